package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// DefaultStateDir is the executor's state directory, where the launch state
// and (by default) the known-good copies live.
const DefaultStateDir = "/var/lib/mesh-host/executor"

// StateFile is the launch state's file in the state directory.
const StateFile = "launch.json"

// KnownGoodDir is the known-good directory's name in the state directory,
// unless Config.KnownGood says otherwise.
const KnownGoodDir = "known-good"

// RunLockFile, in the state directory, is the supervising launcher's lock
// (lockRun): one `mesh-launch` per state directory, held for its life.
const RunLockFile = "launcher.lock"

const (
	lockFile     = "launch.lock"
	maxStateSize = 1 << 20
	// maxKept bounds the start times kept, whatever the policy.
	maxKept = 1000
	// lockWait is how long a writer waits for another one.
	lockWait = 30 * time.Second
)

// State is the launch state, StateFile's content:
//
//	{
//	  "starts": ["2026-05-01T10:00:00.1Z", ...],   start attempts since the last healthy report
//	  "rolled_back": {"at": ..., "reason": ..., "reinstalled": true},
//	  "last_rollback": {"at": ..., "reason": ..., "reinstalled": true},
//	  "halted": {"at": ..., "reason": ...},
//	  "healthy_at": ...,                            the last Healthy
//	  "known_good": {"at": ..., "binaries": {"mesh-executor": "<sha256>"}},
//	  "known_good_dir": "/var/lib/mesh-host/executor/known-good",
//	  "agent": {"starts": [...], "proven": "<sha256>", "proven_at": ...},
//	  "format": 1
//	}
//
// Times are UTC. Every field may be absent; a missing file is the zero
// State.
type State struct {
	// Starts are the start attempts not yet followed by a healthy report;
	// Decide keeps only those within the window.
	Starts []time.Time `json:"starts,omitempty"`
	// RolledBack is the rollback mark: set (before the reinstall) when the
	// launcher rolls back, or by `mesh-launch agent-start` when the agent
	// of an upgrade crash-loops (then the running launcher acts on it);
	// cleared only by Healthy, once the reinstall is done.
	RolledBack *RollbackMark `json:"rolled_back,omitempty"`
	// LastRollback is the last rollback whose reinstall finished. It is
	// the record and RolledBack the decision: Healthy clears the mark
	// once the release reinstalled reconciles (a later release may be
	// rolled back once in its turn), and status, reading the mark alone,
	// said "rolled back: no" of a node just rolled back. Nothing clears
	// it; the next rollback replaces it.
	LastRollback *RollbackMark `json:"last_rollback,omitempty"`
	// Halted is set when the launcher gives up; only Clear clears it.
	Halted *Mark `json:"halted,omitempty"`
	// HealthyAt is when the executor last reported a reconcile run to its end.
	HealthyAt time.Time `json:"healthy_at,omitzero"`
	// KnownGood is what Healthy last copied into the known-good directory.
	KnownGood *KnownGood `json:"known_good,omitempty"`
	// KnownGoodDir is the launcher's known-good directory, which Healthy
	// writes into (DefaultStateDir/known-good when empty).
	KnownGoodDir string `json:"known_good_dir,omitempty"`
	// Launcher is the launcher's own binary, as it runs: the executor
	// adds it to the protected set (with KnownGoodDir) wherever it is.
	Launcher string `json:"launcher,omitempty"`
	// Failed is the last release rolled back from; Healthy keeps it, and
	// only Clear drops it.
	Failed *FailedRelease `json:"failed_release,omitempty"`
	// Agent is the agent's starts and the binary last proven (agent.go).
	Agent *AgentLaunch `json:"agent,omitempty"`
	// Format is the file's format, stateFormat when written (absent, in
	// what releases before the field wrote: 1).
	Format int `json:"format,omitempty"`
}

// stateFormat is the launch state's format. The file is read in every
// format, a later one too, as far as this release knows it: the launcher
// is what rolls a node back, and the release it reinstalls must start on
// the state the failed one left. A later format that changes what a field
// means renames it.
const stateFormat = 1

// Mark is a dated decision and why it was taken.
type Mark struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// RollbackMark is the rollback mark. Reinstalled turns true once the
// known-good binaries are in place; a mark without it is a reinstall the
// launcher was stopped in the middle of, and finishes.
type RollbackMark struct {
	At          time.Time `json:"at"`
	Reason      string    `json:"reason"`
	Reinstalled bool      `json:"reinstalled"`
}

// KnownGood records what Healthy kept: each binary's SHA-256 (hex).
type KnownGood struct {
	At       time.Time         `json:"at"`
	Binaries map[string]string `json:"binaries"`
	// Package is the version of the host's package these binaries came
	// from, when the executor runs the installed package: a rollback
	// reinstalls it through the package manager.
	Package string `json:"package,omitempty"`
}

// FailedRelease is a release of the host's package the launcher rolled
// back from: the executor does not install it again until a declaration
// names another version or a person clears it (mesh-launch clear).
type FailedRelease struct {
	Version string    `json:"version"`
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
}

// clone is a deep copy, so Decide never changes its argument.
func (s State) clone() State {
	c := s
	c.Starts = append([]time.Time(nil), s.Starts...)
	if s.RolledBack != nil {
		r := *s.RolledBack
		c.RolledBack = &r
	}
	if s.LastRollback != nil {
		r := *s.LastRollback
		c.LastRollback = &r
	}
	if s.Halted != nil {
		h := *s.Halted
		c.Halted = &h
	}
	if s.Agent != nil {
		a := *s.Agent
		a.Starts = append([]time.Time(nil), s.Agent.Starts...)
		c.Agent = &a
	}
	if s.KnownGood != nil {
		k := *s.KnownGood
		k.Binaries = map[string]string{}
		for n, d := range s.KnownGood.Binaries {
			k.Binaries[n] = d
		}
		c.KnownGood = &k
	}
	return c
}

// errCorrupt marks a state file that is safe to read but does not parse.
var errCorrupt = errors.New("does not parse")

// ReadState reads the launch state in dir. It takes no lock: the file is
// only ever replaced by a rename, so a read sees one whole version. A
// missing file is the zero State; a file that is not regular, has more than
// one name, is owned by another user or writable by group or others is
// refused.
func ReadState(dir string) (State, error) {
	var s State
	p := filepath.Join(dir, StateFile)
	// O_NONBLOCK: a FIFO planted here must not hang the open.
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if errors.Is(err, unix.ELOOP) {
		return s, fmt.Errorf("launcher: %s is a symbolic link; refused", p)
	}
	if err != nil {
		return s, fmt.Errorf("launcher: %w", err)
	}
	defer f.Close()
	if err := checkOwnFile(f, p); err != nil {
		return s, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxStateSize+1))
	if err != nil {
		return s, fmt.Errorf("launcher: read %s: %w", p, err)
	}
	if len(data) > maxStateSize {
		return s, fmt.Errorf("launcher: %s is over %d bytes: %w", p, maxStateSize, errCorrupt)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return State{}, fmt.Errorf("launcher: %s %w (%v); a person has to look: mesh-launch clear rewrites it", p, errCorrupt, err)
	}
	return s, nil
}

// checkOwnFile refuses an open file that is not this user's own private
// regular file.
func checkOwnFile(f *os.File, p string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("launcher: stat %s: %w", p, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("launcher: %s is not a regular file (mode %#o); refused", p, st.Mode&unix.S_IFMT)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("launcher: %s is owned by uid %d, not by the launcher (uid %d); refused", p, st.Uid, os.Geteuid())
	case st.Nlink > 1: // 0 is a version replaced since it was opened: still whole
		return fmt.Errorf("launcher: %s has %d names (a hard link); refused", p, st.Nlink)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("launcher: %s has mode %04o: writable by others; refused", p, st.Mode&0o7777)
	}
	return nil
}

// checkDir makes sure dir is a private directory of this user, creating it
// 0700 (and its parents 0755) if create is set and it is missing.
func checkDir(dir string, create bool) error {
	if create {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("launcher: create the parent of %s: %w", dir, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("launcher: create %s: %w", dir, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("launcher: %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("launcher: %s is not a directory (mode %#o; a link is refused)", dir, st.Mode&unix.S_IFMT)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("launcher: %s is owned by uid %d, not by the launcher (uid %d)", dir, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("launcher: %s has mode %04o; it is private (0700)", dir, st.Mode&0o7777)
	}
	return nil
}

// writeState replaces the launch state atomically. Callers hold the lock.
func writeState(dir string, s State) error {
	s.Format = stateFormat
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	data = append(data, '\n')
	return atomicWrite(filepath.Join(dir, StateFile), 0o600, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// atomicWrite writes p through a fresh temporary file in the same
// directory (never following a link, never reusing a name someone else
// left): fill, chmod, fsync, rename over p, fsync of the directory.
func atomicWrite(p string, mode os.FileMode, fill func(*os.File) error) error {
	tmp, err := stage(p, mode, fill)
	if err != nil {
		return err
	}
	return commit(map[string]string{tmp: p})
}

// stage writes a whole, synced temporary file beside p and returns its
// name; commit renames it into place.
func stage(p string, mode os.FileMode, fill func(*os.File) error) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("launcher: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("launcher: write %s: %w", p, err)
	}
	if err := fill(f); err != nil {
		return fail(err)
	}
	if err := f.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("launcher: write %s: %w", p, err)
	}
	return tmp, nil
}

// commit renames each staged temporary file onto its target, then syncs
// each directory touched. On an error the temporaries not yet renamed are
// removed.
func commit(staged map[string]string) error {
	var firstErr error
	dirs := map[string]bool{}
	for tmp, p := range staged {
		if firstErr != nil {
			os.Remove(tmp)
			continue
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			firstErr = fmt.Errorf("launcher: %w", err)
			continue
		}
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := syncDir(d); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("launcher: fsync %s: %w", dir, err)
	}
	return nil
}

// openLock opens (creating it 0600) the lock file p in the state
// directory without following a link, and refuses it unless it is this
// user's own private regular file with one name: a link planted there
// steers nothing.
func openLock(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("launcher: the lock %s is a symbolic link; refused", p)
	}
	if err != nil {
		return nil, fmt.Errorf("launcher: lock: %w", err)
	}
	if err := checkOwnFile(f, p); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lockState takes the launch state's write lock, waiting up to lockWait.
// It guards one read-modify-write of StateFile, by whoever makes it (the
// launcher, Healthy in the executor, agent-start, Clear); the supervising
// launcher's own lock for its life is lockRun's.
func lockState(dir string) (unlock func(), err error) {
	p := filepath.Join(dir, lockFile)
	f, err := openLock(p)
	if err != nil {
		return nil, err
	}
	deadline := clock.Deadline(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, fmt.Errorf("launcher: lock %s: %w", p, err)
		}
		if clock.Past(deadline) {
			f.Close()
			return nil, fmt.Errorf("launcher: %s is held by another process for over %v", p, lockWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// update is a read-modify-write of the launch state under its lock. fn
// returns whether it changed anything worth writing.
func update(dir string, fn func(*State) (bool, error)) (State, error) {
	unlock, err := lockState(dir)
	if err != nil {
		return State{}, err
	}
	defer unlock()
	s, err := ReadState(dir)
	if err != nil {
		return State{}, err
	}
	changed, err := fn(&s)
	if err != nil || !changed {
		return s, err
	}
	return s, writeState(dir, s)
}

// Clear clears a halt and the start counter, as a person does with
// `mesh-launch clear` once the machine is looked at. It keeps the
// rolled_back mark: if the known-good version fails again, the launcher
// halts again rather than "rolling back" to what just failed. A state file
// that does not parse is replaced; one that is refused (not a regular file,
// someone else's) is left for the person to remove.
func Clear(stateDir string) error {
	if err := checkDir(stateDir, false); err != nil {
		return err
	}
	unlock, err := lockState(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := ReadState(stateDir)
	if err != nil && !errors.Is(err, errCorrupt) {
		return err
	}
	s.Halted, s.Starts, s.Failed = nil, nil, nil
	return writeState(stateDir, s)
}
