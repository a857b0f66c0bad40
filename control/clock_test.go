package control_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Presence is the control side's clock: a node whose clock is a year fast
// and one a year slow are both heard "now" (when the broker received what
// they said), and each shows its clock's skew beside it — in the registry,
// in `nodes` and in `node show`. A node with a good clock shows none.
func TestPresenceIsTheControlSidesClock(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const year = 8760 * time.Hour
	clocks := map[string]time.Duration{"fast": year, "slow": -year, "good": 2 * time.Second}
	before := time.Now()
	for name, off := range clocks {
		_, id := addNode(t, s, name)
		nc, err := agent.Dial(id)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		send := func(subj string, v any) {
			data, _ := json.Marshal(v)
			sig, _ := id.Sign(data)
			if err := nc.PublishMsg(&nats.Msg{Subject: subj, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
				t.Fatal(err)
			}
		}
		at := time.Now().Add(off).UTC()
		send(id.Subjects.Report, link.Report{Node: name, Enrolment: id.Enrolment, Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Unchanged, At: at})
		send(id.Subjects.Heartbeat, link.Heartbeat{Node: name, Enrolment: id.Enrolment, At: at, Interval: 30, State: link.StateEnrolled, AgentVersion: "v"})
		nc.Flush()
	}
	var ns []*control.NodeStatus
	for {
		var err error
		ns, err = s.client.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		heard := 0
		for _, n := range ns {
			if n.Heartbeat != nil && n.LastReport != nil {
				heard++
			}
		}
		if heard == len(clocks) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the nodes were not heard: %+v", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := time.Now()
	for _, n := range ns {
		if n.LastHeard.Before(before.Add(-time.Second)) || n.LastHeard.After(after) {
			t.Errorf("%s: last heard %s, not between %s and %s (the broker's receipt)", n.Name, n.LastHeard, before, after)
		}
		skew := time.Duration(n.ClockSkewMS) * time.Millisecond
		switch want := clocks[n.Name]; {
		case want.Abs() < control.ClockSkewShown && skew != 0:
			t.Errorf("%s: a skew of %v shown for a clock %v off", n.Name, skew, want)
		case want.Abs() >= control.ClockSkewShown && (skew-want).Abs() > time.Minute:
			t.Errorf("%s: skew %v, want about %v", n.Name, skew, want)
		}
	}
	out, errs, code := run(t, ctx, "nodes", "--dir", dir, "--nats", s.url)
	if code != 0 || !strings.Contains(out, "clock +8760h") || !strings.Contains(out, "clock -8760h") || strings.Contains(out, "8760h0m0s ago") {
		t.Fatalf("nodes (%d):\n%s\n%s", code, out, errs)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "good ") && strings.Contains(l, "clock") {
			t.Fatalf("a good clock shown as skewed: %s", l)
		}
	}
	out, _, code = run(t, ctx, "node", "show", "fast", "--dir", dir, "--nats", s.url)
	if code != 0 || !strings.Contains(out, "its clock is 8760h") || !strings.Contains(out, "ahead of the control side's") {
		t.Fatalf("node show:\n%s", out)
	}
}
