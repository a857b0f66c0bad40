package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds is what the kernel says of one thread's credentials
// (/proc/<pid>/task/<tid>/status).
type Creds struct {
	UID        [4]int `json:"uid"` // real, effective, saved, filesystem
	GID        [4]int `json:"gid"`
	Groups     []int  `json:"groups"`
	CapInh     uint64 `json:"cap_inh"`
	CapPrm     uint64 `json:"cap_prm"`
	CapEff     uint64 `json:"cap_eff"`
	CapBnd     uint64 `json:"cap_bnd"`
	CapAmb     uint64 `json:"cap_amb"`
	NoNewPrivs int    `json:"no_new_privs"`
}

// ReadCreds parses a /proc status file.
func ReadCreds(statusPath string) (*Creds, error) {
	f, err := os.Open(statusPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Creds{NoNewPrivs: -1, Groups: []int{}} // none is [], not null
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Uid", "Gid":
			fs := strings.Fields(v)
			if len(fs) != 4 {
				return nil, fmt.Errorf("%s: %s: %q", statusPath, k, v)
			}
			for i, x := range fs {
				n, err := strconv.Atoi(x)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %q", statusPath, k, v)
				}
				if k == "Uid" {
					c.UID[i] = n
				} else {
					c.GID[i] = n
				}
			}
			seen++
		case "Groups":
			for _, x := range strings.Fields(v) {
				n, err := strconv.Atoi(x)
				if err != nil {
					return nil, fmt.Errorf("%s: Groups: %q", statusPath, v)
				}
				c.Groups = append(c.Groups, n)
			}
			seen++
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb":
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %q", statusPath, k, v)
			}
			*map[string]*uint64{"CapInh": &c.CapInh, "CapPrm": &c.CapPrm, "CapEff": &c.CapEff, "CapBnd": &c.CapBnd, "CapAmb": &c.CapAmb}[k] = n
			seen++
		case "NoNewPrivs":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("%s: NoNewPrivs: %q", statusPath, v)
			}
			c.NoNewPrivs = n
			seen++
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if seen != 9 {
		return nil, fmt.Errorf("%s: expected Uid, Gid, Groups, five capability sets and NoNewPrivs", statusPath)
	}
	return c, nil
}

// Confined is the state the agent runs in: every thread of process pid
// ("self" for this one) has uid and gid as all four of its ids, no
// supplementary group but, at most, its own gid, empty effective, permitted, inheritable and ambient
// capability sets, and no_new_privs set; with bounding, an empty bounding
// set too (what a drop from root achieves; a process started unprivileged
// cannot empty it, and with no_new_privs it can never gain from it). The
// first thread that differs is named.
func Confined(pid string, uid, gid int, bounding bool) error {
	tasks, err := filepath.Glob(filepath.Join("/proc", pid, "task", "*", "status"))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("privileges: cannot read the threads of process %s", pid)
	}
	for _, t := range tasks {
		c, err := ReadCreds(t)
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			return fmt.Errorf("privileges: %w", err)
		}
		var bad []string
		for i := range 4 {
			if c.UID[i] != uid {
				bad = append(bad, fmt.Sprintf("uids %v, not %d", c.UID, uid))
				break
			}
		}
		for i := range 4 {
			if c.GID[i] != gid {
				bad = append(bad, fmt.Sprintf("gids %v, not %d", c.GID, gid))
				break
			}
		}
		// The agent's own primary group as its only supplementary group
		// grants nothing the gid does not (systemd's User= adds it, and
		// cannot leave it out); any other is refused.
		if len(c.Groups) != 0 && !(len(c.Groups) == 1 && c.Groups[0] == gid) {
			bad = append(bad, fmt.Sprintf("supplementary groups %v", c.Groups))
		}
		bnd := c.CapBnd
		if !bounding {
			bnd = 0
		}
		if c.CapInh|c.CapPrm|c.CapEff|bnd|c.CapAmb != 0 {
			bad = append(bad, fmt.Sprintf("capabilities inh=%x prm=%x eff=%x bnd=%x amb=%x", c.CapInh, c.CapPrm, c.CapEff, c.CapBnd, c.CapAmb))
		}
		if c.NoNewPrivs != 1 {
			bad = append(bad, "no_new_privs not set")
		}
		if len(bad) > 0 {
			return fmt.Errorf("privileges: thread %s still has %s", filepath.Base(filepath.Dir(t)), strings.Join(bad, "; "))
		}
	}
	return nil
}

// LookupUser returns the uid and primary gid of name.
func LookupUser(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return 0, 0, fmt.Errorf("privileges: no user %q on this machine: the package (or mesh-launch, for a tarball) makes it; --user names another", name)
		}
		return 0, 0, fmt.Errorf("privileges: user %q: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("privileges: user %q has non-numeric ids", name)
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("privileges: user %q is root's (uid %d, gid %d); the agent runs as its own unprivileged user", name, uid, gid)
	}
	return uid, gid, nil
}

// Drop makes this process name's, for good, in code — so it is confined the
// same under systemd, OpenRC, runit, s6 or a shell:
//
//  1. the capability bounding set emptied (while CAP_SETPCAP is still held);
//  2. setgroups to none, setresgid and setresuid to the user's ids (all
//     threads: the Go runtime applies these to every thread);
//  3. every capability set cleared, ambient included, on every thread;
//  4. PR_SET_NO_NEW_PRIVS on every thread;
//  5. checked against the kernel's view of every thread (Confined).
//
// Started as a non-root user already, Drop only checks that it is name
// (when name is not empty), clears whatever capabilities it was given, sets
// no_new_privs, and checks. It returns the ids it runs as.
//
// It needs a binary built with CGO_ENABLED=0: with cgo the runtime cannot
// apply prctl and capset to every thread, and Drop refuses rather than
// confine one thread of many.
func Drop(name string) (uid, gid int, err error) {
	if os.Geteuid() != 0 {
		uid, gid = os.Getuid(), os.Getgid()
		if name != "" {
			wu, wg, err := LookupUser(name)
			if err != nil {
				return 0, 0, err
			}
			if wu != uid || wg != gid {
				return 0, 0, fmt.Errorf("privileges: running as uid %d gid %d, which is not user %s (uid %d gid %d)", uid, gid, name, wu, wg)
			}
		}
		if os.Getegid() != gid || os.Geteuid() != uid {
			return 0, 0, fmt.Errorf("privileges: effective ids %d:%d differ from real ids %d:%d (set-id binary?)", os.Geteuid(), os.Getegid(), uid, gid)
		}
		if err := clearCaps(false); err != nil {
			return 0, 0, err
		}
		if err := noNewPrivs(); err != nil {
			return 0, 0, err
		}
		return uid, gid, Confined("self", uid, gid, false)
	}
	if name == "" {
		return 0, 0, errors.New("privileges: started as root without a user to drop to")
	}
	uid, gid, err = LookupUser(name)
	if err != nil {
		return 0, 0, err
	}
	if err := dropBounding(); err != nil {
		return 0, 0, err
	}
	if err := syscall.Setgroups(nil); err != nil {
		return 0, 0, fmt.Errorf("privileges: setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return 0, 0, fmt.Errorf("privileges: setresgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return 0, 0, fmt.Errorf("privileges: setresuid %d: %w", uid, err)
	}
	if err := clearCaps(true); err != nil {
		return 0, 0, err
	}
	if err := noNewPrivs(); err != nil {
		return 0, 0, err
	}
	// The way back must be closed.
	if err := syscall.Setresuid(0, 0, 0); err == nil {
		return 0, 0, errors.New("privileges: setresuid(0) succeeded after the drop")
	}
	return uid, gid, Confined("self", uid, gid, true)
}

// ErrCgo: the binary was built with cgo, and the runtime cannot apply a
// system call to every thread.
var ErrCgo = errors.New("privileges: this binary was built with cgo; the agent drops privileges on every thread only when built with CGO_ENABLED=0")

func allThreads(trap, a1, a2, a3 uintptr) error {
	_, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3)
	if e == syscall.ENOTSUP {
		return ErrCgo
	}
	if e != 0 {
		return e
	}
	return nil
}

func dropBounding() error {
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if errors.Is(err, ErrCgo) {
			return err
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("privileges: dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// clearCaps empties the effective, permitted, inheritable and ambient sets
// of every thread (and the bounding set where still permitted).
func clearCaps(dropped bool) error {
	if !dropped {
		// A non-root start may still hold CAP_SETPCAP (ambient capabilities
		// given by the init); empty the bounding set while it can.
		if err := dropBounding(); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("privileges: clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if err != nil {
		return fmt.Errorf("privileges: capset: %w", err)
	}
	return nil
}

func noNewPrivs() error {
	if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("privileges: PR_SET_NO_NEW_PRIVS: %w", err)
	}
	return nil
}

// PrepareStateDir makes dir (0700) the agent's, before the drop: created if
// missing, refused if it is a symlink or not a directory, owned by uid:gid.
// Ownership and mode are set on the opened directory, never through a path
// that could be swapped for a link.
func PrepareStateDir(dir string, uid, gid int) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("state directory: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("state directory %s is not a directory (a symlink?); refusing it: %w", dir, err)
	}
	defer unix.Close(fd)
	// One another user owns is theirs: taken, its files would stay theirs
	// (the agent then failing on them) and the directory closed to them.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	if st.Uid != 0 && int(st.Uid) != uid {
		return fmt.Errorf("state directory %s is uid %d's, not root's nor the agent's (uid %d): refusing to take it from them; give the agent a directory of its own, or chown it to the agent if it is the agent's", dir, st.Uid, uid)
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	return nil
}
