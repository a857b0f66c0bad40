// Package store is the executor's record of what the host holds on this
// machine: the truth it reconciles against, authoritative while
// disconnected.
//
// It is a journal compacted into a snapshot. Before the engine changes the
// machine it appends an intent (so a crash cannot turn the host's own
// creation into a "found" thing), and after the change is read back it
// appends the entry as applied. Records are written with write(2) at once,
// so they survive the process being killed at any instant, and made durable
// in groups (Sync), so a batch of steps costs one sync rather than one each. Each record carries a checksum; a torn last record (a crash
// mid-write) is dropped on load, never guessed at.
//
// The store never claims more than happened: an entry exists only after its
// read-back, and an interrupted intent is kept as Pending, which says "the
// host may have done this", until the next apply observes the machine.
//
// Layout of the directory (root, 0700), which is itself flock'd by the one
// applier:
//
//	journal         checksummed JSON lines since the snapshot
//	snapshot        the compacted state (a checksummed binary format, see
//	                snapshot.go), written atomically
//	originals/      kept originals, by content digest (made when first needed)
//	salvaged.json   hand-edited files the host removed, whose content is kept (Salvage)
//	                for SalvageKeep, dropped at the first Lock after that
//	target-SOURCE.json  the declaration being applied for each source
//	restarts-owed.json  the restarts restart_on owes that an apply could not give (RestartsOwed)
package store

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"golang.org/x/sys/unix"
)

// Source is where a declaration came from. What each source applied is
// recorded with it, and applying a declaration removes only what its own
// source applied earlier.
type Source string

// The three sources.
const (
	Link   Source = "link"
	Bundle Source = "bundle"
	Local  Source = "local"
)

// Claim is one declared resource that holds an entry.
type Claim struct {
	Source Source `json:"source"`
	Module string `json:"module"`
	ID     string `json:"id"`
}

// Key is "source:module.id".
func (c Claim) Key() string { return string(c.Source) + ":" + c.Module + "." + c.ID }

// Original is what the host found before it first changed a thing, kept so
// that undeclaring gives it back (ADR 0118).
type Original struct {
	Kind   string `json:"kind"`             // "file", "directory", "service"
	Digest string `json:"digest,omitempty"` // sha256 of a file's content, kept in originals/
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	// A unit as the host first found it (ADR 0118): running or not, and
	// its enablement at boot.
	Running bool   `json:"running,omitempty"`
	Enabled string `json:"enabled,omitempty"`
	// EnabledSet: Enabled was recorded, the first time a declaration set
	// the unit's enablement (before that the host never touched it, and
	// an operator may change it freely). Records written before this
	// field recorded Enabled always.
	EnabledSet bool `json:"enabled_set,omitempty"`
	// Absent: the unit did not exist before the declaration that first
	// applied it (its unit file or its package came in that declaration):
	// the mesh gave it, and undeclaring takes it back (stopped, disabled).
	Absent bool `json:"absent,omitempty"`
}

// Entry is one thing on the machine the host holds.
type Entry struct {
	Target  string  `json:"target"` // shapes.Target: "path:/etc/motd"
	Type    string  `json:"type"`   // the shape
	Claims  []Claim `json:"claims"`
	Order   uint64  `json:"order"`             // when first applied; removal runs in reverse
	Created bool    `json:"created,omitempty"` // the host made it: undeclaring removes it
	Held    bool    `json:"held,omitempty"`    // found on an adopted node and held as found
	// Recovered: taken in from the control side's copy after the store was
	// lost. Removed when undeclared only if still exactly what the host
	// wrote (files by digest, directories when empty); anything else
	// recovered is forgotten, never removed.
	Recovered bool `json:"recovered,omitempty"`
	// Original is what was found, for a thing the host changed but did not make.
	Original *Original `json:"original,omitempty"`
	// What the host last applied and read back.
	Digest string `json:"digest,omitempty"`
	Mode   uint32 `json:"mode,omitempty"`
	UID    uint32 `json:"uid,omitempty"`
	GID    uint32 `json:"gid,omitempty"`
	// Paths an archive wrote.
	Paths []string `json:"paths,omitempty"`
	// Pending is an intent whose outcome was never recorded: the process
	// died between deciding and recording. It says what may have happened.
	Pending *Intent `json:"pending,omitempty"`
	// Stub marks an entry that exists only because of Pending.
	Stub bool `json:"stub,omitempty"`
}

// Claimed reports whether c holds e.
func (e *Entry) Claimed(c Claim) bool {
	for _, x := range e.Claims {
		if x == c {
			return true
		}
	}
	return false
}

// Intent is what the engine is about to do to a target.
type Intent struct {
	Op string `json:"op"` // "create", "change", "remove", "restore", "run"
	// Created: the target was absent when the intent was written, so if it
	// exists afterwards the host made it.
	Created  bool      `json:"created,omitempty"`
	Original *Original `json:"original,omitempty"`
	Claim    Claim     `json:"claim"`
	Type     string    `json:"type"`
	// Paths an archive may be about to write.
	Paths []string `json:"paths,omitempty"`
	// Digest is the entry's digest the change records once done: what it
	// may have set, for a kill that cuts it before its record (a unit's
	// state and enablement, which the give-back reads from the digest).
	// Releases before it pass it over and read the change as one that set
	// nothing known; the snapshot carries it from format v3 (snapshot.go).
	Digest string `json:"digest,omitempty"`
}

type record struct {
	N      uint64  `json:"n"`
	Op     string  `json:"op"` // intent, put, drop, abandon; begin, said, end, noted (unfinished.go)
	Target string  `json:"target"`
	Entry  *Entry  `json:"entry,omitempty"`
	Intent *Intent `json:"intent,omitempty"`
	// Lines is what an apply said of its changes ("said"); Began names
	// the apply ("begin"). Releases before them pass both over, and the
	// ops they come with (unfinished.go).
	Lines []shapes.Line `json:"lines,omitempty"`
	Began *Began        `json:"began,omitempty"`
	// PID is the process that began the apply ("begin"), for status to
	// tell the apply running now (the store lock's holder) from one cut
	// short. Releases before it pass it over.
	PID int `json:"pid,omitempty"`
	// Format is the record's format, absent in format 1 (journalFormat),
	// which every release so far wrote: a later format writes it, and a
	// reader refuses a format past its own rather than replay a record it
	// would misread.
	Format int `json:"format,omitempty"`
}

// journalFormat is the journal's format: the newest a record may carry.
// Format 1 leaves the field out, so no byte is added to every record,
// and the releases before the field read the journal as they always did.
const journalFormat = 1

// Store is the open state directory. It is not safe for concurrent use; the
// lock makes sure one process applies at a time.
type Store struct {
	dir     string
	entries map[string]*Entry
	n       uint64 // last record number
	order   uint64
	journal *os.File
	jsize   int64
	nrec    int
	buf     bytes.Buffer
	dirty   bool // records written since the last Commit
	// unsynced: state files written since the last Sync.
	unsynced bool
	// seen identifies the snapshot and journal as loaded.
	seen [2]fileID
	lock *os.File
	// legacyLock is the "lock" file of earlier builds, when there is one.
	legacyLock *os.File
	// unfinished: the applies begun in the journal and not ended;
	// said: the lines kept for the next record (unfinished.go).
	unfinished []unfinished
	said       []shapes.Line
	// intentBegun: for each intent pending, the begin record of the
	// apply that wrote it (unfinished.go).
	intentBegun map[string]uint64
	// torn: a journal write was cut short and could not be taken back;
	// nothing more is appended after it (write).
	torn bool
}

// CompactAfter is how many journal records trigger a snapshot.
var CompactAfter = 20000

// Open opens (creating if missing) the state directory dir for reading.
// Writing requires Lock.
func Open(dir string) (*Store, error) {
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, entries: map[string]*Entry{}}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Peek opens dir for reading and creates nothing: the read-only commands
// (status, owned, plan, briefing, inventory) use it, so that looking at a
// machine leaves no trace on it. A dir that does not exist reads as an
// empty store (exists false), which cannot be locked, so nothing is
// written through it either.
func Peek(dir string) (s *Store, exists bool, err error) {
	s = &Store{dir: dir, entries: map[string]*Entry{}}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err := checkDir(dir); err != nil {
		return nil, true, err
	}
	if err := s.load(); err != nil {
		return nil, true, err
	}
	return s, true, nil
}

// ensureDir creates dir 0700 if missing and refuses one that another user
// could write or that is reached through a link.
func ensureDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("store: create parent of %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("store: create %s: %w", dir, err)
	}
	return checkDir(dir)
}

// kindOfMode names what a file mode says a path is, as a person says it.
func kindOfMode(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file (" + m.Type().String() + ")"
}

// checkDir refuses a state directory that another user could write or
// that is reached through a link.
func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("store: %s is not a directory (a %s)", dir, kindOfMode(fi.Mode()))
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("store: %s is owned by uid %d, not by the executor (uid %d)", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("store: %s has mode %04o; the executor's state is private (0700)", dir, fi.Mode().Perm())
	}
	return nil
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// ErrBusy is returned by Lock when another applier holds the lock.
var ErrBusy = errors.New("store: another apply is running (the executor daemon or a rescue command)")

// Lock takes the one-applier lock, waiting up to wait for it. It opens the
// journal for appending.
//
// The lock is flock(2) on the state directory itself: nothing to create on
// a new node. A "lock" file in the directory is locked too when it is
// there, so a build that locks that file instead, still running beside
// this one, is kept out as well.
func (s *Store) Lock(wait time.Duration) error {
	deadline := clock.Deadline(wait)
	f, err := lockPath(s.dir, false, deadline)
	if err != nil {
		return err
	}
	if legacy, err := lockPath(filepath.Join(s.dir, "lock"), true, deadline); err != nil {
		f.Close()
		return err
	} else if legacy != nil {
		s.legacyLock = legacy
	}
	s.lock = f
	// Another process may have written since we loaded: load again, now
	// locked, unless the files are exactly as they were.
	if s.seen != s.identity() {
		s.entries, s.n, s.order, s.nrec = map[string]*Entry{}, 0, 0, 0
		s.unfinished, s.said, s.intentBegun = nil, nil, nil
		if err := s.load(); err != nil {
			s.Unlock()
			return err
		}
	}
	j, err := os.OpenFile(filepath.Join(s.dir, "journal"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		s.Unlock()
		return fmt.Errorf("store: open journal: %w", err)
	}
	s.journal = j
	// Cut a torn tail (a crash mid-write) so new records follow a whole one.
	if fi, err := j.Stat(); err == nil && fi.Size() > s.jsize {
		if err := j.Truncate(s.jsize); err != nil {
			s.Unlock()
			return fmt.Errorf("store: cut torn journal tail: %w", err)
		}
	}
	s.torn = false
	// Salvaged content past SalvageKeep goes now, on every apply, not only
	// when something else is salvaged. Not a reason to refuse the apply if
	// it cannot: the next Lock tries again.
	_ = s.expireSalvaged()
	return nil
}

// lockPath opens p (the state directory, or an optional file in it)
// without following a link and takes an exclusive flock on it, trying
// until deadline. An optional file that is not there is no lock: nil.
func lockPath(p string, optional bool, deadline time.Time) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !optional {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Open(p, flags, 0)
	if err != nil {
		if optional && err == unix.ENOENT {
			return nil, nil
		}
		return nil, fmt.Errorf("store: lock %s: %w", p, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return os.NewFile(uintptr(fd), p), nil
		}
		if err != unix.EWOULDBLOCK || clock.Past(deadline) {
			if err == unix.EWOULDBLOCK {
				pid := statedir.FlockHolder(fd)
				unix.Close(fd)
				if pid > 0 {
					return nil, fmt.Errorf("%w: pid %d holds %s", ErrBusy, pid, p)
				}
				return nil, ErrBusy
			}
			unix.Close(fd)
			return nil, fmt.Errorf("store: lock %s: %w", p, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// LockHolder is the pid of the applier holding dir's lock now (the
// daemon's apply or a rescue command's), 0 when none does or it cannot
// tell: for a reader (status, owned) to tell an apply running from one
// cut short.
func LockHolder(dir string) int {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	return statedir.FlockHolder(fd)
}

// Unlock closes the journal and releases the lock.
func (s *Store) Unlock() {
	if s.journal != nil {
		s.journal.Close()
		s.journal = nil
	}
	if s.legacyLock != nil {
		s.legacyLock.Close()
		s.legacyLock = nil
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

// fileID is what tells that a state file changed: inode, size, mtime.
type fileID struct {
	ino, size int64
	mtime     int64
}

func statID(p string) fileID {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return fileID{}
	}
	return fileID{int64(st.Ino), st.Size, st.Mtim.Nano()}
}

func (s *Store) identity() [2]fileID {
	return [2]fileID{statID(filepath.Join(s.dir, snapshotName)), statID(filepath.Join(s.dir, "journal"))}
}

func (s *Store) load() error {
	s.seen = s.identity()
	// The journal is read before the snapshot: a reader without the lock
	// (Peek: the rescue command's owned and status, a plan) may meet the
	// daemon compacting — a new snapshot renamed in, then the journal
	// emptied. Read in this order, a compaction in between leaves a
	// journal whose records the newer snapshot already holds (skipped by
	// their number); read the other way, an old snapshot and an emptied
	// journal made a store that had lost the last apply.
	jpath := filepath.Join(s.dir, "journal")
	journal, jerr := os.ReadFile(jpath)
	if jerr != nil && !errors.Is(jerr, os.ErrNotExist) {
		return fmt.Errorf("store: %w", jerr)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, snapshotName))
	switch {
	case err == nil:
		snap, err := decodeSnapshot(data)
		if errors.Is(err, errSnapshotV1) {
			// No release wrote v1, so there is nothing to convert from:
			// the host's things come back as after a lost store.
			return fmt.Errorf("%w: move %s aside, then re-enrol the node (the control side hands back what the host owned) or apply again", err, s.dir)
		}
		if err != nil {
			return err
		}
		s.n, s.order = snap.LastN, snap.Order
		if len(s.entries) == 0 {
			// Sized once for the snapshot and some journal, rather than
			// grown step by step on every load.
			s.entries = make(map[string]*Entry, len(snap.Entries)+len(snap.Entries)/8+16)
		}
		for _, e := range snap.Entries {
			s.entries[e.Target] = e
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("store: %w", err)
	}
	if jerr != nil {
		return nil // no journal
	}
	good, err := s.replayJournal(journal)
	s.jsize = int64(good)
	return err
}

// replayJournal applies the whole records at the start of data and returns
// how many bytes they take. It stops at the first torn record, and fails
// at a record of a later format, and at one damaged where a power cut
// cannot have torn it: Lock cuts the journal after the last good record,
// which must never take a later release's records, nor whole records
// past a damaged one, for a torn tail.
func (s *Store) replayJournal(data []byte) (int, error) {
	good := 0
	for off := 0; off < len(data); {
		nl := bytes.IndexByte(data[off:], '\n')
		if nl < 0 {
			break // torn: the last write did not finish
		}
		rec, ok := decodeRecord(data[off : off+nl])
		if !ok {
			if err := damagedAt(data, off, nl, s.dir); err != nil {
				return good, err
			}
			break
		}
		if rec.N > s.n {
			if rec.Format > journalFormat {
				return good, fmt.Errorf("store: journal record %d is in format v%d, written by a later release; this executor reads formats up to v%d: run that release, or move %s aside and re-enrol the node", rec.N, rec.Format, journalFormat, s.dir)
			}
			s.replay(rec)
			s.n = rec.N
		}
		off += nl + 1
		good = off
		s.nrec++
	}
	return good, nil
}

// damagedAt says whether the record that does not read at data[off:],
// nl bytes to its newline, is damage rather than a tear. A power cut tears
// the records written since the last sync — every one before it is on
// disk —, and leaves of them a record cut short or blocks that read as
// zeros, with what was written after them maybe on disk past those: a
// line holding a NUL byte. A whole line without one that does not read,
// with a record that reads after it, is none of that — a disk's damage, or
// a hand's — and the records after it are whole: cutting them as a torn
// tail would forget what the host made (taken again for found, never
// removed). It is refused, the journal left as it is.
func damagedAt(data []byte, off, nl int, dir string) error {
	if bytes.IndexByte(data[off:off+nl], 0) >= 0 {
		return nil
	}
	for next := off + nl + 1; next < len(data); {
		end := bytes.IndexByte(data[next:], '\n')
		if end < 0 {
			return nil
		}
		if rec, ok := decodeRecord(data[next : next+end]); ok {
			return fmt.Errorf("store: the journal is damaged at byte %d (a whole line that does not read, record %d and others whole after it): not a write a power cut tore, and the records after it are not cut; restore %s from a backup, or move it aside and enrol the node again (the control side hands back what it last reported owning)", off, rec.N, dir)
		}
		next += end + 1
	}
	return nil
}

// encodeRecord frames a record as "crc32hex json\n".
func encodeRecord(buf *bytes.Buffer, r *record) error {
	js := appendRecordJSON(make([]byte, 0, 512), r)
	var crc [8]byte
	hex.Encode(crc[:], binaryBE(crc32.ChecksumIEEE(js)))
	buf.Write(crc[:])
	buf.WriteByte(' ')
	buf.Write(js)
	buf.WriteByte('\n')
	return nil
}

func binaryBE(v uint32) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

func decodeRecord(line []byte) (*record, bool) {
	if len(line) < 10 || line[8] != ' ' {
		return nil, false
	}
	want, err := strconv.ParseUint(string(line[:8]), 16, 32)
	if err != nil || crc32.ChecksumIEEE(line[9:]) != uint32(want) {
		return nil, false
	}
	var r record
	if json.Unmarshal(line[9:], &r) != nil {
		// Whole (its checksum holds) yet not a record of this release's:
		// one of a later format, whose fields may have changed, is named
		// as such rather than taken for a torn tail and cut.
		var later struct {
			N      uint64 `json:"n"`
			Format int    `json:"format"`
		}
		if json.Unmarshal(line[9:], &later) == nil && later.Format > journalFormat {
			return &record{N: later.N, Format: later.Format}, true
		}
		return nil, false
	}
	return &r, true
}

func (s *Store) replay(r *record) {
	// A record that checksums but makes no sense is ignored rather than
	// trusted; only the executor writes here, so it means a bug, not input.
	if (r.Op == "intent" && r.Intent == nil) || (r.Op == "put" && (r.Entry == nil || r.Entry.Target != r.Target)) {
		return
	}
	switch r.Op {
	case "intent":
		if r.Entry != nil && r.Entry.Target == r.Target {
			// The entry as settled after a cut intent (IntendOver).
			if r.Entry.Order > s.order {
				s.order = r.Entry.Order
			}
			s.entries[r.Target] = r.Entry
		}
		e := s.entries[r.Target]
		if e == nil {
			e = &Entry{Target: r.Target, Type: r.Intent.Type, Stub: true, Claims: []Claim{r.Intent.Claim}}
			s.entries[r.Target] = e
		}
		e.Pending = r.Intent
		if n := len(s.unfinished); n > 0 {
			if s.intentBegun == nil {
				s.intentBegun = map[string]uint64{}
			}
			s.intentBegun[r.Target] = s.unfinished[n-1].N
		} else {
			delete(s.intentBegun, r.Target)
		}
	case "put":
		if r.Entry.Order > s.order {
			s.order = r.Entry.Order
		}
		s.entries[r.Target] = r.Entry
		delete(s.intentBegun, r.Target)
	case "drop":
		delete(s.entries, r.Target)
		delete(s.intentBegun, r.Target)
	case "abandon":
		delete(s.intentBegun, r.Target)
		if e := s.entries[r.Target]; e != nil {
			if e.Stub {
				delete(s.entries, r.Target)
			} else {
				e.Pending = nil
			}
		}
	case "begin":
		if r.Began != nil {
			s.unfinished = append(s.unfinished, unfinished{Began: *r.Began, N: r.N, PID: r.PID})
		}
	case "said":
		if n := len(s.unfinished); n > 0 {
			s.unfinished[n-1].Lines = append(s.unfinished[n-1].Lines, r.Lines...)
		}
	case "end":
		if n := len(s.unfinished); n > 0 {
			s.unfinished = s.unfinished[:n-1]
		}
	case "noted":
		s.unfinished = nil
	}
}

func (s *Store) append(r *record) error {
	if s.journal == nil {
		return errors.New("store: not locked for writing")
	}
	return s.write(r)
}

// write puts the lines Said kept, if any, and r (nil: the lines alone)
// into the journal in one write(2): it reaches the page cache at once and
// survives the process being killed; Commit makes it durable. A write that
// fails, or is cut short (a full disk), is taken back whole: the journal is
// cut to where it was, so that records written once there is room again
// never follow a torn one (a reader stops at the first torn record, and
// Lock cuts what follows it). Nothing is replayed of what was not written,
// and the lines stay kept for the next write.
func (s *Store) write(r *record) error {
	if s.torn {
		return errors.New("store: the journal holds a write cut short that could not be taken back; apply again once the disk has room")
	}
	s.buf.Reset()
	n0, nrec0 := s.n, s.nrec
	var said *record
	if len(s.said) > 0 {
		s.n++
		said = &record{N: s.n, Op: "said", Lines: s.said}
		if err := encodeRecord(&s.buf, said); err != nil {
			s.n = n0
			return fmt.Errorf("store: encode: %w", err)
		}
		s.nrec++
	}
	if r != nil {
		s.n++
		r.N = s.n
		if err := encodeRecord(&s.buf, r); err != nil {
			s.n, s.nrec = n0, nrec0
			return fmt.Errorf("store: encode: %w", err)
		}
		s.nrec++
	}
	n, err := s.journal.Write(s.buf.Bytes())
	if err != nil {
		s.n, s.nrec = n0, nrec0
		if n > 0 {
			// jsize stays the whole records' end: the next Lock cuts
			// the journal there when this cannot.
			if s.journal.Truncate(s.jsize) != nil {
				s.torn = true
			}
		}
		return fmt.Errorf("store: append to journal: %w", err)
	}
	s.jsize += int64(n)
	s.dirty = true
	if said != nil {
		s.replay(said)
		s.said = nil
	}
	if r != nil {
		s.replay(r)
	}
	return nil
}

// Intend records what is about to be done to target, before it is done.
//
// An intent written over one that never settled on a stub (the entry is
// there only for it: the change failed, or died, before anything was
// recorded of the target) keeps what that first one knew of the target
// before the host touched it — that it was absent, so whatever is there
// is the host's; what was found there — which no later look can tell: a
// thing the failed change half made looks found to it. Without this, a
// directory whose creation failed twice (a full disk) was taken for found
// once made, and never removed.
func (s *Store) Intend(target string, in Intent) error {
	if e := s.entries[target]; e != nil && e.Stub && e.Pending != nil {
		in.Created = in.Created || e.Pending.Created
		if e.Pending.Original != nil {
			in.Original = e.Pending.Original
		}
	}
	return s.append(&record{Op: "intent", Target: target, Intent: &in})
}

// IntendOver is Intend for a target whose last intent a kill cut, once
// the engine has settled it: settled is the entry as it reads after that
// cut (what the cut change may have made kept). It is recorded in the
// intent's own record, so a second kill before this change's record
// settles it against what the first change may have made — not against
// the entry as it was before both — and no kill between two writes can
// leave the settled entry claimed as done with no intent over it.
// Releases before it pass the entry over and read a plain intent.
func (s *Store) IntendOver(target string, settled *Entry, in Intent) error {
	k := *settled
	k.Pending, k.Stub = nil, false
	if k.Order == 0 {
		s.order++
		k.Order = s.order
	}
	return s.append(&record{Op: "intent", Target: target, Intent: &in, Entry: &k})
}

// Abandon records that an intent was not carried out: nothing changed.
func (s *Store) Abandon(target string) error {
	if e := s.entries[target]; e == nil || e.Pending == nil {
		return nil
	}
	return s.append(&record{Op: "abandon", Target: target})
}

// Put records e as applied and read back. A new entry gets the next order.
func (s *Store) Put(e *Entry) error {
	e.Pending, e.Stub = nil, false
	if e.Order == 0 {
		s.order++
		e.Order = s.order
	}
	return s.append(&record{Op: "put", Target: e.Target, Entry: e})
}

// Drop records that target no longer holds anything of the host's.
func (s *Store) Drop(target string) error {
	return s.append(&record{Op: "drop", Target: target})
}

// Commit ends a group of records: it compacts the journal into the
// snapshot when the journal has grown.
//
// It does not sync. Intents are made durable by Sync before the change
// they announce, and what an applied record says can be found again from
// its intent and the machine: a power loss that takes an applied record
// leaves its intent pending, and the next apply settles it by looking. So
// an applied record becomes durable with the next Sync or compaction, and
// an apply costs two syncs (intents before, changes after), not three.
func (s *Store) Commit() error {
	if s.journal == nil {
		return errors.New("store: not locked for writing")
	}
	// Compact when the journal outgrows what it describes: loading a
	// snapshot is one record per entry, replaying a journal is several.
	// Never while an apply is begun and not ended, this one or one cut
	// short and not yet noted (unfinished.go): the snapshot holds the
	// entries, not what an apply said, and the records past its number
	// are all a reader replays, so the begin and what was said before it
	// would be gone. The journal then grows by one apply's records, and
	// is compacted at that apply's end.
	if len(s.unfinished) > 0 {
		return nil
	}
	if s.nrec >= CompactAfter || s.nrec > len(s.entries)+256 {
		return s.Compact()
	}
	return nil
}

// Compact writes the snapshot atomically and empties the journal. A crash
// between the two is harmless: records at or below the snapshot's last
// number are skipped when the journal is read again.
func (s *Store) Compact() error {
	data := encodeSnapshot(&snapshot{Version: snapshotVersion, LastN: s.n, Order: s.order, Entries: s.Entries()})
	if err := WriteFileAtomic(filepath.Join(s.dir, snapshotName), data); err != nil {
		return err
	}
	if err := s.journal.Truncate(0); err != nil {
		return fmt.Errorf("store: empty journal: %w", err)
	}
	s.jsize, s.nrec = 0, 0
	return s.journal.Sync()
}

// Entries returns every entry in the order it was first applied.
func (s *Store) Entries() []*Entry {
	out := make([]*Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Order != out[j].Order {
			return out[i].Order < out[j].Order
		}
		return out[i].Target < out[j].Target
	})
	return out
}

// Get returns the entry for target, or nil.
func (s *Store) Get(target string) *Entry { return s.entries[target] }

// KeepOriginal stores a found file's content under its digest before the
// host changes it, fsync'd before it is named: a power cut must not leave
// an empty file under a digest. One already there is kept only if it
// really holds that digest.
func (s *Store) KeepOriginal(digest string, data []byte) error {
	p := filepath.Join(s.dir, "originals", digest)
	if got, err := os.ReadFile(p); err == nil && sha256Hex(got) == digest {
		return nil
	}
	// originals/ is made the first time the host keeps something, not for
	// every node that never does. Sync makes its name durable with the
	// original's.
	if err := os.Mkdir(filepath.Dir(p), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("store: keep original: %w", err)
	}
	f, err := os.OpenFile(p+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("store: keep original: %w", err)
	}
	// A write cut short (a full disk) must fail the keeping, and with it
	// the change: an original named after a copy cut short would say
	// kept what is lost.
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	if err != nil {
		os.Remove(p + ".tmp")
		return fmt.Errorf("store: keep original: %w", err)
	}
	s.unsynced = true
	return nil
}

// Original reads a kept original back, and refuses one that does not hold
// its digest: putting back garbage would be worse than saying so.
func (s *Store) Original(digest string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "originals", digest))
	if err != nil {
		return nil, fmt.Errorf("store: kept original %s: %w", digest, err)
	}
	if got := sha256Hex(data); got != digest {
		return nil, fmt.Errorf("store: kept original %s is damaged (it hashes to %s); not put back", digest, got)
	}
	return data, nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ForgetOriginal removes a kept original nobody refers to any more. The
// caller makes the records that stopped referring to it durable first
// (Sync): otherwise a power cut could bring back a pending restore whose
// original is gone.
func (s *Store) ForgetOriginal(digest string) { s.forgetOriginal(digest, false) }

// forgetOriginal is ForgetOriginal; pruning says it is the salvaged list
// that lets go of digest (which then no longer counts it).
func (s *Store) forgetOriginal(digest string, pruning bool) {
	if !pruning {
		for _, x := range s.Salvaged() {
			if x.Digest == digest {
				return
			}
		}
	}
	for _, e := range s.entries {
		if e.Original != nil && e.Original.Digest == digest {
			return
		}
		if e.Pending != nil && e.Pending.Original != nil && e.Pending.Original.Digest == digest {
			return
		}
	}
	os.Remove(filepath.Join(s.dir, "originals", digest))
}

// Target returns the saved target declaration of a source, or nil.
func (s *Store) Target(src Source) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "target-"+string(src)+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// SaveTarget saves the declaration a source is about to apply, so a reboot
// mid-apply resumes it rather than the one before. Saving the same bytes
// again writes nothing. The file is renamed into place but not fsync'd
// here: Sync, which the engine calls before the caller's floor moves past
// it and before its first change, makes it durable with the intents.
func (s *Store) SaveTarget(src Source, data []byte) error {
	// Compared a piece at a time (fsx.Equal), not read whole: the target
	// is looked at on every apply, and a large one would cost its size in
	// fresh memory each time. Any doubt (unreadable) writes it again.
	p := filepath.Join(s.dir, "target-"+string(src)+".json")
	if same, _, err := fsx.Equal(p, data); err == nil && same {
		return nil
	}
	if err := os.WriteFile(p+".tmp", data, 0o600); err != nil {
		return fmt.Errorf("store: save target: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("store: save target: %w", err)
	}
	s.unsynced = true
	return nil
}

// Sync makes everything written to the state directory so far durable with
// one syncfs: the target, kept originals and the journal's intents. The
// engine calls it before it changes the machine.
func (s *Store) Sync() error {
	if err := s.FlushSaid(); err != nil {
		return err
	}
	if !s.dirty && !s.unsynced {
		return nil
	}
	if err := unix.Syncfs(int(s.journal.Fd())); err != nil {
		return fmt.Errorf("store: syncfs: %w", err)
	}
	s.dirty, s.unsynced = false, false
	return nil
}

// WriteFileAtomic writes a private state file: temp, fsync, rename, fsync
// of the directory.
func WriteFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	w := bufio.NewWriter(f)
	w.Write(data)
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("store: write %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("store: fsync %s: %w", p, err)
	}
	f.Close()
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	d, err := os.Open(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer d.Close()
	return d.Sync()
}

// SaveReport keeps a summary of the last report of a source — its
// sequence, outcome and how many lines had each outcome — for status and
// the heartbeat. It is a convenience, not a record: it is not synced, and
// the journal, not this, is what the host holds. (The lines themselves go
// to whoever asked for the apply.)
//
// An apply that did something (shapes.Did) is also kept in the history,
// with its trigger (History): what the node did while its link was down.
//
// A refused declaration applied nothing: the summary stays the last
// apply's, so that status names what the machine holds (the refusal is in
// the verdict and the daemon's log).
func (s *Store) SaveReport(src Source, trigger string, rep *shapes.Report) error {
	if rep.Outcome == shapes.Refused {
		return nil
	}
	for _, a := range shapes.ActivitiesOf(rep, clock.Now().UTC(), string(src), trigger) {
		s.note(a)
	}
	sum := ReportSummary{Source: rep.Source, Seq: rep.Seq, Outcome: rep.Outcome, Lines: map[shapes.Outcome]int{}}
	for _, l := range rep.Lines {
		sum.Lines[l.Outcome]++
	}
	data := jsonSummary(nil, &sum)
	p := filepath.Join(s.dir, "report-"+string(src)+".json")
	err := os.WriteFile(p+".tmp", data, 0o600)
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	if err != nil {
		os.Remove(p + ".tmp")
		// A full disk: written over the last in place, in the blocks it
		// holds already (a summary is far smaller than one), so that
		// status does not name an older apply as the last one — what a
		// declaration applied on a disk that filled during it would
		// otherwise say until the next apply.
		if ierr := overwriteInPlace(p, data); ierr != nil {
			return fmt.Errorf("store: save report: %w", err)
		}
	}
	return nil
}

// KeepReport is SaveReport with the history's note durable: what an apply
// whose report reaches the control side through the history alone (a
// start, a drift repaired, a rescue) says is on disk before the journal
// says the apply ended (engine.Options.Keep).
func (s *Store) KeepReport(src Source, trigger string, rep *shapes.Report) error {
	err := s.SaveReport(src, trigger, rep)
	if _, _, did := shapes.Did(rep); did {
		if serr := SyncHistory(s.dir); serr != nil && err == nil {
			err = serr
		}
	}
	return err
}

// overwriteInPlace writes data over the file at p from its start, padded
// with spaces (JSON's whitespace) to the length it had, without truncating
// it: no block is freed or needed while data fits in those it holds.
func overwriteInPlace(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if pad := int(fi.Size()) - len(data); pad > 0 {
		data = append(data, bytes.Repeat([]byte{' '}, pad)...)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.Sync()
}

// ReportSummary is what SaveReport keeps.
type ReportSummary struct {
	Source  string                 `json:"source"`
	Seq     uint64                 `json:"seq"`
	Outcome shapes.Outcome         `json:"outcome"`
	Lines   map[shapes.Outcome]int `json:"lines"`
}

// Report returns the last report of a source, or nil.
func (s *Store) Report(src Source) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "report-"+string(src)+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// RestartsOwed is, for src, the units a restart_on owes a restart to
// (each with the files that changed) that an apply stopped or failed
// before it could give: restarts-owed.json, nil when none.
func (s *Store) RestartsOwed(src Source) map[string][]string {
	f, _ := readOwed(s.dir)
	return f.Owed[string(src)]
}

// CutChanged is the "module.id" of every change an apply of src a kill or
// a power cut ended had said (the journal keeps what it said, and nothing
// of the restarts it owed): kept in restarts-owed.json by the Begin that
// noted the cut apply, until an apply of src has given its restarts
// (SetRestartsOwed); with unnoted, those of the applies not noted yet too
// (a plan's: what its apply's Begin will note). The first apply after a
// cut notes every source's cut applies, while each source's restarts are
// given by an apply of its own. An apply asks without unnoted: ones its
// Begin could not note (a history that cannot be written) are noted, and
// given, by a later apply — counted now, they would be given again at
// every apply until then.
func (s *Store) CutChanged(src Source, unnoted bool) map[string]bool {
	f, _ := readOwed(s.dir)
	out := map[string]bool{}
	for _, k := range f.Cut[string(src)] {
		out[k] = true
	}
	if unnoted {
		for k := range s.unfinishedChanges()[string(src)] {
			out[k] = true
		}
	}
	return out
}

// unfinishedChanges is, by source, the "module.id" of every change the
// applies begun and not ended said.
func (s *Store) unfinishedChanges() map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, u := range s.unfinished {
		for _, l := range u.Lines {
			if !l.Outcome.Changes() {
				continue
			}
			if out[string(u.Source)] == nil {
				out[string(u.Source)] = map[string]bool{}
			}
			out[string(u.Source)][l.Module+"."+l.ID] = true
		}
	}
	return out
}

// keepCutChanges adds the changes the unended applies said to what
// restarts-owed.json keeps by source (CutChanged), durably, before Begin
// notes them and the journal forgets them.
func (s *Store) keepCutChanges() error {
	changes := s.unfinishedChanges()
	if len(changes) == 0 {
		return nil
	}
	f, _, err := readOwedToWrite(s.dir)
	if err != nil {
		return err
	}
	for src, keys := range changes {
		for k := range keys {
			if !slices.Contains(f.Cut[src], k) {
				f.Cut[src] = append(f.Cut[src], k)
			}
		}
		slices.Sort(f.Cut[src])
	}
	return writeOwed(s.dir, f)
}

// SetRestartsOwed replaces src's restarts owed (none: nil or empty); the
// changes of src's cut applies (CutChanged) are given with them.
func (s *Store) SetRestartsOwed(src Source, owed map[string][]string) (err error) {
	f, aside, err := readOwedToWrite(s.dir)
	if err != nil {
		return err
	}
	defer func() {
		if aside != nil && err == nil {
			err = aside
		}
	}()
	if len(owed) == 0 {
		delete(f.Owed, string(src))
	} else {
		f.Owed[string(src)] = owed
	}
	delete(f.Cut, string(src))
	return writeOwed(s.dir, f)
}

// OwedAside is the name an unreadable restarts-owed.json is moved to.
const OwedAside = "restarts-owed.json.unread"

// ErrOwedAside is SetRestartsOwed's word, its write done, that the file it
// replaced did not read and was moved aside (OwedAside): what it owed any
// source is lost to the host, and kept there for a person.
var ErrOwedAside = errors.New("restarts-owed.json did not read: moved aside to " + OwedAside + " (what it owed is no longer given); written anew")

// readOwedToWrite is readOwed for a writer: a file that does not read is
// moved aside (OwedAside, over an older one) and the writer starts from
// none — left in place, it would keep every later write from keeping
// anything, and the cut applies it keeps unnoted given again at every
// apply. aside says that happened.
func readOwedToWrite(dir string) (f owedFile, aside, err error) {
	f, rerr := readOwed(dir)
	if rerr == nil {
		return f, nil, nil
	}
	p := filepath.Join(dir, "restarts-owed.json")
	if _, serr := os.Lstat(p); serr != nil {
		return f, nil, fmt.Errorf("store: restarts-owed.json: %w", rerr) // not there to move: unreadable as a path
	}
	if err := os.Rename(p, filepath.Join(dir, OwedAside)); err != nil {
		return f, nil, fmt.Errorf("store: restarts-owed.json does not read (%v), and could not be moved aside: %w", rerr, err)
	}
	return f, fmt.Errorf("%w (%v)", ErrOwedAside, rerr), nil
}

// writeOwed writes restarts-owed.json, durably, or removes it when it
// holds nothing — the removal durable too, or the restarts it owed come
// back after a power cut.
func writeOwed(dir string, f owedFile) error {
	p := filepath.Join(dir, "restarts-owed.json")
	if len(f.Owed) == 0 && len(f.Cut) == 0 {
		if err := os.Remove(p); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		d, err := os.Open(dir)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		defer d.Close()
		return d.Sync()
	}
	f.Format = owedFormat
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return WriteFileAtomic(p, data)
}

// owedFile is restarts-owed.json. A later format is read as far as this
// release knows it: it drives a restart at most, never an apply.
type owedFile struct {
	Format int                            `json:"format"`
	Owed   map[string]map[string][]string `json:"owed"`
	// Cut is CutChanged's part kept, by source.
	Cut map[string][]string `json:"cut,omitempty"`
}

const owedFormat = 1

// readOwed is restarts-owed.json, empty when there is none; one that
// does not read is empty too (a restart owed lost is the behaviour before
// it was kept), said by err so that it is not written over.
func readOwed(dir string) (owedFile, error) {
	var f owedFile
	var err error
	if data, rerr := os.ReadFile(filepath.Join(dir, "restarts-owed.json")); rerr == nil {
		err = json.Unmarshal(data, &f)
	} else if !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if err != nil {
		f = owedFile{}
	}
	if f.Owed == nil {
		f.Owed = map[string]map[string][]string{}
	}
	if f.Cut == nil {
		f.Cut = map[string][]string{}
	}
	return f, err
}

// SaveBriefing keeps the briefing of the last apply on an adopted node.
func (s *Store) SaveBriefing(b *shapes.Briefing) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(s.dir, "briefing.json"), data)
}

// Briefing returns the kept briefing, or nil.
func (s *Store) Briefing() (*shapes.Briefing, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "briefing.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var b shapes.Briefing
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("store: briefing.json: %w", err)
	}
	return &b, nil
}
