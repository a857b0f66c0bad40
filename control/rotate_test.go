package control_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// walk is what a node holding key takes of chain, as its executor takes
// it (each statement the key in force signs, in order): the key in force
// after.
func walk(t *testing.T, key ed25519.PublicKey, chain [][]byte) ed25519.PublicKey {
	t.Helper()
	for _, env := range chain {
		r, err := wire.OpenRotation(key, nil, env)
		if errors.Is(err, wire.ErrWrongKey) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		key, _ = r.NewKey()
	}
	return key
}

// A rotation cut off between its statements and its switch (serve
// stopped, killed, or the key directory refusing the new key) leaves
// statements naming a key that never signed anything. The next rotation
// from the same key replaces them: a node that was away through both
// takes the chain to the key the control side signs with, not to the
// abandoned one, past the reach of what follows.
func TestARotationCutOffIsReplacedByTheNext(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	text, _, err := s.client.IssueToken(ctx, "n1", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	grantOf(t, s, must(requestWith(t, s, text, newMachine(t).keys, nil, nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}})))
	enrolled := s.client.Keys.ControlPublic()

	// The switch refused: control.key is, for a moment, a directory.
	keyFile := filepath.Join(dir, control.FileControlKey)
	saved, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(keyFile)
	os.MkdirAll(filepath.Join(keyFile, "in-the-way"), 0o700)
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err == nil {
		t.Fatal("a rotation whose switch failed said it was done")
	}
	os.RemoveAll(keyFile)
	os.WriteFile(keyFile, saved, 0o600)
	if !s.client.Keys.ControlPublic().Equal(enrolled) {
		t.Fatal("a rotation whose switch failed signs with its new key")
	}
	rec, _, _ := s.client.Node(ctx, "n1")
	if len(rec.Rotations) != 1 {
		t.Fatalf("the cut-off rotation left %d statements", len(rec.Rotations))
	}

	res, err := s.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, _ = s.client.Node(ctx, "n1")
	if got := walk(t, enrolled, rec.Rotations); !got.Equal(s.client.Keys.ControlPublic()) || wire.KeyID(got) != res.To {
		t.Fatalf("a node away through both takes the chain to key %s; the control side signs with %s (%d statements)",
			wire.KeyID(got), wire.KeyID(s.client.Keys.ControlPublic()), len(rec.Rotations))
	}
	// And on, through a routine rotation after it.
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err != nil {
		t.Fatal(err)
	}
	rec, _, _ = s.client.Node(ctx, "n1")
	if got := walk(t, enrolled, rec.Rotations); !got.Equal(s.client.Keys.ControlPublic()) || len(rec.Rotations) != 2 {
		t.Fatalf("after another rotation: the chain (%d) leads to %s, the control side signs with %s", len(rec.Rotations), wire.KeyID(got), wire.KeyID(s.client.Keys.ControlPublic()))
	}
}

// nodes tells a node that has not taken a rotation from one that cannot:
// no rotation kept retires the key it holds, and it is to be enrolled
// again.
func TestNodesSaysWhoCannotTakeARotation(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	text, _, err := s.client.IssueToken(ctx, "n1", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	_, id := identityOf(t, s, m, grantOf(t, s, must(requestWith(t, s, text, m.keys, nil, nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}}))))
	enrolled := wire.KeyID(s.client.Keys.ControlPublic())
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	eventually(t, "n1 let in", func() bool { nc, err = agent.Dial(id); return err == nil })
	defer nc.Close()
	for _, c := range []struct {
		holds            string
		pending, unreach bool
	}{
		{enrolled, true, false},
		{"00000000000000aa", true, true},
		{wire.KeyID(s.client.Keys.ControlPublic()), false, false},
	} {
		data, _ := json.Marshal(link.Heartbeat{Node: "n1", Enrolment: id.Enrolment, At: time.Now().UTC(), Interval: 30, State: link.StateEnrolled,
			Executor: &link.ExecutorStatus{Version: "v", ControlKeyID: c.holds}})
		sig, _ := id.Sign(data)
		if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		eventually(t, "nodes to read the heartbeat", func() bool {
			ns, err := s.client.Nodes(ctx)
			return err == nil && len(ns) == 1 && ns[0].ControlKeyID == c.holds
		})
		ns, _ := s.client.Nodes(ctx)
		if ns[0].RotationPending != c.pending || ns[0].RotationOutOfReach != c.unreach {
			t.Errorf("a node holding %s: pending %v, out of reach %v", c.holds, ns[0].RotationPending, ns[0].RotationOutOfReach)
		}
	}
}

// listening is a node enrolled with this release's capability and a
// sealing key, linked, listening on its notice subject.
type listening struct {
	id  *agent.Identity
	nc  *nats.Conn
	sub *nats.Subscription
}

func enrolListening(t *testing.T, s *served, name string) *listening {
	t.Helper()
	_, m, g := enrolSealingWith(t, s, name, nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}})
	_, id := identityOf(t, s, m, g)
	n := &listening{id: id}
	var err error
	eventually(t, name+" let in", func() bool { n.nc, err = agent.Dial(id); return err == nil })
	t.Cleanup(n.nc.Close)
	if n.sub, err = n.nc.SubscribeSync(id.Subjects.Notice); err != nil {
		t.Fatal(err)
	}
	n.nc.Flush()
	return n
}

// heartbeat sends a heartbeat whose executor holds the key of id held,
// its agent the broker certificates' statement of sequence pins.
func (n *listening) heartbeat(t *testing.T, held string, pins uint64) {
	t.Helper()
	data, _ := json.Marshal(link.Heartbeat{Node: n.id.Node, Enrolment: n.id.Enrolment, At: time.Now().UTC(), Interval: 30, State: link.StateEnrolled,
		BrokerPinsSeq: pins, Executor: &link.ExecutorStatus{Version: "v", ControlKeyID: held}})
	sig, _ := n.id.Sign(data)
	if err := n.nc.PublishMsg(&nats.Msg{Subject: n.id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
		t.Fatal(err)
	}
}

// statementsAlone is the next message on the node's notice subject within
// wait that carries statements alone (nil: none); what else comes
// meanwhile (a declaration's notice) is passed over.
func (n *listening) statementsAlone(t *testing.T, wait time.Duration) *nats.Msg {
	t.Helper()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		m, err := n.sub.NextMsg(time.Until(deadline))
		if err != nil {
			return nil
		}
		if m.Header.Get(link.StatementsHeader) != "" {
			if len(m.Data) != 0 || m.Header.Get(link.HeaderSequence) != "" || m.Header.Get(link.RotationHeader) == "" && m.Header.Get(link.PinsHeader) == "" {
				t.Fatalf("statements alone, as sent: body %d bytes, headers %v", len(m.Data), m.Header)
			}
			return m
		}
	}
	return nil
}

// alone is statementsAlone that carry the control key's rotations.
func (n *listening) alone(t *testing.T, wait time.Duration) *nats.Msg {
	t.Helper()
	m := n.statementsAlone(t, wait)
	if m != nil && m.Header.Get(link.RotationHeader) == "" {
		t.Fatalf("statements alone without the rotations: %v", m.Header)
	}
	return m
}

// Where a rotation's statements are sent alone (link.StatementsHeader):
// to a node with no declaration on its subject, at the rotation and again
// at a heartbeat naming the retired key (once a node and key every 10 s);
// not to one whose declaration carries them (signed again), nor to one
// held on sealed content — unless the rotation is a recovery's, which a
// node not holding it is sent alone, held or not, for a node held on the
// stolen key would take the thief's declarations until its next one.
func TestARotationAloneGoesWhereNothingCarriesIt(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bare, declared, sealed := enrolListening(t, s, "bare"), enrolListening(t, s, "declared"), enrolListening(t, s, "sealed")
	if _, err := s.client.Declare(ctx, "declared", []byte(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"/srv/f","content":"x\n"}]}`)); err != nil {
		t.Fatal(err)
	}
	sealer := *s.client
	sealer.Seals = map[string][]byte{"app.token": []byte("secret\n")}
	if _, err := sealer.Declare(ctx, "sealed", []byte(sealedDecl)); err != nil {
		t.Fatal(err)
	}
	enrolled := wire.KeyID(s.client.Keys.ControlPublic())

	res, err := s.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Nodes != 3 || res.Republished != 1 || res.Alone != 1 || len(res.Held) != 1 || res.Held[0] != "sealed" {
		t.Fatalf("the rotation: %+v", res)
	}
	if bare.alone(t, 5*time.Second) == nil {
		t.Fatal("bare, never declared to, was not sent the rotation alone")
	}
	for name, n := range map[string]*listening{"declared": declared, "sealed": sealed} {
		if n.alone(t, time.Second) != nil {
			t.Fatalf("%s, with a declaration on its subject, was sent the rotation alone", name)
		}
	}
	// Heartbeats naming the retired key.
	for _, n := range []*listening{bare, declared, sealed} {
		n.heartbeat(t, enrolled, 0)
	}
	if bare.alone(t, 5*time.Second) == nil {
		t.Fatal("bare's heartbeat naming the retired key was not answered")
	}
	for name, n := range map[string]*listening{"declared": declared, "sealed": sealed} {
		if n.alone(t, time.Second) != nil {
			t.Fatalf("%s's heartbeat was answered with the rotation alone", name)
		}
	}
	bare.heartbeat(t, enrolled, 0)
	if bare.alone(t, time.Second) != nil {
		t.Fatal("bare's second heartbeat within 10 s was answered again")
	}

	// The key stolen: the recovery's rotation, sealed's newest declaration
	// signed by the key it retires.
	if _, err := sealer.Declare(ctx, "sealed", []byte(sealedDecl)); err != nil {
		t.Fatal(err)
	}
	routine := wire.KeyID(s.client.Keys.ControlPublic())
	res, err = s.client.RotateKey(ctx, control.RotateRequest{RecoveryKeyFile: filepath.Join(dir, control.FileRecoveryKey)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Alone != 1 || len(res.Held) != 1 {
		t.Fatalf("the recovery: %+v", res)
	}
	for name, n := range map[string]*listening{"bare": bare, "sealed": sealed} {
		if n.alone(t, 5*time.Second) == nil {
			t.Fatalf("%s was not sent the recovery alone", name)
		}
	}
	declared.heartbeat(t, routine, 0)
	if declared.alone(t, 5*time.Second) == nil {
		t.Fatal("declared's heartbeat naming a key the recovery retires was not answered with it alone")
	}
}

// The broker certificates' statement is sent alone to a node whose
// heartbeat says it has not taken it, whatever its subject holds (it
// invalidates nothing), once a node and holding every 10 s; a heartbeat
// that says it took it is answered with nothing.
func TestBrokerPinsAloneGoWhereNotTaken(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bare, declared := enrolListening(t, s, "bare"), enrolListening(t, s, "declared")
	if _, err := s.client.Declare(ctx, "declared", []byte(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"/srv/f","content":"x\n"}]}`)); err != nil {
		t.Fatal(err)
	}
	res, err := s.client.RotateCert(ctx, control.CertRequest{}, s.srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Republished != 1 || res.Alone != 1 {
		t.Fatalf("the announcement: %+v", res)
	}
	pinsOf := func(m *nats.Msg) bool {
		return m != nil && m.Header.Get(link.PinsHeader) != "" && m.Header.Get(link.RotationHeader) == ""
	}
	if m := bare.statementsAlone(t, 5*time.Second); !pinsOf(m) {
		t.Fatalf("bare, never declared to, sent at the announcement: %v", m)
	}
	if m := declared.statementsAlone(t, time.Second); m != nil {
		t.Fatalf("declared, its declaration signed again, sent alone too: %v", m.Header)
	}
	key := wire.KeyID(s.client.Keys.ControlPublic())
	declared.heartbeat(t, key, 0)
	if m := declared.statementsAlone(t, 5*time.Second); !pinsOf(m) {
		t.Fatalf("declared's heartbeat without the statement answered with %v", m)
	}
	declared.heartbeat(t, key, 0)
	if m := declared.statementsAlone(t, time.Second); m != nil {
		t.Fatal("declared's second heartbeat within 10 s answered again")
	}
	bare.heartbeat(t, key, res.Seq)
	if m := bare.statementsAlone(t, time.Second); m != nil {
		t.Fatal("a heartbeat that took the statement answered with it")
	}

	// The control key rotated: the statement, signed again by the new
	// key, goes to a node on the retired one with the rotations beside it,
	// though its subject holds a declaration to carry them.
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err != nil {
		t.Fatal(err)
	}
	declared.heartbeat(t, key, 0)
	if m := declared.statementsAlone(t, 5*time.Second); m == nil || m.Header.Get(link.PinsHeader) == "" || m.Header.Get(link.RotationHeader) == "" {
		t.Fatalf("a node on the retired key, without the statement: %v", m)
	}
}

// The broker certificates' statement follows the control key: a rotation
// signs it again under its sequence, so a node that took the rotation
// takes it, and the key directory read again knows its sequence.
func TestThePinsStatementFollowsTheControlKey(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	enrolListening(t, s, "n1")
	cert, err := s.client.RotateCert(ctx, control.CertRequest{}, s.srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err != nil {
		t.Fatal(err)
	}
	payload, err := wire.Open(s.client.Keys.ControlPublic(), wire.PurposeBrokerPins, s.client.Keys.BrokerPins())
	if err != nil {
		t.Fatalf("the statement after the rotation does not verify under the new key: %v", err)
	}
	if bp, err := wire.ParseBrokerPins(payload); err != nil || bp.Seq != cert.Seq || len(bp.Pins) != 2 {
		t.Fatalf("the statement after the rotation: %+v, %v", bp, err)
	}
	k, err := control.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k.BrokerPinsSeq() != cert.Seq {
		t.Fatalf("the key directory read again says statement %d, want %d", k.BrokerPinsSeq(), cert.Seq)
	}
}

// A node held through a rotation (its newest declaration sealed) is named
// held at the next one too: its declaration, signed by a key before the
// one retired, is nothing this side can check, so nothing it signs again.
func TestANodeHeldThroughTwoRotationsIsNamedHeld(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	enrolListening(t, s, "sealed")
	sealer := *s.client
	sealer.Seals = map[string][]byte{"app.token": []byte("secret\n")}
	if _, err := sealer.Declare(ctx, "sealed", []byte(sealedDecl)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res, err := s.client.RotateKey(ctx, control.RotateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Republished != 0 || len(res.Held) != 1 || res.Held[0] != "sealed" {
			t.Fatalf("rotation %d: %+v", i+1, res)
		}
	}
}

// A rotation refused for the nodes that may not take one says which are
// of a release before rotations and which were added by hand and never
// heard from (their release unknown, not old).
func TestARotationRefusedSaysWhyOfEachNode(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := s.client.AddNode(ctx, "byhand", ""); err != nil {
		t.Fatal(err)
	}
	text, _, err := s.client.IssueToken(ctx, "oldrel", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	identityOf(t, s, m, grantOf(t, s, must(requestWith(t, s, text, m.keys, nil, nil)))) // no capability said: a release before it
	_, err = s.client.RotateKey(ctx, control.RotateRequest{})
	if err == nil {
		t.Fatal("rotated with nodes that cannot take it")
	}
	msg := err.Error()
	before, byHand := strings.Index(msg, "release before rotations"), strings.Index(msg, "added by hand")
	if before < 0 || byHand < 0 || !strings.Contains(msg[before:byHand], "oldrel") || !strings.Contains(msg[byHand:], "byhand") || strings.Contains(msg[before:byHand], "byhand") {
		t.Fatalf("the refusal: %s", msg)
	}
}
