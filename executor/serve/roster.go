package serve

import (
	"bytes"
	"context"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The mesh's roster (shapes.Roster) is the overlay's peers, signed by the
// control plane once per change and the same for every node. The executor
// takes it from the agent like a declaration — under the pinned key, for
// its own purpose, only newer than the one it holds — and keeps the
// envelope (identity.RosterFile), verifying it again whenever it is used:
// nothing the agent says about it is believed.

func (s *Server) roster(ctx context.Context, c *conn, body any) (wire.Kind, any, error) {
	defer s.giveBack()
	return wire.KindVerdict, s.TakeRoster(ctx, body.(*wire.Roster).Envelope, c.line), nil
}

// TakeRoster verifies env as the mesh's roster and, if it is newer than the
// one held, keeps it and applies again every target whose overlay takes its
// peers from the roster, giving each line to emit. The same roster again
// is a duplicate (nothing done); an older one, or another with the same
// sequence, is refused and changes nothing.
func (s *Server) TakeRoster(ctx context.Context, env []byte, emit func(shapes.Line)) *wire.Verdict {
	// Under the apply lock from the identity on, as a declaration is
	// (ApplyEnvelope).
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	id, err := s.identity()
	if err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	if id == nil {
		return refusal(wire.CodeNotEnrolled, "this host has no identity (hosted): it takes no roster from the link")
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeRoster, env)
	if err != nil {
		return openRefusal(err)
	}
	r, err := shapes.ParseRoster(payload)
	if err != nil {
		return refusal(wire.CodeInvalid, "%v", err)
	}
	heldEnv, _ := identity.ReadRoster(s.cfg.StateDir)
	if held := openRoster(heldEnv, id); held != nil {
		switch {
		case r.Seq == held.Seq && bytes.Equal(env, heldEnv):
			return &wire.Verdict{Outcome: shapes.Unchanged, Duplicate: true, Reason: "executor: this roster is the one held"}
		case r.Seq == held.Seq:
			return refusal(wire.CodeConflict, "roster %d is held already with other bytes; refused", r.Seq)
		case r.Seq < held.Seq:
			return refusal(wire.CodeReplay, "roster %d is not newer than the one held, %d", r.Seq, held.Seq)
		}
	}
	if err := identity.WriteRoster(s.cfg.StateDir, env); err != nil {
		return refusal(wire.CodeInternal, "keep the roster: %v", err)
	}
	s.log.Info("took the mesh's roster", "roster", r.Seq, "nodes", len(r.Nodes))
	return s.reconcile(ctx, triggerRoster, emit, true)
}

// HeldRoster is the roster the host in stateDir holds, verified under its
// pinned key now; nil when it holds none that verifies (or no identity).
func HeldRoster(stateDir string) *shapes.Roster {
	id, err := identity.Load(stateDir)
	if err != nil || id == nil {
		return nil
	}
	return heldRoster(stateDir, id)
}

// heldRoster is HeldRoster for the identity id, already read.
func heldRoster(stateDir string, id *identity.Identity) *shapes.Roster {
	if id == nil {
		return nil
	}
	env, err := identity.ReadRoster(stateDir)
	if err != nil {
		return nil
	}
	return openRoster(env, id)
}

func openRoster(env []byte, id *identity.Identity) *shapes.Roster {
	if env == nil {
		return nil
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeRoster, env)
	if err != nil {
		return nil
	}
	r, err := shapes.ParseRoster(payload)
	if err != nil {
		return nil
	}
	return r
}
