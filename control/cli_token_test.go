package control_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// tokenConn connects with a token's one-time credential, as the agent
// does to enrol, once.
func tokenConn(s *served, text string) (*nats.Conn, error) {
	tok, err := wire.ParseToken(text)
	if err != nil {
		return nil, err
	}
	cred, _ := nkeys.FromRawSeed(nkeys.PrefixByteUser, tok.Credential[:])
	pub, _ := cred.PublicKey()
	return nats.Connect(s.url, nats.Secure(link.PinnedTLS(tok.FingerprintHex(), nil)), nats.Nkey(pub, cred.Sign),
		nats.CustomInboxPrefix(link.EnrolInbox(tok.IDString())), nats.NoReconnect())
}

// servedCLI is a serve of the test's own, in a key directory of its
// own, and mesh-control run against it as a person types it.
func servedCLI(t *testing.T) (*served, string, context.Context, func(args ...string) (string, string, int)) {
	t.Helper()
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return s, dir, ctx, func(args ...string) (string, string, int) {
		t.Helper()
		return run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
	}
}

// tokenList is token list --json, decoded and held to the JSON form.
func tokenList(t *testing.T, ctx context.Context, dir, url string) map[string]control.TokenView {
	t.Helper()
	out, errs, code := run(t, ctx, "token", "list", "--dir", dir, "--nats", url, "--json")
	if code != 0 {
		t.Fatalf("token list --json: exit %d\n%s", code, errs)
	}
	if err := jsonform.Check([]byte(out)); err != nil {
		t.Errorf("token list --json: %v\n%s", err, out)
	}
	var vs []control.TokenView
	if err := json.Unmarshal([]byte(out), &vs); err != nil {
		t.Fatalf("token list --json: %v\n%s", err, out)
	}
	m := map[string]control.TokenView{}
	for _, v := range vs {
		m[v.ID] = v
	}
	return m
}

// token list says each token's state; token revoke makes a usable token
// unusable at once — the enrolment responder refuses it and the broker no
// longer lets its credential in — and refuses a used or unknown one.
func TestTokenListAndRevoke(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)

	out, _, code := cmd("token", "list")
	if code != 0 || !strings.Contains(out, "no tokens") {
		t.Fatalf("token list with none: exit %d\n%s", code, out)
	}
	if out, _, code = cmd("token", "list", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("token list --json with none: exit %d %q", code, out)
	}

	enrolNode(t, s, "beta") // its token is used
	out, errs, code := cmd("token", "issue", "--new", "--name", "alpha", "--json")
	var issued struct{ Token, ID string }
	if code != 0 || json.Unmarshal([]byte(out), &issued) != nil {
		t.Fatalf("token issue: exit %d\n%s%s", code, out, errs)
	}
	again, _, code := cmd("token", "issue", "--node", "beta")
	if code != 0 {
		t.Fatalf("token issue --node beta: exit %d", code)
	}
	againID, _ := control.TokenID(strings.TrimSpace(again))

	ts := tokenList(t, ctx, dir, s.url)
	var usedID string
	for id, v := range ts {
		if v.State == control.TokenUsed {
			usedID = id
		}
	}
	if len(ts) != 3 || usedID == "" || ts[usedID].UsedBy != "beta" || ts[issued.ID].State != control.TokenUsable || ts[issued.ID].Node != "alpha" ||
		!ts[issued.ID].New || ts[againID].New || ts[againID].Node != "beta" || ts[againID].State != control.TokenUsable {
		t.Fatalf("token list --json: %+v", ts)
	}
	out, _, code = cmd("token", "list")
	for _, want := range []string{"ID", issued.ID, "alpha", "re-enrolment", "usable for", "used ", "by beta"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("token list lacks %q:\n%s", want, out)
		}
	}
	t.Logf("token list:\n%s", out)

	// The credential is let in while the token is usable; a connection
	// made now carries an enrolment request after the revocation.
	var early *nats.Conn
	eventually(t, "alpha's token credential let in", func() bool {
		c, err := tokenConn(s, issued.Token)
		early = c
		return err == nil
	})
	defer early.Close()

	out, errs, code = cmd("token", "revoke", issued.ID)
	if code != 0 || !strings.Contains(out, "token "+issued.ID+" revoked") || !strings.Contains(out, "refuses its one-time credential") {
		t.Fatalf("token revoke: exit %d\n%s%s", code, out, errs)
	}
	// The responder refuses it, whoever asks, from the record at once.
	m := newMachine(t)
	tok, _ := wire.ParseToken(issued.Token)
	req, _ := json.Marshal(&wire.EnrolRequest{Token: tok.IDString(), Keys: m.keys, Hostname: "h",
		Proof: base64.StdEncoding.EncodeToString(wire.Proof(tok.Secret, tok.ID, &m.keys))})
	if reply, err := early.Request(wire.EnrolSubjectPrefix+"."+tok.IDString(), req, 10*time.Second); err == nil {
		var r wire.EnrolReply
		json.Unmarshal(reply.Data, &r)
		if !strings.Contains(r.Refused, "revoked") || len(r.Grant) != 0 {
			t.Fatalf("an enrolment with a revoked token: %+v", r)
		}
	} else {
		t.Fatalf("the connection made before the revocation: %v", err)
	}
	// And the broker no longer lets its credential in.
	eventually(t, "the revoked token's credential refused by the broker", func() bool {
		c, err := tokenConn(s, issued.Token)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if c, err := tokenConn(s, again); err != nil {
		t.Errorf("another token's credential refused: %v", err)
	} else {
		c.Close()
	}

	// Twice: said, nothing done, exit 0 (the whole token names it too).
	out, _, code = cmd("token", "revoke", issued.Token)
	if code != 0 || !strings.Contains(out, "already revoked") || !strings.Contains(out, "nothing done") {
		t.Fatalf("token revoke again: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		id, want string
	}{
		{usedID, "was used at"},
		{"0011223344556677", "no token 0011223344556677"},
		{"beta", "is not a token id"},
	} {
		out, errs, code := cmd("token", "revoke", c.id)
		if code != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("token revoke %s: exit %d, want 1 and %q\n%s%s", c.id, code, c.want, out, errs)
		}
	}
	if _, errs, _ := cmd("token", "revoke", usedID); !strings.Contains(errs, "node revoke beta") {
		t.Errorf("token revoke of a used token does not say what to do instead: %s", errs)
	}
	js, errs, code := cmd("token", "revoke", againID, "--json")
	if err := jsonform.Check([]byte(js)); code != 0 || err != nil || !strings.Contains(js, `"already": false`) {
		t.Errorf("token revoke --json: exit %d %v\n%s%s", code, err, js, errs)
	}
	ts = tokenList(t, ctx, dir, s.url)
	if ts[issued.ID].State != control.TokenRevoked || ts[issued.ID].Revoked.IsZero() || ts[againID].State != control.TokenRevoked || ts[usedID].State != control.TokenUsed {
		t.Fatalf("token list after the revocations: %+v", ts)
	}
}

// node delete removes a revoked node whole — its registry keys, its
// address claim, its subjects, the re-enrolment token pending for it —
// and the name enrols again as a new node; a live node is refused, saying
// to revoke it first.
func TestNodeDelete(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)
	if _, errs, code := cmd("overlay", "set", "--network", "10.77.0.0/24"); code != 0 {
		t.Fatalf("overlay set: %s", errs)
	}
	enrolNode(t, s, "keep")
	_, id := enrolNode(t, s, "gamma")
	if _, errs, code := cmd("node", "endpoint", "gamma", "192.0.2.9:51820"); code != 0 {
		t.Fatalf("node endpoint: %s", errs)
	}
	module := filepath.Join(t.TempDir(), "base.json")
	os.WriteFile(module, []byte(decl), 0o644)
	if _, errs, code := cmd("assign", "gamma", module); code != 0 {
		t.Fatalf("assign: %s", errs)
	}
	// The node speaks: a report (its last kept in the registry) and a
	// heartbeat.
	nc, err := agent.Dial(id)
	if err != nil {
		t.Fatal(err)
	}
	publishSigned := func(subject string, v any) {
		data, _ := json.Marshal(v)
		m := nats.NewMsg(subject)
		m.Data = data
		sig, _ := id.Sign(data)
		m.Header.Set(link.SignatureHeader, sig)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	publishSigned(id.Subjects.Report, link.Report{Node: "gamma", Enrolment: id.Enrolment, Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, At: now})
	publishSigned(id.Subjects.Heartbeat, link.Heartbeat{Node: "gamma", Enrolment: id.Enrolment, At: now, Interval: 30, State: link.StateEnrolled})
	nc.Flush()
	nc.Close()
	kv := s.client.KV
	has := func(key string) bool {
		_, err := kv.Get(ctx, key)
		return err == nil
	}
	eventually(t, "gamma's address, composition and last report in the registry", func() bool {
		return has("address.gamma") && has("composed.gamma") && has("report.gamma")
	})
	var addr struct{ Address string }
	e, _ := kv.Get(ctx, "address.gamma")
	json.Unmarshal(e.Value(), &addr)
	claim := "ip." + strings.ReplaceAll(addr.Address, ":", "_")
	if !has(claim) {
		t.Fatalf("no claim %s", claim)
	}

	// Live: refused, saying what to do first; nothing removed.
	out, errs, code := cmd("node", "delete", "gamma")
	if code != 1 || !strings.Contains(errs, "revoke it first") || !strings.Contains(errs, "mesh-control node revoke gamma") || !has("node.gamma") || !has("assign.gamma") {
		t.Fatalf("node delete of a live node: exit %d\n%s%s", code, out, errs)
	}
	// Revoked by a re-enrolment token, which is pending for it.
	tokText, _, code := cmd("token", "issue", "--node", "gamma")
	if code != 0 {
		t.Fatal("token issue --node gamma")
	}
	tokID, _ := control.TokenID(strings.TrimSpace(tokText))
	out, errs, code = cmd("node", "delete", "gamma", "--json")
	if err := jsonform.Check([]byte(out)); code != 0 || err != nil {
		t.Fatalf("node delete of a revoked node: exit %d %v\n%s%s", code, err, out, errs)
	}
	var d control.NodeDeleted
	json.Unmarshal([]byte(out), &d)
	for _, k := range []string{"node.gamma", "address.gamma", claim, "endpoint.gamma", "assign.gamma", "composed.gamma", "report.gamma"} {
		if !strings.Contains(out, `"`+k+`"`) {
			t.Errorf("node delete does not say it removed %s:\n%s", k, out)
		}
		if has(k) {
			t.Errorf("%s is still in the registry", k)
		}
	}
	if len(d.TokensRevoked) != 1 || d.TokensRevoked[0] != tokID || len(d.Emptied) != 4 {
		t.Errorf("node delete: %+v", d)
	}
	if ts := tokenList(t, ctx, dir, s.url); ts[tokID].State != control.TokenRevoked {
		t.Errorf("the re-enrolment token pending for gamma: %+v", ts[tokID])
	}
	places := append([]link.StreamSubject{{Stream: link.DeclStream, Subject: "mesh.decl.gamma"}}, link.NodeReports("gamma")...)
	places = append(places, link.StreamSubject{Stream: link.HeartbeatStream, Subject: "mesh.heartbeat.gamma"})
	for _, p := range places {
		st, err := s.client.JS.Stream(ctx, p.Stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(p.Subject))
		if err != nil || info.State.Subjects[p.Subject] != 0 {
			t.Errorf("%s still holds %d message(s) (%v)", p.Subject, info.State.Subjects[p.Subject], err)
		}
	}
	// The other node is untouched.
	if !has("node.keep") || !has("address.keep") {
		t.Error("node delete gamma touched keep")
	}

	// Again, and names it cannot be: refused.
	for _, c := range []struct{ name, want string }{{"gamma", `no node "gamma"`}, {"nosuch", `no node "nosuch"`}, {"a*", "node name"}} {
		if out, errs, code := cmd("node", "delete", c.name); code != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("node delete %s: exit %d, want 1 and %q\n%s%s", c.name, code, c.want, out, errs)
		}
	}
	// The name is free: a new node of that name, from its first sequence,
	// with no reports of the one before.
	enrolNode(t, s, "gamma")
	out, _, code = cmd("reports", "gamma", "--json")
	if code != 0 || !strings.Contains(out, `"reports": []`) || !strings.Contains(out, `"unsigned_skipped": 0`) {
		t.Errorf("reports of the new gamma: exit %d\n%s", code, out)
	}
	out, _, code = cmd("node", "show", "gamma")
	if code != 0 || strings.Contains(out, "revoked") {
		t.Errorf("node show of the new gamma: exit %d\n%s", code, out)
	}
}

// syncBuffer is a bytes buffer a command's goroutines write to while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// After init, and once serve is up on a mesh with no node, the command
// that comes next is said on standard error — never on standard output,
// which scripts parse; a token issued already is pointed at rather than a
// second one; a mesh with nodes is told nothing.
func TestTheNextCommandIsSaid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "keys")
	url := "tls://" + freeAddr(t)
	out, errs, code := run(t, ctx, "init", "--dir", dir, "--url", url)
	if code != 0 || !strings.Contains(errs, "next: mesh-control serve --dir "+dir+"\n") || strings.Contains(out, "next") {
		t.Fatalf("init: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if out, _, _ := run(t, ctx, "init", "--dir", filepath.Join(t.TempDir(), "k2"), "--json"); strings.Contains(out, "next") {
		t.Fatalf("init --json: %s", out)
	}
	// serve, as a person runs it, until stopped.
	type running struct {
		stderr *syncBuffer
		stop   func()
	}
	start := func() *running {
		t.Helper()
		sctx, cancel := context.WithCancel(ctx)
		var stdout syncBuffer
		r := &running{stderr: &syncBuffer{}}
		done := make(chan int, 1)
		go func() {
			done <- control.Main(sctx, []string{"serve", "--dir", dir, "--listen", strings.TrimPrefix(url, "tls://")}, &stdout, r.stderr)
		}()
		var once sync.Once
		r.stop = func() {
			once.Do(func() {
				cancel()
				<-done
				if stdout.String() != "" {
					t.Errorf("serve wrote on standard output: %q", stdout.String())
				}
			})
		}
		t.Cleanup(r.stop)
		eventually(t, "serve up", func() bool { return strings.Contains(r.stderr.String(), "msg=serving") })
		return r
	}
	nextLine := func(r *running) string {
		t.Helper()
		eventually(t, "serve says what comes next", func() bool { return strings.Contains(r.stderr.String(), "next: ") })
		return r.stderr.String()
	}

	r := start()
	said := nextLine(r)
	if !strings.Contains(said, "next: mesh-control token issue --new --name NAME --dir "+dir) || !strings.Contains(said, "mesh-executor enrol") {
		t.Fatalf("serve on a mesh with no node:\n%s", said)
	}
	text, _, code := run(t, ctx, "token", "issue", "--new", "--name", "n1", "--dir", dir)
	if code != 0 {
		t.Fatal("token issue")
	}
	r.stop()
	// Issued, not used: serve points at it.
	id, _ := control.TokenID(strings.TrimSpace(text))
	r = start()
	if said = nextLine(r); !strings.Contains(said, "next: mesh-executor enrol") || !strings.Contains(said, id) {
		t.Fatalf("serve with a token issued and not used:\n%s", said)
	}
	if _, errs, code := run(t, ctx, "node", "add", "n2", "--dir", dir, "--out", filepath.Join(t.TempDir(), "n2", "agent.json")); code != 0 {
		t.Fatalf("node add: %s", errs)
	}
	r.stop()
	// With a node: nothing of a next step.
	r = start()
	time.Sleep(2 * time.Second)
	if said = r.stderr.String(); strings.Contains(said, "next:") {
		t.Fatalf("serve on a mesh with a node:\n%s", said)
	}
	r.stop()
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// broker-config --resolver, moving a key directory to operator mode, names
// the nodes enrolled before it (their grant's credential is of the form
// such a broker refuses), and says how to enrol them again; once moved, it
// says nothing more.
func TestMovingToOperatorModeNamesTheNodesToEnrolAgain(t *testing.T) {
	s, _, _, cmd := servedCLI(t)
	enrolNode(t, s, "web1")
	enrolNode(t, s, "web2")
	// The embedded broker still runs on the store: the nodes are named,
	// and the store is not carried over under it.
	_, errs, code := cmd("broker-config", "--resolver", "--listen", "127.0.0.1:4222")
	if code == 0 || !strings.Contains(errs, "2 node(s) enrolled before") || !strings.Contains(errs, "web1, web2") ||
		!strings.Contains(errs, "token issue --node NAME") || !strings.Contains(errs, "stop it first") {
		t.Fatalf("broker-config --resolver over enrolled nodes, serve running: exit %d\n%s", code, errs)
	}
	if _, errs, _ := cmd("broker-config", "--resolver", "--listen", "127.0.0.1:4222"); strings.Contains(errs, "enrolled before") || !strings.Contains(errs, "stop it first") {
		t.Fatalf("said again once the key directory is in operator mode:\n%s", errs)
	}
}

// A token issued for a node supersedes the ones issued for it before and
// not used: issued twice, the first one (mailed, forgotten) enrols no one.
// A token for another node, and one for no name, stay.
func TestATokenForANodeSupersedesTheEarlierOnes(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)
	enrolNode(t, s, "beta")
	var said string // the last issue's standard error
	id := func(args ...string) string {
		t.Helper()
		out, errs, code := cmd(append([]string{"token", "issue"}, args...)...)
		if code != 0 {
			t.Fatalf("token issue %v: exit %d %s", args, code, errs)
		}
		i, err := control.TokenID(strings.TrimSpace(out))
		if err != nil {
			t.Fatal(err)
		}
		said = errs
		return i
	}
	first, other, anon := id("--node", "beta"), id("--new", "--name", "gamma"), id("--new")
	if strings.Contains(said, "replaces") {
		t.Fatalf("a token that replaces none says it does: %s", said)
	}
	second := id("--node", "beta")
	// The command says which it revoked: the person who carries the first
	// learns why it is refused.
	if !strings.Contains(said, "It replaces 1 earlier token(s) for beta, unused and revoked now: "+first+".") {
		t.Fatalf("the second token for beta does not say it revoked the first (%s):\n%s", first, said)
	}
	// And --json, as a list (empty when none).
	var js struct {
		ID         string   `json:"id"`
		Superseded []string `json:"superseded"`
	}
	out, errs, code := cmd("token", "issue", "--node", "beta", "--json")
	if err := json.Unmarshal([]byte(out), &js); err != nil || code != 0 || len(js.Superseded) != 1 || js.Superseded[0] != second {
		t.Fatalf("token issue --json: exit %d %v %s %s", code, err, out, errs)
	}
	second = js.ID
	ts := tokenList(t, ctx, dir, s.url)
	if ts[first].State != control.TokenRevoked || ts[second].State != control.TokenUsable || ts[other].State != control.TokenUsable || ts[anon].State != control.TokenUsable {
		t.Fatalf("after a second token for beta: first %s, second %s, gamma's %s, no name's %s", ts[first].State, ts[second].State, ts[other].State, ts[anon].State)
	}
	third := id("--new", "--name", "gamma")
	if ts = tokenList(t, ctx, dir, s.url); ts[other].State != control.TokenRevoked || ts[third].State != control.TokenUsable || ts[second].State != control.TokenUsable {
		t.Fatalf("after a second token for gamma: %s %s %s", ts[other].State, ts[third].State, ts[second].State)
	}
	// Issued at once, for one node: one of them stands, not none, not two.
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := s.client.IssueToken(ctx, "delta", true, time.Hour, s.url); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	usable := 0
	for _, v := range tokenList(t, ctx, dir, s.url) {
		if v.Node == "delta" && v.State == control.TokenUsable {
			usable++
		}
	}
	if usable != 1 {
		t.Fatalf("six tokens for delta issued at once: %d usable", usable)
	}
}

// token issue takes one kind of token: neither kind and both are refused
// as the command line's (exit 2), each saying what it lacks.
func TestTokenIssueTakesOneKind(t *testing.T) {
	_, _, _, cmd := servedCLI(t)
	for args, say := range map[string]string{
		"":                       "say which: --new",
		"--new --node beta":      "--new and --node are two kinds of token: give one",
		"--node beta --name foo": "--name goes with --new",
	} {
		out, errs, code := cmd(append([]string{"token", "issue"}, strings.Fields(args)...)...)
		if code != 2 || out != "" || !strings.Contains(errs, say) {
			t.Errorf("token issue %s: exit %d\n%s%s", args, code, out, errs)
		}
	}
}
