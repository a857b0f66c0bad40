package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// A broker that has not read the registry yet (serve starting) does not
// refuse a node: its connect waits, and it is let in once the registry is
// read — where it was refused, took that for its revocation and waited
// longer at each try (a fleet relinking after serve's restart took two
// minutes so). The agent's own timer is an hour here: only the link brings
// it back.
func TestANodeIsNotRefusedWhileTheRegistryIsRead(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("early")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgentPolling(t, id, ex.path, time.Hour)
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, _, err := c.client.Node(ctx, "early")
	if err != nil {
		t.Fatal(err)
	}

	c.stop()
	bare, err := control.StartServer(c.keys, c.listen, logger())
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Shutdown()
	// The agent tries meanwhile (every 2-3 s); it must not be told no.
	time.Sleep(6 * time.Second)
	for _, l := range ex.linksSaid() {
		if !l.Revoked.IsZero() {
			t.Fatalf("the agent was refused by a broker that had not read the registry: %+v", l)
		}
	}
	bare.SetNodes([]*control.NodeRecord{rec})
	bare.SetTokens(nil)
	start := time.Now()
	waitFor(t, "linked again once the registry is read", func() bool { _, r, _ := ex.snapshot(); return r == 2 })
	t.Logf("linked %s after the registry was read", time.Since(start).Round(time.Millisecond))
	for _, l := range ex.linksSaid() {
		if !l.Revoked.IsZero() {
			t.Fatalf("the agent took itself for revoked: %+v", l)
		}
	}
}
