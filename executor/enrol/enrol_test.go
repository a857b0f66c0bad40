package enrol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	// claimed: what does not verify is noted as what the agent handed
	// over, and ends nothing; the others are grants for another
	// enrolment, noted as passing. Neither is final.
	cases := map[string]struct {
		grant   func(t *testing.T, dir string, offer *wire.EnrolOffer) []byte
		want    string
		claimed bool
	}{
		"another control key": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return newControl().grant(t, o, nil)
		}, "does not verify under the control key the token pinned", true},
		"a declaration, not a grant": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			env, _ := wire.Seal(c.priv, wire.PurposeDeclaration, []byte(`{"node":"n1"}`))
			return env
		}, "signed for another purpose", true},
		"garbage": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return []byte("not an envelope")
		}, "not a well-formed signed envelope", true},
		"a grant that says it replaced a node this enrolment does not replace": {func(t *testing.T, _ string, o *wire.EnrolOffer) []byte {
			return c.grant(t, o, func(g *wire.Grant) { g.ReplacedNode, g.ReplacedEnrolment = "other", "e-other" })
		}, "this enrolment replaces nothing", false},
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
			if r == nil || r.Enrolled || r.Final || r.Claimed != tc.claimed || r.RefusedBy != "executor" {
				t.Fatalf("result %+v", r)
			}
			// Whatever the agent handed over, the enrolment stays begun:
			// the genuine grant still enrols.
			if _, err := Accept(dir, c.grant(t, offer, nil)); err != nil {
				t.Fatalf("the genuine grant after a refused one: %v", err)
			}
		})
	}
	// No enrolment pending: a grant is not recorded at all.
	dir := t.TempDir()
	if _, err := Accept(dir, []byte("x")); err == nil || !strings.Contains(err.Error(), "no enrolment is pending") {
		t.Fatalf("no pending: %v", err)
	}
}

// The agent is trusted for nothing, so its word ends nothing root began:
// a refusal it reports (final or not), garbage, a grant or a refusal
// under another key. Each is noted for status as what it is; the genuine
// grant still enrols afterwards.
func TestTheAgentsWordEndsNothing(t *testing.T) {
	c := newControl()
	other := newControl()
	cases := []struct {
		name    string
		handed  func(t *testing.T, dir string, o *wire.EnrolOffer) error
		claimed bool
		says    string
	}{
		{"unreachable, passing", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			return Refused(dir, "broker", "connection refused", false)
		}, false, "still trying (broker, as the agent reports it: connection refused)"},
		{"the broker refused, final in its word", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			return Refused(dir, "broker", "authorization violation", true)
		}, true, "refused by the broker, as the agent reports it: authorization violation"},
		{"the control side refused, final in its word, unsigned", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			return Refused(dir, "control", "token used", true)
		}, true, "refused by the control side, as the agent reports it: token used"},
		{"the agent itself refused", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			return Refused(dir, "agent", "fingerprint mismatch", true)
		}, true, "refused by the agent: fingerprint mismatch"},
		{"no envelope at all, final", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			return Refused(dir, "", "", true)
		}, true, "the agent's word ends nothing"},
		{"garbage for a grant", func(t *testing.T, dir string, _ *wire.EnrolOffer) error {
			_, err := Accept(dir, []byte{0xd2, 0x84, 0x40})
			return err
		}, true, "does not verify"},
		{"a refusal signed by another key", func(t *testing.T, dir string, o *wire.EnrolOffer) error {
			_, err := Accept(dir, other.refusal(t, o.Token, ""))
			return err
		}, true, "does not verify"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, offer := begin(t, dir, c)
			tc.handed(t, dir, offer)
			r, _ := ReadResult(dir)
			if _, err := os.Stat(filepath.Join(dir, PendingFile)); err != nil || r == nil || r.Final || r.Claimed != tc.claimed || !strings.Contains(r.String(), tc.says) {
				t.Fatalf("pending file: %v; result %+v: %s", err, r, r)
			}
			if v, err := ReadPending(dir); err != nil || v == nil || v.Token != offer.Token {
				t.Fatalf("status's view: %+v %v", v, err)
			}
			// A claimed refusal holds the offer back (the agent would only
			// leave its link for a request that fails again), and offers it
			// again after ReofferAfter.
			if IsPending(dir) == tc.claimed {
				t.Fatalf("IsPending %v after a claim %v", IsPending(dir), tc.claimed)
			}
			if tc.claimed {
				p, _, _ := loadPending(dir)
				p.Claimed = time.Now().Add(-ReofferAfter - time.Second)
				writeJSON(dir, PendingFile, p)
				if !IsPending(dir) {
					t.Fatal("not offered again after ReofferAfter")
				}
			}
			if id, err := Accept(dir, c.grant(t, offer, nil)); err != nil || id.Node != "n1" {
				t.Fatalf("the genuine grant after the agent's word: %v %v", id, err)
			}
		})
	}
}

// refusal is a refusal the control side signs: of the token (proof ""),
// or of the request with that proof.
func (c *control) refusal(t *testing.T, token, proof string) []byte {
	t.Helper()
	b, _ := json.Marshal(&wire.EnrolRefusal{Token: token, Proof: proof, Reason: "refused for the test", Issued: time.Now()})
	env, err := wire.Seal(c.priv, wire.PurposeEnrolRefusal, b)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A refusal signed by the pinned key ends the enrolment when it answers
// this enrolment's own request, or refuses its token; one that answers
// another request made with the token (which anyone holding its one-time
// credential could make) ends nothing.
func TestSignedRefusal(t *testing.T) {
	c := newControl()
	cases := []struct {
		name  string
		env   func(t *testing.T, o *wire.EnrolOffer) []byte
		final bool
	}{
		{"of the token", func(t *testing.T, o *wire.EnrolOffer) []byte { return c.refusal(t, o.Token, "") }, true},
		{"of this request", func(t *testing.T, o *wire.EnrolOffer) []byte {
			return c.refusal(t, o.Token, base64.StdEncoding.EncodeToString(o.Proof))
		}, true},
		{"of another request with this token", func(t *testing.T, o *wire.EnrolOffer) []byte {
			return c.refusal(t, o.Token, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
		}, false},
		{"of another token", func(t *testing.T, o *wire.EnrolOffer) []byte { return c.refusal(t, "0011223344556677", "") }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, offer := begin(t, dir, c)
			if _, err := Accept(dir, tc.env(t, offer)); err == nil {
				t.Fatal("a refusal accepted as a grant")
			}
			r, _ := ReadResult(dir)
			_, statErr := os.Stat(filepath.Join(dir, PendingFile))
			if r == nil || r.Final != tc.final || r.Claimed || r.RefusedBy != "control" || (statErr == nil) == tc.final {
				t.Fatalf("result %+v, pending file %v", r, statErr)
			}
			if tc.final && !strings.Contains(r.String(), "refused by the control side: refused for the test") {
				t.Fatalf("says %q", r)
			}
			if id, _ := identity.Load(dir); id != nil {
				t.Fatal("an identity was recorded")
			}
		})
	}
}

// Root ends what root began: --cancel, or a new enrol. The identity the
// host holds stays.
func TestRootEndsTheEnrolment(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	_, offer := begin(t, dir, c)
	if tok, err := Cancel(dir); err != nil || tok != offer.Token {
		t.Fatalf("cancel: %q %v", tok, err)
	}
	r, _ := ReadResult(dir)
	if IsPending(dir) || r == nil || !r.Final || r.RefusedBy != "root" || !strings.Contains(r.String(), "ended by root") {
		t.Fatalf("after cancel: %+v", r)
	}
	if _, err := Accept(dir, c.grant(t, offer, nil)); err == nil || !strings.Contains(err.Error(), "no enrolment is pending") {
		t.Fatalf("a grant after cancel: %v", err)
	}
	if tok, err := Cancel(dir); err != nil || tok != "" {
		t.Fatalf("cancel with nothing pending: %q %v", tok, err)
	}
	// Begun again: the first token's grant answers nothing now.
	_, first := begin(t, dir, c)
	_, second := begin(t, dir, c)
	if _, err := Accept(dir, c.grant(t, first, nil)); err == nil {
		t.Fatal("the grant of an enrolment root replaced was accepted")
	}
	if _, err := Accept(dir, c.grant(t, second, nil)); err != nil {
		t.Fatal(err)
	}
}

// The token's own expiry ends the enrolment, past a margin for a clock a
// little ahead of the control side's, and only once it has been pending
// that long by this clock: a clock hours ahead does not end at once an
// enrolment with a token issued a minute ago.
func TestTokenExpiryEndsTheEnrolment(t *testing.T) {
	c := newControl()
	for _, tc := range []struct {
		name    string
		expires time.Duration // from now, by this clock
		begun   time.Duration // from now, by this clock
		ended   bool
	}{
		{"expired, within the margin", -time.Minute, -time.Hour, false},
		{"expired past the margin, pending past it", -ExpiryMargin - time.Minute, -ExpiryMargin - time.Minute, true},
		{"expired past the margin, just begun", -ExpiryMargin - time.Minute, 0, false},
		{"issued a minute ago by a control side 3h behind this clock", -3*time.Hour + 59*time.Minute, 0, false},
		{"the same, pending past the margin", -3*time.Hour + 59*time.Minute, -ExpiryMargin - time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tok := c.token()
			tok.Expires = time.Now().Add(tc.expires).Truncate(time.Second)
			if err := Begin(dir, tok); err != nil {
				t.Fatal(err)
			}
			p, _, err := loadPending(dir)
			if err != nil {
				t.Fatal(err)
			}
			p.Begun = time.Now().Add(tc.begun).UTC()
			if err := writeJSON(dir, PendingFile, p); err != nil {
				t.Fatal(err)
			}
			if v, _ := ReadPending(dir); v == nil || v.Expired != tc.ended {
				t.Fatalf("status's view: %+v", v)
			}
			if IsPending(dir) == tc.ended {
				t.Fatalf("IsPending %v", !tc.ended)
			}
			r, _ := ReadResult(dir)
			if tc.ended && (r == nil || !r.Final || !strings.Contains(r.Reason, "expired")) {
				t.Fatalf("result %+v", r)
			}
			if o, err := Offer(dir, agentNKey, "", nil, nil); (o == nil) != tc.ended || err != nil {
				t.Fatalf("offer %v %v", o, err)
			}
		})
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

// The daemon and `mesh-executor enrol` are two processes changing one
// pending enrolment: each takes the enrolment's lock, and another process
// holding it past the wait is named by its pid, nothing changed.
func TestAnotherProcessHoldingTheEnrolmentIsNamed(t *testing.T) {
	c := newControl()
	dir := t.TempDir()
	begin(t, dir, c)
	before, _ := os.ReadFile(filepath.Join(dir, PendingFile))
	lockPath := filepath.Join(dir, LockFile)
	holder := exec.Command("flock", "--exclusive", lockPath, "sleep", "30")
	if err := holder.Start(); err != nil {
		t.Fatalf("util-linux flock (tests/install-deps.sh installs it): %v", err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	// Until flock holds it: an open of our own finds it taken.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f, err := os.Open(lockPath)
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("flock never took the lock")
		}
	}
	saved := lockWait
	lockWait = 300 * time.Millisecond
	defer func() { lockWait = saved }()
	want := fmt.Sprintf("pid %d holds it", holder.Process.Pid)
	_, err := Cancel(dir)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("cancel while another process holds the enrolment: %v, want it to say %q", err, want)
	}
	if err := BeginWith(dir, c.token(), Options{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("begin while another process holds the enrolment: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, PendingFile)); !bytes.Equal(before, after) {
		t.Fatal("the pending enrolment changed while another process held it")
	}
}

// A retirement forgets the node's keys, but an enrolment root began
// before it came keeps the WireGuard key it presents: offered again, it
// is the same offer, and nothing of it is gone.
func TestForgetLeavesAnEnrolmentPending(t *testing.T) {
	dir := t.TempDir()
	c := newControl()
	_, offer := begin(t, dir, c)
	os.WriteFile(filepath.Join(dir, KeysFile), []byte("{}"), 0o600) // the retired node's, as Accept writes it
	if err := Forget(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, KeysFile)); !os.IsNotExist(err) {
		t.Fatalf("the retired node's keys: %v", err)
	}
	again, err := Offer(dir, agentNKey, "host", []byte(`{}`), []byte(`{}`))
	if err != nil || again == nil || again.Keys.WireGuard != offer.Keys.WireGuard {
		t.Fatalf("the pending enrolment after a retirement: %+v %v", again, err)
	}
	// Nothing pending: the WireGuard key goes with the rest.
	if _, err := Cancel(dir); err != nil {
		t.Fatal(err)
	}
	if err := Forget(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "wireguard.key")); !os.IsNotExist(err) {
		t.Fatalf("the WireGuard key with nothing pending: %v", err)
	}
}
