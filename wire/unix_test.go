package wire

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// staleSocket leaves at path a socket file nothing listens on, as an
// executor killed with -9 does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
}

// A socket path a live executor listens on is refused, by path, naming
// the process that listens, and its file is left as it is: the first
// executor stays reachable.
func TestListenRefusesALiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "executor.sock")
	first, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	id := fileIdentity(fi)

	second, err := ListenUnix(path, 0)
	if err == nil {
		second.Close()
		t.Fatalf("a second listener took %s from a live one", path)
	}
	want := path + ": another executor (pid " + strconv.Itoa(os.Getpid()) + ") is serving it"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("refusal %q does not say %q", err, want)
	}
	fi, err = os.Lstat(path)
	if err != nil || fileIdentity(fi) != id {
		t.Fatalf("the live executor's socket file was replaced or removed: %v", err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := first.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the first executor is unreachable: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the first executor's listener: %v", err)
	}
}

// A socket file nothing listens on (connection refused) is stale: it is
// replaced, and the new listener serves.
func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "executor.sock")
	staleSocket(t, path)
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the stale socket: dial says %v, want connection refused", err)
	}
	ln, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the new listener: %v", err)
	}
	c.Close()
}

// A closing executor removes its own socket file, never one put at the
// same path since (its file removed from under it, as the init's cleanup
// of the socket directory does, and another executor listening there).
func TestSocketRemovedOnlyIfOurs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "executor.sock")
	old, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	newer, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	if _, err := net.Dial("unix", path); err != nil {
		t.Fatalf("the old executor removed the new one's socket: %v", err)
	}
	newer.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatal("the socket was left behind")
	}
}

// A refused listener removes nothing on its way out, and the file at the
// path is not a socket: refused, left alone.
func TestListenLeavesWhatIsNotItsOwn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "executor.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := ListenUnix(path, 0)
	if err == nil {
		ln.Close()
		t.Fatal("a regular file at the socket path was replaced")
	}
	// Said of the path itself: the directory is the executors' (it holds
	// the path the executor was told), the file in it is not a socket.
	if !strings.Contains(err.Error(), path+" exists and is not a socket") {
		t.Errorf("refused as %q", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the refused listen changed the directory: %v %v", fi.Mode(), err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file at the socket path was touched: %q %v", b, err)
	}
}

// The socket appears at its path as it stays — the agent's group's, mode
// 0660 — in one step (a rename), never as the bare socket of the bind,
// root's and 0700, chowned a moment later: an agent connecting at that
// moment was refused, and a look at the file then saw one that changed
// after. Watched with inotify, the path is only ever moved to, never
// created nor changed in place.
func TestTheSocketAppearsAsItStays(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("ListenUnix gives the socket to a group, which only root may (make test runs as root)")
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "executor.sock")
	// A socket left beside the path by an executor killed between its
	// bind and its rename is taken away.
	staleSocket(t, path+"~")
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CREATE|syscall.IN_ATTRIB|syscall.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	ln, err := ListenUnix(path, 65534)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	buf := make([]byte, 64<<10)
	n, err := syscall.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for off := 0; off+syscall.SizeofInotifyEvent <= n; {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := strings.TrimRight(string(buf[off+syscall.SizeofInotifyEvent:off+syscall.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		off += syscall.SizeofInotifyEvent + int(ev.Len)
		if name != "executor.sock" {
			continue
		}
		switch {
		case ev.Mask&syscall.IN_MOVED_TO != 0:
			seen = append(seen, "moved to")
		case ev.Mask&syscall.IN_CREATE != 0:
			seen = append(seen, "created")
		case ev.Mask&syscall.IN_ATTRIB != 0:
			seen = append(seen, "changed")
		}
	}
	if !slices.Equal(seen, []string{"moved to"}) {
		t.Fatalf("%s came %v, not in one rename", path, seen)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o660 || st.Uid != 0 || st.Gid != 65534 {
		t.Fatalf("the socket is mode %04o, owner %d:%d; want 0660 0:65534", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if _, err := os.Lstat(path + "~"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the name it was bound under is left: %v", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the socket at its path does not answer: %v", err)
	}
	c.Close()
}

// What is beside the path under the name the socket is bound under and
// is not a socket is no executor's: refused, left alone.
func TestListenLeavesWhatIsBesideItsPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "executor.sock")
	if err := os.WriteFile(path+"~", []byte("an editor's backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := ListenUnix(path, 0)
	if err == nil {
		ln.Close()
		t.Fatal("a regular file beside the socket path was replaced")
	}
	if !strings.Contains(err.Error(), path+"~ exists and is not a socket") {
		t.Errorf("refused as %q", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the refused listen changed the directory: %v %v", fi.Mode(), err)
	}
	if b, err := os.ReadFile(path + "~"); err != nil || string(b) != "an editor's backup" {
		t.Fatalf("the file beside the socket path was touched: %q %v", b, err)
	}
}

// The socket's directory is made root's and the agent's group's, 0750:
// one that is not the executors' — shared (/tmp), another user's, or
// holding anything but executors' sockets and their locks (/run, a home)
// — is refused and left exactly as it was. One holding another node's
// socket (several on one machine) is taken.
func TestASocketDirectoryNotTheExecutorsIsLeftAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("ListenUnix gives the directory to root, which only root may (make test runs as root)")
	}
	for _, c := range []struct {
		name string
		make func(dir string)
		say  string
	}{
		{"shared, like /tmp", func(dir string) { os.Chmod(dir, 0o1777) }, "is shared (mode"},
		{"another user's", func(dir string) { os.Chown(dir, 65534, 65534) }, "is uid 65534's"},
		{"holding other files, like /run", func(dir string) { os.WriteFile(filepath.Join(dir, "utmp"), nil, 0o644) }, "holds utmp"},
		{"holding a directory", func(dir string) { os.Mkdir(filepath.Join(dir, "lock"), 0o755) }, "holds lock"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o755)
			c.make(dir)
			before, _ := os.Lstat(dir)
			ln, err := ListenUnix(filepath.Join(dir, "executor.sock"), 65534)
			if err == nil {
				ln.Close()
				t.Fatal("taken")
			}
			if !strings.Contains(err.Error(), c.say) || !strings.Contains(err.Error(), "left as it is") {
				t.Fatalf("refused saying %q, want %q", err, c.say)
			}
			after, _ := os.Lstat(dir)
			b, a := before.Sys().(*syscall.Stat_t), after.Sys().(*syscall.Stat_t)
			if before.Mode() != after.Mode() || b.Uid != a.Uid || b.Gid != a.Gid {
				t.Fatalf("the directory changed: %v %d:%d → %v %d:%d", before.Mode(), b.Uid, b.Gid, after.Mode(), a.Uid, a.Gid)
			}
			if _, err := os.Lstat(filepath.Join(dir, "executor.sock.lock")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a lock was left in it: %v", err)
			}
		})
	}
	// Another node's socket and its lock beside this one's, and the
	// launcher's notice to the agent (and what it is written as).
	dir := filepath.Join(t.TempDir(), "run")
	first, err := ListenUnix(filepath.Join(dir, "a.sock"), 65534)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for _, f := range []string{LauncherNotice, LauncherNotice + ".tmp"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	second, err := ListenUnix(filepath.Join(dir, "b.sock"), 65534)
	if err != nil {
		t.Fatalf("a directory of executors' sockets: %v", err)
	}
	second.Close()
}
