package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// An executor of another build: the host was upgraded. The agent says so
// and ends with ErrUpgraded (mesh-agent exits 0; its init restarts it onto
// its own new binary).
func TestOtherBuildEndsTheAgent(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("upgraded")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b2")
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(context.Background(), agent.Options{
			Identity: id, Socket: ex.path, ExecutorUID: uint32(os.Getuid()), Heartbeat: time.Second,
			Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: logger(),
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, agent.ErrUpgraded) {
			t.Fatalf("Run: %v, want ErrUpgraded", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the agent kept running beside an executor of another build")
	}
	if decls, _, _ := ex.snapshot(); len(decls) != 0 {
		t.Fatalf("it forwarded %v to an executor of another build", decls)
	}
}

// An executor that cannot take a declaration now gets it again: it
// refuses the connection (an Error, then it closes) while the declaration
// is on its way, or refuses it for a passing reason of its own side (its
// store held by a rescue past its wait, its disk full: a verdict, no floor
// moved, as serve answers). Nothing is acked or reported as done, or
// settled as refused: the agent hands it over again, and it is applied
// and reported once, applied.
func TestAnExecutorThatCannotTakeADeclarationNowGetsItAgain(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*fakeExecutor)
	}{
		{"the connection refused", func(f *fakeExecutor) { f.failNext = true }},
		{"a passing refusal", func(f *fakeExecutor) { f.passNext = true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl := startControl(t, t.TempDir(), "127.0.0.1:0")
			id, _ := ctl.addNode("retry")
			ex := newFakeExecutor(t, ctl.keys.ControlPublic(), "b1")
			runAgent(t, id, ex.path)
			waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
			ex.mu.Lock()
			c.set(ex)
			ex.mu.Unlock()
			s := ctl.declare("retry", fmt.Sprintf(motd, 1))
			rs := ctl.reports("retry", "applied once the executor could take it", hasReport(s, shapes.Applied))
			if decls, _, _ := ex.snapshot(); !slices.Equal(decls, []uint64{s}) {
				t.Fatalf("applied %v, want [%d] once", decls, s)
			}
			for _, r := range rs {
				if r.Seq == s && r.Outcome != shapes.Applied {
					t.Fatalf("seq %d reported %s (%s) before it was applied", s, r.Outcome, r.Refused)
				}
			}
		})
	}
}

// An archive the executor will not take: its cache cannot hold it with
// what the declarations applied there name (too-large) is the
// declaration's refusal, said by the executor and settled — streamed once,
// not read from the store again at every back-off and said to no one; its
// disk's room of the moment (internal) is passing, and the declaration is
// applied once the archive fits.
func TestAnArchiveTheExecutorWillNotTake(t *testing.T) {
	for _, c := range []struct {
		name string
		code wire.Code
		once bool
		want shapes.Outcome
	}{
		{"over the cache's bound", wire.CodeTooLarge, false, shapes.Refused},
		{"the state disk's room, then room", wire.CodeInternal, true, shapes.Applied},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl := startControl(t, t.TempDir(), "127.0.0.1:0")
			path := filepath.Join(t.TempDir(), "a.tar")
			if err := os.WriteFile(path, make([]byte, 1024), 0o644); err != nil {
				t.Fatal(err)
			}
			sum, _, err := ctl.client.PutArchive(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			id, _ := ctl.addNode("big")
			ex := newFakeExecutor(t, ctl.keys.ControlPublic(), "b1")
			ex.mu.Lock()
			ex.refuseArchives, ex.refuseOnce = c.code, c.once
			ex.mu.Unlock()
			runAgent(t, id, ex.path)
			s := ctl.declare("big", strings.ReplaceAll(`{"version":1,"resources":[{"module":"m","id":"a","type":"archive","url":"obj://SUM","sha256":"SUM","destination":"/srv/t"}]}`, "SUM", sum))
			rs := ctl.reports("big", "the declaration reported "+string(c.want), hasReport(s, c.want))
			for _, r := range rs {
				if r.Seq != s {
					continue
				}
				if c.want == shapes.Refused && (r.RefusedBy != "executor" || r.Code != agent.CodeArchive || !strings.Contains(r.Refused, "too-large")) {
					t.Fatalf("refused by %q (%s): %s", r.RefusedBy, r.Code, r.Refused)
				}
				if c.want == shapes.Applied && r.Outcome != shapes.Applied {
					t.Fatalf("reported %s (%s) before it was applied", r.Outcome, r.Refused)
				}
			}
			time.Sleep(time.Second) // ten of the agent's back-offs
			ex.mu.Lock()
			streams, decls := ex.streams, slices.Clone(ex.decls)
			ex.mu.Unlock()
			wantStreams, wantDecls := 1, []uint64(nil)
			if c.want == shapes.Applied {
				wantStreams, wantDecls = 2, []uint64{s}
			}
			if streams != wantStreams || !slices.Equal(decls, wantDecls) {
				t.Fatalf("streamed %d times, declarations handed over %v; want %d, %v", streams, decls, wantStreams, wantDecls)
			}
		})
	}
}

// The executor turns hosted — a retire declaration ran to its end, or it
// lost its state and refuses what it is handed (a declaration, or first
// the archive one names) as not enrolled — and the agent follows: it
// drops its identity (its config file) and is hosted too. It asks the
// executor after those only, not after every declaration.
func TestAgentFollowsTheExecutorIntoHosted(t *testing.T) {
	for _, tc := range []struct {
		name, decl string
		lost       bool
	}{
		{"retire", `{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`, false},
		// It ran before: the agent was killed between the verdict and
		// the report, and the executor, hosted since, refuses it.
		{"retire, its first report lost", `{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`, true},
		{"state lost", fmt.Sprintf(motd, 1), true},
		// The archive it names is refused first, before the declaration.
		{"state lost, an archive declared", `{"version":1,"resources":[{"module":"m","id":"a","type":"archive","url":"obj://SUM","sha256":"SUM","destination":"/srv/t"}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startControl(t, t.TempDir(), "127.0.0.1:0")
			if strings.Contains(tc.decl, "SUM") {
				path := filepath.Join(t.TempDir(), "a.tar")
				if err := os.WriteFile(path, make([]byte, 1024), 0o644); err != nil {
					t.Fatal(err)
				}
				sum, _, err := c.client.PutArchive(context.Background(), path)
				if err != nil {
					t.Fatal(err)
				}
				tc.decl = strings.ReplaceAll(tc.decl, "SUM", sum)
			}
			id, _ := c.addNode("leaving")
			ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
			config := filepath.Join(t.TempDir(), "agent.json")
			if err := os.WriteFile(config, []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- agent.Run(ctx, agent.Options{
					Identity: id, ConfigPath: config, Socket: ex.path, ExecutorUID: uint32(os.Getuid()), StateDir: t.TempDir(),
					Heartbeat: time.Minute, Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: logger(),
				})
			}()
			defer func() { cancel(); <-done }()
			waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
			// An applied declaration first: the agent stays.
			s := c.declare("leaving", fmt.Sprintf(motd, 0))
			c.reports("leaving", "the first applied", hasReport(s, shapes.Applied))
			if _, err := os.Stat(config); err != nil {
				t.Fatalf("after an applied declaration the agent dropped its identity: %v", err)
			}
			ex.mu.Lock()
			asked := ex.statusAfterDecl
			ex.mu.Unlock()
			if asked != 0 {
				t.Fatalf("the agent asked its executor's state after an applied declaration (%d times): a round trip for nothing", asked)
			}
			ex.mu.Lock()
			ex.hosted = tc.lost
			ex.mu.Unlock()
			seq := c.declare("leaving", tc.decl)
			if strings.Contains(tc.decl, "retire") {
				// Said retired either way: the control side holds it to
				// the retirement it signed, and follows.
				c.reports("leaving", "the retirement said", func(rs []*control.SignedReport) bool {
					return slices.ContainsFunc(rs, func(r *control.SignedReport) bool { return r.Seq == seq && r.Retired })
				})
				waitFor(t, "the control side to follow the retirement", func() bool {
					rec, _, err := c.client.Node(context.Background(), "leaving")
					return err == nil && rec.IsRevoked()
				})
			}
			waitFor(t, "the agent to drop its identity", func() bool {
				_, err := os.Stat(config)
				return errors.Is(err, os.ErrNotExist)
			})
			ex.mu.Lock()
			asked = ex.statusAfterDecl
			ex.mu.Unlock()
			if asked != 1 && !strings.Contains(tc.decl, "archive") { // an archive's refusal closes the connection first
				t.Fatalf("the agent asked its executor's state %d times after the declaration that left it hosted, want once", asked)
			}
		})
	}
}

// Hosted: without an identity Run stays up, never dials and never ends
// on its own.
func TestHostedStaysIdle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, agent.Options{Log: logger(), Socket: "/nonexistent"}) }()
	select {
	case err := <-done:
		t.Fatalf("a hosted agent ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The launcher halted (a release and its rollback both failed): no
// executor answers, and the agent relays the launcher's reason from beside
// the socket, so the node reads as halted and why, not as switched off.
func TestLauncherHaltReportedUpward(t *testing.T) {
	ctlDir := t.TempDir()
	c := startControl(t, ctlDir, "127.0.0.1:0")
	id, _ := c.addNode("halted")
	run := t.TempDir()
	notice := `{"halted":true,"reason":"halted; starting nothing until a person runs mesh-launch clear: the machine is the problem","at":"2026-11-30T00:00:00Z"}`
	if err := os.WriteFile(filepath.Join(run, "launcher.json"), []byte(notice), 0o640); err != nil {
		t.Fatal(err)
	}
	var log lockedLog
	runAgentWith(t, id, filepath.Join(run, "executor.sock"), t.TempDir(), func(o *agent.Options) {
		o.Log = slog.New(slog.NewTextHandler(&log, nil))
	})
	waitFor(t, "the halt in the registry", func() bool {
		ns, err := c.client.Nodes(context.Background())
		return err == nil && len(ns) == 1 && strings.Contains(ns[0].ExecutorHalted, "the machine is the problem") && ns[0].ExecutorError != ""
	})
	// The fleet's table says halted and where to read why (the reason
	// runs to hundreds of characters); node show says why.
	var out, errb bytes.Buffer
	if code := control.Main(context.Background(), []string{"nodes", "--dir", ctlDir, "--nats", c.url}, &out, &errb); code != 0 || !strings.Contains(out.String(), "halted (node show halted says why)") || strings.Contains(out.String(), "the machine is the problem") {
		t.Fatalf("nodes: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := control.Main(context.Background(), []string{"node", "show", "halted", "--dir", ctlDir, "--nats", c.url}, &out, &errb); code != 0 || !strings.Contains(out.String(), "the machine is the problem") {
		t.Fatalf("node show: exit %d\n%s%s", code, out.String(), errb.String())
	}
	// Said in the agent's own log too, where a person at the machine
	// looks: once for the outage, not at every heartbeat.
	time.Sleep(time.Second)
	if n := strings.Count(log.String(), "the executor cannot be reached"); n != 1 || !strings.Contains(log.String(), "the machine is the problem") {
		t.Fatalf("said %d times:\n%s", n, log.String())
	}
}

// lockedLog is a log's bytes, written from the agent's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An episodic agent (an app, linked only while it runs) says so in its
// heartbeat, and the control side marks it so. When either stops, the
// control side keeps what it last said and how long ago: no "silent"
// threshold of its own: disconnection is the node's to say.
func TestEpisodicSilenceIsNotAnAbsence(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	for _, n := range []struct {
		name     string
		episodic bool
		presence string
	}{{"app", true, link.PresenceEpisodic}, {"server", false, link.PresenceResident}} {
		id, _ := c.addNode(n.name)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- agent.Run(ctx, agent.Options{Identity: id, Socket: ex.path, ExecutorUID: uint32(os.Getuid()), StateDir: t.TempDir(),
				Heartbeat: 200 * time.Millisecond, Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: logger(), Episodic: n.episodic})
		}()
		status := func() *control.NodeStatus {
			ns, _ := c.client.Nodes(context.Background())
			for _, s := range ns {
				if s.Name == n.name {
					return s
				}
			}
			return &control.NodeStatus{}
		}
		waitFor(t, n.name+" heard from", func() bool { s := status(); return s.State == link.StateEnrolled && s.Presence == n.presence })
		cancel()
		<-done
		// Many heartbeat periods later: what it last said, heard longer
		// ago, and nothing the control side made up.
		time.Sleep(time.Second)
		if s := status(); s.State != link.StateEnrolled || s.Presence != n.presence || time.Since(s.LastHeard) < 800*time.Millisecond {
			t.Fatalf("%s after its agent stopped: state %q, presence %q, last heard %v ago", n.name, s.State, s.Presence, time.Since(s.LastHeard))
		}
	}
}

// The agent's state directory moved away under it (or removed, and
// another agent started on the path): it writes nothing there by its path
// any more — it would write over the other agent's, or make the directory
// anew outside its lock — says so, and stops.
func TestAStateMovedUnderTheAgentStopsIt(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("moved")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	dir := filepath.Join(t.TempDir(), "agent")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var log lockedLog
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Options{Identity: id, Socket: ex.path, ExecutorUID: uint32(os.Getuid()), StateDir: dir,
			Heartbeat: 200 * time.Millisecond, Version: "test", Build: "b1", RetryWait: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))})
	}()
	waitFor(t, "the agent's state written", func() bool {
		_, err := os.Stat(filepath.Join(dir, "agent.json"))
		return err == nil
	})
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "state directory is not the one it started on") {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the agent goes on:\n%s", log.String())
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("the state was made anew: %v", err)
	}
	if !strings.Contains(log.String(), "is not the one it started on") {
		t.Fatalf("not said:\n%s", log.String())
	}
}
