package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
)

const overlayDecl = `{"version":1,"resources":[{"module":"net","id":"wg","type":"overlay","interface":"wg0","address":"10.99.0.1/16","roster":true%s}]}`

// A declaration whose overlay names a roster floor newer than the roster
// the agent last handed over has the newest roster read and handed over
// first, so its apply finds it (the roster's own notice comes up to a
// second later, spread over the mesh); one whose floor the last roster
// meets costs no read of the roster.
func TestADeclarationsRosterFloorBringsTheRosterFirst(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keepalive := func(k int) uint64 {
		t.Helper()
		if _, err := c.client.SetOverlay(ctx, control.OverlayChange{Keepalive: &k}); err != nil {
			t.Fatal(err)
		}
		p, err := c.client.PublishRoster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.Seq
	}
	r1 := keepalive(25)
	s1 := c.declare("n1", fmt.Sprintf(overlayDecl, ""))
	waitFor(t, "the first overlay declaration", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("decl %d", s1)) })
	waitFor(t, "roster 1 handed over", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("roster %d", r1)) })

	r2 := keepalive(30)
	s2 := c.declare("n1", fmt.Sprintf(overlayDecl, fmt.Sprintf(`,"roster_min":%d`, r2)))
	waitFor(t, "the declaration with floor 2", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("decl %d", s2)) })
	ev := ex.eventsSeen()
	if i, j := slices.Index(ev, fmt.Sprintf("roster %d", r2)), slices.Index(ev, fmt.Sprintf("decl %d", s2)); i < 0 || i > j {
		t.Fatalf("the declaration naming roster %d reached the executor before that roster: %v", r2, ev)
	}

	before := len(ex.eventsSeen())
	s3 := c.declare("n1", fmt.Sprintf(overlayDecl, fmt.Sprintf(`,"roster_min":%d`, r2)))
	waitFor(t, "the declaration with the same floor", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("decl %d", s3)) })
	time.Sleep(1500 * time.Millisecond) // a roster notice would have set off its read by now
	if ev := ex.eventsSeen()[before:]; len(ev) != 1 {
		t.Fatalf("a floor the last roster meets: %v reached the executor, want the declaration alone", ev)
	}
}
