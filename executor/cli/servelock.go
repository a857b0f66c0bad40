package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ServeLockFile is the daemon's lock in the state directory: one
// `mesh-executor serve` per state. It is apart from the store's
// one-applier lock (a flock on the directory itself), which the daemon
// takes only while it applies and a rescue `apply` shares and waits on;
// this one the daemon holds for its whole life, and nothing else takes it.
const ServeLockFile = "serve.lock"

// errServeHeld is returned by lockServe when another serve holds the lock.
type errServeHeld struct {
	state string
	pid   int // 0: it has not written its pid yet
}

func (e *errServeHeld) Error() string {
	who := "another mesh-executor serve"
	if e.pid > 0 {
		who += fmt.Sprintf(" (pid %d)", e.pid)
	}
	return fmt.Sprintf("refused: %s holds %s", who, e.state)
}

// lockServe takes the daemon's lock on state, which must exist, and writes
// this process's pid into it for the next one to name. The file is opened
// without following a link and must be a regular file of root's with one
// name: a link planted there steers nothing. The lock lasts as long as the
// returned file stays open (the process's life); the kernel drops it when
// the process dies, so a stale file is no lock.
//
// A second serve on the same state would apply beside the first (on
// another socket: ListenUnix refuses one a live executor serves); it must
// stop here, before it touches anything.
func lockServe(state string) (*os.File, error) {
	p := filepath.Join(state, ServeLockFile)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the daemon's lock %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("the daemon's lock %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Nlink != 1 || st.Mode&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("the daemon's lock %s must be a regular file of the executor's, with one name, readable by nobody else (it is mode %04o, uid %d, %d names)", p, st.Mode&0o7777, st.Uid, st.Nlink)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &errServeHeld{state: state, pid: readPid(p)}
		}
		return nil, fmt.Errorf("the daemon's lock %s: %w", p, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("the daemon's lock %s: %w", p, err)
		}
	}
	return f, nil
}

// readPid reads the pid a serve wrote into its lock; 0 when there is none
// (it has just taken the lock and not written it yet).
func readPid(p string) int {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.Read(b)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// serving is the pid of the serve holding state's lock now, 0 for none:
// the pid its lock names, alive and holding the lock file open. A pid
// alone is no proof — the file keeps the last one after a crash or a
// reboot, and the number may be another process's since — and a probe of
// the flock itself is no look: a serve starting at that instant would
// find it held and refuse to start.
func serving(state string) int {
	p := filepath.Join(state, ServeLockFile)
	pid := readPid(p)
	if pid <= 0 || !alive(pid) {
		return 0
	}
	lock, err := os.Stat(p)
	if err != nil {
		return 0
	}
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fds)
	if err != nil {
		return 0
	}
	// The file itself, not its name: the kernel shows an fd's path
	// resolved, and the state may be named through a link.
	for _, e := range ents {
		if fi, err := os.Stat(filepath.Join(fds, e.Name())); err == nil && os.SameFile(fi, lock) {
			return pid
		}
	}
	return 0
}
