package agent_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// The agent measures its clock against the broker's as the control side
// does — its own newest heartbeat read back, the time it stamped against
// the broker's receipt — in either layout, and tells the executor with
// each status; a node reads back no other node's heartbeat. A heartbeat
// stamped three hours behind reads three hours behind.
func TestTheAgentMeasuresItsClockAgainstTheBrokers(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("ticking")
	other, _ := c.addNode("other")
	for _, l := range []link.Layout{link.LayoutByKind, link.LayoutByNode} {
		t.Run([]string{"by kind", "by node"}[l], func(t *testing.T) {
			me := *id
			me.Layout, me.Subjects = l, link.NodeSubjects(id.Node, l)
			// The broker learns of a node just added a moment after.
			var nc *nats.Conn
			var err error
			waitFor(t, "the node linked", func() bool {
				nc, err = agent.Dial(&me, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
				return err == nil
			})
			defer nc.Close()
			for _, behind := range []time.Duration{0, 3 * time.Hour} {
				at := time.Now().Add(-behind).UTC()
				hb, _ := json.Marshal(&link.Heartbeat{Node: id.Node, Enrolment: id.Enrolment, At: at})
				if err := nc.Publish(me.Subjects.Heartbeat, hb); err != nil {
					t.Fatal(err)
				}
				nc.Flush()
				var skew time.Duration
				var said time.Time
				waitFor(t, "the heartbeat read back", func() bool {
					skew, said, err = agent.MeasureClock(nc, me.Subjects.HeartbeatGet, at)
					return err == nil && said.Equal(at)
				})
				if want := -behind; skew > want+5*time.Second || skew < want-5*time.Second {
					t.Errorf("a heartbeat stamped %v behind measures %v", behind, skew)
				}
			}
			// Another node's heartbeat: not its to read.
			theirs := link.NodeSubjects(other.Node, l).HeartbeatGet
			if _, _, err := agent.MeasureClock(nc, theirs, time.Time{}); err == nil {
				t.Errorf("%s read back %s's heartbeat (%s)", id.Node, other.Node, theirs)
			}
		})
	}

	// The agent itself: its status says the measure (its clock is this
	// machine's: within a few seconds of the broker's on the same one).
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	waitFor(t, "the executor told the clock's measure", func() bool {
		ls := ex.linksSaid()
		return len(ls) > 0 && !ls[len(ls)-1].ClockAt.IsZero()
	})
	ls := ex.linksSaid()
	if l := ls[len(ls)-1]; l.ClockSkew.Abs() > 5*time.Second || time.Since(l.ClockAt).Abs() > time.Minute {
		t.Errorf("the agent measured its clock %v off at %v", l.ClockSkew, l.ClockAt)
	}
	for _, l := range ls {
		if l.Up && l.Error != "" {
			t.Errorf("a link up said with an error: %+v", l)
		}
	}
}
