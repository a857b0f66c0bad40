package control_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
)

// After a restart the whole fleet links again at once; serve says how many
// nodes have linked of how many until every one has — the nodes with a
// connection to the broker now, not those that ever had one.
func TestServeSaysHowManyNodesHaveLinkedAgain(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	defer s.stop()
	_, a := addNode(t, s, "alpha")
	_, b := addNode(t, s, "beta")
	eventually(t, "no node is counted once addNode's connections are gone", func() bool {
		linked, of := s.srv.Linking()
		return linked == 0 && of == 2
	})
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.srv.SayRelinking(ctx, slog.New(slog.NewTextHandler(&out, nil)), 20*time.Millisecond)
	}()
	eventually(t, "serve says none has linked", func() bool {
		return strings.Contains(out.String(), `msg="nodes linking again" linked=0 of=2`)
	})
	ncA, err := agent.Dial(a, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer ncA.Close()
	eventually(t, "serve says one has linked", func() bool {
		return strings.Contains(out.String(), `msg="nodes linking again" linked=1 of=2`)
	})
	ncB, err := agent.Dial(b, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer ncB.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still says nodes are linking once both have:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `msg="every node has linked again" nodes=2`) {
		t.Fatalf("serve did not say every node has linked:\n%s", out.String())
	}
	ncA.Close()
	eventually(t, "a node that went is no longer counted", func() bool {
		linked, of := s.srv.Linking()
		return linked == 1 && of == 2
	})
}
