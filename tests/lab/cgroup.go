package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// cgroupParent is the directory, under the cgroup2 mount, that holds one
// directory per running lab, named PID.NAME after the test process.
const cgroupParent = "nox-lab"

var linkSeq atomic.Int64

// cgroup2Root finds the host's cgroup2 mount: /sys/fs/cgroup on a unified
// host, /sys/fs/cgroup/unified on a hybrid one, else any.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		l := sc.Text()
		i := strings.Index(l, " - ")
		if i < 0 {
			continue
		}
		pre, post := strings.Fields(l[:i]), strings.Fields(l[i+3:])
		if len(pre) >= 5 && len(post) >= 1 && post[0] == "cgroup2" {
			found = append(found, unescapeMountinfo(pre[4]))
		}
	}
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, p := range found {
			if p == want {
				return p, nil
			}
		}
	}
	if len(found) > 0 {
		return found[0], nil
	}
	return "", errors.New("no cgroup2 mount on this host (the lab needs one: mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mkdirCgroup creates the lab's cgroup directory. Another process may be
// removing an empty parent at the same moment, so it retries.
func mkdirCgroup(dir string) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = os.Mkdir(filepath.Dir(dir), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", filepath.Dir(dir), err)
		}
		if err = os.Mkdir(dir, 0o755); err == nil {
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	return fmt.Errorf("create cgroup %s: %w", dir, err)
}

// populated reads cgroup.events: whether any process is in dir's subtree.
func populated(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "populated "); ok {
			return strings.TrimSpace(v) != "0", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no populated line", dir)
}

// removeCgroup waits until dir's subtree holds no process, then removes
// it, deepest first, and the shared parent when it is left empty.
func removeCgroup(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		busy, err := populated(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("cgroup %s still populated after %v (procs: %q)", dir, wait, procs)
		}
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		time.Sleep(10 * time.Millisecond)
	}
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := rmdirRetry(dirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	// The shared parent goes when the last lab leaves it; a sibling may
	// still be there, which is fine.
	_ = syscall.Rmdir(filepath.Dir(dir))
	return errors.Join(errs...)
}

// rmdirRetry removes a cgroup directory; right after its last process
// exits the kernel may still hold it for a moment (EBUSY).
func rmdirRetry(p string) error {
	var err error
	for i := 0; i < 100; i++ {
		err = syscall.Rmdir(p)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("rmdir %s: %w", p, err)
}

// sweepStale removes what labs of a test process that no longer runs left
// behind: that process was killed before its cleanups ran (its labs died
// with it, through Pdeathsig). Their cgroup and scratch directories carry
// its pid.
func sweepStale() {
	alive := func(pid int) bool {
		return pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH
	}
	if root, err := cgroup2Root(); err == nil {
		parent := filepath.Join(root, cgroupParent)
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			pid, _, ok := strings.Cut(e.Name(), ".")
			if n, err := strconv.Atoi(pid); e.IsDir() && ok && err == nil && !alive(n) {
				_ = removeCgroup(filepath.Join(parent, e.Name()), 5*time.Second)
			}
		}
	}
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "nox-lab-*"))
	for _, p := range matches {
		f := strings.SplitN(strings.TrimPrefix(filepath.Base(p), "nox-lab-"), "-", 2)
		if n, err := strconv.Atoi(f[0]); err == nil && !alive(n) {
			_ = os.RemoveAll(p)
		}
	}
}
