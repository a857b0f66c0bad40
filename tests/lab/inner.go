package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
)

// innerEnv selects the inner stage: the test binary, re-executed as the
// lab's PID 1 in its new namespaces, reads its orders from this variable,
// makes the lab's mounts, pivots into the overlay and execs the init.
const innerEnv = "NOX_LAB_INNER"

// innerConfig is what the host side hands the inner stage.
type innerConfig struct {
	Name  string  // the lab's name and hostname
	Base  string  // the scratch directory on the host
	Init  Init    // which init to exec
	Seeds []entry // what to place in the upper layer before mounting it
}

// entry is one thing placed in the upper layer.
type entry struct {
	Path   string // absolute, inside the lab
	Data   string // a file's content
	Mode   uint32 // a file's permission bits
	Link   string // when set: a symbolic link to this
	Opaque bool   // a directory that hides the host's (trusted.overlay.opaque)
}

func init() {
	if v := os.Getenv(innerEnv); v != "" {
		// One thread does it all, so the namespaces it enters and the
		// root it pivots to are the ones execve keeps.
		runtime.LockOSThread()
		err := inner(v)
		fmt.Fprintf(os.Stderr, "lab inner stage: %v\n", err)
		os.Exit(111)
	}
}

// inner runs as PID 1 of the lab's new namespaces, in the lab's cgroup. It
// returns only on failure; on success the init replaces it.
func inner(cfgText string) error {
	var c innerConfig
	if err := json.Unmarshal([]byte(cfgText), &c); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// fd 3 is the start pipe: it closes when the init is exec'd (or when
	// this process dies), which is the host side's signal.
	syscall.CloseOnExec(3)
	syscall.Umask(0o022)
	if os.Getpid() != 1 {
		return fmt.Errorf("not PID 1 of a new pid namespace (pid %d)", os.Getpid())
	}
	if err := rootCgroupNamespace(); err != nil {
		return err
	}
	// Before any mount: nothing made here may propagate to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	rw := filepath.Join(c.Base, "rw")
	root := filepath.Join(c.Base, "root")
	upper, work := filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	if err := mount("nox-lab-"+c.Name+"-rw", rw, "tmpfs", 0, "mode=755,size=8g"); err != nil {
		return err
	}
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := placeSeeds(upper, c.Seeds); err != nil {
		return err
	}
	if err := mount("nox-lab-"+c.Name, root, "overlay", 0,
		"lowerdir=/,upperdir="+upper+",workdir="+work); err != nil {
		return err
	}
	if err := mountKernelFS(root); err != nil {
		return err
	}
	if err := mountDev(root, c.Name, filepath.Join(c.Base, "console")); err != nil {
		return err
	}
	if err := mount("nox-lab-"+c.Name+"-run", filepath.Join(root, "run"), "tmpfs",
		syscall.MS_NOSUID|syscall.MS_NODEV, "mode=755,size=256m"); err != nil {
		return err
	}
	if err := mount("nox-lab-"+c.Name+"-tmp", filepath.Join(root, "tmp"), "tmpfs",
		syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777,size=1g"); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; the
	// lazy unmount then drops every host mount from this namespace.
	if err := syscall.Chdir(root); err != nil {
		return err
	}
	if err := syscall.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := syscall.Unmount(".", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := syscall.Chdir("/"); err != nil {
		return err
	}
	if err := syscall.Sethostname([]byte(c.Name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	bin, err := c.Init.binary()
	if err != nil {
		return err
	}
	env := []string{
		"container=nox-lab", "TERM=dumb",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}
	return fmt.Errorf("exec %s: %w", bin, syscall.Exec(bin, c.Init.argv(), env))
}

// rootCgroupNamespace makes sure the lab's cgroup namespace is rooted at
// the lab's own cgroup. The clone made a new namespace, but when the child
// was placed with CLONE_INTO_CGROUP the kernel may have rooted it at the
// parent's cgroup; a second, nested namespace made from here is rooted
// where this process is now.
func rootCgroupNamespace() error {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") && strings.TrimSpace(l) != "0::/" {
			if err := syscall.Unshare(syscall.CLONE_NEWCGROUP); err != nil {
				return fmt.Errorf("unshare the cgroup namespace: %w", err)
			}
		}
	}
	return nil
}

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := syscall.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", source, target, fstype, err)
	}
	return nil
}

// bindReadOnly makes p a read-only bind of itself.
func bindReadOnly(p string) error {
	if err := mount(p, p, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return err
	}
	return mount("", p, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY|
		syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
}

// mountKernelFS mounts the lab's proc (of its own pid namespace) with
// /proc/sys read-only but /proc/sys/net, a read-only sysfs (of its own
// network namespace) and cgroup2 rooted at its cgroup namespace.
func mountKernelFS(root string) error {
	const nosuid = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC
	proc := filepath.Join(root, "proc")
	if err := mount("proc", proc, "proc", nosuid, ""); err != nil {
		return err
	}
	sys := filepath.Join(proc, "sys")
	if err := mount(sys, sys, "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	if err := mount(sys+"/net", sys+"/net", "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	if err := mount("", sys, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY|nosuid, ""); err != nil {
		return err
	}
	for _, p := range []string{"sysrq-trigger", "irq", "bus", "fs"} {
		if _, err := os.Stat(filepath.Join(proc, p)); err == nil {
			if err := bindReadOnly(filepath.Join(proc, p)); err != nil {
				return err
			}
		}
	}
	if err := mount("sysfs", filepath.Join(root, "sys"), "sysfs", syscall.MS_RDONLY|nosuid, ""); err != nil {
		return err
	}
	return mount("cgroup2", filepath.Join(root, "sys/fs/cgroup"), "cgroup2", nosuid, "")
}

// mountDev gives the lab a tmpfs /dev with harmless nodes, its own devpts,
// and the console FIFO as /dev/console.
func mountDev(root, name, console string) error {
	dev := filepath.Join(root, "dev")
	if err := mount("nox-lab-"+name+"-dev", dev, "tmpfs", syscall.MS_NOSUID, "mode=755,size=64m"); err != nil {
		return err
	}
	for _, d := range []string{"pts", "shm", "mqueue", "net"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	nodes := []struct {
		name         string
		major, minor uint32
	}{
		{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8},
		{"urandom", 1, 9}, {"tty", 5, 0}, {"net/tun", 10, 200}, {"fuse", 10, 229},
	}
	for _, n := range nodes {
		p := filepath.Join(dev, n.name)
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(n.major<<8|n.minor)); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	if err := mount("devpts", filepath.Join(dev, "pts"), "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=620,gid=5"); err != nil {
		return err
	}
	if err := mount("shm", filepath.Join(dev, "shm"), "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	for l, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, l)); err != nil {
			return err
		}
	}
	c := filepath.Join(dev, "console")
	if err := os.WriteFile(c, nil, 0o600); err != nil {
		return err
	}
	return mount(console, c, "", syscall.MS_BIND, "")
}

// placeSeeds writes the seeds into the upper layer. A directory the seeds
// need is created with the mode and owner of the host's directory at that
// path, so seeding /root/x does not open /root.
func placeSeeds(upper string, seeds []entry) error {
	sort.Slice(seeds, func(i, j int) bool { return seeds[i].Path < seeds[j].Path })
	for _, e := range seeds {
		p := filepath.Join(upper, e.Path)
		if err := upperDirs(upper, filepath.Dir(e.Path)); err != nil {
			return err
		}
		switch {
		case e.Opaque:
			if err := upperDirs(upper, e.Path); err != nil {
				return err
			}
			if err := syscall.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				return fmt.Errorf("make %s opaque: %w", e.Path, err)
			}
		case e.Link != "":
			if err := os.Symlink(e.Link, p); err != nil {
				return err
			}
		default:
			if err := os.WriteFile(p, []byte(e.Data), os.FileMode(e.Mode)); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(e.Mode)); err != nil {
				return err
			}
		}
	}
	return nil
}

// upperDirs creates dir (a lab path) and its parents in the upper layer.
func upperDirs(upper, dir string) error {
	if dir == "/" || dir == "." {
		return nil
	}
	if err := upperDirs(upper, filepath.Dir(dir)); err != nil {
		return err
	}
	p := filepath.Join(upper, dir)
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	mode, uid, gid := os.FileMode(0o755), 0, 0
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		st := fi.Sys().(*syscall.Stat_t)
		mode, uid, gid = fi.Mode()&(os.ModePerm|os.ModeSticky|os.ModeSetgid), int(st.Uid), int(st.Gid)
	}
	if err := os.Mkdir(p, mode); err != nil {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Lchown(p, uid, gid)
}
