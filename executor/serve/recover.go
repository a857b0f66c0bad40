package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The request boundary holds: a panic in a handler, or in the engine under
// it, is recovered, answered as an internal error, logged with its stack,
// counted (status, metrics) — and the daemon goes on.
//
// Why a root daemon must not die on a request: the launcher counts a crash
// as a failed start, and enough of them roll the host package back; one
// request that panics, sent a few times (a plan from the control side,
// say), would roll back every node it reached and then halt them.
//
// Why going on is safe:
//   - Every lock a handler takes (applyMu, the store's file lock, the
//     daemon's small mutexes) is released by a deferred call, and deferred
//     calls run while a panic unwinds: nothing stays locked.
//   - The store never claims more than happened at any instant, because it
//     is built to survive kill -9 at any instant: an intent record before
//     each change, an applied record only after the read-back. A handler
//     stopped half way by a panic leaves the store exactly as a kill at
//     that instant would, and the next apply finds the interrupted step and
//     does it again. Each request opens the store afresh, so nothing of the
//     half-done request's memory is used again.
//   - A panic that happens again on every reconcile (a saved target the
//     engine cannot take) stays a failure of that reconcile, reported and
//     counted, instead of a crash loop that rolls releases back.

// FaultsFile, in the executor's state directory, counts the panics the
// daemon recovered from, with the last one: what `mesh-executor status`, a
// process of its own, shows. Kept across restarts, so a fault is not
// forgotten because the daemon was restarted since.
const FaultsFile = "faults.json"

// Faults is FaultsFile's content.
type Faults struct {
	// Recovered counts the panics recovered, since the state was made.
	Recovered int `json:"recovered"`
	// Last is the last one: when, serving what, and what it said. Its stack
	// is in the daemon's log, not here.
	LastAt    time.Time `json:"last_at,omitzero"`
	LastIn    string    `json:"last_in,omitempty"`
	LastPanic string    `json:"last_panic,omitempty"`
}

// ReadFaults reads FaultsFile in dir; the zero Faults when there is none.
func ReadFaults(dir string) (Faults, error) {
	var f Faults
	b, err := os.ReadFile(filepath.Join(dir, FaultsFile))
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%s: %w", FaultsFile, err)
	}
	return f, nil
}

// call runs h for a request of kind k, and turns a panic in it into an
// internal error for the peer.
func (s *Server) call(h handler, ctx context.Context, c *conn, k wire.Kind, body any) (rk wire.Kind, reply any, err error) {
	defer func() {
		if p := recover(); p != nil {
			rk, reply = 0, nil
			err = s.recovered(k.String(), p)
		}
	}()
	return h(s, ctx, c, body)
}

// guard runs f, a piece of the daemon's own work that no request answers
// (a reconcile on a timer), and recovers from its panic the same way.
func (s *Server) guard(what string, f func()) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered(what, p)
		}
	}()
	f()
}

// recovered logs a recovered panic with its stack, counts it, and returns
// the refusal the peer is answered with.
func (s *Server) recovered(where string, p any) error {
	msg := clip(fmt.Sprint(p), 512)
	s.log.Error("recovered from a panic; the daemon goes on", "in", where, "panic", msg, "stack", string(debug.Stack()))
	s.faultMu.Lock()
	f, err := ReadFaults(s.cfg.StateDir)
	if err != nil {
		s.log.Warn("the faults count could not be read; counting from here", "err", err)
	}
	f.Recovered++
	f.LastAt, f.LastIn, f.LastPanic = clock.Now().UTC(), where, msg
	b, _ := json.Marshal(f)
	if err := store.WriteFileAtomic(filepath.Join(s.cfg.StateDir, FaultsFile), b); err != nil {
		s.log.Warn("the faults count could not be kept", "err", err)
	}
	s.faultMu.Unlock()
	s.metrics.mu.Lock()
	s.metrics.panics++
	s.metrics.mu.Unlock()
	s.writeMetrics()
	return &wire.Refusal{Code: wire.CodeInternal, Reason: fmt.Sprintf("an internal error serving %s: %s (recovered: the daemon goes on; its log has the stack)", where, msg)}
}
