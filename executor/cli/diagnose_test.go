package cli

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// When an enrolment waits in vain, enrol says what root can see: no
// socket, no agent, or an agent (a real process, named mesh-agent, as
// another user) that may not reach the socket, and where it is stopped.
func TestAgentDiagnosis(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("runs as root, like enrol")
	}
	base, err := os.MkdirTemp("", "diagnose-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755) // the agent's user must reach its binary
	dir := filepath.Join(base, "run")
	os.Mkdir(dir, 0o700) // root's alone: the agent's user may not search it
	sock := filepath.Join(dir, "executor.sock")
	if got := agentDiagnosis("/nonexistent/state", sock); !strings.Contains(got, "there is no executor socket at "+sock) {
		t.Fatalf("%s", got)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if len(agentProcs()) == 0 {
		if got := agentDiagnosis("/nonexistent/state", sock); got != "no mesh-agent process is running" {
			t.Fatalf("%s", got)
		}
	}
	// An agent as uid 65534 for this socket: a copy of sh, named
	// mesh-agent, whose command line names the socket as the agent's
	// does; and another for the default socket, which is not said of.
	shell, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(shell)
	agent := filepath.Join(base, "mesh-agent")
	os.WriteFile(agent, b, 0o755)
	fake := func(args ...string) {
		t.Helper()
		// The shell waits on a read of a pipe nothing writes: a builtin, so
		// it forks no child — a forked child bears the same command line
		// until it execs, and was counted as a second agent for a moment.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(agent, append([]string{"-c", "read x", "mesh-agent"}, args...)...)
		cmd.Stdin = pr
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pr.Close()
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait(); pw.Close() })
	}
	fake("--user", "nobody")
	if got := agentDiagnosis("/nonexistent/state", sock); !strings.Contains(got, "no mesh-agent process is started for the socket "+sock) || !strings.Contains(got, wire.SocketPath) {
		t.Fatalf("only an agent of another socket: %s", got)
	}
	fake("--socket", sock, "--user", "nobody")
	want := "may not connect to the executor's socket " + sock + ": it may not search " + dir + " (uid 0, gid 0, mode 0700)"
	if got := agentDiagnosis("/nonexistent/state", sock); !strings.Contains(got, want) || !strings.Contains(got, "uid 65534") ||
		strings.Count(got, "may not connect") != 1 || !strings.Contains(got, "other mesh-agent processes name another socket") {
		t.Fatalf("%s\nwant %s, once", got, want)
	}
	// Let in through the directory, but the socket is root's 0600.
	os.Chmod(dir, 0o755)
	os.Chmod(sock, 0o600)
	if got := agentDiagnosis("/nonexistent/state", sock); !strings.Contains(got, "it may not write to "+sock) {
		t.Fatalf("%s", got)
	}
	// Its group may: it can reach the socket.
	os.Chown(sock, 0, 65534)
	os.Chmod(sock, 0o660)
	if got := agentDiagnosis("/nonexistent/state", sock); !strings.Contains(got, "can reach "+sock) {
		t.Fatalf("%s", got)
	}
}

// An agent's socket is read from its command line as its flag package
// reads it: -socket or --socket, with = or apart; vsock instead; the
// default when it names none; a relative path from its directory.
func TestAgentSocketFromItsCommandLine(t *testing.T) {
	cwd, _ := os.Readlink("/proc/self/cwd")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, wire.SocketPath},
		{[]string{"--user", "mesh-agent", "--state", "/s"}, wire.SocketPath},
		{[]string{"--socket", "/run/a.sock"}, "/run/a.sock"},
		{[]string{"-socket=/run/b.sock", "-v"}, "/run/b.sock"},
		{[]string{"--socket", "/run/a.sock", "--socket=/run/c.sock"}, "/run/c.sock"},
		{[]string{"--vsock", "2:1024", "--vsock-secret", "/s"}, "vsock 2:1024"},
		{[]string{"--socket", "run/d.sock"}, filepath.Join(cwd, "run/d.sock")},
	} {
		if got := agentSocket(os.Getpid(), c.args); got != c.want {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
}

// An enrolment is said to have nobody to finish it only when no daemon
// holds its state and no socket is where enrol looks: a daemon on another
// socket (enrol told the default) finishes it, and is said as such.
func TestAnEnrolmentADaemonOnAnotherSocketServesHasSomeoneToFinishIt(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	os.Mkdir(state, 0o700)
	nowhere := filepath.Join(t.TempDir(), "executor.sock")
	if !nobodyToFinish(state, nowhere) {
		t.Fatal("no daemon and no socket: someone to finish it")
	}
	lock, err := lockServe(state) // this process, as a daemon holds it
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if nobodyToFinish(state, nowhere) {
		t.Fatal("a daemon holds the state: nobody to finish it")
	}
	if got := agentDiagnosis(state, nowhere); !strings.Contains(got, "holds "+state+" on another socket than "+nowhere) {
		t.Fatalf("%s", got)
	}
}

// A path given relative to the working directory, or through a link, is
// the same path as given whole: status sees the daemon holding a state
// named so, doctor and enrol open them beneath as they open absolute ones.
func TestRelativePathsAreTheSamePaths(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o700)
	lock, err := lockServe(state) // this process, as a daemon holds it
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	os.WriteFile(filepath.Join(dir, "token"), []byte("not a token\n"), 0o600)
	t.Chdir(dir)
	code, out, errs := run("status", "--json", "--state", "state")
	var st struct {
		Running bool `json:"daemon_running"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || !st.Running {
		t.Errorf("status of a held state named relative: exit %d %v\n%s%s", code, err, out, errs)
	}
	// Named through a link: the same state, held by the same daemon.
	os.Symlink(state, filepath.Join(dir, "link"))
	if pid := serving(filepath.Join(dir, "link")); pid != os.Getpid() {
		t.Errorf("the state named through a link: held by pid %d, not this process's %d", pid, os.Getpid())
	}
	for _, args := range [][]string{{"doctor", "--state", "state"}, {"enrol", "--state", "state", "--token-file", "token", "--wait", "1s"}} {
		if _, out, errs := run(args...); strings.Contains(out+errs, "not absolute") {
			t.Errorf("%v:\n%s%s", args, out, errs)
		}
	}
}
