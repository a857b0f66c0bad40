package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/shapegen"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The request boundary holds: a handler that panics is answered as an
// internal error, its stack logged, counted in the faults file and the
// metrics, and the daemon goes on serving — the next connection is
// answered and a declaration is applied.
func TestAPanicInAHandlerIsAnsweredAndTheDaemonGoesOn(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	metrics := filepath.Join(e.base, "mesh-executor.prom")
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, MetricsFile: metrics})
	was := handlers[wire.KindProfile]
	handlers[wire.KindProfile] = func(*Server, context.Context, *conn, any) (wire.Kind, any, error) {
		var m map[string]int
		m["boom"]++ // a nil map: the kind of slip a handler can have
		return 0, nil, nil
	}
	t.Cleanup(func() { handlers[wire.KindProfile] = was })

	for i := range 3 {
		c := e.dial()
		if err := c.Write(wire.KindProfile, &wire.Profile{}); err != nil {
			t.Fatal(err)
		}
		k, body, err := c.Read()
		if err != nil || k != wire.KindError {
			t.Fatalf("answer %d: %v %+v %v", i, k, body, err)
		}
		if m := body.(*wire.Error); m.Code != wire.CodeInternal || !strings.Contains(m.Message, "internal error serving profile") || !strings.Contains(m.Message, "nil map") {
			t.Fatalf("answer %d: %+v", i, m)
		}
	}
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "v1\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("after the panics: %+v", v)
	}
	f, err := ReadFaults(e.state)
	if err != nil || f.Recovered != 3 || f.LastIn != "profile" || !strings.Contains(f.LastPanic, "nil map") || time.Since(f.LastAt) > time.Hour {
		t.Fatalf("faults: %+v %v", f, err)
	}
	b, _ := os.ReadFile(metrics)
	if !strings.Contains(string(b), "mesh_executor_recovered_panics_total 3\n") {
		t.Fatalf("metrics:\n%s", b)
	}
}

// Every shape goes through every door a declaration has into the daemon
// without taking it down: as a plan (on a full host: a plan writes
// nothing, so every shape's observe step runs against this machine), and
// as a declaration (on a partial host, which refuses by name the shapes it
// does not do, and applies file, directory and archive into the test's
// tree). Generated, not listed: a shape added to the vocabulary is sent
// here without anyone writing a case for it.
func TestEveryShapeThroughEveryDoor(t *testing.T) {
	e := newEnv(t, nobody, true)
	seq := 0
	for round := range uint64(3) {
		g := shapegen.New(round, e.root)
		for _, typ := range shapegen.Types() {
			decl := g.Each(shapegen.Options{Node: "n1", Enrolment: "e-1"})[typ]
			c := e.dial()
			p := e.plan(t, c, decl)
			if typ == shapes.TypeAction {
				if p.Outcome != shapes.Refused || !strings.Contains(p.Refused, "action") {
					t.Errorf("an action planned over the link: %+v", p)
				}
				continue
			}
			// This machine may lack what a shape needs (an init the
			// executor drives, a container runtime): the plan is then
			// refused, naming the resource. Either way it is answered.
			if p.Outcome == shapes.Refused && !strings.Contains(p.Refused, "resource base.r0") {
				t.Errorf("plan of a valid %s refused without naming it: %s\n%s", typ, p.Refused, decl)
			}
		}
		many := g.Declaration(shapegen.Options{Node: "n1", Enrolment: "e-1", Types: nonAction(), Min: 4, Max: 10})
		if p := e.plan(t, e.dial(), many); p.Outcome == shapes.Refused && !strings.Contains(p.Refused, "resource ") {
			t.Errorf("plan of a valid declaration refused without naming a resource: %s\n%s", p.Refused, many)
		}
	}

	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, Partial: true})
	partial := map[string]bool{shapes.TypeFile: true, shapes.TypeDirectory: true, shapes.TypeArchive: true, shapes.TypeRegion: true, shapes.TypeKeys: true}
	for round := range uint64(3) {
		g := shapegen.New(100+round, e.root)
		for _, typ := range shapegen.Types() {
			seq++
			decl := g.Each(shapegen.Options{Node: "n1", Enrolment: "e-1", Seq: uint64(seq)})[typ]
			c := e.dial()
			p := e.plan(t, c, decl)
			lines, v := e.push(c, e.seal(decl))
			// The plan said what the push did, line for line — but of an
			// archive whose bytes no agent streamed: the plan says it
			// would apply once streamed, the push fails for want of them.
			if typ != shapes.TypeArchive && (p.Outcome != v.Outcome || outcomesOf(p.Lines) != outcomesOf(lines)) {
				t.Errorf("a %s on a partial host: the plan said %s %s, the push did %s %s", typ, p.Outcome, outcomesOf(p.Lines), v.Outcome, outcomesOf(lines))
			}
			switch {
			case typ == shapes.TypeAction:
				if v.Outcome != shapes.Refused || v.Code != wire.CodeAction {
					t.Errorf("an action from the link: %+v", v)
				}
			case !partial[typ]:
				if v.Outcome != shapes.Refused || !strings.Contains(v.Reason, typ) {
					t.Errorf("a partial host took a %s: %+v %v", typ, v, lines)
				}
			case typ == shapes.TypeRegion || typ == shapes.TypeKeys:
				// Edits of a file that is not there: failed, saying so.
				if v.Outcome != shapes.Failed || len(lines) != 1 || !strings.Contains(lines[0].Detail, "does not exist") {
					t.Errorf("%s into a missing file: %+v %v", typ, v, lines)
				}
			case typ == shapes.TypeArchive:
				// Its bytes were never streamed: the step fails, saying so.
				if v.Outcome != shapes.Failed {
					t.Errorf("an archive with no bytes: %+v %v", v, lines)
				}
			default:
				if v.Outcome != shapes.Applied {
					t.Errorf("%s: %+v %v\n%s", typ, v, lines, decl)
				}
			}
		}
	}
	if f, _ := ReadFaults(e.state); f.Recovered != 0 {
		t.Fatalf("the daemon recovered from a panic on a valid declaration: %+v", f)
	}
}

func nonAction() []string {
	var out []string
	for _, t := range shapegen.Types() {
		if t != shapes.TypeAction {
			out = append(out, t)
		}
	}
	return out
}

// A plan that waits behind an apply past its time is not planned: its time
// is checked again once the apply lock is held.
func TestAPlanThatWaitedPastItsTimeIsRefused(t *testing.T) {
	e := newEnv(t, nobody, true)
	body, _ := json.Marshal(wire.PlanRequest{Node: "n1", Enrolment: "e-1", ID: "late", NotAfter: time.Now().Add(2 * time.Second),
		Declaration: e.decl("n1", "e-1", 0, file("motd", "v1\n"))})
	env, err := wire.Seal(e.priv, wire.PurposePlan, body)
	if err != nil {
		t.Fatal(err)
	}
	c := e.dial()
	e.srv.applyMu.Lock() // an apply that takes its time
	if err := c.Write(wire.KindPlan, &wire.Plan{Envelope: env}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	e.srv.applyMu.Unlock()
	k, reply, err := c.Read()
	if err != nil || k != wire.KindPlanReply {
		t.Fatalf("%v %+v %v", k, reply, err)
	}
	if p := reply.(*wire.PlanReply); p.Outcome != shapes.Refused || p.Code != wire.CodeReplay || !strings.Contains(p.Refused, "it waited for an apply") {
		t.Fatalf("a plan that waited past its time: %+v", p)
	}
}

// outcomesOf is each line's module.id and outcome, in order.
func outcomesOf(lines []shapes.Line) string {
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "%s.%s=%s ", l.Module, l.ID, l.Outcome)
	}
	return b.String()
}
