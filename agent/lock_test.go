package agent_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// runBinary runs the real binary with cred (nil: as this test, root) until
// it exits or said reports true of a line of its log; it returns the
// lines, whether it exited and its exit code. A process still running is
// killed at the end of the test.
func runBinary(t *testing.T, bin string, cred *syscall.Credential, said func(string) bool, args ...string) (lines []string, exited bool, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ch := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
	}()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case l, ok := <-ch:
			if !ok {
				err := cmd.Wait()
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					t.Fatal(err)
				}
				return lines, true, cmd.ProcessState.ExitCode()
			}
			t.Log(l)
			lines = append(lines, l)
			if said != nil && said(l) {
				go func() {
					for range ch {
					}
				}()
				return lines, false, 0
			}
		case <-timeout:
			return lines, false, 0
		}
	}
}

// One agent holds a state directory: a second one, started as root (even
// to drop to another user) or as the agent's user, exits 1 naming the
// running agent by pid before it touches the directory; the first goes on,
// and its directory stays its own.
func TestSecondAgentRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to start agents as root and as nobody (make test runs as root)")
	}
	bin := buildAgent(t)
	uid, gid, err := agent.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	base := openDir(t)
	state := filepath.Join(base, "state")
	args := []string{"--state", state, "--config", filepath.Join(base, "none.json"), "--socket", filepath.Join(base, "none.sock")}
	first := startHosted(t, bin, nil, append([]string{"--user", "nobody"}, args...)...)
	want := fmt.Sprintf("refused: another mesh-agent (pid %d) holds %s; stop it first", first.Process.Pid, state)
	nobody := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	for _, c := range []struct {
		name string
		cred *syscall.Credential
		user string
	}{
		{"as root", nil, "nobody"},
		{"as root, for another user", nil, "daemon"},
		{"as the agent's user", nobody, "nobody"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lines, exited, code := runBinary(t, bin, c.cred, nil, append([]string{"--user", c.user}, args...)...)
			out := strings.Join(lines, "\n")
			if !exited || code != 1 || !strings.Contains(out, want) {
				t.Fatalf("a second agent: exited %v code %d, want exit 1 saying %q:\n%s", exited, code, want, out)
			}
		})
	}
	if err := first.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the first agent: %v", err)
	}
	fi, err := os.Stat(state)
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the state directory after the refusals: %v %v", fi.Mode(), err)
	}
	if b, err := os.ReadFile(filepath.Join(state, agent.StateLockRecord)); err != nil || string(b) != fmt.Sprintf("%d mesh-agent\n", first.Process.Pid) {
		t.Fatalf("%s: %q %v", agent.StateLockRecord, b, err)
	}
	first.Process.Signal(syscall.SIGTERM)
	if err := first.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}
	// Free again once it has stopped.
	startHosted(t, bin, nobody, append([]string{"--user", "nobody"}, args...)...)
}

// An agent whose state directory it cannot write refuses to start, saying
// which directory, whose it is, its mode and what to do — it does not run
// on with a memory that would not outlive a restart. One that cannot make
// its missing state directory says so too.
func TestStateDirNotWritableRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to make directories the agent's user cannot write")
	}
	bin := buildAgent(t)
	uid, gid, err := agent.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	nobody := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	base := openDir(t)
	rootsOwn := filepath.Join(base, "roots")
	os.Mkdir(rootsOwn, 0o755)
	for _, c := range []struct {
		name, state, want string
	}{
		{"root's directory", rootsOwn, fmt.Sprintf("refusing to start: the state directory is not writable: cannot write in %s: permission denied (it is root's, mode 0755; the agent runs as uid %d gid %d and keeps its memory there: make the directory its own (chown %d:%d %s, mode 0700)", rootsOwn, uid, gid, uid, gid, rootsOwn)},
		{"missing, under root's", filepath.Join(rootsOwn, "sub", "state"), fmt.Sprintf("refusing to start: the state directory cannot be made: cannot create %s: permission denied (%s is root's, mode 0755; the agent runs as uid %d", filepath.Join(rootsOwn, "sub", "state"), rootsOwn, uid)},
	} {
		t.Run(c.name, func(t *testing.T) {
			lines, exited, code := runBinary(t, bin, nobody, nil, "--user", "nobody", "--state", c.state,
				"--config", filepath.Join(base, "none.json"), "--socket", filepath.Join(base, "none.sock"))
			out := strings.Join(lines, "\n")
			if !exited || code != 1 || !strings.Contains(out, c.want) || strings.Contains(out, "in memory") {
				t.Fatalf("exited %v code %d, want exit 1 saying %q:\n%s", exited, code, c.want, out)
			}
		})
	}
	if entries, _ := os.ReadDir(rootsOwn); len(entries) != 0 {
		t.Fatalf("the refused agent left %v behind", entries)
	}
}
