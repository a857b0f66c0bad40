package profile

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

func TestRunAnswers(t *testing.T) {
	res, err := run(t.Context(), "sh", "-c", "echo degraded; exit 1")
	if err != nil || res.Code != 1 || res.Stdout != "degraded" {
		t.Fatalf("non-zero exit is an answer: %+v, %v", res, err)
	}
	res, err = run(t.Context(), "sh", "-c", `echo "PATH=$PATH LC_ALL=$LC_ALL HOME=$HOME"`)
	if err != nil || res.Stdout != "PATH="+command.SearchPath+" LC_ALL=C HOME=" {
		t.Fatalf("environment: %+v, %v", res, err)
	}
	if _, err := run(t.Context(), "no-such-command-anywhere"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing command: %v", err)
	}
}

// A command that hangs is killed at the deadline, with whatever it forked.
func TestRunKillsAHangingCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	type outcome struct {
		res command.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := run(ctx, "sh", "-c", "sleep 30 & echo $!; sleep 30")
		done <- outcome{res, err}
	}()

	// The runner must come back within the timeout plus its wait delay.
	outer, stop := context.WithTimeout(t.Context(), 300*time.Millisecond+2500*time.Millisecond)
	defer stop()
	var o outcome
	select {
	case o = <-done:
	case <-outer.Done():
		t.Fatal("run did not return after its context ended")
	}
	if o.err == nil || !strings.Contains(o.err.Error(), "killed") {
		t.Fatalf("hanging command: %+v, err %v; want a killed error", o.res, o.err)
	}

	// The background sleep was in the same process group and must be dead
	// too (gone, or a zombie nobody has reaped yet).
	pid, err := strconv.Atoi(o.res.Stdout)
	if err != nil {
		t.Fatalf("child pid %q: %v", o.res.Stdout, err)
	}
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return // gone
		}
		if f := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+1:]); len(f) > 0 && f[0] == "Z" {
			return
		}
		select {
		case <-outer.Done():
			t.Fatalf("forked child %d survived the kill: %s", pid, stat)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestRunSleepThirty(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := run(ctx, "sleep", "30")
		done <- err
	}()
	outer, stop := context.WithTimeout(t.Context(), 200*time.Millisecond+2500*time.Millisecond)
	defer stop()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("sleep 30 returned no error at a 200ms deadline")
		}
	case <-outer.Done():
		t.Fatal("sleep 30 was not killed at the deadline")
	}
}
