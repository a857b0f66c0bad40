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
// carries out a step of the account signing keys' rotation changes the key
// files under the others, which read them again before they push an
// account or issue a JWT: else, once the rotation is announced, another
// serve's pushes would list the old key alone, and after the switch its
// grants would carry JWTs the broker refuses, and its own sign-in too.
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
		if err := k.nodes.refresh(); err != nil {
			t.Fatal(err)
		}
		return k.nodeAccountClaims(&NodeRecord{Name: "n1", NKey: "U"}).SigningKeys.Keys()
	}
	// The control side's users: issued by its signing key as the files
	// say, and listed by the system account and CONTROL.
	controlIssuer := func(k *Keys) string {
		token, err := k.Operator.userJWT(k.Operator.ControlPublic, "mesh-control")
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		if uc.IssuerAccount != k.Operator.ControlPublic {
			t.Fatalf("a CONTROL user issued for account %s", uc.IssuerAccount)
		}
		return uc.Issuer
	}
	controlOld := controlIssuer(b)

	// a announces.
	if err := a.nodes.announce(); err != nil {
		t.Fatal(err)
	}
	if err := a.Operator.signing.announce(); err != nil {
		t.Fatal(err)
	}
	nextPub := a.nodes.issuerPublic()
	controlNext := a.Operator.signing.issuerPublic() // the key announced
	if nextPub == old || controlNext == controlOld {
		t.Fatal("nothing new announced")
	}
	if got := listed(b); !slices.Contains(got, old) || !slices.Contains(got, nextPub) {
		t.Fatalf("the other serve's accounts list %v after the announcement, not both %s and %s", got, old, nextPub)
	}
	if got := issuedBy(b); got != nextPub {
		t.Fatalf("the other serve issues JWTs of %s after the announcement, not of %s", got, nextPub)
	}
	// Signed in with the key in force until the switch: a broker that
	// has not yet taken the accounts listing the new one would refuse it.
	if got := controlIssuer(b); got != controlOld {
		t.Fatalf("the other serve signs in with a JWT of %s after the announcement, not of %s", got, controlOld)
	}
	if got := b.Operator.controlAccountClaims().SigningKeys.Keys(); !slices.Contains(got, controlOld) || !slices.Contains(got, controlNext) {
		t.Fatalf("the other serve's CONTROL lists %v after the announcement", got)
	}

	// a switches.
	if err := a.nodes.switchOver(); err != nil {
		t.Fatal(err)
	}
	if err := a.Operator.signing.switchOver(); err != nil {
		t.Fatal(err)
	}
	if got := listed(b); len(got) != 1 || got[0] != nextPub {
		t.Fatalf("the other serve's accounts list %v after the switch, not %s alone", got, nextPub)
	}
	if got := issuedBy(b); got != nextPub {
		t.Fatalf("the other serve issues JWTs of %s after the switch", got)
	}
	if got := controlIssuer(b); got != controlNext {
		t.Fatalf("the other serve signs in with a JWT of %s after the switch", got)
	}
	if got := b.Operator.systemAccountClaims().SigningKeys.Keys(); len(got) != 1 || got[0] != controlNext {
		t.Fatalf("the other serve's system account lists %v after the switch, not %s alone", got, controlNext)
	}
	if _, err := os.Stat(filepath.Join(dir, FileNodesAccountNext)); !os.IsNotExist(err) {
		t.Fatalf("the key announced is still beside the one switched to: %v", err)
	}
}
