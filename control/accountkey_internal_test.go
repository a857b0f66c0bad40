package control

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// A key directory in operator mode from before the control side's signing
// key (the system account's and CONTROL's identity seeds kept, no
// signing key) is brought up to it by MakeOperator: the accounts keep
// their IDs, the seeds go, the signing key is made. A seed that does not
// read is refused by name and left as it is, never replaced by a new
// account: CONTROL's ID names its streams' directory.
func TestAnOperatorKeyDirectoryFromBeforeIsBroughtUp(t *testing.T) {
	seedOf := func(kp nkeys.KeyPair) []byte { s, _ := kp.Seed(); return append(s, '\n') }
	layout := func(t *testing.T, control []byte) (dir, sysPub, ctlPub string) {
		dir = filepath.Join(t.TempDir(), "keys")
		if _, err := Init(dir, nil, "tls://127.0.0.1:14222"); err != nil {
			t.Fatal(err)
		}
		op, _ := nkeys.CreateOperator()
		sys, _ := nkeys.CreateAccount()
		ctl, _ := nkeys.CreateAccount()
		sysPub, _ = sys.PublicKey()
		ctlPub, _ = ctl.PublicKey()
		if control == nil {
			control = seedOf(ctl)
		}
		for name, b := range map[string][]byte{FileBrokerOperator: seedOf(op), fileBrokerSystemSeed: seedOf(sys), fileBrokerControlSeed: control} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir, sysPub, ctlPub
	}

	dir, sysPub, ctlPub := layout(t, nil)
	if _, err := LoadKeys(dir); err == nil {
		t.Fatal("a key directory without the control side's signing key loads")
	}
	o, err := MakeOperator(dir)
	if err != nil {
		t.Fatal(err)
	}
	if o.SystemPublic != sysPub || o.ControlPublic != ctlPub {
		t.Fatalf("the accounts changed IDs: %s %s, were %s %s", o.SystemPublic, o.ControlPublic, sysPub, ctlPub)
	}
	for _, f := range []string{fileBrokerSystemSeed, fileBrokerControlSeed} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Fatalf("%s kept: %v", f, err)
		}
	}
	if k, err := LoadKeys(dir); err != nil || k.Operator.ControlPublic != ctlPub || !slices.Contains(k.Operator.controlAccountClaims().SigningKeys.Keys(), k.Operator.signing.issuerPublic()) {
		t.Fatalf("brought up: %v", err)
	}

	dir, _, _ = layout(t, []byte("not a seed\n"))
	if _, err := MakeOperator(dir); err == nil || !strings.Contains(err.Error(), fileBrokerControlSeed) {
		t.Fatalf("a control seed that does not read: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, fileBrokerControlSeed)); string(b) != "not a seed\n" {
		t.Fatal("the seed that does not read was changed")
	}
	if _, err := os.Stat(filepath.Join(dir, FileBrokerControlPub)); !os.IsNotExist(err) {
		t.Fatalf("a new CONTROL account was named: %v", err)
	}
}
