package engine

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

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

// Limits on what one archive may hold.
const (
	maxArchiveEntries = 100000
	maxArchiveBytes   = 4 << 30
)

// archiveCache is where archives are kept, by digest.
func (r *run) archiveCache(sum string) string {
	return filepath.Join(r.st.Dir(), "archives", sum)
}

// fetchArchive makes sure the archive is in the cache, verified. A local
// file or the bundle may name a file:// URL, which root is trusted to read;
// over the link the agent streams the bytes into the cache (obj:// URLs).
func (r *run) fetchArchive(a *shapes.Archive) (string, error) {
	cached := r.archiveCache(a.SHA256)
	if sum, err := fileDigest(cached); err == nil && sum == a.SHA256 {
		return cached, nil
	}
	src, ok := strings.CutPrefix(a.URL, "file://")
	if !ok {
		return "", fmt.Errorf("archive %s is not in the executor's cache, and only a file:// URL is fetched by the executor itself (the agent streams %s over the link)", a.SHA256, a.URL)
	}
	if r.opt.Source == store.Link {
		return "", fmt.Errorf("a file:// archive may come from a local file or the bundle, not over the link")
	}
	if r.opt.Plan {
		return src, nil
	}
	if err := os.MkdirAll(filepath.Dir(cached), 0o700); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("fetch archive: %w", err)
	}
	defer in.Close()
	tmp := cached + ".part"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), io.LimitReader(in, maxArchiveBytes+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("fetch archive: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		os.Remove(tmp)
		return "", fmt.Errorf("archive digest mismatch: %s has sha256 %s, the declaration says %s; nothing written", a.URL, got, a.SHA256)
	}
	return cached, os.Rename(tmp, cached)
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
}

// readArchive checks every entry and returns them, or refuses the archive.
func readArchive(p, dest string) ([]archiveEntry, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("archive: %w", err)
		}
		rd = gz
	}
	tr := tar.NewReader(rd)
	var out []archiveEntry
	var total int64
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("archive: %w", err)
		}
		if len(out) >= maxArchiveEntries {
			return nil, fmt.Errorf("archive: more than %d entries", maxArchiveEntries)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		name = strings.TrimSuffix(name, "/")
		clean := path.Clean(name)
		if name == "" || name == "." {
			continue // the archive's own top directory
		}
		if strings.HasPrefix(name, "/") || clean != name || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, fmt.Errorf("archive: entry %q names a path outside the destination; refused, not relocated", hdr.Name)
		}
		if seen[clean] {
			return nil, fmt.Errorf("archive: entry %q appears twice", hdr.Name)
		}
		seen[clean] = true
		full := path.Join(dest, clean)
		if why := shapes.ProtectedPath(full); why != "" {
			return nil, fmt.Errorf("archive: entry %q: %s: %v", hdr.Name, why, shapes.ErrProtected)
		}
		e := archiveEntry{rel: clean, mode: uint32(hdr.Mode) & 0o777}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.dir = true
		case tar.TypeReg:
			if total += hdr.Size; total > maxArchiveBytes {
				return nil, fmt.Errorf("archive: more than %d bytes", int64(maxArchiveBytes))
			}
			if e.data, err = io.ReadAll(io.LimitReader(tr, hdr.Size)); err != nil {
				return nil, fmt.Errorf("archive: %s: %w", hdr.Name, err)
			}
		default:
			return nil, fmt.Errorf("archive: entry %q is a %s; only regular files and directories are unpacked, and an archive needing one is refused rather than left incomplete", hdr.Name, tarType(hdr.Typeflag))
		}
		out = append(out, e)
	}
	// Every entry's directories must be in the archive or be the destination.
	for _, e := range out {
		if d := path.Dir(e.rel); d != "." && !seen[d] {
			return nil, fmt.Errorf("archive: entry %q is in %q, which the archive does not hold", e.rel, d)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i].rel, "/") < strings.Count(out[j].rel, "/") })
	return out, nil
}

func tarType(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device node"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}

// archive unpacks an archive, or finds it unpacked already.
func (r *run) archive(st *step, rest int) {
	a := st.res.(*shapes.Archive)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	dinfo, err := fsx.Lstat(a.Destination)
	if err != nil || dinfo.Kind != fsx.Dir {
		r.fail(st, fmt.Errorf("destination %s is not a directory (declare it before the archive): %v", a.Destination, err), rest)
		return
	}
	cached, err := r.fetchArchive(a)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	entries, err := readArchive(cached, a.Destination)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	ours := map[string]bool{}
	if e != nil {
		for _, p := range e.Paths {
			ours[p] = true
		}
	}
	// Observe: what is there already, and whether anything there is not ours.
	var todo []archiveEntry
	for _, en := range entries {
		full := path.Join(a.Destination, en.rel)
		info, err := fsx.Lstat(full)
		if err != nil {
			r.fail(st, err, rest)
			return
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
			if eq && info.Mode == en.mode {
				continue
			}
			if !ours[full] {
				r.fail(st, fmt.Errorf("%s exists and is not the host's; an archive does not overwrite what it did not write", full), rest)
				return
			}
		case info.Kind != fsx.Absent:
			r.fail(st, fmt.Errorf("%s is a %s; the archive has a %s there", full, info.Kind, map[bool]string{true: "directory", false: "file"}[en.dir]), rest)
			return
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
	for p := range wrote {
		n.Paths = append(n.Paths, p)
	}
	sort.Strings(n.Paths)
	// What it wrote before and the archive no longer has goes.
	var stale []string
	for p := range ours {
		if !wrote[p] {
			stale = append(stale, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(stale)))

	if len(todo) == 0 && len(stale) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("%d entries as unpacked", len(entries))
		if !r.opt.Plan && (e == nil || e.Digest != a.SHA256 || !e.Claimed(st.claim)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	st.line.Outcome = shapes.Applied
	if e != nil && e.Digest == a.SHA256 {
		st.line.Outcome = shapes.Repaired
	}
	st.line.Detail = fmt.Sprintf("%d of %d entries written, %d removed (sha256 %s…)", len(todo), len(entries), len(stale), a.SHA256[:12])
	if r.opt.Plan {
		r.emit(st.line)
		return
	}
	// The intent names every path it may create, so a crash leaves nothing
	// the host made unaccounted for: settling it claims them all (each is
	// the host's, or absent, and removing an absent path is nothing).
	if err := r.st.Intend(st.target, store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeArchive, Paths: n.Paths}); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := r.st.Sync(); err != nil {
		r.fail(st, err, rest)
		return
	}
	uid, gid := int(dinfo.UID), int(dinfo.GID)
	for _, en := range todo {
		full := path.Join(a.Destination, en.rel)
		if en.dir {
			mode := en.mode
			if mode == 0 {
				mode = 0o755
			}
			err = fsx.Mkdir(full, mode, uid, gid)
		} else {
			err = fsx.WriteFile(full, en.data, fsx.WriteOptions{Mode: en.mode, UID: uid, GID: gid})
		}
		if err != nil {
			r.fail(st, err, rest)
			return
		}
		r.touch(path.Dir(full))
	}
	for _, p := range stale {
		if err := removeWritten(p); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	// Read back every file.
	for _, en := range entries {
		if en.dir {
			continue
		}
		full := path.Join(a.Destination, en.rel)
		if eq, _, err := fsx.Equal(full, en.data); err != nil || !eq {
			r.fail(st, fmt.Errorf("read back %s: it does not hold what the archive has (%v)", full, err), rest)
			return
		}
	}
	if err := r.syncTouched(); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// removeWritten removes a file or an empty directory the archive wrote.
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

// planArchiveRemoval removes the files an archive wrote, deepest first.
func (r *run) planArchiveRemoval(st *step) {
	e := st.entry
	st.drop = true
	st.line.Outcome = shapes.Removed
	st.line.Detail = fmt.Sprintf("the %d paths it wrote removed (directories only when empty)", len(e.Paths))
	paths := append([]string(nil), e.Paths...)
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.change = func() error {
		for _, p := range paths {
			if err := removeWritten(p); err != nil {
				return err
			}
			r.touch(path.Dir(p))
		}
		return nil
	}
}
