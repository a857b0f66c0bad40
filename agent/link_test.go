package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A broker restart: the agent reconnects on its own, receives what was
// published while it was cut off, and tells the executor the link came
// back. While it is cut off the broker is up but does not know the node
// (the control side's plain broker without the registry), so the
// declarations are certainly published while the agent cannot have them.
func TestBrokerRestart(t *testing.T) {
	dir := t.TempDir()
	c := startControl(t, dir, "127.0.0.1:0")
	id, _ := c.addNode("restart")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s1 := c.declare("restart", fmt.Sprintf(motd, 1))
	c.reports("restart", "seq 1 applied", hasReport(s1, shapes.Applied))

	// Down.
	linksBefore := ex.linksSaid()
	stopping := time.Now()
	c.stop()
	stopped := time.Now()
	// Up without the node: publish while it cannot link.
	bare, err := control.StartServer(c.keys, c.listen, logger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := control.Connect(ctx, c.keys, bare.ClientURL(), logger())
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i := range 3 {
		s, err := cl.Declare(ctx, "restart", []byte(fmt.Sprintf(motd, 10+i)))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	cz, _ := bare.NATS().Connz(&server.ConnzOptions{Account: link.NodeAccount("restart")})
	if cz.NumConns != 0 {
		t.Fatalf("the node is connected to the broker that does not know it")
	}
	cl.Close()
	// Meanwhile, root applies a rescue file at the machine.
	rescue := shapes.Activity{At: time.Now().UTC(), Source: "local", Trigger: "rescue", Outcome: shapes.Applied, Changed: 2}
	ex.doing(rescue)
	// And the executor is told the link is down, with each status.
	waitFor(t, "the executor told the link is down", func() bool {
		ls := ex.linksSaid()
		return len(ls) > 0 && !ls[len(ls)-1].Up && !ls[len(ls)-1].Since.Before(stopping.Add(-time.Second))
	})
	// And why. The bare broker has not read a registry: it holds the
	// node's connect (registryWait) rather than refuse it, and the agent
	// says the broker did not answer in time. Once it has read one
	// without the node, it refuses the node. Each said with some status
	// while the link is down, from the stop on (a refusal said before the
	// first link, when the node was just added, is not this one) — not
	// necessarily the last: on a loaded machine an attempt between may
	// end otherwise. Within a minute, not the usual 20 s: an attempt the
	// bare broker holds waits out the connect's timeout (20 s).
	waitForSaid(t, ex, len(linksBefore), "the broker at "+c.url+" did not answer the connect in time")
	bare.SetNodes(nil)
	bare.SetTokens(nil)
	waitForSaid(t, ex, len(linksBefore), "authorization refused by the broker at "+c.url)
	bare.Shutdown()
	if _, r, _ := ex.snapshot(); r != 1 {
		t.Fatalf("Reconnected %d times while unlinked", r)
	}

	// Up again, with the registry.
	starting := time.Now()
	c.start()
	newest := seqs[len(seqs)-1]
	rs := c.reports("restart", "the newest applied after the restart", hasReport(newest, shapes.Applied))
	decls, reconnects, garbage := ex.snapshot()
	if want := []uint64{s1, newest}; !slices.Equal(decls, want) || len(garbage) != 0 {
		t.Fatalf("declarations that reached the executor: %v (garbage %q), want %v", decls, garbage, want)
	}
	if reconnects != 2 {
		t.Fatalf("the executor heard Reconnected %d times, want 2 (the first link and the one after the restart)", reconnects)
	}
	for _, s := range seqs[:len(seqs)-1] {
		if !slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return supersedes(r, s, newest) }) {
			t.Errorf("seq %d not reported superseded by %d: %s", s, newest, describe(rs))
		}
	}
	i := slices.IndexFunc(rs, func(r *control.SignedReport) bool {
		return r.Trigger == link.TriggerReconnect && r.At.After(starting)
	})
	if i < 0 {
		t.Fatalf("no report of the reconcile after the link came back: %s", describe(rs))
	}
	// It says the node was disconnected, from about when the broker went
	// down (its last heartbeat, or the drop the agent noticed a moment
	// after) to when it linked again.
	r := rs[i]
	if r.DisconnectedFrom.IsZero() || r.DisconnectedFrom.After(starting) || r.DisconnectedFrom.Before(stopping.Add(-2*time.Second)) ||
		r.DisconnectedTo.Before(starting) || r.DisconnectedTo.After(r.At) {
		t.Errorf("the reconnect report says disconnected from %v to %v; the broker stopped at %v–%v and started again at %v",
			r.DisconnectedFrom, r.DisconnectedTo, stopping, stopped, starting)
	}
	// And what the executor did meanwhile, by its own account.
	if len(r.Meanwhile) != 1 || r.Meanwhile[0].Trigger != "rescue" || r.Meanwhile[0].Changed != 2 || r.Meanwhile[0].At.Sub(rescue.At).Abs() > time.Millisecond {
		t.Errorf("the reconnect report says the executor did %+v meanwhile; it applied %+v", r.Meanwhile, rescue)
	}
	waitFor(t, "the executor told the link is up again", func() bool {
		ls := ex.linksSaid()
		return len(ls) > 0 && ls[len(ls)-1].Up && !ls[len(ls)-1].Since.Before(starting)
	})
}

// Link failures say which side refused and why.
func TestLinkFailuresAreLegible(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	_, cfg := c.addNode("legible")

	// Nothing listening.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "tls://" + l.Addr().String()
	l.Close()
	unreachable := *cfg
	unreachable.BrokerURL = closed
	// A key the broker does not know.
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	stranger := *cfg
	stranger.NKeySeed = string(seed)
	// Another certificate pinned.
	wrongPin := *cfg
	wrongPin.BrokerFingerprint = strings.Repeat("ab", 32)

	for _, tc := range []struct {
		cfg    agent.Config
		reason string
		says   []string
	}{
		{unreachable, agent.LinkUnreachable, []string{"broker unreachable at " + closed}},
		{stranger, agent.LinkAuthorization, []string{"authorization refused by the broker"}},
		{wrongPin, agent.LinkFingerprint, []string{"fingerprint mismatch", "got " + c.keys.Fingerprint, "pinned " + strings.Repeat("ab", 32)}},
	} {
		id, err := tc.cfg.Identity()
		if err != nil {
			t.Fatal(err)
		}
		_, err = agent.Dial(id)
		var le *agent.LinkError
		if !errors.As(err, &le) || le.Reason != tc.reason {
			t.Errorf("%s: got %v", tc.reason, err)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", tc.reason, err, s)
			}
		}
		t.Logf("%s: %v", tc.reason, err)
	}
}

// waitForSaid waits up to a minute for a link status past the first from
// of those ex heard that says the link is down, for the reason said.
func waitForSaid(t *testing.T, ex *fakeExecutor, from int, said string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		ls := ex.linksSaid()
		if slices.ContainsFunc(ls[min(from, len(ls)):], func(l wire.AgentLink) bool { return !l.Up && strings.Contains(l.Error, said) }) {
			return
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, l := range ls[min(from, len(ls)):] {
				if e := fmt.Sprintf("up=%v %s", l.Up, l.Error); len(seen) == 0 || seen[len(seen)-1] != e {
					seen = append(seen, e)
				}
			}
			t.Fatalf("timed out waiting for the executor told the link is down: %s; the links said since (in turn, each once):\n%s", said, strings.Join(seen, "\n"))
		}
	}
}

// withoutReportStream takes the node's report stream away (the broker
// takes none of its reports) and returns what puts it back.
func withoutReportStream(t *testing.T, c *controlSide, node string) (back func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	part := link.NodeReportPartition(node)
	s, err := c.client.JS.Stream(ctx, part.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.client.JS.DeleteStream(ctx, part.Stream); err != nil {
		t.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.client.JS.CreateStream(ctx, info.Config); err != nil {
			t.Fatal(err)
		}
	}
}

// A declaration the executor applied, whose report the broker did not take,
// is reported as applied once the broker takes reports again — not as
// superseded by the one that came meanwhile, as if it never ran.
func TestAnAppliedDeclarationNotReportedIsNotTakenForSuperseded(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("late")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	c.reports("late", "the link's first report", func(rs []*control.SignedReport) bool {
		return len(rs) > 0 && rs[len(rs)-1].Trigger == link.TriggerReconnect
	})
	back := withoutReportStream(t, c, "late")
	s1 := c.declare("late", fmt.Sprintf(motd, 1))
	waitFor(t, "the first declaration handed over", func() bool { d, _, _ := ex.snapshot(); return slices.Contains(d, s1) })
	s2 := c.declare("late", fmt.Sprintf(motd, 2))
	time.Sleep(time.Second) // its report refused: no stream takes it
	back()
	c.reports("late", "both applied", func(rs []*control.SignedReport) bool {
		return hasReport(s1, shapes.Applied)(rs) && hasReport(s2, shapes.Applied)(rs)
	})
	for _, r := range c.reports("late", "any", func([]*control.SignedReport) bool { return true }) {
		if r.Outcome == shapes.Superseded {
			t.Fatalf("an applied declaration reported superseded: %+v", r)
		}
	}
}

// A reconnect's report the broker does not take (its stream gone a moment)
// is published again, as it was, once it can be: not lost, and the
// executor not asked to reconcile again for it (a second reconcile finds
// unchanged what the first put back).
func TestAReconnectReportNotTakenIsPublishedAgain(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("again")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	back := withoutReportStream(t, c, "again")
	runAgent(t, id, ex.path)
	waitFor(t, "the executor told the link came up", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	time.Sleep(time.Second) // its report refused: no stream takes it
	back()
	c.reports("again", "the reconnect's report", func(rs []*control.SignedReport) bool {
		for _, r := range rs {
			if r.Trigger == link.TriggerReconnect {
				return true
			}
		}
		return false
	})
	if _, r, _ := ex.snapshot(); r != 1 {
		t.Fatalf("the executor was asked to reconcile %d times for one reconnect", r)
	}
}

// A report is named by its bytes (Nats-Msg-Id): the same report published
// again — kept and sent as it was after a confirmation that never came,
// though the broker stored it — is stored once within the stream's window.
func TestAReportPublishedAgainIsStoredOnce(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("once")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	s1 := c.declare("once", fmt.Sprintf(motd, 1))
	c.reports("once", "seq 1 applied", hasReport(s1, shapes.Applied))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	part := link.NodeReportPartition("once")
	s, err := c.client.JS.Stream(ctx, part.Stream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, part.Subject)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(last.Data)
	if got := last.Header.Get(nats.MsgIdHdr); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("the report's name %q is not its bytes' digest", got)
	}
	before, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := c.client.JS.PublishMsg(ctx, &nats.Msg{Subject: part.Subject, Data: last.Data, Header: last.Header})
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate || after.State.Msgs != before.State.Msgs {
		t.Fatalf("the same report published again was stored again (duplicate %v, %d messages, %d before)", ack.Duplicate, after.State.Msgs, before.State.Msgs)
	}
}

// A declaration the executor applied whose report a stopped agent never
// got out — stopped (as by a kill) between the verdict and the broker's
// confirmation, with newer declarations published meanwhile — is reported
// applied, with its lines, by the agent started again: the executor says
// it again (LastApplied). Those before it are superseded by it, those
// after by the newest; none is said superseded that ran.
func TestAnApplyAStoppedAgentNeverReportedIsReportedByTheNext(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("cut")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	dir := t.TempDir()
	stop := runAgentIn(t, id, ex.path, 0, dir)
	s1 := c.declare("cut", fmt.Sprintf(motd, 1))
	c.reports("cut", "seq 1 applied", hasReport(s1, shapes.Applied))
	stop()
	s2 := c.declare("cut", fmt.Sprintf(motd, 2))
	s3 := c.declare("cut", fmt.Sprintf(motd, 3))
	// The next agent's reconnect is reported; its forward of the newest
	// is held while the report stream goes, so that the executor's
	// verdict reaches an agent whose report the broker cannot take.
	ex.hold()
	stop = runAgentIn(t, id, ex.path, 0, dir)
	select {
	case got := <-ex.holding:
		if got != s3 {
			t.Fatalf("the agent forwarded seq %d; want the newest, %d", got, s3)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the newest declaration was never handed over")
	}
	back := withoutReportStream(t, c, "cut")
	ex.unhold()
	waitFor(t, "the executor applied seq 3", func() bool {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		return ex.applied == s3
	})
	time.Sleep(500 * time.Millisecond) // the agent's publish meets no stream
	stop()
	s4 := c.declare("cut", fmt.Sprintf(motd, 4))
	s5 := c.declare("cut", fmt.Sprintf(motd, 5))
	back()
	runAgentIn(t, id, ex.path, 0, dir)
	rs := c.reports("cut", "seq 3 and seq 5 applied", func(rs []*control.SignedReport) bool {
		return hasReport(s3, shapes.Applied)(rs) && hasReport(s5, shapes.Applied)(rs)
	})
	var two, four bool
	for _, r := range rs {
		if r.Outcome == shapes.Superseded && (supersedes(r, s3, r.SupersededBy) || supersedes(r, s1, r.SupersededBy)) {
			t.Fatalf("an applied declaration reported superseded: %s", describe(rs))
		}
		two = two || supersedes(r, s2, s3)
		four = four || supersedes(r, s4, s5)
		// Said as the executor says it again: its line, "applied already"
		// (the agent cannot know whether a first report got out).
		if r.Seq == s3 && r.Outcome == shapes.Applied && (!r.Duplicate || len(r.Lines) != 1) {
			t.Errorf("seq 3's report: duplicate %v, %d lines; want its line, said again", r.Duplicate, len(r.Lines))
		}
	}
	if !two || !four {
		t.Fatalf("seq 2 superseded by 3: %v, seq 4 by 5: %v; reports: %s", two, four, describe(rs))
	}
	if d, _, _ := ex.snapshot(); slices.Contains(d, s2) || slices.Contains(d, s4) {
		t.Fatalf("the executor was handed %v; superseded ones are never forwarded", d)
	}
}

// An agent whose memory is behind — its state not written while the disk
// was full, or killed between the broker's confirmation and the write —
// says none that ran superseded, whether the newest is the executor's
// last apply (handed over again) or newer (LastApplied asked first): the
// executor names the floor each apply moved (Prior), and only
// declarations past it never ran. Its last apply is said again.
func TestAnAgentWhoseMemoryIsBehindSaysNoneThatRanSuperseded(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("behind")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	dir := t.TempDir()
	stop := runAgentIn(t, id, ex.path, 0, dir)
	s1 := c.declare("behind", fmt.Sprintf(motd, 1))
	var stale []byte
	waitFor(t, "seq 1 settled in agent.json", func() bool {
		stale, _ = os.ReadFile(filepath.Join(dir, "agent.json"))
		var st struct {
			LastSeq uint64 `json:"last_seq"`
		}
		return json.Unmarshal(stale, &st) == nil && st.LastSeq == s1
	})
	s2 := c.declare("behind", fmt.Sprintf(motd, 2))
	c.reports("behind", "seq 2 applied", hasReport(s2, shapes.Applied))
	s3 := c.declare("behind", fmt.Sprintf(motd, 3))
	c.reports("behind", "seq 3 applied", hasReport(s3, shapes.Applied))
	noneThatRan := func(what string, rs []*control.SignedReport) {
		t.Helper()
		for _, r := range rs {
			if r.Outcome == shapes.Superseded {
				t.Fatalf("%s: a declaration that ran reported superseded: %s", what, describe(rs))
			}
		}
	}
	for _, newer := range []bool{false, true} {
		stop()
		// What a full disk leaves: the state as it was written last, at
		// seq 1.
		if err := os.WriteFile(filepath.Join(dir, "agent.json"), stale, 0o600); err != nil {
			t.Fatal(err)
		}
		if !newer {
			// The newest is the executor's last apply: handed over again.
			stop = runAgentIn(t, id, ex.path, 0, dir)
			rs := c.reports("behind", "seq 3 said again", func(rs []*control.SignedReport) bool {
				for _, r := range rs {
					if r.Seq == s3 && r.Duplicate {
						return true
					}
				}
				return false
			})
			noneThatRan("the newest handed over again", rs)
			continue
		}
		s4 := c.declare("behind", fmt.Sprintf(motd, 4))
		stop = runAgentIn(t, id, ex.path, 0, dir)
		noneThatRan("a newer one", c.reports("behind", "seq 4 applied", hasReport(s4, shapes.Applied)))
	}
}

// Nothing of an agent's run writes its state after the run ends: the
// broker client's callbacks (the link's loss, written down) are waited
// for. Before, one wrote agent.json after Run returned — over what the
// next agent on the directory, or the next enrolment's run, had written.
func TestNothingOfAnAgentsRunWritesItsStateAfterItEnds(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("ended")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	for i := range 5 {
		dir := t.TempDir()
		stop := runAgentIn(t, id, ex.path, 0, dir)
		waitFor(t, "linked", func() bool { _, r, _ := ex.snapshot(); return r == i+1 })
		stop()
		state := filepath.Join(dir, "agent.json")
		if err := os.Remove(state); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := os.Stat(state); err == nil {
			t.Fatalf("run %d: agent.json written after the agent's end", i+1)
		}
	}
}

// An agent whose state names its enrolment but never learnt the
// executor's floor in it (started and stopped before its first reconnect:
// a new enrolment's grant floor, say) takes the floor from the executor's
// status, as a state lost would: it does not take itself for one that
// remembers, whose sequences below the floor would be said superseded.
func TestAnEnrolmentWhoseFloorWasNeverLearntTakesItFromTheExecutor(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("unlearnt")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	ex.mu.Lock()
	ex.applied = 7 // the grant's floor
	ex.mu.Unlock()
	dir := t.TempDir()
	state := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(state, []byte(`{"enrolment": "`+id.Enrolment+`", "last_applied": 0, "format": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	runAgentIn(t, id, ex.path, 0, dir)
	waitFor(t, "the executor's floor taken", func() bool {
		b, _ := os.ReadFile(state)
		var st struct {
			LastApplied uint64 `json:"last_applied"`
			Learnt      bool   `json:"floor_learnt"`
		}
		return json.Unmarshal(b, &st) == nil && st.LastApplied == 7 && st.Learnt
	})
}
