package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// removeUndeclared undoes, by DESIGN.md's table, what this source applied
// earlier and no longer declares, newest first. What another source still
// declares is only released by this one; what the host found is given back;
// what it held is forgotten, never removed.
func (r *run) removeUndeclared() {
	entries := r.st.Entries()
	slices.Reverse(entries)
	var batch []*step
	for _, e := range entries {
		var mine, rest []store.Claim
		claims := e.Claims
		if e.Stub && e.Pending != nil {
			claims = []store.Claim{e.Pending.Claim}
		}
		for _, c := range claims {
			if c.Source == r.opt.Source && !r.declared[claimTarget{c, e.Target}] {
				mine = append(mine, c)
			} else {
				rest = append(rest, c)
			}
		}
		// An entry nobody claims any more (a directory kept because it
		// held what the host did not make) is tried again by every apply.
		if len(mine) == 0 && len(claims) > 0 {
			continue
		}
		st := &step{target: e.Target, entry: r.settle(e, store.Claim{})}
		st.line = shapes.Line{Type: e.Type}
		if len(mine) > 0 {
			st.line.Module, st.line.ID = mine[0].Module, mine[0].ID
		}
		if len(rest) > 0 {
			n := *st.entry
			n.Claims = rest
			st.record = &n
			st.line.Outcome = shapes.Forgotten
			st.line.Detail = "released by this source; still declared by " + joinClaims(rest)
			batch = append(batch, st)
			continue
		}
		r.planRemoval(st)
		batch = append(batch, st)
	}
	r.execute(batch, 0)
}

// planRemoval decides how to undo one entry nobody declares any more.
func (r *run) planRemoval(st *step) {
	e := st.entry
	p := pathOf(e.Target)
	st.drop = true
	if remove, ok := removers[e.Type]; ok && !e.Held && !e.Recovered {
		remove(r, st)
		return
	}
	switch {
	case e.Held:
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "held as found on an adopted node; never removed"
	case e.Recovered && r.keepRecovered(st, p):
		// Decided: forgotten, with the reason on the line.
	case e.Type == shapes.TypeFile && e.Created:
		st.line.Outcome, st.line.Detail = shapes.Removed, "the host created it; removed"
		st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
		st.change = func() error {
			r.touch(parentOf(p))
			return fsx.Remove(p)
		}
		st.readback = func() (*store.Entry, error) { return nil, expectAbsent(p) }
	case e.Type == shapes.TypeFile && e.Original != nil:
		o := e.Original
		st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("the original the host found is put back (%s)", attrs{o.Mode, o.UID, o.GID})
		st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: o}
		data, err := r.st.Original(o.Digest)
		if err != nil {
			st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
			st.intent, st.drop = nil, false
			return
		}
		st.change = func() error {
			r.touch(parentOf(p))
			return fsx.WriteFile(p, data, fsx.WriteOptions{Mode: o.Mode, UID: int(o.UID), GID: int(o.GID)})
		}
		st.readback = func() (*store.Entry, error) {
			eq, info, err := fsx.Equal(p, data)
			if err != nil {
				return nil, err
			}
			if !eq || attrsOf(info) != (attrs{o.Mode, o.UID, o.GID}) {
				return nil, fmt.Errorf("%s does not hold its original again", p)
			}
			return nil, nil
		}
	case e.Type == shapes.TypeDirectory && e.Created:
		// Decided when it runs, not when planned: everything the host put
		// in it is removed before it (newest first), in the same batch.
		st.line.Outcome, st.line.Detail = shapes.Removed, "the host created it; removed"
		st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
		st.change = func() error {
			r.touch(parentOf(p))
			err := fsx.RemoveDir(p)
			if errors.Is(err, fsx.ErrNotEmpty) {
				n, _ := fsx.CountEntries(p)
				keep := *e
				keep.Claims = nil
				st.record, st.drop, st.readback = &keep, false, nil
				st.line.Outcome = shapes.Kept
				st.line.Detail = fmt.Sprintf("the host created it, but it holds %d entries the host did not create; kept, and removed once it is empty", n)
				return nil
			}
			return err
		}
		st.readback = func() (*store.Entry, error) { return nil, expectAbsent(p) }
	case e.Type == shapes.TypeDirectory && e.Original != nil:
		o := e.Original
		a := attrs{o.Mode, o.UID, o.GID}
		st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("owner and mode given back as found (%s)", a)
		st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: o}
		seen, err := fsx.Lstat(p)
		if err != nil || seen.Kind != fsx.Dir {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s is not the directory the host changed (%v, a %s); not touched", p, err, seen.Kind), false
			return
		}
		st.change = func() error {
			r.touch(parentOf(p))
			return fsx.SetAttr(p, seen, o.Mode, int(o.UID), int(o.GID))
		}
		st.readback = func() (*store.Entry, error) {
			info, err := fsx.Lstat(p)
			if err != nil {
				return nil, err
			}
			if info.Kind != fsx.Dir || attrsOf(info) != a {
				return nil, fmt.Errorf("%s is a %s with %s, not as found (%s)", p, info.Kind, attrsOf(info), a)
			}
			return nil, nil
		}
	default:
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the host neither made it nor kept an original; left as it is"
	}
}

// keepRecovered decides whether a thing recovered from the control side's
// store copy stays (true: the line says why) rather than being removed:
// the copy is a backup, never a source, so only a file still holding
// exactly what the host wrote, or a directory the host made, is removed,
// and never inside the protected set.
func (r *run) keepRecovered(st *step, p string) bool {
	e := st.entry
	keep := func(why string) bool {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "recovered from the control side's copy of a lost store; "+why+"; left as it is"
		return true
	}
	if e.Type != shapes.TypeFile && e.Type != shapes.TypeDirectory {
		return keep("nothing proves a " + e.Type + " is still what the host made")
	}
	resolved, err := fsx.Resolver()(p)
	if p == "" || err != nil || shapes.ProtectedPath(p) != "" || shapes.ProtectedPath(resolved) != "" {
		return keep("it is in the host's protected set, or its path does not resolve")
	}
	if e.Type == shapes.TypeDirectory {
		return false // removed only when empty, as any directory the host made
	}
	if strings.Contains(e.Digest, ":") || len(e.Digest) != 64 {
		return keep("its content cannot be checked (sealed, with the key lost with the store)")
	}
	data, info, err := fsx.ReadRegular(p, maxOriginal)
	switch {
	case err != nil:
		return keep(fmt.Sprintf("it could not be read (%v)", err))
	case info.Kind == fsx.Absent:
		return keep("it is gone already")
	case digest(data) != e.Digest:
		return keep("it changed since the host wrote it")
	}
	return false
}

func expectAbsent(p string) error {
	info, err := fsx.Lstat(p)
	if err != nil {
		return err
	}
	if info.Kind != fsx.Absent {
		return fmt.Errorf("%s is still there (a %s)", p, info.Kind)
	}
	return nil
}

func firstClaim(e *store.Entry) store.Claim {
	if len(e.Claims) > 0 {
		return e.Claims[0]
	}
	return store.Claim{}
}

// pathOf returns the path of a "path:/x" target.
func pathOf(target string) string {
	_, p, _ := cutPrefix(target, "path:")
	return p
}

func cutPrefix(s, prefix string) (string, string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return prefix, s[len(prefix):], true
	}
	return "", s, false
}

func parentOf(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "/"
}
