package rescue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C in the middle of a rescue apply ends it after the step in
// progress, says so at once, and exits as a failed apply: the action it
// was running ran to its end, the resource after it was not attempted, and
// the next apply does it. (A second Ctrl-C is the signal's own: the
// process ends where it is, as a kill does — the crash tests.)
func TestAnInterruptEndsARescueApplyAfterItsStep(t *testing.T) {
	dir := t.TempDir()
	state, tree := filepath.Join(dir, "state"), filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	decl := filepath.Join(dir, "rescue.json")
	doc := strings.ReplaceAll(`{"version":1,"resources":[
		{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo > {root}/started; sleep 1; echo done > {root}/marker"],"verify":["/bin/sh","-c","test -f {root}/marker"]},
		{"module":"m","id":"after","type":"file","path":"{root}/after","content":"x\n"}]}`, "{root}", tree)
	if err := os.WriteFile(decl, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(executorBin, "apply", "--state", state, "--json", decl)
	cmd.Dir = "/"
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(tree, "started")); err == nil {
			break
		}
		if time.Now().After(until) {
			cmd.Process.Kill()
			t.Fatal("the action did not begin")
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || !ee.Exited() || ee.ExitCode() != 1 {
		t.Fatalf("an interrupted apply exits 1 (a failed apply): %v\nstderr: %s", err, errb.Bytes())
	}
	if !strings.Contains(errb.String(), "asked to stop: the apply ends after the step in progress") {
		t.Fatalf("the interrupt was not said: %s", errb.Bytes())
	}
	if b, err := os.ReadFile(filepath.Join(tree, "marker")); err != nil || string(b) != "done\n" {
		t.Fatalf("the action in progress was cut short: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(tree, "after")); !os.IsNotExist(err) {
		t.Fatalf("the resource after the interrupt was applied: %v", err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	last := rep.Lines[len(rep.Lines)-1]
	if rep.Outcome != "failed" || len(rep.Lines) != 2 || !strings.Contains(last.Detail, "1 later resource not attempted") {
		t.Fatalf("the report does not say what the interrupt left: %s", out.Bytes())
	}

	rep2, res := apply(t, t.Context(), "apply", state, decl)
	if res.exit != 0 || rep2.Outcome != "applied" {
		t.Fatalf("the next apply: exit %d, %s", res.exit, res.stdout)
	}
	if _, err := os.Stat(filepath.Join(tree, "after")); err != nil {
		t.Fatal(err)
	}
}

// A rescue apply killed (kill -9) in the middle of an action leaves the
// action running: nothing ties it to the apply. The next apply waits for
// it, rather than run the same action a second time beside it, and
// finds it done. While it waits (the store's lock held, nothing begun),
// status says the killed apply cut short, not running.
func TestAnActionAKilledApplyLeftRunningIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	state, tree := filepath.Join(dir, "state"), filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	decl := filepath.Join(dir, "rescue.json")
	log := filepath.Join(tree, "log")
	doc := strings.ReplaceAll(`{"version":1,"resources":[
		{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo start >> {root}/log; while [ ! -e {root}/gate ]; do sleep 0.05; done; echo end >> {root}/log"],"verify":["/bin/sh","-c","grep -q end {root}/log"]}]}`, "{root}", tree)
	if err := os.WriteFile(decl, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(executorBin, "apply", "--state", state, "--json", decl)
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(log); len(b) > 0 {
			break
		}
		if time.Now().After(until) {
			cmd.Process.Kill()
			t.Fatal("the action did not begin")
		}
	}
	// While it runs, status and owned say so, with its pid.
	running := fmt.Sprintf("last local apply: running now (pid %d)\n", cmd.Process.Pid)
	if res, err := runExecutor(t.Context(), "status", "--state", state); err != nil || !strings.Contains(string(res.stdout), running) {
		t.Fatalf("status while the apply runs: %v\n%s", err, res.stdout)
	}
	if res, err := runExecutor(t.Context(), "owned", "--state", state); err != nil || !strings.Contains(string(res.stdout), fmt.Sprintf("the apply running now (pid %d) is making it", cmd.Process.Pid)) {
		t.Fatalf("owned while the apply runs: %v\n%s", err, res.stdout)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if res, err := runExecutor(t.Context(), "status", "--state", state); err != nil || !strings.Contains(string(res.stdout), "last local apply: cut short since (a kill or a power cut") {
		t.Fatalf("status after the kill: %v\n%s", err, res.stdout)
	}

	next := exec.Command(executorBin, "apply", "--state", state, "--json", decl)
	next.Dir = "/"
	var stdout, stderr syncBuffer
	next.Stdout, next.Stderr = &stdout, &stderr
	if err := next.Start(); err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "a program an executor before this one started is still running"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(until) {
			next.Process.Kill()
			t.Fatalf("the wait was not said: %s", stderr.String())
		}
	}
	if res, err := runExecutor(t.Context(), "status", "--state", state); err != nil || !strings.Contains(string(res.stdout), "last local apply: cut short since (a kill or a power cut") {
		t.Fatalf("status while the next apply waits to begin: %v\n%s%s", err, res.stdout, res.stderr)
	}
	os.WriteFile(filepath.Join(tree, "gate"), nil, 0o644)
	if err := next.Wait(); err != nil {
		t.Fatalf("the next apply: %v, %s %s", err, stdout.String(), stderr.String())
	}
	var rep report
	if err := json.Unmarshal([]byte(stdout.String()), &rep); err != nil || rep.Outcome == "failed" {
		t.Fatalf("the next apply: %v %s", err, stdout.String())
	}
	if b, _ := os.ReadFile(log); string(b) != "start\nend\n" {
		t.Fatalf("the action ran again beside the one left running: %q\nstderr: %s", b, stderr.String())
	}
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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
