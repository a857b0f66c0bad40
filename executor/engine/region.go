package engine

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/edit"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A region is a block of lines the mesh owns inside a file it does not
// (ADR 0102), between marker lines naming the resource (executor/edit).
// The file must be there — a region never creates one — and a regular
// file of one name; it is rewritten whole and atomically (a new file
// beside it, renamed over it: a kill leaves it before or after, never
// half written), with its owner, mode and SELinux label kept. Only the
// block is compared: drift inside it is repaired, changes outside it are
// the file's owner's. The block is the host's creation: undeclared, the
// block and its markers go and the rest of the file stays byte for byte
// (the newline the host added before an appended block too, when the file
// had none and the block is still its end). Found markers that do not
// pair up fail the step and the file is left to a person.
//
// A block already between markers of the resource's name when the mesh
// first declares it was written by someone else (a person, a script): it
// is found content like any other, kept whole in the store and put back
// byte for byte on undeclare, never taken for the mesh's own and removed.
// On an adopted node a region is held until its module is taken: the
// file is a found thing the mesh does not edit yet.

func init() {
	registerAlone(shapes.TypeRegion, (*run).region, (*run).removeRegion)
}

// maxEdited bounds a shared file the host writes into.
const maxEdited = 16 << 20

// editedFile reads a shared file for a region or keys: it must be there.
func (r *run) editedFile(path, what string) ([]byte, fsx.Info, []byte, error) {
	data, info, label, err := fsx.ReadLabeled(path, maxEdited)
	if err != nil {
		return nil, info, nil, err
	}
	if after, kind, ok := r.plannedAt(path, info.Kind); ok {
		// A plan: the file as an earlier removal of it leaves it, or as
		// an archive before it unpacks it.
		data, info.Kind = after, kind
		if en := r.unpacked[path]; en != nil && !en.dir {
			info.Mode = en.mode
		}
	}
	if info.Kind == fsx.Absent && r.opt.Plan && r.planBrings {
		return nil, info, nil, errFileComing
	}
	if info.Kind == fsx.Absent {
		return nil, info, nil, fmt.Errorf("%s does not exist; %s writes into a file that is there and never creates one (declare the file, or the package that brings it, before it)", path, what)
	}
	return data, info, label, nil
}

// errFileComing is a plan's word for a shared file not there yet, which a
// package planned before it may bring: the plan installs nothing, so it
// cannot read the file the apply will edit. (What an archive brings, a
// plan knows: unpacked.)
var errFileComing = errors.New("its file may come with a package declared before it, which a plan does not install")

// fileComing ends a plan's step whose file a package planned before may
// bring (errFileComing), as the apply would go on: applied,
// with what it then does, or held on an adopted node, its module not taken.
func (r *run) fileComing(st *step, path, then string, held bool, module string) {
	st.line.Outcome = shapes.Applied
	if held {
		st.line.Outcome, then = shapes.Held, "held as found until module "+module+" is taken"
	}
	st.line.Detail = fmt.Sprintf("%s is not there yet: it may come with a package declared before it, which a plan does not install; then %s", path, then)
	r.emit(st.line)
}

// plannedWhat is how a plan's diff names a file as an earlier removal of
// the same apply leaves it (removeReshaped), which is not the machine's yet.
const plannedWhat = " (as the removal before it leaves it)"

// editedDiff is a plan's diff of a shared file edited in place.
func (r *run) editedDiff(path string, found, out []byte) string {
	if _, ok := r.plannedFile[path]; ok {
		return contentDiffFrom(path, plannedWhat, found, true, out)
	}
	return contentDiff(path, found, true, out)
}

// rewrite replaces a shared file with data, its owner, mode and label as
// found, synced before the rename: the step records only after.
func rewrite(path string, data []byte, info fsx.Info, label []byte) error {
	return fsx.WriteFile(path, data, fsx.WriteOptions{Mode: info.Mode, UID: int(info.UID), GID: int(info.GID), Label: label, Sync: true})
}

// rewriteNow edits a shared file as it is when the change runs, with its
// owner, mode and label as they are then: a removal is decided with the
// whole apply's removals before the first of them runs, so two in one file
// (two regions undeclared at once, two keys resources) that each wrote
// the file as their decision read it would have the second put back what
// the first took out — a block or a key left that no record claims.
func rewriteNow(path string, edit func(data []byte) ([]byte, error)) error {
	data, info, label, err := fsx.ReadLabeled(path, maxEdited)
	if err != nil {
		return err
	}
	if info.Kind == fsx.Absent {
		return fmt.Errorf("%s is gone", path)
	}
	out, err := edit(data)
	if err != nil {
		return err
	}
	return rewrite(path, out, info, label)
}

// editedForRemoval reads the file of an undeclared region or keys, for
// its remover — in a plan, as an earlier removal leaves it (plannedAt);
// ok is false when that decided the step already (the target unreadable,
// the file gone: nothing to give back).
func (r *run) editedForRemoval(st *step) (path, name string, data []byte, ok bool) {
	e := st.entry
	st.drop = true
	_, path, name, ok = shapes.EditTarget(e.Target)
	if !ok {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%q is not the target of a region or keys", e.Target), false
		return "", "", nil, false
	}
	data, info, _, err := fsx.ReadLabeled(path, maxEdited)
	if after, kind, planned := r.plannedAt(path, info.Kind); planned && err == nil {
		data, info.Kind = after, kind
	}
	switch {
	case err != nil:
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return "", "", nil, false
	case info.Kind == fsx.Absent:
		st.line.Outcome, st.line.Detail = shapes.Forgotten, path+" is gone; nothing to give back"
		return "", "", nil, false
	}
	return path, name, data, true
}

// regionNewline is the Original of a region appended to a file that did
// not end in a newline: the host added one before the block, and gives it
// back with the block.
var regionNewline = &store.Original{Kind: "region", Absent: true}

func (r *run) region(st *step, rest int) {
	g := st.res.(*shapes.Region)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	want := edit.Normalise(g.Text())
	ed := edit.Region{Comment: g.CommentLeader(), Name: g.Key()}
	data, info, label, err := r.editedFile(g.Path, "a region")
	if errors.Is(err, errFileComing) {
		r.fileComing(st, g.Path, "the block written", r.holds(g.Module, e), g.Module)
		return
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	cur, found, err := ed.Current(data)
	if err != nil {
		r.fail(st, fmt.Errorf("%s: %w", g.Path, err), rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeRegion, Claims: withClaim(e, st.claim), Digest: digest([]byte(want)), Created: true}
	if e != nil {
		n.Order, n.Original, n.Created = e.Order, e.Original, e.Created
	}
	if r.holds(g.Module, e) {
		r.holdEdited(st, e, g.Key(), found && cur == want, fmt.Sprintf("%s found on an adopted node; held as found, no block written, until module %s is taken", g.Path, g.Module), rest)
		return
	}
	var keepFound []byte
	if found && (e == nil || e.Held) {
		// Markers of this name the mesh did not write: found content.
		if keepFound, _, err = ed.Whole(data); err != nil {
			r.fail(st, fmt.Errorf("%s: %w", g.Path, err), rest)
			return
		}
		n.Created, n.Original = false, &store.Original{Kind: "region", Digest: digest(keepFound)}
	}
	lines := strings.Count(want, "\n")
	if found && cur == want {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("the block in %s as declared (%s)", g.Path, countWord(lines, "line", "lines"))
		if keepFound != nil {
			st.line.Detail = fmt.Sprintf("a block of this name found in %s, as declared; held by the host from now (kept as found, given back as found)", g.Path)
			if !r.opt.Plan {
				if err := r.st.KeepOriginal(n.Original.Digest, keepFound); err != nil {
					r.fail(st, err, rest)
					return
				}
			}
		}
		r.asDeclared(st, e, n, keepFound != nil, rest)
		return
	}
	out, added, err := ed.Set(data, want)
	if err != nil {
		r.fail(st, fmt.Errorf("%s: %w", g.Path, err), rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	verb := map[bool]string{true: "rewritten", false: "added at the end"}[found]
	if r.opt.Plan {
		verb = "would be " + verb
	}
	st.line.Detail = fmt.Sprintf("the block %s in %s (%s); the rest of the file untouched", verb, g.Path, countWord(lines, "line", "lines"))
	if keepFound != nil {
		st.line.Detail = fmt.Sprintf("a block of this name found in %s, written before the mesh declared it: kept, to be given back as found; %s", g.Path, st.line.Detail)
	}
	if r.opt.Plan {
		if r.opt.OnDiff != nil {
			what := " (on the machine)"
			if _, ok := r.plannedFile[g.Path]; ok {
				what = plannedWhat
			}
			r.opt.OnDiff(g.Module, g.ID, contentDiffFrom(g.Path+" (the block "+g.Key()+")", what, []byte(cur), found, []byte(want)))
		}
		r.emit(st.line)
		return
	}
	in := store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeRegion, Created: n.Created, Original: n.Original}
	if keepFound != nil {
		if err := r.st.KeepOriginal(n.Original.Digest, keepFound); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	if added && n.Original == nil {
		in.Original, n.Original = regionNewline, regionNewline
	}
	if !r.intendNow(st, in, rest) {
		return
	}
	if err := rewrite(g.Path, out, info, label); err != nil {
		r.fail(st, err, rest)
		return
	}
	back, _, err := fsx.ReadRegular(g.Path, maxEdited)
	if err == nil {
		if cur, found, err = ed.Current(back); err == nil && (!found || cur != want) {
			err = errors.New("the block is not as written")
		}
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back %s: %w", g.Path, err), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// removeRegion takes an undeclared region's block and markers out of its
// file, and nothing else. A file gone, or a block gone, leaves nothing to
// do; markers that do not pair up fail the line and keep the record.
func (r *run) removeRegion(st *step) {
	e := st.entry
	path, name, data, ok := r.editedForRemoval(st)
	if !ok {
		return
	}
	ed := edit.Region{Name: name}
	if o := e.Original; o != nil && o.Kind == "region" && o.Digest != "" {
		r.restoreFoundRegion(st, path, data, ed)
		return
	}
	newline := e.Original != nil && e.Original.Kind == "region" && e.Original.Absent
	_, removed, err := ed.Remove(data, newline)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s: %v", path, err), false
		return
	}
	if !removed {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the block of "+name+" is no longer in "+path+"; nothing to remove"
		return
	}
	st.line.Outcome, st.line.Detail = shapes.Removed, fmt.Sprintf("the block and its markers taken out of %s; the rest of the file as it is", path)
	if r.opt.Plan {
		st.line.Detail = fmt.Sprintf("the block and its markers would be taken out of %s; the rest of the file as it is", path)
	}
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.rewrites = func(data []byte) ([]byte, error) {
		out, _, err := ed.Remove(data, newline)
		return out, err
	}
	st.change = func() error { return rewriteNow(path, st.rewrites) }
	if cur, _, err := ed.Current(data); err == nil && len(e.Digest) == 64 && digest([]byte(cur)) != e.Digest {
		// Edited by hand inside the block since the host wrote it: the
		// block is the host's to take out, but what the person wrote in
		// it is kept, as a file's edit is.
		sum, c, remove := digest([]byte(cur)), firstClaim(e), st.change
		st.line.Detail += fmt.Sprintf("; the block was edited by hand since the host wrote it (%s written, sha256:%s found): what it held is kept for %d days (mesh-executor owned says where)",
			shortDigest(e.Digest), sum[:12], store.SalvageKeep/(24*time.Hour))
		st.change = func() error {
			if err := r.st.Salvage(store.Salvaged{Path: path, Digest: sum, Written: e.Digest, Removed: clock.Now().UTC(), Module: c.Module, ID: c.ID}, []byte(cur)); err != nil {
				return err
			}
			if err := r.st.Sync(); err != nil {
				return err
			}
			return remove()
		}
	}
	st.readback = func() (*store.Entry, error) {
		back, _, err := fsx.ReadRegular(path, maxEdited)
		if err != nil {
			return nil, err
		}
		if _, found, err := ed.Find(back); err != nil || found {
			return nil, fmt.Errorf("the block of %s is still in %s", name, path)
		}
		return nil, nil
	}
}

// restoreFoundRegion puts back, on undeclare, the block that was between
// the resource's markers before the mesh declared it, byte for byte,
// markers included.
func (r *run) restoreFoundRegion(st *step, path string, data []byte, ed edit.Region) {
	e := st.entry
	fail := func(err error) {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s: %v", path, err), false
	}
	found, err := r.st.Original(e.Original.Digest)
	if err != nil {
		fail(err)
		return
	}
	cur, _, err := ed.Whole(data)
	if err != nil {
		fail(err)
		return
	}
	if bytes.Equal(cur, found) {
		st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("the block found in %s is as it was found; left", path)
		return
	}
	if _, err := ed.Replace(data, found); err != nil {
		fail(err)
		return
	}
	st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("the block found in %s before the mesh declared it is put back as found; the rest of the file as it is", path)
	if r.opt.Plan {
		st.line.Detail = fmt.Sprintf("the block found in %s would be put back as found", path)
	}
	st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: e.Original}
	st.rewrites = func(data []byte) ([]byte, error) { return ed.Replace(data, found) }
	st.change = func() error { return rewriteNow(path, st.rewrites) }
	st.readback = func() (*store.Entry, error) {
		back, _, err := fsx.ReadRegular(path, maxEdited)
		if err != nil {
			return nil, err
		}
		if cur, _, err := ed.Whole(back); err != nil || !bytes.Equal(cur, found) {
			return nil, fmt.Errorf("the block of %s in %s is not as it was found", ed.Name, path)
		}
		return nil, nil // the drop's record lets the kept block go
	}
}

// holdEdited holds a region or keys on an adopted node until its module is
// taken, like a found file: nothing written, the line says so, and the
// record says held (so its removal forgets, never gives anything back).
// as says whether the file already holds what is declared (the briefing's
// "as declared").
func (r *run) holdEdited(st *step, e *store.Entry, key string, as bool, detail string, rest int) {
	r.heldOK[key] = as
	st.line.Outcome, st.line.Detail = shapes.Held, detail
	if e == nil || !e.Claimed(st.claim) {
		h := &store.Entry{Target: st.target, Type: st.line.Type, Claims: withClaim(e, st.claim), Held: true}
		if e != nil {
			h.Order = e.Order
		}
		st.record = h
	}
	r.recordAndEmit(st, rest)
}
