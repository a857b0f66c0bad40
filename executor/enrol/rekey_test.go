package enrol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// rekeyAnswer is the answer the control side would sign (with key) for
// req: tok sealed to sealing (base64, as the record holds it).
func rekeyAnswer(t *testing.T, key ed25519.PrivateKey, purpose wire.Purpose, req *wire.RekeyRequest, sealing string, tok *wire.Token) []byte {
	t.Helper()
	text, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := base64.StdEncoding.DecodeString(sealing)
	sealed, err := wire.SealRekeyToken(pub, req.Node, req.Nonce, text)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(&wire.RekeyAnswer{Node: req.Node, Enrolment: req.Enrolment, Nonce: req.Nonce, Token: sealed, Expires: tok.Expires})
	env, err := wire.Seal(key, purpose, b)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// stateOf is every file of dir, for "nothing changed".
func stateOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		m[e.Name()] = string(b)
	}
	return m
}

// A rekey: the request is signed by the identity key it replaces, and
// only the control side's answer to it — signed by the key in force, for
// this node, enrolment and nonce, its token sealed to this enrolment's
// sealing key and pinning the key in force — begins the enrolment, which
// replaces the identity held with every key new, the WireGuard key too.
// Anything else the agent hands over is refused and changes nothing.
func TestRekey(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
		t.Fatal(err)
	}
	old := offer.Keys
	if r, err := RekeyRequest(dir); r != nil || err != nil {
		t.Fatalf("a request with no rekey asked for: %+v %v", r, err)
	}
	v, err := BeginRekey(dir)
	if err != nil || v.Node != "n1" || v.Enrolment != "e-new" {
		t.Fatalf("rekey: %+v %v", v, err)
	}
	req, err := RekeyRequest(dir)
	if err != nil || req == nil {
		t.Fatalf("the request: %+v %v", req, err)
	}
	if err := req.Check(old.Identity); err != nil {
		t.Fatalf("the request under the identity key: %v", err)
	}
	// Asked again while it waits: the same request (the control side may
	// be answering it).
	if _, err := BeginRekey(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := RekeyRequest(dir); again.Nonce != req.Nonce {
		t.Fatal("asked again, the rekey took a new nonce")
	}

	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherSealing, _ := SealingKEM().GenerateKey()
	otherSealingPub := base64.StdEncoding.EncodeToString(otherSealing.PublicKey().Bytes())
	tok := c.token()
	foreign := newControl().token()
	elsewhere := *req
	elsewhere.Nonce = strings.Repeat("00", wire.RekeyNonceSize)
	n2 := *req
	n2.Node = "n2"
	before := stateOf(t, dir)
	for name, tc := range map[string]struct {
		env  []byte
		want string
	}{
		"garbage":               {[]byte("garbage"), "does not verify under the control key in force"},
		"another key":           {rekeyAnswer(t, other, wire.PurposeRekey, req, old.Sealing, tok), "does not verify under the control key in force"},
		"a grant":               {rekeyAnswer(t, c.priv, wire.PurposeGrant, req, old.Sealing, tok), "does not verify under the control key in force"},
		"another nonce":         {rekeyAnswer(t, c.priv, wire.PurposeRekey, &elsewhere, old.Sealing, tok), "the rekey pending is node n1 (enrolment e-new)'s"},
		"another node":          {rekeyAnswer(t, c.priv, wire.PurposeRekey, &n2, old.Sealing, tok), "the rekey answer is for node n2"},
		"sealed to another key": {rekeyAnswer(t, c.priv, wire.PurposeRekey, req, otherSealingPub, tok), "does not open with this node's sealing key"},
		"another control key":   {rekeyAnswer(t, c.priv, wire.PurposeRekey, req, old.Sealing, foreign), "pins control key"},
	} {
		if _, err := TakeRekey(dir, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		if now := stateOf(t, dir); !mapsEqual(now, before) {
			t.Fatalf("%s changed the state directory", name)
		}
	}

	id, err := TakeRekey(dir, rekeyAnswer(t, c.priv, wire.PurposeRekey, req, old.Sealing, tok))
	if err != nil || id != tok.IDString() {
		t.Fatalf("the genuine answer: %q %v", id, err)
	}
	if r, _ := ReadRekey(dir); r != nil {
		t.Fatal("the rekey is still pending once its enrolment began")
	}
	if _, err := TakeRekey(dir, rekeyAnswer(t, c.priv, wire.PurposeRekey, req, old.Sealing, tok)); err == nil || !strings.Contains(err.Error(), "no rekey is pending") {
		t.Fatalf("the answer again: %v", err)
	}
	next, err := Offer(dir, agentNKey, "host", nil, nil)
	if err != nil || next == nil {
		t.Fatalf("the enrolment's offer: %+v %v", next, err)
	}
	k := next.Keys
	if k.Identity == old.Identity || k.Sealing == old.Sealing || k.WireGuard == old.WireGuard {
		t.Fatalf("a key is the same: %+v, was %+v", k, old)
	}
	if k.Held == nil || k.Held.Node != "n1" || k.Held.Enrolment != "e-new" || !k.Held.Replace || !wire.VerifyHeld(old.Identity, tok.ID, &k) {
		t.Fatalf("the enrolment does not replace n1 under its identity key's signature: %+v", k.Held)
	}
	// The new WireGuard key is kept beside the pending file, which holds
	// only what the release before reads (it decodes it strictly).
	if b, _ := os.ReadFile(filepath.Join(dir, PendingFile)); bytes.Contains(b, []byte(`"wireguard"`)) {
		t.Fatalf("the pending file carries the new WireGuard key:\n%s", b)
	}
	if fi, err := os.Stat(filepath.Join(dir, PendingWireGuardFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", PendingWireGuardFile, fi, err)
	}
	// The WireGuard key is the executor's only once the grant is taken.
	if wg, _, _ := overlay.LoadKey(dir); wg.PublicKey().String() != old.WireGuard {
		t.Fatal("the new WireGuard key was put in place before the grant")
	}
	if _, err := Accept(dir, c.grant(t, next, func(g *wire.Grant) {
		g.Enrolment, g.ReplacedNode, g.ReplacedEnrolment = "e-newer", "n1", "e-new"
	})); err != nil {
		t.Fatal(err)
	}
	if wg, _, _ := overlay.LoadKey(dir); wg.PublicKey().String() != k.WireGuard {
		t.Fatalf("after the grant the WireGuard key is %s, want %s", wg.PublicKey(), k.WireGuard)
	}
	if pub, _ := os.ReadFile(filepath.Join(dir, overlay.PubFile)); strings.TrimSpace(string(pub)) != k.WireGuard {
		t.Fatalf("wireguard.pub says %q", pub)
	}
	if keys, _ := LoadKeys(dir); keys == nil || keys.Enrolment != "e-newer" || base64.StdEncoding.EncodeToString(keys.Identity.Public().(ed25519.PublicKey)) != k.Identity {
		t.Fatalf("the keys after the grant: %+v", keys)
	}
	if _, err := os.Stat(filepath.Join(dir, PendingWireGuardFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the new WireGuard key's file outlived its enrolment: %v", err)
	}
}

// A new WireGuard key left by a rekey's enrolment that the release before
// finished (rolled back to, it does not know the file) is no later
// enrolment's: that one presents the executor's own key, and the file goes
// once nothing is pending.
func TestALeftWireGuardKeyIsNoLaterEnrolments(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
		t.Fatal(err)
	}
	if err := BeginWith(dir, c.token(), Options{Replace: true, NewWireGuard: true}); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadFile(filepath.Join(dir, PendingWireGuardFile))
	if err != nil {
		t.Fatal(err)
	}
	// Root's next enrolment, begun by the release before (which leaves
	// the file), and this release reading it.
	if err := BeginWith(dir, c.token(), Options{Replace: true}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, PendingWireGuardFile), left, 0o600)
	next, err := Offer(dir, agentNKey, "host", nil, nil)
	if err != nil || next == nil {
		t.Fatalf("the offer: %+v %v", next, err)
	}
	if next.Keys.WireGuard != offer.Keys.WireGuard {
		t.Fatalf("a later enrolment presented the key left behind: %s, not the executor's own %s", next.Keys.WireGuard, offer.Keys.WireGuard)
	}
	if _, err := Cancel(dir); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, PendingWireGuardFile), left, 0o600)
	if IsPending(dir) {
		t.Fatal("pending after the cancel")
	}
	if _, err := os.Stat(filepath.Join(dir, PendingWireGuardFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the key left behind with nothing pending: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// What a rekey cannot start from is refused before anything is written:
// a hosted host, an enrolled one whose identity key is gone, one with an
// enrolment pending. Root's --cancel ends a pending rekey, and an
// enrolment root begins takes its place.
func TestRekeyRefusals(t *testing.T) {
	c := newControl()
	hosted := t.TempDir()
	var refused Refusal
	if _, err := BeginRekey(hosted); !errors.As(err, &refused) || !strings.Contains(err.Error(), "holds no identity") {
		t.Fatalf("hosted: %v", err)
	}
	if e, _ := os.ReadDir(hosted); len(e) != 0 {
		t.Fatalf("a refused rekey wrote %v", e)
	}

	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
		t.Fatal(err)
	}
	begin(t, dir, c)
	if _, err := BeginRekey(dir); !errors.As(err, &refused) || !strings.Contains(err.Error(), "an enrolment is pending") {
		t.Fatalf("with an enrolment pending: %v", err)
	}
	if _, err := Cancel(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := BeginRekey(dir); err != nil {
		t.Fatal(err)
	}
	if ended, err := CancelRekey(dir); !ended || err != nil {
		t.Fatalf("cancel: %v %v", ended, err)
	}
	if r, _ := RekeyRequest(dir); r != nil {
		t.Fatal("a cancelled rekey still asks")
	}
	if ended, _ := CancelRekey(dir); ended {
		t.Fatal("cancelled twice")
	}
	if _, err := BeginRekey(dir); err != nil {
		t.Fatal(err)
	}
	begin(t, dir, c) // root's enrolment takes the rekey's place
	if r, _ := ReadRekey(dir); r != nil {
		t.Fatal("an enrolment root began left the rekey pending")
	}
	Cancel(dir)

	os.Remove(filepath.Join(dir, KeysFile))
	if _, err := BeginRekey(dir); !errors.As(err, &refused) || !strings.Contains(err.Error(), "cannot be used") {
		t.Fatalf("without the identity key: %v", err)
	}
}

// The grant an executor accepted is handed back to the agent that holds
// the NKey it names — the agent stopped before keeping its own half — and
// to no other, and only while the host holds that enrolment.
func TestGrantedIsKeptForItsAgent(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	grant := c.grant(t, offer, nil)
	if _, err := Accept(dir, grant); err != nil {
		t.Fatal(err)
	}
	g, err := Granted(dir, agentNKey)
	if err != nil || g == nil || string(g.Granted) != string(grant) || g.BrokerURL != "tls://127.0.0.1:4222" || !c.pub.Equal(ed25519.PublicKey(g.ControlKey)) || g.Pending {
		t.Fatalf("granted: %+v %v", g, err)
	}
	if g, _ := Granted(dir, "UOTHERNKEY"); g != nil {
		t.Fatal("handed to an agent of another NKey")
	}
	os.Remove(filepath.Join(dir, "identity.json"))
	if g, _ := Granted(dir, agentNKey); g != nil {
		t.Fatal("handed back while the host holds no identity")
	}
}

// A rekey's answer ends the rekey and begins an enrolment, under the
// enrolment's lock; RekeyState reads the two under it too, so that no look
// falls between them (the rekey gone, no enrolment begun: `rekey` once
// said it had ended without one while it went on to finish).
func TestARekeyAnsweredIsReadWhole(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
		t.Fatal(err)
	}
	v, err := BeginRekey(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The answer, half done, as beginLocked does it under the lock.
	unlock, err := lock(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, RekeyFile)); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		p   *RekeyView
		r   *Result
		err error
	}
	got := make(chan seen, 1)
	go func() { p, r, err := RekeyState(dir); got <- seen{p, r, err} }()
	select {
	case s := <-got:
		unlock()
		t.Fatalf("read between the rekey's end and the enrolment it begins: %+v %+v %v", s.p, s.r, s.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := writeJSON(dir, ResultFile, &Result{Token: "t", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	unlock()
	s := <-got
	if s.err != nil || s.p != nil || s.r == nil || s.r.At.Before(v.Begun) {
		t.Fatalf("after the answer: %+v %+v %v", s.p, s.r, s.err)
	}
}
