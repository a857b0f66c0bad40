package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// agentProc is the mesh's running agent.
func (m *mesh) agentProc() *exec.Cmd {
	m.t.Helper()
	for _, p := range m.procs {
		if filepath.Base(p.Path) == "mesh-agent" {
			return p
		}
	}
	m.t.Fatal("no agent runs")
	return nil
}

// An operator's mixture: the agent stopped (SIGSTOP), a plan asked of it
// and given up on, a declaration published; the agent resumed. The plan
// request and the declaration reach it at once, and each is answered as
// itself: the declaration is applied once and reported with the lines of
// what it changed, and the agent never reads one request's reply as
// another's.
func TestAPlanAndADeclarationToAStoppedAgent(t *testing.T) {
	m := newMesh(t)
	seq := m.declare(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"v1\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("%+v", r)
	}
	ag := m.agentProc()
	if err := ag.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer ag.Process.Signal(syscall.SIGCONT)
	f := filepath.Join(m.base, "plan.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"planned\n"}]}`, "{root}", m.tree)), 0o600)
	cmd := exec.Command(filepath.Join(bin, "mesh-control"), "plan", "n1", f, "--dir", m.ctl, "--wait=2s")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("a stopped agent answered a plan:\n%s", out)
	}
	seq2 := m.declare(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"v2\n"}]}`)
	if err := ag.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := m.reportFor(seq2)
	if r.Outcome != shapes.Applied || len(r.Lines) != 1 || r.Lines[0].ID != "motd" || r.Lines[0].Outcome != shapes.Applied {
		t.Errorf("the declaration applied after the resume reports %s with lines %+v", r.Outcome, r.Lines)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "v2\n" {
		t.Errorf("motd is %q", b)
	}
	eventually(t, "the plan answered", func() bool {
		for _, r := range m.reports(20) {
			if r.Trigger == "plan" {
				return true
			}
		}
		return false
	})
	b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
	for _, bad := range []string{"reading the answer to", "unknown message kind", "executor answered"} {
		if bytes.Contains(b, []byte(bad)) {
			t.Errorf("the agent logged %q", bad)
		}
	}
}

// A revoked node's agent tries less and less often: once the broker
// refuses its credential each wait is twice the one before, up to an hour,
// where it tried every two or three seconds for ever (an authentication
// error in the broker's log each time). mesh-executor status says the node is
// revoked, since when, and not merely disconnected.
func TestARevokedNodeTriesSeldom(t *testing.T) {
	m := newMesh(t)
	m.run("mesh-control", "node", "revoke", "n1", "--dir", m.ctl)
	eventually(t, "the agent refused by the broker", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return bytes.Contains(b, []byte("authorization refused by the broker"))
	})
	refusals := func() int {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-control.log"))
		return bytes.Count(b, []byte("authentication error"))
	}
	// Thirty seconds from the first refusal: ten or more attempts at the
	// old pace; at most four at the new (waits of 2, 4, 8, 16 s, a quarter
	// either way). Six leaves a margin for a busy machine either way.
	before := refusals()
	time.Sleep(30 * time.Second)
	if n := refusals() - before; n > 6 {
		t.Errorf("the revoked agent was refused %d times in 30 s", n)
	}
	var out string
	eventually(t, "status saying revoked", func() bool {
		out = m.run("mesh-executor", "status", "--state", m.state)
		return strings.HasPrefix(out, "state: enrolled, revoked\ndaemon: running (pid ") && strings.Contains(out, "\nlink: revoked by the control side at ")
	})
	if strings.Contains(out, "disconnected") {
		t.Errorf("status:\n%s", out)
	}
}
