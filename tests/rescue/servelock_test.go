package rescue

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveProc is a running `mesh-executor serve`.
type serveProc struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
}

func startServe(t *testing.T, state, socket string) *serveProc {
	t.Helper()
	cmd := exec.Command(executorBin, "serve", "--state", state, "--socket", socket, "--agent-uid", strconv.Itoa(attackerUID), "--drift", "0", "--build", "rescue")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &serveProc{cmd: cmd, out: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *serveProc) stop(t *testing.T) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// exited waits up to d for the process to end and returns its exit code.
func (p *serveProc) exited(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("still running after %v:\n%s", d, p.out)
		return 0
	}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !f(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// One daemon per state: a second `serve` on the same --state refuses by
// name, with the holder's pid, before it touches the socket or anything
// else; a rescue apply still runs beside the daemon (the store's lock is
// the one it shares, and waits on); and once the first is gone the lock
// is too.
func TestASecondServeIsRefusedByName(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	state := filepath.Join(base, "executor")
	run := filepath.Join(base, "run")
	first := startServe(t, state, filepath.Join(run, "a.sock"))
	waitFor(t, "the first daemon's socket", func() bool { _, err := os.Stat(filepath.Join(run, "a.sock")); return err == nil })
	sock := snapshotPath(t, filepath.Join(run, "a.sock"))

	for _, socket := range []string{filepath.Join(run, "b.sock"), filepath.Join(run, "a.sock")} {
		second := startServe(t, state, socket)
		code := second.exited(t, 10*time.Second)
		want := "mesh-executor: serve: refused: another mesh-executor serve (pid " + strconv.Itoa(first.cmd.Process.Pid) + ") holds " + state
		if code == 0 || !strings.Contains(second.out.String(), want) {
			t.Fatalf("the second serve on %s: exit %d\n%s\nwant %q", socket, code, second.out, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(run, "b.sock")); !os.IsNotExist(err) {
		t.Fatal("the refused serve made its socket")
	}
	if d := sameAs(filepath.Join(run, "a.sock"), sock); d != "" {
		t.Fatalf("the first daemon's socket was touched: %s", d)
	}
	select {
	case <-first.done:
		t.Fatalf("the first daemon ended:\n%s", first.out)
	default:
	}

	// Rescue beside the daemon: apply takes the store's lock, not the
	// daemon's.
	out := filepath.Join(base, "out")
	decl := writeDecl(t, base, "decl.json", declaration{Version: 1, Resources: []resource{fileRes("m", "f", out, "rescued\n", "0644")}})
	rep, _ := apply(t, context.Background(), "apply", state, decl)
	if rep.Outcome != "applied" {
		t.Fatalf("rescue apply beside the daemon: %+v", rep)
	}

	// The first one gone, its lock is gone with it.
	first.stop(t)
	third := startServe(t, state, filepath.Join(run, "c.sock"))
	waitFor(t, "the next daemon's socket", func() bool { _, err := os.Stat(filepath.Join(run, "c.sock")); return err == nil })
	third.stop(t)
}

// The daemon's lock is opened without following a link: one planted in
// its place steers nothing, and serve says what is wrong.
func TestServeLockIsNotALink(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	state := filepath.Join(base, "executor")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "elsewhere")
	if err := os.WriteFile(target, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(state, "serve.lock")); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, state, filepath.Join(base, "run", "a.sock"))
	if code := p.exited(t, 10*time.Second); code == 0 || !strings.Contains(p.out.String(), "serve.lock") {
		t.Fatalf("serve over a planted link: exit %d\n%s", code, p.out)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Fatalf("the link's target was written: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(base, "run", "a.sock")); !os.IsNotExist(err) {
		t.Fatal("the socket was made")
	}
}

// A daemon lives through a hang-up (the terminal it was started from
// closed), saying it ignored it, and through its log's reader going away
// (journald restarted, a pipe to head): neither ended it without a word.
func TestServeLivesThroughAHangUpAndItsLogsReaderGone(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	state, socket := filepath.Join(base, "executor"), filepath.Join(base, "run", "executor.sock")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(executorBin, "serve", "--state", state, "--socket", socket, "--agent-uid", strconv.Itoa(attackerUID), "--drift", "0", "--build", "rescue")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	var log bytes.Buffer
	read := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			log.Write(buf[:n])
			if strings.Contains(log.String(), "SIGHUP: ignored") {
				close(read)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	waitFor(t, "the daemon's socket", func() bool { _, err := os.Stat(socket); return err == nil })
	cmd.Process.Signal(syscall.SIGHUP)
	select {
	case <-read:
	case err := <-done:
		t.Fatalf("SIGHUP ended it: %v\n%s", err, log.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no word of the SIGHUP:\n%s", log.String())
	}
	r.Close() // its log's reader gone: the next line it writes meets a broken pipe
	cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a write to its log with no reader ended it: %v", err)
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stopped: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not stop it")
	}
}
