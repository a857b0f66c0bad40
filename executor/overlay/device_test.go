package overlay

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A WireGuard process being removed is asked to end, killed when it does
// not within the grace, and only then is the removal done: a process that
// ignores SIGTERM is gone when endProcess returns nil, never still running
// behind a reported removal. An ended child not yet reaped (a zombie)
// counts as ended. One that is no longer the one (still says no) is not
// signalled at all.
func TestEndProcess(t *testing.T) {
	defer func(g time.Duration) { processGrace = g }(processGrace)
	processGrace = 300 * time.Millisecond
	for _, c := range []struct {
		name, script string
		still        bool
		want         syscall.Signal // 0: not signalled
	}{
		{"ends on SIGTERM", "exec sleep 60", true, syscall.SIGTERM},
		{"ignores SIGTERM", "trap '' TERM; echo ready; while :; do sleep 0.05; done", true, syscall.SIGKILL},
		{"no longer the one", "echo ready; exec sleep 60", false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", c.script)
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if strings.Contains(c.script, "ready") {
				bufio.NewReader(out).ReadString('\n') // the trap is set
			}
			start := time.Now()
			if err := endProcess(context.Background(), cmd.Process.Pid, func() bool { return c.still }); err != nil {
				t.Fatalf("endProcess: %v", err)
			}
			if c.want == 0 {
				if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
					t.Fatalf("a process that is not the one was signalled: %v", err)
				}
				return
			}
			// Not reaped yet: a zombie, which kill(pid, 0) still finds.
			if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
				t.Fatalf("the child was reaped by someone else: %v", err)
			}
			err := cmd.Wait()
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != c.want {
				t.Fatalf("it ended with %v (%v), want by %v", err, ws, c.want)
			}
			if c.want == syscall.SIGKILL && time.Since(start) < processGrace {
				t.Fatalf("killed after %v, before the grace of %v", time.Since(start), processGrace)
			}
		})
	}
}

// wireguard-go listens on its socket, then daemonises: the process that
// called listen() exits and a child holds the socket. The process to end is
// the one holding it — found by the socket's inode — not the one
// SO_PEERCRED names (the exited parent, whose pid may be another's by now).
// This test's binary plays wireguard-go: run with OVERLAY_TEST_DAEMON set,
// it listens, hands the socket to a child in its own session, and exits.
func TestTheDaemonIsFoundByItsSocket(t *testing.T) {
	switch os.Getenv("OVERLAY_TEST_DAEMON") {
	case "listen":
		l, err := net.Listen("unix", os.Getenv("OVERLAY_TEST_SOCKET"))
		if err != nil {
			os.Exit(3)
		}
		f, _ := l.(*net.UnixListener).File()
		d := exec.Command(os.Args[0], "-test.run=^TestTheDaemonIsFoundByItsSocket$")
		d.Env = append(os.Environ(), "OVERLAY_TEST_DAEMON=serve")
		d.ExtraFiles = []*os.File{f}
		d.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := d.Start(); err != nil {
			os.Exit(4)
		}
		os.Stdout.WriteString(strconv.Itoa(d.Process.Pid) + "\n")
		os.Exit(0)
	case "serve":
		time.Sleep(time.Hour) // holding the socket (fd 3)
		os.Exit(0)
	}
	sock := filepath.Join(t.TempDir(), "wgtest.sock")
	parent := exec.Command(os.Args[0], "-test.run=^TestTheDaemonIsFoundByItsSocket$")
	parent.Env = append(os.Environ(), "OVERLAY_TEST_DAEMON=listen", "OVERLAY_TEST_SOCKET="+sock)
	out, err := parent.Output()
	if err != nil {
		t.Fatalf("the daemonising parent: %v", err)
	}
	daemon, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the parent said %q", out)
	}
	t.Cleanup(func() { syscall.Kill(daemon, syscall.SIGKILL) })
	if parent.ProcessState.Pid() == daemon {
		t.Fatal("the daemon is the parent")
	}
	var pids []int
	var inodes map[uint64]bool
	deadline := time.Now().Add(10 * time.Second)
	for len(pids) == 0 && time.Now().Before(deadline) { // the child is up
		if pids, inodes, err = socketHolders(sock); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !slices.Equal(pids, []int{daemon}) {
		t.Fatalf("the socket's holders are %v, want the daemon %d (the parent was %d)", pids, daemon, parent.ProcessState.Pid())
	}
	if err := endProcess(context.Background(), daemon, func() bool { return holding(daemon, inodes) }); err != nil {
		t.Fatal(err)
	}
	if pids, _, err := socketHolders(sock); err != nil || len(pids) != 0 {
		t.Fatalf("after it ended, the socket's holders are %v (%v)", pids, err)
	}
}
