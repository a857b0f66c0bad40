package serve

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/launcher"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// statusLoop is an agent that says hello and asks the executor's status
// every 20 ms for SERVE_TEST_FOR, as the agent does every few seconds.
func statusLoop(sock string) int {
	d, _ := time.ParseDuration(os.Getenv("SERVE_TEST_FOR"))
	c, err := wire.DialUnix(sock, 0)
	if err != nil {
		return 3
	}
	defer c.Close()
	if c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"}) != nil {
		return 3
	}
	if k, _, err := c.Read(); err != nil || k != wire.KindHelloReply {
		return 3
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if c.Write(wire.KindStatus, &wire.Status{}) != nil {
			return 4
		}
		if k, _, err := c.Read(); err != nil || k != wire.KindStatusReply {
			return 4
		}
	}
	return 0
}

// runAgent runs a copy of the test binary at bin as the agent's uid, for d.
func (e *env) runAgent(bin string, d time.Duration) {
	e.t.Helper()
	if _, err := os.Stat(bin); err != nil {
		self, _ := os.ReadFile(os.Args[0])
		if err := os.WriteFile(bin, self, 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	for attempt := 0; ; attempt++ {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = []string{"SERVE_TEST_CHILD=status-loop", "SERVE_TEST_SOCK=" + e.sock, "SERVE_TEST_FOR=" + d.String()}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		err := cmd.Run()
		if errors.Is(err, syscall.ETXTBSY) && attempt < 20 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			e.t.Fatalf("agent %s: %v", bin, err)
		}
		return
	}
}

// The executor proves the agent only by what it sees: the agent's uid, one
// process that stays up past the proof's time, running the installed
// binary. An agent that lives shorter (a crash loop), or runs another
// binary (the release before an upgrade, not yet restarted), proves
// nothing; the installed one that stays up is recorded in the launch
// state, and the release is offered to Healthy again.
func TestTheAgentProvesItselfByStayingUp(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	installed := filepath.Join(e.base, "mesh-agent")
	var healthy atomic.Int32
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, AgentBinary: installed, AgentProofAfter: 400 * time.Millisecond,
		Healthy: func() error { healthy.Add(1); return nil }})
	e.afterStart()
	proven := func() string {
		s, err := launcher.ReadState(e.state)
		if err != nil {
			t.Fatal(err)
		}
		if s.Agent == nil {
			return ""
		}
		return s.Agent.Proven
	}
	before := healthy.Load()

	e.runAgent(installed, 200*time.Millisecond) // a crash loop's life
	// Another release's agent: other bytes (the test binary with one
	// more at its end, which runs as it did).
	old := filepath.Join(e.base, "old-agent")
	self, _ := os.ReadFile(os.Args[0])
	if err := os.WriteFile(old, append(self, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	e.runAgent(old, time.Second)
	time.Sleep(100 * time.Millisecond)
	if p := proven(); p != "" {
		t.Fatalf("proven by an agent that did not stay up, or ran another binary: %s", p)
	}
	if healthy.Load() != before {
		t.Error("Healthy was offered the release with no agent proven")
	}

	e.runAgent(installed, time.Second)
	want, err := launcher.FileDigest(installed)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for proven() != want || healthy.Load() == before {
		if time.Now().After(deadline) {
			t.Fatalf("the installed agent stayed up a second and is not proven (%q, want %s; Healthy called %d times after the start)", proven(), want, healthy.Load()-before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A rollback by copying writes the known-good release's binaries anew: the
// agent running from the file before, the same bytes, is proven all the
// same (it was never seen to stay up, so the release never became known
// good again).
func TestTheSameBytesInstalledAgainProveTheAgent(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	installed := filepath.Join(e.base, "mesh-agent")
	self, _ := os.ReadFile(os.Args[0])
	if err := os.WriteFile(installed, self, 0o755); err != nil {
		t.Fatal(err)
	}
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, AgentBinary: installed, AgentProofAfter: 300 * time.Millisecond})
	e.dial()
	done := make(chan struct{})
	go func() { defer close(done); e.runAgent(installed, 2*time.Second) }()
	time.Sleep(200 * time.Millisecond) // running, from the file installed first
	again := installed + ".new"
	if err := os.WriteFile(again, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(again, installed); err != nil {
		t.Fatal(err)
	}
	<-done
	s, err := launcher.ReadState(e.state)
	want, _ := launcher.FileDigest(installed)
	if err != nil || s.Agent == nil || s.Agent.Proven != want {
		t.Fatalf("the agent running the same bytes as installed again is not proven: %+v %v", s.Agent, err)
	}
}
