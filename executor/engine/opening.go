package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// An opening is a port made reachable through the firewall found on the
// machine (package firewall says how it meets a found ruleset): one accept
// rule, marked "nox-mesh-host <module.id>", at the top of every base filter
// chain on the opening's hook, so that a found "policy drop" cannot drop
// what the mesh opened. It is observed and read back from the firewall's
// own listing on every apply: a rule deleted by hand is put back
// (repaired), a rule that is not the mesh's is never touched, and the
// mesh's rule is removed when the opening is undeclared. A firewalld or
// ufw found running, or iptables-legacy in use, fails the step with that
// firewall's name rather than half-doing it. The rule is the host's own
// creation: there is nothing found to hold on an adopted node.

// detectFirewall finds the machine's firewall; tests replace it.
var detectFirewall = firewall.Detect

// openingSpec is the firewall's spec of an opening resource.
func openingSpec(o *shapes.Opening) (firewall.Spec, error) {
	return firewall.ParseSpec(o.Path, o.Protocol, o.Port, o.From)
}

// specOfTarget reads a spec back from a target
// "opening:<path>/<port>/<protocol>/<from>" (from may hold a '/').
func specOfTarget(target string) (firewall.Spec, error) {
	rest, ok := strings.CutPrefix(target, "opening:")
	f := strings.SplitN(rest, "/", 4)
	if !ok || len(f) != 4 {
		return firewall.Spec{}, fmt.Errorf("%q is not an opening's target", target)
	}
	port, err := strconv.Atoi(f[1])
	if err != nil {
		return firewall.Spec{}, fmt.Errorf("%q is not an opening's target", target)
	}
	return firewall.ParseSpec(f[0], f[2], port, f[3])
}

// openingWhere says where the rule is, for a line.
func openingWhere(chains []firewall.Chain) string {
	return "in " + firewall.Chains(chains)
}

func (r *run) opening(st *step, rest int) {
	o := st.res.(*shapes.Opening)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	spec, err := openingSpec(o)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	fw, err := detectFirewall(r.ctx)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	cur, err := fw.Observe(r.ctx, spec)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeOpening, Claims: withClaim(e, st.claim), Digest: spec.String(), Created: true}
	if e != nil {
		n.Order = e.Order
	}
	if len(cur.Missing) == 0 {
		st.line.Outcome = shapes.Unchanged
		st.line.Detail = fmt.Sprintf("%s open %s (%s)", spec, openingWhere(cur.Open), fw.Name())
		if len(cur.Open) == 0 {
			st.line.Detail = fmt.Sprintf("%s: no %s chain filters this path; reachable as it is, nothing added", spec, fw.Name())
		}
		r.asDeclared(st, e, n, e != nil && !e.Created, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	verb := "added"
	if r.opt.Plan {
		verb = "would add"
	}
	comment := firewall.Comment(st.claim.Module + "." + st.claim.ID)
	st.line.Detail = fmt.Sprintf("%s an accept rule for %s %s, marked %q", verb, spec, openingWhere(cur.Missing), comment)
	if r.opt.Plan {
		r.emit(st.line)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "create", Claim: st.claim, Type: shapes.TypeOpening, Created: true}, rest) {
		return
	}
	if err := fw.Open(r.ctx, spec, comment, cur.Missing); err != nil {
		r.fail(st, err, rest)
		return
	}
	got, err := fw.Observe(r.ctx, spec)
	if err == nil && len(got.Missing) > 0 {
		err = fmt.Errorf("the mesh's rule for %s is not listed %s", spec, openingWhere(got.Missing))
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// removeOpening removes the mesh's rule of an undeclared opening, and
// nothing else.
func (r *run) removeOpening(st *step) {
	e := st.entry
	st.drop = true
	spec, err := specOfTarget(e.Target)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	fw, err := detectFirewall(r.ctx)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot remove the mesh's rule: "+err.Error(), false
		return
	}
	cur, err := fw.Observe(r.ctx, spec)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	if len(cur.Open) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Removed, fmt.Sprintf("%s: no rule of the mesh's is listed in %s; nothing to remove", spec, fw.Name())
		return
	}
	st.line.Outcome = shapes.Removed
	st.line.Detail = fmt.Sprintf("the mesh's rule for %s removed %s; the operator's rules left as they are", spec, openingWhere(cur.Open))
	if r.opt.Plan {
		st.line.Detail = fmt.Sprintf("the mesh's rule for %s would be removed %s", spec, openingWhere(cur.Open))
	}
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.change = func() error {
		_, err := fw.Close(r.ctx, spec)
		return err
	}
	st.readback = func() (*store.Entry, error) {
		got, err := fw.Observe(r.ctx, spec)
		if err != nil {
			return nil, err
		}
		if len(got.Open) > 0 {
			return nil, fmt.Errorf("the mesh's rule for %s is still listed %s", spec, openingWhere(got.Open))
		}
		return nil, nil
	}
}

func init() {
	registerAlone(shapes.TypeOpening, (*run).opening, (*run).removeOpening)
}
