package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// miniExecutor answers hello and status on a unix socket, until stopped:
// its listener and every connection closed, as an executor killed.
type miniExecutor struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startMini(t *testing.T, path string) *miniExecutor {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	m := &miniExecutor{ln: ln}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			m.mu.Lock()
			m.conns = append(m.conns, nc)
			m.mu.Unlock()
			go func() {
				c := wire.NewConn(nc, wire.AgentToExecutor)
				defer c.Close()
				for {
					k, _, err := c.Read()
					if err != nil {
						return
					}
					switch k {
					case wire.KindHello:
						c.Write(wire.KindHelloReply, &wire.HelloReply{Protocol: wire.ProtocolVersion, Version: "test", Build: "b1"})
					case wire.KindStatus:
						c.Write(wire.KindStatusReply, &wire.StatusReply{Version: "test", Build: "b1", State: "hosted"})
					case wire.KindDeclaration:
						c.Write(wire.KindVerdict, &wire.Verdict{Seq: 1, Outcome: shapes.Applied})
					case wire.KindGrant:
						c.Write(wire.KindGrantReply, &wire.GrantReply{})
					}
				}
			}()
		}
	}()
	return m
}

func (m *miniExecutor) stop() {
	m.ln.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		c.Close()
	}
}

// The executor restarted since the agent's connection to it was made (a
// kill, its launcher's restart): the first request on the old connection
// finds its end closed, and is asked once more of the executor there is
// now — not failed (a plan then was answered "the executor could not be
// asked: broken pipe").
func TestARequestAfterTheExecutorRestartedIsAskedOfTheNewOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "executor.sock")
	first := startMini(t, path)
	e := &execClient{path: path, version: "test", build: "b1"}
	if _, err := e.status(&wire.AgentLink{}); err != nil {
		t.Fatal(err)
	}
	first.stop()
	second := startMini(t, path)
	defer second.stop()
	if _, err := e.status(&wire.AgentLink{}); err != nil {
		t.Fatalf("the first request after the executor's restart: %v", err)
	}
	// A declaration the same way (its verdict on a connection the
	// executor's restart closed: an error in the agent's log at every
	// upgrade, then the declaration read again).
	second.stop()
	third := startMini(t, path)
	defer third.stop()
	if v, _, err := e.request(t.Context(), wire.KindDeclaration, &wire.Declaration{Envelope: []byte("x")}); err != nil || v.Outcome != shapes.Applied {
		t.Fatalf("a declaration after the executor's restart: %+v %v", v, err)
	}
}

// An enrolment whose broker cannot be reached is asked again at every
// poll (2 s by default, for as long as the token lives): the same "no
// grant" is said at warning once, not once a poll.
func TestTheSameNoGrantIsSaidOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "executor.sock")
	m := startMini(t, path)
	defer m.stop()
	var logs bytes.Buffer
	o := Options{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	ex := &execClient{path: path, version: "test", build: "b1"}
	kp, _ := nkeys.CreateUser()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "tls://" + ln.Addr().String()
	ln.Close()
	offer := &wire.EnrolOffer{Pending: true, Token: "t1", BrokerURL: closed, Fingerprint: strings.Repeat("ab", 32),
		Credential: make([]byte, 32), ControlKey: make([]byte, 32)}
	said := ""
	for range 3 {
		if id, err := enrolWith(t.Context(), o, ex, kp, offer, &said); id != nil || err != nil {
			t.Fatal(id, err)
		}
	}
	if n := strings.Count(logs.String(), "enrolment: no grant"); n != 1 {
		t.Fatalf("said %d times:\n%s", n, logs.String())
	}
}

// A state directory another user owns is not taken from them by an agent
// started as root (its files stayed theirs, the agent failed on them, and
// the directory was closed to its owner); root's, or the agent's own, is.
func TestAStateDirectoryOfAnotherUserIsNotTaken(t *testing.T) {
	base := t.TempDir()
	theirs, roots := filepath.Join(base, "theirs"), filepath.Join(base, "roots")
	for _, d := range []string{theirs, roots} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(theirs, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := PrepareStateDir(theirs, 65534, 65534); err == nil || !strings.Contains(err.Error(), "is uid 4242's, not root's nor the agent's") {
		t.Fatalf("%v", err)
	}
	if fi, _ := os.Stat(theirs); fi.Sys().(*syscall.Stat_t).Uid != 4242 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("changed: %v", fi.Mode())
	}
	if err := PrepareStateDir(roots, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(roots); fi.Sys().(*syscall.Stat_t).Uid != 65534 || fi.Mode().Perm() != 0o700 {
		t.Fatalf("root's not taken: %v", fi.Mode())
	}
}

// Told the executor runs another build, the agent exits at once when its
// binary on disk was replaced (an upgrade: the init restarts onto it), and
// otherwise says so and waits for another binary or for the executor to
// run its own build, rather than be restarted onto the same binary, link
// and exit again every few seconds.
func TestAnAgentWithNoOtherBinaryWaitsForOne(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	waitForAnotherBinary(ctx, log, ErrUpgraded, 50*time.Millisecond, func() bool { return false })
	if ctx.Err() == nil || !strings.Contains(logs.String(), "there is nothing to restart onto") {
		t.Fatalf("returned before its context ended:\n%s", logs.String())
	}
	// The executor restarted onto this agent's build (this agent the
	// newer, the executor not restarted yet when it started): it exits,
	// to be restarted and link.
	ctx2, cancel2 := context.WithTimeout(t.Context(), time.Minute)
	defer cancel2()
	asked := 0
	waitForAnotherBinary(ctx2, log, ErrUpgraded, 10*time.Millisecond, func() bool { asked++; return asked == 3 })
	if ctx2.Err() != nil || asked != 3 || !strings.Contains(logs.String(), "the executor runs this agent's build again") {
		t.Fatalf("did not end as the executor came to its build (asked %d):\n%s", asked, logs.String())
	}
}

// Not root, the agent refuses a state directory another user may write
// (its key and identity could be swapped under it), or another's; its
// own, 0700 or writable by its own group alone, it takes.
func TestANonRootAgentRefusesAStateOthersMayWrite(t *testing.T) {
	base := t.TempDir()
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o700, true}, {0o770, true}, {0o777, false}, {0o703, false}} {
		dir := filepath.Join(base, c.mode.String())
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, c.mode)
		lock, err := takeStateDir(dir, "", false)
		if lock != nil {
			lock.Close()
		}
		if c.ok != (err == nil) || !c.ok && !strings.Contains(err.Error(), "another user may write it") {
			t.Errorf("mode %v: %v", c.mode, err)
		}
	}
	// Another user's, even closed to its owner's writes (a chmod away).
	theirs := filepath.Join(base, "theirs")
	os.Mkdir(theirs, 0o570)
	os.Chown(theirs, 4321, 0)
	if lock, err := takeStateDir(theirs, "", false); err == nil || !strings.Contains(err.Error(), "is uid 4321's") {
		if lock != nil {
			lock.Close()
		}
		t.Errorf("another user's directory: %v", err)
	}
}

// A config cut short (a disk filled as it was written) says what to do,
// not a bare "unexpected EOF".
func TestAConfigCutShortSaysWhatToDo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.json")
	for _, data := range []string{"", `{"broker_url":"tls://x:4222","no`} {
		os.WriteFile(p, []byte(data), 0o600)
		_, err := LoadConfig(p)
		if err == nil || !strings.Contains(err.Error(), "move it aside and start the agent again") {
			t.Errorf("%q: %v", data, err)
		}
	}
}

// A --vsock the command line got wrong is the command line's (exit 2,
// as every flag's), a secret that cannot be read is not.
func TestAVsockOfNoFormIsTheCommandLines(t *testing.T) {
	var u vsockUsage
	if _, err := parseVsock("bogus", "x"); !errors.As(err, &u) {
		t.Errorf("bogus: %v", err)
	}
	if _, err := parseVsock("3:1024", ""); !errors.As(err, &u) {
		t.Errorf("no secret: %v", err)
	}
	if _, err := parseVsock("3:1024", "/nonexistent"); err == nil || errors.As(err, &u) {
		t.Errorf("a secret that cannot be read: %v", err)
	}
}

// An install that swaps a link — the path the agent was started by, to a
// release's own file — leaves the file the agent was read from in place:
// the wait looks at the path started by too, and ends once it leads to
// another file.
func TestAnAgentStartedByALinkSeesItSwapped(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	link, other := filepath.Join(dir, "mesh-agent"), filepath.Join(dir, "mesh-agent-next")
	if err := os.Symlink(self, link); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755)
	defer func(f func() string) { invokedAs = f }(invokedAs)
	invokedAs = func() string { return link }
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() {
		waitForAnotherBinary(ctx, log, ErrUpgraded, 10*time.Millisecond, func() bool { return false })
		close(done)
	}()
	select {
	case <-done:
		t.Fatalf("returned while the link leads to the binary running:\n%s", logs.String())
	case <-time.After(200 * time.Millisecond):
	}
	tmp := link + ".new"
	os.Symlink(other, tmp)
	if err := os.Rename(tmp, link); err != nil { // the swap, as an installer does it
		t.Fatal(err)
	}
	<-done
	if ctx.Err() != nil || !strings.Contains(logs.String(), "the agent's binary was replaced") {
		t.Fatalf("the swap was not seen:\n%s", logs.String())
	}
}
