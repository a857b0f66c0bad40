package enrol

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// enrolled makes dir an executor enrolled as node n1 (enrolment e-new)
// and returns the public half of its identity key, as the control side
// recorded it.
func enrolled(t *testing.T, dir string, c *control) string {
	t.Helper()
	_, offer := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
		t.Fatal(err)
	}
	return offer.Keys.Identity
}

func beginWith(t *testing.T, dir string, c *control, o Options) (*wire.Token, *wire.EnrolOffer) {
	t.Helper()
	tok := c.token()
	if err := BeginWith(dir, tok, o); err != nil {
		t.Fatal(err)
	}
	offer, err := Offer(dir, agentNKey, "host", nil, nil)
	if err != nil || offer == nil {
		t.Fatalf("offer: %v %v", offer, err)
	}
	return tok, offer
}

// An enrolled host enrolled again presents the identity it holds, signed
// by that identity's key over this very request, under the proof: so the
// control side can refuse to leave it behind (no --replace) or revoke it
// (--replace), and nobody on the way can drop, change or replay it.
func TestTheHeldIdentityGoesWithTheRequest(t *testing.T) {
	c := newControl()
	for _, replace := range []bool{false, true} {
		dir := t.TempDir()
		oldPub := enrolled(t, dir, c)
		tok, offer := beginWith(t, dir, c, Options{Replace: replace})
		h := offer.Keys.Held
		if h == nil || h.Node != "n1" || h.Enrolment != "e-new" || h.Replace != replace {
			t.Fatalf("replace %v: held %+v", replace, h)
		}
		if !wire.VerifyHeld(oldPub, tok.ID, &offer.Keys) {
			t.Fatalf("replace %v: the held identity is not signed by the old identity key", replace)
		}
		if wire.VerifyHeld(offer.Keys.Identity, tok.ID, &offer.Keys) {
			t.Fatal("signed by the new key")
		}
		// Bound: another token, or another new key, and it does not verify.
		other := tok.ID
		other[0] ^= 1
		if wire.VerifyHeld(oldPub, other, &offer.Keys) {
			t.Fatal("the signature verifies for another token")
		}
		// Under the proof: dropped or flipped, the proof no longer holds.
		stripped := offer.Keys
		stripped.Held = nil
		flipped := offer.Keys
		hf := *h
		hf.Replace = !replace
		flipped.Held = &hf
		if wire.CheckProof(tok.Secret, tok.ID, &stripped, offer.Proof) || wire.CheckProof(tok.Secret, tok.ID, &flipped, offer.Proof) ||
			!wire.CheckProof(tok.Secret, tok.ID, &offer.Keys, offer.Proof) {
			t.Fatal("the proof does not cover the held identity")
		}
		// The identity held is untouched until a grant comes.
		if id, _ := identity.Load(dir); id == nil || id.Node != "n1" {
			t.Fatalf("identity while pending: %+v", id)
		}
		// The offer is made again the same way (an agent that asks twice,
		// or after a crash): one signature, one proof.
		again, err := Offer(dir, agentNKey, "host", nil, nil)
		if err != nil || !wire.CheckProof(tok.Secret, tok.ID, &again.Keys, offer.Proof) {
			t.Fatalf("a second offer: %v", err)
		}
	}
}

// Replacing: a grant must say it replaced the identity held (the control
// side revoked it first); one that does not is for another enrolment.
// Without --replace, a grant that claims a replacement is refused too.
func TestAReplacementIsAcceptedOnlyAsOne(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	enrolled(t, dir, c)
	_, offer := beginWith(t, dir, c, Options{Replace: true})
	newNode := func(g *wire.Grant) { g.Node, g.Enrolment = "n2", "e-n2" }
	if _, err := Accept(dir, c.grant(t, offer, newNode)); err == nil || !strings.Contains(err.Error(), "does not say it replaced node n1") {
		t.Fatalf("a grant that replaced nothing: %v", err)
	}
	if id, _ := identity.Load(dir); id.Node != "n1" {
		t.Fatal("the identity changed on a refused grant")
	}
	id, err := Accept(dir, c.grant(t, offer, func(g *wire.Grant) {
		newNode(g)
		g.ReplacedNode, g.ReplacedEnrolment = "n1", "e-new"
	}))
	if err != nil || id.Node != "n2" {
		t.Fatalf("the replacement: %v %v", id, err)
	}
	r, _ := ReadResult(dir)
	if !r.Enrolled || !strings.Contains(r.String(), "enrolled as node n2 (enrolment e-n2), replacing node n1 (enrolment e-new)") {
		t.Fatalf("result: %s", r)
	}
	if k, _ := LoadKeys(dir); k.Enrolment != "e-n2" || encodePub(k.Identity.Public().(ed25519.PublicKey)) != offer.Keys.Identity {
		t.Fatal("the new keys are not the ones kept")
	}
}

// Root's --replace is refused before anything is written when nothing can
// be replaced: a hosted host, or one whose identity key is gone.
func TestReplaceRefusedWhenNothingCanBeReplaced(t *testing.T) {
	c := newControl()
	hosted := t.TempDir()
	gone := t.TempDir()
	enrolled(t, gone, c)
	os.Remove(filepath.Join(gone, KeysFile))
	for name, tc := range map[string]struct {
		dir  string
		want string
	}{
		"hosted":                   {hosted, "this host holds no identity"},
		"the identity key is gone": {gone, "cannot be used"},
	} {
		before, _ := os.ReadDir(tc.dir)
		err := BeginWith(tc.dir, c.token(), Options{Replace: true})
		var refusal Refusal
		if !errors.As(err, &refusal) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v", name, err)
		}
		if after, _ := os.ReadDir(tc.dir); len(after) != len(before) {
			t.Fatalf("%s: %d files before, %d after", name, len(before), len(after))
		}
	}
	// Without --replace, a host whose key is gone still presents what it
	// holds (unsigned: it can refuse its own enrolment, never revoke).
	_, offer := beginWith(t, gone, c, Options{})
	if h := offer.Keys.Held; h == nil || h.Node != "n1" || h.Signature != nil {
		t.Fatalf("held %+v", h)
	}
}

// The signature is what the control side checks against the key it
// recorded for the node: base64 of the executor's identity key.
func TestHeldSignatureUnderTheRecordedKey(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	oldPub := enrolled(t, dir, c)
	tok, offer := beginWith(t, dir, c, Options{Replace: true})
	raw, _ := base64.StdEncoding.DecodeString(oldPub)
	if !ed25519.Verify(raw, wire.HeldMessage(tok.ID, &offer.Keys), offer.Keys.Held.Signature) {
		t.Fatal("the signature is not over HeldMessage")
	}
}

// A replacement cut short between its floor and its identity (a crash, a
// full disk) leaves the identity it replaces in place, and a floor that is
// no floor for it: the new node's sequences start lower than the old one's
// reached, and the old identity's declarations below it must not be taken
// again (the daemon refuses any declaration while the two disagree).
func TestAReplacementCutShortLowersNoFloorOfTheIdentityItReplaces(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	enrolled(t, dir, c) // n1, its floor 41
	_, offer := beginWith(t, dir, c, Options{Replace: true})
	// The identity cannot be written: something sits where its temporary goes.
	if err := os.Mkdir(filepath.Join(dir, identity.FileName+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Accept(dir, c.grant(t, offer, func(g *wire.Grant) {
		g.Node, g.Enrolment, g.SeqFloor = "n2", "e-n2", 0
		g.ReplacedNode, g.ReplacedEnrolment = "n1", "e-new"
	}))
	if err == nil {
		t.Fatal("the identity was written through the obstacle")
	}
	id, err := identity.Load(dir)
	if err != nil || id.Node != "n1" {
		t.Fatalf("the identity after the cut: %+v %v", id, err)
	}
	f, err := identity.ReadFloor(dir)
	if err != nil {
		t.Fatal(err)
	}
	if f.Of(id.Enrolment) && f.Seq < 41 {
		t.Fatalf("n1's floor is %d after a replacement cut short, below the 41 it had", f.Seq)
	}
}
