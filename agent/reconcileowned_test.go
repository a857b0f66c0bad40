package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The reports of the reconciles the link sets off — the reconnect's and a
// roster's — carry what the executor says the store owns after them, as a
// declaration's report does: such a reconcile can finish an apply that
// failed (an overlay waiting for its roster), and the control side keeps
// the newest report's copy to hand back after a lost store.
func TestReconcileReportsCarryWhatTheStoreOwns(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	owned := []wire.OwnedEntry{{Target: "path:/etc/motd", Type: "file", Module: "base", ID: "motd", Digest: "ab", Mode: 0o644}}
	ex.mu.Lock()
	ex.owned = owned
	ex.mu.Unlock()
	runAgent(t, id, ex.path)
	carries := func(trigger string) func([]*control.SignedReport) bool {
		return func(rs []*control.SignedReport) bool {
			return slices.ContainsFunc(rs, func(r *control.SignedReport) bool {
				return r.Trigger == trigger && slices.Equal(r.Owned, owned)
			})
		}
	}
	c.reports("n1", "the reconnect's report with what the store owns", carries(link.TriggerReconnect))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The agent takes rosters once a declaration's overlay uses one.
	s1 := c.declare("n1", fmt.Sprintf(overlayDecl, ""))
	waitFor(t, "the overlay declaration", func() bool { return slices.Contains(ex.eventsSeen(), fmt.Sprintf("decl %d", s1)) })
	k := 25
	if _, err := c.client.SetOverlay(ctx, control.OverlayChange{Keepalive: &k}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.PublishRoster(ctx); err != nil {
		t.Fatal(err)
	}
	c.reports("n1", "the roster's report with what the store owns", carries(link.TriggerRoster))
}
