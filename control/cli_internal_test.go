package control

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A plan refused for its time is told apart from other refusals, in every
// way the executor and the agent refuse one (wire's words, one place): past its
// time (the node's clock ahead) and good for too long (behind). The CLI
// then says the two clocks differ, when the node's heartbeat showed it.
func TestAPlanRefusedForItsTime(t *testing.T) {
	for _, c := range []struct {
		refused string
		want    bool
	}{
		{"executor: " + wire.PlanPast(time.Now().Add(-time.Hour), time.Now(), ""), true},
		{"executor: " + wire.PlanPast(time.Now().Add(-time.Hour), time.Now(), "it waited for an apply"), true},
		{"agent: " + wire.PlanPast(time.Now().Add(-time.Hour), time.Now(), "") + ": not run", true},
		{"executor: " + wire.PlanTooFar(time.Now().Add(time.Hour), time.Now()), true},
		{"executor: the plan request is addressed to node \"n2\" enrolment \"e\"; this is node \"n1\" enrolment \"e\"", false},
		{"executor: resource base.motd: path: \"x\" is not absolute", false},
	} {
		r := &SignedReport{Report: link.Report{Outcome: shapes.Refused, Refused: c.refused}}
		if got := refusedForTime(r); got != c.want {
			t.Errorf("%q: %v, want %v", c.refused, got, c.want)
		}
	}
	if got := SkewText(-90_000); got != "its clock is 1m30s behind the control side's" {
		t.Errorf("SkewText: %q", got)
	}
}

// A plan's report reads as a plan wherever it is printed (reports, plan):
// labelled with its request, not a sequence, and in the conditional — never
// "seq 0 applied" among the applies.
func TestAPlanReadsAsAPlan(t *testing.T) {
	var b strings.Builder
	c := &cli{stdout: &b}
	c.printReport(&SignedReport{Report: link.Report{Seq: 0, Trigger: link.TriggerPlan, PlanID: "9f2c", Outcome: shapes.Applied, Lines: []shapes.Line{
		{Module: "m", ID: "motd", Type: "file", Outcome: shapes.Applied, Detail: "content replaced"},
		{Module: "m", ID: "old", Type: "file", Outcome: shapes.Removed},
		{Module: "m", ID: "dir", Type: "directory", Outcome: shapes.Unchanged},
	}}})
	c.printReport(&SignedReport{Report: link.Report{Seq: 4, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, Lines: []shapes.Line{
		{Module: "m", ID: "motd", Type: "file", Outcome: shapes.Applied, Detail: "content replaced"}}}})
	out := b.String()
	for _, want := range []string{"plan 9f2c  would apply\n", "m.motd  file  would apply  content replaced\n", "m.old  file  would remove\n",
		"m.dir  directory  would change nothing\n", "seq 4  applied\n", "m.motd  file  applied  content replaced\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the reports lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "seq 0") {
		t.Errorf("a plan shown as an apply of sequence 0:\n%s", out)
	}
}

// A report's lines counted as a person reads them: kept (undeclared and
// not undone) and held apart from unchanged, forgotten in none.
func TestTallyCountsEveryLineItSays(t *testing.T) {
	var lines []shapes.Line
	for _, o := range []shapes.Outcome{shapes.Applied, shapes.Removed, shapes.Unchanged, shapes.Failed, shapes.Held, shapes.Kept, shapes.Kept, shapes.Forgotten} {
		lines = append(lines, shapes.Line{Module: "m", ID: string(o), Type: "file", Outcome: o})
	}
	if got := tallyOf(lines).String(); got != "2 changed, 1 unchanged, 1 failed, 1 held, 2 kept" {
		t.Fatalf("%q", got)
	}
}

// The store opened anew is said as taking writes again, a note, not as a
// store that cannot write: a command then is to be run again, not fixed.
func TestStatusSaysAStoreOpenedAnewTakesWrites(t *testing.T) {
	s := &fleetStatus{}
	s.Store.Answered = true
	s.Store.Problem = (&ReopenedError{Dir: "/srv/control/jetstream", At: time.Now()}).Error()
	row := s.parts()[0].Rows[1]
	if row.Head != "store:" || !strings.HasPrefix(row.Value, "takes writes again: the broker's store in /srv/control/jetstream was opened anew at ") || row.Class != "note" {
		t.Fatalf("%+v", row)
	}
	s.Store.Problem = (&DiskFullError{Dir: "/srv/control/jetstream", Err: errors.New("no space left on device")}).Error()
	if row := s.parts()[0].Rows[1]; !strings.HasPrefix(row.Value, "cannot write: ") || row.Class != "bad" {
		t.Fatalf("%+v", row)
	}
}

// A node's last outcome with its sequence; one of no declaration by what
// made it, not as "seq 0".
func TestOutcomeSaid(t *testing.T) {
	for _, c := range []struct {
		n    NodeStatus
		want string
	}{
		{NodeStatus{}, "-"},
		{NodeStatus{LastOutcome: shapes.Applied, LastSeq: 7, LastReport: &link.Report{Trigger: link.TriggerDeclaration, Seq: 7}}, "applied (seq 7)"},
		{NodeStatus{LastOutcome: shapes.Unchanged, LastReport: &link.Report{Trigger: link.TriggerReconnect}}, "unchanged (reconnect, no declaration yet)"},
	} {
		if got := outcomeSaid(&c.n); got != c.want {
			t.Errorf("%+v: %q, want %q", c.n, got, c.want)
		}
	}
}
