package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

func logger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// agentLog is logger for an agent of t's: its log is kept, and its end
// printed when t fails — a test that fails once in many runs under
// another load says what the agent saw.
func agentLog(t *testing.T) *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return logger()
	}
	var mu sync.Mutex
	var buf bytes.Buffer
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		t.Logf("the agent's log (its last %d lines):\n%s", min(len(lines), 80), strings.Join(lines[max(0, len(lines)-80):], "\n"))
	})
	return slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// controlSide is the real control side: control.Serve with its embedded
// broker (TLS, JetStream, NKey users) on loopback.
type controlSide struct {
	t      *testing.T
	keys   *control.Keys
	listen string
	url    string
	srv    *control.Server
	client *control.Client
	cancel context.CancelFunc
	done   chan error
}

func startControl(t *testing.T, dir, listen string) *controlSide {
	t.Helper()
	k, err := control.LoadKeys(dir)
	if err != nil {
		if k, err = control.Init(dir, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	c := &controlSide{t: t, keys: k, listen: listen}
	c.start()
	t.Cleanup(c.stop)
	return c
}

func (c *controlSide) start() {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	type up struct {
		url string
		srv *control.Server
	}
	ready := make(chan up, 1)
	done := make(chan error, 1)
	go func() {
		done <- control.Serve(ctx, c.keys, control.ServeOptions{Listen: c.listen, Log: logger(),
			Ready: func(u string, s *control.Server) { ready <- up{u, s} }})
	}()
	select {
	case u := <-ready:
		c.url, c.srv = u.url, u.srv
	case err := <-done:
		cancel()
		c.t.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		c.t.Fatal("serve did not come up")
	}
	cl, err := control.Connect(ctx, c.keys, c.url, logger())
	if err != nil {
		cancel()
		c.t.Fatal(err)
	}
	c.client, c.cancel, c.done = cl, cancel, done
	_, port, _ := splitHostPort(c.url)
	c.listen = "127.0.0.1:" + port // a restart comes back on the same port
}

func (c *controlSide) stop() {
	if c.cancel == nil {
		return
	}
	c.client.Close()
	c.cancel()
	<-c.done
	c.cancel = nil
}

// addNode registers a node and returns its identity and its config.
func (c *controlSide) addNode(name string) (*agent.Identity, *agent.Config) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, _, err := c.client.AddNode(ctx, name, c.url)
	if err != nil {
		c.t.Fatal(err)
	}
	id, err := cfg.Identity()
	if err != nil {
		c.t.Fatal(err)
	}
	return id, cfg
}

func (c *controlSide) declare(node string, decl string) uint64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seq, err := c.client.Declare(ctx, node, []byte(decl))
	if err != nil {
		c.t.Fatal(err)
	}
	return seq
}

// reports waits until cond holds of the node's signed reports on the
// broker, and returns them.
func (c *controlSide) reports(node string, what string, cond func([]*control.SignedReport) bool) []*control.SignedReport {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rs, skipped, err := c.client.Reports(ctx, node, 0)
		cancel()
		if err == nil && skipped > 0 {
			c.t.Fatalf("%d unsigned reports on %s's subject", skipped, node)
		}
		if err == nil && cond(rs) {
			return rs
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("waiting for %s: %v; reports so far: %s", what, err, describe(rs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describe(rs []*control.SignedReport) string {
	s := ""
	for _, r := range rs {
		s += "\n  " + r.Trigger + " seq " + itoa(r.Seq) + " " + string(r.Outcome)
		if r.Refused != "" {
			s += " (" + r.Code + ": " + r.Refused + ")"
		}
		if r.SupersededFrom != 0 && r.SupersededFrom != r.Seq {
			s += " (from seq " + itoa(r.SupersededFrom) + ")"
		}
		if r.SupersededBy != 0 {
			s += " by " + itoa(r.SupersededBy)
		}
	}
	return s
}

// supersedes says whether r reports seq superseded by by.
func supersedes(r *control.SignedReport, seq, by uint64) bool {
	from := r.SupersededFrom
	if from == 0 {
		from = r.Seq
	}
	return r.Outcome == shapes.Superseded && r.SupersededBy == by && from <= seq && seq <= r.Seq
}

func hasReport(seq uint64, outcome shapes.Outcome) func([]*control.SignedReport) bool {
	return func(rs []*control.SignedReport) bool {
		for _, r := range rs {
			if r.Seq == seq && r.Outcome == outcome && r.Trigger == link.TriggerDeclaration {
				return true
			}
		}
		return false
	}
}

// runAgent runs the agent in this process until the test ends.
func runAgent(t *testing.T, id *agent.Identity, socket string) (stop func() error) {
	t.Helper()
	return runAgentPolling(t, id, socket, 0)
}

// runAgentPolling is runAgent with the agent's timer read every poll (0:
// the default, minutes).
func runAgentPolling(t *testing.T, id *agent.Identity, socket string, poll time.Duration) (stop func() error) {
	t.Helper()
	return runAgentIn(t, id, socket, poll, t.TempDir())
}

// runAgentIn is runAgentPolling with the agent's state in dir: an agent
// started again where one stopped.
func runAgentIn(t *testing.T, id *agent.Identity, socket string, poll time.Duration, dir string) (stop func() error) {
	t.Helper()
	return runAgentWith(t, id, socket, dir, func(o *agent.Options) { o.Poll = poll })
}

// runAgentWith is runAgentIn with the test's options changed by edit.
func runAgentWith(t *testing.T, id *agent.Identity, socket, dir string, edit func(*agent.Options)) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := agent.Options{
		Identity: id, Socket: socket, ExecutorUID: uint32(os.Getuid()), StateDir: dir,
		Heartbeat: 300 * time.Millisecond, Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: agentLog(t),
	}
	edit(&o)
	go func() { done <- agent.Run(ctx, o) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitFor polls cond for up to 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, 20*time.Second, cond)
}

// waitForWithin polls cond for up to d.
func waitForWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// carry sends a declaration of seq (a file named by it), signed by the
// control key and addressed to node's enrolment, on node's notice subject
// as publishDecl sends one, with h beside it: its stream sequence is past
// any on the stream (a message the agent has not read), by seq.
func (c *controlSide) carry(t *testing.T, node, enrolment string, seq uint64, h nats.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	decls, err := c.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := decls.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(map[string]any{"version": 1, "node": node, "enrolment": enrolment, "seq": seq, "resources": file(fmt.Sprint(seq))})
	env, err := wire.Seal(c.keys.Control, wire.PurposeDeclaration, payload)
	if err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = nats.Header{}
	}
	h.Set(link.HeaderSequence, fmt.Sprint(info.State.LastSeq+100+seq))
	c.client.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf(node).Notice, Data: env, Header: h})
}
