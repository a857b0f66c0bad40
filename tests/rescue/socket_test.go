package rescue

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// servedBy dials the socket at path and returns the pid of the process
// listening there, as the kernel says (SO_PEERCRED).
func servedBy(t *testing.T, path string) int {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("nothing serves %s: %v", path, err)
	}
	defer c.Close()
	p, err := wire.PeerOf(c)
	if err != nil {
		t.Fatal(err)
	}
	return int(p.PID)
}

// A second daemon with its own state but the same socket path is refused
// by path, naming the executor that serves it, before it takes the socket:
// it used to remove the file and listen in its place, and on exit remove
// its own, leaving the first daemon running, unreachable, and its agent's
// status saying linked. The first one's socket file stays as it was and it
// still answers; once it is gone (killed, its file left stale), the next
// daemon takes the path.
func TestASecondServeOnTheSameSocketIsRefused(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	run := filepath.Join(base, "run")
	sock := filepath.Join(run, "executor.sock")
	first := startServe(t, filepath.Join(base, "a"), sock)
	waitFor(t, "the first daemon's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	snap := snapshotPath(t, sock)

	second := startServe(t, filepath.Join(base, "b"), sock)
	code := second.exited(t, 20*time.Second)
	want := sock + ": another executor (pid " + strconv.Itoa(first.cmd.Process.Pid) + ") is serving it"
	if code == 0 || !strings.Contains(second.out.String(), want) {
		t.Fatalf("the second serve on %s: exit %d\n%s\nwant %q", sock, code, second.out, want)
	}
	if d := sameAs(sock, snap); d != "" {
		t.Fatalf("the first daemon's socket was touched: %s", d)
	}
	if pid := servedBy(t, sock); pid != first.cmd.Process.Pid {
		t.Fatalf("%s is served by pid %d, not the first daemon (pid %d)", sock, pid, first.cmd.Process.Pid)
	}
	select {
	case <-first.done:
		t.Fatalf("the first daemon ended:\n%s", first.out)
	default:
	}

	// Killed, the first leaves a stale file: nothing listens, and the next
	// daemon replaces it.
	first.cmd.Process.Kill()
	<-first.done
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("a daemon killed with -9 leaves its socket file: %v", err)
	}
	third := startServe(t, filepath.Join(base, "b"), sock)
	waitFor(t, "the next daemon serving the stale path", func() bool {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if pid := servedBy(t, sock); pid != third.cmd.Process.Pid {
		t.Fatalf("%s is served by pid %d, not the new daemon (pid %d)", sock, pid, third.cmd.Process.Pid)
	}
	third.stop(t)
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("the daemon left its own socket behind: %v", err)
	}
}
