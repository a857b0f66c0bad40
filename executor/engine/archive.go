package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// An archive is a tar (optionally gzipped) pinned by digest. Its bytes are
// in the executor's private cache before anything is written: checked
// against the declared digest while they are copied in, and read back from
// there, never from a file anyone else can touch. Every entry is checked
// before the first is written: one naming a path outside the destination,
// a link, a device or anything but a regular file or a directory refuses
// the archive whole, rather than being skipped or relocated.

// Limits on what one archive may hold: shapes.WalkArchive's.
const maxArchiveBytes = shapes.MaxArchiveBytes

// ArchiveCacheDir is the executor's private archive cache under its state
// directory: a file per archive, named by its sha256, written only by the
// executor after it hashed what it wrote.
func ArchiveCacheDir(stateDir string) string { return filepath.Join(stateDir, "archives") }

// MaxArchiveBytes bounds one archive, as a stream into the cache and as the
// files it holds.
const MaxArchiveBytes = maxArchiveBytes

// MaxArchiveCacheBytes bounds the cache as a whole: a stream that would
// take it past this is refused. What no declaration names any more is
// pruned after each link apply (PruneArchiveCache), so the bound is met by
// what is declared, not by what was once streamed.
const MaxArchiveCacheBytes = 2 * maxArchiveBytes

// ArchiveCacheBytes is the size of everything in the cache now.
func ArchiveCacheBytes(stateDir string) uint64 {
	kept, own, others := ArchiveCacheUse(stateDir, "")
	return kept + own + others
}

// ArchiveCacheUse is what the cache holds now, as a stream of archive sum
// counts it against the bound: kept, the archives cached but sum (a stream
// of one cached already replaces it with the same bytes); own, that
// stream's temporary so far; others, every other temporary (streams and
// fetches in flight, which end, or go).
func ArchiveCacheUse(stateDir, sum string) (kept, own, others uint64) {
	ents, _ := os.ReadDir(ArchiveCacheDir(stateDir))
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		n := uint64(info.Size())
		switch name := e.Name(); {
		case ValidDigest(name):
			if name != sum {
				kept += n
			}
		case sum != "" && name == sum+StreamSuffix:
			own += n
		default:
			others += n
		}
	}
	return kept, own, others
}

// StreamSuffix names a stream's temporary in the cache (<sha256>.part).
const StreamSuffix = ".part"

// DropLeftovers removes the temporaries a stop or a kill left in the
// cache: a stream's (streams: at the daemon's start, when none is in
// flight) and a fetch's (when no apply holds the store). Left, one whose
// digest never comes again would count against the bound for good.
func DropLeftovers(stateDir string, streams bool) {
	suffix := FetchSuffix
	if streams {
		suffix = StreamSuffix
	}
	dir := ArchiveCacheDir(stateDir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), suffix); ok && ValidDigest(name) && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// FetchSuffix names a fetch's temporary in the cache (a file:// archive a
// local file or the bundle names, read by an apply).
const FetchSuffix = ".fetch"

// PruneArchiveCache removes every cached archive whose digest keep lacks
// (temporaries of streams in flight are not archives, and stay). It
// returns the digests removed.
func PruneArchiveCache(stateDir string, keep map[string]bool) []string {
	dir := ArchiveCacheDir(stateDir)
	ents, _ := os.ReadDir(dir)
	var gone []string
	for _, e := range ents {
		if ValidDigest(e.Name()) && !keep[e.Name()] && e.Type().IsRegular() {
			if os.Remove(filepath.Join(dir, e.Name())) == nil {
				gone = append(gone, e.Name())
			}
		}
	}
	return gone
}

// ArchiveDigests are the digests of the archives d declares.
func ArchiveDigests(d *shapes.Declaration, into map[string]bool) {
	for _, r := range d.Resources {
		if a, ok := r.(*shapes.Archive); ok {
			into[a.SHA256] = true
		}
	}
}

// archiveCache is where archives are kept, by digest.
func (r *run) archiveCache(sum string) string {
	return filepath.Join(ArchiveCacheDir(r.st.Dir()), sum)
}

// ValidDigest reports whether s is a sha256 as a declaration writes it: 64
// lower-case hex digits (and so a safe file name).
func ValidDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CacheWriter writes one archive into the cache: in order, bounded,
// hashing every byte as it writes it into a temporary file of its own
// (0600, in the executor's private state), and names the result by its
// digest only if it is the one expected. Whoever supplies the bytes is
// trusted for nothing: the digest it claims only names the file.
type CacheWriter struct {
	sum, tmp, final string
	f               *os.File
	h               hash.Hash
	n, limit        uint64
}

// NewCacheWriter starts writing the archive with digest sum into stateDir's
// cache, under the temporary name <sum><suffix>, refusing more than limit
// bytes. A temporary left by a crash is replaced.
func NewCacheWriter(stateDir, sum, suffix string, limit uint64) (*CacheWriter, error) {
	if !ValidDigest(sum) {
		return nil, fmt.Errorf("archive digest %q is not 64 lower-case hex digits", sum)
	}
	dir := ArchiveCacheDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	w := &CacheWriter{sum: sum, tmp: filepath.Join(dir, sum+suffix), final: filepath.Join(dir, sum), h: sha256.New(), limit: limit}
	os.Remove(w.tmp)
	f, err := os.OpenFile(w.tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("archive cache: %w", err)
	}
	w.f = f
	return w, nil
}

// Written is how many bytes were written so far: the next chunk's offset.
func (w *CacheWriter) Written() uint64 { return w.n }

// Write appends b, which must start at offset off (the bytes written so
// far): a chunk out of order, or one past the limit, is refused.
func (w *CacheWriter) Write(off uint64, b []byte) error {
	if off != w.n {
		return fmt.Errorf("archive %s: a chunk at offset %d, where %d bytes were written; chunks come in order", w.sum, off, w.n)
	}
	if uint64(len(b)) > w.limit-w.n {
		return fmt.Errorf("archive %s: more than %d bytes", w.sum, w.limit)
	}
	if _, err := w.f.Write(b); err != nil {
		return fmt.Errorf("archive cache: %w", err)
	}
	w.h.Write(b)
	w.n += uint64(len(b))
	return nil
}

// Commit ends the stream: if what was written has the expected digest it
// becomes the cache's file for it; otherwise nothing of it is kept.
func (w *CacheWriter) Commit() (string, error) {
	got := hex.EncodeToString(w.h.Sum(nil))
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	if err == nil && got != w.sum {
		err = fmt.Errorf("archive digest mismatch: the %d bytes have sha256 %s, not %s; nothing kept", w.n, got, w.sum)
	}
	if err == nil {
		err = os.Rename(w.tmp, w.final)
	}
	if err != nil {
		os.Remove(w.tmp)
		return "", err
	}
	if d, derr := os.Open(filepath.Dir(w.final)); derr == nil {
		d.Sync()
		d.Close()
	}
	return w.final, nil
}

// Abort drops what was written.
func (w *CacheWriter) Abort() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
		os.Remove(w.tmp)
	}
}

// notStreamed: an obj:// archive is not in the executor's cache. The
// agent streams one before it hands its declaration over, and none before
// a plan: planned, it is one the apply would unpack once streamed.
type notStreamed struct{ sum string }

func (e *notStreamed) Error() string {
	return fmt.Sprintf("the agent has not streamed archive %s into the executor's cache; it is not applied until it has", e.sum)
}

// fetchArchive makes sure the archive is in the cache, verified. A local
// file or the bundle may name a file:// URL, which root is trusted to read;
// over the link the agent streams the bytes into the cache (obj:// URLs)
// before it forwards the declaration.
func (r *run) fetchArchive(a *shapes.Archive) (string, error) {
	if err := a.CheckURL(); err != nil {
		return "", err
	}
	cached := r.archiveCache(a.SHA256)
	if sum, err := fileDigest(cached); err == nil && sum == a.SHA256 {
		return cached, nil
	}
	if strings.HasPrefix(a.URL, "obj://") {
		if r.opt.Source != store.Link {
			return "", fmt.Errorf("archive %s is not in the executor's cache: an obj:// archive is streamed by the agent for a declaration over the link, never for a local file or the bundle (name a file on the machine, file:///PATH)", a.SHA256)
		}
		return "", &notStreamed{sum: a.SHA256}
	}
	src, ok := strings.CutPrefix(a.URL, "file://")
	if !ok {
		return "", fmt.Errorf("archive %s is not in the executor's cache, and only a file:// URL is fetched by the executor itself (the agent streams obj:// URLs over the link, not %s)", a.SHA256, a.URL)
	}
	if r.opt.Source == store.Link {
		if err := a.CheckLinkURL(); err != nil {
			return "", err
		}
	}
	if r.opt.Plan {
		// Checked as the apply checks it, and read where it is: a plan
		// writes nothing, the cache included, and says what the apply
		// would unpack only of the bytes the declaration pins.
		sum, err := fileDigest(src)
		if err != nil {
			return "", fmt.Errorf("fetch archive: %w", err)
		}
		if sum != a.SHA256 {
			return "", digestMismatch(a, sum)
		}
		return src, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("fetch archive: %w", err)
	}
	defer in.Close()
	// Its own temporary name: a stream from the agent may be writing
	// <sum>.part meanwhile.
	w, err := NewCacheWriter(r.st.Dir(), a.SHA256, FetchSuffix, maxArchiveBytes)
	if err != nil {
		return "", fmt.Errorf("fetch archive: %w", err)
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := in.Read(buf)
		if n > 0 {
			if err := w.Write(w.Written(), buf[:n]); err != nil {
				w.Abort()
				return "", fmt.Errorf("fetch archive %s: %w", a.URL, err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			w.Abort()
			return "", fmt.Errorf("fetch archive: %w", rerr)
		}
	}
	p, err := w.Commit()
	if err != nil {
		if strings.Contains(err.Error(), "digest mismatch") {
			return "", digestMismatch(a, hex.EncodeToString(w.h.Sum(nil)))
		}
		return "", fmt.Errorf("fetch archive: %w", err)
	}
	return p, nil
}

// digestMismatch refuses archive a, whose bytes have sha256 sum.
func digestMismatch(a *shapes.Archive, sum string) error {
	return fmt.Errorf("archive digest mismatch: %s has sha256 %s, the declaration says %s; nothing written", a.URL, sum, a.SHA256)
}

// sumOf is fileDigest's sum, "" when the file does not read.
func sumOf(p string) string {
	sum, err := fileDigest(p)
	if err != nil {
		return ""
	}
	return sum
}

func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// archiveEntry is one checked entry: a directory, or a file and its bytes.
type archiveEntry struct {
	rel  string // relative to the destination, clean
	dir  bool
	mode uint32
	data []byte
	// uid, gid: the owner it is given, the destination's (known once
	// planned: r.unpacked).
	uid, gid uint32
}

// editedContent is a file an archive wrote, as that version wrote it and
// as it is now.
type editedContent struct{ wrote, now []byte }

// editedSince is, of the paths the archive of entry e (the version before)
// wrote under dest and this apply removes, the regular files whose
// content is not what that version wrote: edited by hand since. Told only
// while that version's bytes are in the cache (the executor prunes it
// after the apply); otherwise none is said edited.
//
// unkept is, of those, the files edited whose content is more than the
// host keeps a copy of (maxOriginal): they are not removed, and stay the
// archive's until a person has looked.
func (r *run) editedSince(e *store.Entry, dest string, stale []string) (edited map[string]editedContent, unkept []string) {
	if e == nil || len(stale) == 0 {
		return nil, nil
	}
	version := r.filesOf(e.Digest, dest)
	if version == nil {
		return nil, nil
	}
	wrote := version.files
	// What the version a cut unpack was writing has at a path is the
	// host's too (cutVersion): it may have written it before the cut.
	var alsoWrote map[string][]byte
	if cut := r.cutVersion[e.Target]; cut != "" {
		if v := r.filesOf(cut, dest); v != nil {
			alsoWrote = v.files
		}
	}
	out := map[string]editedContent{}
	for _, p := range stale {
		data, ok := wrote[p]
		if !ok {
			// Carried in the record from a version before this one: what
			// was written there is not this version's to compare with. One
			// larger than the host keeps a copy of is one kept as edited
			// then (unkept), and stays so.
			if info, err := fsx.Lstat(p); err == nil && info.Kind == fsx.Regular && info.Size > maxOriginal {
				unkept = append(unkept, p)
			}
			continue
		}
		if r.editedAt(p) {
			continue // what the mesh's region or keys edit changed is the mesh's
		}
		if eq, info, err := fsx.Equal(p, data); err != nil || eq || info.Kind != fsx.Regular {
			continue
		}
		if also, ok := alsoWrote[p]; ok {
			if eq, _, err := fsx.Equal(p, also); err != nil || eq {
				continue
			}
		}
		now, info, err := fsx.ReadRegular(p, maxOriginal)
		switch {
		case err != nil && info.Kind == fsx.Regular && info.Size > maxOriginal:
			unkept = append(unkept, p)
		case err == nil && info.Kind == fsx.Regular && !bytes.Equal(now, data):
			out[p] = editedContent{wrote: data, now: now}
		}
	}
	return out, unkept
}

// unkeptSaid is what an archive's line adds for the files edited by hand
// too large to keep a copy of, which it does not remove ("" for none).
func unkeptSaid(unkept []string) string {
	if len(unkept) == 0 {
		return ""
	}
	slices.Sort(unkept)
	return fmt.Sprintf("; %s by hand since, larger than the host keeps a copy of (%d MiB): not removed, and still the archive's until a person has looked (%s)",
		countWord(len(unkept), "was edited", "were edited"), maxOriginal>>20, listSome(unkept, 3))
}

// editedSaid is what an archive's line adds for the files it removes that
// were edited by hand since by (the version before, the archive) wrote
// them: "" for none.
func editedSaid(edited map[string]editedContent, by string) string {
	if len(edited) == 0 {
		return ""
	}
	one := len(edited) == 1
	return fmt.Sprintf("; of those removed, %s edited by hand since %s wrote %s: what %s held is kept for %d days (mesh-executor owned says where)",
		countWord(len(edited), "was", "were"), by, map[bool]string{true: "it", false: "them"}[one], map[bool]string{true: "it", false: "they"}[one], store.SalvageKeep/(24*time.Hour))
}

// keepEdited keeps, for store.SalvageKeep, what the files edited by
// hand hold before they are removed, and makes the record durable first:
// a power cut after the removal loses no edit.
func (r *run) keepEdited(c store.Claim, edited map[string]editedContent) error {
	if len(edited) == 0 {
		return nil
	}
	for _, p := range slices.Sorted(maps.Keys(edited)) {
		content := edited[p]
		if err := r.st.Salvage(store.Salvaged{Path: p, Digest: digest(content.now), Written: digest(content.wrote), Removed: clock.Now().UTC(), Module: c.Module, ID: c.ID}, content.now); err != nil {
			return err
		}
	}
	return r.st.Sync()
}

// readArchive checks every entry and returns them, or refuses the archive.
func readArchive(p, dest string) ([]archiveEntry, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []archiveEntry
	err = shapes.WalkArchive(f, func(h shapes.ArchiveEntry, body io.Reader) error {
		if why := shapes.ProtectedPath(path.Join(dest, h.Name)); why != "" {
			return fmt.Errorf("archive: entry %q: %s: %v", h.Raw, why, shapes.ErrProtected)
		}
		e := archiveEntry{rel: h.Name, mode: h.Mode, dir: h.Dir}
		if !h.Dir {
			var err error
			if e.data, err = io.ReadAll(body); err != nil {
				return fmt.Errorf("archive: %s: %w", h.Raw, err)
			}
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i].rel, "/") < strings.Count(out[j].rel, "/") })
	return out, nil
}

// archive unpacks an archive, or finds it unpacked already.
func (r *run) archive(st *step, rest int) {
	a := st.res.(*shapes.Archive)
	raw := r.st.Get(st.target)
	// An unpack a cut stopped (its intent pending) is finished by this
	// one: what it writes was never all there, and is applied, not a
	// drift repaired — though the record, settled, names the version.
	cut := raw != nil && raw.Pending != nil
	e := r.settle(raw, st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	dinfo, err := fsx.Lstat(a.Destination)
	switch {
	case err != nil:
		r.fail(st, fmt.Errorf("destination %s: %w", a.Destination, err), rest)
		return
	case dinfo.Kind == fsx.Absent && r.plannedDirAt(a.Destination):
		// A plan: a directory resource, or an archive, before it makes
		// it, with the owner it gives it.
		if o, ok := r.plannedOwner[a.Destination]; ok {
			dinfo.UID, dinfo.GID = o[0], o[1]
		} else if en := r.unpacked[a.Destination]; en != nil {
			dinfo.UID, dinfo.GID = en.uid, en.gid
		}
	case dinfo.Kind != fsx.Dir:
		what := "a " + dinfo.Kind.String()
		if dinfo.Kind == fsx.Absent {
			what = "not there"
		}
		r.fail(st, fmt.Errorf("destination %s is %s, not a directory (declare it before the archive)", a.Destination, what), rest)
		return
	}
	cached, err := r.fetchArchive(a)
	if ns := (*notStreamed)(nil); errors.As(err, &ns) && r.opt.Plan {
		st.line.Outcome = shapes.Applied
		st.line.Detail = fmt.Sprintf("sha256 %s… to be unpacked once the agent streams it before the apply (not in the executor's cache now: what it writes, and over what, is not known to this plan)", a.SHA256[:12])
		r.emit(st.line)
		return
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	entries, err := readArchive(cached, a.Destination)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	ours, edited := map[string]bool{}, map[string]bool{}
	if e != nil {
		for _, p := range e.Paths {
			ours[p] = true
		}
	}
	if r.clearWay(a, entries, e); r.stopped {
		return
	}
	// Observe: what is there already, and whether anything there is not ours.
	var todo []archiveEntry
	left := map[string]string{} // a file of this declaration declares it
	absent := map[string]bool{} // not there when looked at: put there only if it still is not
	for _, en := range entries {
		full := path.Join(a.Destination, en.rel)
		if by := r.fileDeclared(full); by != "" && !en.dir {
			// The file's, which overrides the archive's (a default
			// configuration the archive brings, the module's own over it):
			// written by both, each apply would put back the other's.
			left[full] = by
			continue
		}
		others, above := r.othersAt(full)
		if len(above) > 0 && !en.dir {
			// A file a source above declares (a rescue file's over the
			// link's archive): the same, across sources.
			left[full] = joinClaims(above)
			continue
		}
		info, err := fsx.Lstat(full)
		if err != nil {
			r.fail(st, err, rest)
			return
		}
		after, kind, planned := r.plannedAt(full, info.Kind)
		info.Kind = kind
		if prev := r.unpacked[full]; planned && prev != nil && !prev.dir {
			info.Mode = prev.mode // a plan: as an archive before it writes it
		}
		if r.opt.Plan && info.Kind == fsx.Absent {
			// A plan: what a directory or a file declared before it makes
			// there, as the apply will find it.
			switch {
			case r.declaredDirs[full]:
				info.Kind = fsx.Dir
			case r.plannedFiles[full]:
				info.Kind = fsx.Regular
			}
		}
		switch {
		case en.dir && info.Kind == fsx.Dir:
			continue // an existing directory is used as it is
		case !en.dir && info.Kind == fsx.Regular:
			eq, _, err := fsx.Equal(full, en.data)
			if err != nil {
				r.fail(st, err, rest)
				return
			}
			if planned {
				eq = bytes.Equal(after, en.data)
			}
			if eq && info.Mode == en.mode {
				continue
			}
			if ours[full] && e.Digest == a.SHA256 && info.Mode == en.mode && r.editedAt(full) && !r.early["path:"+full] {
				// Its file as a region or keys of the mesh's edit it (a
				// default configuration, a block in it): what this
				// version wrote, and the edit in it. Written again, each
				// would undo the other at every apply; a new version is,
				// and so is one a file undone before it (clearWay) put
				// its original back over.
				edited[full] = true
				continue
			}
			if !ours[full] && len(others) == 0 {
				r.fail(st, fmt.Errorf("%s exists and is not the host's; an archive does not overwrite what it did not write", full), rest)
				return
			}
			// A file a source below declares is the host's: written over,
			// that source's file held while this archive has it.
		case info.Kind != fsx.Absent:
			r.fail(st, fmt.Errorf("%s is a %s; the archive has a %s there", full, info.Kind, map[bool]string{true: "directory", false: "file"}[en.dir]), rest)
			return
		default:
			absent[full] = true
		}
		todo = append(todo, en)
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeArchive, Claims: withClaim(e, st.claim), Digest: a.SHA256}
	if e != nil {
		n.Order = e.Order
	}
	// The paths it holds: what it wrote before and still declares, and what
	// it writes now. A directory that was there already is not its own.
	wrote := map[string]bool{}
	for _, en := range entries {
		full := path.Join(a.Destination, en.rel)
		if ours[full] {
			wrote[full] = true
		}
	}
	for _, en := range todo {
		wrote[path.Join(a.Destination, en.rel)] = true
	}
	// A path it wrote that a file of the declaration, or of a source
	// above, declares stays its own, whether or not this version still has
	// it: the file's while it declares it, the archive's to remove after
	// (clearWay gives it back). One a source below declares that this
	// version no longer has is that source's again (handed), left as it
	// is for it to write: removed, its file would go; kept, held for good.
	handed := map[string]bool{}
	for p := range ours {
		others, above := r.othersAt(p)
		switch {
		case r.fileDeclared(p) != "" || len(above) > 0:
			wrote[p] = true
		case len(others) > 0 && !wrote[p]:
			handed[p] = true
		}
	}
	for p := range wrote {
		n.Paths = append(n.Paths, p)
	}
	sort.Strings(n.Paths)
	// What it wrote before and the archive no longer has goes; what a
	// file declares now is the file's.
	var stale []string
	for p := range ours {
		if wrote[p] || left[p] != "" || handed[p] {
			continue
		}
		if r.dirDeclared(p) != "" {
			// A directory this declaration declares: its resource's to
			// hold from now (taken away here, it would make it again as
			// "removed by something else").
			continue
		}
		_, replaced, behind, _ := pathNow(p)
		if replaced {
			continue
		}
		if behind {
			n.Paths = append(n.Paths, p) // kept until the link is gone
			continue
		}
		stale = append(stale, p)
	}
	sort.Strings(n.Paths)
	sort.Sort(sort.Reverse(sort.StringSlice(stale)))
	// What goes that someone edited by hand since the version before
	// wrote it is not thrown away without a word: kept as a file's is
	// (store.Salvage), when that version is still in the cache to tell.
	editedStale, unkept := r.editedSince(e, a.Destination, stale)
	if len(unkept) > 0 {
		stale = slices.DeleteFunc(stale, func(p string) bool { return slices.Contains(unkept, p) })
		n.Paths = append(n.Paths, unkept...)
		sort.Strings(n.Paths)
	}

	if len(todo) == 0 && len(stale) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("%s as unpacked%s", countWord(len(entries)-len(left), "entry", "entries"), leftSaid(left))
		if !r.opt.Plan && (e == nil || e.Digest != a.SHA256 || !e.Claimed(st.claim) || cut) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	for _, en := range todo {
		if full := path.Join(a.Destination, en.rel); !en.dir && r.editedAt(full) {
			r.archiveWrote[full] = true
		}
	}
	st.line.Outcome = shapes.Applied
	if e != nil && e.Digest == a.SHA256 && len(todo) > 0 && !cut {
		// What it wrote was changed or taken away since: drift. Paths it
		// only takes away now are ones a file held until this apply.
		st.line.Outcome = shapes.Repaired
	}
	st.line.Detail = fmt.Sprintf("%d of %d entries written, %d removed (sha256 %s…)%s", len(todo), len(entries), len(stale), a.SHA256[:12], leftSaid(left))
	st.line.Detail += editedSaid(editedStale, "the version before") + unkeptSaid(unkept)
	if r.opt.Plan {
		for i := range todo {
			todo[i].uid, todo[i].gid = dinfo.UID, dinfo.GID
			r.unpacked[path.Join(a.Destination, todo[i].rel)] = &todo[i]
			if todo[i].dir && absent[path.Join(a.Destination, todo[i].rel)] {
				r.archiveMadeDir[path.Join(a.Destination, todo[i].rel)] = true // as the apply makes it
			}
		}
		for _, p := range stale {
			r.plannedFile[p] = nil
		}
		r.emit(st.line)
		return
	}
	// The intent names every path it may create, and the version it
	// unpacks, so a crash leaves nothing the host made unaccounted for:
	// settling it claims each that is there (reachedByCut), and the
	// record names the version.
	if !r.intendNow(st, store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeArchive, Paths: n.Paths, Digest: a.SHA256}, rest) {
		return
	}
	// What this apply made and took away, for the record of an unpack that
	// fails part way (failMidway): its intent names every path the unpack
	// might make, and left pending, the next apply would settle it by
	// claiming them all — a path the unpack never reached, and one a
	// person puts there since, taken for the host's and removed with the
	// archive.
	made, gone := map[string]bool{}, map[string]bool{}
	failMidway := func(err error) {
		k := *n
		// The version the record names: the one before while there is
		// one (what a look at its files compares them with, editedSince;
		// named this one, an edit of the mesh's in a file it has not
		// rewritten yet would keep the old content), else this one.
		k.Digest = a.SHA256
		if e != nil {
			k.Digest = e.Digest
		}
		k.Paths = nil
		for _, p := range append(slices.Clone(n.Paths), stale...) {
			if ours[p] && !gone[p] || made[p] {
				k.Paths = append(k.Paths, p)
			}
		}
		slices.Sort(k.Paths)
		k.Paths = slices.Compact(k.Paths)
		r.syncTouched() // best effort: the record may claim a path a power cut took back, never the reverse
		var rerr error
		if e == nil && len(k.Paths) == 0 {
			r.abandon(st.target)
		} else if rerr = r.st.Put(&k); rerr == nil {
			rerr = r.st.Sync()
		}
		if rerr != nil {
			// The intent stays: the next apply settles it by looking.
			err = fmt.Errorf("%w; and the store could not record what was unpacked before it: %v", err, rerr)
		}
		r.fail(st, err, rest)
	}
	uid, gid := int(dinfo.UID), int(dinfo.GID)
	for _, en := range todo {
		full := path.Join(a.Destination, en.rel)
		if r.opt.beforeChange != nil {
			r.opt.beforeChange("path:" + full)
		}
		if en.dir {
			mode := en.mode
			if mode == 0 {
				mode = 0o755
			}
			err = fsx.Mkdir(full, mode, uid, gid)
			if err == nil {
				r.archiveMadeDir[full] = true
			}
			info, lerr := fsx.Lstat(full)
			switch {
			case errors.Is(err, fs.ErrExist) && lerr == nil && info.Kind == fsx.Dir:
				// Made by another since the look: used as it is, as one
				// there before, and not the archive's.
				err = nil
				n.Paths = slices.DeleteFunc(n.Paths, func(p string) bool { return p == full })
				continue
			case err != nil && !errors.Is(err, fsx.ErrChanged) && lerr == nil && info.Kind == fsx.Dir && info.UID == uint32(os.Geteuid()):
				// Made, and its owner or mode not set: the host's still,
				// which no one else could have made root's.
				made[full] = true
			}
		} else {
			err = fsx.WriteFile(full, en.data, fsx.WriteOptions{Mode: en.mode, UID: uid, GID: gid, NoReplace: absent[full]})
			if absent[full] && errors.Is(err, fs.ErrExist) {
				// Someone's, not the archive's, though the archive wrote
				// the path before (it was taken away since): no longer
				// claimed, so never removed as the host's.
				delete(ours, full)
				err = fmt.Errorf("%s was put there by something else since this apply looked; an archive does not overwrite what it did not write", full)
			}
		}
		if err != nil {
			failMidway(err)
			return
		}
		made[full] = true
		r.touch(path.Dir(full))
	}
	if err := r.keepEdited(st.claim, editedStale); err != nil {
		failMidway(err)
		return
	}
	for _, p := range stale {
		if err := removeWritten(p); err != nil {
			failMidway(err)
			return
		}
		gone[p] = true
		r.touch(path.Dir(p)) // durable before the record lets go of it
	}
	// Read back every file.
	for _, en := range entries {
		full := path.Join(a.Destination, en.rel)
		if en.dir || left[full] != "" || edited[full] {
			continue
		}
		if eq, _, err := fsx.Equal(full, en.data); err != nil || !eq {
			failMidway(fmt.Errorf("read back %s: it does not hold what the archive has (%v)", full, err))
			return
		}
	}
	if err := r.syncTouched(); err != nil {
		failMidway(err)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	// A file a source below declares that it wrote over: what the host
	// wrote there last is the archive's entry, so that when the path is
	// that source's again its write is said applied, not a hand edit put
	// right, and its removal keeps nothing aside as a person's edit.
	for _, en := range todo {
		full := path.Join(a.Destination, en.rel)
		if le := r.st.Get("path:" + full); !en.dir && le != nil && le.Type == shapes.TypeFile && (le.Digest != digest(en.data) || le.Mode != en.mode) {
			if others, _ := r.othersAt(full); len(others) > 0 {
				m := *le
				m.Digest, m.Mode = digest(en.data), en.mode
				if err := r.st.Put(&m); err != nil {
					r.fail(st, err, rest)
					return
				}
			}
		}
	}
	r.emit(st.line)
}

// reachedByCut says, of a path an archive's intent a cut left pending
// names and its record does not, whether the cut unpack made it: not when
// it is absent — the unpack never reached it, and a record naming it
// would claim more than happened (and an owned list name a path that is
// not there). The unpack writes only where nothing was (NoReplace), so
// what is there is the unpack's if it is what the version being unpacked
// (wrote) has there: a directory where it has one, a regular file holding
// its bytes. Anything else was put there since, by someone else (a person,
// between the cut and this apply), and is not claimed: the archive's going
// would remove it. A version whose archive cannot be read (wrote nil)
// leaves what is there taken for the unpack's.
func reachedByCut(x string, wrote *versionFiles) bool {
	info, err := fsx.Lstat(x)
	if err != nil {
		return true
	}
	if info.Kind == fsx.Absent {
		return false
	}
	if wrote == nil {
		return true
	}
	if wrote.dirs[x] {
		return info.Kind == fsx.Dir
	}
	want, ok := wrote.files[x]
	if !ok || info.Kind != fsx.Regular || info.Size != int64(len(want)) {
		return false
	}
	got, err := os.ReadFile(x)
	return err == nil && bytes.Equal(got, want)
}

// versionFiles is what one version of an archive unpacks: its files'
// bytes and its directories, by full path.
type versionFiles struct {
	files map[string][]byte
	dirs  map[string]bool
}

// filesOf reads what the archive of digest sum, in the cache, unpacks
// into dest; nil when it is not there or does not read.
func (r *run) filesOf(sum, dest string) *versionFiles {
	p := r.archiveCache(sum)
	if !ValidDigest(sum) || sumOf(p) != sum {
		return nil
	}
	entries, err := readArchive(p, dest)
	if err != nil {
		return nil
	}
	v := &versionFiles{files: map[string][]byte{}, dirs: map[string]bool{}}
	for _, en := range entries {
		if en.dir {
			v.dirs[path.Join(dest, en.rel)] = true
		} else {
			v.files[path.Join(dest, en.rel)] = en.data
		}
	}
	return v
}

// leftSaid is what an archive's line adds for the entries it leaves to
// files of the declaration ("" for none).
func leftSaid(left map[string]string) string {
	if len(left) == 0 {
		return ""
	}
	var said []string
	for _, p := range slices.Sorted(maps.Keys(left)) {
		said = append(said, p+" ("+left[p]+")")
	}
	return fmt.Sprintf("; %d left to the file or directory that declares it: %s", len(left), listSome(said, 3))
}

// editedAt says whether a region or keys edit the file at p: of this
// declaration, or recorded of any source.
func (r *run) editedAt(p string) bool {
	if len(r.editsAt(p)) > 0 {
		return true
	}
	for _, res := range r.d.Resources {
		switch x := res.(type) {
		case *shapes.Region:
			if x.Path == p {
				return true
			}
		case *shapes.Keys:
			if x.Path == p {
				return true
			}
		}
	}
	return false
}

// fileDeclared is the file resource of this declaration ("module.id")
// that declares path p, "" for none.
func (r *run) fileDeclared(p string) string {
	r.declaredPaths()
	return r.filePaths[p]
}

// dirDeclared is the directory resource of this declaration ("module.id")
// that declares path p, "" for none.
func (r *run) dirDeclared(p string) string {
	r.declaredPaths()
	return r.dirPaths[p]
}

// declaredPaths indexes, once a run, the paths this declaration's files
// and directories declare: an archive's removal asks for each path it
// wrote.
func (r *run) declaredPaths() {
	if r.filePaths != nil {
		return
	}
	r.filePaths, r.dirPaths = map[string]string{}, map[string]string{}
	for _, res := range r.d.Resources {
		switch x := res.(type) {
		case *shapes.File:
			r.filePaths[x.Path] = x.Key()
		case *shapes.Directory:
			r.dirPaths[x.Path] = x.Key()
		}
	}
}

// clearWay undoes, before an archive is looked at, what this source made
// at a path the archive writes, or wrote, and this declaration no longer
// declares (a file declared there before, or a directory the host made
// where the archive has a file). Undone at the end with the
// other removals, it would be in the archive's way when its step runs —
// "not the host's to overwrite" — and that failure stops the apply before
// the removal that would clear it, at every apply; and at a path the
// archive wrote and no longer has, the archive would take away the file,
// and the file's removal then put back its original (the archive's old
// entry) where nothing accounts for it any more. A file the host created
// goes, a found one gets its original back (which the archive then does
// not overwrite, as any file it did not write, or takes away as its own).
// A plan is told what each leaves.
func (r *run) clearWay(a *shapes.Archive, entries []archiveEntry, was *store.Entry) {
	var ways []string
	for _, en := range entries {
		if !en.dir {
			ways = append(ways, path.Join(a.Destination, en.rel))
		}
	}
	if was != nil {
		ways = append(ways, was.Paths...)
	}
	var batch []*step
	seen := map[string]bool{}
	for _, full := range ways {
		target := "path:" + full
		e := r.st.Get(target)
		// A directory the host made where the archive has a file, no
		// longer declared, is in its way the same.
		inWay := e != nil && (e.Type == shapes.TypeFile || e.Type == shapes.TypeDirectory && e.Created && r.dirDeclared(full) == "")
		if seen[full] || !inWay || r.early[target] || r.fileDeclared(full) != "" {
			continue
		}
		seen[full] = true
		if !r.onlyMine(e) {
			continue
		}
		batch = append(batch, r.removeFirst(e, full, true, ""))
	}
	r.execute(batch, len(r.d.Resources))
}

// removeWritten removes a file or an empty directory the archive wrote.
// pathNow is what is at p, a path an archive wrote, as its removal sees
// it, from one look: replaced, a link or a special file put there since —
// never what the archive made, left as it is and no longer claimed;
// behind, reached through a link now (a directory on its way replaced by
// one) — what the host wrote may be where the directory went, so it stays
// claimed, never followed, taken away once the link is gone.
func pathNow(p string) (info fsx.Info, replaced, behind bool, err error) {
	info, err = fsx.Lstat(p)
	replaced = err == nil && (info.Kind == fsx.Symlink || info.Kind == fsx.Other)
	behind = errors.Is(err, fsx.ErrSymlink)
	return info, replaced, behind, err
}

// removeWritten removes what an archive wrote at p: a file, or a
// directory once empty.
func removeWritten(p string) error {
	info, err := fsx.Lstat(p)
	if err != nil {
		return err
	}
	switch info.Kind {
	case fsx.Absent:
		return nil
	case fsx.Dir:
		if err := fsx.RemoveDir(p); err != nil && !errors.Is(err, fsx.ErrNotEmpty) {
			return err
		}
		return nil
	default:
		return fsx.Remove(p)
	}
}

// planArchiveRemoval removes the files an archive wrote, deepest first, and
// the directories it made that will then be empty — decided here, where
// plan and apply both decide. A directory it made that holds what it did
// not write is kept, and the archive's record with it (its line names it,
// and every apply tries again), until it is empty.
func (r *run) planArchiveRemoval(st *step) {
	e := st.entry
	paths := append([]string(nil), e.Paths...)
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	var gone []string
	var handed []*store.Entry
	left := map[string]string{} // to the file that declares it now
	kept := map[string][]string{}
	var replaced, through []string
	// Which of its files were edited by hand since it wrote them, while
	// that version is in the cache to tell.
	edited, unkept := r.editedSince(e, strings.TrimPrefix(e.Target, "archive:"), paths)
	for _, p := range paths {
		if by := r.fileDeclared(p); by != "" {
			left[p] = by
			// A file of this declaration declares it now: the file's, as
			// what the host made rather than what it found, so that the
			// file undeclared takes it away instead of putting back, as an
			// original, the archive's entry nothing accounts for any more.
			if fe := r.st.Get("path:" + p); fe != nil && fe.Type == shapes.TypeFile && !fe.Held && !fe.Created && fe.Original != nil {
				n := *fe
				n.Created, n.Original = true, nil
				handed = append(handed, &n)
			}
			continue
		}
		if others, _ := r.othersAt(p); len(others) > 0 {
			// Another source's file or directory declares it now: left to
			// it, which took it as the host's creation (startChange).
			left[p] = joinClaims(others)
			continue
		}
		if by := r.dirDeclared(p); by != "" {
			// A directory of this declaration declares it now: left to
			// it, as what the host made, which it takes away once
			// undeclared (and empty) rather than leave as found.
			left[p] = by
			if de := r.st.Get("path:" + p); de != nil && de.Type == shapes.TypeDirectory && !de.Held && !de.Created {
				n := *de
				n.Created, n.Original = true, nil
				handed = append(handed, &n)
			}
			continue
		}
		info, isReplaced, isBehind, err := pathNow(p)
		if isReplaced {
			replaced = append(replaced, p)
			continue
		}
		if isBehind {
			through = append(through, p)
			continue
		}
		if slices.Contains(unkept, p) {
			continue // kept: said below
		}
		if err == nil && info.Kind == fsx.Dir {
			left, err := r.leftIn(p)
			if err != nil {
				st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
				return
			}
			if len(left) > 0 {
				kept[p] = left
				continue
			}
		}
		r.removing[p] = true
		gone = append(gone, p)
	}
	// What goes that someone edited by hand since the archive wrote it is
	// kept as a file's is (edited), or, too large to keep, not removed
	// (unkept, decided in the loop above).
	for p := range edited {
		if !slices.Contains(gone, p) {
			delete(edited, p)
		}
	}
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.change = func() error {
		if err := r.keepEdited(firstClaim(e), edited); err != nil {
			return err
		}
		for _, n := range handed {
			was := r.st.Get(n.Target)
			if err := r.st.Put(n); err != nil {
				return err
			}
			if was != nil && was.Original != nil && was.Original.Digest != "" { // a directory's keeps no content
				r.forget = append(r.forget, was.Original.Digest)
			}
		}
		for _, p := range gone {
			if err := removeWritten(p); err != nil {
				return err
			}
			r.touch(path.Dir(p))
		}
		return nil
	}
	leftTo := ""
	if len(left) > 0 {
		leftTo = strings.Replace(leftSaid(left), "left to the file or directory that declares it", "left to the file or directory that declares it now, the host's own to remove with it", 1)
	}
	if len(replaced) > 0 {
		slices.Sort(replaced)
		leftTo += fmt.Sprintf("; %s a link or special file now, which the host did not make: left as it is (%s)", countWord(len(replaced), "is", "are"), listSome(replaced, 3))
	}
	if len(kept) == 0 && len(through) == 0 && len(unkept) == 0 {
		st.drop = true
		st.line.Outcome = shapes.Removed
		st.line.Detail = fmt.Sprintf("%s it wrote removed%s%s", pathsWord(len(gone)), editedSaid(edited, "the archive"), leftTo)
		return
	}
	var names []string
	for p, left := range kept {
		names = append(names, fmt.Sprintf("%s (holds %s)", p, listSome(left, 3)))
	}
	sort.Strings(names)
	n := *e
	n.Paths = nil
	for _, p := range e.Paths {
		if kept[p] != nil || slices.Contains(through, p) || slices.Contains(unkept, p) {
			n.Paths = append(n.Paths, p)
		}
	}
	st.record, st.drop = &n, false
	st.line.Outcome = shapes.Kept
	var why []string
	if len(names) > 0 {
		why = append(why, "the directories it made that hold what it did not write are kept, and removed once empty: "+listSome(names, 3))
	}
	if len(through) > 0 {
		slices.Sort(through)
		why = append(why, fmt.Sprintf("%s reached through a link now, never followed: kept, and removed once the link is gone (%s)", countWord(len(through), "path is", "paths are"), listSome(through, 3)))
	}
	said := ""
	if len(why) > 0 {
		said = "; " + strings.Join(why, "; ")
	}
	st.line.Detail = fmt.Sprintf("%d of the %s it wrote removed%s%s%s%s",
		len(gone), pathsWord(len(e.Paths)), editedSaid(edited, "the archive"), said, unkeptSaid(unkept), leftTo)
}

// pathsWord is "1 path" or "N paths".
func pathsWord(n int) string { return countWord(n, "path", "paths") }

// countWord is n with the word for one or for several.
func countWord(n int, one, several string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, several)
}

func init() {
	registerAlone(shapes.TypeArchive, (*run).archive, (*run).planArchiveRemoval)
}
