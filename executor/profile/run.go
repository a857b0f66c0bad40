package profile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// searchPath is where probes look for commands. It is fixed rather than
// inherited: the executor runs as root and must not be steered by whatever
// PATH it was started with.
var searchPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// outputLimit caps what a probe keeps of a command's output.
const outputLimit = 64 << 10

// waitDelay is how long a killed command's pipes may stay open before they
// are closed under it.
const waitDelay = 500 * time.Millisecond

// lookPath finds an executable regular file named name in searchPath.
func lookPath(name string) (string, error) {
	for _, dir := range searchPath {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", name)
}

// result is what one command did. Code is its exit status; Stdout and
// Stderr are trimmed and capped at outputLimit.
type result struct {
	Stdout, Stderr string
	Code           int
}

// run runs name with args and waits for it, bounded by ctx. The command
// gets an environment of only PATH and LC_ALL=C, stdin from /dev/null, and
// its own process group, which is killed whole when ctx ends. A non-zero
// exit is not an error (Code says it; "degraded" is such an answer); an
// error means the command could not be started or did not finish.
func run(ctx context.Context, name string, args ...string) (result, error) {
	path, err := lookPath(name)
	if err != nil {
		return result{}, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=" + strings.Join(searchPath, ":"), "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The negative pid names the group: the command and anything it forked.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = waitDelay
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	err = cmd.Run()
	res := result{Stdout: strings.TrimSpace(stdout.String()), Stderr: strings.TrimSpace(stderr.String()), Code: -1}
	if cmd.ProcessState != nil {
		res.Code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("%s: killed, no answer in time: %w", name, ctx.Err())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return res, nil
	case errors.As(err, &exit) && exit.Exited():
		return res, nil
	default:
		return res, fmt.Errorf("%s: %w", name, err)
	}
}

// describe renders what a command answered, for a reason: its output (or
// its stderr) and its exit status when that is not zero.
func describe(res result) string {
	out := res.Stdout
	if out == "" {
		out = res.Stderr
	}
	if i := strings.IndexByte(out, '\n'); i >= 0 {
		out = out[:i]
	}
	switch {
	case out == "":
		return fmt.Sprintf("exit %d", res.Code)
	case res.Code != 0:
		return fmt.Sprintf("%q, exit %d", out, res.Code)
	default:
		return fmt.Sprintf("%q", out)
	}
}

// capped is a buffer that keeps the first outputLimit bytes and discards
// the rest while still accepting them, so a chatty command never blocks.
type capped struct{ buf bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := outputLimit - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }
