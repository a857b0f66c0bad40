package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// rekey runs mesh-executor rekey with extra.
func (m *mesh) rekey(extra ...string) (code int, stdout, stderr string) {
	m.t.Helper()
	return m.runCode("mesh-executor", "", append([]string{"rekey", "--state", m.state, "--socket", m.sock}, extra...)...)
}

// nodeKeys is what n1's record says of its keys and enrolment.
func (m *mesh) nodeKeys() (enrolment, nkey string, keys map[string]any) {
	m.t.Helper()
	r := m.nodeRecord("n1")
	keys, _ = r["keys"].(map[string]any)
	enrolment, _ = r["enrolment"].(string)
	nkey, _ = r["nkey"].(string)
	return enrolment, nkey, keys
}

// brokerLetsIn says whether the broker lets in an agent with cfg (an
// agent's config file's bytes).
func brokerLetsIn(t *testing.T, cfg []byte) error {
	t.Helper()
	var c struct {
		URL  string `json:"broker_url"`
		Pin  string `json:"broker_fingerprint"`
		Seed string `json:"nkey_seed"`
		JWT  string `json:"user_jwt"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed([]byte(c.Seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	pin, err := link.ParseFingerprint(c.Pin)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.Secure(link.PinnedTLS(pin, nil)), nats.Nkey(pub, kp.Sign), nats.NoReconnect(), nats.Timeout(5 * time.Second)}
	if c.JWT != "" {
		opts = append(opts, nats.Token(c.JWT))
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err == nil {
		nc.Close()
	}
	return err
}

// A node renews its keys without a token: root runs mesh-executor rekey,
// the request (signed by the identity key) goes up with the heartbeats,
// the control side's answer (a token sealed to the node) begins an
// enrolment that replaces the identity under the same name. After it every
// key is new — identity, sealing, WireGuard, the agent's NKey — the old
// NKey no longer gets onto the broker, and the node is declared to as
// before, sealed content included. Then the edges: a rekey with no agent
// to carry it waits and says so, a compromised agent's answers (garbage, a
// key not the control side's) change nothing, root's --cancel ends it, and
// a hosted host is refused before anything is made.
func TestANodeRenewsItsKeys(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	if r := m.reportFor(m.declare(strings.Replace(motd, "%s", "before", 1))); r.Outcome != shapes.Applied {
		t.Fatalf("before the rekey: %+v", r)
	}
	enrolment, nkey, keys := m.nodeKeys()
	oldConfig, err := os.ReadFile(m.agentConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := brokerLetsIn(t, oldConfig); err != nil {
		t.Fatalf("the agent's own credential, before the rekey: %v", err)
	}

	code, out, errOut := m.rekey("--wait", "60s")
	if code != 0 || !strings.Contains(out, "rekeyed: enrolled as node n1") || !strings.Contains(out, "replacing node n1 (enrolment "+enrolment+")") {
		t.Fatalf("rekey: exit %d\n%s%s", code, out, errOut)
	}
	enrolment2, nkey2, keys2 := m.nodeKeys()
	if enrolment2 == enrolment || nkey2 == nkey || nkey2 == "" {
		t.Fatalf("after the rekey: enrolment %s, nkey %s (were %s, %s)", enrolment2, nkey2, enrolment, nkey)
	}
	for _, k := range []string{"identity_key", "sealing_key", "wireguard_key"} {
		if keys2[k] == keys[k] || keys2[k] == "" || keys2[k] == nil {
			t.Errorf("%s after the rekey: %v (was %v)", k, keys2[k], keys[k])
		}
	}
	if pub, _ := os.ReadFile(filepath.Join(m.state, "wireguard.pub")); strings.TrimSpace(string(pub)) != keys2["wireguard_key"] {
		t.Errorf("the executor's WireGuard key is %q; the record says %v", pub, keys2["wireguard_key"])
	}
	if st := m.executorStatus(); st["state"] != "enrolled" || st["node"] != "n1" || st["enrolment"] != enrolment2 || st["rekey"] != nil {
		t.Fatalf("the executor after the rekey: %v", st)
	}
	if err := brokerLetsIn(t, oldConfig); err == nil {
		t.Fatal("the broker still lets in the NKey the rekey replaced")
	}
	newConfig := m.agentConfigAfter(oldConfig)
	if err := brokerLetsIn(t, newConfig); err != nil {
		t.Fatalf("the agent's new credential: %v", err)
	}
	// Declared to as before; sealed content is sealed to the new key.
	if r := m.reportFor(m.declare(strings.Replace(motd, "%s", "after", 1))); r.Outcome != shapes.Applied {
		t.Fatalf("after the rekey: %+v", r)
	}
	secret := filepath.Join(m.base, "secret")
	os.WriteFile(secret, []byte("sealed after the rekey\n"), 0o600)
	f := filepath.Join(m.base, "sealed.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"db","id":"creds","type":"file","path":"{root}/creds","mode":"0600"}]}`, "{root}", m.tree)), 0o600)
	seq := declaredSeq(t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--seal", "db.creds="+secret, "--json"))
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("sealed content after the rekey: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "creds")); string(b) != "sealed after the rekey\n" {
		t.Fatalf("the sealed file holds %q", b)
	}

	// No agent to carry it: pending, said so; the status says so too.
	ag := m.agentProc()
	ag.Process.Signal(syscall.SIGSTOP)
	defer ag.Process.Signal(syscall.SIGCONT)
	ids := m.identityFiles()
	if code, _, errOut := m.rekey("--wait", "2s"); code != 3 || !strings.Contains(errOut, "the control side has not answered yet") {
		t.Fatalf("a rekey with the agent stopped: exit %d\n%s", code, errOut)
	}
	if s := m.run("mesh-executor", "status", "--state", m.state); !strings.Contains(s, "rekey: asked for since") {
		t.Fatalf("status with a rekey pending:\n%s", s)
	}
	// What a compromised agent hands over changes nothing.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	forged, _ := wire.Seal(other, wire.PurposeRekey, []byte(`{"node":"n1","enrolment":"`+enrolment2+`","nonce":"00","token":"x","expires":"2030-01-01T00:00:00Z"}`))
	c := helloAsAgent(t, m.sock)
	for _, env := range [][]byte{[]byte("garbage"), forged} {
		if err := c.Write(wire.KindRekey, &wire.Rekey{Envelope: env}); err != nil {
			t.Fatal(err)
		}
		k, body, err := c.Read()
		if err != nil || k != wire.KindRekeyReply {
			t.Fatalf("reply %v %v", k, err)
		}
		if r := body.(*wire.RekeyReply); r.Begun || !strings.Contains(r.Refused, "does not verify under the control key in force") {
			t.Fatalf("a forged answer: %+v", r)
		}
	}
	c.Close()
	if !bytes.Equal(m.identityFiles(), ids) {
		t.Fatal("the executor's identity files changed")
	}
	if st := m.executorStatus(); st["enrolling"] == true || st["rekey"] == nil {
		t.Fatalf("the executor after forged answers: %v", st)
	}
	if out := m.run("mesh-executor", "rekey", "--cancel", "--state", m.state); !strings.Contains(out, "the rekey is cancelled") {
		t.Fatalf("rekey --cancel: %s", out)
	}
	if out := m.run("mesh-executor", "rekey", "--cancel", "--state", m.state); !strings.Contains(out, "no rekey is pending") {
		t.Fatalf("rekey --cancel twice: %s", out)
	}
	ag.Process.Signal(syscall.SIGCONT)
	if e, _, _ := m.nodeKeys(); e != enrolment2 {
		t.Fatalf("a cancelled rekey changed the enrolment: %s", e)
	}

	// A hosted host: nothing to renew, and nothing made.
	m2 := newBareMesh(t)
	if code, _, errOut := m2.rekey(); code != 2 || !strings.Contains(errOut, "this host holds no identity") {
		t.Fatalf("rekey on a hosted host: exit %d\n%s", code, errOut)
	}
	for _, f := range []string{"rekey-pending.json", "enrol.lock"} {
		if _, err := os.Stat(filepath.Join(m2.state, f)); !os.IsNotExist(err) {
			t.Fatalf("a refused rekey made %s: %v", f, err)
		}
	}
}

// An agent stopped after the executor recorded a grant and before the
// agent kept its own config (kill -9, a power cut, in that instant)
// finishes from the executor's copy of the grant when it starts again: its
// config still names the enrolment the grant replaced (revoked: the broker
// refuses it), its new NKey's seed is still kept apart. Made here as that
// instant leaves the files: the config before a rekey written back, the
// seed of the one after put back beside it.
func TestAnAgentStoppedBeforeKeepingItsGrantFinishes(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	before, err := os.ReadFile(m.agentConfig())
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := m.rekey("--wait", "60s"); code != 0 {
		t.Fatalf("rekey: exit %d\n%s%s", code, out, errOut)
	}
	after, _ := os.ReadFile(m.agentConfig())
	var cfg struct {
		Enrolment string `json:"enrolment"`
		Seed      string `json:"nkey_seed"`
	}
	if err := json.Unmarshal(after, &cfg); err != nil {
		t.Fatal(err)
	}
	ag := m.agentProc()
	ag.Process.Kill()
	ag.Wait()
	if err := os.WriteFile(m.agentConfig(), before, 0o600); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(m.agentState(), "nkey.seed")
	if err := os.WriteFile(seed, []byte(cfg.Seed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(seed, 65534, 65534)
	m.startAgent("--config", m.agentConfig())
	eventually(t, "the agent's config names the new enrolment", func() bool {
		b, _ := os.ReadFile(m.agentConfig())
		return bytes.Contains(b, []byte(cfg.Enrolment))
	})
	// Removed right after the config is written (its reader saw the
	// config first).
	eventually(t, "the seed kept apart gone", func() bool {
		_, err := os.Stat(seed)
		return os.IsNotExist(err)
	})
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"finished\n"}]}`
	if r := m.reportFor(m.declare(motd)); r.Outcome != shapes.Applied {
		t.Fatalf("after finishing: %+v", r)
	}
	logb, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
	if !bytes.Contains(logb, []byte("finished from the executor's copy of the grant")) {
		t.Fatal("the agent does not say it finished from the executor's copy")
	}
}

// A rekey of a node that has not taken the control key's last rotation
// (held: its newest declaration holds sealed content, which is not signed
// again, and it takes a routine rotation with its next declaration): the
// answer the new key signs comes with the rotation, which the node takes
// first.
func TestARekeyAfterARotationTheNodeMissed(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	sf := filepath.Join(m.base, "secret")
	os.WriteFile(sf, []byte("s3cret\n"), 0o600)
	f := filepath.Join(m.base, "sealed.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"db","id":"creds","type":"file","path":"{root}/creds","mode":"0600"}]}`, "{root}", m.tree)), 0o600)
	if r := m.reportFor(declaredSeq(t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--seal", "db.creds="+sf, "--json"))); r.Outcome != shapes.Applied {
		t.Fatalf("the sealed declaration: %+v", r)
	}
	keys := filepath.Join(m.state, "control-keys.json")
	was, _ := os.ReadFile(keys)
	if out := m.run("mesh-control", "key", "rotate", "--dir", m.ctl); !strings.Contains(out, "held, their newest declaration not signed again (sealed content, or signed before the key retired): n1") {
		t.Fatalf("key rotate:\n%s", out)
	}
	time.Sleep(3 * time.Second) // heartbeats a second apart: none brings it
	if now, _ := os.ReadFile(keys); !bytes.Equal(now, was) {
		t.Fatal("the node took the rotation before the rekey")
	}
	if code, out, errOut := m.rekey("--wait", "60s"); code != 0 || !strings.Contains(out, "rekeyed: enrolled as node n1") {
		t.Fatalf("rekey: exit %d\n%s%s", code, out, errOut)
	}
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"rotated and rekeyed\n"}]}`
	if r := m.reportFor(m.declare(motd)); r.Outcome != shapes.Applied {
		t.Fatalf("after the rekey: %+v", r)
	}
}

// A rekey while the disk holding the agent's state is full: the agent
// cannot keep the NKey it would enrol with, so the rekey stays pending —
// and the node stays linked meanwhile as the node it is (its enrolment is
// live until the new one is granted): a declaration still applies. Once
// there is room the rekey finishes by itself.
func TestARekeyWaitingForRoomKeepsTheNodeLinked(t *testing.T) {
	m := newMeshDirs(t)
	if err := os.MkdirAll(m.agentState(), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700,uid=65534,gid=65534", "tmpfs", m.agentState()).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", m.agentState()).Run() })
	m.startControl()
	m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	enrolment, _, _ := m.nodeKeys()

	filler := filepath.Join(m.agentState(), "filler")
	fill(t, filler)
	if code, out, errOut := m.rekey("--wait", "5s"); code != 3 || !strings.Contains(errOut, "the enrolment with the new keys has not finished") {
		t.Fatalf("a rekey with the agent's disk full: exit %d\n%s%s", code, out, errOut)
	}
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	if r := m.reportFor(m.declare(strings.Replace(motd, "%s", "while the rekey waits", 1))); r.Outcome != shapes.Applied {
		t.Fatalf("a declaration while the rekey waits for room: %+v", r)
	}
	if e, _, _ := m.nodeKeys(); e != enrolment {
		t.Fatalf("the enrolment changed with no room for the agent's key: %s (was %s)", e, enrolment)
	}

	os.Remove(filler)
	eventually(t, "the rekey finished once there is room", func() bool {
		e, _, _ := m.nodeKeys()
		return e != enrolment && e != ""
	})
	if r := m.reportFor(m.declare(strings.Replace(motd, "%s", "after the rekey", 1))); r.Outcome != shapes.Applied {
		t.Fatalf("after the rekey: %+v", r)
	}
	logb, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
	if !bytes.Contains(logb, []byte("staying linked as the node it is")) {
		t.Fatalf("the agent does not say why the enrolment waits:\n%s", logb)
	}
}
