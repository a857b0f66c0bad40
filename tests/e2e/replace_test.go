package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// nodeRecord is a node's registry record, as `mesh-control node show
// --json` shows it.
func (m *mesh) nodeRecord(name string) map[string]any {
	m.t.Helper()
	var v struct {
		Record map[string]any `json:"record"`
	}
	if err := json.Unmarshal([]byte(m.run("mesh-control", "node", "show", name, "--dir", m.ctl, "--json")), &v); err != nil {
		m.t.Fatal(err)
	}
	return v.Record
}

// readState reads the executor's files that say who it is.
func (m *mesh) identityFiles() []byte {
	m.t.Helper()
	var all []byte
	for _, f := range []string{"identity.json", "keys.json"} {
		b, err := os.ReadFile(filepath.Join(m.state, f))
		if err != nil {
			m.t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// An enrolled machine given a --new token: without --replace the control
// side refuses it (signed, for this very request) before anything
// changes — the machine stays n1, linked, the registry as it was, the
// token unspent; with --replace the same token makes it n2, and n1 is
// revoked in the same step, which the grant, `enrol` and the registry say.
func TestEnrolANewTokenOnAnEnrolledMachine(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	was := m.executorStatus()
	ids := m.identityFiles()
	rec := m.nodeRecord("n1")
	token := m.issue("--new", "--name", "n2")

	code, out, errOut := m.enrol(token)
	all := out + errOut
	if code != 1 || !strings.Contains(all, "enrolment refused by the control side: this machine is enrolled as node n1 (enrolment "+was["enrolment"].(string)+"), which is live") ||
		!strings.Contains(all, "mesh-executor enrol --replace") {
		t.Fatalf("a --new token on n1 without --replace: exit %d\n%s", code, all)
	}
	if st := m.executorStatus(); st["state"] != "enrolled" || st["node"] != "n1" || st["enrolment"] != was["enrolment"] || st["enrolling"] == true {
		t.Fatalf("the executor after the refusal: %v", st)
	}
	if !bytes.Equal(m.identityFiles(), ids) {
		t.Fatal("the executor's identity files changed")
	}
	if now := m.nodeRecord("n1"); now["nkey"] != rec["nkey"] || now["enrolment"] != rec["enrolment"] || now["revoked"] != nil {
		t.Fatalf("n1's record changed: %v, was %v", now, rec)
	}
	if m.nodeNamed("n2") != nil {
		t.Fatal("the refusal made node n2")
	}
	// Still n1, still linked: the agent went back to its link.
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"still n1\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("n1 after the refusal: %+v", r)
	}

	// Twice in a row: the same answer (the token is still unspent).
	if code, out, errOut := m.enrol(token); code != 1 || !strings.Contains(out+errOut, "which is live") {
		t.Fatalf("again: exit %d\n%s%s", code, out, errOut)
	}

	// --replace, the same token: n2, and n1 revoked.
	code, out, errOut = m.enrol(token, "--replace")
	if code != 0 || !strings.Contains(out, "enrolled as node n2") || !strings.Contains(out, "replacing node n1 (enrolment "+was["enrolment"].(string)+")") {
		t.Fatalf("--replace: exit %d\n%s%s", code, out, errOut)
	}
	if st := m.executorStatus(); st["state"] != "enrolled" || st["node"] != "n2" {
		t.Fatalf("the executor after --replace: %v", st)
	}
	if r := m.nodeRecord("n1"); r["nkey"] != "" || r["revoked"] == nil {
		t.Fatalf("n1 after the replacement: %v", r)
	}
	if s := m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl); !strings.Contains(s, "revoked") {
		t.Fatalf("node show n1 after the replacement:\n%s", s)
	}
	eventually(t, "n2 heard from", func() bool { n := m.nodeNamed("n2"); return n != nil && n["executor_version"] == "e2e" })

	// --replace on a host that holds nothing is refused before anything
	// changes.
	m2 := newHost(t)
	if code, _, errOut := m2.enrol(m2.issue("--new"), "--replace"); code != 2 || !strings.Contains(errOut, "this host holds no identity") {
		t.Fatalf("--replace on a hosted host: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(m2.state, "enrolment-pending.json")); !os.IsNotExist(err) {
		t.Fatal("a refused --replace began an enrolment")
	}
}

// What a compromised agent hands over on the socket — a refusal in its own
// words, a grant that does not verify — ends no enrolment root began:
// status shows it as the agent's word, and root's --cancel ends it.
func TestTheAgentCannotEndAnEnrolment(t *testing.T) {
	m := newBareMesh(t)
	m.startExecutor()
	if code, _, errOut := m.enrol(m.issue("--new"), "--wait", "1s"); code != 3 {
		t.Fatalf("enrol with no agent: exit %d\n%s", code, errOut)
	}
	c := helloAsAgent(t, m.sock)
	defer c.Close()
	for _, g := range []*wire.GrantHandover{
		{Final: true},
		{RefusedBy: "control", Reason: "made up by the agent", Final: true},
		{Envelope: []byte("garbage"), Final: true},
	} {
		if err := c.Write(wire.KindGrant, g); err != nil {
			t.Fatal(err)
		}
		if k, _, err := c.Read(); err != nil || k != wire.KindGrantReply {
			t.Fatalf("reply %v %v", k, err)
		}
		st := m.executorStatus()
		last, _ := st["last_enrolment"].(map[string]any)
		if st["enrolling"] != true || last == nil || last["final"] == true || last["claimed"] != true {
			t.Fatalf("after %+v: %v", g, st)
		}
	}
	text := m.run("mesh-executor", "status", "--state", m.state)
	if !strings.Contains(text, "enrolment: begun") || !strings.Contains(text, "the agent's word ends nothing") {
		t.Fatalf("status:\n%s", text)
	}
	if out := m.run("mesh-executor", "enrol", "--cancel", "--state", m.state); !strings.Contains(out, "is cancelled") {
		t.Fatalf("cancel: %s", out)
	}
	if st := m.executorStatus(); st["enrolling"] == true {
		t.Fatalf("after --cancel: %v", st)
	}
}
