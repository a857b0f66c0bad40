package enrol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const agentNKey = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"

// control plays the control side: its key, and tokens it issues.
type control struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
}

func newControl() *control {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	return &control{pub, priv}
}

func (c *control) token() *wire.Token {
	tok := &wire.Token{BrokerURL: "tls://127.0.0.1:4222", ControlKey: c.pub, Expires: time.Now().Add(time.Hour)}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	rand.Read(tok.Credential[:])
	rand.Read(tok.Fingerprint[:])
	return tok
}

// grant is the grant the control side would sign for offer.
func (c *control) grant(t *testing.T, offer *wire.EnrolOffer, change func(*wire.Grant)) []byte {
	t.Helper()
	g := wire.Grant{Node: "n1", Enrolment: "e-new", Token: offer.Token, SeqFloor: 41,
		IdentityKey: wire.KeyIDOf(offer.Keys.Identity), SealingKey: wire.KeyIDOf(offer.Keys.Sealing),
		WireGuardKey: wire.KeyIDOf(offer.Keys.WireGuard), AgentNKey: offer.Keys.AgentNKey, UserJWT: "jwt", Issued: time.Now()}
	if change != nil {
		change(&g)
	}
	b, _ := json.Marshal(&g)
	env, err := wire.Seal(c.priv, wire.PurposeGrant, b)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func begin(t *testing.T, dir string, c *control) (*wire.Token, *wire.EnrolOffer) {
	t.Helper()
	tok := c.token()
	if err := Begin(dir, tok); err != nil {
		t.Fatal(err)
	}
	offer, err := Offer(dir, agentNKey, "host", []byte(`{}`), []byte(`{}`))
	if err != nil || offer == nil {
		t.Fatalf("offer: %v %v", offer, err)
	}
	return tok, offer
}

func TestEnrolment(t *testing.T) {
	dir := t.TempDir()
	c := newControl()
	if o, err := Offer(dir, agentNKey, "", nil, nil); o != nil || err != nil {
		t.Fatalf("nothing begun, yet an offer: %v %v", o, err)
	}
	tok, offer := begin(t, dir, c)

	// The offer is the network half and a proof: never the secret.
	raw, _ := cbor.Marshal(offer)
	if bytes.Contains(raw, tok.Secret[:]) {
		t.Fatal("the offer carries the token's secret")
	}
	if offer.Token != tok.IDString() || offer.BrokerURL != tok.BrokerURL || !bytes.Equal(offer.Credential, tok.Credential[:]) {
		t.Fatalf("offer %+v", offer)
	}
	if !wire.CheckProof(tok.Secret, tok.ID, &offer.Keys, offer.Proof) || offer.Keys.AgentNKey != agentNKey {
		t.Fatal("the proof is not over the keys offered and the agent's NKey")
	}
	for _, f := range []string{PendingFile, ResultFile, "wireguard.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi.Mode(), err)
		}
	}
	if id, _ := identity.Load(dir); id != nil {
		t.Fatal("an identity before any grant")
	}

	id, err := Accept(dir, c.grant(t, offer, nil))
	if err != nil {
		t.Fatal(err)
	}
	if id.Node != "n1" || id.Enrolment != "e-new" || !bytes.Equal(id.ControlKey, c.pub) {
		t.Fatalf("identity %+v", id)
	}
	if loaded, _ := identity.Load(dir); loaded == nil || loaded.Enrolment != "e-new" {
		t.Fatalf("identity on disk: %+v", loaded)
	}
	if f, _ := identity.ReadFloor(dir); f.Seq != 41 {
		t.Fatalf("floor %+v, want the grant's 41", f)
	}
	k, err := LoadKeys(dir)
	if err != nil || k == nil || k.Enrolment != "e-new" {
		t.Fatalf("keys: %v %v", k, err)
	}
	if got := wire.KeyIDOf(encodePub(k.Identity.Public().(ed25519.PublicKey))); got != wire.KeyIDOf(offer.Keys.Identity) {
		t.Fatal("the identity key kept is not the one offered")
	}
	if IsPending(dir) {
		t.Fatal("still pending after the grant")
	}
	if r, _ := ReadResult(dir); r == nil || !r.Enrolled || !r.Final {
		t.Fatalf("result %+v", r)
	}
}

// What a compromised agent, or a control plane other than the pinned one,
// hands over is refused, and nothing is recorded.
func TestGrantRefusals(t *testing.T) {
	c := newControl()
	cases := map[string]struct {
		grant func(t *testing.T, dir string, offer *wire.EnrolOffer) []byte
		want  string
		final bool
	}{
		"another control key": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return newControl().grant(t, o, nil)
		}, "does not verify under the control key the token pinned", true},
		"a declaration, not a grant": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			env, _ := wire.Seal(c.priv, wire.PurposeDeclaration, []byte(`{"node":"n1"}`))
			return env
		}, "signed for another purpose", true},
		"another token": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.Token = "0011223344556677" })
		}, "it answers token 0011223344556677", false},
		"the agent's own sealing key": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.SealingKey = wire.KeyIDOf("QUJD") })
		}, "its sealing key is", false},
		"the agent's own WireGuard key": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.WireGuardKey = wire.KeyIDOf("QUJD") })
		}, "its WireGuard key is", false},
		"another identity key": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.IdentityKey = wire.KeyIDOf("QUJD") })
		}, "its identity key is", false},
		"another NKey": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.AgentNKey = "U" + strings.Repeat("Q", 55) })
		}, "its agent NKey is", false},
		"a stale grant from this host's last enrolment": {func(t *testing.T, dir string, o *wire.EnrolOffer) []byte {
			// The host enrolled before; the agent kept that grant.
			old := t.TempDir()
			_, oldOffer := begin(t, old, c)
			return c.grant(t, oldOffer, nil)
		}, "it answers token", false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, offer := begin(t, dir, c)
			_, err := Accept(dir, tc.grant(t, dir, offer))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Accept: %v, want %q", err, tc.want)
			}
			if id, _ := identity.Load(dir); id != nil {
				t.Fatal("an identity was recorded")
			}
			if k, _ := LoadKeys(dir); k != nil {
				t.Fatal("keys were recorded")
			}
			if _, err := os.Stat(filepath.Join(dir, identity.FloorFile)); err == nil {
				t.Fatal("a floor was recorded")
			}
			r, _ := ReadResult(dir)
			if r == nil || r.Enrolled || r.Final != tc.final || r.RefusedBy != "executor" {
				t.Fatalf("result %+v", r)
			}
			// A passing refusal leaves the enrolment pending: the genuine
			// grant still enrols.
			if !tc.final {
				if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
					t.Fatalf("the genuine grant after a refused one: %v", err)
				}
			}
		})
	}
	// No enrolment pending: a grant is not recorded at all.
	dir := t.TempDir()
	if _, err := Accept(dir, []byte("x")); err == nil || !strings.Contains(err.Error(), "no enrolment is pending") {
		t.Fatalf("no pending: %v", err)
	}
}

func TestRefusedByTheControlSideEndsTheEnrolment(t *testing.T) {
	dir := t.TempDir()
	tok, _ := begin(t, dir, newControl())
	if err := Refused(dir, "broker", "unreachable", false); err != nil {
		t.Fatal(err)
	}
	if !IsPending(dir) {
		t.Fatal("a passing failure ended the enrolment")
	}
	if err := Refused(dir, "control", "token used", true); err != nil {
		t.Fatal(err)
	}
	r, _ := ReadResult(dir)
	if IsPending(dir) || r == nil || !r.Final || r.RefusedBy != "control" || r.Token != tok.IDString() || !strings.Contains(r.String(), "refused by the control: token used") {
		t.Fatalf("result %+v pending %v", r, IsPending(dir))
	}
}

// A pending file anyone else could have written is not used.
func TestPendingMustBeTheExecutors(t *testing.T) {
	dir := t.TempDir()
	begin(t, dir, newControl())
	os.Chmod(filepath.Join(dir, PendingFile), 0o644)
	if _, err := Offer(dir, agentNKey, "", nil, nil); err == nil || !strings.Contains(err.Error(), "readable by nobody else") {
		t.Fatalf("offer from a 0644 pending file: %v", err)
	}
}

func storeCopy(t *testing.T, c *control, node, enrolment string, entries ...wire.OwnedEntry) []byte {
	t.Helper()
	b, _ := json.Marshal(&wire.StoreCopy{Node: node, Enrolment: enrolment, FromEnrolment: "e-old", FromSeq: 7, Entries: entries})
	env, err := wire.Seal(c.priv, wire.PurposeStoreCopy, b)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A store copy is taken only into an empty store, only for this
// enrolment, only under the pinned key, and only what may be removed
// safely: files and directories outside the protected set.
func TestRecover(t *testing.T) {
	c := newControl()
	id := &identity.Identity{Node: "n1", Enrolment: "e-new", ControlKey: c.pub}
	entries := []wire.OwnedEntry{
		{Target: "path:/srv/a", Type: "file", Module: "m", ID: "a", Digest: strings.Repeat("ab", 32), Mode: 0o644},
		{Target: "path:/srv/d", Type: "directory", Module: "m", ID: "d"},
		{Target: "path:/var/lib/mesh-host/executor/identity.json", Type: "file", Module: "m", ID: "evil"},
		{Target: "unit:nginx.service", Type: "service", Module: "m", ID: "svc"},
		{Target: "path:relative", Type: "file", Module: "m", ID: "rel"},
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	rec, err := Recover(dir, id, storeCopy(t, c, "n1", "e-new", entries...), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Taken != 2 || len(rec.Skipped) != 3 || rec.Intact {
		t.Fatalf("recovery %+v", rec)
	}
	st, _ := store.Open(dir)
	got := st.Entries()
	if len(got) != 2 || !got[0].Recovered || !got[0].Created || got[0].Digest != entries[0].Digest || got[0].Claims[0] != (store.Claim{Source: store.Link, Module: "m", ID: "a"}) {
		t.Fatalf("entries %+v", got)
	}
	// Intact now: a second copy is not used.
	if rec, err := Recover(dir, id, storeCopy(t, c, "n1", "e-new", entries[:1]...), time.Second); err != nil || !rec.Intact {
		t.Fatalf("second copy: %+v %v", rec, err)
	}
	for name, env := range map[string][]byte{
		"another enrolment":   storeCopy(t, c, "n1", "e-other", entries...),
		"another node":        storeCopy(t, c, "n2", "e-new", entries...),
		"another key":         storeCopy(t, newControl(), "n1", "e-new", entries...),
		"a grant, not a copy": func() []byte { e, _ := wire.Seal(c.priv, wire.PurposeGrant, []byte(`{}`)); return e }(),
	} {
		empty := t.TempDir()
		os.Chmod(empty, 0o700)
		if _, err := Recover(empty, id, env, time.Second); err == nil {
			t.Errorf("%s: taken in", name)
		}
		st, _ := store.Open(empty)
		if len(st.Entries()) != 0 {
			t.Errorf("%s: the store holds entries", name)
		}
	}
}
