package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// planRequest is the handler of the plan subject (mesh-control plan NODE
// FILE): the request is checked as a declaration is — signed by the pinned
// key for its own purpose, addressed to this node and enrolment, not past
// its time — before the executor sees it (which checks it all again), and
// the answer is a report, trigger plan, naming the request. A request this
// agent refuses is answered too, saying why.
func (a *Agent) planRequest(m *nats.Msg) {
	if !a.planning.CompareAndSwap(false, true) {
		a.log.Warn("a plan request while another is answered; dropped")
		return
	}
	env := append([]byte(nil), m.Data...)
	capability, rotations := m.Header.Get(link.CapabilityHeader), m.Header.Get(link.RotationHeader)
	// Within the run: a plan outliving it would ask an executor client
	// the run has closed.
	go func() {
		defer a.planning.Store(false)
		ctx, cancel := context.WithTimeout(a.runCtx, 2*time.Minute)
		defer cancel()
		r := a.plan(ctx, env, capability, rotations)
		if r == nil {
			return
		}
		if err := a.publishReports(ctx, []*link.Report{r}); err != nil {
			a.log.Warn("the plan's report could not be published", "err", err)
		}
	}()
}

// plan answers one plan request's envelope with the report to publish; nil
// when it names no request this node can answer (not signed by the pinned
// key: nobody to answer). capability is what the control side said beside
// it (link.CapabilityHeader), held to the version skew policy as a
// declaration's is.
func (a *Agent) plan(ctx context.Context, env []byte, capability, rotations string) *link.Report {
	payload, err := a.open(wire.PurposePlan, env, rotations)
	var ku *keyUnasked
	if errors.As(err, &ku) {
		// Its executor, which would answer it, does not answer either.
		a.log.Warn("a plan request signed by a key the executor was not there to confirm; not answered", "reason", err.Error())
		return nil
	}
	if err != nil {
		a.log.Warn("a plan request that does not verify; dropped", "reason", err.Error())
		return nil
	}
	var req wire.PlanRequest
	if err := json.Unmarshal(payload, &req); err != nil {
		a.log.Warn("a plan request that does not parse; dropped", "reason", err.Error())
		return nil
	}
	r := &link.Report{Node: a.id.Node, Enrolment: a.id.Enrolment, Trigger: link.TriggerPlan, PlanID: req.ID, Lines: []shapes.Line{}, At: clock.Now().UTC()}
	refuse := func(code wire.Code, reason string) *link.Report {
		r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, reason, code.String(), "agent"
		return r
	}
	skew, err := link.HeaderCapability(capability)
	if err == nil {
		err = link.CheckControl(skew)
	}
	switch {
	case err != nil:
		r = refuse(wire.CodeNone, err.Error())
		r.Code = CodeSkew
		return r
	case req.Node != a.id.Node || req.Enrolment != a.id.Enrolment:
		return refuse(wire.CodeAddress, fmt.Sprintf("the plan request is addressed to node %q enrolment %q; this is node %q enrolment %q", req.Node, req.Enrolment, a.id.Node, a.id.Enrolment))
	case clock.Now().After(req.NotAfter):
		a.log.Warn("a plan request past its time; not handed to the executor", "plan", req.ID, "not_after", req.NotAfter)
		return refuse(wire.CodeReplay, (&pastTime{req.NotAfter, clock.Now()}).Error())
	}
	// The archives it names are looked up in the store as before an apply
	// (checkArchives): one the store says no node can take refuses the
	// plan as it would the declaration. One that does not parse is the
	// executor's to refuse, as it would a declaration's.
	if d, err := shapes.Parse(req.Declaration); err == nil {
		if err := a.checkArchives(ctx, d); err != nil {
			var ar *archiveRefusal
			if !errors.As(err, &ar) {
				return refuse(wire.CodeInternal, "the archive store could not be read: "+err.Error())
			}
			return ar.refuse(r)
		}
	}
	// The worker's connection, in turn: a plan waits for the apply before
	// it (the executor plans against what an apply wrote anyway), and is
	// looked at again once its turn comes, so one that waited past its
	// time (the agent stopped, a long apply) is never run.
	a.log.Info("asking the executor for a plan", "plan", req.ID)
	b, err := a.exec.askIf(func() error {
		if now := clock.Now(); now.After(req.NotAfter) {
			return &pastTime{req.NotAfter, now}
		}
		return nil
	}, wire.KindPlan, &wire.Plan{Envelope: env}, "plan")
	var late *pastTime
	if errors.As(err, &late) {
		a.log.Warn("a plan request past its time; not handed to the executor", "plan", req.ID, "not_after", req.NotAfter)
		return refuse(wire.CodeReplay, late.Error())
	}
	if err != nil {
		return refuse(wire.CodeInternal, link.PlanUnasked+err.Error())
	}
	p := b.(*wire.PlanReply)
	r.Outcome, r.Lines, r.Diffs = p.Outcome, p.Lines, link.DiffList(p.Diffs)
	if p.Outcome == shapes.Refused || p.Code != wire.CodeNone {
		r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, p.Refused, p.Code.String(), "executor"
	}
	a.log.Info("planned", "plan", req.ID, "outcome", r.Outcome)
	return r
}

// pastTime: a plan request's NotAfter passed before the agent handed it
// over. Its report says both times: the control side's clock set the one,
// this node's reads the other.
type pastTime struct{ notAfter, now time.Time }

func (p *pastTime) Error() string {
	return wire.PlanPast(p.notAfter, p.now, "") + ": not run"
}
