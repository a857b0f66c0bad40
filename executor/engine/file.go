package engine

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// maxOriginal bounds a found file the host will keep a copy of.
const maxOriginal = 64 << 20

// Defaults for a file or directory the host creates without a declared
// mode or owner. A thing the host finds keeps its own.
const (
	defaultFileMode = 0o644
	defaultDirMode  = 0o755
)

// attrs is the owner and mode the host will leave on a thing.
type attrs struct {
	mode     uint32
	uid, gid uint32
}

func (a attrs) String() string {
	return fmt.Sprintf("%s %d:%d", modeString(a.mode), a.uid, a.gid)
}

// wantAttrs is what a declaration asks, filled from what is found (or the
// defaults) where it asks nothing.
func (r *run) wantAttrs(key, modeSpec string, found fsx.Info, exists bool, defMode uint32) (attrs, error) {
	a := attrs{mode: defMode}
	if exists {
		a = attrs{mode: found.Mode, uid: found.UID, gid: found.GID}
	}
	if m, ok := shapes.ParseMode(modeSpec); ok {
		a.mode = m
	}
	if spec := r.ownerComing[key]; spec != "" {
		o, err := newOwners(r.opt.getent).resolve(spec)
		switch {
		case err != nil && r.opt.Plan:
			return a, errOwnerComing
		case err != nil:
			return a, fmt.Errorf("owner %s: %w (its user was to be made by this declaration, before it)", spec, err)
		}
		r.owners[key], r.ownerComing[key] = o, ""
	}
	if o, ok := r.owners[key]; ok {
		a.uid, a.gid = uint32(o.uid), uint32(o.gid)
	}
	return a, nil
}

// errOwnerComing is a plan's word for an owner whose user a user resource
// of the declaration makes: the plan makes none, so it cannot say its ids.
var errOwnerComing = errors.New("its owner's user comes with this declaration, " + planDoesNotApply)

// planDoesNotApply ends a plan's line that rests on what the same
// declaration brings (a user, a unit): the plan says it as the apply would
// find it, having applied nothing.
const planDoesNotApply = "which a plan does not apply"

// ownerComingLine is how a plan says a file or directory whose owner's
// user the declaration makes: applied, with the owner, then.
func ownerComingLine(st *step, what, owner string) {
	st.line.Outcome = shapes.Applied
	st.line.Detail = fmt.Sprintf("its owner %s comes with this declaration's user, which a plan does not make; then %s as declared", owner, what)
}

func attrsOf(i fsx.Info) attrs { return attrs{mode: i.Mode, uid: i.UID, gid: i.GID} }

// Unsealer is how the engine opens sealed file content without holding a
// key: the caller binds the node's sealing key, and the node and sequence
// of the declaration being applied (wire.OpenSealed), so content sealed for
// another file, declaration or node does not open.
type Unsealer struct {
	// Open returns the plaintext of file module.id's sealed content, or
	// why it cannot be opened. Its error never carries content.
	Open func(module, id, sealed string) ([]byte, error)
	// DigestKey keys the digest the store records of opened content
	// (Entry.Digest). A plain SHA-256 would let anyone who sees a record
	// (a store copy handed to the control side) confirm a guess at a
	// secret; a keyed one names the content to this host alone. It must
	// be secret to the host and the same from one apply to the next.
	DigestKey []byte
}

// unseal opens f's sealed content into r.unsealed, or says why it cannot:
// no key on this host, or content that does not open with it.
func (r *run) unseal(f *shapes.File) error {
	u := r.opt.Unseal
	if u == nil || u.Open == nil {
		return fmt.Errorf("sealed content for %s could not be opened: this host has no sealing key (it is not enrolled, or its node was registered by hand; sealed content needs a node enrolled with a token)", f.Key())
	}
	data, err := u.Open(f.Module, f.ID, *f.Sealed)
	if err != nil {
		return fmt.Errorf("sealed content for %s could not be opened: %w", f.Key(), err)
	}
	if len(u.DigestKey) == 0 {
		return fmt.Errorf("sealed content for %s opened, but the executor gave no key to record its digest under; not applied", f.Key())
	}
	r.unsealed[f.Key()] = data
	return nil
}

// fileContent is what f says the file holds: its content or bytes, or its
// sealed content as check opened it. For sealed content, want is keyed
// (Unsealer.DigestKey) rather than the plain SHA-256.
func (r *run) fileContent(f *shapes.File) (data []byte, want string, sealed bool) {
	if f.Sealed != nil {
		data = r.unsealed[f.Key()]
		m := hmac.New(sha256.New, r.opt.Unseal.DigestKey)
		m.Write(data)
		return data, "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)), true
	}
	data, _ = f.Data()
	return data, digest(data), false
}

// planFile observes a file and decides what, if anything, to do.
func (r *run) planFile(st *step, f *shapes.File) error {
	data, want, sealed := r.fileContent(f)
	var eq bool
	var info fsx.Info
	var err error
	if after, kind, planned := r.plannedAt(f.Path, fsx.Absent); planned && after == nil {
		// A plan: what an earlier removal takes away (a directory the
		// mesh made where this file goes), or a directory an archive
		// before it makes there.
		info.Kind = kind
	} else if eq, info, err = fsx.Equal(f.Path, data); err != nil && r.opt.Plan && errors.Is(err, unix.ENOTDIR) && r.plannedDir(path.Dir(f.Path)) {
		// A plan: its directory is a file now, which an earlier step
		// makes a directory (the file taken away first): nothing is in it.
		info, err = fsx.Info{Kind: fsx.Absent}, nil
	} else if err != nil && (info.Kind == fsx.Absent || info.Kind == fsx.Regular) {
		return err
	} else if planned && info.Kind == fsx.Regular {
		// A plan: the file as its regions' or keys' removal leaves it.
		eq = bytes.Equal(after, data)
	}
	if info.Kind != fsx.Absent && info.Kind != fsx.Regular {
		return fmt.Errorf("%s is a %s; the host writes only regular files", f.Path, info.Kind)
	}
	exists := info.Kind == fsx.Regular
	e := st.entry
	a, err := r.wantAttrs(f.Key(), f.Mode, info, exists, defaultFileMode)
	coming := errors.Is(err, errOwnerComing) // a plan: held or not is said still
	if err != nil && !coming {
		return err
	}
	match := exists && eq && attrsOf(info) == a && !coming

	if !exists && r.heldGone(st, e, f.Module, f.Key(), "deleted") {
		return nil
	}
	if exists && r.holds(f.Module, e) {
		r.heldOK[f.Key()] = match
		return r.holdFile(st, f, e, info)
	}
	if coming {
		ownerComingLine(st, "written", f.Owner)
		return nil
	}
	if match {
		st.line.Outcome = shapes.Unchanged
		switch {
		case e == nil && r.unpackedByOther(f.Path):
			// Written by another source's archive: the host's own, as
			// startChange takes it, with no original to give back.
			st.line.Detail = "found as declared, written by an archive of another source; held by the host from now"
			st.record = &store.Entry{Target: st.target, Type: shapes.TypeFile, Claims: withClaim(nil, st.claim), Created: true,
				Digest: want, Mode: a.mode, UID: a.uid, GID: a.gid}
		case e == nil:
			// Found exactly as declared: the host holds it from now on, and
			// what it found is what it gives back.
			st.line.Detail = "found as declared; held by the host from now (original kept)"
			// The kept original is what was found, named by its plain
			// digest in the root-only store: originals/ is addressed and
			// checked by content.
			sum := digest(data)
			orig := &store.Original{Kind: "file", Digest: sum, Mode: info.Mode, UID: info.UID, GID: info.GID}
			if !r.opt.Plan {
				if err := r.st.KeepOriginal(sum, data); err != nil {
					return err
				}
			}
			st.record = &store.Entry{Target: st.target, Type: shapes.TypeFile, Claims: withClaim(nil, st.claim), Original: orig,
				Digest: want, Mode: a.mode, UID: a.uid, GID: a.gid}
		case e.Digest != want || !e.Claimed(st.claim) || e.Held || e.Mode != a.mode || e.UID != a.uid || e.GID != a.gid:
			n := *e
			n.Claims, n.Held = withClaim(e, st.claim), false
			n.Digest, n.Mode, n.UID, n.GID = want, a.mode, a.uid, a.gid
			st.record = &n
		}
		return nil
	}

	n, err := r.startChange(st, e, shapes.TypeFile, f.Path, exists, func() (*store.Original, error) { return r.keepFile(f.Path) })
	if err != nil {
		return err
	}

	// size is how a line speaks of the content: its length (which the
	// sealed form shows anyway), never its bytes or plain digest.
	size := fmt.Sprintf("%d bytes", len(data))
	if sealed {
		size = "sealed, " + size
	}
	if r.opt.Plan && r.opt.OnDiff != nil && !eq {
		r.planDiff(f, data, exists, sealed)
	}
	st.line.Outcome = shapes.Applied
	drift := e != nil && e.Digest == want && e.Mode == a.mode && e.UID == a.uid && e.GID == a.gid
	if drift {
		st.line.Outcome = shapes.Repaired
	}
	switch {
	case !exists:
		st.line.Detail = fmt.Sprintf("created (%s, %s)", size, a)
		if drift {
			st.line.Detail = fmt.Sprintf("was deleted by something else; written again (%s, %s)", size, a)
		}
	case !eq:
		st.line.Detail = fmt.Sprintf("content replaced (%s, %s)", size, a)
		if e == nil {
			st.line.Detail += "; the original is kept and goes back when this is undeclared"
		}
		if drift {
			st.line.Detail = fmt.Sprintf("content was changed by something else; written again (%s, %s)", size, a)
		}
	default:
		st.line.Detail = fmt.Sprintf("owner and mode %s → %s", attrsOf(info), a)
	}

	// Even when only the owner or mode differ, the file is written anew
	// through a file of the host's own: setting them on whatever is at the
	// path when the change runs would hand root's owner and mode to
	// content a user swapped in after it was observed.
	st.creates = !exists
	if r.opt.Plan {
		r.plannedFiles[f.Path] = true
	}
	st.change = func() error {
		// A file absent when looked at is put there only if it still is:
		// one that appeared since (a person's, another applier's) is not
		// written over and taken for the host's.
		err := fsx.WriteFile(f.Path, data, fsx.WriteOptions{Mode: a.mode, UID: int(a.uid), GID: int(a.gid), NoReplace: st.creates})
		r.touch(path.Dir(f.Path))
		return err
	}
	st.readback = func() (*store.Entry, error) {
		eq, info, err := fsx.Equal(f.Path, data)
		if err != nil {
			return nil, err
		}
		if !eq {
			return nil, fmt.Errorf("%s does not hold what was written (it is a %s of %d bytes)", f.Path, info.Kind, info.Size)
		}
		if attrsOf(info) != a {
			return nil, fmt.Errorf("%s has %s, not %s", f.Path, attrsOf(info), a)
		}
		n.Digest, n.Mode, n.UID, n.GID = want, a.mode, a.uid, a.gid
		return n, nil
	}
	return nil
}

// keepFile keeps a found file's content and attributes before the host
// changes it, and returns what was kept.
func (r *run) keepFile(p string) (*store.Original, error) {
	content, info, err := fsx.ReadRegular(p, maxOriginal)
	if err != nil {
		return nil, fmt.Errorf("keep the original: %w", err)
	}
	orig := &store.Original{Kind: "file", Digest: digest(content), Mode: info.Mode, UID: info.UID, GID: info.GID}
	if !r.opt.Plan {
		if err := r.st.KeepOriginal(orig.Digest, content); err != nil {
			return nil, err
		}
	}
	return orig, nil
}

// holdFile handles a file found on an adopted node whose module is not yet
// taken: its original is kept, it is reported as held, and never changed.
func (r *run) holdFile(st *step, f *shapes.File, e *store.Entry, info fsx.Info) error {
	if e == nil {
		orig, err := r.keepFile(f.Path)
		if err != nil {
			return err
		}
		st.record = &store.Entry{Target: st.target, Type: shapes.TypeFile, Claims: withClaim(nil, st.claim), Held: true, Original: orig}
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("found on an adopted node; held as found until module %s is taken (original kept)", f.Module)
		return nil
	}
	sum, info, err := fsx.Sum(f.Path)
	if err != nil {
		return err
	}
	if !e.Claimed(st.claim) {
		n := *e
		n.Claims = withClaim(e, st.claim)
		st.record = &n
	}
	o := e.Original
	if fmt.Sprintf("%x", sum) != o.Digest || info.Mode != o.Mode || info.UID != o.UID || info.GID != o.GID {
		st.line.Outcome = shapes.HeldChanged
		st.line.Detail = fmt.Sprintf("held until module %s is taken, and changed by something else since it was found; left as it is", f.Module)
		return nil
	}
	st.line.Outcome = shapes.Held
	st.line.Detail = fmt.Sprintf("held as found until module %s is taken", f.Module)
	return nil
}

// planDirectory observes a directory and decides what, if anything, to do.
func (r *run) planDirectory(st *step, d *shapes.Directory) error {
	info, err := fsx.Lstat(d.Path)
	if err != nil {
		return err
	}
	if _, kind, ok := r.plannedAt(d.Path, info.Kind); ok {
		info.Kind = kind // a plan: a file an earlier removal takes away, or puts back
		if en := r.unpacked[d.Path]; en != nil && en.dir {
			// Or a directory an archive before it makes, as it makes it.
			info.Mode, info.UID, info.GID = cmp.Or(en.mode, 0o755), en.uid, en.gid
		}
	}
	if info.Kind != fsx.Absent && info.Kind != fsx.Dir {
		return fmt.Errorf("%s is a %s, not a directory; the host will not replace it", d.Path, info.Kind)
	}
	exists := info.Kind == fsx.Dir
	e := st.entry
	// A directory the host made and never recorded as made (an apply
	// cut between its mkdir and its chmod) is not one found: what it is
	// wanted to be is what its making would have left it, not the
	// root-only mode a new directory starts with (fsx.Mkdir), taken as
	// found for good when no mode is declared.
	asFound := exists && (e == nil || !e.Created || e.Digest == "dir")
	a, err := r.wantAttrs(d.Key(), d.Mode, info, asFound, defaultDirMode)
	coming := errors.Is(err, errOwnerComing) // a plan: held or not is said still
	if err != nil && !coming {
		return err
	}

	if !exists && r.heldGone(st, e, d.Module, d.Key(), "deleted") {
		return nil
	}
	if exists && r.holds(d.Module, e) {
		r.heldOK[d.Key()] = attrsOf(info) == a
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("found on an adopted node; held as found until module %s is taken", d.Module)
		if e == nil {
			st.record = &store.Entry{Target: st.target, Type: shapes.TypeDirectory, Claims: withClaim(nil, st.claim), Held: true,
				Original: &store.Original{Kind: "directory", Mode: info.Mode, UID: info.UID, GID: info.GID}}
		} else if o := e.Original; attrsOf(info) != (attrs{o.Mode, o.UID, o.GID}) {
			st.line.Outcome = shapes.HeldChanged
			st.line.Detail = fmt.Sprintf("held until module %s is taken, and changed by something else since it was found; left as it is", d.Module)
		}
		return nil
	}
	if coming {
		ownerComingLine(st, "made", d.Owner)
		return nil
	}
	if exists && attrsOf(info) == a {
		st.line.Outcome = shapes.Unchanged
		switch {
		case e == nil:
			st.line.Detail = "found as declared; held by the host from now"
			// Digest "dir": held as declared from now, so one taken away
			// by someone is made again as a repair, as a file is.
			st.record = &store.Entry{Target: st.target, Type: shapes.TypeDirectory, Claims: withClaim(nil, st.claim),
				Original: &store.Original{Kind: "directory", Mode: info.Mode, UID: info.UID, GID: info.GID},
				Mode:     a.mode, UID: a.uid, GID: a.gid, Digest: "dir"}
			if r.unpackedByOther(d.Path) || r.archiveMadeDir[d.Path] {
				// An archive made it — another source's, or one of this
				// apply's before it — as startChange takes it: the host's
				// making, removed when undeclared, not given back as found.
				st.record.Original, st.record.Created = nil, true
				st.line.Detail = "made by the archive before it; held by the host from now"
			}
		case !e.Claimed(st.claim) || e.Held || e.Mode != a.mode || e.UID != a.uid || e.GID != a.gid || e.Digest != "dir":
			n := *e
			n.Claims, n.Held = withClaim(e, st.claim), false
			n.Mode, n.UID, n.GID, n.Digest = a.mode, a.uid, a.gid, "dir"
			st.record = &n
		}
		return nil
	}

	n, err := r.startChange(st, e, shapes.TypeDirectory, d.Path, exists, func() (*store.Original, error) {
		return &store.Original{Kind: "directory", Mode: info.Mode, UID: info.UID, GID: info.GID}, nil
	})
	if err != nil {
		return err
	}
	st.line.Outcome = shapes.Applied
	if e != nil && e.Digest == "dir" && e.Mode == a.mode && e.UID == a.uid && e.GID == a.gid {
		st.line.Outcome = shapes.Repaired
	}
	if exists {
		st.line.Detail = fmt.Sprintf("owner and mode %s → %s", attrsOf(info), a)
	} else {
		st.line.Detail = fmt.Sprintf("created (%s)", a)
		if st.line.Outcome == shapes.Repaired {
			st.line.Detail = fmt.Sprintf("was removed by something else; created again (%s)", a)
		}
	}
	st.creates = !exists
	if r.opt.Plan {
		r.plannedOwner[d.Path] = [2]uint32{a.uid, a.gid}
	}
	st.change = func() error {
		var err error
		if exists {
			err = fsx.SetAttr(d.Path, info, a.mode, int(a.uid), int(a.gid))
		} else {
			err = fsx.Mkdir(d.Path, a.mode, int(a.uid), int(a.gid))
		}
		r.touch(path.Dir(d.Path))
		return err
	}
	st.readback = func() (*store.Entry, error) {
		info, err := fsx.Lstat(d.Path)
		if err != nil {
			return nil, err
		}
		if info.Kind != fsx.Dir || attrsOf(info) != a {
			return nil, fmt.Errorf("%s is a %s with %s, not a directory with %s", d.Path, info.Kind, attrsOf(info), a)
		}
		n.Mode, n.UID, n.GID, n.Digest = a.mode, a.uid, a.gid, "dir"
		return n, nil
	}
	return nil
}

// plannedDir says whether an earlier step of this run makes dir a
// directory: a directory resource, or an archive's entry.
func (r *run) plannedDir(dir string) bool {
	en := r.unpacked[dir]
	return r.declaredDirs[dir] || en != nil && en.dir
}

// parentReady says whether p's directory exists, or is declared by an
// earlier resource: the engine never creates parents on its own, and a plan
// must say so before the apply finds out.
func (r *run) parentReady(p string) error {
	parent := path.Dir(p)
	if en := r.unpacked[parent]; r.declaredDirs[parent] || en != nil && en.dir {
		return nil
	}
	info, err := fsx.Lstat(parent)
	if err != nil {
		return err
	}
	if info.Kind != fsx.Dir {
		return fmt.Errorf("parent directory %s does not exist (declare a directory before what it holds)", parent)
	}
	return nil
}

// startChange begins the entry and the intent of a change to a file or a
// directory at p: one the host already holds keeps its order, creation and
// original; an absent one will be the host's creation (its parent must be
// ready); a found one keeps what found returns as its original, before
// anything is written.
func (r *run) startChange(st *step, e *store.Entry, typ, p string, exists bool, found func() (*store.Original, error)) (*store.Entry, error) {
	if !exists {
		if err := r.parentReady(p); err != nil {
			return nil, err
		}
	}
	n := &store.Entry{Target: st.target, Type: typ, Claims: withClaim(e, st.claim)}
	in := &store.Intent{Claim: st.claim, Type: typ, Op: "change"}
	switch {
	case e != nil:
		n.Order, n.Created, n.Original = e.Order, e.Created, e.Original
	case !exists:
		n.Created = true
		in.Op, in.Created = "create", true
	case r.unpackedByOther(p):
		// Another source's archive's: the host made it, so it takes it
		// away when undeclared rather than put an archive's entry back as
		// an original where nothing accounts for it once that archive went.
		n.Created, in.Created = true, true
	default:
		orig, err := found()
		if err != nil {
			return nil, err
		}
		n.Original, in.Original = orig, orig
	}
	st.intent = in
	return n, nil
}

// SealedNotShown is a sealed file's diff in a plan: it carries nothing of
// either side, so a plan's reply passes it as it is.
const SealedNotShown = "(not shown: sealed content)"

// planDiff gives the plan's caller the content diff of f (OnDiff). Sealed
// content is never shown, not even to root at the terminal: the plan says
// only that it would change.
func (r *run) planDiff(f *shapes.File, data []byte, exists, sealed bool) {
	if sealed {
		r.opt.OnDiff(f.Module, f.ID, SealedNotShown)
		return
	}
	var found []byte
	if after, ok := r.plannedFile[f.Path]; ok && exists {
		r.opt.OnDiff(f.Module, f.ID, contentDiffFrom(f.Path, plannedWhat, after, true, data))
		return
	}
	if exists {
		b, _, err := fsx.ReadRegular(f.Path, maxDiffInput)
		if err != nil {
			r.opt.OnDiff(f.Module, f.ID, fmt.Sprintf("(not shown: %v)", err))
			return
		}
		found = b
	}
	r.opt.OnDiff(f.Module, f.ID, contentDiff(f.Path, found, exists, data))
}
