package overlay

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A WireGuard process being removed is asked to end, killed when it does
// not within the grace, and only then is the removal done: a process that
// ignores SIGTERM is gone when endProcess returns nil, never still running
// behind a reported removal. An ended child not yet reaped (a zombie)
// counts as ended.
func TestEndProcess(t *testing.T) {
	defer func(g time.Duration) { processGrace = g }(processGrace)
	processGrace = 300 * time.Millisecond
	for _, c := range []struct{ name, script string }{
		{"ends on SIGTERM", "exec sleep 60"},
		{"ignores SIGTERM", "trap '' TERM; echo ready; while :; do sleep 0.05; done"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", c.script)
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(c.script, "ready") {
				buf := make([]byte, 6)
				out.Read(buf) // the trap is set
			}
			start := time.Now()
			if err := endProcess(context.Background(), cmd.Process.Pid); err != nil {
				t.Fatalf("endProcess: %v", err)
			}
			// Not reaped yet: a zombie, which kill(pid, 0) still finds.
			if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
				t.Fatalf("the child was reaped by someone else: %v", err)
			}
			err := cmd.Wait()
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			want := syscall.SIGTERM
			if strings.Contains(c.script, "trap") {
				want = syscall.SIGKILL
				if time.Since(start) < processGrace {
					t.Fatalf("killed after %v, before the grace of %v", time.Since(start), processGrace)
				}
			}
			if !ws.Signaled() || ws.Signal() != want {
				t.Fatalf("it ended with %v (%v), want by %v", err, ws, want)
			}
		})
	}
}
