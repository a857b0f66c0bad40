package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// presented is the fingerprint of the certificate the broker presents now.
func (m *mesh) presented() string {
	m.t.Helper()
	// NATS says its INFO in the clear, then the client starts TLS.
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", m.port))
	if err != nil {
		m.t.Fatal(err)
	}
	defer raw.Close()
	if _, err := bufio.NewReader(raw).ReadString('\n'); err != nil {
		m.t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		m.t.Fatal(err)
	}
	return link.Fingerprint(c.ConnectionState().PeerCertificates[0].Raw)
}

// pinsSeq is the broker certificates' statement node's heartbeat says it
// took.
func (m *mesh) pinsSeq(node string) float64 {
	hb, _ := m.nodeNamed(node)["heartbeat"].(map[string]any)
	n, _ := hb["broker_pins_seq"].(float64)
	return n
}

// The broker's certificate rotates with real processes, in its two
// steps: announced (every linked node takes the new certificate beside
// the old, and says so), then switched — refused while a node away has
// not taken it, forced — the broker presenting the new one to the next
// handshake while linked nodes stay linked, and a node's agent started
// again linking with the certificate it was announced.
func TestTheBrokerCertificateRotates(t *testing.T) {
	m := newHost(t)
	agentCmd := m.procs[len(m.procs)-1]
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	m2, away := m.enrolledSecond("n2")
	decl := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	if r := m.reportFor(m.declare(fmt.Sprintf(decl, "one"))); r.Outcome != shapes.Applied {
		t.Fatalf("before: %+v", r)
	}
	before := m.presented()
	away.Process.Signal(syscall.SIGTERM)
	away.Wait()

	out := m.run("mesh-control", "cert", "rotate", "--dir", m.ctl)
	if !strings.Contains(out, "announced beside "+before) {
		t.Fatalf("cert rotate:\n%s", out)
	}
	eventually(t, "n1 takes the announcement", func() bool { return m.pinsSeq("n1") == 1 })
	var st struct {
		Pins []string `json:"broker_pins"`
	}
	b, _ := os.ReadFile(filepath.Join(m.agentState(), "agent.json"))
	json.Unmarshal(b, &st)
	if len(st.Pins) != 2 || st.Pins[0] != before {
		t.Fatalf("n1's agent accepts %v", st.Pins)
	}
	if m.presented() != before {
		t.Fatal("the broker switched at the announcement")
	}

	// n2, away, has not taken it: the switch is refused, naming it.
	cmd := m.binary("mesh-control")
	if out, err := execOut(cmd, "cert", "rotate", "--switch", "--dir", m.ctl); err == nil || !strings.Contains(out, "n2") || strings.Contains(out, "n1,") {
		t.Fatalf("a switch while n2 is away: %v\n%s", err, out)
	}
	out = m.run("mesh-control", "cert", "rotate", "--switch", "--force", "--dir", m.ctl)
	if !strings.Contains(out, "presents certificate "+st.Pins[1]) || !strings.Contains(out, "despite: n2") {
		t.Fatalf("cert rotate --switch --force:\n%s", out)
	}
	if got := m.presented(); got != st.Pins[1] {
		t.Fatalf("the broker presents %s after the switch, want %s", got, st.Pins[1])
	}
	// Linked through the switch.
	if r := m.reportFor(m.declare(fmt.Sprintf(decl, "two"))); r.Outcome != shapes.Applied {
		t.Fatalf("after the switch: %+v", r)
	}
	// Started again, n1's agent links to the new certificate.
	agentCmd.Process.Signal(syscall.SIGTERM)
	agentCmd.Wait()
	m.startAgent("--config", m.agentConfig())
	if r := m.reportFor(m.declare(fmt.Sprintf(decl, "three"))); r.Outcome != shapes.Applied {
		t.Fatalf("n1's agent started again: %+v", r)
	}
	// n2, back, cannot: it says why.
	m2.startAgent("--config", m2.agentConfig())
	eventually(t, "n2's agent says the broker is not the one it pinned", func() bool {
		b, _ := os.ReadFile(filepath.Join(m2.base, "mesh-agent.log"))
		return strings.Contains(string(b), "fingerprint mismatch")
	})
}

// execOut runs a command and returns its output, both streams.
func execOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// The announcement reaches nodes with nothing declared: one never
// declared to takes it at once, one away through the announcement at its
// first heartbeat back — each sent the statement alone — so the switch
// goes through without --force, and each links again to the new
// certificate.
func TestTheBrokerCertificateReachesNodesWithNothingDeclared(t *testing.T) {
	m := newHost(t)
	agentCmd := m.procs[len(m.procs)-1]
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	m2, away := m.enrolledSecond("n2")
	away.Process.Signal(syscall.SIGTERM)
	away.Wait()

	out := m.run("mesh-control", "cert", "rotate", "--dir", m.ctl)
	if !strings.Contains(out, "0 declaration(s) signed again to carry it\n2 sent it alone") {
		t.Fatalf("cert rotate:\n%s", out)
	}
	eventually(t, "n1, never declared to, takes the announcement", func() bool { return m.pinsSeq("n1") == 1 })
	if m.pinsSeq("n2") != 0 {
		t.Fatal("n2, away, took the announcement")
	}
	m2.startAgent("--config", m2.agentConfig())
	eventually(t, "n2, back, takes the announcement", func() bool { return m.pinsSeq("n2") == 1 })
	out = m.run("mesh-control", "cert", "rotate", "--switch", "--dir", m.ctl)
	if !strings.Contains(out, "presents certificate") || strings.Contains(out, "despite") {
		t.Fatalf("cert rotate --switch:\n%s", out)
	}
	// Run again, as a runbook might: nothing is announced now, said so.
	if code, _, stderr := m.runCode("mesh-control", "", "cert", "rotate", "--switch", "--dir", m.ctl); code != 1 || !strings.Contains(stderr, "no certificate is announced") || !strings.Contains(stderr, "a switch made leaves none") {
		t.Fatalf("cert rotate --switch again: exit %d\n%s", code, stderr)
	}
	// Started again, n1's agent links to the new certificate, and takes
	// its first declaration.
	agentCmd.Process.Signal(syscall.SIGTERM)
	agentCmd.Wait()
	m.startAgent("--config", m.agentConfig())
	if r := m.reportFor(m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"new\n"}]}`)); r.Outcome != shapes.Applied {
		t.Fatalf("n1 after the switch: %+v", r)
	}
}
