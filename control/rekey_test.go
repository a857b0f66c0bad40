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
func TestARekeyIsAnsweredOnlyUnderTheIdentityKey(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
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
	defer nc.Close()
	answers, err := nc.SubscribeSync(id.Subjects.Notice)
	if err != nil {
		t.Fatal(err)
	}
	broker := "tls://node-side.example:4222" // where the node reaches the broker
	heartbeat := func(r *wire.RekeyRequest) {
		t.Helper()
		data, _ := json.Marshal(&link.Heartbeat{Node: "n1", Enrolment: g.Enrolment, At: time.Now().UTC(), Rekey: r, RekeyBroker: broker})
		sig, _ := id.Sign(data)
		if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
	}
	next := func() (*nats.Msg, *wire.RekeyAnswer, *wire.Token) {
		t.Helper()
		msg, err := answers.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatal("no answer:", err)
		}
		payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeRekey, msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		a, err := wire.ParseRekeyAnswer(payload)
		if err != nil {
			t.Fatal(err)
		}
		text, err := wire.OpenRekeyToken(sealing, a.Node, a.Nonce, a.Token)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := wire.ParseToken(text)
		if err != nil {
			t.Fatal(err)
		}
		return msg, a, tok
	}
	nonce := func(b byte) string { return strings.Repeat(string("0123456789abcdef"[b]), 2*wire.RekeyNonceSize) }
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
	if tok.BrokerURL != broker {
		t.Fatalf("the token names broker %s, not where the node reaches it (%s)", tok.BrokerURL, broker)
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
	broker = "file:///etc/passwd"
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
