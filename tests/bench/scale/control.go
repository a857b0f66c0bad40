package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// controlProc is `mesh-control serve` with its embedded broker, run as a
// child process of the bench so that its CPU and memory are its own in
// /proc, apart from the simulated agents'.
type controlProc struct {
	bin    string // mesh-control
	dir    string // its key directory (and the broker's store)
	logs   string
	listen string // host:port, the same at every start
	// profile is where serve writes CPU profiles when signalled (-profile;
	// a build with -tags benchprofile), "" for none.
	profile string
	// profileFromStart: the next start profiles from its first instant
	// (the restart's storm), until SIGUSR2.
	profileFromStart bool
	// serveArgs, when set, are serve's arguments instead of the embedded
	// broker's (CLUSTER=1).
	serveArgs []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	log    string // this start's log file
	starts int
}

// url is the broker's address for clients.
func (c *controlProc) url() string { return "tls://" + c.listen }

// run runs a mesh-control command to its end (init, overlay set), its
// output in logs/<name>.log, and returns how long it took.
func (c *controlProc) run(ctx context.Context, name string, args ...string) (time.Duration, error) {
	took, _, err := c.runCPU(ctx, name, args...)
	return took, err
}

// runCPU is run, saying also the CPU the command used (user and system).
func (c *controlProc) runCPU(ctx context.Context, name string, args ...string) (time.Duration, time.Duration, error) {
	logf, err := os.Create(filepath.Join(c.logs, name+".log"))
	if err != nil {
		return 0, 0, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if c.profile != "" {
		// The command's own CPU profile, from its first instant to its end
		// (profile_bench.go writes it when the process exits).
		cmd.Env = append(os.Environ(), "MESH_BENCH_PROFILE="+c.profile, "MESH_BENCH_PROFILE_FROM_START=1")
	}
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	var cpu time.Duration
	if cmd.ProcessState != nil {
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if err != nil {
		return took, cpu, fmt.Errorf("mesh-control %s: %w (%s)", strings.Join(args, " "), err, lastLines(logf.Name(), 3))
	}
	return took, cpu, nil
}

// start starts serve; it dies with the bench (PR_SET_PDEATHSIG).
func (c *controlProc) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts++
	c.log = filepath.Join(c.logs, fmt.Sprintf("serve-%d.log", c.starts))
	logf, err := os.Create(c.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := c.serveArgs
	if args == nil {
		args = []string{"serve", "--dir", c.dir, "--listen", c.listen}
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if c.profile != "" {
		cmd.Env = append(os.Environ(), "MESH_BENCH_PROFILE="+c.profile)
		if c.profileFromStart {
			cmd.Env = append(cmd.Env, "MESH_BENCH_PROFILE_FROM_START=1")
			c.profileFromStart = false
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mesh-control serve: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	c.cmd, c.done = cmd, done
	return nil
}

// pid is serve's process id (0 when not running).
func (c *controlProc) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	select {
	case <-c.done:
		return 0
	default:
		return c.cmd.Process.Pid
	}
}

// waitServing waits until serve says it is serving (its log line), it
// exits, or within passes.
func (c *controlProc) waitServing(ctx context.Context, within time.Duration) error {
	c.mu.Lock()
	done, log := c.done, c.log
	c.mu.Unlock()
	deadline := time.Now().Add(within)
	for {
		b, _ := os.ReadFile(log)
		if bytes.Contains(b, []byte("msg=serving")) {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("mesh-control serve exited before serving: %s", lastLines(log, 3))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mesh-control serve did not say it was serving within %s", within)
		}
	}
}

// stop ends serve with SIGTERM, as an init stops it, and waits up to
// within for it to exit; then it is killed. It returns how long the stop
// took and whether it had to be killed.
func (c *controlProc) stop(within time.Duration) (time.Duration, bool) {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return 0, false
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return time.Since(start), false
	case <-time.After(within):
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
	return time.Since(start), true
}

// lastLines is the end of a log file, on one line.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "no log"
		}
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// dumpLog copies the end of serve's log to w.
func (c *controlProc) dumpLog(w io.Writer) {
	c.mu.Lock()
	log := c.log
	c.mu.Unlock()
	if log != "" {
		fmt.Fprintf(w, "--- %s (last lines) ---\n%s\n", filepath.Base(log), strings.ReplaceAll(lastLines(log, 15), " / ", "\n"))
	}
}
