package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// A state directory is held by one process at a time. Two processes
// writing one directory is how state is lost without anyone noticing: two
// mesh-control serve on one key directory each open its embedded
// JetStream store, and the second rewrites the first one's files under it
// (the first then logs "could not locate msg block 1" and loses reports
// and declarations); two agents on one state directory race on agent.json
// and on the NKey a pending enrolment depends on.
//
// The lock is flock(2) on the directory itself, taken without waiting,
// before anything in the directory is opened or created. A directory and
// not a file inside it: root can take it before the agent drops its
// privileges and before the directory is made the agent's, without opening
// a file in a directory an unprivileged user owns (a link planted there
// could steer root's open). The kernel drops the lock when the process
// ends, however it ends, so a crash never leaves a stale lock behind. Who
// holds it is recorded apart, in a file beside (Record), so the one
// refused can say whom to stop.

// HeldError is returned by LockDir when another process holds the
// directory. PID is 0 when the holder's record could not be read.
type HeldError struct {
	Dir  string // absolute
	PID  int
	What string // what the holder recorded itself as ("mesh-control serve")
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.What != "" {
		who = "another " + e.What
	}
	if e.PID > 0 {
		who += fmt.Sprintf(" (pid %d)", e.PID)
	} else {
		who += " (its pid was not recorded)"
	}
	return fmt.Sprintf("refused: %s holds %s; stop it first", who, e.Dir)
}

// DirLock is an exclusive lock on a state directory (LockDir).
type DirLock struct {
	dir    string
	record string // the holder's record, beside the lock
	f      *os.File
}

// recordWait is how long a refused LockDir waits for the holder to record
// itself: a holder records right after it locks (the agent, after its
// privilege drop), so a refusal in between would otherwise name no one.
const recordWait = time.Second

// LockDir takes an exclusive flock(2) on the directory dir, without
// waiting. record is the name of the file in dir where the holder records
// its pid (Record) and where a refused caller reads it: another holder
// yields a *HeldError naming it. dir must exist, and is not itself a
// symlink: it is opened without following one (a caller that may follow
// one resolves dir first).
func LockDir(dir, record string) (*DirLock, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		err = &fs.PathError{Op: "open", Path: abs, Err: err}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			if fi, lerr := os.Lstat(abs); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				return nil, fmt.Errorf("%s is a symlink; refusing it (name the directory itself): %w", abs, err)
			}
			return nil, fmt.Errorf("%s is not a directory: %w", abs, err)
		}
		return nil, ExplainAccess("open", abs, err, "")
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if err != unix.EWOULDBLOCK {
			return nil, fmt.Errorf("lock %s: %w", abs, err)
		}
		held := &HeldError{Dir: abs}
		for deadline := clock.Deadline(recordWait); ; {
			if pid, what, ok := readRecord(filepath.Join(abs, record)); ok {
				held.PID, held.What = pid, what
				break
			}
			if clock.Past(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil, held
	}
	return &DirLock{dir: abs, record: filepath.Join(abs, record), f: os.NewFile(uintptr(fd), abs)}, nil
}

// Dir is the locked directory, absolute.
func (l *DirLock) Dir() string { return l.dir }

// Still says whether the path of the locked directory still names the
// directory locked: one moved, removed or replaced since is another's to
// take, and a holder writing by the path would write into it.
func (l *DirLock) Still() bool {
	var held, now unix.Stat_t
	return unix.Fstat(int(l.f.Fd()), &held) == nil && unix.Stat(l.dir, &now) == nil && held.Dev == now.Dev && held.Ino == now.Ino
}

// Record writes "PID WHAT" into the holder's record, replacing it whole
// (a reader never sees half of it). It is the first write into the
// directory, so a directory its holder cannot write fails here, legibly.
//
// On a full disk the record is written over the one before, in place:
// the lock is what excludes another process, the record only names the
// holder, and a daemon started on a full disk (a machine rebooted after
// its disk filled) must still come up to say so and answer what it can.
func (l *DirLock) Record(what string) error {
	data := []byte(fmt.Sprintf("%d %s\n", os.Getpid(), what))
	l.sweep()
	err := WriteBytes(l.record, data, 0o600)
	if errors.Is(err, syscall.ENOSPC) {
		err = overwrite(l.record, data)
	}
	if err != nil {
		return ExplainAccess("write in", l.dir, err, "")
	}
	return nil
}

// staleTemp is the age past which a temporary of WriteBytes is a dead
// writer's: a live one renames its temporary within the write of a few
// kilobytes, and one refused (a full disk) removes it.
const staleTemp = time.Minute

// sweep removes the temporaries WriteBytes left in the directory when the
// process writing died between creating one and renaming it (kill -9, a
// power cut, an exit from another goroutine): a holder that crash-loops
// would otherwise leave one a start. It runs as the holder, holding the
// lock, and removes only what is plainly such a temporary: a regular file
// named ".<name>.<digits>", last written more than staleTemp ago — another
// process writing in the directory without the lock keeps its own.
func (l *DirLock) sweep() {
	fd := int(l.f.Fd())
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !isTemp(e.Name()) {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if clock.Since(time.Unix(st.Mtim.Unix())) > staleTemp {
			unix.Unlinkat(fd, e.Name(), 0)
		}
	}
}

// isTemp says whether name is a temporary's of WriteBytes: ".<name>.<digits>".
func isTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	i := strings.LastIndexByte(rest, '.')
	if !ok || i < 1 || i == len(rest)-1 {
		return false
	}
	for _, c := range rest[i+1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// overwrite writes data over the start of the existing file at path and
// cuts it there: the blocks the file holds already are written again, so
// a full disk takes it as long as the file is no shorter than data's
// block. A reader may see it half written, or another record's end.
func overwrite(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Close releases the lock. The record stays: it names a process that no
// longer holds the lock, which LockDir, holding it, overwrites.
func (l *DirLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// readRecord reads a holder's record; ok only for a process alive now.
func readRecord(path string) (pid int, what string, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 4096 {
		return 0, "", false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	ps, what, _ := strings.Cut(strings.TrimSpace(line), " ")
	pid, err = strconv.Atoi(ps)
	if err != nil || pid <= 0 {
		return 0, "", false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0, "", false // a record left by a process gone: not the holder
	}
	return pid, strings.TrimSpace(what), true
}

// AccessError is a permission error said the way an operator acts on it:
// what could not be done to which path, and whose file or directory is in
// the way, with its mode, so "run as its owner" (or Advice) can be
// followed without looking anything up.
type AccessError struct {
	Op, Path string
	Err      error
	// Blocker is the path in the way: Path itself, or the first
	// directory above it this process may not pass ("" when none could
	// be found). Owner and Mode are Blocker's.
	Blocker string
	Owner   string
	Mode    fs.FileMode
	// Advice is what to do ("" for "run as its owner").
	Advice string
}

func (e *AccessError) Error() string {
	reason := e.Err
	var errno syscall.Errno
	if errors.As(reason, &errno) {
		reason = errno // the path is said once, not once per wrapping
	}
	advice := e.Advice
	if advice == "" {
		advice = "run as its owner"
	}
	switch {
	case e.Blocker == "":
		return fmt.Sprintf("cannot %s %s: %v (running as uid %d; %s)", e.Op, e.Path, reason, os.Geteuid(), advice)
	case e.Blocker == e.Path:
		return fmt.Sprintf("cannot %s %s: %v (it is %s, mode %04o; %s)", e.Op, e.Path, reason, e.Owner, e.Mode.Perm(), advice)
	default:
		return fmt.Sprintf("cannot %s %s: %v (%s is %s, mode %04o; %s)", e.Op, e.Path, reason, e.Blocker, e.Owner, e.Mode.Perm(), advice)
	}
}

func (e *AccessError) Unwrap() error { return e.Err }

// ExplainAccess returns err as an *AccessError when it is a permission
// error (EACCES, EPERM, EROFS), and err unchanged otherwise: a missing
// file stays a missing file, for the caller to say what makes it. advice
// replaces "run as its owner" when not empty.
func ExplainAccess(op, path string, err error, advice string) error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrPermission) && !errors.Is(err, unix.EROFS) {
		return err
	}
	e := &AccessError{Op: op, Path: path, Err: err, Advice: advice}
	if errors.Is(err, unix.EROFS) {
		e.Blocker, e.Owner = path, "on a read-only file system"
		if fi, serr := os.Lstat(path); serr == nil {
			e.Owner, e.Mode = owner(fi)+", on a read-only file system", fi.Mode()
		}
		return e
	}
	// The path itself when it can be seen (this process lacks the access
	// to it); otherwise the nearest directory above it that can be seen:
	// in the way if it may not be passed, or, for a path not there yet,
	// written in.
	if fi, serr := os.Lstat(path); serr == nil {
		e.Blocker, e.Mode = path, fi.Mode()
		e.Owner = owner(fi)
		return e
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		if fi, serr := os.Stat(d); serr == nil {
			if unix.Access(d, unix.X_OK) != nil || unix.Access(d, unix.W_OK) != nil {
				e.Blocker, e.Owner, e.Mode = d, owner(fi), fi.Mode()
			}
			return e
		}
		if d == filepath.Dir(d) {
			return e
		}
	}
}

// owner names fi's owner: "root's", "uid 1234's"; and its group when the
// mode lets the group do more than others ("root's (group mesh-agent)"),
// which is how the executor's socket lets its agent in.
func owner(fi fs.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "someone else's"
	}
	id := strconv.FormatUint(uint64(st.Uid), 10)
	who := "uid " + id + "'s"
	if u, err := user.LookupId(id); err == nil {
		who = u.Username + "'s"
	}
	if perm := fi.Mode().Perm(); (perm>>3)&^perm&0o7 != 0 {
		gid := strconv.FormatUint(uint64(st.Gid), 10)
		group := "gid " + gid
		if g, err := user.LookupGroupId(gid); err == nil {
			group = g.Name
		}
		who += " (group " + group + ")"
	}
	return who
}
