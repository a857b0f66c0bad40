package launcher

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The stub executors are real processes: a shell script that logs its start
// to a file and exits, or that execs this test binary in one of the modes
// below (LAUNCHER_STUB), which stands in for the executor's side of the
// protocol: Healthy at the end of a reconcile, serving until SIGTERM.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCHER_STUB"); mode != "" {
		os.Exit(stub(mode))
	}
	code := m.Run()
	if meshLaunch.path != "" {
		os.RemoveAll(filepath.Dir(meshLaunch.path))
	}
	os.Exit(code)
}

func stub(mode string) int {
	state, logf := os.Getenv("STUB_STATE"), os.Getenv("STUB_LOG")
	say := func(s string) {
		f, err := os.OpenFile(logf, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			fmt.Fprintln(f, s)
			f.Close()
		}
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "stub %s: %v\n", mode, err)
		return 3
	}
	switch mode {
	case "healthy-exit": // a reconcile runs to its end, then the executor exits
		if err := Healthy(state, map[string]string{"mesh-executor": os.Getenv("STUB_INSTALLED")}); err != nil {
			return fail(err)
		}
		code, _ := strconv.Atoi(os.Getenv("STUB_CODE"))
		return code
	case "healthy-serve": // reconciles, then serves until SIGTERM
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		bins := map[string]string{"mesh-executor": os.Getenv("STUB_INSTALLED")}
		if a := os.Getenv("STUB_AGENT"); a != "" {
			bins["mesh-agent"] = a // the agent beside it, as the executor passes it
		}
		if err := Healthy(state, bins); err != nil {
			return fail(err)
		}
		say("serving")
		<-sig
		say("term")
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		say(fmt.Sprintf("ready %d", os.Getpid()))
		time.Sleep(time.Hour)
		return 0
	case "healthy-self": // the executor's own call: its binary is os.Executable()
		self, err := os.Executable()
		if err != nil {
			return fail(err)
		}
		if os.Getenv("STUB_REPLACE") != "" {
			// The package manager installs a new binary under the running one.
			if err := atomicWrite(self, 0o755, func(f *os.File) error {
				_, err := f.WriteString("#!/bin/sh\necho a new release\n")
				return err
			}); err != nil {
				return fail(err)
			}
		}
		if err := Healthy(state, map[string]string{"mesh-executor": self}); err != nil {
			return fail(err)
		}
		return 0
	case "count": // read-modify-write under the lock, many times
		n, _ := strconv.Atoi(os.Getenv("STUB_N"))
		for i := 0; i < n; i++ {
			if _, err := update(state, func(s *State) (bool, error) {
				s.Starts = append(s.Starts, time.Now().UTC())
				return true, nil
			}); err != nil {
				return fail(err)
			}
		}
		return 0
	}
	return fail(fmt.Errorf("unknown mode"))
}

// syncBuffer collects the launcher's log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// lab is one launcher's world in a temporary directory.
type lab struct {
	t         *testing.T
	dir       string
	state     string // the executor's state directory
	kg        string // the known-good directory
	installed string // the installed mesh-executor
	log       string // one line per stub start or event
	out       *os.File
	logs      *syncBuffer
	mu        sync.Mutex
	reinstall []string // what the stub package manager was asked
}

func newLab(t *testing.T) *lab {
	t.Helper()
	d := t.TempDir()
	l := &lab{t: t, dir: d, state: filepath.Join(d, "state"), kg: filepath.Join(d, "known-good"),
		installed: filepath.Join(d, "bin", "mesh-executor"), log: filepath.Join(d, "starts.log"), logs: &syncBuffer{}}
	for _, p := range []string{l.kg, filepath.Dir(l.installed)} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.Create(filepath.Join(d, "child.out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	l.out = out
	return l
}

// script writes a stub executor at p: it logs "tag" and its pid, then
// either execs this test binary in mode (with env), or exits with code.
func (l *lab) script(p, tag, mode string, code int, env ...string) {
	l.t.Helper()
	self, err := os.Executable()
	if err != nil {
		l.t.Fatal(err)
	}
	s := fmt.Sprintf("#!/bin/sh\necho \"%s $$\" >> '%s'\n", tag, l.log)
	if mode != "" {
		env = append(env, "LAUNCHER_STUB="+mode, "STUB_STATE="+l.state, "STUB_LOG="+l.log, "STUB_INSTALLED="+l.installed)
		s += fmt.Sprintf("exec env %s '%s'\n", strings.Join(env, " "), self)
	}
	s += fmt.Sprintf("exit %d\n", code)
	if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
		l.t.Fatal(err)
	}
}

// config is a fast policy: 3 starts a minute, short pauses.
func (l *lab) config() Config {
	return Config{
		StateDir:  l.state,
		Installed: map[string]string{"mesh-executor": l.installed},
		KnownGood: l.kg,
		MaxStarts: 3, Window: time.Minute, Backoff: 20 * time.Millisecond, Poll: 50 * time.Millisecond,
		StopTimeout: 10 * time.Second,
		Notice:      filepath.Join(l.dir, "run", "launcher.json"),
		Reinstall: func(ctx context.Context, kg string, installed map[string]string) error {
			l.mu.Lock()
			l.reinstall = append(l.reinstall, fmt.Sprintf("%s -> %v", kg, installed))
			l.mu.Unlock()
			return CopyReinstall(ctx, kg, installed)
		},
		Stdout: l.out, Stderr: l.out,
		Log: slog.New(slog.NewTextHandler(l.logs, nil)),
	}
}

func (l *lab) reinstalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reinstall...)
}

// lines is the stub log: one entry per line, first word only.
func (l *lab) lines() []string {
	data, _ := os.ReadFile(l.log)
	var out []string
	for _, ln := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(ln); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

// running is a Run in a goroutine.
type running struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Run(ctx, cfg) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// alive asserts Run has not returned within d.
func (r *running) alive(d time.Duration) {
	r.t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		r.t.Fatalf("Run returned on its own (%v); it must stay up", err)
	case <-time.After(d):
	}
}

// stop cancels and returns how long Run took to return.
func (r *running) stop(within time.Duration) time.Duration {
	r.t.Helper()
	t0 := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			r.t.Fatalf("Run = %v after cancel, want nil", err)
		}
	case <-time.After(within):
		r.t.Fatalf("Run did not return within %v of cancel", within)
	}
	return time.Since(t0)
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readState(t *testing.T, dir string) State {
	t.Helper()
	s, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func count(lines []string, tag string) int {
	n := 0
	for _, l := range lines {
		if l == tag {
			n++
		}
	}
	return n
}

var meshLaunch struct {
	once sync.Once
	path string
	err  error
}

// buildMeshLaunch builds cmd/mesh-launch once per test run.
func buildMeshLaunch(t *testing.T) string {
	t.Helper()
	meshLaunch.once.Do(func() {
		dir, err := os.MkdirTemp("", "mesh-launch-test-")
		if err != nil {
			meshLaunch.err = err
			return
		}
		meshLaunch.path = filepath.Join(dir, "mesh-launch")
		cmd := exec.Command("go", "build", "-o", meshLaunch.path, "../cmd/mesh-launch")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			meshLaunch.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if meshLaunch.err != nil {
		t.Fatal(meshLaunch.err)
	}
	return meshLaunch.path
}
