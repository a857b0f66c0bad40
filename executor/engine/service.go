package engine

import (
	"fmt"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A service puts a unit the init already knows into a state; it never
// installs one. What the host changes is recorded against the state it
// first found the unit in, once, and undeclaring gives that back (ADR
// 0118): a unit found running is left running; one the host started is
// stopped again, one it enabled disabled again; nothing is started on the
// way out; a unit whose found state is unknown is left alone.

// desiredService is the summary of a service declaration the entry keeps,
// so a later apply can tell drift from a changed declaration.
func desiredService(s *shapes.Service) string {
	en := "-"
	if s.Enabled != nil {
		en = fmt.Sprint(*s.Enabled)
	}
	return "state=" + s.State + " enabled=" + en
}

func describeState(s initsys.State) string {
	run := "stopped"
	if s.Running {
		run = "running"
	}
	if s.Enabled == "" {
		return run
	}
	return run + ", " + s.Enabled
}

// service observes a unit, changes it when it differs, and reads it back.
// rest is how many resources follow, for a failure's message.
func (r *run) service(st *step, rest int) {
	svc := st.res.(*shapes.Service)
	r.reloadUnits()
	unit := r.units[svc.Key()]
	st.target = "service:" + unit
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yields(st, e) {
		if st.record != nil && !r.opt.Plan {
			if err := r.st.Put(st.record); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc)
		return
	}
	cur, err := r.init.State(r.ctx, unit)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if !cur.Known {
		r.fail(st, fmt.Errorf("%s knows no unit %q, even after its unit file was written", r.init.Name(), unit), rest)
		return
	}
	desired := desiredService(svc)
	orig := &store.Original{Kind: shapes.TypeService, Running: cur.Running, Enabled: cur.Enabled}
	if e != nil && e.Original != nil {
		orig = e.Original // recorded once: later applies never overwrite it
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeService, Claims: withClaim(e, st.claim), Original: orig, Digest: desired}
	if e != nil {
		n.Order, n.Held = e.Order, e.Held
	}

	// Held: found on an adopted node, its module not yet taken.
	if r.d.Adopted && !r.taken[svc.Module] && (e == nil || e.Held) {
		r.heldOK[svc.Key()] = (svc.State == "" || (svc.State == "running") == cur.Running) &&
			(svc.Enabled == nil || *svc.Enabled == cur.IsEnabled())
		n.Held, n.Digest = true, ""
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("found %s on an adopted node; held as found until module %s is taken", describeState(cur), svc.Module)
		if e != nil && (e.Original.Running != cur.Running || e.Original.Enabled != cur.Enabled) {
			st.line.Outcome = shapes.HeldChanged
			st.line.Detail = fmt.Sprintf("held until module %s is taken, and changed by something else since it was found (now %s); left as it is", svc.Module, describeState(cur))
		}
		if !r.opt.Plan && (e == nil || !e.Claimed(st.claim)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc)
		return
	}
	n.Held = false

	start := svc.State == "running" && !cur.Running
	stop := svc.State == "stopped" && cur.Running
	setEnabled := svc.Enabled != nil && *svc.Enabled != cur.IsEnabled()
	if !start && !stop && !setEnabled {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, describeState(cur)
		if !r.opt.Plan && (e == nil || e.Digest != desired || !e.Claimed(st.claim) || e.Held) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc)
		return
	}
	st.line.Outcome = shapes.Applied
	if e != nil && e.Digest == desired {
		st.line.Outcome = shapes.Repaired
	}
	var did []string
	if start {
		did = append(did, "started")
	}
	if stop {
		did = append(did, "stopped")
	}
	if setEnabled {
		if *svc.Enabled {
			did = append(did, "enabled at boot")
		} else {
			did = append(did, "disabled at boot")
		}
	}
	st.line.Detail = fmt.Sprintf("%s (found %s)", strings.Join(did, ", "), describeState(cur))
	if e == nil {
		st.line.Detail += "; the state it was found in is kept and given back when this is undeclared"
	}
	if r.opt.Plan {
		r.serviceDone(st, svc)
		return
	}
	in := store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeService}
	if e == nil {
		in.Original = orig
	}
	if !r.intendNow(st, in, rest) {
		return
	}
	if setEnabled {
		if err := r.init.SetEnabled(r.ctx, unit, *svc.Enabled); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	if start {
		err = r.init.Start(r.ctx, unit)
	} else if stop {
		err = r.init.Stop(r.ctx, unit)
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	got, err := r.init.State(r.ctx, unit)
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	if (svc.State == "running" && !got.Running) || (svc.State == "stopped" && got.Running) ||
		(svc.Enabled != nil && *svc.Enabled != got.IsEnabled()) {
		r.fail(st, fmt.Errorf("read back: %s is %s, not %s", unit, describeState(got), desired), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.serviceDone(st, svc)
}

// serviceDone emits the service's line now, or, for one with restart_on,
// after the apply's last step, when it is known whether a file it names
// changed.
func (r *run) serviceDone(st *step, svc *shapes.Service) {
	if len(svc.RestartOn) > 0 {
		r.restarts = append(r.restarts, pendingRestart{st: st, svc: svc})
		return
	}
	r.emit(st.line)
}

type pendingRestart struct {
	st  *step
	svc *shapes.Service
}

// restartOn restarts, after the apply's last step, each unit a changed file
// names — drift repairs included. A unit declared with no state is
// restarted only if it is running; a stopped one is never started by this.
func (r *run) restartOn() {
	for _, p := range r.restarts {
		st, svc := p.st, p.svc
		if r.stopped || st.line.Outcome == shapes.Failed {
			if st.line.Outcome != shapes.Failed {
				st.line.Detail += "; not restarted: the apply stopped before its end"
			}
			r.lines = append(r.lines, st.line)
			if r.opt.OnLine != nil {
				r.opt.OnLine(st.line)
			}
			continue
		}
		var changed []string
		for _, ref := range svc.RestartOn {
			key := ref
			if !strings.Contains(ref, ".") {
				key = svc.Module + "." + ref
			}
			if r.changed[key] {
				changed = append(changed, key)
			}
		}
		if len(changed) > 0 && svc.State != "stopped" {
			unit := r.units[svc.Key()]
			cur, err := r.init.State(r.ctx, unit)
			switch {
			case err != nil:
				st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
			case !cur.Running:
				st.line.Detail += fmt.Sprintf("; %s changed, but the unit is not running: not started", strings.Join(changed, ", "))
			case r.opt.Plan:
				st.line.Detail += fmt.Sprintf("; would be restarted: %s changed", strings.Join(changed, ", "))
				st.line.Outcome = worse(st.line.Outcome, shapes.Applied)
			default:
				if err := r.init.Restart(r.ctx, unit); err != nil {
					st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
				} else {
					st.line.Detail += fmt.Sprintf("; restarted: %s changed", strings.Join(changed, ", "))
					st.line.Outcome = worse(st.line.Outcome, shapes.Applied)
				}
			}
		}
		r.emit(st.line)
	}
	r.restarts = nil
}

// worse returns the more severe of two outcomes.
func worse(a, b shapes.Outcome) shapes.Outcome {
	if shapes.Severity(b) < shapes.Severity(a) {
		return b
	}
	return a
}

// planServiceRemoval gives a unit back the state it was first found in.
func (r *run) planServiceRemoval(st *step) {
	e := st.entry
	unit := strings.TrimPrefix(e.Target, "service:")
	st.drop = true
	o := e.Original
	if e.Held || o == nil {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the state it was found in is unknown; left as it is"
		if e.Held {
			st.line.Detail = "held as found on an adopted node; left as it is"
		}
		return
	}
	if r.init == nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "this host cannot drive its init to give the unit back", false
		return
	}
	cur, err := r.init.State(r.ctx, unit)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	stop := cur.Running && !o.Running
	disable := cur.IsEnabled() && o.Enabled != "" && !(initsys.State{Enabled: o.Enabled}).IsEnabled()
	if !stop && !disable {
		st.line.Outcome = shapes.Forgotten
		switch {
		case cur.Running && o.Running:
			st.line.Detail = "it was running before the mesh; left as it is"
		case !cur.Running && o.Running:
			st.line.Detail = "it was running before the mesh and is stopped now; never started on the way out"
		default:
			st.line.Detail = "already as it was found (" + describeState(cur) + "); left as it is"
		}
		return
	}
	var did []string
	if stop {
		did = append(did, "stopped again")
	}
	if disable {
		did = append(did, "disabled again")
	}
	st.line.Outcome = shapes.Restored
	st.line.Detail = strings.Join(did, " and ") + ", as the host found it"
	if r.opt.Plan {
		st.line.Detail = "would be " + st.line.Detail
	}
	st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: o}
	st.change = func() error {
		if disable {
			if err := r.init.SetEnabled(r.ctx, unit, false); err != nil {
				return err
			}
		}
		if stop {
			return r.init.Stop(r.ctx, unit)
		}
		return nil
	}
	st.readback = func() (*store.Entry, error) {
		got, err := r.init.State(r.ctx, unit)
		if err != nil {
			return nil, err
		}
		if (stop && got.Running) || (disable && got.IsEnabled()) {
			return nil, fmt.Errorf("%s is %s, not as it was found", unit, describeState(got))
		}
		return nil, nil
	}
}

func init() {
	registerAlone(shapes.TypeService, (*run).service, func(r *run, st *step) {
		e := st.entry
		if err := r.connectInit(); err != nil && e.Original != nil {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot give the unit back: "+err.Error(), false
			return
		}
		r.planServiceRemoval(st)
	})
}
