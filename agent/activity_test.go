package agent_test

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// What the executor does on its own while the node is linked — here a
// drift repaired, someone's hand edit of a file the mesh holds put back —
// reaches the control side within a status look, by name, not only at the
// next reconnect; a burst of them in bounded reports; each once across an
// agent's restart and across a disconnection, whose reconnect report
// carries what was done since the last reported, and nothing twice.
func TestWhatTheExecutorDoesOnItsOwnIsReportedWhileLinked(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("own")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	state := t.TempDir()
	stop := runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })

	drift := func(i int) shapes.Activity {
		return shapes.Activity{At: time.Now().UTC(), Source: "link", Trigger: "drift", Seq: 1, Outcome: shapes.Repaired, Changed: 1,
			Lines: []shapes.Line{{Module: "ssh", ID: fmt.Sprintf("sshd_config-%d", i), Type: "file", Outcome: shapes.Repaired, Detail: "content was changed by something else"}}}
	}
	// said is every activity the node's reports named, by its line's id,
	// from reports of either trigger.
	said := func(rs []*control.SignedReport) (ids []string, activityReports int) {
		for _, r := range rs {
			if r.Trigger == link.TriggerActivity {
				activityReports++
				if r.Seq != 0 || r.Outcome != shapes.Repaired {
					t.Errorf("an activity report of seq %d, outcome %s", r.Seq, r.Outcome)
				}
			}
			for _, a := range r.Meanwhile {
				for _, l := range a.Lines {
					ids = append(ids, l.ID)
				}
			}
		}
		return ids, activityReports
	}
	saidAll := func(n int) func([]*control.SignedReport) bool {
		return func(rs []*control.SignedReport) bool { ids, _ := said(rs); return len(ids) >= n }
	}
	ex.doing(drift(0))
	rs := c.reports("own", "the drift reported while linked", saidAll(1))
	if ids, n := said(rs); !slices.Equal(ids, []string{"sshd_config-0"}) || n != 1 {
		t.Fatalf("said %v in %d activity reports: %s", ids, n, describe(rs))
	}

	// A burst: in reports of at most sixteen, each activity once.
	for i := 1; i <= 20; i++ {
		ex.doing(drift(i))
	}
	rs = c.reports("own", "the burst reported", saidAll(21))
	ids, n := said(rs)
	if len(ids) != 21 || n < 3 {
		t.Fatalf("said %d activities in %d activity reports, want 21 in at least 3: %v", len(ids), n, ids)
	}
	for i := range 21 {
		if !slices.Contains(ids, fmt.Sprintf("sshd_config-%d", i)) {
			t.Errorf("sshd_config-%d never said", i)
		}
	}

	// Restarted where it stopped: nothing said again.
	stop()
	runAgentIn(t, id, ex.path, 0, state)
	waitFor(t, "the Reconnected of the restart", func() bool { _, r, _ := ex.snapshot(); return r == 2 })
	ex.doing(drift(21))
	rs = c.reports("own", "the one after the restart", saidAll(22))
	time.Sleep(time.Second) // a look or two more: nothing else comes
	rs = c.reports("own", "the reports", saidAll(22))
	if ids, _ := said(rs); len(ids) != 22 {
		t.Fatalf("after the restart, %d said (want 22, each once): %v", len(ids), ids)
	}

	// Cut off: what is done meanwhile rides on the reconnect's report,
	// and on no activity report besides.
	c.stop()
	ex.doing(drift(22))
	time.Sleep(time.Second)
	c.start()
	rs = c.reports("own", "the reconnect's report", saidAll(23))
	time.Sleep(time.Second)
	rs = c.reports("own", "the reports", saidAll(23))
	if ids, _ := said(rs); len(ids) != 23 {
		t.Fatalf("after the reconnect, %d said (want 23, each once): %v", len(ids), ids)
	}
	i := slices.IndexFunc(rs, func(r *control.SignedReport) bool {
		return r.Trigger == link.TriggerReconnect && len(r.Meanwhile) == 1 && r.Meanwhile[0].Lines[0].ID == "sshd_config-22"
	})
	if i < 0 {
		t.Errorf("the reconnect's report does not carry what was done while cut off: %s", describe(rs))
	}
}

// The client library says connected a moment before its handler of the
// new link runs (on a goroutine of its own: late on a busy machine). A
// look in that moment must not report what the executor did while cut
// off as activity: it rides on the reconnect's report, which follows.
// The handler is held back here for two seconds, as long as the work
// loop's wait while unlinked and more.
func TestWhatWasDoneWhileCutOffWaitsForTheReconnect(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("late")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	var hold atomic.Bool
	runAgentWith(t, id, ex.path, t.TempDir(), func(o *agent.Options) {
		agent.OnLinked(o, func() {
			if hold.Load() {
				time.Sleep(2 * time.Second)
			}
		})
	})
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	drift := shapes.Activity{At: time.Now().UTC(), Source: "link", Trigger: "drift", Seq: 1, Outcome: shapes.Repaired, Changed: 1,
		Lines: []shapes.Line{{Module: "ssh", ID: "sshd_config", Type: "file", Outcome: shapes.Repaired, Detail: "content was changed by something else"}}}
	// The activity count starts at the first look that says one.
	waitFor(t, "a look", func() bool { return len(ex.linksSaid()) > 0 })

	c.stop()
	hold.Store(true)
	ex.doing(drift)
	time.Sleep(time.Second) // a look or two: the count past the one reported
	c.start()
	carried := func(rs []*control.SignedReport) bool {
		return slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return len(r.Meanwhile) > 0 })
	}
	rs := c.reports("late", "what was done while cut off, reported", carried)
	time.Sleep(time.Second)
	rs = c.reports("late", "the reports", carried)
	for _, r := range rs {
		if len(r.Meanwhile) > 0 && r.Trigger != link.TriggerReconnect {
			t.Fatalf("what was done while cut off went up on a report of trigger %s, ahead of the reconnect's: %s", r.Trigger, describe(rs))
		}
	}
}
