package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/dockerapi"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A network is a container network by name, made through the runtime's
// Engine API (see container.go) with the host's label (networkLabel) and
// read back by inspecting it. One found by name is the runtime's or
// somebody's: the host uses it as it is, holds it on an adopted node, and
// never removes it. One the host made is removed when undeclared — but
// kept, and said so, while a container the host does not own (no
// specLabel) is attached to it, since removing the network would cut that
// container off or fail half-way; a later apply removes it once it is free.

// networkLabel marks a network the host made, naming its resource.
const networkLabel = "nox-mesh-host.network"

// netInspected is what the host reads back of a network.
type netInspected struct {
	Name       string            `json:"Name"`
	ID         string            `json:"Id"`
	Labels     map[string]string `json:"Labels"`
	Containers map[string]struct {
		Name string `json:"Name"`
	} `json:"Containers"`
}

func inspectNetwork(ctx context.Context, rt *dockerapi.Client, name string) (cur netInspected, found bool, err error) {
	err = rt.Do(ctx, "GET", dockerapi.Path(nil, "networks", name), nil, &cur)
	if dockerapi.IsNotFound(err) {
		return cur, false, nil
	}
	if err != nil {
		return cur, false, fmt.Errorf("inspect network %s: %w", name, err)
	}
	return cur, true, nil
}

// network observes a network by name, makes it when absent, and reads it
// back.
func (r *run) network(st *step, rest int) {
	nw := st.res.(*shapes.Network)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	rt, err := findRuntime(r.ctx, shapes.TypeNetwork)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	cur, found, err := inspectNetwork(r.ctx, rt, nw.Name)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeNetwork, Claims: withClaim(e, st.claim), Digest: "network:" + nw.Name}
	if e != nil {
		n.Order, n.Created = e.Order, e.Created
	}
	if found {
		mine := cur.Labels[networkLabel] != ""
		n.Created = n.Created && mine
		if !mine && r.holds(nw.Module, e) {
			r.heldOK[nw.Key()] = true // a network by name is all that is declared
			n.Held, n.Digest = true, ""
			st.line.Outcome = shapes.Held
			st.line.Detail = fmt.Sprintf("found on an adopted node; held as found until module %s is taken", nw.Module)
			if !r.opt.Plan && (e == nil || !e.Claimed(st.claim)) {
				if err := r.st.Put(n); err != nil {
					r.fail(st, err, rest)
					return
				}
			}
			r.emit(st.line)
			return
		}
		st.line.Outcome, st.line.Detail = shapes.Unchanged, "present"
		if !mine {
			st.line.Detail = "present, not made by the host: used as it is, never removed by it"
		}
		r.asDeclared(st, e, n, e != nil && e.Held, rest)
		return
	}
	n.Created = true
	st.line.Outcome = changedOutcome(e, n)
	st.line.Detail = "created"
	if e != nil && e.Created {
		st.line.Detail = "gone; created again"
	}
	if r.opt.Plan {
		st.line.Detail = "would be " + strings.TrimPrefix(st.line.Detail, "gone; ")
		r.emit(st.line)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "create", Claim: st.claim, Type: shapes.TypeNetwork, Created: true}, rest) {
		return
	}
	body := map[string]any{"Name": nw.Name, "CheckDuplicate": true, "Labels": map[string]string{networkLabel: st.claim.Key()}}
	if err := rt.Do(r.ctx, "POST", dockerapi.Path(nil, "networks", "create"), body, &struct{}{}); err != nil {
		r.fail(st, fmt.Errorf("create network %s: %w", nw.Name, err), rest)
		return
	}
	got, found, err := inspectNetwork(r.ctx, rt, nw.Name)
	if err == nil && (!found || got.Labels[networkLabel] == "") {
		err = fmt.Errorf("network %s is not there with the host's label", nw.Name)
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

// removeNetwork removes an undeclared network the host made, unless a
// container the host does not own is attached.
func (r *run) removeNetwork(st *step) {
	e := st.entry
	name := strings.TrimPrefix(e.Target, "network:")
	st.drop = true
	if !e.Created {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "network "+name+" was found, not made by the host; left as it is"
		return
	}
	rt, err := findRuntime(r.ctx, shapes.TypeNetwork)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot remove the network: "+err.Error(), false
		return
	}
	cur, found, err := inspectNetwork(r.ctx, rt, name)
	switch {
	case err != nil:
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	case !found:
		st.line.Outcome, st.line.Detail = shapes.Removed, "network "+name+" is gone already"
		return
	case cur.Labels[networkLabel] == "":
		st.line.Outcome, st.line.Detail = shapes.Forgotten, fmt.Sprintf("network %s does not carry the host's %s label; left as it is", name, networkLabel)
		return
	}
	var foreign []string
	for id, a := range cur.Containers {
		c, ok, err := inspectContainer(r.ctx, rt, id)
		if err != nil {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
			return
		}
		if ok && c.label() == "" {
			foreign = append(foreign, strings.TrimPrefix(a.Name, "/"))
		}
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		// Kept, and still tracked: its line names it, and every apply
		// tries again.
		st.record, st.drop = e, false
		st.line.Outcome = shapes.Kept
		st.line.Detail = fmt.Sprintf("network %s is still used by %s, which the host does not own; kept, and removed once nothing of another's is attached", name, strings.Join(foreign, ", "))
		return
	}
	st.line.Outcome, st.line.Detail = shapes.Removed, "network "+name+" removed"
	if r.opt.Plan {
		st.line.Detail = "network " + name + " would be removed"
		return
	}
	st.intent = &store.Intent{Op: "remove", Type: shapes.TypeNetwork, Claim: firstClaim(e)}
	st.change = func() error {
		if err := rt.Do(r.ctx, "DELETE", dockerapi.Path(nil, "networks", name), nil, nil); err != nil && !dockerapi.IsNotFound(err) {
			return fmt.Errorf("remove network %s: %w", name, err)
		}
		return nil
	}
	st.readback = func() (*store.Entry, error) {
		if _, found, err := inspectNetwork(r.ctx, rt, name); err != nil || found {
			return nil, errors.Join(err, fmt.Errorf("network %s is still there", name))
		}
		return nil, nil
	}
}

func init() {
	registerAlone(shapes.TypeNetwork, (*run).network, (*run).removeNetwork)
}
