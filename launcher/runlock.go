package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// One launcher supervises a state directory. A second one, started by hand
// beside the init's, counted its own executor's failed starts (that
// executor refused, the first one holding the state) in the same launch
// state, and the next ordinary restart of the first then found MaxStarts
// and rolled the node back. So the supervising launcher takes RunLockFile
// before it reads the launch state, and holds it until it returns.
//
// The mechanism is the executor's (`mesh-executor serve` and its
// serve.lock) and the agent's and control side's: flock(2) without
// waiting, held for the life of the process, dropped by the kernel however
// the process ends (a crash leaves no stale lock), and the holder's pid
// recorded for the one refused to name. It is a file in the directory and
// not the directory itself, as the agent and control side lock theirs:
// this directory is the executor's, and a flock on the directory itself is
// the store's one-applier lock, which the executor takes at every apply.
// Neither implementation can be linked here (the launcher imports nothing
// of the agent's or the executor's but executor/command: it must work
// where they do not), so this is that mechanism on the launcher's own lock
// file, opened and checked like lockState's.

// HeldError is returned by Run when another process holds the state
// directory's launcher lock. PID is 0 when its record could not be read.
type HeldError struct {
	Dir string
	PID int
}

func (e *HeldError) Error() string {
	who := "another mesh-launch"
	if e.PID > 0 {
		who += fmt.Sprintf(" (pid %d)", e.PID)
	} else {
		who += " (its pid was not recorded)"
	}
	return fmt.Sprintf("refused: %s holds %s; stop it first (nothing was counted or started)", who, e.Dir)
}

// recordWait is how long a refused lockRun waits for the holder to write
// its pid: the holder writes it right after it locks.
const recordWait = time.Second

// lockRun takes RunLockFile in dir, which must exist, without waiting, and
// writes this process's pid into it. The lock lasts while the returned
// file stays open. Another holder yields a *HeldError naming it.
func lockRun(dir string) (*os.File, error) {
	p := filepath.Join(dir, RunLockFile)
	f, err := openLock(p)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("launcher: lock %s: %w", p, err)
		}
		held := &HeldError{Dir: dir}
		for deadline := clock.Deadline(recordWait); ; time.Sleep(50 * time.Millisecond) {
			if held.PID = readRunPid(p); held.PID > 0 || clock.Past(deadline) {
				break
			}
		}
		return nil, held
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("launcher: record this process in %s: %w", p, err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("launcher: record this process in %s: %w", p, err)
	}
	return f, nil
}

// readRunPid reads the pid the holder wrote into its lock; 0 when there is
// none yet, or it names a process gone.
func readRunPid(p string) int {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.Read(b)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return 0
	}
	return pid
}

// ExecutorServeLock is the executor's own lock in the state directory
// (executor/cli.ServeLockFile, which this package cannot link; tests hold
// the two names equal): `mesh-executor serve` holds it for its life.
const ExecutorServeLock = "serve.lock"

// serveHeld says whether a `mesh-executor serve` holds dir now, with the
// pid it recorded (0: not read). Probed with a shared flock taken without
// waiting and let go at once, which fails only while a serve's exclusive
// one is held; the file is opened without following a link and never
// created. Not this launcher's child: it probes only while none runs.
func serveHeld(dir string) (held bool, pid int) {
	p := filepath.Join(dir, ExecutorServeLock)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, 0
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK), readRunPid(p)
	}
	unix.Flock(fd, unix.LOCK_UN)
	return false, 0
}

// runningLauncher is the pid of the launcher that supervises dir now, 0
// when none does (or it cannot tell): read from the kernel's locks, never
// by taking the lock, which would refuse a launcher starting that moment.
func runningLauncher(dir string) int {
	fd, err := unix.Open(filepath.Join(dir, RunLockFile), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	return statedir.FlockHolder(fd)
}
