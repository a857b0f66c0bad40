package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// controlKey reads a private key file of the key directory.
func readPrivate(t *testing.T, path string) ed25519.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: not PEM", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k.(ed25519.PrivateKey)
}

// heldKey is the control key a node's executor holds in force, by id.
func (m *mesh) heldKey() string {
	m.t.Helper()
	b, err := os.ReadFile(filepath.Join(m.state, "control-keys.json"))
	if err != nil {
		return ""
	}
	var ck struct {
		Key string `json:"control_key"`
	}
	json.Unmarshal(b, &ck)
	return ck.Key
}

// rotationsTo hands the node's executor a chain of rotations as the agent
// would, and returns its answer.
func rotationsTo(t *testing.T, sock string, envs ...[]byte) *wire.KeyRotationReply {
	t.Helper()
	c := helloAsAgent(t, sock)
	defer c.Close()
	if err := c.Write(wire.KindKeyRotation, &wire.KeyRotations{Envelopes: envs}); err != nil {
		t.Fatal(err)
	}
	k, b, err := c.Read()
	if err != nil || k != wire.KindKeyRotationReply {
		t.Fatalf("the executor's answer: kind %d, %v", k, err)
	}
	return b.(*wire.KeyRotationReply)
}

func pubB64(k ed25519.PrivateKey) string {
	b, _ := json.Marshal([]byte(k.Public().(ed25519.PublicKey)))
	return strings.Trim(string(b), `"`)
}

// The control key rotates with real processes: a node online takes the
// rotation with the declaration the new key signs again for it; a node
// offline through it takes it when its agent comes back; a declaration
// signed by the retired key is refused from then on; a rotation signed
// by one key alone is refused; and when the control key is stolen (here,
// used to move a node onto a thief's key), the recovery key, pinned at
// enrolment, brings the node back onto a key of the control side's.
func TestTheControlKeyRotates(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	m2, away := m.enrolledSecond("n2")
	decl := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	s1 := m.declare(fmt.Sprintf(decl, "before"))
	if r := m.reportFor(s1); r.Outcome != shapes.Applied {
		t.Fatalf("n1 before the rotation: %+v", r)
	}
	f := filepath.Join(m.base, "decl2.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(fmt.Sprintf(decl, "before"), "{root}", m2.tree)), 0o600)
	m.run("mesh-control", "declare", "--dir", m.ctl, "--wait=30s", "n2", f)

	retired := readPrivate(t, filepath.Join(m.ctl, "control.key"))
	if got := m.heldKey(); got != pubB64(retired) {
		t.Fatalf("n1 holds %q before any rotation, want the key it enrolled with", got)
	}
	// n2 away through the rotation.
	away.Process.Signal(syscall.SIGTERM)
	away.Wait()

	out := m.run("mesh-control", "key", "rotate", "--dir", m.ctl)
	if !strings.Contains(out, "announced to 2 node(s)") || !strings.Contains(out, "2 signed again") {
		t.Fatalf("key rotate:\n%s", out)
	}
	current := readPrivate(t, filepath.Join(m.ctl, "control.key"))
	if current.Equal(retired) {
		t.Fatal("key rotate left the control key as it was")
	}
	eventually(t, "n1 takes the rotation", func() bool { return m.heldKey() == pubB64(current) })
	// nodes says which have taken it: n1, heard since, and not n2, away.
	eventually(t, "nodes to say n1 holds the new key", func() bool {
		n1 := m.nodeNamed("n1")
		return n1["control_key_id"] == wire.KeyID(current.Public().(ed25519.PublicKey)) && n1["rotation_pending"] == nil
	})
	if n2 := m.nodeNamed("n2"); n2["rotation_pending"] != true || n2["control_key_id"] != wire.KeyID(retired.Public().(ed25519.PublicKey)) {
		t.Fatalf("nodes on n2, away through the rotation: key %v, pending %v", n2["control_key_id"], n2["rotation_pending"])
	}
	if st := m.run("mesh-control", "status", "--dir", m.ctl); !strings.Contains(st, "a control key rotation not taken yet:") || !strings.Contains(st, "n2") {
		t.Fatalf("status while n2 is away:\n%s", st)
	}
	s2 := m.declare(fmt.Sprintf(decl, "after"))
	if r := m.reportFor(s2); r.Outcome != shapes.Applied {
		t.Fatalf("n1 after the rotation: %+v", r)
	}

	// The retired key's signature is refused from now on, whoever
	// carries it.
	var idf struct{ Enrolment string }
	b, _ := os.ReadFile(filepath.Join(m.state, "identity.json"))
	json.Unmarshal(b, &idf)
	payload := fmt.Sprintf(`{"version":1,"node":"n1","enrolment":%q,"seq":%d,"resources":[]}`, idf.Enrolment, s2+10)
	env, err := wire.Seal(retired, wire.PurposeDeclaration, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	if v := pushEnvelope(t, m.sock, env); v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "other than the pinned") {
		t.Fatalf("a declaration signed by the retired key: %+v", v)
	}

	// A rotation signed by one key alone: by the key in force over a
	// statement the key it names did not sign, or by the new key alone.
	thief := newKey(t)
	stmt := wire.KeyRotation{Node: "n1", Enrolment: idf.Enrolment, Seq: 99, By: wire.ByKey, From: wire.KeyID(current.Public().(ed25519.PublicKey)), To: pubB64(thief)}
	stmtJSON, _ := json.Marshal(&stmt)
	innerByOther, _ := wire.Seal(newKey(t), wire.PurposeKeyRotationNew, stmtJSON)
	oneOuter, _ := wire.Seal(current, wire.PurposeKeyRotation, innerByOther)
	innerByNew, _ := wire.Seal(thief, wire.PurposeKeyRotationNew, stmtJSON)
	newAlone, _ := wire.Seal(thief, wire.PurposeKeyRotation, innerByNew)
	for name, e := range map[string][]byte{"signed by the key in force alone": oneOuter, "signed by the new key alone": newAlone} {
		r := rotationsTo(t, m.sock, e)
		if r.Taken != 0 || !ed25519.PublicKey(r.ControlKey).Equal(current.Public()) || m.heldKey() != pubB64(current) {
			t.Fatalf("a rotation %s: %+v", name, r)
		}
	}

	// n2 comes back, and takes the rotation with its newest declaration.
	m2.startAgent("--config", m2.agentConfig())
	eventually(t, "n2 takes the rotation on its return", func() bool { return m2.heldKey() == pubB64(current) })
	eventually(t, "nodes to say n2 holds the new key", func() bool { return m.nodeNamed("n2")["rotation_pending"] == nil })
	if b, _ := os.ReadFile(filepath.Join(m2.tree, "motd")); string(b) != "before\n" {
		t.Fatalf("n2's motd after its return: %q", b)
	}

	// The control key stolen: the thief moves n1 onto a key of its own;
	// the recovery key, from its safe place, takes the fleet back.
	out = m.stolenThenRecovered(current, thief, idf.Enrolment)
	if !strings.Contains(out, "signed by the recovery key") {
		t.Fatalf("key rotate --recovery-key:\n%s", out)
	}
	recovered := readPrivate(t, filepath.Join(m.ctl, "control.key"))
	eventually(t, "n1 back on the control side's key", func() bool { return m.heldKey() == pubB64(recovered) })
	s3 := m.declare(fmt.Sprintf(decl, "recovered"))
	if r := m.reportFor(s3); r.Outcome != shapes.Applied {
		t.Fatalf("n1 after the recovery: %+v", r)
	}
	// The thief's key signs nothing n1 takes now, nor can it rotate n1
	// again: n1 holds neither of its keys.
	again, _ := wire.SealRotation(thief, newKey(t), wire.KeyRotation{Node: "n1", Enrolment: idf.Enrolment, Seq: 2000, By: wire.ByKey, From: wire.KeyID(thief.Public().(ed25519.PublicKey))})
	if r := rotationsTo(t, m.sock, again); r.Taken != 0 || m.heldKey() != pubB64(recovered) {
		t.Fatalf("the thief rotating again after the recovery: %+v", r)
	}
}

// stolenThenRecovered is the control key stolen and the theft undone: the
// thief, holding stolen (the key in force), moves n1 (of enrolment) onto
// thief with a rotation both sign — which n1 cannot tell from one of the
// control side's; then key rotate --recovery-key, the recovery key moved
// off the key directory first, as kept. It returns what key rotate said.
func (m *mesh) stolenThenRecovered(stolen, thief ed25519.PrivateKey, enrolment string) string {
	t := m.t
	t.Helper()
	theft, err := wire.SealRotation(stolen, thief, wire.KeyRotation{Node: "n1", Enrolment: enrolment, Seq: 1000, By: wire.ByKey,
		From: wire.KeyID(stolen.Public().(ed25519.PublicKey))})
	if err != nil {
		t.Fatal(err)
	}
	if r := rotationsTo(t, m.sock, theft); r.Taken != 1 || m.heldKey() != pubB64(thief) {
		t.Fatalf("the thief's rotation: %+v", r)
	}
	safe := filepath.Join(t.TempDir(), "recovery.key")
	os.Rename(filepath.Join(m.ctl, "recovery.key"), safe)
	// Brought back on a medium that shows it readable by all: used, and
	// said.
	os.Chmod(safe, 0o644)
	code, out, errs := m.runCode("mesh-control", "", "key", "rotate", "--dir", m.ctl, "--recovery-key", safe)
	if code != 0 {
		t.Fatalf("key rotate --recovery-key: exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "warning: the recovery key "+safe+" is readable by others than its owner (mode 0644)") {
		t.Errorf("key rotate --recovery-key of a key readable by all says nothing of it:\n%s", errs)
	}
	return strings.TrimSpace(out)
}

func newKey(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A rotation reaches a node with nothing on its declaration subject to
// carry it: one never declared to, one whose subject its re-enrolment
// emptied, one away through the rotation. Each takes the new key from the
// rotations the control side sends alone — at the rotation, and again
// while its heartbeats name the retired key — without a declaration, and
// stops trusting the retired key. And when the key was stolen, a node the
// thief moved onto a key of its own, with nothing declared, comes back
// onto the control side's with the recovery's rotation.
func TestARotationReachesANodeWithNothingDeclared(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	m2, _ := m.enrolledSecond("n2")
	// n2's declaration holds sealed content: enrolled again, it is not
	// declared it again (sealed to the keys replaced), and its subject
	// stays empty.
	f := filepath.Join(m.base, "decl2.json")
	os.WriteFile(f, []byte(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"`+m2.tree+`/motd"}]}`), 0o600)
	sf := filepath.Join(m.base, "motd2")
	os.WriteFile(sf, []byte("kept\n"), 0o600)
	m.run("mesh-control", "declare", "--dir", m.ctl, "--wait=30s", "--seal", "base.motd="+sf, "n2", f)
	if code, out, errOut := m2.enrol(m.issue("--node", "n2"), "--replace"); code != 0 || !strings.Contains(out, "enrolled as node n2") {
		t.Fatalf("n2 enrolled again: exit %d\n%s%s", code, out, errOut)
	}
	m3, away := m.enrolledSecond("n3")
	away.Process.Signal(syscall.SIGTERM)
	away.Wait()
	retired := readPrivate(t, filepath.Join(m.ctl, "control.key"))

	out := m.run("mesh-control", "key", "rotate", "--dir", m.ctl)
	if !strings.Contains(out, "announced to 3 node(s); 0 signed again") || !strings.Contains(out, "3 with no declaration to sign again take the rotation alone: 3 sent it now") {
		t.Fatalf("key rotate:\n%s", out)
	}
	current := readPrivate(t, filepath.Join(m.ctl, "control.key"))
	eventually(t, "n1, never declared to, takes the rotation", func() bool { return m.heldKey() == pubB64(current) })
	eventually(t, "n2, its subject emptied by its re-enrolment, takes the rotation", func() bool { return m2.heldKey() == pubB64(current) })
	if got := m3.heldKey(); got != pubB64(retired) {
		t.Fatalf("n3, away, holds %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(m2.tree, "motd")); string(b) != "kept\n" {
		t.Fatalf("n2's motd after the rotation: %q", b)
	}
	// n3 back: its heartbeat names the retired key, and is answered.
	m3.startAgent("--config", m3.agentConfig())
	eventually(t, "n3, back, takes the rotation", func() bool { return m3.heldKey() == pubB64(current) })
	eventually(t, "nodes to say no rotation is pending", func() bool {
		for _, n := range []string{"n1", "n2", "n3"} {
			if v := m.nodeNamed(n); v == nil || v["rotation_pending"] != nil {
				return false
			}
		}
		return true
	})

	// The retired key is refused by a node it never signed anything for.
	var idf struct{ Enrolment string }
	b, _ := os.ReadFile(filepath.Join(m.state, "identity.json"))
	json.Unmarshal(b, &idf)
	env, err := wire.Seal(retired, wire.PurposeDeclaration, []byte(fmt.Sprintf(`{"version":1,"node":"n1","enrolment":%q,"seq":50,"resources":[]}`, idf.Enrolment)))
	if err != nil {
		t.Fatal(err)
	}
	if v := pushEnvelope(t, m.sock, env); v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "other than the pinned") {
		t.Fatalf("a declaration signed by the retired key, to n1: %+v", v)
	}

	// The key stolen: the thief moves n1, still with nothing declared,
	// onto a key of its own; the recovery's rotation brings it back.
	m.stolenThenRecovered(current, newKey(t), idf.Enrolment)
	recovered := readPrivate(t, filepath.Join(m.ctl, "control.key"))
	eventually(t, "n1, with nothing declared, back on the control side's key", func() bool { return m.heldKey() == pubB64(recovered) })
}
