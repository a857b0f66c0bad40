package control

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// twoServesKeys is a key directory in operator mode, loaded twice: the
// keys of two serves that share it.
func twoServesKeys(t *testing.T) (dir string, a, b *Keys) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "keys")
	if _, err := Init(dir, nil, "tls://127.0.0.1:14222"); err != nil {
		t.Fatal(err)
	}
	if _, err := MakeOperator(dir); err != nil {
		t.Fatal(err)
	}
	var err error
	if a, err = LoadKeys(dir); err != nil {
		t.Fatal(err)
	}
	if b, err = LoadKeys(dir); err != nil {
		t.Fatal(err)
	}
	return dir, a, b
}

// Several serves may share one key directory and one broker; the one that
// carries out a step of the account signing keys' rotation changes the key
// files under the others, which read them again before they push an
// account or issue a JWT: else, once the rotation is announced, another
// serve's pushes would list the old key alone, and after the switch its
// grants would carry JWTs the broker refuses, and its own sign-in too.
func TestServesOfOneKeyDirectoryFollowTheRotation(t *testing.T) {
	dir, a, b := twoServesKeys(t)
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

// A heartbeat that carries nothing else but names a JWT of another key
// than the one issuing the nodes' JWTs now is read, so that the node is
// sent one (renewUserJWT): the recorder passed every heartbeat without a
// profile over, and a node whose heartbeat with a profile came before the
// announce was never sent its JWT — the switch waited on it for ever.
// One that names the key issuing now is not read. A serve sharing the key
// directory with the one that announced sees the announce within
// issuerFreshness.
func TestAHeartbeatNamingAnotherIssuerIsRead(t *testing.T) {
	_, a, b := twoServesKeys(t)
	heartbeat := func(issuer string) []byte {
		data, err := json.Marshal(&link.Heartbeat{Node: "n1", Enrolment: "e-1", At: time.Now().UTC(), State: link.StateEnrolled, JWTIssuer: issuer})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	old := a.nodes.issuerPublic()
	ra, rb := &recorder{c: &Client{Keys: a}, kind: "heartbeat"}, &recorder{c: &Client{Keys: b}, kind: "heartbeat"}
	for _, r := range []*recorder{ra, rb} {
		if r.heartbeatActs(heartbeat(old)) {
			t.Fatalf("a heartbeat naming the key in force, nothing announced, is read")
		}
		if r.heartbeatActs(heartbeat("")) {
			t.Fatalf("a heartbeat naming no issuer (not operator mode's) is read")
		}
	}
	if err := a.nodes.announce(); err != nil {
		t.Fatal(err)
	}
	next := a.nodes.issuerPublic()
	if next == old {
		t.Fatal("announce made no new key")
	}
	if !ra.heartbeatActs(heartbeat(old)) {
		t.Fatalf("after the announce, a heartbeat naming the old key is not read")
	}
	if ra.heartbeatActs(heartbeat(next)) {
		t.Fatalf("a heartbeat naming the key announced is read")
	}
	// A prefix of the key is another key.
	if !ra.heartbeatActs(heartbeat(next[:len(next)-1])) {
		t.Fatalf("a heartbeat naming a prefix of the key announced is not read")
	}
	for deadline := time.Now().Add(5 * issuerFreshness); !rb.heartbeatActs(heartbeat(old)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a serve sharing the key directory never reads a heartbeat naming the old key after another announced")
		}
	}
}
