package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The overlay is applied for real here: userspace wireguard-go (this
// kernel has no WireGuard), started by the executor in its own session as
// on a machine without systemd. So that it touches nothing of this
// machine's, each executor runs in fresh network and mount namespaces,
// with a private /run/wireguard (where wireguard-go keeps its socket);
// everything else — the state directory, the executor's socket the agent
// dials, the tree — is the same filesystem. The agent stays in the
// machine's namespaces: it is the one that reaches the broker.

// isolatedExecutor starts m's executor in fresh network and mount
// namespaces, and returns its process. At the end of the test the
// wireguard-go it started, which lives on in its namespace, is ended by
// its pid.
func (m *mesh) isolatedExecutor() *exec.Cmd {
	m.t.Helper()
	args := append([]string{"--mount", "--net", "--propagation", "private", "--", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 tmpfs /run/wireguard && exec "$0" "$@"`, filepath.Join(bin, "mesh-executor")},
		"serve", "--state", m.state, "--socket", m.sock, "--agent-user", "nobody", "--drift", "0", "--build", "e2e")
	cmd := exec.Command("unshare", args...)
	logf, err := os.Create(filepath.Join(m.base, "mesh-executor.log"))
	if err != nil {
		m.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := os.MkdirAll("/run/wireguard", 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	eventually(m.t, "the executor's socket", func() bool { _, err := os.Stat(m.sock); return err == nil })
	netns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	m.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		// What the executor started in its namespace: its wireguard-go.
		pids, _ := filepath.Glob("/proc/[0-9]*/ns/net")
		for _, p := range pids {
			if l, err := os.Readlink(p); err == nil && l == netns {
				if pid, err := strconv.Atoi(strings.Split(p, "/")[2]); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if m.t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			m.t.Logf("mesh-executor (%s) log:\n%s", m.base, b)
		}
	})
	return cmd
}

// inside runs argv in ex's namespaces: what the machine itself says,
// outside the executor.
func inside(t *testing.T, ex *exec.Cmd, argv ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(ex.Process.Pid), "-n", "-m"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v in the executor's namespaces: %v\n%s", argv, err, out)
	}
	return strings.TrimSpace(string(out))
}

// second is another machine of m's mesh: its own directories, the same
// control side.
func (m *mesh) second(name string) *mesh {
	base := filepath.Join(m.base, name)
	m2 := &mesh{t: m.t, base: base, ctl: m.ctl, port: m.port, state: filepath.Join(base, "executor"),
		tree: filepath.Join(base, "tree"), sock: filepath.Join(base, "run", "executor.sock")}
	os.MkdirAll(m2.tree, 0o755)
	os.MkdirAll(m2.state, 0o700)
	os.Chmod(base, 0o755)
	return m2
}

// enrolledSecond is second(name) with its executor and agent started and
// enrolled as a new node of that name; its agent's process, for a test
// that stops it.
func (m *mesh) enrolledSecond(name string) (*mesh, *exec.Cmd) {
	m.t.Helper()
	m2 := m.second(name)
	m2.startExecutor()
	agent := m2.startAgent("--config", m2.agentConfig())
	m2.enrolled(m.issue("--new", "--name", name), name)
	return m2, agent
}

// reportsOf is node's reports of the declarations it applied (or was
// refused), oldest first.
func (m *mesh) reportsOf(node string) []report {
	var rs struct {
		Reports []report `json:"reports"`
	}
	out, _ := exec.Command(filepath.Join(bin, "mesh-control"), "reports", node, "--dir", m.ctl, "--json", "--last", "50").Output()
	json.Unmarshal(out, &rs)
	var decls []report
	for _, r := range rs.Reports {
		if r.Trigger == "declaration" && r.Outcome != shapes.Superseded {
			decls = append(decls, r)
		}
	}
	return decls
}

func lineKeys(r report) string {
	var ks []string
	for _, l := range r.Lines {
		ks = append(ks, l.Module+"."+l.ID+"="+string(l.Outcome))
	}
	return strings.Join(ks, " ")
}

// The overlay first, then the assignments, with real processes: once the
// mesh has an overlay, each node is sent its overlay alone, which its
// executor applies (wireguard-go, in the executor's namespaces), with the
// other node as its peer by the key its executor bound at enrolment; a
// module assigned meanwhile is held, said so by `nodes`, and applied after
// the node reported its overlay applied; an endpoint given for a node
// reaches its peer. Nothing on the executor side is stood in for.
func TestOverlayFirstThenAssignments(t *testing.T) {
	if _, err := exec.LookPath("wireguard-go"); err != nil {
		t.Fatal("wireguard-go is missing (tests/install-deps.sh installs it)")
	}
	m := newBareMesh(t)
	ex1 := m.isolatedExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	// A second machine. Its agent stops after enrolment, so what is
	// declared to it waits on the broker.
	m2 := m.second("m2")
	ex2 := m2.isolatedExecutor()
	agent2 := m2.startAgent("--config", m2.agentConfig())
	m2.enrolled(m.issue("--new", "--name", "n2"), "n2")
	agent2.Process.Signal(syscall.SIGTERM)
	agent2.Wait()
	mod := filepath.Join(m.base, "site.json")
	os.WriteFile(mod, []byte(strings.ReplaceAll(`{"version":1,"resources":[
		{"module":"site","id":"dir","type":"directory","path":"{root}/site"},
		{"module":"site","id":"index","type":"file","path":"{root}/site/index.html","content":"after the overlay\n"}]}`, "{root}", m2.tree)), 0o600)

	// Without an overlay, nothing is assigned.
	if out, err := exec.Command(filepath.Join(bin, "mesh-control"), "assign", "n2", mod, "--dir", m.ctl).CombinedOutput(); err == nil || !strings.Contains(string(out), "no overlay is set") {
		t.Fatalf("assign without an overlay: %v %s", err, out)
	}
	iface := fmt.Sprintf("e2e%d", m.port)
	m.run("mesh-control", "overlay", "set", "--dir", m.ctl, "--network", "10.231.77.0/24", "--interface", iface)
	var r1 report
	eventually(t, "n1 applied its overlay", func() bool {
		rs := m.reportsOf("n1")
		if len(rs) > 0 {
			r1 = rs[0]
		}
		return len(rs) > 0
	})
	if r1.Outcome != shapes.Applied || lineKeys(r1) != "mesh.overlay=applied" {
		t.Fatalf("n1's first declaration: %+v", r1)
	}
	if got := inside(t, ex1, "ip", "-br", "addr", "show", iface); !strings.Contains(got, "10.231.77.1/24") {
		t.Fatalf("n1's interface: %s", got)
	}
	if got := inside(t, ex1, "wg", "show", iface, "listen-port"); got != "51820" {
		t.Fatalf("n1's listen port: %s", got)
	}

	out := m.run("mesh-control", "assign", "n2", mod, "--dir", m.ctl)
	if !strings.Contains(out, "assignments held until the node reports its overlay applied") {
		t.Fatalf("assign to a node that has not applied its overlay:\n%s", out)
	}
	if n := m.nodeNamed("n2"); !strings.HasPrefix(fmt.Sprint(n["assignments"]), "held until the node reports its overlay applied") {
		t.Fatalf("nodes says of n2: %v", n["assignments"])
	}
	if text := m.run("mesh-control", "nodes", "--dir", m.ctl); !strings.Contains(text, "held until the node reports its overlay applied") {
		t.Fatalf("nodes:\n%s", text)
	}
	m2.startAgent("--config", m2.agentConfig())
	var rs []report
	eventually(t, "n2 applied its module", func() bool {
		rs = m.reportsOf("n2")
		return len(rs) > 0 && lineKeys(rs[len(rs)-1]) == "mesh.overlay=unchanged site.dir=applied site.index=applied"
	})
	// The first declaration n2 applied: its overlay, alone.
	if lineKeys(rs[0]) != "mesh.overlay=applied" {
		t.Fatalf("n2's first declaration: %+v", rs[0])
	}
	if b, _ := os.ReadFile(filepath.Join(m2.tree, "site", "index.html")); string(b) != "after the overlay\n" {
		t.Fatalf("n2's machine: %q", b)
	}
	if owned := m.run("mesh-executor", "owned", "--state", m2.state); strings.Count(owned, "link:") != 3 || !strings.Contains(owned, "link:mesh.overlay") {
		t.Fatalf("n2 owns:\n%s", owned)
	}
	if n := m.nodeNamed("n2"); n["assignments"] != "site" || n["overlay_address"] != "10.231.77.2" {
		t.Fatalf("nodes says of n2: %v at %v", n["assignments"], n["overlay_address"])
	}

	// Each has the other as its peer, by the keys the executors bound at
	// enrolment; n1 gets n2's endpoint once a person gives it.
	pub := func(mm *mesh) string {
		b, _ := os.ReadFile(filepath.Join(mm.state, "wireguard.pub"))
		return string(bytes.TrimSpace(b))
	}
	if got := inside(t, ex2, "wg", "show", iface, "allowed-ips"); got != pub(m)+"\t10.231.77.1/32" {
		t.Fatalf("n2's peers: %q", got)
	}
	if got := inside(t, ex1, "wg", "show", iface, "allowed-ips"); got != pub(m2)+"\t10.231.77.2/32" {
		t.Fatalf("n1's peers: %q", got)
	}
	m.run("mesh-control", "node", "endpoint", "n2", "192.0.2.5:51820", "--dir", m.ctl)
	eventually(t, "n2's endpoint in n1's overlay", func() bool {
		return inside(t, ex1, "wg", "show", iface, "endpoints") == pub(m2)+"\t192.0.2.5:51820"
	})
	if got := inside(t, ex2, "wg", "show", iface, "endpoints"); got != pub(m)+"\t(none)" {
		t.Fatalf("n2 has an endpoint for n1, which no one gave: %q", got)
	}
}
