package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// heard is a log handler that keeps the messages the agent logged, for a
// test to wait on what the agent says it is doing.
type heard struct {
	mu   sync.Mutex
	msgs []string
	next slog.Handler
}

func (h *heard) Enabled(context.Context, slog.Level) bool { return true }
func (h *heard) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Message)
	h.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}
func (h *heard) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *heard) WithGroup(string) slog.Handler      { return h }

// count says how many times msg was logged.
func (h *heard) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// runAgentHeard is runAgent with what the agent logs kept in h.
func runAgentHeard(t *testing.T, id *agent.Identity, socket string, h *heard) {
	t.Helper()
	h.next = logger().Handler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Options{
			Identity: id, Socket: socket, ExecutorUID: uint32(os.Getuid()), StateDir: t.TempDir(),
			Heartbeat: 300 * time.Millisecond, Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: slog.New(h),
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// A plan request that comes while the executor applies a declaration (a
// person plans while the control side declares; or both waited while the
// agent was stopped) is answered with the plan's own answer, and the
// declaration with its own verdict and lines: applied once, reported with
// what it changed. The two once shared the worker's connection at the same
// time, and each read the other's replies.
func TestAPlanDuringAnApplyKeepsEachAnswerItsOwn(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("mixture")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	h := &heard{}
	runAgentHeard(t, id, ex.path, h)
	waitFor(t, "the agent to link", func() bool { _, n, _ := ex.snapshot(); return n > 0 })

	ex.hold()
	seq := c.declare("mixture", fmt.Sprintf(motd, 1))
	select {
	case <-ex.holding:
	case <-time.After(20 * time.Second):
		t.Fatal("the declaration did not reach the executor")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	planID, err := c.client.Plan(ctx, "mixture", []byte(fmt.Sprintf(motd, 2)))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent to ask for the plan", func() bool { return h.count("asking the executor for a plan") > 0 })
	ex.unhold()

	p, err := c.client.WaitPlan(ctx, "mixture", planID, 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Outcome != shapes.Applied || p.Refused != "" || len(p.Lines) != 1 || p.Lines[0].ID != "planned" {
		t.Errorf("the plan's answer: %s %q %+v", p.Outcome, p.Refused, p.Lines)
	}
	rs := c.reports("mixture", "the declaration's report", hasReport(seq, shapes.Applied))
	for _, r := range rs {
		if r.Seq == seq && r.Trigger == link.TriggerDeclaration {
			if r.Duplicate || len(r.Lines) != 1 || r.Lines[0].ID != "motd" {
				t.Errorf("the declaration's report lost its lines: duplicate %v, lines %+v", r.Duplicate, r.Lines)
			}
		}
	}
	decls, _, garbage := ex.snapshot()
	if !slices.Equal(decls, []uint64{seq}) || len(garbage) > 0 {
		t.Errorf("the executor was handed declarations %v (want %d once); garbage %v", decls, seq, garbage)
	}
}

// A plan request that was in time when it came but waited past its time
// for its turn (the executor busy with an apply) is never handed to the
// executor: its report says it was refused for its time, by the agent.
func TestAPlanPastItsTimeIsNeverRun(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("late")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	h := &heard{}
	runAgentHeard(t, id, ex.path, h)
	waitFor(t, "the agent to link", func() bool { _, n, _ := ex.snapshot(); return n > 0 })

	ex.hold()
	c.declare("late", fmt.Sprintf(motd, 1))
	select {
	case <-ex.holding:
	case <-time.After(20 * time.Second):
		t.Fatal("the declaration did not reach the executor")
	}
	// Signed by hand as Plan signs it, good for a few seconds only.
	notAfter := time.Now().Add(3 * time.Second).UTC()
	env := sealPlan(t, c, id, "late-plan", notAfter)
	for _, subj := range link.PlanSubjects("late") {
		c.client.NC.Publish(subj, env)
	}
	waitFor(t, "the agent to take the plan request", func() bool {
		return h.count("asking the executor for a plan")+h.count("a plan request past its time; not handed to the executor") > 0
	})
	for !time.Now().After(notAfter) {
		time.Sleep(100 * time.Millisecond)
	}
	ex.unhold()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.client.WaitPlan(ctx, "late", "late-plan", 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Outcome != shapes.Refused || p.RefusedBy != "agent" || !strings.Contains(p.Refused, "good until") {
		t.Errorf("the late plan's report: %s by %q: %q", p.Outcome, p.RefusedBy, p.Refused)
	}
	ex.mu.Lock()
	plans := ex.plans
	ex.mu.Unlock()
	if plans != 0 {
		t.Errorf("the executor was asked %d plan(s) past their time", plans)
	}
}

// sealPlan is a plan request of nothing for id's node, signed by hand as
// Plan signs one.
func sealPlan(t *testing.T, c *controlSide, id *agent.Identity, planID string, notAfter time.Time) []byte {
	t.Helper()
	payload, _ := json.Marshal(wire.PlanRequest{Node: id.Node, Enrolment: id.Enrolment, ID: planID, NotAfter: notAfter,
		Declaration: json.RawMessage(fmt.Sprintf(`{"version":1,"node":%q,"enrolment":%q,"seq":0,"resources":[]}`, id.Node, id.Enrolment))})
	env, err := wire.Seal(c.keys.Control, wire.PurposePlan, payload)
	if err != nil {
		t.Fatal(err)
	}
	return env
}
