package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// openat2(2), which the syscall package does not wrap. RESOLVE_IN_ROOT
// resolves the path as if the directory were the root: "..", and absolute
// symbolic links, stay inside the lab.
const (
	sysOpenat2          = 437
	resolveNoMagiclinks = 0x02
	resolveInRoot       = 0x10
)

type openHow struct{ flags, mode, resolve uint64 }

func openat2(dirfd int, p string, flags int, mode uint32) (int, error) {
	b, err := syscall.BytePtrFromString(p)
	if err != nil {
		return -1, err
	}
	how := openHow{flags: uint64(flags | syscall.O_CLOEXEC), mode: uint64(mode), resolve: resolveInRoot | resolveNoMagiclinks}
	for {
		fd, _, e := syscall.Syscall6(sysOpenat2, uintptr(dirfd), uintptr(unsafe.Pointer(b)),
			uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
		if e == syscall.EINTR || e == syscall.EAGAIN {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(fd), nil
	}
}

// labRoot opens the lab's root directory.
func (m *Machine) labRoot() (int, error) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(m.pid)+"/root", oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("lab %s: open its root: %w", m.name, err)
	}
	return fd, nil
}

// mkdirAll creates dir (a lab path) and its parents, resolving every
// step inside the lab.
func mkdirAll(root int, dir string) error {
	rel := strings.TrimPrefix(path.Clean("/"+dir), "/")
	if rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := openat2(root, prefix, oPath|syscall.O_DIRECTORY, 0)
		if err == nil {
			syscall.Close(fd)
			continue
		}
		if !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("/%s: %w", prefix, err)
		}
		parent := "."
		if i > 0 {
			parent = strings.Join(parts[:i], "/")
		}
		pfd, err := openat2(root, parent, oPath|syscall.O_DIRECTORY, 0)
		if err != nil {
			return fmt.Errorf("/%s: %w", parent, err)
		}
		err = syscall.Mkdirat(pfd, parts[i], 0o755)
		syscall.Close(pfd)
		if err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("mkdir /%s: %w", prefix, err)
		}
	}
	return nil
}

// create opens p in the lab for writing, truncated, with mode, making its
// parent directories (0755) on the way. Nothing on the way, not even an
// absolute symbolic link planted in the lab, can lead it out of the lab.
func (m *Machine) create(p string, mode os.FileMode) (*os.File, error) {
	p = path.Clean("/" + p)
	root, err := m.labRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(root)
	if err := mkdirAll(root, path.Dir(p)); err != nil {
		return nil, fmt.Errorf("lab %s: %w", m.name, err)
	}
	fd, err := openat2(root, strings.TrimPrefix(p, "/"), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, uint32(mode.Perm()))
	if err != nil {
		return nil, fmt.Errorf("lab %s: create %s: %w", m.name, p, err)
	}
	f := os.NewFile(uintptr(fd), m.Path(p))
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return nil, fmt.Errorf("lab %s: chmod %s: %w", m.name, p, err)
	}
	return f, nil
}

// WriteFile writes data to p inside the lab with mode (umask not applied),
// creating missing parent directories with mode 0755. Paths resolve inside
// the lab, symbolic links included.
func (m *Machine) WriteFile(p string, data []byte, mode os.FileMode) error {
	f, err := m.create(p, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("lab %s: write %s: %w", m.name, p, err)
	}
	return f.Close()
}

// WriteFiles writes files given as Options.Seed is (mode 0755 for "#!",
// "symlink:TARGET" for a link) into the running lab, in path order.
func (m *Machine) WriteFiles(files map[string]string) error {
	ps := make([]string, 0, len(files))
	for p := range files {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	for _, p := range ps {
		data := files[p]
		if target, ok := strings.CutPrefix(data, symlinkPrefix); ok {
			if err := m.symlink(target, p); err != nil {
				return err
			}
			continue
		}
		if err := m.WriteFile(p, []byte(data), os.FileMode(modeFor(data))); err != nil {
			return err
		}
	}
	return nil
}

// symlink makes p (replacing a link already there) a link to target.
func (m *Machine) symlink(target, p string) error {
	p = path.Clean("/" + p)
	root, err := m.labRoot()
	if err != nil {
		return err
	}
	defer syscall.Close(root)
	if err := mkdirAll(root, path.Dir(p)); err != nil {
		return fmt.Errorf("lab %s: %w", m.name, err)
	}
	dir := strings.TrimPrefix(path.Dir(p), "/")
	if dir == "" {
		dir = "."
	}
	dfd, err := openat2(root, dir, oPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("lab %s: %s: %w", m.name, path.Dir(p), err)
	}
	defer syscall.Close(dfd)
	// No symlinkat in package syscall; /proc/self/fd/N names the directory
	// already resolved inside the lab.
	at := "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + path.Base(p)
	if fi, err := os.Lstat(at); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		_ = os.Remove(at)
	}
	if err := os.Symlink(target, at); err != nil {
		return fmt.Errorf("lab %s: symlink %s -> %s: %w", m.name, p, target, err)
	}
	return nil
}

// CopyIn copies the host file hostPath into the lab at labPath, keeping its
// permission bits; when labPath is a directory in the lab, into it under
// the file's own name. Use it for anything made after the lab booted (the
// project's binaries, say, into /usr/local/bin): the overlay does not
// reliably show changes to the host made while the lab runs.
func (m *Machine) CopyIn(hostPath, labPath string) error {
	src, err := os.Open(hostPath)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("lab %s: CopyIn %s: not a regular file", m.name, hostPath)
	}
	root, err := m.labRoot()
	if err != nil {
		return err
	}
	if fd, err := openat2(root, strings.TrimPrefix(path.Clean("/"+labPath), "/"), oPath|syscall.O_DIRECTORY, 0); err == nil {
		syscall.Close(fd)
		labPath = path.Join(labPath, path.Base(hostPath))
	}
	syscall.Close(root)
	dst, err := m.create(labPath, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("lab %s: copy %s to %s: %w", m.name, hostPath, labPath, err)
	}
	return dst.Close()
}

// O_PATH, which package syscall does not name on every architecture.
const oPath = 0x200000
