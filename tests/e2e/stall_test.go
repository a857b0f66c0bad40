package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The operator's commands outlast a broker that stalls, as a busy control
// machine's does: serve (its embedded broker inside) is stopped for 7 s
// — longer than the 5 s nats.go gives a connection's handshake by
// default — as each command starts, so the stall meets the handshake;
// each command waits, and ends as it would have.
func TestCommandsOutlastAStalledBroker(t *testing.T) {
	m := newMesh(t)
	serve := m.procs[0]
	decl := filepath.Join(m.base, "stall.json")
	os.WriteFile(decl, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"after a stall\n"}]}`, "{root}", m.tree)), 0o600)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"nodes", "--json"}, `"name": "n1"`},
		{[]string{"declare", "n1", decl, "--json"}, `"seq"`},
		{[]string{"node", "show", "n1", "--json"}, `"record"`},
		{[]string{"token", "issue", "--new", "--name", "later"}, "nmt1-"},
		{[]string{"status"}, "nodes"},
	} {
		serve.Process.Signal(syscall.SIGSTOP)
		cmd := exec.Command(m.binary("mesh-control"), append(c.args, "--dir", m.ctl)...)
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			serve.Process.Signal(syscall.SIGCONT)
			t.Fatal(err)
		}
		time.Sleep(7 * time.Second)
		serve.Process.Signal(syscall.SIGCONT)
		if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), c.says) {
			t.Errorf("mesh-control %v across a 7 s stall: %v\n%s", c.args, err, out)
		}
	}
}
