package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// newHost is a mesh whose machine runs the executor (hosted: no identity)
// and the agent (hosted: no config), as after installing the package.
func newHost(t *testing.T) *mesh {
	m := newBareMesh(t)
	m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	return m
}

func (m *mesh) agentConfig() string { return filepath.Join(m.agentState(), "config.json") }

// agentConfigAfter waits for the agent's config to be another than was,
// and returns it: the agent keeps a new grant's identity a moment after
// the executor recorded it, which is when enrol and rekey end.
func (m *mesh) agentConfigAfter(was []byte) []byte {
	m.t.Helper()
	var now []byte
	eventually(m.t, "the agent keeps the new grant's identity", func() bool {
		now, _ = os.ReadFile(m.agentConfig())
		return len(now) > 0 && !bytes.Equal(now, was)
	})
	return now
}

// issue runs mesh-control token issue with args and returns the token.
func (m *mesh) issue(args ...string) string {
	m.t.Helper()
	return m.run("mesh-control", append([]string{"token", "issue", "--dir", m.ctl}, args...)...)
}

// enrol runs mesh-executor enrol with token on standard input.
func (m *mesh) enrol(token string, extra ...string) (code int, stdout, stderr string) {
	m.t.Helper()
	return m.runCode("mesh-executor", token+"\n", append([]string{"enrol", "--state", m.state, "--wait", "60s"}, extra...)...)
}

// runCode runs the binary name with args and stdin, and says how it ended.
func (m *mesh) runCode(name, stdin string, args ...string) (code int, stdout, stderr string) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.binary(name), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		m.t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

func (m *mesh) enrolled(token, node string) {
	m.t.Helper()
	code, out, errOut := m.enrol(token)
	if code != 0 || !strings.Contains(out, "enrolled as node "+node) {
		m.t.Fatalf("enrol: exit %d\n%s%s", code, out, errOut)
	}
}

func (m *mesh) nodeNamed(name string) map[string]any {
	out, err := exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl, "--json").Output()
	if err != nil {
		return nil
	}
	var nodes []map[string]any
	json.Unmarshal(out, &nodes)
	for _, n := range nodes {
		if n["name"] == name {
			return n
		}
	}
	return nil
}

func (m *mesh) executorStatus() map[string]any {
	out, err := exec.Command(m.binary("mesh-executor"), "status", "--state", m.state, "--json").Output()
	if err != nil {
		m.t.Fatalf("status: %v", err)
	}
	var st map[string]any
	json.Unmarshal(out, &st)
	return st
}

// The ordinary case, end to end: a token carried to a hosted machine,
// enrolment, the first declaration applied and reported, the profile and
// inventory kept on the control side; the secret never reached the agent.
func TestEnrolThenDeclare(t *testing.T) {
	m := newHost(t)
	token := m.issue("--new", "--name", "n1")
	tok, err := wire.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	m.enrolled(token, "n1")
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"enrolled\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "enrolled\n" {
		t.Fatalf("the machine: %q", b)
	}

	// node show: what the node reported at enrolment.
	var view struct {
		Record    map[string]any `json:"record"`
		ProfileAt string         `json:"profile_at"`
		Profile   struct {
			Capabilities []map[string]any `json:"capabilities"`
		} `json:"profile"`
		Inventory map[string]any `json:"inventory"`
	}
	if err := json.Unmarshal([]byte(m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl, "--json")), &view); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if len(view.Profile.Capabilities) != 8 || view.Inventory["hostname"] != host || view.Record["token"] != tok.IDString() {
		t.Fatalf("node show: %+v", view)
	}
	// On change, they go upward again: the inventory counts what the host
	// holds, one file now.
	eventually(t, "the changed inventory reported", func() bool {
		var v struct {
			Inventory map[string]any `json:"inventory"`
		}
		json.Unmarshal([]byte(m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl, "--json")), &v)
		return v.Inventory["holds"] == float64(1)
	})
	text := m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl)
	for _, want := range []string{"package-manager", "inventory:", "granted"} {
		if !strings.Contains(text, want) {
			t.Fatalf("node show says no %q:\n%s", want, text)
		}
	}

	// The agent holds its own NKey and the grant's JWT, and never the
	// token's secret: not in its files, not in its log.
	cfg, err := os.ReadFile(m.agentConfig())
	if err != nil || !strings.Contains(string(cfg), `"user_jwt"`) {
		t.Fatalf("agent config: %v %s", err, cfg)
	}
	if _, err := os.Stat(filepath.Join(m.agentState(), "nkey.seed")); err == nil {
		t.Fatal("the hosted seed file outlived enrolment")
	}
	secretForms := [][]byte{tok.Secret[:], []byte(hex.EncodeToString(tok.Secret[:])), []byte(base64.StdEncoding.EncodeToString(tok.Secret[:])),
		[]byte(base64.RawURLEncoding.EncodeToString(tok.Secret[:])), []byte(token)}
	filepath.Walk(m.agentState(), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			for _, f := range secretForms {
				if bytes.Contains(b, f) {
					t.Errorf("the agent's %s holds the token's secret", p)
				}
			}
		}
		return nil
	})
	logb, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
	for _, f := range secretForms {
		if bytes.Contains(logb, f) {
			t.Error("the agent's log holds the token's secret")
		}
	}
	if st := m.executorStatus(); st["state"] != "enrolled" || st["node"] != "n1" {
		t.Fatalf("executor status %v", st)
	}
}

// forge re-encodes a genuine token with one thing changed, checksum and
// all: what a person handed a doctored token would paste.
func forge(t *testing.T, token string, change func(*wire.Token)) string {
	tok, err := wire.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	change(tok)
	s, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Every refusal says which side refused and why, and leaves the host
// hosted.
func TestEnrolRefusalsAreLegible(t *testing.T) {
	m := newHost(t)
	otherKey, _, _ := ed25519.GenerateKey(rand.Reader)
	cases := []struct {
		name  string
		token func() string
		code  int
		want  []string
	}{
		{"mistyped", func() string {
			tk := m.issue("--new")
			b := []byte(tk)
			b[30] ^= 0x01
			return string(b)
		}, 2, []string{"mistyped"}},
		{"expired", func() string {
			tk := m.issue("--new", "--ttl", "1s")
			time.Sleep(2100 * time.Millisecond)
			return tk
		}, 1, []string{"refused by the control", "expired at"}},
		{"fingerprint mismatch", func() string {
			tk := m.issue("--new")
			return forge(t, tk, func(tok *wire.Token) { tok.Fingerprint[0] ^= 0xff })
		}, 1, []string{"refused by the agent", "fingerprint mismatch: got ", "pinned "}},
		{"control key mismatch", func() string {
			tk := m.issue("--new")
			return forge(t, tk, func(tok *wire.Token) { tok.ControlKey = otherKey })
		}, 1, []string{"refused by the executor", "does not verify under the control key the token pinned"}},
		{"another mesh's token", func() string {
			tk := m.issue("--new")
			return forge(t, tk, func(tok *wire.Token) { rand.Read(tok.Credential[:]) })
		}, 1, []string{"refused by the broker", "refused the token's one-time credential"}},
	}
	for _, tc := range cases {
		code, out, errOut := m.enrol(tc.token())
		all := out + errOut
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, code, tc.code, all)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: the refusal does not say %q:\n%s", tc.name, w, all)
			}
		}
		if st := m.executorStatus(); st["state"] != "hosted" {
			t.Fatalf("%s: the executor is %v after a refusal", tc.name, st["state"])
		}
	}
	// The fingerprint case names both values.
	if code, _, errOut := m.enrol(forge(t, m.issue("--new"), func(tok *wire.Token) { tok.Fingerprint[0] ^= 0xff })); code != 1 || strings.Count(errOut, "got ") != 1 {
		t.Fatalf("fingerprint: %d %s", code, errOut)
	}

	// A token is used once: a second machine (here: the same one, again)
	// presenting it is refused by the control side, saying so.
	token := m.issue("--new", "--name", "n1")
	m.enrolled(token, "n1")
	code, out, errOut := m.enrol(token)
	if code != 1 || !strings.Contains(out+errOut, "was used already") {
		t.Fatalf("used token: exit %d\n%s%s", code, out, errOut)
	}
	// The refusal of a re-enrolment leaves the identity the host has.
	if st := m.executorStatus(); st["state"] != "enrolled" || st["node"] != "n1" {
		t.Fatalf("executor status %v", st)
	}
	// Never from the command line.
	cmd := exec.Command(filepath.Join(bin, "mesh-executor"), "enrol", "--state", m.state, token)
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "never taken from the command line") {
		t.Fatalf("a token on the command line: %v %s", err, b)
	}
}

// Re-enrolment as the same node revokes the old identity; declarations
// made for the old enrolment are refused by the executor even when a
// compromised agent hands them over; revocation alone shuts the node out
// at the broker, legibly.
func TestReEnrolmentAndRevocation(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"first\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	// What a compromised agent kept: the envelope as the broker carried it.
	old := m.lastEnvelope()
	oldID := m.executorStatus()

	// Re-enrol: token --node revokes the identity now.
	token := m.issue("--node", "n1")
	eventually(t, "the old identity shut out", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return bytes.Contains(b, []byte("authorization refused by the broker"))
	})
	// The agent holds an identity the broker refuses; the person re-enrols
	// the machine: the agent is hosted again once the executor is, or
	// here, takes the new enrolment over its old one.
	m.enrolled(token, "n1")
	if st := m.executorStatus(); st["enrolment"] == oldID["enrolment"] {
		t.Fatalf("the same enrolment after re-enrolment: %v", st)
	}
	// The old declaration, handed over by a compromised agent (a root
	// process on the socket here), is refused by the executor.
	v := pushEnvelope(t, m.sock, old)
	if v.Outcome != shapes.Refused || v.Code != wire.CodeAddress {
		t.Fatalf("the old enrolment's declaration: %+v", v)
	}
	seq2 := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"second\n"}]}`)
	if seq2 <= seq {
		t.Fatalf("sequences restarted on re-enrolment: %d after %d", seq2, seq)
	}
	if r := m.reportFor(seq2); r.Outcome != shapes.Applied {
		t.Fatalf("after re-enrolment: %+v", r)
	}

	// node revoke: the broker refuses the node from now on, and the
	// agent says so.
	m.run("mesh-control", "node", "revoke", "n1", "--dir", m.ctl)
	os.Truncate(filepath.Join(m.base, "mesh-agent.log"), 0)
	eventually(t, "the revoked node told legibly", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return bytes.Contains(b, []byte("authorization refused by the broker"))
	})
	if s := m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl); !strings.Contains(s, "revoked") {
		t.Fatalf("node show after revoke:\n%s", s)
	}
}

// lastEnvelope reads the newest declaration envelope the executor saved as
// its link target.
func (m *mesh) lastEnvelope() []byte {
	m.t.Helper()
	b, err := os.ReadFile(filepath.Join(m.state, "target-link.json"))
	if err != nil {
		m.t.Fatalf("the link target: %v", err)
	}
	return b
}

// helloAsAgent is a connection to the executor at sock, its hello said as
// the agent of this build says it.
func helloAsAgent(t *testing.T, sock string) *wire.Conn {
	t.Helper()
	c, err := wire.DialUnix(sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Build: "e2e"}); err != nil {
		c.Close()
		t.Fatal(err)
	}
	if _, _, err := c.Read(); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// pushEnvelope hands env to the executor as the agent would.
func pushEnvelope(t *testing.T, sock string, env []byte) *wire.Verdict {
	t.Helper()
	c := helloAsAgent(t, sock)
	defer c.Close()
	if err := c.Write(wire.KindDeclaration, &wire.Declaration{Envelope: env}); err != nil {
		t.Fatal(err)
	}
	for {
		k, b, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		if k == wire.KindVerdict {
			return b.(*wire.Verdict)
		}
	}
}

// Retiring: a signed declaration with owns_nothing and retire removes what
// the host owns, is reported, and both halves drop the identity: hosted
// again, and enrollable again.
func TestRetire(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"held\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	// owns_nothing alone: a node holding nothing, still a node.
	seq = m.declare(`{"version":1,"owns_nothing":true,"resources":[]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Removed {
		t.Fatalf("owns_nothing report %+v", r)
	}
	if st := m.executorStatus(); st["state"] != "enrolled" || st["holds"] != float64(0) {
		t.Fatalf("executor after owns_nothing: %v", st)
	}
	if n := m.nodeNamed("n1"); n["state"] == "revoked" {
		t.Fatalf("the control side after owns_nothing alone: %v", n)
	}
	// A plan of the retirement says it, and retires nothing.
	if out, code := m.plan(`{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`); code != 0 || !strings.Contains(out, "then n1 is retired") {
		t.Fatalf("plan of the retirement: exit %d\n%s", code, out)
	}
	if st := m.executorStatus(); st["state"] != "enrolled" {
		t.Fatalf("executor after the plan of its retirement: %v", st)
	}
	seq = m.declare(`{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Unchanged {
		t.Fatalf("retire report %+v", r)
	}
	if _, err := os.Stat(filepath.Join(m.tree, "motd")); !os.IsNotExist(err) {
		t.Fatal("owns_nothing left what the host made")
	}
	if st := m.executorStatus(); st["state"] != "hosted" {
		t.Fatalf("executor after retire: %v", st)
	}
	// No key of the node it was is left on the machine.
	for _, f := range []string{"keys.json", "enrolment-granted.json", "rekey-pending.json", "enrolment-pending-wireguard.json", "wireguard.key", "wireguard.pub", "identity.json", "control-keys.json"} {
		if _, err := os.Stat(filepath.Join(m.state, f)); !os.IsNotExist(err) {
			t.Errorf("after retire, %s is still in the state: %v", f, err)
		}
	}
	eventually(t, "the agent hosted again", func() bool {
		_, err := os.Stat(m.agentConfig())
		return os.IsNotExist(err)
	})
	// The control side follows: the node revoked (its credential let in
	// no more), its reports still read, the retirement's among them.
	eventually(t, "the retired node revoked", func() bool { return m.nodeNamed("n1")["state"] == "revoked" })
	if out := m.run("mesh-control", "reports", "n1", "--dir", m.ctl); !strings.Contains(out, fmt.Sprintf("seq %d", seq)) {
		t.Fatalf("the retired node's reports:\n%s", out)
	}
	// Hosted again: enrollable again, as the same node.
	m.enrolled(m.issue("--node", "n1"), "n1")
	seq = m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"back\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("after re-enrolment: %+v", r)
	}
}

// Disconnection is a situation: with the broker down the node keeps
// holding its machine; back up, it says how long it was away, and nodes
// shows when it was last heard from.
func TestDisconnectionIsASituation(t *testing.T) {
	m := newBareMesh(t)
	m.startExecutor("--drift", "300ms")
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"held\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	// The broker goes away.
	ctl := m.procs[0]
	ctl.Process.Signal(os.Interrupt)
	ctl.Wait()
	// The machine drifts; the node repairs it from its store, unlinked.
	os.WriteFile(filepath.Join(m.tree, "motd"), []byte("drifted\n"), 0o644)
	eventually(t, "drift repaired while disconnected", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.tree, "motd"))
		return string(b) == "held\n"
	})
	time.Sleep(3 * time.Second)
	m.startControl()
	var hb map[string]any
	eventually(t, "a heartbeat saying how long it was away", func() bool {
		n := m.nodeNamed("n1")
		if n == nil {
			return false
		}
		hb, _ = n["heartbeat"].(map[string]any)
		u, _ := hb["unlinked_seconds"].(float64)
		return u >= 3
	})
	text := m.run("mesh-control", "nodes", "--dir", m.ctl)
	if !strings.Contains(text, "ago") || strings.Contains(strings.ToLower(text), "alarm") {
		t.Fatalf("nodes:\n%s", text)
	}
	// In the one form every JSON output keeps: how long, in whole seconds.
	if js := m.run("mesh-control", "nodes", "--dir", m.ctl, "--json"); jsonform.Check([]byte(js)) != nil {
		t.Fatalf("nodes --json after a disconnection: %v\n%s", jsonform.Check([]byte(js)), js)
	}
	_ = strconv.Itoa
}

// Losing the store: the control side keeps what the node last reported
// it owns and hands it back, signed, on re-enrolment; the next apply
// removes a recovered orphan only if it is still exactly what the host
// wrote. The last declaration holds sealed content, sealed to the keys
// the re-enrolment replaces, so the control side does not declare it
// again by itself (it would otherwise put the machine back as declared,
// leaving no orphan), and says so.
func TestLostStoreRecovered(t *testing.T) {
	m := newBareMesh(t)
	ex := m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	sf := filepath.Join(m.base, "secret")
	os.WriteFile(sf, []byte("s\n"), 0o600)
	f := filepath.Join(m.base, "decl.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"resources":[`+
		`{"module":"app","id":"a","type":"file","path":"{root}/a","content":"a\n"},`+
		`{"module":"app","id":"b","type":"file","path":"{root}/b","content":"b\n"},`+
		`{"module":"app","id":"c","type":"file","path":"{root}/c","content":"c\n"},`+
		`{"module":"app","id":"d","type":"directory","path":"{root}/d"},`+
		`{"module":"app","id":"x","type":"file","path":"{root}/d/x","content":"x\n"},`+
		`{"module":"app","id":"s","type":"file","path":"{root}/s","mode":"0600"}]}`, "{root}", m.tree)), 0o600)
	seq := declaredSeq(t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--seal", "app.s="+sf, "--json"))
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	eventually(t, "the control side's copy", func() bool {
		var v struct {
			Owned *struct {
				Entries []map[string]any `json:"entries"`
			} `json:"owned"`
		}
		json.Unmarshal([]byte(m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl, "--json")), &v)
		return v.Owned != nil && len(v.Owned.Entries) == 6
	})
	// Someone edits c; then the disk with the executor's state is lost.
	os.WriteFile(filepath.Join(m.tree, "c"), []byte("edited by hand\n"), 0o644)
	ex.Process.Signal(os.Interrupt)
	ex.Wait()
	os.RemoveAll(m.state)
	os.MkdirAll(m.state, 0o700)
	m.startExecutor()

	// Re-enrolled as the same node (the token revokes the old identity).
	token := m.issue("--node", "n1")
	m.enrolled(token, "n1")
	logb, _ := os.ReadFile(filepath.Join(m.base, "mesh-executor.log"))
	if !bytes.Contains(logb, []byte("recovered from the control side's copy")) {
		t.Fatal("the executor did not take the store copy in")
	}
	owned := m.run("mesh-executor", "owned", "--state", m.state)
	if strings.Count(owned, "link:app.") != 6 {
		t.Fatalf("owned after recovery:\n%s", owned)
	}
	eventually(t, "serve saying the last declaration is not declared again", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-control.log"))
		return bytes.Contains(b, []byte("was not declared its last declaration")) && bytes.Contains(b, []byte("sealed content (app.s)"))
	})
	// The mesh now declares only a: b is removed (exactly what the host
	// wrote), c is left (changed by hand), d and d/x removed, s left (its
	// content, sealed, cannot be checked against what the host wrote).
	seq = m.declare(`{"version":1,"resources":[{"module":"app","id":"a","type":"file","path":"{root}/a","content":"a\n"}]}`)
	r := m.reportFor(seq)
	lines := map[string]shapes.Line{}
	for _, l := range r.Lines {
		lines[l.ID] = l
	}
	if lines["b"].Outcome != shapes.Removed || lines["x"].Outcome != shapes.Removed || lines["d"].Outcome != shapes.Removed ||
		lines["s"].Outcome != shapes.Forgotten || !strings.Contains(lines["s"].Detail, "sealed") ||
		lines["c"].Outcome != shapes.Forgotten || !strings.Contains(lines["c"].Detail, "changed since the host wrote it") {
		t.Fatalf("the apply after recovery: %+v", r.Lines)
	}
	for f, want := range map[string]bool{"a": true, "b": false, "c": true, "d": false, "s": true} {
		if _, err := os.Stat(filepath.Join(m.tree, f)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", f, err == nil, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "c")); string(b) != "edited by hand\n" {
		t.Fatal("a changed orphan was touched")
	}
}

// A machine whose disk was replaced (the executor's store lost), enrolled
// again as its node, is put back as it was declared with no one declaring
// to it again: the control side declares to the new enrolment what the
// node was last declared, and the executor, recovering what it owned from
// the control side's copy, writes back what changed meanwhile and holds
// it from then on.
func TestALostStoreIsPutBackAsDeclared(t *testing.T) {
	m := newBareMesh(t)
	ex := m.startExecutor("--drift", "1s")
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[` +
		`{"module":"app","id":"a","type":"file","path":"{root}/a","content":"a\n"},` +
		`{"module":"app","id":"b","type":"file","path":"{root}/b","content":"b\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	ex.Process.Signal(os.Interrupt)
	ex.Wait()
	os.RemoveAll(m.state)
	os.MkdirAll(m.state, 0o700)
	os.WriteFile(filepath.Join(m.tree, "b"), []byte("edited by hand\n"), 0o644)
	m.startExecutor("--drift", "1s")
	m.enrolled(m.issue("--node", "n1"), "n1")
	r := m.reportFor(seq + 1)
	if r.Outcome != shapes.Repaired && r.Outcome != shapes.Applied {
		t.Fatalf("the declaration carried to the new enrolment: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "b")); string(b) != "b\n" {
		t.Fatalf("b after the carried declaration: %q", b)
	}
	// And held: a hand edit now is put back by the drift timer.
	os.WriteFile(filepath.Join(m.tree, "a"), []byte("edited again\n"), 0o644)
	eventually(t, "the drift put back", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.tree, "a"))
		return string(b) == "a\n"
	})
}

// Sealed content crosses the whole mesh unread: the file is written on the
// machine, and neither the agent's files and log, the broker's JetStream
// store on disk, nor any report holds the plaintext, its base64 or its
// plain SHA-256.
func TestSealedContentEndToEnd(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	secret := []byte("db-password=" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-never-in-the-clear\n")
	sf := filepath.Join(m.base, "secret")
	os.WriteFile(sf, secret, 0o600)
	f := filepath.Join(m.base, "decl.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"db","id":"creds","type":"file","path":"{root}/creds","mode":"0600"}]}`, "{root}", m.tree)), 0o600)
	// A plan seals the content for itself: it says what the declare will
	// do, and nothing of the content.
	plan := func() string {
		t.Helper()
		return m.run("mesh-control", "plan", "n1", f, "--dir", m.ctl, "--seal", "db.creds="+sf)
	}
	planned := plan()
	if !strings.Contains(planned, "db.creds  file  would apply  created (sealed, ") || !strings.Contains(planned, "(not shown: sealed content)") {
		t.Fatalf("the plan before the declare:\n%s", planned)
	}
	seq := declaredSeq(t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--seal", "db.creds="+sf, "--json"))
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "creds")); !bytes.Equal(b, secret) {
		t.Fatalf("the machine holds %q", b)
	}
	same := plan()
	if !strings.Contains(same, "db.creds  file  would change nothing") {
		t.Fatalf("the plan of the content the node holds:\n%s", same)
	}
	other := filepath.Join(m.base, "other")
	os.WriteFile(other, []byte("db-password=another\n"), 0o600)
	changed := m.run("mesh-control", "plan", "n1", f, "--dir", m.ctl, "--seal", "db.creds="+other)
	if !strings.Contains(changed, "db.creds  file  would apply  content replaced (sealed, ") || !strings.Contains(changed, "(not shown: sealed content)") {
		t.Fatalf("the plan of other content:\n%s", changed)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "creds")); !bytes.Equal(b, secret) {
		t.Fatalf("a plan changed the file: %q", b)
	}
	sum := sha256.Sum256(secret)
	forms := map[string][]byte{
		"plaintext": secret, "base64": []byte(base64.StdEncoding.EncodeToString(secret)),
		"sha256": []byte(hex.EncodeToString(sum[:])), "raw sha256": sum[:],
	}
	search := func(where string, b []byte) {
		for name, f := range forms {
			if bytes.Contains(b, f) {
				t.Errorf("%s holds the sealed content's %s", where, name)
			}
		}
	}
	walk := func(root string) {
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				b, _ := os.ReadFile(p)
				search(p, b)
			}
			return nil
		})
	}
	walk(m.agentState())
	walk(filepath.Join(m.ctl, "jetstream"))
	for _, l := range []string{"mesh-agent.log", "mesh-control.log"} {
		b, _ := os.ReadFile(filepath.Join(m.base, l))
		search(l, b)
	}
	search("the plans", []byte(planned+same+changed))
	search("reports", []byte(m.run("mesh-control", "reports", "n1", "--dir", m.ctl, "--json", "--last", "100")))
	search("node show", []byte(m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl, "--json")))
	// The positive controls: the broker's store on disk does hold the
	// declaration (its path, in the clear), so the search looked where it
	// lives.
	found := false
	filepath.Walk(filepath.Join(m.ctl, "jetstream"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			found = found || bytes.Contains(b, []byte(filepath.Join(m.tree, "creds")))
		}
		return nil
	})
	if !found {
		t.Fatal("the declaration is not in the broker's store on disk: the search proves nothing")
	}
}

// An enrolment root begins on a machine whose agent is linked (enrol
// --replace, as another node) is carried out within the agent's look at
// its executor, every few seconds, not at its next heartbeat: here an
// hour away.
func TestAnEnrolmentOfALinkedNodeIsCarriedOutWithinSeconds(t *testing.T) {
	m := newBareMesh(t)
	m.startExecutor()
	m.startAgent("--config", m.agentConfig(), "--heartbeat", "1h")
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 linked", func() bool { return m.nodeNamed("n1")["state"] == "enrolled" })
	code, out, errs := m.runCode("mesh-executor", m.issue("--new", "--name", "n2")+"\n", "enrol", "--state", m.state, "--replace", "--wait", "20s")
	if code != 0 || !strings.Contains(out, "enrolled as node n2") {
		t.Fatalf("enrol --replace of a linked node: exit %d\n%s%s", code, out, errs)
	}
}

// A retirement that keeps what the host made (a directory holding a file
// someone put there) still retires the node — the executor drops its
// identity whatever its lines kept — and the control side follows it:
// revoked, as its agent says the declaration it signed retired the node.
func TestARetirementThatKeepsIsFollowedToo(t *testing.T) {
	m := newHost(t)
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"dir","type":"directory","path":"{root}/kept"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	os.WriteFile(filepath.Join(m.tree, "kept", "theirs"), []byte("not the host's\n"), 0o644)
	seq = m.declare(`{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`)
	r := m.reportFor(seq)
	if r.Outcome == shapes.Failed || r.Outcome == shapes.Refused || len(r.Lines) != 1 || r.Lines[0].Outcome != shapes.Kept {
		t.Fatalf("the retirement's report %+v", r)
	}
	if st := m.executorStatus(); st["state"] != "hosted" {
		t.Fatalf("executor after the retirement: %v", st)
	}
	eventually(t, "the retired node revoked", func() bool { return m.nodeNamed("n1")["state"] == "revoked" })
}
