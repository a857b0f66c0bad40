package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func actionDigest(a *shapes.Action) string {
	b, _ := json.Marshal([]any{a.Run, a.Verify, a.Timeout})
	return digest(b)
}

func withOutput(s, out string) string {
	if out == "" {
		return s
	}
	return s + ": " + out
}

// action observes an action by its verify, runs it when verify fails, and
// requires verify to pass afterwards. rest is how many resources follow.
func (r *run) action(st *step, rest int) {
	a := st.res.(*shapes.Action)
	st.entry = r.settle(r.st.Get(st.target), st.claim)
	timeout := time.Duration(a.Timeout) * time.Second
	if a.Timeout == 0 {
		timeout = shapes.DefaultActionTimeout * time.Second
	}
	spec := actionDigest(a)
	entry := &store.Entry{Target: st.target, Type: shapes.TypeAction, Claims: withClaim(st.entry, st.claim), Digest: spec}
	if st.entry != nil {
		entry.Order = st.entry.Order
	}

	code, out, err := command.Action(r.ctx, a.Verify, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("verify: %w", err), rest)
		return
	}
	if code == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, "verify passes"
		if !r.opt.Plan && (st.entry == nil || st.entry.Digest != spec || !st.entry.Claimed(st.claim)) {
			if err := r.st.Put(entry); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	st.line.Outcome = shapes.Applied
	if st.entry != nil && st.entry.Digest == spec {
		st.line.Outcome = shapes.Repaired
	}
	if r.opt.Plan {
		st.line.Detail = withOutput(fmt.Sprintf("verify fails (exit %d); would run %q", code, a.Run), out)
		r.emit(st.line)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "run", Claim: st.claim, Type: shapes.TypeAction}, rest) {
		return
	}
	code, out, err = command.Action(r.ctx, a.Run, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("run: %w", err), rest)
		return
	}
	if code != 0 {
		r.fail(st, errors.New(withOutput(fmt.Sprintf("run %q exited %d", a.Run, code), out)), rest)
		return
	}
	code, vout, err := command.Action(r.ctx, a.Verify, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("verify after run: %w", err), rest)
		return
	}
	if code != 0 {
		r.fail(st, errors.New(withOutput(fmt.Sprintf("the action ran without error and its own verify still fails (verify %q exited %d)", a.Verify, code), vout)), rest)
		return
	}
	if err := r.st.Put(entry); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := r.st.Commit(); err != nil {
		r.fail(st, err, rest)
		return
	}
	st.line.Detail = withOutput(fmt.Sprintf("ran %q; verify passes", a.Run), out)
	r.emit(st.line)
}

func init() {
	registerAlone(shapes.TypeAction, (*run).action, func(r *run, st *step) {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "an action leaves nothing the host owns"
	})
}
