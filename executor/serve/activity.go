package serve

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// What the executor does on its own — a start's reconcile after a boot,
// a drift repaired (a hand edit of a file the mesh holds put back), a
// rescue file root applied, a carried bundle — reaches the control side
// by the agent, which asks for it by count (the history's, store.Since)
// whenever the status says the count moved past what it last reported:
// while linked within a heartbeat, and after a disconnection on the
// reconnect's report. The applies a report of their own carries upward (a
// declaration's, a roster's, the reconnect's reconcile) are counted and
// passed over: said once, not twice.

// The triggers of an apply, as the history, the log and the reports name
// them (store.TriggerInterrupted is the store's own).
const (
	triggerStart       = "start"       // the daemon started: after a boot, perhaps
	triggerDrift       = "drift"       // the drift timer
	triggerReconnect   = "reconnect"   // the agent says the link came back
	triggerDeclaration = "declaration" // a declaration the link brought
	triggerRoster      = "roster"      // the mesh's roster changed
	triggerFirewall    = "firewall"    // the host's firewall took a rule of the mesh's
)

// restores says whether an apply of the trigger follows what may have
// taken what lives only in the kernel (a boot, a firewall loaded again):
// what the store records of it is put back even where a step before it
// fails (engine.Options.Restore).
func restores(trigger string) bool { return trigger == triggerStart || trigger == triggerFirewall }

// reportedAlone says whether an activity is one a report of its own
// carried upward.
func reportedAlone(a shapes.Activity) bool {
	switch a.Trigger {
	case triggerDeclaration, triggerRoster, triggerReconnect:
		return true
	}
	return false
}

// ownActivity keeps the activities no report of their own carried.
func ownActivity(a shapes.Activity) bool { return !reportedAlone(a) }

// unsaid keeps, of what was done before a reconnect and past the count
// the agent names, the activities no report is known to have carried:
// its own, and a reconnect's or a roster's. The agent's count moves past
// one of those only once its report is out (the reconnect's with its
// verdict's count, the next look's), so one named again had its report
// lost with the agent (killed between the verdict and the broker's
// confirmation): said now, twice at worst, never not at all. Not a
// declaration's: the agent asks for its kept lines (LastApplied).
func unsaid(a shapes.Activity) bool { return a.Trigger != triggerDeclaration }

func (s *Server) activity(_ context.Context, _ *conn, body any) (wire.Kind, any, error) {
	after := body.(*wire.Activity).After
	part, err := store.Since(s.cfg.StateDir, after, s.newestActivity(), wire.MaxActivities, ownActivity)
	if err != nil {
		s.log.Warn("the history of applies could not be read whole", "err", err)
	}
	return wire.KindActivityReply, &wire.ActivityReply{Acts: part.Acts, Last: part.Last, Lost: part.Lost}, nil
}

// newestSeen caches the history's newest count by the file's identity:
// the status asks for it every few seconds, and the file changes only when
// an apply did something.
type newestSeen struct {
	mu        sync.Mutex
	ino       uint64
	size      int64
	mtimeNano int64
	n         uint64
}

// newestActivity is the count of the newest activity in the history, made
// durable before it is said.
func (s *Server) newestActivity() uint64 {
	fi, err := os.Lstat(filepath.Join(s.cfg.StateDir, store.HistoryFile))
	if err != nil {
		return 0
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	c := &s.newest
	c.mu.Lock()
	defer c.mu.Unlock()
	if st != nil && st.Ino == c.ino && fi.Size() == c.size && fi.ModTime().UnixNano() == c.mtimeNano {
		return c.n
	}
	// Said to the agent, which keeps it: durable first (store.SyncHistory),
	// synced after it is read, so that the line it counts is written
	// before the sync. Not durable, the last durable count is said, and
	// the history looked at again next time.
	n := store.Newest(s.cfg.StateDir)
	if err := store.SyncHistory(s.cfg.StateDir); err != nil {
		s.log.Warn("the history of applies could not be made durable", "err", err)
		return c.n
	}
	if st != nil {
		c.ino, c.size, c.mtimeNano, c.n = st.Ino, fi.Size(), fi.ModTime().UnixNano(), n
	}
	return n
}
