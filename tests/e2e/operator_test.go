package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// An existing broker in NATS operator mode (broker-config --resolver): a
// real nats-server whose every account is a JWT the operator key signs,
// each node's own pushed by serve through the system account. A node
// enrols with a token (whose one-time credential signs in as an account of
// its own) and is declared to; another node's answers cannot be steered
// onto its subjects (each request's answer lands in the requester's own
// account); a revoked node is cut off, a deleted node's account leaves the
// resolver, and a token revoked takes its account with it.
func TestAnExistingBrokerInOperatorMode(t *testing.T) {
	m, url, store := operatorMesh(t)

	if out := m.run("mesh-control", "status", "--dir", m.ctl); !strings.Contains(out, "in NATS operator mode") {
		t.Errorf("status does not say the broker is in operator mode:\n%s", out)
	}

	// n2, added by hand, and a probe of each node signing in with its own
	// credentials.
	n2conf := filepath.Join(m.base, "n2.json")
	m.run("mesh-control", "node", "add", "n2", "--dir", m.ctl, "--out", n2conf)
	n1 := probeClient(t, m.agentConfig(), url)
	n2 := probeClient(t, n2conf, url)
	// Every subject n2 hears, in either layout: what n1 names as the reply
	// of each request it may make, in either layout, must never reach it.
	heard := make(chan *nats.Msg, 64)
	for _, subj := range []string{"mesh.notice.n2", "mesh.notice.n2.>", "mesh.plan.n2", "_INBOX.n2.>", "mesh.roster-notice"} {
		if _, err := n2.ChanSubscribe(subj, heard); err != nil {
			t.Fatalf("n2 hears %s: %v", subj, err)
		}
	}
	n2.Flush()
	replies := []string{"mesh.notice.n2", "mesh.notice.n2.plan", "mesh.notice.n2.inbox.x", "mesh.plan.n2", "_INBOX.n2.x", "mesh.roster-notice"}
	probes := 0
	for _, l := range []link.Layout{link.LayoutByNode, link.LayoutByKind} {
		s1 := link.NodeSubjects("n1", l)
		own, err := n1.SubscribeSync(s1.Inbox + ".probe")
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range []string{s1.DeclGet, s1.RosterGet, s1.HeartbeatGet, s1.ArchiveGet, s1.Report, s1.Heartbeat} {
			// The positive control: with its own inbox as the reply, each
			// is answered (a read, or JetStream's acknowledgement of a
			// report or heartbeat, which the recorder ignores: n1's NKey
			// did not sign it).
			if err := n1.PublishRequest(req, s1.Inbox+".probe", []byte("{}")); err != nil {
				t.Fatal(err)
			}
			if _, err := own.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("n1's own request %s, answered to its own inbox: %v", req, err)
			}
			for _, reply := range replies {
				if err := n1.PublishRequest(req, reply, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				probes++
			}
		}
		own.Unsubscribe()
	}
	n1.Flush()
	t.Logf("%d probes of replies onto n2's subjects", probes)
	select {
	case msg := <-heard:
		t.Fatalf("n2 heard n1's answer on %s: %q", msg.Subject, msg.Data)
	case <-time.After(2 * time.Second):
	}
	// n2's listener works: the control side's notice reaches it.
	f := filepath.Join(m.base, "n2-decl.json")
	os.WriteFile(f, []byte(`{"version":1,"owns_nothing":true,"resources":[]}`), 0o600)
	m.run("mesh-control", "declare", "n2", f, "--dir", m.ctl)
	select {
	case <-heard:
	case <-time.After(10 * time.Second):
		t.Fatal("n2 never heard its own notice: the probe above proves nothing")
	}

	accounts := filepath.Join(store, "accounts")
	// A token's account is there while the token may be used, and goes
	// with its revocation.
	t3, err := wire.ParseToken(m.issue("--new", "--name", "n3"))
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.FromRawSeed(nkeys.PrefixByteAccount, t3.Credential[:])
	pub, _ := kp.PublicKey()
	t3account := filepath.Join(accounts, pub+".jwt")
	eventually(t, "the token's account in the resolver", func() bool { _, err := os.Stat(t3account); return err == nil })
	// Its holder signs its own JWT, with every permission: its account
	// still reaches nothing but its enrolment subject.
	tc := tokenHolder(t, url, t3)
	for _, subj := range []string{"$JS.API.INFO", "$JS.API.DIRECT.GET.MESH_DECL.mesh.decl.n1", "$JS.API.STREAM.NAMES", "mesh.up.n1.decl", "mesh.heartbeat.n1", "mesh.enrol.0000000000000000"} {
		// JetStream's API answers in every account, and in its own
		// says only that it has none.
		if msg, err := tc.Request(subj, []byte("{}"), time.Second); err == nil && !strings.Contains(string(msg.Data), "not enabled for account") {
			t.Errorf("the token's holder asked %s and was answered: %s", subj, msg.Data)
		}
	}
	heardT := make(chan *nats.Msg, 8)
	if _, err := tc.ChanSubscribe(">", heardT); err != nil {
		t.Fatal(err)
	}
	tc.Flush()
	m.run("mesh-control", "declare", "n2", f, "--dir", m.ctl)
	select {
	case msg := <-heardT:
		t.Errorf("the token's holder heard %s", msg.Subject)
	case <-time.After(2 * time.Second):
	}
	tc.Close()

	// Revoked: the broker cuts n1's connections and refuses the next.
	os.Truncate(filepath.Join(m.base, "mesh-agent.log"), 0)
	m.run("mesh-control", "node", "revoke", "n1", "--dir", m.ctl)
	eventually(t, "the revoked node's probe connection cut", func() bool { return n1.IsClosed() || !n1.IsConnected() })
	eventually(t, "the revoked node refused by the broker", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return strings.Contains(string(b), "authorization refused by the broker")
	})

	// A deleted node's account leaves the resolver.
	n2account := filepath.Join(accounts, control.NodeAccountID("n2")+".jwt")
	if _, err := os.Stat(n2account); err != nil {
		t.Fatalf("n2's account is not in the resolver: %v", err)
	}
	m.run("mesh-control", "node", "revoke", "n2", "--dir", m.ctl)
	m.run("mesh-control", "node", "delete", "n2", "--dir", m.ctl)
	eventually(t, "the deleted node's account out of the resolver", func() bool { _, err := os.Stat(n2account); return os.IsNotExist(err) })

	m.run("mesh-control", "token", "revoke", t3.IDString(), "--dir", m.ctl)
	eventually(t, "the revoked token's account out of the resolver", func() bool { _, err := os.Stat(t3account); return os.IsNotExist(err) })
}

// operatorMesh is a real nats-server in operator mode, from the
// configuration broker-config --resolver writes (its store under the
// returned directory), serve on it, and n1 enrolled with a token and
// declared to.
func operatorMesh(t *testing.T) (m *mesh, url, store string) {
	m = newMeshDirs(t)
	url = fmt.Sprintf("tls://127.0.0.1:%d", m.port)
	listen := fmt.Sprintf("127.0.0.1:%d", m.port)
	store = filepath.Join(m.base, "broker-store")
	natsServer := buildNATSServer(t, m.base)
	conf := filepath.Join(m.base, "broker.conf")
	os.WriteFile(conf, []byte(m.run("mesh-control", "broker-config", "--dir", m.ctl, "--listen", listen, "--resolver", "--store", store)), 0o600)
	startAbs(m, natsServer, "-c", conf)

	// The key directory stays in operator mode: the embedded broker is
	// refused there, as a configuration from a file is.
	if code, _, stderr := m.runCode("mesh-control", "", "serve", "--dir", m.ctl, "--listen", "127.0.0.1:0"); code == 0 || !strings.Contains(stderr, "operator mode") {
		t.Fatalf("the embedded broker from a key directory in operator mode: exit %d: %s", code, stderr)
	}
	m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--nats", url)
	eventually(t, "the control side serves", func() bool { code, _, _ := m.runCode("mesh-control", "", "nodes", "--dir", m.ctl); return code == 0 })

	// n1 enrols with a token, and is declared to.
	m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from through the broker in operator mode", func() bool { return m.node()["executor_version"] == "e2e" })
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"through a broker in operator mode\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("a declaration through the broker in operator mode: %+v", r)
	}
	return m, url, store
}

// The nodes' account key, a trust anchor in operator mode, rotates: a new
// key announced, every node's account lists both, and n1 is sent a JWT of
// the new key, which it keeps and names in its heartbeat; the switch is
// refused while n2 (added by hand, no agent) has not, naming it, and
// forced goes on: the accounts list the new key alone, n1 is cut off its
// old JWT's connection and signs in again with the new, and a JWT of the
// old key is refused.
func TestTheNodesAccountKeyRotates(t *testing.T) {
	m, url, _ := operatorMesh(t)
	n2conf := filepath.Join(m.base, "n2", "n2.json")
	m.run("mesh-control", "node", "add", "n2", "--dir", m.ctl, "--out", n2conf)
	old, err := control.LoadKeys(m.ctl)
	if err != nil {
		t.Fatal(err)
	}
	// The system account's and CONTROL's identity keys are nowhere: an
	// identity key issues its account's users for ever, and cannot be
	// rotated away.
	for _, f := range []string{"broker-system.nk", "broker-control.nk"} {
		if _, err := os.Stat(filepath.Join(m.ctl, f)); !os.IsNotExist(err) {
			t.Fatalf("the key directory keeps %s: %v", f, err)
		}
	}
	issuer := func() string {
		hb, _ := m.node()["heartbeat"].(map[string]any)
		s, _ := hb["jwt_issuer"].(string)
		return s
	}
	if issuer() != old.AccountPublic {
		t.Fatalf("n1 signs in with a JWT of %q, not the nodes' account key %s", issuer(), old.AccountPublic)
	}
	if code, _, stderr := m.runCode("mesh-control", "", "account-key", "rotate", "--switch", "--dir", m.ctl); code == 0 || !strings.Contains(stderr, "account-key rotate first") {
		t.Fatalf("a switch with nothing announced: exit %d: %s", code, stderr)
	}

	out := m.run("mesh-control", "account-key", "rotate", "--dir", m.ctl, "--json")
	var res control.AccountKeyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Phase != "announced" || res.Next == "" || res.Next == old.AccountPublic {
		t.Fatalf("account-key rotate: %v\n%s", err, out)
	}
	eventually(t, "n1 signs in with a JWT of the new key", func() bool { return issuer() == res.Next })

	code, _, stderr := m.runCode("mesh-control", "", "account-key", "rotate", "--switch", "--dir", m.ctl)
	if code == 0 || !strings.Contains(stderr, "n2") || strings.Contains(stderr, "n1") {
		t.Fatalf("a switch while n2 has not taken the new key: exit %d: %s", code, stderr)
	}
	// A connection of a JWT of the old key, made while both are listed,
	// is cut at the switch; so is a user of CONTROL whom the control
	// side's old signing key issued (a thief of it, or a serve that has
	// not signed in again).
	pre, err := dialAs(m.agentConfig(), url)
	if err != nil {
		t.Fatalf("the grant's JWT, of the old key, while both are listed: %v", err)
	}
	defer pre.Close()
	oldSigning, err := os.ReadFile(filepath.Join(m.ctl, control.FileBrokerSigning))
	if err != nil {
		t.Fatal(err)
	}
	if res.ControlNext == "" || res.ControlNext == res.ControlCurrent {
		t.Fatalf("no control signing key announced: %+v", res)
	}
	preControl, err := controlUser(old, oldSigning, url)
	if err != nil {
		t.Fatalf("a CONTROL user of the old signing key while both are listed: %v", err)
	}
	defer preControl.Close()
	os.Truncate(filepath.Join(m.base, "mesh-agent.log"), 0)
	if out := m.run("mesh-control", "account-key", "rotate", "--switch", "--force", "--dir", m.ctl); !strings.Contains(out, "switched despite: n2") {
		t.Fatalf("a forced switch:\n%s", out)
	}
	now, err := control.LoadKeys(m.ctl)
	if err != nil || now.AccountPublic != res.Next {
		t.Fatalf("the key directory's nodes' account key after the switch: %v %v", err, now)
	}
	if _, err := os.Stat(filepath.Join(m.ctl, control.FileNodesAccountNext)); !os.IsNotExist(err) {
		t.Fatalf("the announced key is still beside it: %v", err)
	}
	eventually(t, "the old key's connection cut", func() bool { return !pre.IsConnected() })
	eventually(t, "the old control signing key's connection cut", func() bool { return !preControl.IsConnected() })
	if nc, err := controlUser(old, oldSigning, url); err == nil {
		nc.Close()
		t.Fatal("a CONTROL user of the old control signing key still signs in")
	}
	if signing, _ := os.ReadFile(filepath.Join(m.ctl, control.FileBrokerSigning)); bytes.Equal(signing, oldSigning) {
		t.Fatal("the control side's signing key is the same after the switch")
	}
	// serve, cut off too, signed in again with the new key; a command
	// signs in with it.
	m.run("mesh-control", "nodes", "--dir", m.ctl)
	// n1, cut off its connection of the old JWT, links again with the new.
	eventually(t, "n1 linked again", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return strings.Contains(string(b), "linked")
	})
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"after the nodes' account key rotated\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("a declaration after the switch: %+v", r)
	}
	// The grant's JWT, of the old key, is refused now.
	if nc, err := dialAs(m.agentConfig(), url); err == nil {
		nc.Close()
		t.Fatal("a JWT of the old nodes' account key still signs in")
	}

	// A rekey after it: the token's account, the grant's JWT of the key
	// in force, the renewed JWT of the NKey the rekey replaced left
	// behind in the agent's state and passed over.
	before := filepath.Join(m.base, "before-rekey.json")
	b, _ := os.ReadFile(m.agentConfig())
	os.WriteFile(before, b, 0o600)
	if code, out, errOut := m.rekey("--wait", "60s"); code != 0 || !strings.Contains(out, "rekeyed: enrolled as node n1") {
		t.Fatalf("rekey in operator mode: exit %d\n%s%s", code, out, errOut)
	}
	m.agentConfigAfter(b)
	nc, err := dialAs(m.agentConfig(), url)
	if err != nil {
		t.Fatalf("the rekey's grant does not sign in: %v", err)
	}
	nc.Close()
	if nc, err := dialAs(before, url); err == nil {
		nc.Close()
		t.Fatal("the NKey the rekey replaced still signs in")
	}
	seq = m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"after a rekey in operator mode\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("a declaration after the rekey: %+v", r)
	}
	if issuer() != res.Next {
		t.Fatalf("after the rekey n1 signs in with a JWT of %q, not of the key in force %s", issuer(), res.Next)
	}
}

// controlUser signs in to CONTROL as a user whose JWT signing (the
// seed of a control side's signing key) issued, with a key of its own.
func controlUser(k *control.Keys, signing []byte, url string) (*nats.Conn, error) {
	issuer, err := nkeys.FromSeed(bytes.TrimSpace(signing))
	if err != nil {
		return nil, err
	}
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.IssuerAccount = k.Operator.ControlPublic
	tok, err := uc.Encode(issuer)
	if err != nil {
		return nil, err
	}
	return nats.Connect(url, nats.Secure(link.PinnedTLS(k.Fingerprint, nil)),
		nats.UserJWT(func() (string, error) { return tok, nil }, user.Sign), nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// probeClient signs in as the node whose agent configuration is conf,
// with its grant's JWT.
func probeClient(t *testing.T, conf, url string) *nats.Conn {
	t.Helper()
	// Until serve has pushed the node's account, the broker refuses it.
	var nc *nats.Conn
	eventually(t, conf+": signs in with its own credentials", func() bool {
		var err error
		nc, err = dialAs(conf, url)
		return err == nil
	})
	t.Cleanup(nc.Close)
	return nc
}

// tokenHolder signs in as the holder of token would to a broker in
// operator mode, with a user JWT the token's credential signs for itself,
// every subject allowed.
func tokenHolder(t *testing.T, url string, token *wire.Token) *nats.Conn {
	t.Helper()
	user, _ := nkeys.FromRawSeed(nkeys.PrefixByteUser, token.Credential[:])
	account, _ := nkeys.FromRawSeed(nkeys.PrefixByteAccount, token.Credential[:])
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Pub.Allow.Add(">")
	uc.Sub.Allow.Add(">")
	tok, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.Secure(link.PinnedTLS(token.FingerprintHex(), nil)),
		nats.UserJWT(func() (string, error) { return tok, nil }, user.Sign), nats.NoReconnect())
	if err != nil {
		t.Fatalf("the token's holder signs in: %v", err)
	}
	return nc
}

// dialAs signs in once with the grant's JWT in the agent configuration
// conf.
func dialAs(conf, url string) (*nats.Conn, error) {
	var c agent.Config
	b, err := os.ReadFile(conf)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(c.NKeySeed))
	if err != nil {
		return nil, err
	}
	pin, err := link.ParseFingerprint(c.BrokerFingerprint)
	if err != nil {
		return nil, err
	}
	return nats.Connect(url, nats.Secure(link.PinnedTLS(pin, nil)),
		nats.UserJWT(func() (string, error) { return c.UserJWT, nil }, kp.Sign),
		nats.CustomInboxPrefix(link.NodeSubjects(c.Node, link.LayoutByNode).Inbox), nats.NoReconnect())
}

// A control side that ran the embedded broker moves to a broker of its own
// in operator mode on the same store: broker-config --resolver refuses
// while the embedded broker runs, then carries the control side's streams
// over (nats-server names an account's directory after the account, CONTROL
// before, its public key now), so the registry, the declarations and their
// sequences are there under the new broker. The node, whose credential is
// of the form before, enrols again with a token and is declared to after
// its last sequence.
func TestTheStoreCarriesOverToOperatorMode(t *testing.T) {
	m := newMeshDirs(t)
	url := fmt.Sprintf("tls://127.0.0.1:%d", m.port)
	listen := fmt.Sprintf("127.0.0.1:%d", m.port)
	embedded := m.startControl()
	m.startExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	eventually(t, "n1 heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	before := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"before\n"}]}`)
	if r := m.reportFor(before); r.Outcome != shapes.Applied {
		t.Fatalf("before the move: %+v", r)
	}

	if code, _, stderr := m.runCode("mesh-control", "", "broker-config", "--dir", m.ctl, "--resolver", "--listen", listen); code == 0 || !strings.Contains(stderr, "stop it") {
		t.Fatalf("broker-config --resolver with the embedded broker running: exit %d\n%s", code, stderr)
	}
	embedded.Process.Signal(syscall.SIGTERM)
	embedded.Wait()
	code, conf, stderr := m.runCode("mesh-control", "", "broker-config", "--dir", m.ctl, "--resolver", "--listen", listen)
	if code != 0 || !strings.Contains(stderr, "carried over to operator mode") {
		t.Fatalf("broker-config --resolver with no broker: exit %d\n%s", code, stderr)
	}
	confFile := filepath.Join(m.base, "broker.conf")
	os.WriteFile(confFile, []byte(conf), 0o600)
	startAbs(m, buildNATSServer(t, m.base), "-c", confFile)
	m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--nats", url)
	eventually(t, "the control side serves on the broker in operator mode", func() bool {
		code, _, _ := m.runCode("mesh-control", "", "nodes", "--dir", m.ctl)
		return code == 0
	})
	if m.node() == nil {
		t.Fatal("n1 is not in the registry under the broker in operator mode")
	}

	// Enrolled again: its credential was of the form before.
	if code, out, errOut := m.enrol(m.issue("--node", "n1"), "--replace"); code != 0 || !strings.Contains(out, "enrolled as node n1") {
		t.Fatalf("n1 enrolled again: exit %d\n%s%s", code, out, errOut)
	}
	after := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"after\n"}]}`)
	if after <= before {
		t.Fatalf("the sequence went back: %d after %d", after, before)
	}
	if r := m.reportFor(after); r.Outcome != shapes.Applied {
		t.Fatalf("after the move: %+v", r)
	}
}
