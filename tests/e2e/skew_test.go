package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// previousRelease is testdata/previous-release: the commit of the release
// before this one, and its version. The version skew policy
// (docs/operations.md) is proved against it; a release that changes the
// link or a format on disk records itself there once it ships.
func previousRelease(t *testing.T) (commit, version string) {
	t.Helper()
	b, err := os.ReadFile("testdata/previous-release")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		t.Fatalf("testdata/previous-release: want a commit and a version, got %q", b)
	}
	return f[0], f[1]
}

// buildPrevious builds the previous release's executor and agent from the
// repository's history (git archive of its commit, built as a release is,
// stamped build "prev"), into a directory the agent's user can run from.
func buildPrevious(t *testing.T) string {
	t.Helper()
	commit, version := previousRelease(t)
	if err := exec.Command("git", "-C", "../..", "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		shallow, _ := exec.Command("git", "-C", "../..", "rev-parse", "--is-shallow-repository").Output()
		if strings.TrimSpace(string(shallow)) == "true" {
			// .ci/run fetches the history of a shallow clone; this is a
			// clone it could not.
			t.Skipf("the previous release (%s, %s) is not in this shallow clone: git fetch --unshallow, then run again", version, commit)
		}
		t.Fatalf("the previous release's commit %s (testdata/previous-release) is not in this repository", commit)
	}
	dir, err := os.MkdirTemp("", "e2e-prev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755) // the agent, as nobody, runs from here
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o700)
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", "../..", commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	for _, c := range []string{"mesh-executor", "mesh-agent"} {
		b := exec.Command("go", "build", "-ldflags", "-X main.version="+version+" -X main.build=prev", "-o", filepath.Join(dir, c), "./cmd/"+c)
		b.Dir = src
		b.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := b.CombinedOutput(); err != nil {
			t.Fatalf("building the previous release's %s: %v\n%s", c, err, out)
		}
	}
	return dir
}

// The version skew policy, proved against the release before this one,
// built from the repository's history, in the two orders a fleet upgrades
// in: a control side of this release with nodes of the previous one
// (enrolled, declared to, planned, reported), and then, on such a node,
// the executor upgraded under the previous release's agent — which sees
// the new build, exits to be restarted onto its own, and this release's
// agent carries on with the store the previous executor wrote.
func TestThePreviousReleaseRunsWithThisOne(t *testing.T) {
	prev := buildPrevious(t)
	_, version := previousRelease(t)
	m := newBareMesh(t)
	m.from = map[string]string{"mesh-executor": prev, "mesh-agent": prev}
	startExecutor := func(build string) *exec.Cmd {
		cmd := m.start("mesh-executor", nil, "serve", "--state", m.state, "--socket", m.sock, "--agent-user", "nobody", "--drift", "0", "--build", build)
		eventually(t, "the executor's socket", func() bool { _, err := os.Stat(m.sock); return err == nil })
		return cmd
	}
	oldExecutor := startExecutor("prev")
	oldAgent := m.startAgent("--config", m.agentConfig())

	// Control side new, node old: enrolled, declared to, planned.
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from, of the previous release", func() bool {
		n := m.node()
		return n["executor_version"] == version && n["state"] == link.StateEnrolled
	})
	if n := m.node(); n["capability"] != float64(0) || n["outside_skew"] != nil {
		t.Fatalf("a node of the previous release: capability %v, outside the policy %v", n["capability"], n["outside_skew"])
	}
	s1 := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"from the previous release\n"}]}`)
	if r := m.reportFor(s1); r.Outcome != shapes.Applied {
		t.Fatalf("the previous release's node on seq %d: %+v", s1, r)
	}
	plan := filepath.Join(m.base, "plan.json")
	os.WriteFile(plan, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"planned\n"}]}`, "{root}", m.tree)), 0o600)
	if out := m.run("mesh-control", "plan", "n1", plan, "--dir", m.ctl); !strings.Contains(out, "motd") {
		t.Fatalf("a plan answered by the previous release's node:\n%s", out)
	}

	// The executor upgraded under the previous release's agent, as the
	// launcher restarts it onto a new binary: the agent exits, cleanly,
	// to be restarted onto its own.
	oldExecutor.Process.Signal(syscall.SIGTERM)
	oldExecutor.Wait()
	os.Remove(m.sock)
	// The package installs both binaries: the agent's replaced under the
	// running agent (renamed over it), which an agent told of another
	// build restarts onto; with its own binary still in place it would
	// wait for one.
	newAgent, err := os.ReadFile(filepath.Join(bin, "mesh-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prev, "mesh-agent.new"), newAgent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(prev, "mesh-agent.new"), filepath.Join(prev, "mesh-agent")); err != nil {
		t.Fatal(err)
	}
	m.from = nil
	startExecutor("e2e")
	exited := make(chan error, 1)
	go func() { exited <- oldAgent.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("the previous release's agent, under a new executor: %v (a clean exit is what its init restarts at once)", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the previous release's agent carried on under an executor of another build")
	}
	log, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
	if !bytes.Contains(log, []byte("runs another build")) {
		t.Fatalf("the previous release's agent did not say why it exited:\n%s", log)
	}
	m.startAgent("--config", m.agentConfig())
	eventually(t, "n1 heard from, of this release", func() bool {
		n := m.node()
		return n["executor_version"] == "e2e" && n["capability"] == float64(link.Capability)
	})
	s2 := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"from this release\n"}]}`)
	if r := m.reportFor(s2); r.Outcome != shapes.Applied {
		t.Fatalf("seq %d after the upgrade: %+v", s2, r)
	}
	// The store the previous executor wrote, read by this one: the file
	// it made is still the mesh's, changed in place, not found anew.
	owned := m.run("mesh-executor", "owned", "--state", m.state)
	if !strings.Contains(owned, filepath.Join(m.tree, "motd")) {
		t.Fatalf("after the upgrade the store does not hold what the previous release made:\n%s", owned)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "from this release\n" {
		t.Fatalf("motd: %q", b)
	}
}

// A rollback to the release before while a rekey's enrolment is pending:
// that release reads the pending enrolment (its files are read strictly,
// so the new WireGuard key is kept beside it, in a file it does not know)
// and finishes it as an ordinary replacement, presenting the WireGuard
// key the executor has. Back on this release, the new key nobody names
// any more is removed, and the node is declared to.
func TestARollbackDuringARekeyFinishesIt(t *testing.T) {
	prev := buildPrevious(t)
	_, version := previousRelease(t)
	m := newBareMesh(t)
	executor := m.startExecutor()
	agent := m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	before, _, keys := m.nodeKeys()
	wgBefore := keys["wireguard"]

	// The enrolment a rekey's answer begins (every key new, the
	// WireGuard key too), made as the answer makes it, with the node's
	// daemons stopped: then the launcher rolls the node back.
	for _, p := range []*exec.Cmd{agent, executor} {
		p.Process.Signal(syscall.SIGTERM)
		p.Wait()
	}
	os.Remove(m.sock)
	tok, err := wire.ParseToken(m.issue("--node", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := enrol.BeginWith(m.state, tok, enrol.Options{Replace: true, NewWireGuard: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.state, enrol.PendingWireGuardFile)); err != nil {
		t.Fatalf("the rekey's new WireGuard key: %v", err)
	}

	m.from = map[string]string{"mesh-executor": prev, "mesh-agent": prev}
	if p := m.executorStatus()["pending"]; p == nil {
		t.Fatalf("the release before does not read the rekey's pending enrolment: %v", m.executorStatus())
	}
	m.start("mesh-executor", nil, "serve", "--state", m.state, "--socket", m.sock, "--agent-user", "nobody", "--drift", "0", "--build", "prev")
	eventually(t, "the executor's socket", func() bool { _, err := os.Stat(m.sock); return err == nil })
	m.startAgent("--config", m.agentConfig())
	eventually(t, "the rekey's enrolment finished by the release before", func() bool {
		e, _, _ := m.nodeKeys()
		n := m.node()
		return e != "" && e != before && n["executor_version"] == version && n["state"] == link.StateEnrolled
	})
	if _, _, keys := m.nodeKeys(); keys["wireguard"] != wgBefore {
		t.Fatalf("the release before presented WireGuard key %v, not the executor's own %v", keys["wireguard"], wgBefore)
	}
	s1 := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"rolled back\n"}]}`)
	if r := m.reportFor(s1); r.Outcome != shapes.Applied {
		t.Fatalf("seq %d on the release before: %+v", s1, r)
	}
	if _, err := os.Stat(filepath.Join(m.state, enrol.PendingWireGuardFile)); err != nil {
		t.Fatalf("the release before removed a file it does not know: %v", err)
	}

	// This release again: the key left behind goes, and the node goes on.
	for _, p := range m.procs[len(m.procs)-2:] {
		p.Process.Signal(syscall.SIGTERM)
		p.Wait()
	}
	os.Remove(m.sock)
	m.from = nil
	m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	eventually(t, "the key no enrolment names removed", func() bool {
		_, err := os.Stat(filepath.Join(m.state, enrol.PendingWireGuardFile))
		return errors.Is(err, os.ErrNotExist)
	})
	s2 := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"this release\n"}]}`)
	if r := m.reportFor(s2); r.Outcome != shapes.Applied {
		t.Fatalf("seq %d back on this release: %+v", s2, r)
	}
}
