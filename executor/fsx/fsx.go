// Package fsx is how the executor touches the filesystem as root: every
// operation is relative to an open directory descriptor reached without
// following a symbolic link, and ownership and mode are set on the open
// descriptor, never by path.
//
// The threat is a local user who can write somewhere along a path the host
// manages (a home directory, /tmp, a shared data directory) and plants a
// symlink, a hardlink or a FIFO to steer a root write, a read of an
// "original", or a removal. Every path here is walked with openat2 and
// RESOLVE_NO_SYMLINKS (or, on kernels without openat2, an equivalent walk of
// O_NOFOLLOW opens), so a link anywhere on the path is an error, not a
// detour. A non-regular or hardlinked file where a regular one is expected
// is refused: rewriting a hardlinked file would change its other name too.
//
// Out of scope: fsx does not decide what to write; it refuses what it cannot
// do safely and says why.
package fsx

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Errors fsx returns, each wrapped with the path it concerns.
var (
	// ErrSymlink: a component of the path, or the path itself, is a symbolic link.
	ErrSymlink = errors.New("a symbolic link is on the path; the host never follows one")
	// ErrNotRegular: a regular file was expected and something else is there.
	ErrNotRegular = errors.New("not a regular file")
	// ErrHardlinked: the regular file has more than one name.
	ErrHardlinked = errors.New("a hardlinked file (more than one name); the host will not write through another name")
	// ErrNotDir: a directory was expected and something else is there.
	ErrNotDir = errors.New("not a directory")
	// ErrNotEmpty: a directory still holds entries.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrChanged: what is at a path is no longer what was observed.
	ErrChanged = errors.New("changed under the host")
)

// Kind is what is found at a path.
type Kind uint8

// The kinds of thing at a path.
const (
	Absent Kind = iota
	Regular
	Dir
	Symlink
	Other // FIFO, socket, device
)

func (k Kind) String() string {
	return [...]string{"absent", "regular file", "directory", "symbolic link", "special file"}[k]
}

// Info is what an lstat says about a path.
type Info struct {
	Kind  Kind
	Mode  uint32 // permission bits with setuid, setgid and sticky
	UID   uint32
	GID   uint32
	Nlink uint64
	Size  int64
	Dev   uint64
	Ino   uint64
}

func infoOf(st *unix.Stat_t) Info {
	i := Info{Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink), Size: st.Size, Dev: uint64(st.Dev), Ino: st.Ino}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		i.Kind = Regular
	case unix.S_IFDIR:
		i.Kind = Dir
	case unix.S_IFLNK:
		i.Kind = Symlink
	default:
		i.Kind = Other
	}
	return i
}

var noOpenat2 atomic.Bool

// open opens an absolute path without following any symlink on the way.
func open(p string, flags int, mode uint32) (int, error) {
	if !strings.HasPrefix(p, "/") {
		return -1, fmt.Errorf("fsx: %q is not absolute", p)
	}
	flags |= unix.O_CLOEXEC
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
			Flags:   uint64(flags),
			Mode:    uint64(mode),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == nil {
			return fd, nil
		}
		if err != unix.ENOSYS {
			return -1, mapErr(err)
		}
		noOpenat2.Store(true)
	}
	return walk(p, flags, mode)
}

// walk is the equivalent of openat2(RESOLVE_NO_SYMLINKS) for older kernels:
// each component opened relative to the last with O_NOFOLLOW.
func walk(p string, flags int, mode uint32) (int, error) {
	dir, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i, c := range parts {
		if c == "" || c == "." || c == ".." {
			unix.Close(dir)
			return -1, fmt.Errorf("fsx: %q is not a clean path", p)
		}
		last := i == len(parts)-1
		f := unix.O_DIRECTORY | unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(dir, c, f, mode)
		if err != nil {
			var st unix.Stat_t
			isLink := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
			unix.Close(dir)
			if isLink {
				return -1, ErrSymlink
			}
			return -1, mapErr(err)
		}
		unix.Close(dir)
		dir = next
	}
	return dir, nil
}

func mapErr(err error) error {
	switch err {
	case unix.ELOOP, unix.EXDEV:
		// EXDEV is what openat2 says for a magic link; ELOOP for a symlink.
		return ErrSymlink
	case unix.ENOENT:
		return os.ErrNotExist
	}
	return err
}

func wrap(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// Parent is an open directory and a name in it: the only way fsx names a
// file it is about to create, replace or remove.
type Parent struct {
	fd   int
	Name string
	Path string
}

// OpenParent opens the directory holding p without following links. The
// caller must Close it.
func OpenParent(p string) (*Parent, error) {
	dir, name := path.Split(p)
	if name == "" || name == "." || name == ".." {
		return nil, fmt.Errorf("fsx: %q has no final name", p)
	}
	fd, err := open(path.Clean(dir), unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("parent directory %s does not exist (declare a directory before what it holds): %w", path.Clean(dir), err)
		}
		return nil, wrap("open parent of", p, err)
	}
	return &Parent{fd: fd, Name: name, Path: p}, nil
}

// Close releases the directory descriptor.
func (d *Parent) Close() error { return unix.Close(d.fd) }

// Lstat says what is at the name, without following it.
func (d *Parent) Lstat() (Info, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, d.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return Info{Kind: Absent}, nil
		}
		return Info{}, wrap("stat", d.Path, err)
	}
	return infoOf(&st), nil
}

// Lstat says what is at p without following any link on the way. A missing
// parent reads as Absent.
func Lstat(p string) (Info, error) {
	if p == "/" {
		var st unix.Stat_t
		if err := unix.Stat("/", &st); err != nil {
			return Info{}, wrap("stat", p, err)
		}
		return infoOf(&st), nil
	}
	d, err := OpenParent(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Info{Kind: Absent}, nil
		}
		return Info{}, err
	}
	defer d.Close()
	return d.Lstat()
}

// rawFile is a read-only descriptor read with plain read(2): an os.File
// would register it with the runtime's poller, two more system calls per
// file for nothing on a regular file.
type rawFile int

func (f rawFile) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(f), b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(b) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (f rawFile) Close() error { return unix.Close(int(f)) }

// openRegular opens p for reading, refusing anything but a regular file
// with one name. O_NONBLOCK keeps a planted FIFO from hanging the open.
func openRegular(p string) (rawFile, Info, error) {
	fd, info, err := openOnlyRegular(p)
	if err != nil {
		return -1, info, err
	}
	if info.Nlink > 1 {
		unix.Close(fd)
		return -1, info, wrap("open", p, ErrHardlinked)
	}
	return rawFile(fd), info, nil
}

// openOnlyRegular opens the regular file at p for reading as what a user
// may have planted is opened: no link followed, never blocking (a FIFO
// would hold the reader for good), anything but a regular file refused,
// said with what it is.
func openOnlyRegular(p string) (int, Info, error) {
	fd, err := open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		// A link at p itself is said as what it is: a caller reading
		// the zero Info would take it for nothing there.
		var info Info
		if l, lerr := Lstat(p); errors.Is(err, ErrSymlink) && lerr == nil && l.Kind == Symlink {
			info = l
		}
		return -1, info, wrap("open", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, Info{}, wrap("stat", p, err)
	}
	info := infoOf(&st)
	if info.Kind != Regular {
		unix.Close(fd)
		return -1, info, wrap("open", p, fmt.Errorf("%w (it is a %s)", ErrNotRegular, info.Kind))
	}
	return fd, info, nil
}

// ReadHead reads the first n bytes (or fewer) of the regular file at p,
// opened as ReadRegular opens one — no link followed, never blocking (a
// FIFO planted there would hold the reader for good), a device or
// anything but a regular file refused — whatever its size or its names.
func ReadHead(p string, n int) ([]byte, error) {
	fd, _, err := openOnlyRegular(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, n)
	got := 0
	for got < n {
		m, err := unix.Read(fd, buf[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, wrap("read", p, err)
		}
		if m == 0 {
			break
		}
		got += m
	}
	return buf[:got], nil
}

// ReadRegular reads a regular file of at most max bytes. It reports
// Absent, without error, when nothing is there.
func ReadRegular(p string, max int64) ([]byte, Info, error) {
	f, info, err := openRegular(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, Info{Kind: Absent}, nil
		}
		return nil, info, err
	}
	defer f.Close()
	if info.Size > max {
		return nil, info, fmt.Errorf("read %s: %d bytes, over the limit of %d", p, info.Size, max)
	}
	buf := make([]byte, info.Size+1)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, info, wrap("read", p, err)
	}
	if int64(n) > info.Size {
		return nil, info, fmt.Errorf("read %s: it grew while being read", p)
	}
	return buf[:n], info, nil
}

// selinuxLabel is the extended attribute that holds a file's SELinux
// context.
const selinuxLabel = "security.selinux"

// ReadLabeled is ReadRegular, and the file's SELinux label read from the
// same descriptor (nil when it has none, or the file system keeps none):
// what the host needs to rewrite a file it does not own (a region, keys)
// and leave it labelled as it was.
func ReadLabeled(p string, max int64) (data []byte, info Info, label []byte, err error) {
	f, info, err := openRegular(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, Info{Kind: Absent}, nil, nil
		}
		return nil, info, nil, err
	}
	defer f.Close()
	if info.Size > max {
		return nil, info, nil, fmt.Errorf("read %s: %d bytes, over the limit of %d", p, info.Size, max)
	}
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(int(f), selinuxLabel, buf)
		if err == nil {
			label = buf[:n]
			break
		}
		if err == unix.ERANGE && len(buf) < 64<<10 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if err != unix.ENODATA && err != unix.ENOTSUP {
			return nil, info, nil, wrap("read the SELinux label of", p, err)
		}
		break
	}
	data = make([]byte, info.Size+1)
	n, err := io.ReadFull(f, data)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, info, nil, wrap("read", p, err)
	}
	if int64(n) > info.Size {
		return nil, info, nil, fmt.Errorf("read %s: it grew while being read", p)
	}
	return data[:n], info, label, nil
}

// Equal reports whether the regular file at p holds exactly want, without
// reading more than len(want)+1 bytes. Absent and non-regular return false
// with the Info saying which.
//
// The file is compared a piece at a time: a small one in one read into a
// buffer on the stack, a large one (a saved declaration) through a buffer
// of at most equalChunk, not its whole size in fresh memory. The last read
// asks for one byte more than is left: a file grown since its size was read
// shows it and is not equal, without a further read for the end of file.
func Equal(p string, want []byte) (bool, Info, error) {
	f, info, err := openRegular(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, Info{Kind: Absent}, nil
		}
		return false, info, err
	}
	defer f.Close()
	if info.Size != int64(len(want)) {
		return false, info, nil
	}
	// Most declared files are small: compared without an allocation (and
	// with a frame small enough not to grow the goroutine's stack).
	var small [512]byte
	buf := small[:]
	if len(want)+1 > len(small) {
		buf = make([]byte, min(len(want)+1, equalChunk))
	}
	for off := 0; ; {
		ask := min(len(buf), len(want)+1-off)
		n, err := f.Read(buf[:ask])
		if n > 0 {
			if off+n > len(want) || string(buf[:n]) != string(want[off:off+n]) {
				return false, info, nil
			}
			off += n
			if off == len(want) && n < ask {
				return true, info, nil // the byte more was not there
			}
		}
		if err == io.EOF || n == 0 {
			return off == len(want), info, nil
		}
		if err != nil {
			return false, info, wrap("read", p, err)
		}
	}
}

// equalChunk bounds the buffer Equal reads a large file through.
const equalChunk = 64 << 10

// Sum returns the sha256 of a regular file.
func Sum(p string) ([32]byte, Info, error) {
	var sum [32]byte
	f, info, err := openRegular(p)
	if err != nil {
		return sum, info, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, info, wrap("read", p, err)
	}
	copy(sum[:], h.Sum(nil))
	return sum, info, nil
}

// WriteOptions say how WriteFile leaves the file.
type WriteOptions struct {
	Mode     uint32
	UID, GID int
	// Sync fsyncs the file before the rename and its directory after it:
	// the new content is then at the name, durably, when WriteFile
	// returns. A file fsynced and renamed, its directory not, may be the
	// old one again after a power cut — after the caller recorded the
	// new. The engine's batches leave it off and sync the filesystem once
	// per batch instead, before they record.
	Sync bool
	// Label is the SELinux context to give the new file (ReadLabeled's of
	// the file it replaces); nil gives none, and the file system's default
	// applies.
	Label []byte
	// NoReplace: the path was absent when the caller looked, and the file
	// is put there only if it still is (renameat2's RENAME_NOREPLACE); what
	// appeared since is left as it is, and the error wraps fs.ErrExist.
	NoReplace bool
}

// WriteFile replaces p with data atomically: a new file is written beside
// it, its owner and mode set on the descriptor, and renamed over the name.
// Whatever is at p must be a regular file with one name, or absent.
func WriteFile(p string, data []byte, o WriteOptions) error {
	d, err := OpenParent(p)
	if err != nil {
		return err
	}
	defer d.Close()
	info, err := d.Lstat()
	if err != nil {
		return err
	}
	switch {
	case info.Kind == Absent || info.Kind == Regular && info.Nlink == 1:
	case info.Kind == Regular:
		return wrap("write", p, ErrHardlinked)
	case info.Kind == Symlink:
		return wrap("write", p, ErrSymlink)
	default:
		return wrap("write", p, fmt.Errorf("%w (it is a %s)", ErrNotRegular, info.Kind))
	}
	tmp := TempName(d.Name)
	create := func() (int, error) {
		return unix.Openat(d.fd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	fd, err := create()
	if err == unix.EEXIST && d.removeLeftover() {
		fd, err = create()
	}
	if err != nil {
		if err == unix.EEXIST {
			return wrap("create beside", p, fmt.Errorf("%s is there and is not a leftover of the host's (a root-owned regular file); refusing to touch it", tmp))
		}
		return wrap("create beside", p, err)
	}
	closed, ok := false, false
	defer func() {
		if !closed {
			unix.Close(fd)
		}
		if !ok {
			unix.Unlinkat(d.fd, tmp, 0)
		}
	}()
	for b := data; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return wrap("write", p, err)
		}
		b = b[n:]
	}
	if info.Kind == Regular && (info.UID == uint32(o.UID) || info.UID == 0) {
		// Before the owner and mode: an access ACL sets the group bits
		// (its mask), which the chmod below sets back as declared. Only
		// from a file of the same owner, or root's: another's ACL (its
		// owner's own rights, or what they gave others) carried onto
		// content written for a new owner would let them read it.
		if err := d.carryXattrs(info, fd); err != nil {
			return wrap("keep the extended attributes (ACLs) of", p, err)
		}
	}
	// chown before chmod: chown clears setuid and setgid.
	if err := unix.Fchown(fd, o.UID, o.GID); err != nil {
		return wrap("chown", p, err)
	}
	if err := unix.Fchmod(fd, o.Mode); err != nil {
		return wrap("chmod", p, err)
	}
	if o.Label != nil {
		if err := unix.Fsetxattr(fd, selinuxLabel, o.Label, 0); err != nil {
			return wrap("set the SELinux label "+strings.TrimRight(string(o.Label), "\x00")+" on", p, err)
		}
	}
	if o.Sync {
		if err := unix.Fsync(fd); err != nil {
			return wrap("fsync", p, err)
		}
	}
	closed = true
	if err := unix.Close(fd); err != nil {
		return wrap("close", p, err)
	}
	if o.NoReplace {
		err := unix.Renameat2(d.fd, tmp, d.fd, d.Name, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			// A file system or kernel without it: looked at once more,
			// the window left as narrow as it goes.
			var st unix.Stat_t
			if unix.Fstatat(d.fd, d.Name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				err = unix.EEXIST
			} else {
				err = unix.Renameat(d.fd, tmp, d.fd, d.Name)
			}
		}
		if err != nil {
			return wrap("rename into", p, err)
		}
	} else if err := unix.Renameat(d.fd, tmp, d.fd, d.Name); err != nil {
		return wrap("rename into", p, err)
	}
	ok = true
	if o.Sync {
		if err := unix.Fsync(d.fd); err != nil {
			return wrap("fsync the directory of", p, err)
		}
	}
	return nil
}

// TempName is the name WriteFile writes beside name before renaming it
// over. It is fixed, not random, so that what a crash leaves between the
// two is found again: the engine removes it when it settles the
// interrupted intent of that file (RemoveLeftover), and WriteFile itself
// when it finds one. One applier at a time holds the store's lock, so two
// never share it.
func TempName(name string) string {
	if len(name) > 200 {
		name = name[:200]
	}
	return "." + name + ".mesh-host-new"
}

// carryXattrs copies the extended attributes of the file at d.Name — the
// one observed (was): the same inode, or nothing is copied — onto the new
// file fd that replaces it: its POSIX ACLs (a service user's read access
// the owner and mode do not say) and user.* and trusted.* attributes, so
// that a rewrite, and the give-back of the original after it, leave the
// file as reachable as it was. Not security.*: the SELinux label is the
// caller's to set (WriteOptions.Label), and file capabilities copied onto
// new content would grant them to what they were never given for. A file
// system that keeps none, or refuses one (EPERM, ENOTSUP), is passed over.
func (d *Parent) carryXattrs(was Info, fd int) error {
	old, err := unix.Openat(d.fd, d.Name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // gone or replaced since: nothing of it to keep
	}
	defer unix.Close(old)
	var st unix.Stat_t
	if unix.Fstat(old, &st) != nil || uint64(st.Dev) != was.Dev || st.Ino != was.Ino {
		return nil
	}
	names, err := listXattrs(old)
	if err != nil || len(names) == 0 {
		return nil
	}
	for _, name := range names {
		if strings.HasPrefix(name, "security.") {
			continue
		}
		val, err := getXattr(old, name)
		if err != nil {
			continue // removed meanwhile, or unreadable: passed over
		}
		if err := unix.Fsetxattr(fd, name, val, 0); err != nil && err != unix.EPERM && err != unix.ENOTSUP && err != unix.EOPNOTSUPP {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// listXattrs is the names of fd's extended attributes.
func listXattrs(fd int) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				names = append(names, string(b))
			}
		}
		return names, nil
	}
}

// getXattr is the value of fd's extended attribute name.
func getXattr(fd int, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		if err == unix.ERANGE && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// removeLeftover removes the temporary file of d.Name if it is the host's
// own: a regular file, owned by root, with one name. Anything else under
// that name (another user cannot make a root-owned file) is left alone.
func (d *Parent) removeLeftover() bool {
	return d.leftover() && unix.Unlinkat(d.fd, TempName(d.Name), 0) == nil
}

// leftover says whether the temporary file of d.Name is there and the
// host's own (removeLeftover).
func (d *Parent) leftover() bool {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, TempName(d.Name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false
	}
	i := infoOf(&st)
	return i.Kind == Regular && i.UID == 0 && i.Nlink == 1
}

// HasLeftover says whether an interrupted WriteFile of p left beside it
// what RemoveLeftover would remove: for a plan, which removes nothing.
func HasLeftover(p string) bool {
	d, err := OpenParent(p)
	if err != nil {
		return false
	}
	defer d.Close()
	return d.leftover()
}

// RemoveLeftover removes what an interrupted WriteFile of p left beside
// it, if anything, and reports whether it did.
func RemoveLeftover(p string) bool {
	d, err := OpenParent(p)
	if err != nil {
		return false
	}
	defer d.Close()
	return d.removeLeftover()
}

// SetAttr sets the owner and mode of the directory at p, on an open
// descriptor. It must still be the very directory observed (seen: device,
// inode and owner): between a plan and its change, a user who can write the
// parent could swap in a directory of their own, and root would then hand
// it the declared owner and mode. (A file's owner and mode are never set
// this way: WriteFile replaces the file through a file of its own.)
func SetAttr(p string, seen Info, mode uint32, uid, gid int) error {
	k := Dir
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY
	if k == Dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := open(p, flags, 0)
	if err != nil {
		if err == unix.ENOTDIR {
			return wrap("open", p, ErrNotDir)
		}
		return wrap("open", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wrap("stat", p, err)
	}
	info := infoOf(&st)
	if info.Kind != k {
		return wrap("set owner and mode of", p, fmt.Errorf("expected a %s, found a %s", k, info.Kind))
	}
	if info.Dev != seen.Dev || info.Ino != seen.Ino || info.UID != seen.UID || info.GID != seen.GID {
		return wrap("set owner and mode of", p, fmt.Errorf("%w: it was replaced or changed hands since it was observed; not touched", ErrChanged))
	}
	if info.UID != uint32(uid) || info.GID != uint32(gid) {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return wrap("chown", p, err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return wrap("chmod", p, err)
	}
	return nil
}

// Mkdir creates the directory p (its parent must exist) with owner and mode
// set on its descriptor. It fails if anything is already there.
func Mkdir(p string, mode uint32, uid, gid int) error {
	d, err := OpenParent(p)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Mkdirat(d.fd, d.Name, 0o700); err != nil {
		return wrap("mkdir", p, err)
	}
	fd, err := unix.Openat(d.fd, d.Name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return wrap("open new directory", p, mapErr(err))
	}
	defer unix.Close(fd)
	// Still the directory just made: the executor's own, empty. Between
	// mkdirat and openat a user who can write the parent could have put
	// their own there.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wrap("stat new directory", p, err)
	}
	if st.Uid != uint32(os.Geteuid()) || st.Nlink != 2 {
		return wrap("mkdir", p, fmt.Errorf("%w: the new directory was replaced before its owner and mode were set; not touched", ErrChanged))
	}
	if n, err := entriesAt(fd); err != nil || n > 0 {
		return wrap("mkdir", p, fmt.Errorf("%w: the new directory holds entries already; not touched", ErrChanged))
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return wrap("chown", p, err)
	}
	return wrap("chmod", p, unix.Fchmod(fd, mode))
}

// Remove removes the regular file at p. Anything else there (a link planted
// in its place, a directory) is refused, not removed.
func Remove(p string) error {
	err := removeAt(p, Regular, 0, "remove")
	if errors.Is(err, errWrongKind) {
		return wrap("remove", p, fmt.Errorf("%w: %v, not the file the host wrote", ErrNotRegular, err))
	}
	return err
}

// RemoveDir removes the directory p if it is empty; ErrNotEmpty otherwise.
func RemoveDir(p string) error {
	err := removeAt(p, Dir, unix.AT_REMOVEDIR, "remove directory")
	if errors.Is(err, errWrongKind) {
		return wrap("remove directory", p, fmt.Errorf("%w: %v", ErrNotDir, err))
	}
	return err
}

var errWrongKind = errors.New("something else is there now")

// removeAt unlinks p, relative to its parent opened without following
// links, if what is there is of kind want; nothing there is done already.
func removeAt(p string, want Kind, flags int, op string) error {
	d, err := OpenParent(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer d.Close()
	info, err := d.Lstat()
	if err != nil {
		return err
	}
	switch info.Kind {
	case Absent:
		return nil
	case want:
	default:
		return fmt.Errorf("%w (a %s)", errWrongKind, info.Kind)
	}
	if err := unix.Unlinkat(d.fd, d.Name, flags); err != nil && err != unix.ENOENT {
		if err == unix.ENOTEMPTY || err == unix.EEXIST {
			return wrap(op, p, ErrNotEmpty)
		}
		return wrap(op, p, err)
	}
	return nil
}

// CountEntries counts what a directory holds, without following links.
func CountEntries(p string) (int, error) {
	names, err := DirNames(p)
	return len(names), err
}

// DirNames lists the names a directory holds, without following links.
func DirNames(p string) ([]string, error) {
	fd, err := open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, wrap("open", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return names, wrap("read directory", p, err)
}

// Syncfs flushes the whole filesystem holding the directory p to stable
// storage: one call makes a batch of writes durable before they are recorded.
func Syncfs(p string) error {
	fd, err := open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return wrap("open", p, err)
	}
	defer unix.Close(fd)
	return wrap("syncfs", p, unix.Syncfs(fd))
}

// Resolve resolves p through the machine's symlinks the way the kernel
// would, for the protected-set check: the longest existing prefix is
// resolved and the rest appended. It only reads.
func Resolve(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("fsx: %q is not absolute", p)
	}
	todo := strings.Split(strings.Trim(p, "/"), "/")
	done := "/"
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c)
		target, err := os.Readlink(next)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) && pe.Err == unix.EINVAL {
				done = next // exists, not a link
				continue
			}
			if os.IsNotExist(err) || errors.Is(err, unix.ENOTDIR) {
				return path.Join(append([]string{next}, todo...)...), nil
			}
			return "", fmt.Errorf("resolve %s: %w", p, err)
		}
		if links++; links > 40 {
			return "", fmt.Errorf("resolve %s: too many levels of symbolic links", p)
		}
		if strings.HasPrefix(target, "/") {
			done = "/"
		}
		todo = append(strings.Split(strings.Trim(target, "/"), "/"), todo...)
	}
	return done, nil
}

// ErrNotExist is returned, wrapped, for a path with nothing at it.
var ErrNotExist = os.ErrNotExist

// Resolver returns a Resolve that remembers the directories it resolved,
// so checking a thousand paths in ten directories reads ten directories'
// links once (from the second name asked in each), and each final name
// once. It is for one apply: a link changed afterwards is not seen.
func Resolver() func(string) (string, error) {
	dirs := map[string]string{"/": "/"}
	// links holds, per resolved directory, which of its entries are
	// symbolic links: one read of a directory answers for a thousand
	// files in it, instead of one readlink each.
	links := map[string]map[string]bool{}
	once := map[string]bool{} // directories asked about one name so far
	var resolve, resolveDir func(p string) (string, error)
	resolve = func(p string) (string, error) {
		if rp, ok := dirs[p]; ok {
			return rp, nil
		}
		dir, base := path.Split(p)
		if base == "" || base == "." || base == ".." || !strings.HasPrefix(p, "/") {
			return Resolve(p)
		}
		// A clean path's directory is dir without its slash: no copy. A
		// path that is not clean is resolved name by name, as the kernel
		// would ("a/link/.." is not "a").
		if len(dir) > 1 {
			dir = dir[:len(dir)-1]
		}
		if path.Clean(dir) != dir {
			return Resolve(p)
		}
		rd, err := resolveDir(dir)
		if err != nil {
			return "", err
		}
		full := p
		if rd != dir {
			full = path.Join(rd, base)
		}
		ls, seen := links[rd]
		switch {
		case seen:
		case !once[rd]:
			// The first name asked in a directory is asked alone (one
			// readlink below): /etc's hundred entries are not read to
			// learn about one name in it.
			once[rd] = true
		default:
			ls, _ = symlinksIn(rd)
			links[rd] = ls // nil when unreadable: ask each name below
		}
		if ls != nil && !ls[base] {
			// Not a link (or not there): the answer, remembered only for a
			// directory someone asks about, not for each of a thousand
			// files.
			return full, nil
		}
		if _, err := os.Readlink(full); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) && (pe.Err == unix.EINVAL || pe.Err == unix.ENOENT || pe.Err == unix.ENOTDIR) {
				dirs[p] = full
				return full, nil
			}
			return "", fmt.Errorf("resolve %s: %w", p, err)
		}
		// The final name is a link: resolve it in full.
		rp, err := Resolve(full)
		if err == nil {
			dirs[p] = rp
		}
		return rp, err
	}
	// resolveDir resolves a directory on the way. Most have no link
	// anywhere on their path: one openat2 that refuses every link says so,
	// and the directory is itself — without reading each ancestor's
	// entries. Otherwise (a link on the way, or not there) it is resolved
	// name by name.
	resolveDir = func(d string) (string, error) {
		if rd, ok := dirs[d]; ok {
			return rd, nil
		}
		fd, err := unix.Openat2(unix.AT_FDCWD, d, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if err == nil {
			unix.Close(fd)
			dirs[d] = d
			return d, nil
		}
		rd, err := resolve(d)
		if err == nil {
			dirs[d] = rd
		}
		return rd, err
	}
	return resolve
}

// symlinksIn names the entries of dir that are symbolic links, from one
// pass over its raw entries (their types as the filesystem records them),
// without sorting or a stat each; nil when a filesystem does not record
// types (then each name is asked by the caller).
func symlinksIn(dir string) (map[string]bool, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	out := map[string]bool{}
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) >= 19; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			reclen := int(b[16]) | int(b[17])<<8
			if reclen < 19 || reclen > len(b) {
				return nil, fmt.Errorf("fsx: %s: a malformed directory entry", dir)
			}
			typ, name := b[18], b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			switch typ {
			case unix.DT_LNK:
				out[string(name)] = true
			case unix.DT_UNKNOWN:
				return nil, nil
			}
			b = b[reclen:]
		}
	}
}

// entriesAt counts the entries (other than . and ..) of an open directory.
func entriesAt(fd int) (int, error) {
	buf := make([]byte, 4096)
	count := 0
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return 0, err
		}
		if n <= 0 {
			return count, nil
		}
		_, c, names := unix.ParseDirent(buf[:n], -1, nil)
		_ = c
		count += len(names)
	}
}
