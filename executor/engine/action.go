package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// outputLimit bounds what an action's output the host keeps for a report.
const outputLimit = 16 << 10

// actionPath is the only environment an action gets.
const actionPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// limitedBuffer keeps the first n bytes written and counts the rest.
type limitedBuffer struct {
	buf     bytes.Buffer
	n       int
	dropped int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	room := l.n - l.buf.Len()
	if room > len(p) {
		room = len(p)
	}
	if room > 0 {
		l.buf.Write(p[:room])
	}
	l.dropped += len(p) - room
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	s := strings.TrimSpace(l.buf.String())
	if l.dropped > 0 {
		s += fmt.Sprintf(" … (%d more bytes)", l.dropped)
	}
	return s
}

// runArgv runs an argument vector the way DESIGN.md says an action runs: no
// shell, an empty environment but PATH, standard input from /dev/null,
// output captured up to a limit, and its own process group killed whole on
// timeout. It reports the exit code (-1 if it did not exit by itself) and
// the output.
func runArgv(ctx context.Context, argv []string, timeout time.Duration) (code int, output string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.Command(argv[0], argv[1:]...)
	// The program is found on the action's own PATH, not the executor's.
	if !strings.Contains(argv[0], "/") {
		cmd.Path, cmd.Err = lookPath(argv[0])
	}
	cmd.Env = []string{actionPath}
	cmd.Dir = "/"
	// A process that left the group (setsid) and kept the output open
	// must not hold the executor past the action's end: the pipes are
	// closed a moment after the action itself exits.
	cmd.WaitDelay = 2 * time.Second
	// A nil Stdin is /dev/null to exec.Cmd.
	out := &limitedBuffer{n: outputLimit}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, "", fmt.Errorf("cannot start %q: %w", argv, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// The whole group: a shell's children go with it.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return -1, out.String(), fmt.Errorf("%q did not finish within %s; its process group was killed", argv, timeout)
	}
	// Whatever it left behind in its group goes too.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, exec.ErrWaitDelay) {
		// It exited; something it started outside its group still held
		// the output, which is now cut. Its exit status stands.
		err = nil
		if cmd.ProcessState != nil && !cmd.ProcessState.Success() {
			return cmd.ProcessState.ExitCode(), out.String(), nil
		}
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String(), nil
		}
		return -1, out.String(), fmt.Errorf("running %q failed: %w", argv, err)
	}
	return 0, out.String(), nil
}

func actionDigest(a *shapes.Action) string {
	b, _ := json.Marshal([]any{a.Run, a.Verify, a.Timeout})
	return digest(b)
}

func withOutput(s, out string) string {
	if out == "" {
		return s
	}
	return s + ": " + out
}

// action observes an action by its verify, runs it when verify fails, and
// requires verify to pass afterwards. rest is how many resources follow.
func (r *run) action(st *step, rest int) {
	a := st.res.(*shapes.Action)
	st.entry = r.settle(r.st.Get(st.target), st.claim)
	timeout := time.Duration(a.Timeout) * time.Second
	if a.Timeout == 0 {
		timeout = shapes.DefaultActionTimeout * time.Second
	}
	spec := actionDigest(a)
	entry := &store.Entry{Target: st.target, Type: shapes.TypeAction, Claims: withClaim(st.entry, st.claim), Digest: spec}
	if st.entry != nil {
		entry.Order = st.entry.Order
	}

	code, out, err := runArgv(r.ctx, a.Verify, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("verify: %w", err), rest)
		return
	}
	if code == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, "verify passes"
		if !r.opt.Plan && (st.entry == nil || st.entry.Digest != spec || !st.entry.Claimed(st.claim)) {
			if err := r.st.Put(entry); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	st.line.Outcome = shapes.Applied
	if st.entry != nil && st.entry.Digest == spec {
		st.line.Outcome = shapes.Repaired
	}
	if r.opt.Plan {
		st.line.Detail = withOutput(fmt.Sprintf("verify fails (exit %d); would run %q", code, a.Run), out)
		r.emit(st.line)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "run", Claim: st.claim, Type: shapes.TypeAction}, rest) {
		return
	}
	code, out, err = runArgv(r.ctx, a.Run, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("run: %w", err), rest)
		return
	}
	if code != 0 {
		r.fail(st, errors.New(withOutput(fmt.Sprintf("run %q exited %d", a.Run, code), out)), rest)
		return
	}
	code, vout, err := runArgv(r.ctx, a.Verify, timeout)
	if err != nil {
		r.fail(st, fmt.Errorf("verify after run: %w", err), rest)
		return
	}
	if code != 0 {
		r.fail(st, errors.New(withOutput(fmt.Sprintf("the action ran without error and its own verify still fails (verify %q exited %d)", a.Verify, code), vout)), rest)
		return
	}
	if err := r.st.Put(entry); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := r.st.Commit(); err != nil {
		r.fail(st, err, rest)
		return
	}
	st.line.Detail = withOutput(fmt.Sprintf("ran %q; verify passes", a.Run), out)
	r.emit(st.line)
}

// lookPath finds a program on the action's PATH.
func lookPath(name string) (string, error) {
	for _, dir := range strings.Split(strings.TrimPrefix(actionPath, "PATH="), ":") {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q is not on the action's PATH (%s)", name, strings.TrimPrefix(actionPath, "PATH="))
}

func init() {
	registerAlone(shapes.TypeAction, (*run).action, func(r *run, st *step) {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "an action leaves nothing the host owns"
	})
}
