package control_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A node's request for new keys, carried in its heartbeat, is answered
// only when its node's identity key signed it: with a token for the node
// (not revoking it: the enrolment the token makes replaces it), sealed to
// the node's sealing key, in an answer the control key signs, on the
// node's notice subject. The same request again is sent the same answer;
// a new one gets a new token, and the one before, unused, is revoked.
// rekeyNode is a node enrolled with an identity and a sealing key of its
// own, linked, that asks for new keys in its heartbeat (heartbeat) and
// reads the answers on its notice subject (next: the answer, and the
// token it carries opened with the sealing key, as text and parsed).
type rekeyNode struct {
	s      *served
	m      *machine
	g      *wire.Grant
	id     *agent.Identity
	idKey  ed25519.PrivateKey
	broker string // where the node says it reaches the broker
	nc     *nats.Conn
	sub    *nats.Subscription
	open   func(*wire.RekeyAnswer) (string, error)
}

func newRekeyNode(t *testing.T, ctx context.Context) *rekeyNode {
	t.Helper()
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	m := newMachine(t)
	idPub, idKey, _ := ed25519.GenerateKey(rand.Reader)
	sealing, err := wire.SealedKEM().GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	m.keys.Identity = base64.StdEncoding.EncodeToString(idPub)
	m.keys.Sealing = base64.StdEncoding.EncodeToString(sealing.PublicKey().Bytes())
	text, _, err := s.client.IssueToken(ctx, "n1", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	g := grantOf(t, s, must(request(t, s, text, m.keys, nil)))
	_, id := identityOf(t, s, m, g)
	var nc *nats.Conn
	eventually(t, "n1 let in", func() bool { nc, err = agent.Dial(id); return err == nil })
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(id.Subjects.Notice)
	if err != nil {
		t.Fatal(err)
	}
	return &rekeyNode{s: s, m: m, g: g, id: id, idKey: idKey, broker: "tls://node-side.example:4222", nc: nc, sub: sub,
		open: func(a *wire.RekeyAnswer) (string, error) {
			return wire.OpenRekeyToken(sealing, a.Node, a.Nonce, a.Token)
		}}
}

func (r *rekeyNode) heartbeat(t *testing.T, req *wire.RekeyRequest) {
	t.Helper()
	data, _ := json.Marshal(&link.Heartbeat{Node: "n1", Enrolment: r.g.Enrolment, At: time.Now().UTC(), Rekey: req, RekeyBroker: r.broker})
	sig, _ := r.id.Sign(data)
	if err := r.nc.PublishMsg(&nats.Msg{Subject: r.id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
		t.Fatal(err)
	}
}

func (r *rekeyNode) next(t *testing.T) (*nats.Msg, *wire.RekeyAnswer, string, *wire.Token) {
	t.Helper()
	msg, err := r.sub.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatal("no answer:", err)
	}
	payload, err := wire.Open(r.s.keys.ControlPublic(), wire.PurposeRekey, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	a, err := wire.ParseRekeyAnswer(payload)
	if err != nil {
		t.Fatal(err)
	}
	text, err := r.open(a)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := wire.ParseToken(text)
	if err != nil {
		t.Fatal(err)
	}
	return msg, a, text, tok
}

func TestARekeyIsAnsweredOnlyUnderTheIdentityKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := newRekeyNode(t, ctx)
	s, g, idKey := r.s, r.g, r.idKey
	heartbeat := func(req *wire.RekeyRequest) { t.Helper(); r.heartbeat(t, req) }
	next := func() (*nats.Msg, *wire.RekeyAnswer, *wire.Token) {
		t.Helper()
		msg, a, _, tok := r.next(t)
		return msg, a, tok
	}
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)

	// Refused, and nothing sent: another key's signature, another
	// enrolment's request. Then the genuine one: its answer is the first.
	heartbeat(wire.SignRekey(otherKey, "n1", g.Enrolment, nonce(1)))
	heartbeat(wire.SignRekey(idKey, "n1", "e-other", nonce(2)))
	heartbeat(wire.SignRekey(idKey, "n1", g.Enrolment, nonce(3)))
	msg, a, tok := next()
	if a.Nonce != nonce(3) || msg.Header.Get(link.RekeyHeader) != nonce(3) || a.Node != "n1" || a.Enrolment != g.Enrolment {
		t.Fatalf("the first answer is %+v (header %q): a refused request was answered", a, msg.Header.Get(link.RekeyHeader))
	}
	if !s.keys.ControlPublic().Equal(ed25519.PublicKey(tok.ControlKey)) {
		t.Fatal("the token pins another control key")
	}
	if tok.BrokerURL != r.broker {
		t.Fatalf("the token names broker %s, not where the node reaches it (%s)", tok.BrokerURL, r.broker)
	}
	rec, _, err := s.client.Node(ctx, "n1")
	if err != nil || rec.NKey == "" || !rec.Revoked.IsZero() || rec.Rekey == nil || rec.Rekey.Token != tok.IDString() {
		t.Fatalf("n1's record after the answer: %+v %v", rec, err)
	}
	if tr := tokenRecord(t, s, tok.IDString()); !tr.Rekey || tr.New || tr.Node != "n1" {
		t.Fatalf("the token's record: %+v", tr)
	}

	// Again, many times at once (a backlog of heartbeats, read after
	// serve's restart): no answer sent again so soon. Once the resend
	// interval has passed, the same answer.
	for range 20 {
		heartbeat(wire.SignRekey(idKey, "n1", g.Enrolment, nonce(3)))
	}
	time.Sleep(control.RekeyResend)
	heartbeat(wire.SignRekey(idKey, "n1", g.Enrolment, nonce(3)))
	if again, _, _ := next(); string(again.Data) != string(msg.Data) {
		t.Fatal("the same request was given another answer")
	}
	// A new request: a new token, and the one before revoked. A broker
	// address that is not one is not put in the token: this side's own is.
	r.broker = "file:///etc/passwd"
	heartbeat(wire.SignRekey(idKey, "n1", g.Enrolment, nonce(4)))
	_, a4, tok4 := next()
	if a4.Nonce != nonce(4) || tok4.IDString() == tok.IDString() {
		t.Fatalf("a new request's answer (the answer before it sent again %s?): %+v", control.RekeyResend, a4)
	}
	if tok4.BrokerURL != s.client.Keys.BrokerURL {
		t.Fatalf("the token names broker %s", tok4.BrokerURL)
	}
	if tr := tokenRecord(t, s, tok.IDString()); tr.Revoked.IsZero() {
		t.Fatal("the token of the answer replaced is still live")
	}
}

// nonce is a rekey request's nonce made of the hex digit b.
func nonce(b byte) string {
	return strings.Repeat(string("0123456789abcdef"[b]), 2*wire.RekeyNonceSize)
}

// A rekey token enrols the node that asked, replacing the enrolment that
// asked: new keys, its record live on them, the rekey no longer pending.
func TestARekeyTokenEnrolsTheNodeThatAsked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := newRekeyNode(t, ctx)
	r.heartbeat(t, wire.SignRekey(r.idKey, "n1", r.g.Enrolment, nonce(7)))
	_, _, text, _ := r.next(t)
	renewed := newMachine(t)
	renewed.keys.Held = &wire.HeldIdentity{Node: "n1", Enrolment: r.g.Enrolment, Replace: true}
	g := grantOf(t, r.s, must(request(t, r.s, text, renewed.keys, nil)))
	if g.Node != "n1" || g.Enrolment == r.g.Enrolment || g.ReplacedEnrolment != r.g.Enrolment {
		t.Fatalf("the rekey's grant: %+v (asked by enrolment %s)", g, r.g.Enrolment)
	}
	rec, _, err := r.s.client.Node(ctx, "n1")
	if err != nil || rec.IsRevoked() || rec.NKey != renewed.keys.AgentNKey || rec.Enrolment != g.Enrolment || rec.Rekey != nil {
		t.Fatalf("n1 after its rekey: %+v %v", rec, err)
	}
}

// A rekey token enrols only the enrolment that asked for it, while that
// enrolment is live. A node revoked — a stolen machine, which holds the
// keys its rekey token was sealed to — is not enrolled again with a rekey
// token issued before the revocation; nor, once a token --node enrolled
// the node on another machine, is the node taken back with it.
func TestARevokedNodeIsNotEnrolledAgainByItsRekeyToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := newRekeyNode(t, ctx)
	r.heartbeat(t, wire.SignRekey(r.idKey, "n1", r.g.Enrolment, nonce(5)))
	_, _, text, tok := r.next(t)
	if _, already, err := r.s.client.Revoke(ctx, "n1", "stolen"); err != nil || already {
		t.Fatalf("revoke: %v (revoked already: %v)", err, already)
	}
	if tr := tokenRecord(t, r.s, tok.IDString()); tr.Revoked.IsZero() {
		t.Fatal("the revoked node's rekey token is still live")
	}
	refused := func(what string, reply *wire.EnrolReply, err error) {
		t.Helper()
		if err == nil && reply.Refused == "" {
			t.Fatalf("%s: granted", what)
		}
	}
	thief := newMachine(t)
	reply, err := request(t, r.s, text, thief.keys, nil)
	refused("the rekey token after the node's revocation", reply, err)
	if rec, _, err := r.s.client.Node(ctx, "n1"); err != nil || !rec.IsRevoked() {
		t.Fatalf("n1 after its rekey token was tried: %+v %v", rec, err)
	}

	// A node enrolled again on another machine (a token --node, after a
	// theft) is not taken back with the rekey token of the enrolment it
	// replaced.
	r2 := newRekeyNode(t, ctx)
	r2.heartbeat(t, wire.SignRekey(r2.idKey, "n1", r2.g.Enrolment, nonce(6)))
	_, _, text2, _ := r2.next(t)
	again, _, err := r2.s.client.IssueToken(ctx, "n1", false, time.Hour, r2.s.url)
	if err != nil {
		t.Fatal(err)
	}
	owner := newMachine(t)
	g := grantOf(t, r2.s, must(request(t, r2.s, again, owner.keys, nil)))
	reply, err = request(t, r2.s, text2, thief.keys, nil)
	refused("a rekey token after the node was enrolled again with a token --node", reply, err)
	if rec, _, err := r2.s.client.Node(ctx, "n1"); err != nil || rec.Enrolment != g.Enrolment || rec.NKey != owner.keys.AgentNKey {
		t.Fatalf("n1 after the old rekey token was tried: %+v %v (enrolled as %s)", rec, err, g.Enrolment)
	}
}

func tokenRecord(t *testing.T, s *served, id string) *control.TokenRecord {
	t.Helper()
	e, err := s.client.KV.Get(context.Background(), "token."+id)
	if err != nil {
		t.Fatal(err)
	}
	var tr control.TokenRecord
	if err := json.Unmarshal(e.Value(), &tr); err != nil {
		t.Fatal(err)
	}
	return &tr
}

// A node whose broker addresses are more than a token carries (a node
// added by hand with a long list) is not answered a token naming this
// side's own address in their place — its configuration would take it,
// and could lose the broker: refused, and the next request, from
// addresses a token carries, is the first answered.
func TestARekeyWhoseBrokerListATokenCannotCarryIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := newRekeyNode(t, ctx)
	r.broker = "tls://a.example:4222" + strings.Repeat(",tls://b.example:4222", 12)
	r.heartbeat(t, wire.SignRekey(r.idKey, "n1", r.g.Enrolment, nonce(1)))
	r.broker = "tls://node-side.example:4222"
	r.heartbeat(t, wire.SignRekey(r.idKey, "n1", r.g.Enrolment, nonce(2)))
	_, a, _, tok := r.next(t)
	if a.Nonce != nonce(2) || tok.BrokerURL != r.broker {
		t.Fatalf("the first answer is to %s naming %s: the request whose addresses a token cannot carry was answered", a.Nonce, tok.BrokerURL)
	}
}
