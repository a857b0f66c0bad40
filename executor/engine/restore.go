package engine

import (
	"context"
	"fmt"

	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A boot empties what lives only in the kernel's memory: the firewall's
// rules and the overlay's interface; the host's firewall loaded again
// takes the rules too. The apply that follows (Options.Restore: the
// daemon's start, the firewall's reconcile) puts them back as any apply
// repairs drift, step by step in stated order — which a failed step
// stops. A failure then is an ordinary one (a full disk under a file
// declared before the opening), and the rule the store records must not
// stay out of the firewall until the disk has room: the store would claim
// a port open that is closed, and the machine would have changed (a rule
// gone) with no line saying so.
//
// So when such an apply stops, what the store records of this source
// that no step has reported on is put back: an opening from its record
// (its target names the spec whole) — declared still, or undeclared and
// waiting for the removal the failure skipped, since until an apply gets
// past the failure the machine holds what it held before it — and an
// overlay that is gone, by its declared step (its record keeps a digest
// only). Bringing back exactly what the store records needs no write to
// the store, so a full disk does not stop it, and a cut in the middle
// leaves the store as true as it was, for the next apply to put back
// again.

// putBackLost runs after a restoring apply stopped; see above.
func (r *run) putBackLost() {
	if !r.opt.Restore || r.opt.Plan || !r.stopped {
		return
	}
	// A step that ran (applied, held or failed) has said its target; the
	// others have not.
	for _, res := range r.d.Resources {
		if res.Head().Type != shapes.TypeOverlay {
			continue
		}
		st := &step{res: res, claim: r.claimOf(res), restoring: true}
		st.target = targetOf(st.claim, res)
		if r.ran[claimTarget{st.claim, st.target}] || !r.recordsOwn(r.st.Get(st.target), st.claim) {
			continue // said, or not made before: made by an apply that gets this far
		}
		if cur, err := newOverlayBackend(r).Observe(r.ctx, res.(*shapes.Overlay).Interface); err == nil && cur.Exists {
			continue // not lost: a change to it waits for its own step
		}
		st.line = shapes.Line{Module: res.Head().Module, ID: res.Head().ID, Type: res.Head().Type}
		r.overlay(st, 0)
	}
	for _, e := range r.st.Entries() {
		if e.Type != shapes.TypeOpening {
			continue
		}
		c, ok := r.ownClaim(e)
		if !ok || !r.recordsOwn(e, c) || r.ran[claimTarget{c, e.Target}] {
			continue
		}
		r.putBackOpening(e, c)
	}
}

// declares says whether the declaration has c manage target — read from
// the declaration itself: the steps after a stop never declared theirs.
func (r *run) declares(c store.Claim, target string) bool {
	for _, res := range r.d.Resources {
		if r.claimOf(res) == c && targetOf(c, res) == target {
			return true
		}
	}
	return false
}

// ownClaim is e's claim of the source being applied.
func (r *run) ownClaim(e *store.Entry) (store.Claim, bool) {
	for _, c := range e.Claims {
		if c.Source == r.opt.Source {
			return c, true
		}
	}
	return store.Claim{}, false
}

// recordsOwn says whether e is a settled record (no change in doubt, not
// held as found) that c claims: what the store says the host made.
func (r *run) recordsOwn(e *store.Entry, c store.Claim) bool {
	return e != nil && !e.Stub && e.Pending == nil && !e.Held && e.Claimed(c)
}

// putBackOpening puts the mesh's rule of the recorded opening e back into
// the chains that lack it, marked with c, and reads it back.
func (r *run) putBackOpening(e *store.Entry, c store.Claim) {
	line := shapes.Line{Module: c.Module, ID: c.ID, Type: shapes.TypeOpening, Outcome: shapes.Repaired}
	where, err := r.reopen(e.Target, c)
	switch {
	case err != nil:
		line.Outcome, line.Detail = shapes.Failed, fmt.Sprintf("the store records the mesh's rule for %s, and it could not be put back: %v", e.Target, err)
	case where == "":
		return // the machine still holds it: a daemon restarted, not a boot
	case r.declares(c, e.Target):
		line.Detail = "put back: " + where + "; declared still, and the apply stopped before its step"
	default:
		line.Detail = "put back: " + where + "; no longer declared, and its removal waits for an apply that gets past the failure"
	}
	r.emit(line)
}

// reopen adds the rule of the opening target back where it is missing and
// says where it put it; "" when nothing was missing.
func (r *run) reopen(target string, c store.Claim) (string, error) {
	spec, err := specOfTarget(target)
	if err != nil {
		return "", err
	}
	fw, err := detectFirewall(r.ctx)
	if err != nil {
		return "", err
	}
	cur, err := fw.Observe(r.ctx, spec)
	if err != nil || len(cur.Missing) == 0 {
		return "", err
	}
	if err := fw.Open(r.ctx, spec, firewall.Comment(c.Module+"."+c.ID), cur.Missing); err != nil {
		return "", err
	}
	got, err := fw.Observe(r.ctx, spec)
	if err == nil && len(got.Missing) > 0 {
		err = fmt.Errorf("the mesh's rule for %s is not listed %s", spec, openingWhere(got.Missing))
	}
	if err != nil {
		return "", fmt.Errorf("read back: %w", err)
	}
	return fmt.Sprintf("the mesh's accept rule for %s %s (%s), which the store records and the machine no longer held (a boot, or the host's firewall loaded again)",
		spec, openingWhere(cur.Missing), fw.Name()), nil
}

// OpeningsLost says whether the firewall lacks the rule of an opening the
// store records (settled, not held): the host's firewall loaded again took
// it, and a reconcile is to put it back. It changes nothing; a store with
// no opening costs no look at the firewall.
func OpeningsLost(ctx context.Context, st *store.Store) (bool, error) {
	var fw firewall.Firewall
	for _, e := range st.Entries() {
		if e.Type != shapes.TypeOpening || e.Stub || e.Pending != nil || e.Held {
			continue
		}
		spec, err := specOfTarget(e.Target)
		if err != nil {
			return false, err
		}
		if fw == nil {
			if fw, err = detectFirewall(ctx); err != nil {
				return false, err
			}
		}
		cur, err := fw.Observe(ctx, spec)
		if err != nil {
			return false, err
		}
		if len(cur.Missing) > 0 {
			return true, nil
		}
	}
	return false, nil
}
