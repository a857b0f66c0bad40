package control_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// keyed is a machine whose executor's identity key the test holds, so it
// can sign what that identity holds when the machine is enrolled again.
type keyed struct {
	machine
	id ed25519.PrivateKey
}

func newKeyed(t *testing.T) *keyed {
	t.Helper()
	m := newMachine(t)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	m.keys.Identity = base64.StdEncoding.EncodeToString(pub)
	kp, _ := nkeys.CreateUser()
	m.nkey = kp
	m.keys.AgentNKey, _ = kp.PublicKey()
	return &keyed{machine: *m, id: priv}
}

// enrolAs enrols a keyed machine as a new node name and returns its grant.
func enrolAs(t *testing.T, s *served, m *keyed, name string) *wire.Grant {
	t.Helper()
	text, _, err := s.client.IssueToken(context.Background(), name, true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	return grantOf(t, s, must(request(t, s, text, m.keys, nil)))
}

// again is what the executor of old (enrolled as node, enrolment) presents
// when root enrols it again with token text: new keys, the held identity
// signed with old's identity key over them.
func again(t *testing.T, text string, old *keyed, node, enrolment string, replace bool) wire.EnrolKeys {
	t.Helper()
	tok, err := wire.ParseToken(text)
	if err != nil {
		t.Fatal(err)
	}
	k := newKeyed(t).keys
	k.Held = &wire.HeldIdentity{Node: node, Enrolment: enrolment, Replace: replace}
	wire.SignHeld(old.id, tok.ID, &k)
	return k
}

func record(t *testing.T, s *served, name string) *control.NodeRecord {
	t.Helper()
	rec, _, err := s.client.Node(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func tokenUnspent(t *testing.T, s *served, text string) bool {
	t.Helper()
	tok, _ := wire.ParseToken(text)
	e, err := s.client.KV.Get(context.Background(), "token."+tok.IDString())
	return err == nil && !strings.Contains(string(e.Value()), `"used"`)
}

// signedRefusal opens a reply's signed refusal.
func signedRefusal(t *testing.T, s *served, r *wire.EnrolReply) *wire.EnrolRefusal {
	t.Helper()
	payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeEnrolRefusal, r.Refusal)
	if err != nil {
		t.Fatalf("the refusal %q is not signed: %v", r.Refused, err)
	}
	ref, err := wire.ParseEnrolRefusal(payload)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// A machine enrolled as a, enrolled again with a --new token: refused
// unless it replaces a; refused before the token is spent, so the same
// token replaces a afterwards; and replacing revokes a in the same step
// as it grants the new node, which the grant says.
func TestANewTokenOnAnEnrolledMachine(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	m := newKeyed(t)
	ga := enrolAs(t, s, m, "a")
	text, _, err := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	before := record(t, s, "a")

	// Not replacing: refused, signed for this very request, and nothing
	// changed — a live, the token unspent, no second node.
	k := again(t, text, m, "a", ga.Enrolment, false)
	r := must(request(t, s, text, k, nil))
	if len(r.Grant) != 0 || !strings.Contains(r.Refused, "this machine is enrolled as node a (enrolment "+ga.Enrolment+"), which is live") ||
		!strings.Contains(r.Refused, "mesh-executor enrol --replace") {
		t.Fatalf("reply %+v", r)
	}
	tok, _ := wire.ParseToken(text)
	if ref := signedRefusal(t, s, r); !ref.Answers(tok.IDString(), wire.Proof(tok.Secret, tok.ID, &k)) || ref.Proof == "" {
		t.Fatalf("the signed refusal does not answer this request alone: %+v", ref)
	}
	if after := record(t, s, "a"); after.NKey != before.NKey || !after.Revoked.IsZero() || after.Enrolment != before.Enrolment {
		t.Fatalf("a changed: %+v", after)
	}
	if !tokenUnspent(t, s, text) {
		t.Fatal("the refusal spent the token")
	}
	if _, _, err := s.client.Node(ctx, "test-host"); err == nil {
		t.Fatal("a second node was made")
	}

	// Replacing, with the same token: granted, a revoked first.
	k = again(t, text, m, "a", ga.Enrolment, true)
	g := grantOf(t, s, must(request(t, s, text, k, nil)))
	if g.Node != "test-host" || g.ReplacedNode != "a" || g.ReplacedEnrolment != ga.Enrolment {
		t.Fatalf("grant %+v", g)
	}
	if a := record(t, s, "a"); a.NKey != "" || a.Revoked.IsZero() {
		t.Fatalf("a after the replacement: %+v", a)
	}
	if n := record(t, s, "test-host"); n.Keys == nil || n.Keys.Held != nil || n.Keys.Identity != k.Identity {
		t.Fatalf("the new node's record keeps %+v", n.Keys)
	}
}

// A replacement is honoured only when the identity it names signed it,
// over this request: a compromised agent (or anyone with a token) can
// neither forge one nor replay one to revoke another node.
func TestAReplacementMustBeSignedByTheIdentityItNames(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	victim := newKeyed(t)
	gv := enrolAs(t, s, victim, "victim")
	thief := newKeyed(t)
	enrolAs(t, s, thief, "thief")
	issue := func() string {
		text, _, err := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
		if err != nil {
			t.Fatal(err)
		}
		return text
	}

	// Forged: the thief names the victim and signs with its own key.
	text := issue()
	r := must(request(t, s, text, again(t, text, thief, "victim", gv.Enrolment, true), nil))
	if len(r.Grant) != 0 || !strings.Contains(r.Refused, "not signed by that node's identity key") {
		t.Fatalf("forged: %+v", r)
	}
	// Replayed: the victim's genuine replacement, made for one token,
	// presented with another.
	genuine := issue()
	stolen := again(t, genuine, victim, "victim", gv.Enrolment, true)
	text = issue()
	r = must(request(t, s, text, stolen, nil))
	if len(r.Grant) != 0 || !strings.Contains(r.Refused, "not signed by that node's identity key") {
		t.Fatalf("replayed: %+v", r)
	}
	// Dropped or flipped on the way: the proof covers it, and such a
	// request gets no signed refusal (it must not end the executor's
	// enrolment).
	text = issue()
	k := again(t, text, victim, "victim", gv.Enrolment, true)
	for name, change := range map[string]func(*wire.EnrolRequest){
		"dropped": func(req *wire.EnrolRequest) { req.Keys.Held = nil },
		"flipped": func(req *wire.EnrolRequest) { h := *req.Keys.Held; h.Replace = false; req.Keys.Held = &h },
	} {
		r = must(request(t, s, text, k, change))
		if len(r.Grant) != 0 || !strings.Contains(r.Refused, "proof does not verify") || len(r.Refusal) != 0 {
			t.Fatalf("%s: %+v", name, r)
		}
	}
	if v := record(t, s, "victim"); v.NKey == "" || !v.Revoked.IsZero() {
		t.Fatalf("the victim was revoked: %+v", v)
	}
	// The genuine one still works with that token.
	if g := grantOf(t, s, must(request(t, s, text, k, nil))); g.ReplacedNode != "victim" {
		t.Fatalf("grant %+v", g)
	}
	if v := record(t, s, "victim"); v.NKey != "" {
		t.Fatal("the replaced node was not revoked")
	}
}

// What stays as it was: a token --node for the node the machine holds
// (it revoked that identity when issued), and a held identity that is no
// longer live, need no --replace.
func TestWhatNeedsNoReplace(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	m := newKeyed(t)
	ga := enrolAs(t, s, m, "a")

	text, _, err := s.client.IssueToken(ctx, "a", false, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	g := grantOf(t, s, must(request(t, s, text, again(t, text, m, "a", ga.Enrolment, false), nil)))
	if g.Node != "a" || g.ReplacedNode != "" {
		t.Fatalf("re-enrolled as itself: %+v", g)
	}
	// The machine still presents the enrolment it held before; a has
	// moved on to another since: nothing is left behind.
	text, _, _ = s.client.IssueToken(ctx, "b", true, time.Hour, s.url)
	if g := grantOf(t, s, must(request(t, s, text, again(t, text, m, "a", ga.Enrolment, false), nil))); g.Node != "b" {
		t.Fatalf("grant %+v", g)
	}
	// Revoked by hand first: likewise.
	m2 := newKeyed(t)
	gc := enrolAs(t, s, m2, "c")
	if err := s.client.RevokeNode(ctx, "c", "test"); err != nil {
		t.Fatal(err)
	}
	text, _, _ = s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	if g := grantOf(t, s, must(request(t, s, text, again(t, text, m2, "c", gc.Enrolment, false), nil))); g.ReplacedNode != "" {
		t.Fatalf("grant %+v", g)
	}
}

// Refusals of the token are signed for any request made with it; a
// refusal of a request whose proof did not verify is never signed.
func TestWhichRefusalsAreSigned(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	text, _, _ := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	m := newMachine(t)
	grantOf(t, s, must(request(t, s, text, m.keys, nil)))
	r := must(request(t, s, text, newMachine(t).keys, nil))
	if ref := signedRefusal(t, s, r); ref.Proof != "" || !strings.Contains(ref.Reason, "was used already") {
		t.Fatalf("used: %+v", ref)
	}
	text, _, _ = s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	r = must(request(t, s, text, m.keys, func(req *wire.EnrolRequest) { req.Keys.Sealing = newMachine(t).keys.Sealing }))
	if !strings.Contains(r.Refused, "proof does not verify") || len(r.Refusal) != 0 {
		t.Fatalf("a substituted key: %+v", r)
	}
}
