package serve

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The agent's stand-in uid for the tests that need a real second uid.
const nobody = 65534

// env is a real executor daemon on a real unix socket, with a pinned key
// the test holds, applying to a scratch tree.
type env struct {
	t      *testing.T
	base   string
	state  string
	root   string
	sock   string
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	srv    *Server
	cancel context.CancelFunc
	done   chan error
}

func newEnv(t *testing.T, agentUID int, enrolled bool) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the executor's tests run as root, like the executor")
	}
	base, err := os.MkdirTemp("", "serve-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o755) // the unprivileged child must reach its files
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &env{t: t, base: base, state: filepath.Join(base, "state"), root: filepath.Join(base, "tree"), sock: filepath.Join(base, "run", "executor.sock")}
	os.Mkdir(e.root, 0o755)
	if _, err := store.Open(e.state); err != nil {
		t.Fatal(err)
	}
	e.pub, e.priv, _ = ed25519.GenerateKey(rand.Reader)
	if enrolled {
		if err := identity.Save(e.state, &identity.Identity{Node: "n1", Enrolment: "e-1", ControlKey: e.pub}); err != nil {
			t.Fatal(err)
		}
	}
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: agentUID})
	return e
}

func (e *env) start(cfg Config) {
	ln, err := wire.ListenUnix(e.sock, nobody)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.srv, e.cancel, e.done = New(cfg), cancel, make(chan error, 1)
	go func() { e.done <- e.srv.Run(ctx, ln) }()
	e.t.Cleanup(e.stop)
}

func (e *env) stop() {
	if e.cancel != nil {
		e.cancel()
		<-e.done
		e.cancel = nil
	}
}

// decl is a declaration addressed to this node with seq and resources
// written with {root}.
// plan asks the executor on c for a plan of decl (a declaration for n1,
// enrolment e-1), signed for its purpose and good a minute.
func (e *env) plan(t *testing.T, c *wire.Conn, decl []byte) *wire.PlanReply {
	t.Helper()
	body, _ := json.Marshal(wire.PlanRequest{Node: "n1", Enrolment: "e-1", ID: "p1", NotAfter: time.Now().Add(time.Minute), Declaration: decl})
	env, err := wire.Seal(e.priv, wire.PurposePlan, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(wire.KindPlan, &wire.Plan{Envelope: env}); err != nil {
		t.Fatal(err)
	}
	k, reply, err := c.Read()
	if err != nil || k != wire.KindPlanReply {
		t.Fatalf("plan of %s: %v %+v %v", decl, k, reply, err)
	}
	return reply.(*wire.PlanReply)
}

func (e *env) decl(node, enrolment string, seq int, resources ...string) []byte {
	return []byte(strings.ReplaceAll(fmt.Sprintf(`{"version":1,"node":%q,"enrolment":%q,"seq":%d,"resources":[%s]}`,
		node, enrolment, seq, strings.Join(resources, ",")), "{root}", e.root))
}

func (e *env) seal(payload []byte) []byte {
	b, err := wire.Seal(e.priv, wire.PurposeDeclaration, payload)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func file(id, content string) string {
	return fmt.Sprintf(`{"module":"m","id":%q,"type":"file","path":"{root}/%s","content":%q}`, id, id, content)
}

// dial connects as root (allowed) and says hello.
func (e *env) dial() *wire.Conn {
	e.t.Helper()
	c, err := wire.DialUnix(e.sock, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	if err := c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"}); err != nil {
		e.t.Fatal(err)
	}
	k, body, err := c.Read()
	if err != nil || k != wire.KindHelloReply {
		e.t.Fatalf("hello: %v %v %v", k, body, err)
	}
	return c
}

// afterStart waits for the start reconcile's end: it holds the apply lock
// from before the first connection is answered, and a lastApplied is
// answered under that lock.
func (e *env) afterStart() {
	e.t.Helper()
	c := e.dial()
	defer c.Close()
	send(e.t, c, wire.KindLastApplied, &wire.LastApplied{After: math.MaxUint64})
}

// send sends a request and collects the streamed lines and the verdict.
func send(t *testing.T, c *wire.Conn, k wire.Kind, body any) ([]shapes.Line, *wire.Verdict) {
	t.Helper()
	if err := c.Write(k, body); err != nil {
		t.Fatal(err)
	}
	var lines []shapes.Line
	for {
		k, body, err := c.Read()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		switch k {
		case wire.KindReportLine:
			lines = append(lines, *body.(*shapes.Line))
		case wire.KindVerdict:
			return lines, body.(*wire.Verdict)
		default:
			t.Fatalf("unexpected %s %+v", k, body)
		}
	}
}

func (e *env) push(c *wire.Conn, envelope []byte) ([]shapes.Line, *wire.Verdict) {
	return send(e.t, c, wire.KindDeclaration, &wire.Declaration{Envelope: envelope})
}

// snapshot is everything under the tree and the store's entries: what a
// refusal must leave exactly as it was.
func (e *env) snapshot() string {
	var out []string
	filepath.Walk(e.root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			b, _ := os.ReadFile(p)
			out = append(out, fmt.Sprintf("%s %v %s", p, fi.Mode(), b))
		}
		return nil
	})
	sort.Strings(out)
	st, _ := store.Open(e.state)
	for _, en := range st.Entries() {
		out = append(out, "entry "+en.Target)
	}
	return strings.Join(out, "\n")
}

func TestPushedDeclarationIsVerifiedAppliedAndStreamed(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	env1 := e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))
	lines, v := e.push(c, env1)
	if v.Outcome != shapes.Applied || v.Seq != 1 || len(lines) != 1 || lines[0].Outcome != shapes.Applied {
		t.Fatalf("verdict %+v lines %+v", v, lines)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "motd")); string(b) != "hello\n" {
		t.Fatal("not applied")
	}
	// Re-delivery of the same bytes: a no-op that says so, with the lines
	// of the apply it repeats (a report sent again never loses them).
	os.WriteFile(filepath.Join(e.root, "motd"), []byte("drift"), 0o644)
	lines, v = e.push(c, env1)
	if !v.Duplicate || len(lines) != 1 || lines[0].Outcome != shapes.Applied || v.Outcome != shapes.Applied {
		t.Fatalf("re-delivery: %+v %+v", v, lines)
	}
	// With what the store owns, as the first answer had: the control side
	// keeps the newest report's copy to hand back to a node that lost its
	// store, and a report sent again is the newest.
	if len(v.Owned) == 0 {
		t.Fatalf("re-delivery: no copy of what the store owns: %+v", v)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "motd")); string(b) != "drift" {
		t.Fatal("a re-delivery applied again")
	}
	// Status for the heartbeat.
	if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
		t.Fatal(err)
	}
	k, body, err := c.Read()
	if err != nil || k != wire.KindStatusReply {
		t.Fatal(k, err)
	}
	if s := body.(*wire.StatusReply); s.Seq != 1 || s.Node != "n1" || s.State != "enrolled" || s.Build != "b1" {
		t.Fatalf("status %+v", s)
	}
	// The next sequence is applied, and removes what the link no longer declares.
	_, v = e.push(c, e.seal(e.decl("n1", "e-1", 2, file("other", "x"))))
	if v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	if _, err := os.Stat(filepath.Join(e.root, "motd")); !os.IsNotExist(err) {
		t.Fatal("undeclared file kept")
	}
}

// Each refusal says which check refused, and changes nothing: not the
// machine, not the store, not the sequence floor.
func TestRefusalsChangeNothing(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 5, file("motd", "five")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	forged, _ := wire.Seal(otherKey, wire.PurposeDeclaration, e.decl("n1", "e-1", 6, file("motd", "forged")))
	grant, _ := wire.Seal(e.priv, wire.PurposeGrant, e.decl("n1", "e-1", 6, file("motd", "grant")))
	good6 := e.seal(e.decl("n1", "e-1", 6, file("motd", "six")))
	tampered := []byte(strings.Replace(string(good6), "six", "sux", 1))
	cases := []struct {
		name string
		env  []byte
		code wire.Code
		want string
	}{
		{"signed by another key", forged, wire.CodeWrongKey, "signed by a key other than the pinned control-plane key"},
		{"tampered after signing", tampered, wire.CodeSignature, "does not verify"},
		{"a grant passed off as a declaration", grant, wire.CodePurpose, "signed for another purpose"},
		{"another node", e.seal(e.decl("n2", "e-1", 6, file("motd", "x"))), wire.CodeAddress, `addressed to node "n2"`},
		{"another enrolment", e.seal(e.decl("n1", "e-0", 6, file("motd", "x"))), wire.CodeAddress, `enrolment "e-0"`},
		{"an older sequence", e.seal(e.decl("n1", "e-1", 4, file("motd", "four"))), wire.CodeReplay, "sequence 4 is not newer than the last applied, 5"},
		{"the same sequence, other bytes", e.seal(e.decl("n1", "e-1", 5, file("motd", "FIVE"))), wire.CodeConflict, "sequence 5 was applied already with other bytes"},
		{"an action over the link", e.seal(e.decl("n1", "e-1", 6, `{"module":"m","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/false"]}`)), wire.CodeAction, "an action may only come from a local file"},
		{"an invalid declaration", e.seal(e.decl("n1", "e-1", 6, `{"module":"m","id":"f","type":"file","path":"{root}/x","content":"x","colour":1}`)), wire.CodeInvalid, "field colour: unknown field"},
		{"the protected set", e.seal(e.decl("n1", "e-1", 6, `{"module":"m","id":"f","type":"file","path":"/var/lib/mesh-host/executor/identity.json","content":"{}"}`)), wire.CodeInvalid, "protected set"},
		{"garbage", []byte("not an envelope"), wire.CodeMalformed, "not a well-formed signed envelope"},
	}
	before := e.snapshot()
	// And what status says was applied last: a refusal applied nothing.
	summary := func() string {
		st, _ := store.Open(e.state)
		b, _ := st.Report(store.Link)
		return string(b)
	}
	sum := summary()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lines, v := e.push(c, tc.env)
			if v.Outcome != shapes.Refused || v.Code != tc.code || !strings.Contains(v.Reason, tc.want) || len(lines) != 0 {
				t.Fatalf("verdict %+v (code %s), want %s containing %q", v, v.Code, tc.code, tc.want)
			}
			if !strings.HasPrefix(v.Reason, "executor: ") {
				t.Errorf("a refusal must say which side refused: %q", v.Reason)
			}
			if after := e.snapshot(); after != before {
				t.Fatalf("a refusal changed something:\n%s\n---\n%s", before, after)
			}
			if now := summary(); now != sum {
				t.Fatalf("a refusal changed the summary status reads: %s, was %s", now, sum)
			}
		})
	}
	// The floor did not move: 6 is still next.
	if _, v := e.push(c, good6); v.Outcome != shapes.Applied {
		t.Fatalf("the genuine next declaration: %+v", v)
	}
}

func TestHostedTakesNothingFromTheLink(t *testing.T) {
	e := newEnv(t, nobody, false)
	c := e.dial()
	_, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "x"))))
	if v.Code != wire.CodeNotEnrolled || !strings.Contains(v.Reason, "no identity (hosted)") {
		t.Fatalf("%+v", v)
	}
}

// readError reads what the executor says before it closes: an Error frame,
// then the end of the stream.
func readError(t *testing.T, c net.Conn, conn *wire.Conn) *wire.Error {
	t.Helper()
	k, body, err := conn.Read()
	if err != nil || k != wire.KindError {
		t.Fatalf("expected an error frame, got %v %+v %v", k, body, err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the executor did not close the connection: %v", err)
	}
	return body.(*wire.Error)
}

func frame(k wire.Kind, body []byte) []byte {
	f := make([]byte, 6, 6+len(body))
	binary.BigEndian.PutUint16(f, uint16(k))
	binary.BigEndian.PutUint32(f[2:], uint32(len(body)))
	return append(f, body...)
}

func hello() []byte {
	b, _ := wire.Encode(&wire.Hello{Protocol: wire.ProtocolVersion})
	return frame(wire.KindHello, b)
}

func TestProtocolViolationsCloseTheConnection(t *testing.T) {
	e := newEnv(t, nobody, true)
	empty, _ := wire.Encode(&wire.Status{})
	decl, _ := wire.Encode(&wire.Declaration{Envelope: e.seal(e.decl("n1", "e-1", 1, file("motd", "x")))})
	huge := make([]byte, 6)
	binary.BigEndian.PutUint16(huge, uint16(wire.KindDeclaration))
	binary.BigEndian.PutUint32(huge[2:], 0xfffffff0)
	oldHello, _ := wire.Encode(&wire.Hello{Protocol: 99})
	cases := []struct {
		name   string
		frames [][]byte
		code   wire.Code
		want   string
	}{
		{"a declaration before hello", [][]byte{frame(wire.KindDeclaration, decl)}, wire.CodeProtocol, "declaration is not allowed now"},
		{"a second hello", [][]byte{hello(), hello()}, wire.CodeProtocol, "hello is not allowed now"},
		{"an unknown kind", [][]byte{hello(), frame(100, empty)}, wire.CodeProtocol, "unknown message kind 100"},
		{"a reply sent by the agent", [][]byte{hello(), frame(wire.KindVerdict, empty)}, wire.CodeProtocol, "verdict may not be sent in this direction"},
		{"a frame over the limit", [][]byte{hello(), huge}, wire.CodeTooLarge, "over its limit"},
		{"a garbage frame", [][]byte{hello(), frame(wire.KindStatus, []byte{0xff, 0xfe})}, wire.CodeMalformed, "status body"},
		{"another protocol", [][]byte{frame(wire.KindHello, oldHello)}, wire.CodeProtocol, "protocol 99"},
	}
	before := e.snapshot()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", e.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, f := range tc.frames {
				c.Write(f)
			}
			conn := wire.NewConn(c, wire.ExecutorToAgent)
			if tc.frames[0][1] == byte(wire.KindHello) && len(tc.frames) > 1 {
				// The first hello is answered; skip its reply.
				k, _, err := conn.Read()
				if err != nil || k != wire.KindHelloReply {
					t.Fatalf("hello: %v %v", k, err)
				}
			}
			werr := readError(t, c, conn)
			if werr.Code != tc.code || !strings.Contains(werr.Message, tc.want) {
				t.Fatalf("error %+v, want %s containing %q", werr, tc.code, tc.want)
			}
		})
	}
	if e.snapshot() != before {
		t.Fatal("a protocol violation changed something")
	}
}

func TestRequestRateIsBounded(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, Rate: 1, Burst: 3})
	c := e.dial()
	var werr error
	for i := 0; i < 10 && werr == nil; i++ {
		if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
			break
		}
		k, body, err := c.Read()
		if err != nil {
			werr = err
		} else if k == wire.KindError {
			werr = body.(*wire.Error)
		}
	}
	if !errors.Is(werr, wire.ErrBusy) {
		t.Fatalf("a flood of requests was not bounded: %v", werr)
	}
	// Refused, the peer dials again: its bucket is as it left it, not
	// full, and the new connection's hello in the same second is refused
	// too.
	c, err := wire.DialUnix(e.sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"}); err != nil {
		t.Fatal(err)
	}
	if k, body, err := c.Read(); err != nil || k != wire.KindError || !errors.Is(body.(*wire.Error), wire.ErrBusy) {
		t.Fatalf("a flood of requests over new connections was not bounded: %v %v %v", k, body, err)
	}
}

// The start, reconnect and drift triggers reconcile what each source last
// declared; pushed is tested above.
func TestReconcileTriggers(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	motd := filepath.Join(e.root, "motd")

	// reconnect: the agent says the link came back.
	os.WriteFile(motd, []byte("drift\n"), 0o644)
	lines, v := send(t, c, wire.KindReconnected, &wire.Reconnected{})
	if v.Outcome != shapes.Repaired || len(lines) != 1 || lines[0].Outcome != shapes.Repaired {
		t.Fatalf("reconnect: %+v %+v", v, lines)
	}

	// start: a new daemon reconciles as it starts, and says in its log
	// what it put back (no report goes upward for it).
	e.stop()
	os.WriteFile(motd, []byte("drift again\n"), 0o644)
	var log lockedBuffer
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, Log: slog.New(slog.NewTextHandler(&log, nil))})
	e.afterStart()
	if b, _ := os.ReadFile(motd); string(b) != "hello\n" {
		t.Fatalf("start did not reconcile: %q", b)
	}
	if said := log.String(); !strings.Contains(said, `msg="repaired: `) || !strings.Contains(said, "trigger=start seq=1 module=m id=motd type=file") {
		t.Fatalf("the start's repair is not in the log:\n%s", said)
	}

	// drift: the timer, with nothing said on the socket.
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, DriftEvery: 50 * time.Millisecond})
	os.WriteFile(motd, []byte("drift by timer\n"), 0o644)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, _ := os.ReadFile(motd); string(b) == "hello\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drift timer never repaired the file")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The table, the codec and the executor's handlers are the same set: every
// request kind has a handler, no handler serves a kind the table lacks, and
// every kind decodes.
func TestTableCodecHandlersAreOneSet(t *testing.T) {
	requests := map[wire.Kind]bool{}
	for _, s := range wire.Table {
		if s.Dir == wire.AgentToExecutor {
			requests[s.Kind] = true
			if len(s.States) == 0 {
				t.Errorf("%s is a request allowed in no state", s.Kind)
			}
		} else if len(s.States) != 0 {
			t.Errorf("%s is a reply with states", s.Kind)
		}
		if _, err := wire.Encode(s.Body()); err != nil {
			t.Errorf("%s does not encode: %v", s.Kind, err)
		}
	}
	handled := map[wire.Kind]bool{}
	for _, k := range Handled() {
		handled[k] = true
		if !requests[k] {
			t.Errorf("a handler serves %s, which is no request of the table", k)
		}
	}
	for k := range requests {
		if !handled[k] {
			t.Errorf("request %s has no handler", k)
		}
	}
}

// --- The agent's uid, for real: a child process as uid 65534. ---

// TestMain runs the child's part when asked to.
func TestMain(m *testing.M) {
	if mode := os.Getenv("SERVE_TEST_CHILD"); mode != "" {
		os.Exit(child(mode, os.Getenv("SERVE_TEST_SOCK"), os.Getenv("SERVE_TEST_DIR")))
	}
	os.Exit(m.Run())
}

// observation is what the child saw for one attempt.
type observation struct {
	Attempt string `json:"attempt"`
	Reply   string `json:"reply"`
	Code    string `json:"code,omitempty"`
	Outcome string `json:"outcome,omitempty"`
}

// child is a compromised agent: it speaks the protocol by hand and tries
// every message in every state, and every envelope in dir.
func child(mode, sock, dir string) int {
	if mode == "status-loop" {
		return statusLoop(sock)
	}
	var obs []observation
	try := func(name string, frames ...[]byte) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			obs = append(obs, observation{Attempt: name, Reply: "dial: " + err.Error()})
			return
		}
		defer c.Close()
		conn := wire.NewConn(c, wire.ExecutorToAgent)
		var o observation
		o.Attempt = name
		for _, f := range frames {
			c.Write(f)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			k, body, err := conn.Read()
			if err != nil {
				if o.Reply == "" {
					o.Reply = "closed"
				}
				break
			}
			if k == wire.KindHelloReply && len(frames) > 1 {
				continue
			}
			o.Reply = k.String()
			if k == wire.KindError {
				o.Code = body.(*wire.Error).Code.String()
				break
			}
			if k == wire.KindVerdict {
				o.Outcome, o.Code = string(body.(*wire.Verdict).Outcome), body.(*wire.Verdict).Code.String()
				break
			}
			if k == wire.KindPlanReply {
				o.Outcome, o.Code = string(body.(*wire.PlanReply).Outcome), body.(*wire.PlanReply).Code.String()
				break
			}
			if k == wire.KindArchiveAck {
				o.Outcome = map[bool]string{true: "stored", false: "not-stored"}[body.(*wire.ArchiveAck).Stored]
				break
			}
			if k != wire.KindReportLine {
				break
			}
		}
		obs = append(obs, o)
	}
	switch mode {
	case "hello":
		try("hello", hello())
	case "large-bad-envelopes":
		// Three envelopes of the largest size, signed by another key
		// than the pinned one, sent at once on three connections.
		_, forger, _ := ed25519.GenerateKey(rand.Reader)
		payload := []byte(fmt.Sprintf(`{"version":1,"node":"n1","enrolment":"e-1","seq":99,"resources":[{"module":"m","id":"big","type":"file","path":"/tmp/never","content":%q}]}`, strings.Repeat("x", wire.MaxEnvelope-8<<10)))
		bad, _ := wire.Seal(forger, wire.PurposeDeclaration, payload)
		body, _ := wire.Encode(&wire.Declaration{Envelope: bad})
		big := frame(wire.KindDeclaration, body)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				saw := observation{Attempt: fmt.Sprintf("large-%d", i)}
				c, err := net.Dial("unix", sock)
				if err == nil {
					c.SetDeadline(time.Now().Add(2 * time.Minute))
					c.Write(hello())
					conn := wire.NewConn(c, wire.ExecutorToAgent)
					if k, _, rerr := conn.Read(); rerr != nil || k != wire.KindHelloReply {
						err = fmt.Errorf("hello: %v %v", k, rerr)
					} else if _, err = c.Write(big); err == nil {
						k, body, rerr := conn.Read()
						err = rerr
						if v, ok := body.(*wire.Verdict); ok {
							saw.Reply, saw.Outcome, saw.Code = k.String(), string(v.Outcome), v.Code.String()
						}
					}
					c.Close()
				}
				if err != nil {
					saw.Reply = err.Error()
				}
				mu.Lock()
				obs = append(obs, saw)
				mu.Unlock()
			}()
		}
		wg.Wait()
	case "attack":
		for _, s := range wire.Table {
			body, _ := wire.Encode(s.Body())
			try("new/"+s.Name, frame(s.Kind, body))
			try("ready/"+s.Name, hello(), frame(s.Kind, body))
		}
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			if !strings.HasSuffix(ent.Name(), ".env") {
				continue
			}
			envelope, _ := os.ReadFile(filepath.Join(dir, ent.Name()))
			body, _ := wire.Encode(&wire.Declaration{Envelope: envelope})
			try("envelope/"+strings.TrimSuffix(ent.Name(), ".env"), hello(), frame(wire.KindDeclaration, body))
		}
		// Archive streams: bytes that are not what their digest says, a
		// chunk out of order, a second stream overtaking the first, a
		// request overtaking a stream.
		sum := strings.Repeat("ab", 32)
		chunk := func(sum string, off uint64, b string, last bool) []byte {
			body, _ := wire.Encode(&wire.Archive{SHA256: sum, Offset: off, Chunk: []byte(b), Last: last})
			return frame(wire.KindArchive, body)
		}
		status, _ := wire.Encode(&wire.Status{})
		try("stream/wrong-digest", hello(), chunk(sum, 0, "not ", false), chunk(sum, 4, "these bytes", true))
		// Each attempt streams a digest of its own: one stream per digest
		// is allowed across connections, and the executor releases an
		// attempt's only once it has seen that connection close.
		d := func(i int) string { return strings.Repeat(fmt.Sprintf("a%d", i), 32) }
		try("stream/out-of-order", hello(), chunk(d(1), 0, "abc", false), chunk(d(1), 7, "def", true))
		try("stream/not-at-zero", hello(), chunk(d(2), 5, "abc", true))
		try("stream/two-at-once", hello(), chunk(d(3), 0, "abc", false), chunk(strings.Repeat("cd", 32), 0, "def", true))
		try("stream/overtaken", hello(), chunk(d(4), 0, "abc", false), frame(wire.KindStatus, status))
		try("stream/bad-digest", hello(), chunk("../../../../etc/passwd", 0, "x", true))
	}
	json.NewEncoder(os.Stdout).Encode(obs)
	return 0
}

// runChild runs the test binary as uid/gid 65534 in mode.
func (e *env) runChild(mode string) []observation {
	e.t.Helper()
	return e.startChild(mode)()
}

// startChild starts the test binary as uid/gid 65534 in mode; the function
// it returns waits for the child and returns what it observed.
func (e *env) startChild(mode string) func() []observation {
	e.t.Helper()
	bin := filepath.Join(e.base, "serve.test")
	if _, err := os.Stat(bin); err != nil {
		self, _ := os.ReadFile(os.Args[0])
		if err := os.WriteFile(bin, self, 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	var cmd *exec.Cmd
	var out bytes.Buffer
	// A fork elsewhere in this process (the daemon under test starts
	// programs) may hold the copy's write descriptor for a moment: exec
	// then says "text file busy", and is tried again (golang/go#22315).
	for attempt := 0; ; attempt++ {
		cmd = exec.Command(bin, "-test.run=^$")
		cmd.Env = []string{"SERVE_TEST_CHILD=" + mode, "SERVE_TEST_SOCK=" + e.sock, "SERVE_TEST_DIR=" + e.base}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out.Reset()
		cmd.Stdout = &out
		err := cmd.Start()
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ETXTBSY) || attempt >= 20 {
			e.t.Fatalf("child: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return func() []observation {
		e.t.Helper()
		if err := cmd.Wait(); err != nil {
			e.t.Fatalf("child: %v", err)
		}
		var obs []observation
		if err := json.Unmarshal(out.Bytes(), &obs); err != nil {
			e.t.Fatalf("child said %q: %v", out.Bytes(), err)
		}
		return obs
	}
}

func TestOnlyRootAndTheAgentMayConnect(t *testing.T) {
	e := newEnv(t, 12345, true) // the agent is uid 12345; the child is 65534
	obs := e.runChild("hello")
	if len(obs) != 1 || obs[0].Reply != "error" || obs[0].Code != "protocol" {
		t.Fatalf("a uid that is neither root nor the agent's was served: %+v", obs)
	}
	e2 := newEnv(t, nobody, true)
	if obs := e2.runChild("hello"); obs[0].Reply != "hello-reply" {
		t.Fatalf("the agent's uid was refused: %+v", obs)
	}
}

// A compromised agent, as the agent's own uid, tries every message in
// every state and every bad envelope; nothing it sends changes the
// machine, and only the genuine requests are answered.
func TestCompromisedAgentFailsEveryTime(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 5, file("motd", "five")))); v.Outcome != shapes.Applied {
		t.Fatal(v)
	}
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	forged, _ := wire.Seal(otherKey, wire.PurposeDeclaration, e.decl("n1", "e-1", 9, file("motd", "pwned")))
	grant, _ := wire.Seal(e.priv, wire.PurposeGrant, e.decl("n1", "e-1", 9, file("motd", "pwned")))
	old := e.seal(e.decl("n1", "e-1", 4, file("motd", "pwned")))
	other := e.seal(e.decl("n2", "e-1", 9, file("motd", "pwned")))
	action := e.seal(e.decl("n1", "e-1", 9, `{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo pwned > {root}/motd"],"verify":["/bin/false"]}`))
	conflict := e.seal(e.decl("n1", "e-1", 5, file("motd", "pwned")))
	for name, b := range map[string][]byte{"forged": forged, "grant": grant, "old": old, "other-node": other, "action": action, "conflict": conflict} {
		os.WriteFile(filepath.Join(e.base, name+".env"), b, 0o644)
	}
	before := e.snapshot()
	got := map[string]observation{}
	for _, o := range e.runChild("attack") {
		got[o.Attempt] = o
	}
	want := map[string]string{
		// An empty hello says protocol 0, which is refused too.
		"new/hello": "error protocol", "ready/hello": "error protocol",
		"ready/declaration": "verdict refused malformed", "ready/reconnected": "verdict unchanged none",
		"ready/status": "status-reply", "ready/roster": "verdict refused malformed",
		// No enrolment is pending: an empty offer, and a grant (or a
		// refusal) handed over is answered and changes nothing.
		"ready/enrol": "enrol-offer", "ready/grant": "grant-reply", "ready/profile": "profile-reply",
		// An empty plan request is no envelope: answered, refused.
		"ready/plan": "plan-reply refused malformed",
		// No rotation carried: answered with the key in force.
		"ready/key-rotation": "key-rotation-reply",
		// No rekey is pending: an answer handed over is refused.
		"ready/rekey": "rekey-reply",
		// What the executor did on its own: read, and nothing changed.
		"ready/activity": "activity-reply",
		// The last apply said again (asked past 0): what its report
		// carried already, read, and nothing changed.
		"ready/last-applied": "verdict applied none",
		"envelope/forged":    "verdict refused wrong-key", "envelope/grant": "verdict refused wrong-purpose",
		"envelope/old": "verdict refused replay", "envelope/other-node": "verdict refused address",
		"envelope/action": "verdict refused action", "envelope/conflict": "verdict refused conflict",
		// An empty archive chunk names no digest.
		"ready/archive":       "error malformed",
		"stream/wrong-digest": "archive-ack not-stored", "stream/out-of-order": "error protocol",
		"stream/not-at-zero": "error protocol", "stream/two-at-once": "error protocol",
		"stream/overtaken": "error protocol", "stream/bad-digest": "error malformed",
	}
	for _, s := range wire.Table {
		for _, st := range []string{"new/", "ready/"} {
			if _, ok := want[st+s.Name]; !ok {
				want[st+s.Name] = "error protocol"
			}
		}
	}
	for attempt, w := range want {
		o := got[attempt]
		have := strings.TrimSpace(strings.Join([]string{o.Reply, o.Outcome, o.Code}, " "))
		have = strings.ReplaceAll(have, "  ", " ")
		if have != w {
			t.Errorf("%s: got %q, want %q", attempt, have, w)
		}
	}
	if e.snapshot() != before {
		t.Fatal("the compromised agent changed the machine or the store")
	}
	if left := e.cache(); len(left) != 0 {
		t.Fatalf("the compromised agent left something in the archive cache: %v", left)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "motd")); string(b) != "five" {
		t.Fatalf("motd = %q", b)
	}
}

// An agent that stops reading cannot hold the apply, nor with it the lock
// a rescue command needs.
func TestAStalledAgentDoesNotHoldTheLock(t *testing.T) {
	e := newEnv(t, nobody, true)
	var res []string
	for i := 0; i < 3000; i++ {
		res = append(res, file(fmt.Sprintf("f%04d", i), "x"))
	}
	c := e.dial()
	body := &wire.Declaration{Envelope: e.seal(e.decl("n1", "e-1", 1, res...))}
	if err := c.Write(wire.KindDeclaration, body); err != nil {
		t.Fatal(err)
	}
	// The agent never reads a line. A rescue apply must get the lock.
	st, err := store.Open(e.state)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := st.Lock(60 * time.Second); err != nil {
		t.Fatalf("the store is still locked by an apply whose agent stopped reading: %v", err)
	}
	st.Unlock()
}

// A declaration refused for a passing reason is not burned: delivered
// again, it is applied.
func TestAPassingRefusalBurnsNothing(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	env1 := e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))
	// The target cannot be saved: something sits where its temporary goes.
	obstacle := filepath.Join(e.state, "target-link.json.tmp")
	os.Mkdir(obstacle, 0o700)
	os.WriteFile(filepath.Join(obstacle, "x"), nil, 0o600)
	if _, v := e.push(c, env1); v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "cannot save the target") {
		t.Fatalf("%+v", v)
	}
	os.RemoveAll(obstacle)
	if _, v := e.push(c, env1); v.Outcome != shapes.Applied || v.Duplicate {
		t.Fatalf("delivered again after the obstacle went: %+v", v)
	}
}

// After a re-enrolment, the old enrolment's declaration is not reconciled.
func TestReconcileOnlyThisEnrolment(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "e1\n")))); v.Outcome != shapes.Applied {
		t.Fatal(v)
	}
	identity.Save(e.state, &identity.Identity{Node: "n1", Enrolment: "e-2", ControlKey: e.pub})
	os.Remove(filepath.Join(e.root, "motd"))
	if v := e.srv.Reconcile(context.Background(), "test", nil); v.Outcome != shapes.Unchanged {
		t.Fatalf("%+v", v)
	}
	if _, err := os.Stat(filepath.Join(e.root, "motd")); !os.IsNotExist(err) {
		t.Fatal("the old enrolment's declaration was applied again")
	}
}

// A signed retire empties the node and drops its identity: hosted again,
// it takes nothing more from the link. A local file cannot retire a node.
func TestRetire(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "x")))); v.Outcome != shapes.Applied {
		t.Fatal(v)
	}
	retire := []byte(`{"version":1,"node":"n1","enrolment":"e-1","seq":2,"resources":[],"owns_nothing":true,"retire":true}`)
	if _, v := e.push(c, e.seal(retire)); v.Outcome != shapes.Removed {
		t.Fatalf("%+v", v)
	}
	if id, _ := identity.Load(e.state); id != nil {
		t.Fatal("the identity survived a retire")
	}
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 3, file("motd", "y")))); v.Code != wire.CodeNotEnrolled {
		t.Fatalf("a retired node took a declaration: %+v", v)
	}
	// A kill after the apply, before the node's keys and identity were
	// dropped: the retirement handed over again, or the start's
	// reconcile, finishes it.
	cut := func() {
		identity.Save(e.state, &identity.Identity{Node: "n1", Enrolment: "e-1", ControlKey: e.pub})
		os.WriteFile(filepath.Join(e.state, enrol.KeysFile), []byte("{}"), 0o600)
	}
	finished := func(how string) {
		t.Helper()
		if id, _ := identity.Load(e.state); id != nil {
			t.Fatalf("%s: the identity survived", how)
		}
		if _, err := os.Stat(filepath.Join(e.state, enrol.KeysFile)); !os.IsNotExist(err) {
			t.Fatalf("%s: the node's keys survived: %v", how, err)
		}
	}
	env := e.seal(retire)
	cut()
	if _, v := e.push(c, env); !v.Duplicate || v.Outcome != shapes.Removed {
		t.Fatalf("the retirement handed over again: %+v", v)
	}
	finished("handed over again")
	cut()
	if v := e.srv.Reconcile(context.Background(), "start", nil); v.Outcome == shapes.Failed || v.Outcome == shapes.Refused {
		t.Fatalf("%+v", v)
	}
	finished("reconciled")
	// A kill before the apply's end (no lines kept of it): handed over,
	// it is passing until the reconcile has ended it; then said.
	cut()
	os.Remove(filepath.Join(e.state, LinesFile))
	if _, v := e.push(c, env); !v.Code.Passing() {
		t.Fatalf("a retirement cut before its end, handed over again: %+v", v)
	}
	if id, _ := identity.Load(e.state); id == nil {
		t.Fatal("a retirement cut before its end dropped the identity on being handed over")
	}
	e.srv.Reconcile(context.Background(), "start", nil)
	finished("cut before its end, then reconciled")
	// A retirement whose apply failed, and was said failed, is not
	// carried out unsaid by a reconcile that succeeds later.
	cut()
	sum := sha256.Sum256(env)
	if err := keepLines(e.state, 2, hex.EncodeToString(sum[:]), &shapes.Report{Outcome: shapes.Failed}); err != nil {
		t.Fatal(err)
	}
	e.srv.Reconcile(context.Background(), "drift", nil)
	if _, v := e.push(c, env); !v.Duplicate || v.Outcome != shapes.Failed {
		t.Fatalf("a failed retirement handed over again: %+v", v)
	}
	if id, _ := identity.Load(e.state); id == nil {
		t.Fatal("a retirement whose apply failed was carried out by a later reconcile")
	}
}

// --- Archives streamed into the cache. ---

// tgz is a gzipped tar of a directory "theme" holding one file.
func tgz(t *testing.T, content string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "theme/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "theme/index.theme", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))})
	tw.Write([]byte(content))
	tw.Close()
	gz.Close()
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}

// streamArchive sends b in chunks of size n under the digest sum, and reads
// the answer to the last.
func streamArchive(t *testing.T, c *wire.Conn, sum string, b []byte, n int) *wire.ArchiveAck {
	t.Helper()
	off := 0
	for {
		end := min(off+n, len(b))
		if err := c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Offset: uint64(off), Chunk: b[off:end], Last: end == len(b)}); err != nil {
			t.Fatal(err)
		}
		if end == len(b) {
			break
		}
		off = end
	}
	k, body, err := c.Read()
	if err != nil || k != wire.KindArchiveAck {
		t.Fatalf("the answer to the last chunk: %v %+v %v", k, body, err)
	}
	return body.(*wire.ArchiveAck)
}

// cache lists the executor's archive cache.
func (e *env) cache() []string {
	ents, _ := os.ReadDir(filepath.Join(e.state, "archives"))
	var out []string
	for _, x := range ents {
		out = append(out, x.Name())
	}
	return out
}

func archiveDecl(sum string) []string {
	return []string{
		`{"module":"ui","id":"themes","type":"directory","path":"{root}/themes"}`,
		fmt.Sprintf(`{"module":"ui","id":"theme","type":"archive","url":"obj://%s","sha256":%q,"destination":"{root}/themes"}`, sum, sum),
	}
}

// A stream is hashed as it is written, kept under its digest (0600, in the
// executor's own state), and a declaration naming it by obj:// unpacks it
// from there. An archive no declaration names any more leaves the cache.
func TestArchiveStreamedThenApplied(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	b, sum := tgz(t, "[Theme]\n")
	// Before it is streamed, the declaration's archive step fails, saying so.
	lines, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, archiveDecl(sum)...)))
	if v.Outcome != shapes.Failed || len(lines) != 2 || !strings.Contains(lines[1].Detail, "the agent has not streamed archive "+sum) {
		t.Fatalf("not streamed: %+v %+v", v, lines)
	}
	if ack := streamArchive(t, c, sum, b, 100); !ack.Stored || ack.SHA256 != sum {
		t.Fatalf("%+v", ack)
	}
	fi, err := os.Stat(filepath.Join(e.state, "archives", sum))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the cached archive: %v %v", fi, err)
	}
	if got := e.cache(); len(got) != 1 {
		t.Fatalf("the cache holds %v", got)
	}
	lines, v = e.push(c, e.seal(e.decl("n1", "e-1", 2, archiveDecl(sum)...)))
	if v.Outcome != shapes.Applied {
		t.Fatalf("%+v %+v", v, lines)
	}
	if got, _ := os.ReadFile(filepath.Join(e.root, "themes/theme/index.theme")); string(got) != "[Theme]\n" {
		t.Fatalf("unpacked: %q", got)
	}
	// Streamed again (the agent does so before each forward): the same.
	if ack := streamArchive(t, c, sum, b, wire.MaxArchiveChunk); !ack.Stored {
		t.Fatalf("%+v", ack)
	}
	// Undeclared: the files go, and so does the cached archive.
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 3, file("motd", "x")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	if got := e.cache(); len(got) != 0 {
		t.Fatalf("the cache kept what nothing declares: %v", got)
	}
}

// A stream whose bytes are not what its digest says is refused, and leaves
// nothing: not the archive, not its temporary. The connection goes on.
func TestArchiveWrongDigestLeavesNothing(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	b, _ := tgz(t, "genuine")
	_, other := tgz(t, "other")
	ack := streamArchive(t, c, other, b, 64)
	if ack.Stored || !strings.Contains(ack.Reason, "not "+other) || !strings.Contains(ack.Reason, "nothing kept") {
		t.Fatalf("%+v", ack)
	}
	if got := e.cache(); len(got) != 0 {
		t.Fatalf("the cache holds %v", got)
	}
	// Nor does a declaration naming that digest find anything.
	lines, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, archiveDecl(other)...)))
	if v.Outcome != shapes.Failed || !strings.Contains(lines[1].Detail, "has not streamed") {
		t.Fatalf("%+v %+v", v, lines)
	}
	if _, err := os.Stat(filepath.Join(e.root, "themes/theme")); !os.IsNotExist(err) {
		t.Fatal("something was unpacked")
	}
}

// Violations end the stream, leaving nothing, and close the connection:
// an offset out of order, a second digest, another request overtaking the
// stream, a stream cut off.
func TestArchiveStreamViolations(t *testing.T) {
	e := newEnv(t, nobody, true)
	b, sum := tgz(t, "x")
	cases := []struct {
		name string
		next any
		kind wire.Kind
		code wire.Code
		want string
	}{
		{"out of order", &wire.Archive{SHA256: sum, Offset: 50, Chunk: b[10:]}, wire.KindArchive, wire.CodeProtocol, "chunks come in order"},
		{"again from zero", &wire.Archive{SHA256: sum, Offset: 0, Chunk: b}, wire.KindArchive, wire.CodeProtocol, "chunks come in order"},
		{"another digest", &wire.Archive{SHA256: strings.Repeat("0", 64), Chunk: b}, wire.KindArchive, wire.CodeProtocol, "one stream at a time"},
		{"a declaration overtaking it", &wire.Declaration{Envelope: e.seal(e.decl("n1", "e-1", 1, archiveDecl(sum)...))}, wire.KindDeclaration, wire.CodeProtocol, "only its next chunk may come"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := e.dial()
			if err := c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Chunk: b[:10]}); err != nil {
				t.Fatal(err)
			}
			if err := c.Write(tc.kind, tc.next); err != nil {
				t.Fatal(err)
			}
			werr := readError(t, c.NetConn(), c)
			if werr.Code != tc.code || !strings.Contains(werr.Message, tc.want) {
				t.Fatalf("%+v, want %s containing %q", werr, tc.code, tc.want)
			}
			waitEmpty(t, e)
		})
	}
	t.Run("cut off", func(t *testing.T) {
		c := e.dial()
		if err := c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Chunk: b[:10]}); err != nil {
			t.Fatal(err)
		}
		// Once the daemon holds that stream (a chunk but the last is
		// answered by nothing: its handler is watched instead, or, on a
		// busy machine, the second connection came first), the same
		// digest on another connection waits its turn.
		for deadline := time.Now().Add(5 * time.Second); ; {
			e.srv.streamMu.Lock()
			held := len(e.srv.streaming) != 0
			e.srv.streamMu.Unlock()
			if held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first chunk never began a stream")
			}
			time.Sleep(5 * time.Millisecond)
		}
		c2 := e.dial()
		c2.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Chunk: b, Last: true})
		if werr := readError(t, c2.NetConn(), c2); werr.Code != wire.CodeBusy {
			t.Fatalf("%+v", werr)
		}
		c.Close()
		waitEmpty(t, e)
		// And then it is free.
		if ack := streamArchive(t, e.dial(), sum, b, 7); !ack.Stored {
			t.Fatalf("%+v", ack)
		}
	})
}

func waitEmpty(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	// The stream is released when the refused connection's handler ends,
	// a moment after the refusal is written: wait for that too, or the
	// next stream of the same digest is (rightly) told it is busy.
	streaming := func() bool {
		e.srv.streamMu.Lock()
		defer e.srv.streamMu.Unlock()
		return len(e.srv.streaming) != 0
	}
	for len(e.cache()) != 0 || streaming() {
		if time.Now().After(deadline) {
			t.Fatalf("the cache holds %v after a refused stream", e.cache())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A hosted executor takes no archive from the link.
func TestHostedTakesNoArchive(t *testing.T) {
	e := newEnv(t, nobody, false)
	c := e.dial()
	b, sum := tgz(t, "x")
	c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Chunk: b, Last: true})
	if werr := readError(t, c.NetConn(), c); werr.Code != wire.CodeNotEnrolled || !strings.Contains(werr.Message, "no identity (hosted)") {
		t.Fatalf("%+v", werr)
	}
	if got := e.cache(); len(got) != 0 {
		t.Fatalf("a hosted executor cached %v", got)
	}
}

// The overlay's public key goes upward with the status the heartbeat
// carries; the private key never does.
func TestStatusCarriesTheOverlayPublicKey(t *testing.T) {
	e := newEnv(t, nobody, true)
	k, _, err := overlay.EnsureKey(e.state)
	if err != nil {
		t.Fatal(err)
	}
	c := e.dial()
	c.Write(wire.KindStatus, &wire.Status{})
	_, body, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	s := body.(*wire.StatusReply)
	if s.WireGuardKey != k.PublicKey().String() || strings.Contains(fmt.Sprintf("%+v", s), k.String()) {
		t.Fatalf("status %+v", s)
	}
}

// A reconcile the link sets off (a reconnect, a roster taken) may finish
// what the declaration's apply left undone: its verdict says what the store
// owns after it, as an apply's does, so the report of it — the newest —
// gives the control side the copy it hands back after a lost store, not
// the copy of the apply that failed.
func TestAReconcileSaysWhatTheStoreOwnsAfterIt(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	blocker := filepath.Join(e.root, "sub")
	if err := os.WriteFile(blocker, []byte("in the way\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	decl := e.decl("n1", "e-1", 1, file("motd", "hello\n"),
		`{"module":"m","id":"deep","type":"file","path":"{root}/sub/deep","content":"deep\n"}`)
	_, v := e.push(c, e.seal(decl))
	if v.Outcome != shapes.Failed {
		t.Fatalf("the apply with a file in the way: %+v, want failed", v)
	}
	owns := func(v *wire.Verdict) map[string]string {
		m := map[string]string{}
		for _, o := range v.Owned {
			m[o.Target] = o.Digest
		}
		return m
	}
	deep := "path:" + filepath.Join(e.root, "sub", "deep")
	if _, ok := owns(v)[deep]; ok {
		t.Fatalf("the failed apply's verdict claims %s: %+v", deep, v.Owned)
	}
	os.Remove(blocker)
	os.Mkdir(blocker, 0o755)
	_, v = send(t, c, wire.KindReconnected, &wire.Reconnected{})
	sum := sha256.Sum256([]byte("deep\n"))
	if got := owns(v)[deep]; got != hex.EncodeToString(sum[:]) {
		t.Fatalf("the reconcile that wrote %s: verdict %+v owns it as %q, want its digest", deep, v, got)
	}
	if _, ok := owns(v)["path:"+filepath.Join(e.root, "motd")]; !ok {
		t.Fatalf("the reconcile's verdict leaves out what the store owned before: %+v", v.Owned)
	}
}

// A declaration that waited for the apply lock while the node was enrolled
// anew (a grant taken under the lock ahead of it: another node, another
// enrolment, another control key) is checked under the identity in force
// once it holds the lock, not the one before: an old enrolment's
// declaration, which the agent may hold, changes nothing after the grant
// that replaced it, and burns no floor of the new node's.
func TestADeclarationIsCheckedUnderTheIdentityInForceWhenItApplies(t *testing.T) {
	e := newEnv(t, -1, false)
	e.enrolHere()
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 5, file("cur", "current")))); v.Outcome != shapes.Applied {
		t.Fatalf("seq 5: %+v", v)
	}
	old := e.seal(e.decl("n1", "e-1", 6, file("stale", "the old enrolment's")))

	e.srv.applyMu.Lock() // a long apply ahead of both
	verdict := make(chan *wire.Verdict, 1)
	go func() {
		_, v := e.push(e.dial(), old)
		verdict <- v
	}()
	time.Sleep(300 * time.Millisecond) // the declaration waits on the lock
	// The grant, taken under the lock as the daemon takes one.
	pub2, priv2, _ := ed25519.GenerateKey(rand.Reader)
	e.enrolAs("n2", "e-2", pub2, priv2)
	e.srv.applyMu.Unlock()

	v := <-verdict
	if v.Outcome != shapes.Refused {
		t.Fatalf("the old enrolment's declaration, after the grant: %+v", v)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "stale")); err == nil {
		t.Fatal("the old enrolment's declaration changed the machine after the grant")
	}
	d, err := wire.Seal(priv2, wire.PurposeDeclaration, e.decl("n2", "e-2", 1, file("new", "n2's")))
	if err != nil {
		t.Fatal(err)
	}
	if _, v := e.push(e.dial(), d); v.Outcome != shapes.Applied {
		t.Fatalf("the new node's first declaration: %+v", v)
	}
}

// The last declaration applied from the link is said again to the agent
// that asks past a sequence below it — its outcome, the lines its apply
// kept, what the store owns — by an executor started again too (its
// outcome then read from the store); past it, or past a newer one, the
// answer names the floor and says nothing; a hosted executor refuses.
// The agent asks so that an apply it never reported (it stopped between
// the verdict and the broker's confirmation) is not taken for superseded.
func TestTheLastApplyIsSaidAgainToTheAgentThatAsks(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 3, file("motd", "hello\n"), file("issue", "hi\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	ask := func(c *wire.Conn, after uint64) ([]shapes.Line, *wire.Verdict) {
		t.Helper()
		return send(t, c, wire.KindLastApplied, &wire.LastApplied{After: after})
	}
	check := func(c *wire.Conn, who string) {
		t.Helper()
		lines, v := ask(c, 1)
		if v.Seq != 3 || v.Outcome != shapes.Applied || v.Code != wire.CodeNone || len(lines) != 2 || len(v.Owned) != 2 {
			t.Fatalf("%s, asked past 1: %+v, lines %+v; want seq 3 applied, its two lines, two owned", who, v, lines)
		}
		// The floor before it: the first of this enrolment's applies.
		if v.Prior == nil || *v.Prior != 0 {
			t.Fatalf("%s: the floor before seq 3 said as %v; want 0", who, v.Prior)
		}
		for _, after := range []uint64{3, 9} {
			if lines, v := ask(c, after); v.Seq != 3 || v.Outcome != "" || len(lines) != 0 || v.Owned != nil {
				t.Fatalf("%s, asked past %d: %+v, lines %+v; want the floor named and nothing said", who, after, v, lines)
			}
		}
	}
	check(c, "the executor that applied it")
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
	c = e.dial()
	check(c, "the executor started again")
	// An apply's own verdict names the floor before it too.
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 7, file("motd", "seven\n")))); v.Outcome != shapes.Applied || v.Prior == nil || *v.Prior != 3 {
		t.Fatalf("seq 7 applied: %+v (prior %v); want applied, prior 3", v, v.Prior)
	}
	if lines, v := ask(c, 3); v.Seq != 7 || v.Prior == nil || *v.Prior != 3 || len(lines) != 2 {
		t.Fatalf("asked past 3 after seq 7: %+v (prior %v), lines %+v; want seq 7, prior 3, its two lines (motd replaced, issue removed)", v, v.Prior, lines)
	}
	// A floor an enrolment set (a grant's floor, no apply) is no apply.
	if err := identity.WriteFloor(e.state, identity.Floor{Seq: 20}); err != nil {
		t.Fatal(err)
	}
	if lines, v := ask(c, 7); v.Seq != 20 || v.Outcome != "" || len(lines) != 0 {
		t.Fatalf("a floor an enrolment set, asked: %+v, lines %+v; want it named, nothing said", v, lines)
	}

	h := newEnv(t, nobody, false)
	if _, v := ask(h.dial(), 0); v.Code != wire.CodeNotEnrolled || v.Outcome != shapes.Refused {
		t.Fatalf("a hosted executor asked: %+v", v)
	}
}

// An archive streamed on one connection while a declaration handed on
// another is still applying (an agent that came back while its
// predecessor's apply ran, and streams for the newer declaration) is not
// dropped by that apply's cleaning of the cache: the declaration that
// names it, handed next on the connection that streamed it, finds it.
func TestAnArchiveStreamedDuringAnApplyIsKeptForTheNext(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.afterStart()
	first, next := e.dial(), e.dial()
	st, err := store.Open(e.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil { // a rescue, say: the apply waits for it
		t.Fatal(err)
	}
	if err := first.Write(wire.KindDeclaration, &wire.Declaration{Envelope: e.seal(e.decl("n1", "e-1", 1, file("motd", "x")))}); err != nil {
		t.Fatal(err)
	}
	b, sum := tgz(t, "[Theme]\n")
	if ack := streamArchive(t, next, sum, b, 100); !ack.Stored {
		t.Fatalf("%+v", ack)
	}
	st.Unlock()
	for {
		k, body, err := first.Read()
		if err != nil {
			t.Fatalf("the first apply's answer: %v", err)
		}
		if k == wire.KindVerdict {
			if v := body.(*wire.Verdict); v.Outcome != shapes.Applied {
				t.Fatalf("the first apply: %+v", v)
			}
			break
		}
	}
	lines, v := e.push(next, e.seal(e.decl("n1", "e-1", 2, archiveDecl(sum)...)))
	if v.Outcome != shapes.Applied {
		t.Fatalf("the declaration the archive was streamed for: %+v %+v", v, lines)
	}
	// Handed over, the archive is the declaration's to keep: one that no
	// longer names it lets it go.
	if _, v := e.push(next, e.seal(e.decl("n1", "e-1", 3, file("motd", "y")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	if got := e.cache(); len(got) != 0 {
		t.Fatalf("the cache kept what nothing declares: %v", got)
	}
}

// A floor of another enrolment than the identity's — an enrolment cut
// short between its floor and its identity, whose floor may be lower than
// the identity's own — takes no declaration: a compromised agent cannot
// replay the identity's earlier declarations below it.
func TestAFloorOfAnotherEnrolmentTakesNoDeclaration(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 40, file("motd", "forty\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	if err := identity.WriteFloor(e.state, identity.Floor{Seq: 0, Enrolment: "e-2"}); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot()
	_, v := e.push(c, e.seal(e.decl("n1", "e-1", 5, file("motd", "five\n"))))
	if v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "cut short") {
		t.Fatalf("an earlier declaration of the identity, under another enrolment's floor: %+v", v)
	}
	if e.snapshot() != before {
		t.Fatal("the machine changed on a refusal")
	}
	if f, _ := identity.ReadFloor(e.state); f.Seq != 0 || f.Enrolment != "e-2" {
		t.Fatalf("the floor moved: %+v", f)
	}
}
