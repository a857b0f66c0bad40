package wire

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
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
	path := filepath.Join(dir, "executor.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := ListenUnix(path, 0); err == nil {
		ln.Close()
		t.Fatal("a regular file at the socket path was replaced")
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file at the socket path was touched: %q %v", b, err)
	}
}
