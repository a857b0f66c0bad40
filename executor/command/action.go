package command

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

// A declared action runs by the rules for actions (docs/declaration.md,
// action), which are not Run's: its program is found on the action's own
// PATH (a declaration names what it runs, and its files are the
// declaration's business, not checked for ownership as a tool of the
// machine's is; the PATH itself holds only directories root alone could
// fill), its output is one stream, what it
// leaves in its process group is killed once it exits, and a program that
// ran and failed is an answer, not an error. It lives here so that this
// package stays the only one of the executor that starts a process.

// ActionOutputLimit bounds what of an action's output the host keeps for a
// report.
const ActionOutputLimit = 16 << 10

// ActionEnv is the whole environment an action gets: PATH, SearchPath's
// directories that only root could have filled (SafePath).
func ActionEnv() string { return "PATH=" + SafePath(SearchPath) }

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

// Action runs an action's argument vector the way an action runs: no
// shell, an empty environment but PATH, standard input from /dev/null,
// output captured up to a limit, and its own process group killed whole
// on timeout and once it exits. It reports the exit code (-1
// if it did not exit by itself) and the output.
func Action(ctx context.Context, argv []string, timeout time.Duration) (code int, output string, err error) {
	if len(argv) == 0 {
		return -1, "", errors.New("command: an action with no program")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.Command(argv[0], argv[1:]...)
	// The program is found on the action's own PATH, not the executor's.
	if !strings.Contains(argv[0], "/") {
		cmd.Path, cmd.Err = actionLookPath(argv[0])
	}
	cmd.Env = []string{ActionEnv()}
	cmd.Dir = "/"
	// A process that left the group (setsid) and kept the output open
	// must not hold the executor past the action's end: the pipes are
	// closed a moment after the action itself exits.
	cmd.WaitDelay = 2 * time.Second
	// A nil Stdin is /dev/null to exec.Cmd.
	out := &limitedBuffer{n: ActionOutputLimit}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, "", fmt.Errorf("cannot start %q: %w", argv, err)
	}
	deadline, _ := ctx.Deadline()
	defer note(ctx, cmd.Process.Pid, argv, deadline, stopAction)()
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

// actionLookPath finds a program on the action's PATH.
func actionLookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(SafePath(SearchPath)) {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q is not on the action's PATH (%s)", name, SafePath(SearchPath))
}
