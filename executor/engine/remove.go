package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// removeUndeclared undoes, by docs/declaration.md's table, what this source applied
// earlier and no longer declares, newest first. What another source still
// declares is only released by this one; what the host found is given back;
// what it held is forgotten, never removed.
func (r *run) removeUndeclared() {
	entries := r.st.Entries()
	slices.Reverse(entries)
	r.removing = map[string]bool{}
	r.shipped = nil // asked again: this apply may have installed a package since (shippedBy)
	// What this declaration declares, by target: a thing declared under
	// another name now (a resource renamed, or moved to another module)
	// is released, not removed. An apply has written the new name into
	// the thing's entry by now; a plan writes nothing, and reads it here,
	// so that it says what the apply does.
	here := make(map[string][]store.Claim, len(r.declared))
	for ct := range r.declared {
		here[ct.target] = append(here[ct.target], ct.claim)
	}
	var batch []*step
	// wholeUndone: the files a removal of this batch puts back or takes
	// away whole. Keys or a region of the same file undone after it are
	// decided on the file as that leaves it: on what it holds now, the
	// mesh's key the put-back original holds would be "gone already", and
	// stay. (Both undone in one apply: an edit's removal waited while a
	// source above held the file whole, aboveAcross.)
	wholeUndone := map[string]bool{}
	for _, e := range entries {
		if r.early[e.Target] {
			continue // undone before the apply (removeReshaped)
		}
		if _, p, _, edit := shapes.EditTarget(e.Target); edit && wholeUndone[p] && !r.opt.Plan {
			if r.execute(batch, 0); r.stopped {
				return
			}
			batch, wholeUndone = nil, map[string]bool{}
		}
		var mine, rest []store.Claim
		claims := claimsOf(e)
		for _, c := range claims {
			if c.Source == r.opt.Source && !r.declared[claimTarget{c, e.Target}] {
				mine = append(mine, c)
			} else {
				rest = append(rest, c)
			}
		}
		for _, c := range here[e.Target] {
			// Not a resource of another type at the same path (a
			// directory where a source above holds a file: yields).
			if len(mine) > 0 && !slices.Contains(rest, c) && r.typeOf(c) == e.Type {
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
		if len(mine) > 0 && r.typeOf(mine[0]) != "" {
			// Its resource is declared still, at another target (a file
			// moved): the line, named as the one that declares the new
			// target, says which it undoes.
			st.line.Detail = strings.TrimPrefix(e.Target, "path:") + ": " + st.line.Detail
		}
		if p, ok := strings.CutPrefix(e.Target, "path:"); ok && e.Type == shapes.TypeFile && st.change != nil {
			wholeUndone[p] = true
			if r.opt.Plan {
				r.planAfter(st, p, true, "")
			}
		}
		batch = append(batch, st)
	}
	r.execute(batch, 0)
}

// typeOf is the type of the resource of this declaration claim names.
func (r *run) typeOf(c store.Claim) string {
	if r.claimTypes == nil {
		r.claimTypes = make(map[store.Claim]string, len(r.d.Resources))
		for _, res := range r.d.Resources {
			h := res.Head()
			r.claimTypes[store.Claim{Source: r.opt.Source, Module: h.Module, ID: h.ID}] = h.Type
		}
	}
	return r.claimTypes[c]
}

// checkReshaped refuses a region or keys in a file the mesh made whole
// for a resource this declaration no longer declares: undeclared, the
// file is removed first (the mesh takes back what it made; removeReshaped),
// and a region or keys edits only a file that is there. Refused, nothing
// is removed to fail on: a sshd_config the mesh wrote stays until a
// declaration says what becomes of it.
func (r *run) checkReshaped() error {
	for _, res := range r.d.Resources {
		_, p, _, edits := shapes.EditTarget(shapes.Target(res))
		if !edits {
			continue
		}
		what := "keys are set"
		if res.Head().Type == shapes.TypeRegion {
			what = "a region is written"
		}
		for _, ae := range r.st.Entries() {
			// Unpacked by an archive of this source alone that the
			// declaration no longer declares (by its destination: one
			// renamed is the same archive): the same, the file going
			// with it.
			if ae.Type != shapes.TypeArchive || !slices.Contains(ae.Paths, p) || r.declaresTarget(ae.Target) || !r.thisSourceOnly(ae) {
				continue
			}
			return &Refusal{fmt.Sprintf("resource %s: %s was unpacked by the mesh's archive %s, which this declaration no longer declares: undeclared, what it wrote is removed (the mesh takes back what it made), and %s only in a file that is there. Declare the archive again, or nothing in the file", res.Head().Key(), p, joinClaims(ae.Claims), what)}
		}
		e := r.st.Get("path:" + p)
		if e == nil || e.Type != shapes.TypeFile || !e.Created || slices.ContainsFunc(e.Claims, func(c store.Claim) bool { return c.Source != r.opt.Source }) {
			continue
		}
		return &Refusal{fmt.Sprintf("resource %s: %s was made whole by the mesh for %s, which this declaration no longer declares: undeclared, it is removed first (the mesh takes back what it made), and %s only in a file that is there. Declare the file whole again, or nothing in it", res.Head().Key(), p, joinClaims(e.Claims), what)}
	}
	return nil
}

// declaresTarget says whether a resource of this declaration has target t.
func (r *run) declaresTarget(t string) bool {
	return slices.ContainsFunc(r.d.Resources, func(res shapes.Resource) bool { return shapes.Target(res) == t })
}

// removeReshaped undoes, before anything is applied, what this source
// made of a file in another shape than this declaration gives it: a file
// declared whole before and edited now (a region, keys), or edited before
// and declared whole now. Undone last, with the other removals, the old
// shape's give back would run over the new one's work: a file the mesh
// made, removed as "edited by hand" because keys were just set in it; a
// found file's original put back over the keys just set; a whole file's
// found content taken with the mesh's own keys or block in it, to be put
// back one day as the person's. Undone first, the new shape starts from
// the file as the person had it. A thing another source still declares is
// only released, at the end, as ever.
//
// So is a file's edit of the other shape (keys before, a region now, or
// the other way): the new one reads the file as the person had it.
//
// So are a directory the mesh made where a file is declared now, and a
// file it wrote where a directory is: undone last, the new one's step
// found the old one in its way and failed, the apply stopped before its
// removals, and so at every apply. A found directory, or a found file put
// back, is the person's: the new one's step fails on it, as it says.
func (r *run) removeReshaped() {
	whole, edited, dirs := map[string]bool{}, map[string]bool{}, false
	editedAs := map[string]string{}                    // a file edited now → how (region, keys: one shape a file)
	now := make(map[string]string, len(r.d.Resources)) // target → the type declared there
	for _, res := range r.d.Resources {
		t := shapes.Target(res)
		if f, ok := res.(*shapes.File); ok {
			whole[f.Path] = true
		} else if _, p, _, ok := shapes.EditTarget(t); ok {
			edited[p] = true
			editedAs[p] = res.Head().Type
		}
		now[t] = res.Head().Type
		dirs = dirs || res.Head().Type == shapes.TypeDirectory
	}
	if len(whole) == 0 && len(edited) == 0 && !dirs {
		return
	}
	entries := r.st.Entries()
	slices.Reverse(entries)
	// A path declared as a directory now and recorded as a file, or the
	// other way (the one target of both): under the same resource's name
	// too.
	retypedAt := func(e *store.Entry) bool {
		return strings.HasPrefix(e.Target, "path:") && now[e.Target] != "" && now[e.Target] != e.Type &&
			(e.Type == shapes.TypeFile && now[e.Target] == shapes.TypeDirectory || e.Type == shapes.TypeDirectory && e.Created && now[e.Target] == shapes.TypeFile)
	}
	// A directory of the host's undone first is emptied first of what the
	// host made in it that nothing declares now (it comes before it here,
	// the entries newest first): left for the removals after the apply,
	// it would keep the directory, and the file declared at its path fail
	// at every apply.
	var undone []string
	for _, e := range entries {
		if e.Type == shapes.TypeDirectory && retypedAt(e) && r.thisSourceOnly(e) {
			undone = append(undone, strings.TrimPrefix(e.Target, "path:")+"/")
		}
	}
	inUndone := func(p string) bool {
		return slices.ContainsFunc(undone, func(d string) bool { return strings.HasPrefix(p, d) })
	}
	var batch []*step
	touched := map[*step]string{} // the file each step undoes a shape of
	for _, e := range entries {
		p, isPath := strings.CutPrefix(e.Target, "path:")
		_, editPath, _, isEdit := shapes.EditTarget(e.Target)
		retyped := retypedAt(e)
		// Edited as keys before and as a region now, or the other way:
		// the old edit's lines, given back last, would be the same
		// settings twice in the file the new one reads.
		reshaped := isPath && e.Type == shapes.TypeFile && edited[p] || isEdit && (whole[editPath] || edited[editPath] && editedAs[editPath] != e.Type)
		switch {
		case retyped && r.thisSourceOnly(e):
		case isPath && now[e.Target] == "" && inUndone(p) && r.thisSourceOnly(e):
		case !reshaped || now[e.Target] != "" || !r.onlyMine(e):
			continue
		}
		st := r.removeFirst(e, p, isPath, editPath)
		if !isPath {
			p = editPath
		}
		touched[st] = p
		batch = append(batch, st)
	}
	r.execute(batch, len(r.d.Resources))
	// What it changed, it changed in a file a resource of the declaration
	// holds now: restart_on naming that resource restarts, though the
	// resource's own line may find nothing more to do (the found original
	// put back with the keys it sets already in it).
	for _, st := range batch {
		if !st.line.Outcome.Changes() {
			continue
		}
		for _, res := range r.d.Resources {
			if pathOfResource(res) == touched[st] {
				r.changed[res.Head().Key()] = true
			}
		}
	}
}

// pathOfResource is the file or directory a resource writes, whole or in
// place ("" for none).
func pathOfResource(res shapes.Resource) string {
	t := shapes.Target(res)
	if p, ok := strings.CutPrefix(t, "path:"); ok {
		return p
	}
	if _, p, _, ok := shapes.EditTarget(t); ok {
		return p
	}
	return ""
}

// claimsOf is who claims e: a stub's only claim is its pending intent's.
func claimsOf(e *store.Entry) []store.Claim {
	if e.Stub && e.Pending != nil {
		return []store.Claim{e.Pending.Claim}
	}
	return e.Claims
}

// onlyMine reports whether e is claimed, and by this source alone, under
// no claim this declaration declares: undone whole when it is undone.
func (r *run) onlyMine(e *store.Entry) bool {
	claims := claimsOf(e)
	return len(claims) > 0 && !slices.ContainsFunc(claims, func(c store.Claim) bool {
		return c.Source != r.opt.Source || r.declared[claimTarget{c, e.Target}]
	})
}

// thisSourceOnly reports whether e is claimed, by this source alone.
func (r *run) thisSourceOnly(e *store.Entry) bool {
	claims := claimsOf(e)
	return len(claims) > 0 && !slices.ContainsFunc(claims, func(c store.Claim) bool { return c.Source != r.opt.Source })
}

// removeFirst decides the removal of e ahead of the others
// (removeReshaped, clearWay), marks it done early so removeUndeclared
// passes over it, and tells a plan what it leaves at its file.
func (r *run) removeFirst(e *store.Entry, p string, isPath bool, editPath string) *step {
	claims := claimsOf(e)
	st := &step{target: e.Target, entry: r.settle(e, store.Claim{})}
	st.line = shapes.Line{Type: e.Type, Module: claims[0].Module, ID: claims[0].ID}
	if r.removing == nil {
		r.removing = map[string]bool{}
	}
	r.planRemoval(st)
	r.early[e.Target] = true
	if r.opt.Plan && st.line.Outcome != shapes.Failed {
		r.planAfter(st, p, isPath, editPath)
		if st.drop {
			// The store forgets the target: a step of another type at
			// it (a directory the mesh made, a file declared there now)
			// starts with no record of it, as in the apply.
			r.plannedGone[e.Target] = true
		}
	}
	return st
}

// plannedAt is, in a plan, what an earlier removal leaves at p (ok false
// outside a plan, or where none planned one), and kind as the machine has
// it then: nothing (nil: taken away), or a file (put back where a person
// had deleted it).
func (r *run) plannedAt(p string, kind fsx.Kind) (after []byte, _ fsx.Kind, ok bool) {
	if !r.opt.Plan {
		return nil, kind, false
	}
	after, ok = r.plannedFile[p]
	if en := r.unpacked[p]; en != nil && (!ok || after == nil) {
		// What an archive before it unpacks there (a plan unpacks
		// nothing): the apply's later steps find it made.
		if en.dir {
			return nil, fsx.Dir, true
		}
		return en.data, fsx.Regular, true
	}
	switch {
	case !ok:
		return nil, kind, false
	case after == nil:
		return nil, fsx.Absent, true
	case kind == fsx.Absent:
		return after, fsx.Regular, true
	}
	return after, kind, true
}

// planAfter tells, in a plan, the step of the file's new shape what an
// early removal leaves in it (a plan changes nothing to read back): a
// whole file's found original, or nothing (gone); or, under a region's or
// keys' removal, the file as their give back rewrites it.
func (r *run) planAfter(st *step, p string, isPath bool, editPath string) {
	if st.change == nil || st.line.Outcome == shapes.Forgotten {
		// It changes nothing at p (held, forgotten — one that keeps the
		// original it cannot give back changes the store alone): the
		// file as it is.
		return
	}
	if isPath {
		var after []byte // nil: gone
		if o := st.entry.Original; !st.entry.Created && o != nil {
			after, _ = r.st.Original(o.Digest)
		}
		r.plannedFile[p] = after
		return
	}
	if st.rewrites == nil {
		return // nothing to give back: the file as it is
	}
	data, ok := r.plannedFile[editPath]
	if !ok {
		var err error
		if data, _, err = fsx.ReadRegular(editPath, maxEdited); err != nil {
			return
		}
	}
	if out, err := st.rewrites(data); err == nil {
		r.plannedFile[editPath] = out
	}
}

// planRemoval decides how to undo one entry nobody declares any more.
func (r *run) planRemoval(st *step) {
	e := st.entry
	p := pathOf(e.Target)
	if above, how := r.aboveAcross(e.Target, e.Type); len(above) > 0 && !e.Held {
		// Given back now, it would change what a source above has in the
		// file; kept, with what it found, and tried again by every apply.
		st.record = e
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("%s by %s, which takes precedence: given back once that source no longer declares it", how, joinClaims(above))
		return
	}
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
	case (e.Type == shapes.TypeFile || e.Type == shapes.TypeDirectory) && e.Created && r.shippedBy(p) != "":
		// A package installed since ships it now: its file, which the
		// package manager's checks and upgrades count on (a conffile
		// removed is one dpkg never brings back). Left to it.
		st.line.Outcome = shapes.Forgotten
		st.line.Detail = fmt.Sprintf("the host created it; package %s ships it now (installed since): left to the package as it is", r.shippedBy(p))
	case e.Type == shapes.TypeFile && e.Created:
		r.planCreatedFileRemoval(st, p)
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
		if _, _, behind, _ := pathNow(p); behind {
			keptBehindLink(r, st, p, "the host changed it", "its original given back")
			return
		}
		if gone := r.nowhereToGiveBack(p); gone != "" {
			// Put back, it would write over what someone put there, or
			// make a directory the host did not make: the original is
			// kept as an edit of a person's would be, for them to take.
			c := firstClaim(e)
			st.intent, st.readback = nil, nil
			st.line.Outcome = shapes.Forgotten
			st.line.Detail = fmt.Sprintf("%s; the original the host found is not put back: it is kept for %d days (mesh-executor owned says where)", gone, store.SalvageKeep/(24*time.Hour))
			st.change = func() error {
				return r.st.Salvage(store.Salvaged{Path: p, Digest: o.Digest, Written: e.Digest, Removed: clock.Now().UTC(), Module: c.Module, ID: c.ID}, data)
			}
			return
		}
		restore := func() error {
			r.touch(parentOf(p))
			return fsx.WriteFile(p, data, fsx.WriteOptions{Mode: o.Mode, UID: int(o.UID), GID: int(o.GID)})
		}
		st.change = restore
		if e.Digest != "" { // "": an interrupted write, what the host wrote is not known
			if content, info, err := fsx.ReadRegular(p, maxOriginal); err != nil && info.Kind == fsx.Regular && info.Size > maxOriginal {
				// More than the host ever writes, so edited since; and
				// more than it keeps a copy of: put back, the original
				// would throw the edit away unsaid.
				st.intent, st.change, st.readback, st.drop = nil, nil, nil, false
				st.record = e
				st.line.Outcome = shapes.Kept
				st.line.Detail = fmt.Sprintf("the host changed it, and it was edited by hand since: it is larger than the host keeps a copy of (%d MiB), so its original is not put back over it; kept, and still tracked until a person has looked", maxOriginal>>20)
				return
			} else if err == nil && info.Kind == fsx.Regular {
				if said, sealed := r.sealedDiffers(e, content); sealed {
					if said != "" {
						st.line.Detail += "; " + said
					}
				} else if edited, ok := r.salvageEdited(st, p, content, restore); ok {
					st.line.Detail += fmt.Sprintf("; it was edited by hand since %s: what it held is kept for %d days (mesh-executor owned says where)", edited, store.SalvageKeep/(24*time.Hour))
				}
			}
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
		r.planCreatedDirRemoval(st, p)
	case e.Type == shapes.TypeDirectory && e.Original != nil:
		o := e.Original
		a := attrs{o.Mode, o.UID, o.GID}
		st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("owner and mode given back as found (%s)", a)
		st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: o}
		seen, err := fsx.Lstat(p)
		switch {
		case err != nil:
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s: %v; not touched", p, err), false
			return
		case seen.Kind != fsx.Dir:
			// Taken away or replaced by someone since: theirs now, and
			// nothing of the host's is left to give back. Kept as failed,
			// the record would stop every later apply's removals here.
			st.intent, st.change = nil, nil
			st.line.Outcome, st.line.Detail = shapes.Forgotten, fmt.Sprintf("the directory the host found here is gone (a %s now); nothing to give back, left as it is", seen.Kind)
			if seen.Kind == fsx.Absent {
				st.line.Detail = "the directory the host found here was removed by something else; nothing to give back"
			}
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

// nowhereToGiveBack says why a found file's original cannot be put back at
// p ("" when it can): its directory removed by something else, or, at p,
// something other than a file — a link, a directory — put there since.
func (r *run) nowhereToGiveBack(p string) string {
	if after, kind, planned := r.plannedAt(p, fsx.Absent); planned && (after != nil || kind != fsx.Absent) {
		if kind != fsx.Regular {
			return fmt.Sprintf("a %s is there now, which the host did not make", kind)
		}
		return ""
	}
	seen, err := fsx.Lstat(p)
	switch {
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Sprintf("its directory %s is not a directory now (replaced since)", parentOf(p))
	case err != nil:
		return "" // a passing error: the restore says it, and is tried again
	case seen.Kind == fsx.Absent:
		parent := parentOf(p)
		if r.plannedDirAt(parent) {
			return ""
		}
		if pi, err := fsx.Lstat(parent); err != nil || pi.Kind != fsx.Dir {
			return fmt.Sprintf("its directory %s was removed by something else", parent)
		}
	case seen.Kind != fsx.Regular:
		return fmt.Sprintf("a %s is there now, which the host did not make", seen.Kind)
	}
	return ""
}

// keptBehindLink makes st, the undoing of what the host did at p (did:
// "the host created it"), one that waits: p is reached through a link now,
// which the host never follows, so nothing is done and the record is
// kept, its line saying what is done (then) once the link is gone — not a
// failure, which would fail every later apply for as long as the link is
// there.
func keptBehindLink(r *run, st *step, p, did, then string) {
	delete(r.removing, p)
	st.intent, st.change, st.readback, st.drop = nil, nil, nil, false
	st.record = st.entry
	st.line.Outcome = shapes.Kept
	st.line.Detail = fmt.Sprintf("%s; a link is on its way now, which the host never follows: kept, and %s once the link is gone", did, then)
}

// plannedDirAt says, in a plan, whether a directory resource or an archive
// planned before makes p (a plan makes nothing; the apply's later steps
// find it made).
func (r *run) plannedDirAt(p string) bool {
	en := r.unpacked[p]
	return r.opt.Plan && (r.declaredDirs[p] || en != nil && en.dir)
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

// shippedBy is the package that ships p now, by the package manager's
// database, "" for none (or no package manager to ask). Asked only of a
// host that has installed a package itself (what the host declares is
// what brings a package over its own files; the package manager's
// database is slow to ask, some 100 ms a question), once an apply, for
// every file and directory the host created that this declaration does
// not declare: the answer for all of them at once is almost always
// none, and only then is each looked up alone.
func (r *run) shippedBy(p string) string {
	if r.shipped == nil {
		r.shipped = map[string]string{}
		declared := map[string]bool{}
		for ct := range r.declared {
			declared[ct.target] = true
		}
		var paths []string
		installed := false
		for _, e := range r.st.Entries() {
			switch {
			case e.Type == shapes.TypePackage && (e.Created || e.Pending != nil && e.Pending.Created) && !e.Held:
				installed = true
			case (e.Type == shapes.TypeFile || e.Type == shapes.TypeDirectory) && e.Created && !declared[e.Target] && r.thisSourceOnly(e):
				paths = append(paths, pathOf(e.Target))
			}
		}
		if !installed || len(paths) == 0 {
			return ""
		}
		mgr, err := r.packages()
		if err != nil {
			return ""
		}
		if owners, err := mgr.owners(r.ctx, paths); err != nil || len(owners) == 0 {
			return ""
		}
		for _, x := range paths {
			if owners, err := mgr.owners(r.ctx, []string{x}); err == nil && len(owners) > 0 {
				r.shipped[x] = strings.Join(owners, ", ")
			}
		}
	}
	return r.shipped[p]
}

// planCreatedFileRemoval removes a file the host created. One edited by
// hand since (its content is not what the host wrote) is removed too — the
// host made it — but not without a word: the line says so, and its content
// is kept (store.Salvage) for a person to get back.
func (r *run) planCreatedFileRemoval(st *step, p string) {
	e := st.entry
	r.removing[p] = true
	st.line.Outcome, st.line.Detail = shapes.Removed, "the host created it; removed"
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.readback = func() (*store.Entry, error) { return nil, expectAbsent(p) }
	remove := func() error {
		r.touch(parentOf(p))
		return fsx.Remove(p)
	}
	st.change = remove
	content, info, err := fsx.ReadRegular(p, maxOriginal)
	switch {
	case err != nil && info.Kind != fsx.Absent && info.Kind != fsx.Regular:
		// Not the file the host made, nor nothing: a link, a directory,
		// put there by something else since. Its file is gone; what is
		// there now is not the host's, and is left as it is (failed, the
		// record would stop every later apply's removals here).
		delete(r.removing, p)
		st.intent, st.change, st.readback = nil, nil, nil
		st.line.Outcome = shapes.Forgotten
		st.line.Detail = fmt.Sprintf("the host created it; a %s is there now, which the host did not make: left as it is", info.Kind)
		return
	case errors.Is(err, unix.ENOTDIR):
		// Its directory replaced by a file since: the host's file went
		// with the directory, and nothing of it is left to remove.
		delete(r.removing, p)
		st.intent, st.change, st.readback = nil, nil, nil
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the host created it; its directory is not a directory now (replaced since): nothing of the host's is left there"
		return
	case errors.Is(err, fsx.ErrSymlink):
		// A link on its way (a directory replaced by one): the file the
		// host made may be where the directory went. Never followed;
		// kept, and removed once the link is gone. Any other error (a
		// passing one: no descriptor left, an I/O error) keeps the
		// record too: the removal says it, and the next apply tries again.
		keptBehindLink(r, st, p, "the host created it", "removed")
		return
	case info.Kind == fsx.Absent:
		st.line.Detail = "the host created it; it was deleted already"
		return
	case err != nil && info.Kind == fsx.Regular:
		// Too large to keep a copy of, or unreadable: not removed on a
		// guess that it is still the host's.
		delete(r.removing, p)
		st.intent, st.change, st.readback, st.drop = nil, nil, nil, false
		st.record = e
		st.line.Outcome = shapes.Kept
		st.line.Detail = fmt.Sprintf("the host created it, but cannot tell whether it was edited since (%v); kept, and still tracked", err)
		return
	case err != nil:
		return // not a regular file: Remove says what it is
	}
	if said, sealed := r.sealedDiffers(e, content); sealed {
		if said != "" {
			st.line.Detail = "the host created it; removed: " + said
		}
		return
	}
	if edited, ok := r.salvageEdited(st, p, content, remove); ok {
		st.line.Detail = fmt.Sprintf("the host created it, and it was edited by hand since %s; removed, and its content kept for %d days (mesh-executor owned says where)",
			edited, store.SalvageKeep/(24*time.Hour))
	}
}

// sealedDiffers says, of an entry of sealed content (its digest keyed:
// sealed is false for any other), what its line says when the file holds
// other content than the host wrote, and "" when it does not. Sealed
// content is written to its file alone, so none of it is kept
// (store.Salvage), and what is found there is never named by a plain
// digest: a line goes up the link, and the content found may be the
// secret, edited. Nor can the host tell an edit from a sealing key it no
// longer holds (enrolled anew since: the keyed digest is another), and it
// says so rather than claim an edit.
func (r *run) sealedDiffers(e *store.Entry, content []byte) (said string, sealed bool) {
	if !strings.HasPrefix(e.Digest, "hmac-sha256:") {
		return "", false
	}
	found, known := r.writtenDigest(e, content)
	if !known || found == e.Digest {
		return "", true // the same, or not to be told (no digest key here): nothing claimed
	}
	return "it holds other content than the host wrote (edited by hand since), or content sealed under a key this host no longer holds (enrolled anew since); sealed content is never copied, so none of it is kept", true
}

// salvageEdited makes st's change keep content, what the file at p holds,
// before it runs then, when it was edited by hand since the host last
// wrote it: removing a file the host made (planCreatedFileRemoval), or
// putting a found file's original back over it, never throws a person's
// edit away without a word. ok is whether it was; edited says how, for
// the line ("(X written, Y found)").
func (r *run) salvageEdited(st *step, p string, content []byte, then func() error) (edited string, ok bool) {
	e := st.entry
	found, known := r.writtenDigest(e, content)
	if !known || found == e.Digest {
		return "", false
	}
	sum := digest(content)
	c := firstClaim(e)
	st.change = func() error {
		if err := r.st.Salvage(store.Salvaged{Path: p, Digest: sum, Written: e.Digest, Removed: clock.Now().UTC(), Module: c.Module, ID: c.ID}, content); err != nil {
			return err
		}
		if err := r.st.Sync(); err != nil {
			return err
		}
		return then()
	}
	return fmt.Sprintf("(%s written, sha256:%s found)", shortDigest(e.Digest), sum[:12]), true
}

// writtenDigest is content's digest as the entry records what the host
// wrote: plain, or keyed for sealed content (false when this host cannot
// compute it).
func (r *run) writtenDigest(e *store.Entry, content []byte) (string, bool) {
	if strings.HasPrefix(e.Digest, "hmac-sha256:") {
		if r.opt.Unseal == nil || len(r.opt.Unseal.DigestKey) == 0 {
			return "", false
		}
		m := hmac.New(sha256.New, r.opt.Unseal.DigestKey)
		m.Write(content)
		return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)), true
	}
	return digest(content), true
}

// shortDigest names a recorded digest in a line: its kind and first
// twelve digits.
func shortDigest(d string) string {
	kind, hexs, ok := strings.Cut(d, ":")
	if !ok {
		kind, hexs = "sha256", d
	}
	if len(hexs) > 12 {
		hexs = hexs[:12]
	}
	return kind + ":" + hexs
}

// planCreatedDirRemoval removes a directory the host created when it will
// be empty once what the host removes in this same apply is gone — decided
// here, where plan and apply both decide, not when the removal runs. One
// that holds something else is kept and still tracked (its line names it,
// and every apply tries again), and removed once it is empty.
func (r *run) planCreatedDirRemoval(st *step, p string) {
	e := st.entry
	switch info, err := fsx.Lstat(p); {
	case errors.Is(err, unix.ENOTDIR):
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the host created it; the directory above it is not a directory now (replaced since): nothing of the host's is left there"
		return
	case err == nil && info.Kind != fsx.Dir && info.Kind != fsx.Absent:
		// Replaced since by what the host did not make (a link, a file):
		// its directory is gone, what is there is left as it is —
		// failed, the record would fail every apply after.
		st.line.Outcome, st.line.Detail = shapes.Forgotten, fmt.Sprintf("the host created it; a %s is there now, which the host did not make: left as it is", info.Kind)
		return
	case errors.Is(err, fsx.ErrSymlink):
		keptBehindLink(r, st, p, "the host created it", "removed (once empty)")
		return
	}
	left, err := r.leftIn(p)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	if len(left) > 0 {
		st.drop, st.record = false, e
		st.line.Outcome = shapes.Kept
		st.line.Detail = "the host created it, but it holds " + r.leftSaid(p, left) + "; kept, and removed once it is empty"
		return
	}
	r.removing[p] = true
	st.line.Outcome, st.line.Detail = shapes.Removed, "the host created it; removed"
	if info, err := fsx.Lstat(p); err == nil && info.Kind == fsx.Absent {
		// As a file's: said as it is, and nothing to do but forget it.
		st.line.Detail = "the host created it; it was deleted already"
		return
	}
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.change = func() error {
		r.touch(parentOf(p))
		err := fsx.RemoveDir(p)
		if errors.Is(err, fsx.ErrNotEmpty) {
			// Something arrived between the decision and now.
			n, _ := fsx.CountEntries(p)
			st.record, st.drop, st.readback = e, false, nil
			st.line.Outcome = shapes.Kept
			st.line.Detail = fmt.Sprintf("the host created it, but it holds %d entries the host did not create (they arrived during the apply); kept, and removed once it is empty", n)
			return nil
		}
		return err
	}
	st.readback = func() (*store.Entry, error) { return nil, expectAbsent(p) }
}

// leftSaid says what directory p still holds, left: what the host did
// not create, what a declaration declares still (this one, or another
// source's), and the host's own directories kept in turn — the host's own
// said as such, not as another's. Read alike by a plan and an apply: from the
// declaration and from entries recorded before either.
func (r *run) leftSaid(p string, left []string) string {
	declared := map[string]bool{}
	for ct := range r.declared {
		declared[ct.target] = true
	}
	var others, still, kept []string
	for _, name := range left {
		t := "path:" + path.Join(p, name)
		switch e := r.st.Get(t); {
		case declared[t] || e != nil && otherSource(e, r.opt.Source) || len(r.archivedAt(path.Join(p, name))) > 0:
			// Declared, by a resource or as what an archive holds.
			still = append(still, name)
		case e != nil && e.Created && e.Type == shapes.TypeDirectory:
			kept = append(kept, name)
		default:
			others = append(others, name)
		}
	}
	var parts []string
	if len(others) > 0 {
		parts = append(parts, fmt.Sprintf("%s the host did not create (%s)", countWord(len(others), "entry", "entries"), listSome(others, 3)))
	}
	if len(still) > 0 {
		parts = append(parts, fmt.Sprintf("%s declared still (%s)", countWord(len(still), "entry", "entries"), listSome(still, 3)))
	}
	if len(kept) > 0 {
		parts = append(parts, fmt.Sprintf("%s of the host's kept in turn (%s)", countWord(len(kept), "directory", "directories"), listSome(kept, 3)))
	}
	return strings.Join(parts, " and ")
}

// otherSource says whether another source than src claims e: declared
// still, by it.
func otherSource(e *store.Entry, src store.Source) bool {
	for _, c := range e.Claims {
		if c.Source != src {
			return true
		}
	}
	return false
}

// leftIn lists what directory p will still hold once this apply's removals
// planned so far (r.removing) are done; nothing for one already gone.
func (r *run) leftIn(p string) ([]string, error) {
	names, err := fsx.DirNames(p)
	if err != nil {
		info, lerr := fsx.Lstat(p)
		if lerr != nil || info.Kind != fsx.Absent {
			return nil, err
		}
		names = nil
	}
	// What this declaration's own steps put there is there once the apply
	// has run: a plan, which made none of it, counts it as the apply does.
	if r.declaredKids == nil {
		// From the declaration itself: a removal decided before the
		// apply (removeFirst) comes before its steps are declared.
		r.declaredKids = map[string][]string{}
		for _, res := range r.d.Resources {
			if dp, ok := strings.CutPrefix(shapes.Target(res), "path:"); ok {
				r.declaredKids[path.Dir(dp)] = append(r.declaredKids[path.Dir(dp)], path.Base(dp))
			}
		}
	}
	// And what an archive planned before would unpack there (a plan).
	for full := range r.unpacked {
		if path.Dir(full) == p {
			names = append(names, path.Base(full))
		}
	}
	seen := map[string]bool{}
	var left []string
	for _, n := range append(names, r.declaredKids[p]...) {
		if _, kind, planned := r.plannedAt(path.Join(p, n), fsx.Regular); planned && kind == fsx.Absent {
			continue // a plan: an earlier step takes it away (an archive's older version's file)
		}
		if !seen[n] && !r.removing[path.Join(p, n)] && !r.leftovers[path.Join(p, n)] {
			seen[n] = true
			left = append(left, n)
		}
	}
	sort.Strings(left)
	return left, nil
}

// listSome names up to n items, and how many more there are.
func listSome(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
