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
)

// Two agents linked as one node — a machine copied with its state — are
// both let in by the broker (they hold one credential), and said: serve
// finds their heartbeats alternating between two links, and `nodes` and
// `node show` say so, --json too. One agent relinking (a new link, its
// old one never heard again) is not taken for two.
func TestTwoAgentsLinkedAsOneNodeAreSaid(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx := context.Background()
	_, id := enrolNode(t, s, "copied")
	_, one := enrolNode(t, s, "single")

	// The original and its copy: two connections of one credential.
	original, err := agent.Dial(id, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer original.Close()
	copied, err := agent.Dial(id, nats.NoReconnect())
	if err != nil {
		t.Fatalf("the copy's connection: %v", err)
	}
	defer copied.Close()
	a, b := time.Now().Add(-time.Hour), time.Now().Add(-time.Minute)
	// One agent relinking: links a, then c, then c again — forward only.
	solo, err := agent.Dial(one, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer solo.Close()
	for _, since := range []time.Time{a, a, b, b, b} {
		beatOver(t, solo, one, since)
	}
	for range 3 {
		beatOver(t, original, id, a)
		beatOver(t, copied, id, b)
	}

	cmd := func(args ...string) string {
		t.Helper()
		out, errs, code := run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errs)
		}
		return out
	}
	eventually(t, "node show says two agents", func() bool {
		return strings.Contains(cmd("node", "show", "copied"), "two agents")
	})
	show := cmd("node", "show", "copied")
	t.Log(show)
	for _, want := range []string{"linked as this node", a.UTC().Format(time.RFC3339Nano), b.UTC().Format(time.RFC3339Nano), "a machine copied with its state"} {
		if !strings.Contains(show, want) {
			t.Errorf("node show lacks %q:\n%s", want, show)
		}
	}
	nodes := cmd("nodes")
	var copiedLine, singleLine string
	for _, l := range strings.Split(nodes, "\n") {
		switch {
		case strings.HasPrefix(l, "copied "):
			copiedLine = l
		case strings.HasPrefix(l, "single "):
			singleLine = l
		}
	}
	if !strings.Contains(copiedLine, "TWO AGENTS linked as it") || strings.Contains(singleLine, "TWO AGENTS") {
		t.Fatalf("nodes:\n%s", nodes)
	}
	var ns []*control.NodeStatus
	if err := json.Unmarshal([]byte(cmd("nodes", "--json")), &ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if (n.TwoAgents != nil) != (n.Name == "copied") {
			t.Errorf("nodes --json: %s two agents %+v", n.Name, n.TwoAgents)
		}
	}
	if show := cmd("node", "show", "single"); strings.Contains(show, "two agents") || !strings.Contains(show, "state") {
		t.Fatalf("one agent relinking taken for two:\n%s", show)
	}
}
