package serve

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// enrolHere enrols the env's executor as node n1, enrolment e-1, through
// the real path: Begin with a token that pins the test's control key, an
// offer to an agent, and a grant the test's key signs. It returns the
// sealing public key the executor offered, as the control side records it.
func (e *env) enrolHere() []byte {
	e.t.Helper()
	return e.enrolAs("n1", "e-1", e.pub, e.priv)
}

// enrolAs enrols the env's executor as node, enrolment, under the control
// key pub (priv signs the grant), as enrolHere does.
func (e *env) enrolAs(node, enrolment string, pub ed25519.PublicKey, priv ed25519.PrivateKey) []byte {
	e.t.Helper()
	tok := e.beginEnrolment(pub)
	nkey := "U" + strings.Repeat("A", 55) // the form of a NATS user key
	offer, err := enrol.Offer(e.state, nkey, "host", nil, nil)
	if err != nil || offer == nil {
		e.t.Fatalf("offer: %+v %v", offer, err)
	}
	g := wire.Grant{Node: node, Enrolment: enrolment, Token: tok.IDString(),
		IdentityKey: wire.KeyIDOf(offer.Keys.Identity), SealingKey: wire.KeyIDOf(offer.Keys.Sealing),
		WireGuardKey: wire.KeyIDOf(offer.Keys.WireGuard), AgentNKey: nkey, UserJWT: "jwt", Issued: time.Now().UTC()}
	payload, _ := json.Marshal(&g)
	grant, err := wire.Seal(priv, wire.PurposeGrant, payload)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := enrol.Accept(e.state, grant); err != nil {
		e.t.Fatal(err)
	}
	sealing, err := base64.StdEncoding.DecodeString(offer.Keys.Sealing)
	if err != nil {
		e.t.Fatal(err)
	}
	return sealing
}

// beginEnrolment begins an enrolment, as root's mesh-executor enrol does,
// with a token that pins the control key pub.
func (e *env) beginEnrolment(pub ed25519.PublicKey) *wire.Token {
	e.t.Helper()
	tok := &wire.Token{Expires: time.Now().Add(time.Hour), BrokerURL: "tls://broker.example:4222", ControlKey: pub}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	rand.Read(tok.Credential[:])
	if err := enrol.Begin(e.state, tok); err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func (e *env) sealAs(p wire.Purpose, payload []byte) []byte {
	b, err := wire.Seal(e.priv, p, payload)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// sealedFile is a file resource whose content is sealed to pub for node,
// seq and m.<id>.
func sealedFile(t *testing.T, pub []byte, node string, seq uint64, id, content string) string {
	t.Helper()
	s, err := wire.SealContent(pub, node, seq, "m", id, []byte(content))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"module":"m","id":%q,"type":"file","path":"{root}/%s","sealed":%q,"mode":"0600"}`, id, id, s)
}

// lockedBuffer is a log the daemon's goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

const secret = "api-token: s3cret-2718281828\n"

// notCarried fails the test if s holds the secret, its base64 or its plain
// SHA-256.
func notCarried(t *testing.T, where, s string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	for _, bad := range []string{"s3cret", base64.StdEncoding.EncodeToString([]byte(secret)), hex.EncodeToString(sum[:])} {
		if strings.Contains(s, bad) {
			t.Fatalf("%s carries the sealed content (%q)", where, bad)
		}
	}
}

// Over the link, end to end in the daemon: content sealed to the key this
// executor made at enrolment is written; the envelope the agent forwards,
// the streamed lines, the verdict and the log carry only what was sealed;
// content sealed for another sequence is refused whole, touching nothing
// and burning no sequence; reconcile opens it again to repair drift.
func TestSealedFileOverTheLink(t *testing.T) {
	e := newEnv(t, nobody, false)
	pub := e.enrolHere()
	var log lockedBuffer
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody,
		Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	c := e.dial()

	// Sealed for seq 1 and carried in seq 2: refused before anything is
	// touched, the plain file before it included, and seq 2 not burnt.
	wrong := e.seal(e.decl("n1", "e-1", 2, file("plain", "p\n"), sealedFile(t, pub, "n1", 1, "token", secret)))
	before := e.snapshot()
	lines, v := e.push(c, wrong)
	if v.Outcome != shapes.Refused || v.Code != wire.CodeInvalid || !strings.Contains(v.Reason, "sealed content for m.token could not be opened") || len(lines) != 0 {
		t.Fatalf("sealed for another sequence: %+v %+v", v, lines)
	}
	if e.snapshot() != before {
		t.Fatal("a refused declaration with sealed content changed the machine")
	}

	env2 := e.seal(e.decl("n1", "e-1", 2, file("plain", "p\n"), sealedFile(t, pub, "n1", 2, "token", secret)))
	notCarried(t, "the envelope the agent and the broker carry", string(env2))
	lines, v = e.push(c, env2)
	if v.Outcome != shapes.Applied || len(lines) != 2 {
		t.Fatalf("%+v %+v", v, lines)
	}
	token := filepath.Join(e.root, "token")
	if b, _ := os.ReadFile(token); string(b) != secret {
		t.Fatalf("written %q", b)
	}
	if fi, _ := os.Stat(token); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	notCarried(t, "the streamed lines and the verdict", fmt.Sprintf("%+v %+v", lines, v))

	// Drift, repaired by a reconcile that opens the saved target again.
	os.WriteFile(token, []byte("vandal\n"), 0o600)
	if v := e.srv.Reconcile(context.Background(), "test", nil); v.Outcome != shapes.Repaired {
		t.Fatalf("reconcile: %+v", v)
	}
	if b, _ := os.ReadFile(token); string(b) != secret {
		t.Fatalf("not repaired: %q", b)
	}
	notCarried(t, "the executor's log", log.String())
}

// A node registered by hand (an identity, no keys from an enrolment) has
// no sealing key: sealed content is refused whole, legibly, touching
// nothing.
func TestSealedFileOnANodeWithoutKeys(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	k, _ := wire.SealedKEM().GenerateKey()
	before := e.snapshot()
	_, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("plain", "p\n"), sealedFile(t, k.PublicKey().Bytes(), "n1", 1, "token", secret))))
	if v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "sealed content for m.token could not be opened: this host has no sealing key") {
		t.Fatalf("%+v", v)
	}
	if e.snapshot() != before {
		t.Fatal("the refusal changed the machine")
	}
}

// What the agent says of an enrolment with no grant is its word, and reaches
// root's terminal (enrol, status) as text: who refused is one of those it can
// speak for, said as its report; a control sequence in the reason is not
// passed on, and the reason is bounded.
func TestTheAgentsWordOnAnEnrolmentIsShownAsText(t *testing.T) {
	e := newEnv(t, -1, false)
	e.beginEnrolment(e.pub)
	c := e.dial()
	reason := "\x1b]0;owned\a\x1b[2Jthe control side refused" + strings.Repeat("x", 60<<10)
	if err := c.Write(wire.KindGrant, &wire.GrantHandover{RefusedBy: "control side (signed)", Reason: reason}); err != nil {
		t.Fatal(err)
	}
	if k, _, err := c.Read(); err != nil || k != wire.KindGrantReply {
		t.Fatalf("%v %v", k, err)
	}
	r, err := enrol.ReadResult(e.state)
	if err != nil || r == nil {
		t.Fatal(r, err)
	}
	said := r.String()
	if strings.ContainsAny(said, "\x1b\a") || len(said) > wire.MaxLinkError+100 || !strings.HasPrefix(said, "still trying (the agent: ") {
		t.Fatalf("root is shown %q", said[:min(len(said), 200)])
	}
}

// An agent asking for the pending enrolment again and again (every few
// seconds as it waits; a compromised one as often as the rate allows) does
// not have the machine's profile found anew at each ask — commands run as
// root — but the one found within the last minute.
func TestAnEnrolmentOfferDoesNotFindTheProfileAtEveryAsk(t *testing.T) {
	e := newEnv(t, -1, false)
	e.beginEnrolment(e.pub)
	c := e.dial()
	// Once the daemon's own look at its start has ended.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if err := c.Write(wire.KindProfile, &wire.Profile{}); err != nil {
			t.Fatal(err)
		}
		_, body, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		if len(body.(*wire.ProfileReply).Profile) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon never found its profile")
		}
	}
	var profiles [][]byte
	for range 5 {
		if err := c.Write(wire.KindEnrol, &wire.Enrol{AgentNKey: "U" + strings.Repeat("A", 55)}); err != nil {
			t.Fatal(err)
		}
		k, body, err := c.Read()
		if err != nil || k != wire.KindEnrolOffer {
			t.Fatalf("%v %v", k, err)
		}
		o := body.(*wire.EnrolOffer)
		if !o.Pending || len(o.Profile) == 0 {
			t.Fatalf("%+v", o)
		}
		profiles = append(profiles, o.Profile)
	}
	for _, p := range profiles[1:] {
		if !bytes.Equal(p, profiles[0]) {
			t.Fatalf("the profile was found anew within a minute:\n%s\n%s", profiles[0], p)
		}
	}
}

// A plan over the link of a sealed file not on the machine: the plan's
// diff of a file that is not there is shown (it holds only what the
// control plane declares), but sealed content is in no diff — the plan
// reply carries none of it.
func TestAPlanOfSealedContentCarriesNoneOfIt(t *testing.T) {
	e := newEnv(t, nobody, false)
	pub := e.enrolHere()
	c := e.dial()
	p := e.plan(t, c, e.decl("n1", "e-1", 0, file("plain", "p\n"), sealedFile(t, pub, "n1", 0, "token", secret)))
	all, _ := json.Marshal(p)
	notCarried(t, "the plan's reply", string(all))
	if d := p.Diffs["m.plain"]; !strings.HasPrefix(d, "--- /dev/null\n") || !strings.Contains(d, "+p") {
		t.Fatalf("the plain file's diff: %q (%+v)", d, p)
	}
	// The file is not there: its diff says it is sealed, not that the
	// machine holds it.
	if d := p.Diffs["m.token"]; d != engine.SealedNotShown {
		t.Fatalf("the sealed file's diff: %q (%+v)", d, p)
	}
}
