package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// plan answers a plan request (mesh-control plan NODE FILE): verified as
// everything from the link is — signed by the pinned key for its own
// purpose (PurposePlan: a declaration's envelope is no plan request, nor
// the reverse), addressed to this node and enrolment, not past its time —
// then the declaration planned on the one decision path apply takes
// (engine.Apply with Plan), against the store read as it is (store.Peek:
// nothing written, no lock taken), and the lines an apply would report
// returned. It takes no sequence and moves no floor: a plan is no
// declaration. Content diffs are returned only for files the mesh holds
// and that are as it wrote them: what the control plane declared before,
// never a file's content the mesh did not write (a found file, a drift, a
// sealed file's plaintext).
func (s *Server) plan(ctx context.Context, _ *conn, body any) (wire.Kind, any, error) {
	defer s.giveBack()
	return wire.KindPlanReply, s.Plan(ctx, body.(*wire.Plan).Envelope), nil
}

// Plan is plan's work, for a request's envelope.
func (s *Server) Plan(ctx context.Context, env []byte) *wire.PlanReply {
	refuse := func(code wire.Code, format string, args ...any) *wire.PlanReply {
		return &wire.PlanReply{Outcome: shapes.Refused, Code: code, Refused: "executor: " + fmt.Sprintf(format, args...), Lines: []shapes.Line{}}
	}
	// One thing at a time: a plan reads what an apply writes, and is
	// checked under the identity in force when it is planned
	// (ApplyEnvelope) — and its time once the lock is held: a plan that
	// waited behind a long apply may be past its time now, and is planned
	// against what that apply left, not what was before it.
	asked := clock.Now()
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	id, err := s.identity()
	if err != nil {
		return refuse(wire.CodeInternal, "%v", err)
	}
	if id == nil {
		return refuse(wire.CodeNotEnrolled, "this host has no identity (hosted): it plans nothing from the link")
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposePlan, env)
	if err != nil {
		v := openRefusal(err)
		return refuse(v.Code, "%s", v.Reason)
	}
	var req wire.PlanRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		return refuse(wire.CodeMalformed, "the plan request does not parse: %v", err)
	}
	switch {
	case req.Node != id.Node || req.Enrolment != id.Enrolment:
		return refuse(wire.CodeAddress, "the plan request is addressed to node %q enrolment %q; this is node %q enrolment %q", req.Node, req.Enrolment, id.Node, id.Enrolment)
	case clock.Now().After(req.NotAfter):
		// This node's own time is said: a refusal for time is as often a
		// clock that is off as a request that is late.
		why := ""
		if !asked.After(req.NotAfter) {
			why = "it waited for an apply"
		}
		return refuse(wire.CodeReplay, "%s", wire.PlanPast(req.NotAfter, clock.Now(), why))
	case req.NotAfter.Sub(clock.Now()) > wire.PlanWithin+time.Minute:
		return refuse(wire.CodeInvalid, "%s", wire.PlanTooFar(req.NotAfter, clock.Now()))
	}
	d, err := shapes.Parse(req.Declaration) // the link's parser: no action
	if err != nil {
		return refuse(wire.CodeInvalid, "%v", err)
	}
	st, _, err := store.Peek(s.cfg.StateDir)
	if err != nil {
		return refuse(wire.CodeInternal, "%v", err)
	}
	diffs := map[string]string{}
	failed, failedWhy := s.failedRelease()
	rep := engine.Apply(ctx, st, d, req.Declaration, engine.Options{Source: store.Link, NodeID: id.Node, Plan: true, Partial: s.cfg.Partial, Log: s.log,
		Roster: heldRoster(s.cfg.StateDir, id), Unseal: Unsealer(s.cfg.StateDir, d.Node, d.Seq), HostBinary: s.cfg.HostBinary, HostVersion: s.cfg.Version,
		AgentUser: s.cfg.AgentUser, FailedHostRelease: failed, FailedHostReason: failedWhy,
		OnDiff: func(module, rid, diff string) { diffs[module+"."+rid] = diff }})
	out := &wire.PlanReply{Outcome: rep.Outcome, Lines: rep.Lines, Refused: rep.Refused}
	if out.Lines == nil {
		out.Lines = []shapes.Line{}
	}
	if rep.Outcome == shapes.Refused {
		out.Code = wire.CodeInvalid
	}
	for _, r := range d.Resources {
		key := r.Head().Key()
		diff, has := diffs[key]
		if !has {
			continue
		}
		switch f := r.(type) {
		case *shapes.File:
			if diff == engine.SealedNotShown {
				break // it says so, and the file's own reason is not the machine's
			}
			if why := s.mayShow(st, f.Path, diff); why != "" {
				diff = "(not shown: " + why + ")"
			}
		case *shapes.Keys, *shapes.Region:
			// The lines around an edit are the machine's file's.
			diff = "(not shown: an edit of a file the machine holds; its content is the machine's)"
		default:
			continue
		}
		if out.Diffs == nil {
			out.Diffs = map[string]string{}
		}
		out.Diffs[key] = diff
	}
	s.log.Info("planned", "outcome", out.Outcome, "lines", len(out.Lines), "refused", out.Refused)
	return out
}

// mayShow says why a file's diff is not shown over the link, or "": shown
// only when the mesh holds the file and it is exactly what the mesh wrote
// in plain (so its content is what the control plane declared before), or
// when there is no file and the diff is of nothing (from /dev/null: all
// it shows is what the control plane declares; sealed content is never in
// a diff, engine.planDiff).
func (s *Server) mayShow(st *store.Store, path, diff string) string {
	e := st.Get(shapes.Target(&shapes.File{Path: path}))
	switch {
	case e == nil && strings.HasPrefix(diff, "--- /dev/null\n"):
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return ""
		}
		return "a file the mesh does not hold; its content is the machine's"
	case e == nil || e.Type != shapes.TypeFile:
		return "a file the mesh does not hold; its content is the machine's"
	case e.Digest == "" || len(e.Digest) != 64:
		return "the mesh holds it with content it does not show (sealed, or not yet read back)"
	}
	sum, info, err := fsx.Sum(path)
	if err != nil || info.Kind != fsx.Regular || fmt.Sprintf("%x", sum) != e.Digest {
		return "it differs from what the mesh wrote; its content is the machine's"
	}
	return ""
}
