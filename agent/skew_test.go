package agent_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The agent holds the control side to the version skew policy by the
// capability it says beside what it publishes (link.CapabilityHeader): a
// genuine declaration, or plan request, from a control side too far ahead
// never reaches the executor, and is reported refused, saying both
// capabilities and what to upgrade; one with no capability said (a
// release before it) is within the policy and applied. Its heartbeat says
// its own capability.
func TestTheAgentHoldsTheControlSideToTheSkewPolicy(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s1 := c.declare("n1", fmt.Sprintf(motd, 1))
	c.reports("n1", "seq 1 applied", hasReport(s1, shapes.Applied))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	far := strconv.Itoa(link.Capability + link.Skew + 1)
	// Signed by the pinned key and addressed right, carried by a notice
	// as publishDecl carries one, with the capability given.
	carry := func(seq uint64, capability string) {
		h := nats.Header{}
		if capability != "" {
			h.Set(link.CapabilityHeader, capability)
		}
		c.carry(t, "n1", cfg.Enrolment, seq, h)
	}
	carry(s1+1, far)
	rs := c.reports("n1", "the declaration from a control side too far ahead refused", func(rs []*control.SignedReport) bool {
		return slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return r.Seq == s1+1 && r.Outcome == shapes.Refused })
	})
	r := rs[slices.IndexFunc(rs, func(r *control.SignedReport) bool { return r.Seq == s1+1 })]
	if r.Code != "skew" || r.RefusedBy != "agent" || !strings.Contains(r.Refused, "the control side speaks link capability "+far) ||
		!strings.Contains(r.Refused, "upgrade this agent") {
		t.Fatalf("the refusal: code %q by %q: %q", r.Code, r.RefusedBy, r.Refused)
	}
	carry(s1+2, "")
	c.reports("n1", "a declaration with no capability said applied", hasReport(s1+2, shapes.Applied))
	// The declarations carried here were never stored in the stream, so
	// a read of the subject that comes after one (a wake whose notice the
	// carried declaration already answered) finds s1 as the newest, no
	// longer the one last settled, and offers it again: the executor takes
	// it as the no-op it is. What is judged is that s1+1 never reached it.
	if got, _, _ := ex.snapshot(); !slices.Equal(slices.Compact(slices.Clone(got)), []uint64{s1, s1 + 2}) {
		t.Fatalf("the executor got %v, want %v (s1 perhaps twice)", got, []uint64{s1, s1 + 2})
	}

	// A plan request alike.
	env := sealPlan(t, c, id, "skewed-plan", time.Now().Add(time.Minute).UTC())
	c.client.NC.PublishMsg(&nats.Msg{Subject: id.Subjects.Plan, Data: env, Header: nats.Header{link.CapabilityHeader: []string{far}}})
	p, err := c.client.WaitPlan(ctx, "n1", "skewed-plan", 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Outcome != shapes.Refused || p.Code != "skew" || !strings.Contains(p.Refused, "upgrade this agent") {
		t.Fatalf("the plan's report: %s, code %q: %q", p.Outcome, p.Code, p.Refused)
	}
	ex.mu.Lock()
	plans := ex.plans
	ex.mu.Unlock()
	if plans != 0 {
		t.Fatalf("the executor was asked %d plan(s)", plans)
	}

	hbs, err := c.client.JS.Stream(ctx, link.HeartbeatStream)
	if err != nil {
		t.Fatal(err)
	}
	var m *jetstream.RawStreamMsg
	waitFor(t, "a heartbeat", func() bool {
		m, err = hbs.GetLastMsgForSubject(ctx, link.SubjectsOf("n1").Heartbeat)
		return err == nil
	})
	var hb link.Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil || hb.Capability != link.Capability {
		t.Fatalf("the heartbeat says capability %d (%v), want %d", hb.Capability, err, link.Capability)
	}
}

// A rotation of the control key reaches a node's roster as well as its
// declarations: the roster the new key signed, met before the rotation
// (read first, by a node linking again), is passed over rather than
// settled as refused, and
// read again once the declaration that carries the rotation is taken —
// before that declaration, whose overlay takes its peers from it, reaches
// the executor.
func TestARotationReachesTheRoster(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id := c.addNodeOfThisRelease("n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	state := t.TempDir()
	stop := runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	if _, err := c.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.PublishRoster(ctx); err != nil {
		t.Fatal(err)
	}
	s1 := c.declare("n1", fmt.Sprintf(overlayDecl, ""))
	waitFor(t, "the overlay declaration", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("decl %d", s1)) })

	// Away through the rotation: linking again, the agent reads the
	// roster before the declaration, as it always does.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := c.client.Keys.ControlPublic()
	res, err := c.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	runAgentIn(t, id, ex.path, 0, state)
	r, err := c.client.LastRoster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the roster the new key signed handed over", func() bool {
		return slices.Contains(ex.eventsSeen(), fmt.Sprintf("roster %d", r.Seq))
	})
	ev := ex.eventsSeen()
	rot, ros := slices.Index(ev, fmt.Sprintf("rotation %d", res.Seq)), slices.Index(ev, fmt.Sprintf("roster %d", r.Seq))
	if rot < 0 || ros < rot || c.client.Keys.ControlPublic().Equal(before) {
		t.Fatalf("the executor saw %v; want the rotation, then the new roster", ev)
	}
	if _, _, garbage := ex.snapshot(); len(garbage) != 0 {
		t.Fatalf("the executor was handed what it could not verify: %v", garbage)
	}
	rs, _, _ := c.client.Reports(ctx, "n1", 50)
	for _, rp := range rs {
		if rp.Trigger == link.TriggerRoster && rp.Outcome == shapes.Refused {
			t.Fatalf("a roster reported refused: %s", rp.Refused)
		}
	}
}

// The broker certificates a node accepts change only by a statement the
// control key signs, carried beside a declaration: one signed by another
// key is passed over; the genuine one is kept in the agent's state and
// accepted from the next handshake.
func TestBrokerPinsOnlyFromTheControlKey(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	state := t.TempDir()
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	theirs := strings.Repeat("ee", 32)
	carry := func(seq uint64, signer ed25519.PrivateKey) {
		pins, _ := json.Marshal(&wire.BrokerPins{Seq: seq, Pins: []string{id.Pin, theirs}, Issued: time.Now().UTC()})
		stmt, _ := wire.Seal(signer, wire.PurposeBrokerPins, pins)
		c.carry(t, "n1", cfg.Enrolment, seq, nats.Header{link.PinsHeader: []string{base64.StdEncoding.EncodeToString(stmt)}})
	}
	pinned := func() []string {
		var st struct {
			Pins []string `json:"broker_pins"`
		}
		b, _ := os.ReadFile(filepath.Join(state, "agent.json"))
		json.Unmarshal(b, &st)
		return st.Pins
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	carry(1, other)
	c.reports("n1", "seq 1 applied", hasReport(1, shapes.Applied))
	if p := pinned(); len(p) != 0 || len(id.Pins()) != 1 {
		t.Fatalf("a statement another key signed was taken: %v", p)
	}
	carry(2, c.keys.Control)
	c.reports("n1", "seq 2 applied", hasReport(2, shapes.Applied))
	if p := pinned(); len(p) != 2 || p[1] != theirs || !slices.Contains(id.Pins(), theirs) {
		t.Fatalf("the control key's statement: state %v, accepted %v", p, id.Pins())
	}

	// The same, sent alone (link.StatementsHeader): another key's, of a
	// later sequence, passed over — taken, it would keep the control
	// key's, sent after it, from being taken.
	alone := func(seq uint64, signer ed25519.PrivateKey, pin string) {
		pins, _ := json.Marshal(&wire.BrokerPins{Seq: seq, Pins: []string{id.Pin, pin}, Issued: time.Now().UTC()})
		stmt, _ := wire.Seal(signer, wire.PurposeBrokerPins, pins)
		if err := c.client.NC.PublishMsg(&nats.Msg{Subject: id.Subjects.Notice, Header: nats.Header{
			link.StatementsHeader: []string{"1"}, link.PinsHeader: []string{base64.StdEncoding.EncodeToString(stmt)}}}); err != nil {
			t.Fatal(err)
		}
	}
	alone(5, other, strings.Repeat("dd", 32))
	time.Sleep(time.Second)
	alone(4, c.keys.Control, strings.Repeat("cc", 32))
	waitFor(t, "the control key's statement sent alone, taken", func() bool {
		p := pinned()
		return len(p) == 2 && p[1] == strings.Repeat("cc", 32)
	})
}

// An agent started after a rotation its executor took checks what it is
// sent under the key the executor holds, not its enrolment's: a statement
// of the broker's certificates the new key signed, sent alone before any
// declaration, is taken.
func TestAStatementAfterARestartIsCheckedUnderTheKeyInForce(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	_, rotated, _ := ed25519.GenerateKey(rand.Reader)
	ex := newFakeExecutor(t, rotated.Public().(ed25519.PublicKey), "b1")
	state := t.TempDir()
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	theirs := strings.Repeat("cc", 32)
	pins, _ := json.Marshal(&wire.BrokerPins{Seq: 1, Pins: []string{id.Pin, theirs}, Issued: time.Now().UTC()})
	stmt, _ := wire.Seal(rotated, wire.PurposeBrokerPins, pins)
	if err := c.client.NC.PublishMsg(&nats.Msg{Subject: id.Subjects.Notice, Header: nats.Header{
		link.StatementsHeader: []string{"1"}, link.PinsHeader: []string{base64.StdEncoding.EncodeToString(stmt)}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the statement the executor's key signed, taken", func() bool { return slices.Contains(id.Pins(), theirs) })
}

// The broker certificates a statement named belong to the enrolment that
// took them: enrolled again (its token pinning the certificate the broker
// presents now), the node links with that one, not with what its state
// kept of a statement taken before — an older certificate after a switch
// would keep it off the broker for good — and its heartbeat says it holds
// no statement, so the control side sends it the newest.
func TestPinsOfAnEarlierEnrolmentGiveWay(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	state := t.TempDir()
	stale, _ := json.Marshal(map[string]any{"broker_pins": []string{strings.Repeat("ee", 32)}, "pins_seq": 4, "pins_enrolment": "e-before", "format": 1})
	if err := os.WriteFile(filepath.Join(state, "agent.json"), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "linked with the certificate its enrolment pinned", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	var st struct {
		Pins []string `json:"broker_pins"`
		Seq  uint64   `json:"pins_seq"`
	}
	b, _ := os.ReadFile(filepath.Join(state, "agent.json"))
	json.Unmarshal(b, &st)
	if len(st.Pins) != 0 || st.Seq != 0 {
		t.Fatalf("the state kept the earlier enrolment's statement: %+v", st)
	}
}

// A declaration signed by a rotated control key, read while the executor
// — which says which key is in force — is down, is not refused for good:
// the agent cannot judge it yet, leaves it unsettled, and forwards it once
// the executor is back, without a timer's read or a newer declaration.
// Settled as refused (wrong-key), it would leave the node behind its
// newest declaration until the next one came.
func TestARotatedKeysDeclarationWaitsForTheExecutor(t *testing.T) {
	c, ex := linkedOfThisRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s1 := c.declare("n1", fmt.Sprintf(motd, 1))
	waitFor(t, "the first declaration", func() bool { d, _, _ := ex.snapshot(); return slices.Contains(d, s1) })

	ex.down()
	res, err := c.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s2 := c.declare("n1", fmt.Sprintf(motd, 2))
	// The agent has read it, and tried its executor (its retries, 100 ms
	// apart here), before the executor comes back.
	time.Sleep(2 * time.Second)
	refused := func(rs []*control.SignedReport) *control.SignedReport {
		for _, r := range rs {
			if r.Seq == s2 || r.Outcome == shapes.Refused && r.RefusedBy == "agent" {
				return r
			}
		}
		return nil
	}
	rs, _, err := c.client.Reports(ctx, "n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := refused(rs); r != nil {
		t.Fatalf("reported while the executor was down: seq %d %s %s %s", r.Seq, r.Outcome, r.Code, r.Refused)
	}

	ex.up()
	waitFor(t, "the declaration the new key signed, forwarded once the executor is back", func() bool {
		d, _, _ := ex.snapshot()
		return slices.Contains(d, s2)
	})
	ev := ex.eventsSeen()
	if rot, dec := slices.Index(ev, fmt.Sprintf("rotation %d", res.Seq)), slices.Index(ev, fmt.Sprintf("decl %d", s2)); rot < 0 || dec < rot {
		t.Fatalf("the executor saw %v; want the rotation, then the declaration", ev)
	}
	c.reports("n1", "its report applied", func(rs []*control.SignedReport) bool {
		for _, r := range rs {
			if r.Seq == s2 && r.Outcome == shapes.Applied {
				return true
			}
			if r.Outcome == shapes.Refused {
				t.Fatalf("a refusal reported: seq %d %s %s", r.Seq, r.Code, r.Refused)
			}
		}
		return false
	})
	if _, _, garbage := ex.snapshot(); len(garbage) != 0 {
		t.Fatalf("the executor was handed what it could not verify: %v", garbage)
	}
}

// A node with no declaration to carry a rotation is sent the statements
// alone: the agent hands them to the executor, with no declaration, and
// follows the key the executor says is in force — what the new key signs
// next is forwarded with nothing refused on the way.
func TestARotationAloneIsHandedToTheExecutor(t *testing.T) {
	c, ex := linkedOfThisRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	res, err := c.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Republished != 0 || res.Alone != 1 {
		t.Fatalf("the rotation of a node never declared to: %+v", res)
	}
	waitFor(t, "the rotation handed to the executor", func() bool {
		return slices.Contains(ex.eventsSeen(), fmt.Sprintf("rotation %d", res.Seq))
	})
	s1 := c.declare("n1", fmt.Sprintf(motd, 1))
	c.reports("n1", "the first declaration the new key signed, applied", func(rs []*control.SignedReport) bool {
		for _, r := range rs {
			if r.Outcome == shapes.Refused {
				t.Fatalf("a refusal reported: seq %d %s %s", r.Seq, r.Code, r.Refused)
			}
			if r.Seq == s1 && r.Outcome == shapes.Applied {
				return true
			}
		}
		return false
	})
	if _, _, garbage := ex.snapshot(); len(garbage) != 0 {
		t.Fatalf("the executor was handed what it could not verify: %v", garbage)
	}
}

// linkedOfThisRelease is a control side and node n1 of this release, its
// agent linked (reading on notices alone: no timer) to a fake executor
// that has been told the link is up.
func linkedOfThisRelease(t *testing.T) (*controlSide, *fakeExecutor) {
	t.Helper()
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id := c.addNodeOfThisRelease("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentIn(t, id, ex.path, time.Hour, t.TempDir())
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	return c, ex
}

// addNodeOfThisRelease is addNode with the node's record saying this
// release's link capability, as its agent's heartbeat would: the control
// side rotates its key only when every node can take a rotation.
func (c *controlSide) addNodeOfThisRelease(name string) *agent.Identity {
	c.t.Helper()
	id, _ := c.addNode(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, rev, err := c.client.Node(ctx, name)
	if err != nil {
		c.t.Fatal(err)
	}
	rec.Capability = link.Capability
	data, _ := json.Marshal(rec)
	if _, err := c.client.KV.Update(ctx, "node."+name, data, rev); err != nil {
		c.t.Fatal(err)
	}
	return id
}

// A statement of the broker's certificates that cannot be kept (the
// agent's disk full) is not taken: the control side switches the broker's
// certificate on what the heartbeats say the node holds, and pins held in
// memory alone would be gone after a restart, the node kept off the
// broker for good. Sent again once there is room, it is taken.
func TestBrokerPinsAreTakenOnlyOnceKept(t *testing.T) {
	state, fill := agent.SmallDisk(t, "256k")
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	waitFor(t, "the agent's state written", func() bool { _, err := os.Stat(filepath.Join(state, "agent.json")); return err == nil })
	theirs := strings.Repeat("ee", 32)
	send := func() {
		pins, _ := json.Marshal(&wire.BrokerPins{Seq: 1, Pins: []string{id.Pin, theirs}, Issued: time.Now().UTC()})
		stmt, _ := wire.Seal(c.keys.Control, wire.PurposeBrokerPins, pins)
		if err := c.client.NC.PublishMsg(&nats.Msg{Subject: id.Subjects.Notice, Header: nats.Header{
			link.StatementsHeader: []string{"1"}, link.PinsHeader: []string{base64.StdEncoding.EncodeToString(stmt)}}}); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() uint64 {
		var st struct {
			Seq uint64 `json:"pins_seq"`
		}
		b, _ := os.ReadFile(filepath.Join(state, "agent.json"))
		json.Unmarshal(b, &st)
		return st.Seq
	}
	fill()
	send()
	time.Sleep(2 * time.Second)
	if slices.Contains(id.Pins(), theirs) || kept() != 0 {
		t.Fatalf("a statement that could not be kept was taken: accepted %v, kept seq %d", id.Pins(), kept())
	}
	os.Remove(filepath.Join(state, "filler"))
	send()
	waitFor(t, "the statement sent again, kept and taken", func() bool { return kept() == 1 && slices.Contains(id.Pins(), theirs) })
}

// What the agent learnt of the link's sequences belongs to the enrolment
// it learnt them in: a host retired and enrolled as another node (whose
// declarations begin at 1 again) has the new node's first declaration
// handed to its executor, not refused as older than the old node's last.
func TestSequencesOfAnEarlierEnrolmentGiveWay(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	state := t.TempDir()
	stale, _ := json.Marshal(map[string]any{"enrolment": "e-before", "last_applied": 50, "last_seq": 50, "last_stream_seq": 99, "format": 1})
	if err := os.WriteFile(filepath.Join(state, "agent.json"), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "linked", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	seq := c.declare("n1", `{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"/etc/motd","content":"new node\n"}]}`)
	waitFor(t, "the new node's first declaration handed to the executor", func() bool {
		d, _, _ := ex.snapshot()
		return slices.Contains(d, seq)
	})
}

// A declaration the agent could not hand over, its executor down, goes as
// soon as the executor answers the agent's look again — not at the end of
// the back-off it began then, here a minute, past this test's wait.
func TestADeclarationGoesOnceTheExecutorIsBack(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id := c.addNodeOfThisRelease("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	// Linked once with the tests' short waits (a node just added may be
	// refused until the broker knows it), then again with a minute's.
	state := t.TempDir()
	stop := runAgentIn(t, id, ex.path, time.Hour, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	stop()
	runAgentWith(t, id, ex.path, state, func(o *agent.Options) { o.Poll, o.RetryWait = time.Hour, time.Minute })
	waitFor(t, "the second Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 2 })

	ex.down()
	s := c.declare("n1", fmt.Sprintf(motd, 1))
	// The agent has read it and failed to hand it over: backing off.
	time.Sleep(2 * time.Second)
	if d, _, _ := ex.snapshot(); slices.Contains(d, s) {
		t.Fatal("handed over while the executor was down")
	}
	ex.up()
	waitFor(t, "the declaration handed over once the executor is back", func() bool {
		d, _, _ := ex.snapshot()
		return slices.Contains(d, s)
	})
}
