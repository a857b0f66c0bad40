package agent_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"github.com/nats-io/nats-server/v2/server"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const motd = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/tmp/mesh-test/motd","content":"%d\n","mode":"0644"}]}`

// How a hand-made declaration is noticed: not at all (only the agent's
// timer finds it), by a notice naming its stream sequence only (as an
// older control side sent), or by one carrying it (as the control side
// does: the agent reads nothing).
type noticeKind int

const (
	noNotice noticeKind = iota
	hintNotice
	carriedNotice
)

// publishSealed signs a declaration by hand, as the control side would or
// as a forger would, publishes it on node's subject and notices it as
// notify says.
func publishSealed(t *testing.T, c *controlSide, node string, key ed25519.PrivateKey, purpose wire.Purpose, decl map[string]any, notify noticeKind) {
	t.Helper()
	payload, _ := json.Marshal(decl)
	env, err := wire.Seal(key, purpose, payload)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := c.client.JS.Publish(ctx, link.SubjectsOf(node).Decl, env)
	if err != nil {
		t.Fatal(err)
	}
	switch notify {
	case hintNotice:
		c.client.NC.Publish(link.SubjectsOf(node).Notice, []byte(fmt.Sprint(ack.Sequence)))
	case carriedNotice:
		c.client.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf(node).Notice, Data: env,
			Header: nats.Header{link.HeaderSequence: []string{fmt.Sprint(ack.Sequence)}}})
	}
}

func file(content string) []any {
	return []any{map[string]any{"module": "base", "id": "motd", "type": "file", "path": "/tmp/mesh-test/motd", "content": content, "mode": "0644"}}
}

// The drain, against a fake executor: with the executor busy, 50
// declarations are published; released, the agent forwards exactly one
// more declaration, the newest, and reports the 49 between superseded by
// it, in one report. Then bad envelopes, each the newest on the subject in
// turn: the forged one, the one signed for another purpose, the one for
// another node, the one with an action and the one with an old sequence
// are refused upward with their reasons and never reach the executor; one
// published with no notice is found by the agent's timer. The registry
// then shows what the node applied.
func TestDrainForwardsOnlyTheNewest(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("drain")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentPolling(t, id, ex.path, time.Second)

	// Linked: the executor hears so.
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s1 := c.declare("drain", fmt.Sprintf(motd, 1))
	c.reports("drain", "seq 1 applied", hasReport(s1, shapes.Applied))

	// Busy with seq 2.
	ex.hold()
	s2 := c.declare("drain", fmt.Sprintf(motd, 2))
	select {
	case got := <-ex.holding:
		if got != s2 {
			t.Fatalf("held %d, want %d", got, s2)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the executor never got seq 2")
	}
	var newest uint64
	for i := range 50 {
		newest = c.declare("drain", fmt.Sprintf(motd, 3+i))
	}
	ex.unhold()
	rs := c.reports("drain", "the newest applied", hasReport(newest, shapes.Applied))
	// The executor is handed the newest the agent has heard of once it is
	// free: the newest, or — when the last notice was still on its way
	// (they are core NATS, delivered beside the drain) — the one before
	// it, then the newest. Every one between is reported superseded, once,
	// by the one handed over next; none of them reaches the executor.
	decls, _, _ := ex.snapshot()
	after := decls[slices.Index(decls, s2)+1:]
	if !slices.Equal(after, []uint64{newest}) && !slices.Equal(after, []uint64{newest - 1, newest}) {
		t.Fatalf("after seq %d the executor was handed %v, want [%d] (or [%d %d])", s2, after, newest, newest-1, newest)
	}
	var sup []*control.SignedReport
	for _, r := range rs {
		if r.Outcome == shapes.Superseded {
			sup = append(sup, r)
		}
	}
	first := after[0] // the first handed over after seq 2 supersedes those before it
	if len(sup) != 1 || sup[0].SupersededFrom != s2+1 || sup[0].Seq != first-1 || sup[0].SupersededBy != first || sup[0].SupersededOutcome != shapes.Applied {
		t.Fatalf("want one report of seqs %d to %d superseded by %d (applied): %s", s2+1, first-1, first, describe(rs))
	}
	for s := s2 + 1; s < first; s++ {
		if !supersedes(sup[0], s, first) {
			t.Errorf("seq %d not reported superseded", s)
		}
	}

	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	base := func(node string, seq uint64, res []any) map[string]any {
		return map[string]any{"version": 1, "node": node, "enrolment": cfg.Enrolment, "seq": seq, "resources": res}
	}
	bad := []struct {
		code   string
		seq    uint64 // the sequence the refusal names
		key    ed25519.PrivateKey
		purp   wire.Purpose
		decl   map[string]any
		notify noticeKind
	}{
		{"wrong-key", 0, other, wire.PurposeDeclaration, base("drain", 1000, file("forged")), carriedNotice},
		{"wrong-purpose", 0, c.keys.Control, wire.PurposeGrant, base("drain", 1001, file("grant")), carriedNotice},
		{"address", 1002, c.keys.Control, wire.PurposeDeclaration, base("other", 1002, file("other node")), hintNotice},
		{"action", 1003, c.keys.Control, wire.PurposeDeclaration, base("drain", 1003,
			[]any{map[string]any{"module": "m", "id": "a", "type": "action", "run": []string{"/bin/true"}, "verify": []string{"/bin/true"}}}), carriedNotice},
		{"replay", s1, c.keys.Control, wire.PurposeDeclaration, base("drain", s1, file("old")), noNotice},
	}
	for _, b := range bad {
		publishSealed(t, c, "drain", b.key, b.purp, b.decl, b.notify)
		rs = c.reports("drain", "the refusal "+b.code, func(rs []*control.SignedReport) bool {
			return slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return r.Code == b.code })
		})
		r := rs[slices.IndexFunc(rs, func(r *control.SignedReport) bool { return r.Code == b.code })]
		if r.Outcome != shapes.Refused || r.RefusedBy != "agent" || r.Refused == "" {
			t.Errorf("refusal %+v: want refused by the agent, with a reason", r.Report)
		}
		if r.Seq != b.seq {
			t.Errorf("refusal %s names seq %d, want %d (nothing unsigned is repeated as the control plane's word)", b.code, r.Seq, b.seq)
		}
		t.Logf("refused [%s] seq %d: %s", b.code, r.Seq, r.Refused)
	}
	// Let anything that would still come, come.
	time.Sleep(1500 * time.Millisecond)
	decls, _, garbage := ex.snapshot()
	if want := append([]uint64{s1, s2}, after...); !slices.Equal(decls, want) {
		t.Fatalf("declarations that reached the executor: %v, want %v", decls, want)
	}
	if len(garbage) != 0 {
		t.Fatalf("garbage reached the executor: %q", garbage)
	}
	rs = c.reports("drain", "all settled", func([]*control.SignedReport) bool { return true })
	if n, want := len(rs), 1+2+len(after)+1+len(bad); n != want { // reconnect, s1, s2, those handed over after, the range, the refusals
		t.Errorf("%d reports, want %d (each message settled once): %s", n, want, describe(rs))
	}

	// The next good declaration goes through, and supersedes nothing:
	// the refused ones were never the control plane's.
	last := c.declare("drain", fmt.Sprintf(motd, 99))
	rs = c.reports("drain", "the next applied", hasReport(last, shapes.Applied))
	if r := rs[len(rs)-2]; r.Outcome == shapes.Superseded {
		t.Errorf("a superseded report before %d: %s", last, describe(rs))
	}
	newest = last

	// The control side's registry: declared against applied, the
	// executor's version from the heartbeat, the last outcome.
	waitFor(t, "the registry to show the node", func() bool {
		ns, err := c.client.Nodes(context.Background())
		if err != nil || len(ns) != 1 {
			return false
		}
		n := ns[0]
		return n.Declared == newest && n.Applied == newest && n.LastOutcome == shapes.Applied &&
			n.LastSeq == newest && n.ExecutorVersion == "fake" && n.State == link.StateEnrolled
	})
}

// A notice that carries a declaration is taken as read: a linked agent
// reads nothing more. Shown by a signed declaration that is only in a
// notice, never on the stream — the executor gets it, which a read could
// not have found. A forged one carried so is refused as a read one is
// (TestDrainForwardsOnlyTheNewest), and so is a genuine older one.
func TestNoticeCarriesTheDeclaration(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("carried")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path) // the timer minutes away: only notices wake it
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s1 := c.declare("carried", fmt.Sprintf(motd, 1))
	c.reports("carried", "seq 1 applied", hasReport(s1, shapes.Applied))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	last, err := c.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := last.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	carry := func(seq uint64, sseq uint64) {
		payload, _ := json.Marshal(map[string]any{"version": 1, "node": "carried", "enrolment": cfg.Enrolment, "seq": seq, "resources": file(fmt.Sprint(seq))})
		env, err := wire.Seal(c.keys.Control, wire.PurposeDeclaration, payload)
		if err != nil {
			t.Fatal(err)
		}
		c.client.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf("carried").Notice, Data: env,
			Header: nats.Header{link.HeaderSequence: []string{fmt.Sprint(sseq)}}})
	}
	carry(s1+1, info.State.LastSeq+100)
	c.reports("carried", "the carried declaration applied", hasReport(s1+1, shapes.Applied))
	// A genuine older one, carried with a newer stream sequence: refused
	// as a replay, never forwarded.
	carry(s1, info.State.LastSeq+101)
	c.reports("carried", "the carried replay refused", func(rs []*control.SignedReport) bool {
		return slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return r.Code == "replay" && r.Seq == s1 })
	})
	decls, _, garbage := ex.snapshot()
	if want := []uint64{s1, s1 + 1}; !slices.Equal(decls, want) || len(garbage) != 0 {
		t.Fatalf("the executor got %v (garbage %q), want %v", decls, garbage, want)
	}
}

// An agent of an earlier version (link.LayoutByKind: it asks for no
// layout in its connection's name) keeps working against this control
// side: it hears its notice, reads its declaration, and its report and
// heartbeats are taken — beside an agent of this version on the same
// broker, each given its own layout's permissions only.
func TestAnAgentOfTheEarlierLayoutStillWorks(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	for _, l := range []link.Layout{link.LayoutByKind, link.LayoutByNode} {
		node := map[link.Layout]string{link.LayoutByKind: "earlier", link.LayoutByNode: "current"}[l]
		id, _ := c.addNode(node)
		if id.Layout != link.LayoutByNode {
			t.Fatalf("this agent's identity has layout %d, not LayoutByNode", id.Layout)
		}
		id.Layout, id.Subjects = l, link.NodeSubjects(node, l)
		ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
		runAgent(t, id, ex.path) // the timer minutes away: only the notice wakes it
		waitFor(t, node+"'s first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
		seq := c.declare(node, fmt.Sprintf(motd, 1))
		c.reports(node, node+"'s declaration applied", hasReport(seq, shapes.Applied))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		waitFor(t, node+"'s heartbeat stored", func() bool {
			hb, err := c.client.JS.Stream(ctx, link.HeartbeatStream)
			if err != nil {
				return false
			}
			_, err = hb.GetLastMsgForSubject(ctx, link.SubjectsOf(node).Heartbeat)
			return err == nil
		})
		cancel()
		// The other layout's door is shut to it.
		other := link.NodeSubjects(node, 1-l)
		nc, err := agent.Dial(id, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Request(other.DeclGet, nil, 2*time.Second); err == nil {
			t.Fatalf("%s (layout %d) read its declaration through the other layout's %s", node, l, other.DeclGet)
		}
		nc.Close()
	}
}

// An agent of this version against a control side of an earlier one
// (which gives every node the permissions of the layout by kind, whatever
// its connection asks for): the broker refuses its publishes by node, and
// the agent links again with its subjects by kind, rather than stay
// linked and deaf. The earlier control side is the broker's answer: a
// connection that does not ask for the layout by node is given the
// layout by kind, as an earlier control side gives every connection.
// When the link comes back (a control side is upgraded by restarting
// it), the agent tries its subjects by node again, and keeps them where
// they are taken.
func TestAgentFallsBackToAnEarlierControlSide(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("newer")
	id.Layout = link.LayoutByKind // the connection asks for nothing; its subjects stay by node
	if !strings.HasPrefix(id.Subjects.DeclGet, link.UpPrefix+".") {
		t.Fatalf("this agent's subjects are not by node: %s", id.Subjects.DeclGet)
	}
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentPolling(t, id, ex.path, 300*time.Millisecond) // it reads on its timer too: the notice may come before the fallback
	seq := c.declare("newer", fmt.Sprintf(motd, 1))
	c.reports("newer", "the declaration applied after the fallback", hasReport(seq, shapes.Applied))
	if name := agentConnName(t, c, id); name == "" || strings.HasSuffix(name, link.LayoutTag) {
		t.Fatalf("the agent's connection is %q: not linked by kind after the fallback", name)
	}

	// The control side comes back (upgraded): the agent links by node.
	c.stop()
	c.start()
	waitFor(t, "the agent linked by node", func() bool {
		return strings.HasSuffix(agentConnName(t, c, id), " "+link.LayoutTag)
	})
	seq = c.declare("newer", fmt.Sprintf(motd, 2))
	c.reports("newer", "a declaration applied by node", hasReport(seq, shapes.Applied))
}

// agentConnName is the name of id's connection on c's broker ("" when it
// has none).
func agentConnName(t *testing.T, c *controlSide, id *agent.Identity) string {
	t.Helper()
	cz, err := c.srv.NATS().Connz(&server.ConnzOptions{Limit: 1024, Username: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cz.Conns {
		if ci.AuthorizedUser == id.NKeyPublic() {
			return ci.Name
		}
	}
	return ""
}

// What another node makes the broker deliver to this node's notice
// subject — the answer to a read of its own declaration, or the
// acknowledgement of its own report, each sent here by naming this node's
// notice as the reply — is no notice: dropped without a report (else n1
// could make n2 say it refused things) and nothing reaches n2's executor;
// a genuine notice after them is taken.
func TestAnotherNodesAnswerIsNoNotice(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id1, _ := c.addNode("n1")
	id2, _ := c.addNode("n2")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id2, ex.path) // the timer minutes away: only notices wake it
	waitFor(t, "n2's first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s2 := c.declare("n2", fmt.Sprintf(motd, 1))
	c.reports("n2", "n2's declaration applied", hasReport(s2, shapes.Applied))
	// n1's declaration is newer on the stream than n2's: its answer, sent
	// to n2, names a stream sequence n2 has not seen.
	s1 := c.declare("n1", fmt.Sprintf(motd, 1))

	nc, err := agent.Dial(id1)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 3 {
		if err := nc.PublishRequest(id1.Subjects.DeclGet, id2.Subjects.Notice, nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(id1.Subjects.Report, id2.Subjects.Notice, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	// A genuine one after them, so the wait below has an end.
	s3 := c.declare("n2", fmt.Sprintf(motd, 2))
	rs := c.reports("n2", "n2's next declaration applied", hasReport(s3, shapes.Applied))
	for _, r := range rs {
		if r.Outcome == shapes.Refused {
			t.Fatalf("n2 reported a refusal of what n1 sent it: %s", describe(rs))
		}
	}
	if decls, _, garbage := ex.snapshot(); !slices.Equal(decls, []uint64{s2, s3}) || len(garbage) != 0 {
		t.Fatalf("n2's executor got %v (garbage %q), want %v; n1's declaration was %d", decls, garbage, []uint64{s2, s3}, s1)
	}
}

// A notice's declaration is not lost to a read the timer makes meanwhile:
// while the executor is busy, a notice carries a newer declaration and the
// timer falls due too, so the worker, free again, has both to choose from.
// The timer's read finds the subject staler than the notice (here, the
// carried declarations are on no stream at all), and the newer of the two
// goes on. Each round is a coin toss for a worker that let the timer's
// read drop what the notice carried.
func TestACarriedDeclarationOutlastsATimerRead(t *testing.T) {
	const poll = 50 * time.Millisecond
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("carried")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentPolling(t, id, ex.path, poll)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	var want []uint64
	for seq := uint64(1); seq < 16; seq += 2 {
		ex.hold()
		c.carry(t, "carried", cfg.Enrolment, seq, nil)
		select {
		case <-ex.holding:
		case <-time.After(20 * time.Second):
			t.Fatalf("declaration %d never reached the executor", seq)
		}
		c.carry(t, "carried", cfg.Enrolment, seq+1, nil)
		time.Sleep(4 * poll) // the notice and the timer both wait
		ex.unhold()
		c.reports("carried", fmt.Sprintf("the carried declaration %d applied", seq+1), hasReport(seq+1, shapes.Applied))
		want = append(want, seq, seq+1)
	}
	if decls, _, _ := ex.snapshot(); !slices.Equal(decls, want) {
		t.Fatalf("the executor got %v, want %v", decls, want)
	}
}
