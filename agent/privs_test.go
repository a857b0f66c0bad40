package agent_test

import (
	"bufio"
	"errors"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// openDir is a temporary directory that another user can reach (the
// test's own are 0700 under a 0700 parent).
func openDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "mesh-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// buildAgent builds cmd/mesh-agent as it ships (CGO_ENABLED=0).
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(openDir(t), "mesh-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nox-mesh/nox-mesh-host/cmd/mesh-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startHosted starts the real binary without an identity and waits until
// it says it is hosted; it returns the process.
func startHosted(t *testing.T, bin string, cred *syscall.Credential, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	said := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			said <- sc.Text()
		}
		close(said)
	}()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case l, ok := <-said:
			if !ok {
				t.Fatalf("mesh-agent exited: %v", cmd.Wait())
			}
			t.Log(l)
			if strings.Contains(l, "hosted: no identity; not dialling") {
				go func() {
					for range said {
					}
				}()
				return cmd
			}
		case <-timeout:
			t.Fatal("mesh-agent never said it is hosted")
		}
	}
}

// The privilege drop, in the real binary started as root: every thread of
// the running daemon is nobody's (uid and gid, all four ids), with no
// supplementary groups, every capability set empty (bounding included) and
// no_new_privs set, as the kernel reports from outside the process. Without
// an identity it stays up and opens no socket. Started as nobody already,
// it only checks, and is as confined. SIGTERM ends it with 0.
func TestPrivilegeDrop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to start the agent as root (make test runs as root)")
	}
	bin := buildAgent(t)
	uid, gid, err := agent.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	base := openDir(t)
	state := filepath.Join(base, "state")

	cmd := startHosted(t, bin, nil, "--user", "nobody", "--state", state, "--config", filepath.Join(base, "none.json"))
	pid := itoa(uint64(cmd.Process.Pid))
	if err := agent.Confined(pid, uid, gid, true); err != nil {
		t.Fatal(err)
	}
	c, err := agent.ReadCreds("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if c.UID != [4]int{uid, uid, uid, uid} || len(c.Groups) != 0 || c.CapEff != 0 || c.CapPrm != 0 || c.CapBnd != 0 || c.NoNewPrivs != 1 {
		t.Fatalf("after the drop: %+v", c)
	}
	tasks, _ := filepath.Glob("/proc/" + pid + "/task/*")
	t.Logf("%d threads confined: uid %v gid %v groups %v CapEff %x CapBnd %x NoNewPrivs %d", len(tasks), c.UID, c.GID, c.Groups, c.CapEff, c.CapBnd, c.NoNewPrivs)
	// No socket off the machine: a hosted agent never dials. A unix
	// socket is its look at the executor (every few seconds), which it
	// may hold at the instant of reading.
	unixSockets, _ := os.ReadFile("/proc/" + pid + "/net/unix")
	fds, _ := filepath.Glob("/proc/" + pid + "/fd/*")
	for _, fd := range fds {
		l, _ := os.Readlink(fd)
		inode, ok := strings.CutPrefix(l, "socket:[")
		if !ok {
			continue
		}
		inode = strings.TrimSuffix(inode, "]")
		local := false
		for _, line := range strings.Split(string(unixSockets), "\n") {
			if f := strings.Fields(line); len(f) >= 7 && f[6] == inode {
				local = true
			}
		}
		if !local {
			t.Fatalf("a hosted agent holds a socket that is not a unix one (%s, %s)", fd, l)
		}
	}
	fi, err := os.Stat(state)
	if err != nil || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Fatalf("state directory %s: %v %v", state, fi.Mode(), err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}

	// Started as nobody already: it checks and confines itself as far as
	// an unprivileged process can (the bounding set stays the kernel's).
	cmd = startHosted(t, bin, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		"--user", "nobody", "--state", state, "--config", filepath.Join(base, "none.json"))
	if err := agent.Confined(itoa(uint64(cmd.Process.Pid)), uid, gid, false); err != nil {
		t.Fatal(err)
	}

	// Root may start it only to drop to an unprivileged user.
	if out, err := exec.Command(bin, "--user", "root", "--state", state, "--self-check").CombinedOutput(); err == nil {
		t.Fatalf("mesh-agent --user root ran: %s", out)
	}
	// The self-check an upgrade runs prints the JSON form every output
	// keeps, and touches no state: not the directory it is named (a
	// running agent's), nor one it would have made.
	fresh, held := filepath.Join(base, "fresh"), filepath.Join(base, "held")
	os.Mkdir(held, 0o750) // another agent's, say: root's here
	for _, st := range []string{held, fresh} {
		before, _ := os.Stat(st)
		out, err := exec.Command(bin, "--user", "nobody", "--state", st, "--self-check").Output()
		if err := errors.Join(err, jsonform.Check(out)); err != nil || !strings.Contains(string(out), `"confined": true`) {
			t.Fatalf("--self-check: %v\n%s", err, out)
		}
		after, err := os.Stat(st)
		if before == nil && err == nil {
			t.Errorf("--self-check made %s", st)
		}
		if before != nil && (after == nil || after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid || after.Mode() != before.Mode()) {
			t.Errorf("--self-check changed %s: %v to %v", st, before.Mode(), after)
		}
	}
}
