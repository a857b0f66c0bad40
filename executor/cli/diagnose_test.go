package cli

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
	if got := agentDiagnosis(sock); !strings.Contains(got, "there is no executor socket at "+sock) {
		t.Fatalf("%s", got)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if len(agentProcs()) == 0 {
		if got := agentDiagnosis(sock); got != "no mesh-agent process is running" {
			t.Fatalf("%s", got)
		}
	}
	// An agent as uid 65534: a copy of sleep, named mesh-agent.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(sleep)
	agent := filepath.Join(base, "mesh-agent")
	os.WriteFile(agent, b, 0o755)
	cmd := exec.Command(agent, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	want := "may not connect to the executor's socket " + sock + ": it may not search " + dir + " (uid 0, gid 0, mode 0700)"
	if got := agentDiagnosis(sock); !strings.Contains(got, want) || !strings.Contains(got, "uid 65534") {
		t.Fatalf("%s\nwant %s", got, want)
	}
	// Let in through the directory, but the socket is root's 0600.
	os.Chmod(dir, 0o755)
	os.Chmod(sock, 0o600)
	if got := agentDiagnosis(sock); !strings.Contains(got, "it may not write to "+sock) {
		t.Fatalf("%s", got)
	}
	// Its group may: it can reach the socket.
	os.Chown(sock, 0, 65534)
	os.Chmod(sock, 0o660)
	if got := agentDiagnosis(sock); !strings.Contains(got, "can reach "+sock) {
		t.Fatalf("%s", got)
	}
}
