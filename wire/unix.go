package wire

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The executor's socket. The directory is root's and the agent's group's
// (0750), the socket 0660 root:group, created under a umask of 077 beside
// its path, opened to the group, and only then renamed to its path: there
// is no instant at which another user could connect, nor one at which the
// agent finds it and cannot. Peer credentials are checked on every connection anyway.
const (
	SocketDir  = "/run/mesh-host"
	SocketPath = "/run/mesh-host/executor.sock"
	// LauncherNotice is the name of the file the launcher tells the agent
	// through, beside the socket (launcher.NoticeFile, and Android's
	// mesh-host.rc), and LauncherNotice+".tmp" the one it is written as.
	LauncherNotice = "launcher.json"
)

// ListenUnix creates the socket at path for the group gid and listens.
//
// A socket already at path is taken over only when it is stale: a
// connection to it refused (ECONNREFUSED) means nothing listens there any
// more (an executor killed with -9 leaves its file). A connection accepted
// means another executor serves it — one with another state directory but
// the same --socket — and is refused, naming the path and that process:
// taking the file over left that executor running and unreachable while
// its agent's status still said linked, and the taker removed the file on
// exit. Anything else (the file gone meanwhile aside) is no proof of
// staleness, and nothing is removed. The check, the removal and the bind
// are made holding a flock on PATH.lock beside the socket (lockPath), so
// two executors starting together cannot each find the same stale file
// and one remove the other's fresh socket.
func ListenUnix(path string, gid int) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := socketDirOwn(dir, filepath.Base(path)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("wire: socket directory: %w", err)
	}
	unlock, err := lockPath(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// The directory is opened to the group only once the path is known to
	// be this executor's to take: a refused one changes nothing.
	if err := os.Chown(dir, 0, gid); err != nil {
		return nil, fmt.Errorf("wire: socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return nil, fmt.Errorf("wire: socket directory: %w", err)
	}
	// Bound under another name, given its owner and mode, and only then
	// renamed to path: whoever sees the socket at path (the agent, a
	// watcher of the directory) sees it as it stays, never root's 0700
	// socket of the instant before the chown — a connection then was
	// refused, and a look then saw a file that changed after.
	tmp := path + "~"
	if len(tmp) >= len(unix.RawSockaddrUnix{}.Path) {
		return nil, fmt.Errorf("wire: the socket path %s is too long (at most %d bytes)", path, len(unix.RawSockaddrUnix{}.Path)-2)
	}
	if err := removeLeftover(tmp); err != nil {
		return nil, err
	}
	old := syscall.Umask(0o077)
	ln, err := net.Listen("unix", tmp)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("wire: listen on %s (bound first as %s, then renamed): %w", path, filepath.Base(tmp), err)
	}
	// Go would unlink the path by name on Close: if another executor has
	// put its own socket there since (an old one outliving its launcher),
	// that would remove the new one's. Remove only the file this one made.
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("wire: socket: %w", err)
	}
	if err := os.Chown(tmp, 0, gid); err != nil {
		return fail(err)
	}
	if err := os.Chmod(tmp, 0o660); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ul.Close()
		return nil, fmt.Errorf("wire: socket: %w", err)
	}
	return &ownSocket{UnixListener: ul, path: path, id: fileIdentity(fi)}, nil
}

// ServedPath is the path a listener of ListenUnix serves — its address
// is the temporary name it was bound under — or, for any other Unix
// listener, its address; "" for one of another kind.
func ServedPath(ln net.Listener) string {
	if o, ok := ln.(*ownSocket); ok {
		return o.path
	}
	if a, ok := ln.Addr().(*net.UnixAddr); ok {
		return a.Name
	}
	return ""
}

// socketDirOwn refuses a socket directory that is not the executors' to
// take: the executor makes it root's and the agent's group's, mode 0750,
// so a directory that holds anything else — /tmp (whose sticky bit and
// world-write would go), /run, a home directory — would be taken from
// whoever uses it. One that does not exist yet is made; one that holds
// only executors' sockets and their locks (an earlier run's, or another
// node's on a machine running several) and the launcher's notice to the
// agent is theirs.
func socketDirOwn(dir, sock string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wire: socket directory: %w", err)
	}
	refuse := func(why string) error {
		return fmt.Errorf("wire: the socket's directory %s %s, and the executor makes its socket's directory root's and the agent's group's, mode 0750: name a socket in a directory of its own (such as %s), left as it is", dir, why, SocketPath)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return refuse("is not a directory (" + fi.Mode().Type().String() + ")")
	case fi.Mode()&os.ModeSticky != 0 || fi.Mode().Perm()&0o002 != 0:
		return refuse(fmt.Sprintf("is shared (mode %v)", fi.Mode().Perm()|fi.Mode()&os.ModeSticky))
	case !ok || st.Uid != 0:
		return refuse(fmt.Sprintf("is uid %d's", st.Uid))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("wire: socket directory: %w", err)
	}
	for _, e := range entries {
		own := e.Name() == LauncherNotice || e.Name() == LauncherNotice+".tmp" || filepath.Ext(e.Name()) == ".lock"
		if e.Type()&os.ModeSocket != 0 || (e.Type().IsRegular() && own) {
			continue
		}
		if e.Name() == sock || e.Name() == sock+"~" {
			// The socket's own names: said of the path itself, as
			// removeStale and removeLeftover say it (not "name a
			// directory of its own" for the very path the executor was
			// told), before anything in the directory is changed.
			return notASocket(filepath.Join(dir, e.Name()))
		}
		return refuse("holds " + e.Name() + ", which is not an executor's socket or its lock")
	}
	return nil
}

// notASocket refuses p, where the executor's socket goes and something
// else is: no executor made it, and nothing removes it.
func notASocket(p string) error {
	return fmt.Errorf("wire: %s exists and is not a socket; not removing it", p)
}

// removeLeftover removes the socket an executor killed between its bind
// and its rename left at tmp (nothing listens there: every executor
// renames under the lock ListenUnix holds); anything else there is not
// the executor's, and is refused.
func removeLeftover(tmp string) error {
	fi, err := os.Lstat(tmp)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("wire: %s: %w", tmp, err)
	case fi.Mode().Type() != os.ModeSocket:
		return notASocket(tmp)
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wire: remove %s: %w", tmp, err)
	}
	return nil
}

// lockPath takes an exclusive flock on path+".lock", a file of root's
// (the executor's) mode 0600 beside the socket, for the check-remove-bind
// of ListenUnix. It waits: every holder holds it for a few system calls
// only. Not the socket directory itself: the agent's group may open that
// (0750), and an agent holding a flock on it would keep every executor
// from starting.
func lockPath(path string) (unlock func(), err error) {
	p := path + ".lock"
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wire: the socket's lock %s: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("wire: the socket's lock %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Nlink != 1 || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("wire: the socket's lock %s must be a regular file of the executor's, with one name, for nobody else (it is mode %04o, uid %d, %d names)", p, st.Mode&0o7777, st.Uid, st.Nlink)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("wire: lock %s: %w", p, err)
	}
	return func() { unix.Close(fd) }, nil
}

// removeStale removes the socket at path if nothing listens on it, and
// refuses a path another process serves or that is not a socket.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wire: socket %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return notASocket(path)
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	switch {
	case err == nil:
		who := "another executor"
		if p, perr := PeerOf(c); perr == nil && p.PID > 0 {
			who += fmt.Sprintf(" (pid %d)", p.PID)
		}
		c.Close()
		return fmt.Errorf("wire: %s: %s is serving it; refusing to take its socket (stop it first, or give this one another --socket)", path, who)
	case errors.Is(err, syscall.ECONNREFUSED):
		// Stale: nothing listens. Removed by the identity just seen, in
		// case it changed since (a file put there by something that does
		// not take the directory's lock is left).
		if fi2, lerr := os.Lstat(path); lerr == nil && fileIdentity(fi2) == fileIdentity(fi) {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("wire: remove the stale socket %s: %w", path, err)
			}
			return nil
		}
		return fmt.Errorf("wire: %s changed while it was looked at; not removing it", path)
	case errors.Is(err, syscall.ENOENT):
		return nil // gone meanwhile
	default:
		return fmt.Errorf("wire: %s: cannot tell whether another executor serves it (%w); not removing it", path, err)
	}
}

// probeTimeout bounds the connection ListenUnix makes to a socket already
// at its path. A live executor accepts at once; one whose backlog is full
// is busy, hence alive, and is not taken over either.
const probeTimeout = 5 * time.Second

// ownSocket is a listener that, closed, removes its socket file only if
// that file is still the one it created.
type ownSocket struct {
	*net.UnixListener
	path string
	id   [3]int64
}

// fileIdentity tells one file from another at the same path: the inode
// alone is not enough (tmpfs hands a freed inode number to the next file
// at once), so its change time to the nanosecond goes with it.
func fileIdentity(fi os.FileInfo) [3]int64 {
	st := fi.Sys().(*syscall.Stat_t)
	return [3]int64{int64(st.Ino), st.Ctim.Sec, st.Ctim.Nsec}
}

func (o *ownSocket) Close() error {
	err := o.UnixListener.Close()
	if fi, lerr := os.Lstat(o.path); lerr == nil && fileIdentity(fi) == o.id {
		os.Remove(o.path)
	}
	return err
}

// Peer is who is at the other end of a unix socket, as the kernel says.
type Peer struct {
	UID, GID uint32
	PID      int32
}

// ErrNoCredentials is returned for a connection that is not a unix socket.
var ErrNoCredentials = errors.New("wire: the connection carries no peer credentials")

// PeerOf returns the kernel's credentials of the peer of c (SO_PEERCRED).
func PeerOf(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, ErrNoCredentials
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if serr != nil {
		return Peer{}, fmt.Errorf("wire: SO_PEERCRED: %w", serr)
	}
	return Peer{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}, nil
}

// DialUnix connects to the executor and checks that the process listening
// is root's (or wantUID's): an agent must not pour declarations into a
// socket someone else put in the executor's place.
func DialUnix(path string, wantUID uint32) (*Conn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("wire: executor socket %s: %w", path, err)
	}
	p, err := PeerOf(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if p.UID != wantUID {
		c.Close()
		return nil, fmt.Errorf("wire: the process at %s runs as uid %d, not the executor's uid %d; refusing to talk to it", path, p.UID, wantUID)
	}
	return NewConn(c, ExecutorToAgent), nil
}
