package control

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Several serves may share one key directory and one broker; the one that
// carries out a step of the nodes' account key's rotation changes the key
// files under the others, which read them again before they push an
// account or issue a JWT: else, once the rotation is announced, another
// serve's pushes would list the old key alone, and after the switch its
// grants would carry JWTs the broker refuses.
func TestServesOfOneKeyDirectoryFollowTheRotation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if _, err := Init(dir, nil, "tls://127.0.0.1:14222"); err != nil {
		t.Fatal(err)
	}
	if _, err := MakeOperator(dir); err != nil {
		t.Fatal(err)
	}
	a, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := a.AccountPublic
	issuedBy := func(k *Keys) string {
		c := &Client{Keys: k}
		user, _ := nkeys.CreateUser()
		pub, _ := user.PublicKey()
		token, err := c.UserJWT("n1", pub)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		return uc.Issuer
	}
	listed := func(k *Keys) []string {
		if err := k.refreshNodesAccount(); err != nil {
			t.Fatal(err)
		}
		return k.nodeAccountClaims(&NodeRecord{Name: "n1", NKey: "U"}).SigningKeys.Keys()
	}

	// a announces.
	next, _ := nkeys.CreateAccount()
	nextPub, _ := next.PublicKey()
	seed, _ := next.Seed()
	if err := writeNew(dir, FileNodesAccountNext, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	a.setNodesAccount(a.current(), next)
	if got := listed(b); !slices.Contains(got, old) || !slices.Contains(got, nextPub) {
		t.Fatalf("the other serve's accounts list %v after the announcement, not both %s and %s", got, old, nextPub)
	}
	if got := issuedBy(b); got != nextPub {
		t.Fatalf("the other serve issues JWTs of %s after the announcement, not of %s", got, nextPub)
	}

	// a switches.
	if err := os.Rename(filepath.Join(dir, FileNodesAccountNext), filepath.Join(dir, FileNodesAccount)); err != nil {
		t.Fatal(err)
	}
	a.setNodesAccount(next, nil)
	if got := listed(b); len(got) != 1 || got[0] != nextPub {
		t.Fatalf("the other serve's accounts list %v after the switch, not %s alone", got, nextPub)
	}
	if got := issuedBy(b); got != nextPub {
		t.Fatalf("the other serve issues JWTs of %s after the switch", got)
	}
}
