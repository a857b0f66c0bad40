// Package command is the one place that says how the root executor runs a
// program of the machine's: getent, useradd, ip, iptables, rc-service, a
// package manager, the installed host's own binary. The executor runs as
// root, started by whatever started it, so nothing it inherited may steer
// what runs or how:
//
//   - a bare name is looked for in SearchPath, a fixed list, never in the
//     PATH the executor was started with (a root shell's PATH may name a
//     directory someone else can write); an absolute name is used as given;
//     either way it must be an executable regular file that only root could
//     have put there (its file, its directory and the directory naming it
//     root's and writable by no group or other);
//   - the program's environment is PATH=SearchPath and LC_ALL=C (so its
//     output is the one the caller parses), plus the variables a caller
//     names; nothing of the executor's own environment (LD_PRELOAD, HOME,
//     a proxy) reaches it;
//   - standard input is /dev/null and the working directory is "/";
//   - it runs in a process group of its own, killed whole (SIGKILL to the
//     group) when the caller's context ends or its timeout passes;
//   - its standard output and standard error are each kept up to
//     OutputLimit, and the rest is read and dropped, so a chatty program is
//     never blocked on a full pipe;
//   - a process it leaves behind holding its output cannot hold Run: the
//     pipes are closed shortly after the program itself is done.
//
// A declared action is run here too, but by the rules for
// actions, not Run's (Action: the action's PATH only, one combined output,
// what is left in the group killed after the action exits): so this is the
// one package of the executor that starts a process (an import rule holds
// it). Run does not kill what a program leaves running after it exits by
// itself: an init's tool (rc-service start) is expected to leave a daemon
// behind. Like os/exec, it never invokes a shell.
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

// SearchPath is where a bare program name is looked for, in order, and the
// PATH every program is given. It is fixed: never the executor's inherited
// PATH.
const SearchPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// OutputLimit is how much of each of a program's standard output and
// standard error is kept.
const OutputLimit = 64 << 10

// DefaultTimeout bounds a program when Options.Timeout is zero and the
// caller's context does not end sooner.
const DefaultTimeout = 60 * time.Second

// waitDelay is how long Run waits, once the program is done (or killed),
// for its output pipes to close before it closes them itself: a daemon it
// left behind may hold them. It is short enough that a profile probe killed
// at its deadline still answers within the profile's second of grace.
const waitDelay = 500 * time.Millisecond

// ErrNotFound is wrapped by the error LookPath and Run return when a bare
// name is in no directory of the search path, or an absolute one does not
// exist.
var ErrNotFound = errors.New("not found")

// Options are what a caller may change about how a program runs. The zero
// value is the usual: DefaultTimeout, SearchPath, no extra variables.
type Options struct {
	// Env holds extra "NAME=value" variables, given after PATH and
	// LC_ALL=C; it may not name either of those.
	Env []string
	// Timeout bounds the program unless the context ends sooner; zero
	// means DefaultTimeout.
	Timeout time.Duration
	// Session starts the program in a session of its own (setsid), not only
	// a process group of its own: for a program that daemonises (wireguard-go
	// without -f), so what it leaves behind shares nothing with the
	// executor's session. Its group is still killed if it is not done in time.
	Session bool
	// Path replaces SearchPath, in PATH's form, both to find a bare name and
	// as the program's PATH. Only tests set it, to put fake tools first.
	Path string
	// Gentle, for a package manager: at the deadline or cancellation only
	// the program itself is asked to stop (SIGTERM, then SIGKILL after
	// gentleGrace), never its process group, so the back end it runs
	// (dpkg) finishes its transaction rather than leave the package
	// database half configured for every later install.
	Gentle bool
}

// gentleGrace is how long a Gentle program has between SIGTERM and SIGKILL.
const gentleGrace = 10 * time.Second

// Result is what one program did.
type Result struct {
	Argv []string
	// Stdout and Stderr are the first OutputLimit bytes of each, trimmed of
	// surrounding white space.
	Stdout, Stderr string
	// Code is the exit status; -1 when the program did not exit by itself
	// (it was killed, or never started).
	Code int
}

// ErrorLine is the one line of a failed program's output that says what
// went wrong, for a report that has room for one: the first line, of
// standard error and then of standard output, that says an error (see
// errorWords, case aside); failing that, the last line of standard error,
// else of standard output, that is not decoration (a box drawn around a
// banner, a rule of dashes); failing that, the last non-empty line. ""
// when the program printed nothing.
//
// It is one rule for every caller, because a last line is often not the
// error: wireguard-go prints its error to standard output and then a boxed
// banner to standard error, and its box's bottom edge ("└───…┘") was
// reported in place of "UAPI listen error: unix socket in use".
func (r Result) ErrorLine() string {
	streams := [][]string{nonEmptyLines(r.Stderr), nonEmptyLines(r.Stdout)}
	for _, lines := range streams {
		for _, l := range lines {
			if !decoration(l) && saysError(l) {
				return l
			}
		}
	}
	for _, lines := range streams {
		for i := len(lines) - 1; i >= 0; i-- {
			if !decoration(lines[i]) {
				return lines[i]
			}
		}
	}
	for _, lines := range streams {
		if len(lines) > 0 {
			return lines[len(lines)-1]
		}
	}
	return ""
}

// nonEmptyLines is s's lines, trimmed, the empty ones left out.
func nonEmptyLines(s string) []string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// errorWords are what a line that says an error says, in lower case.
var errorWords = []string{"error", "failed", "failure", "fatal", "cannot", "can't", "unable", "denied", "not permitted", "no such"}

func saysError(line string) bool {
	l := strings.ToLower(line)
	for _, w := range errorWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

// decoration tells a line of a drawn box or banner: one that begins or
// ends with a box-drawing or block character (U+2500–U+259F: the box's
// edges and its framed text alike), or is made of rule characters alone.
func decoration(line string) bool {
	box := func(r rune) bool { return r >= 0x2500 && r <= 0x259F }
	rs := []rune(line)
	if box(rs[0]) || box(rs[len(rs)-1]) {
		return true
	}
	for _, r := range rs {
		if !strings.ContainsRune("-=_*#~+|. \t", r) {
			return false
		}
	}
	return true
}

// LookPath finds the program name names: an absolute name as given, a bare
// name in SearchPath's safe directories (SafePath), never in the inherited
// PATH. Either way it must be an executable regular file only root could
// have put there, and what it returns is the file itself, every link on
// the way resolved: that is what is run, so no link can be swapped between
// the check and the exec. A relative name with a slash is refused.
func LookPath(name string) (string, error) { return lookPath(name, SearchPath) }

func lookPath(name, path string) (string, error) {
	if filepath.IsAbs(name) {
		return executable(name)
	}
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return "", fmt.Errorf("command: %q is neither an absolute path nor a bare name", name)
	}
	var refused error // a copy found but not run, said if no other is
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // "" or "." would mean the working directory
		}
		var p string
		err := searchDir(dir)
		if err == nil {
			p, err = executable(filepath.Join(dir, name))
		} else if _, serr := os.Stat(filepath.Join(dir, name)); serr == nil {
			err = fmt.Errorf("command: %s is not run: %w", filepath.Join(dir, name), err)
		} else {
			err = ErrNotFound
		}
		if err == nil {
			return p, nil
		}
		if refused == nil && !errors.Is(err, ErrNotFound) {
			refused = err
		}
	}
	if refused != nil {
		return "", refused
	}
	return "", fmt.Errorf("command: %s: %w in %s", name, ErrNotFound, path)
}

// executable returns the file p names, every symbolic link resolved
// (/sbin/iptables is one on most machines), if it is an executable regular
// file that only root (or the executor's own user) could have put there:
// the file is owned by root or the executor's user and writable by no group
// or other, and so is every directory on its resolved path and on the path
// that names it — or, for a directory, it has the sticky bit (/tmp), which
// keeps others from renaming or removing what root owns in it. Root running
// a program any user could replace would be that user running it as root (a
// /usr/local/bin left group-writable for "staff" is the classic case).
func executable(p string) (string, error) {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("command: %s: %w", p, ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("command: %w", err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("command: %s is not an executable regular file (%v)", p, fi.Mode())
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("command: %w", err)
	}
	if err := onlyRootWrites(real, false); err != nil {
		return "", fmt.Errorf("command: %s is not run: %w", p, err)
	}
	for _, d := range []string{filepath.Dir(real), filepath.Dir(p)} {
		if err := onlyRootAbove(d, true); err != nil {
			return "", fmt.Errorf("command: %s is not run: %w", p, err)
		}
	}
	return real, nil
}

// onlyRootAbove is onlyRootWrites for the directory d and each directory
// above it: whoever may write one of them may rename what is below. sticky
// accepts d itself with the sticky bit; those above always may have it.
func onlyRootAbove(d string, sticky bool) error {
	for {
		if err := onlyRootWrites(d, sticky); err != nil {
			return err
		}
		up := filepath.Dir(d)
		if up == d {
			return nil
		}
		d, sticky = up, true
	}
}

// searchDir says whether dir may be searched for a program, and handed to
// one as its PATH: only root could add a name to it (no sticky exception:
// in /tmp anyone may create one), nor rename it or a directory above.
func searchDir(dir string) error { return onlyRootAbove(dir, false) }

// SafePath is the directories of path (in PATH's form) that only root could
// have filled (searchDir), in order: the search path a program is given as
// its own PATH. A directory others could write is left out rather than
// given to a program that runs its helpers by name (dpkg runs ldconfig, a
// maintainer script systemctl).
func SafePath(path string) string {
	var keep []string
	for _, dir := range filepath.SplitList(path) {
		if filepath.IsAbs(dir) && searchDir(dir) == nil {
			keep = append(keep, dir)
		}
	}
	return strings.Join(keep, ":")
}

// onlyRootWrites refuses q (followed if a link) if anyone but root or the
// executor's own user owns it, or group or others may write it — unless
// sticky allows a directory with the sticky bit.
func onlyRootWrites(q string, sticky bool) error {
	fi, err := os.Stat(q)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", q)
	}
	switch uid := int(st.Uid); {
	case uid != 0 && uid != os.Geteuid():
		return fmt.Errorf("%s is owned by uid %d, who could replace it", q, uid)
	case fi.Mode().Perm()&0o022 != 0 && !(sticky && fi.IsDir() && fi.Mode()&os.ModeSticky != 0):
		return fmt.Errorf("%s has mode %04o: its group or others could replace it", q, fi.Mode().Perm())
	}
	return nil
}

// Run runs argv and waits for it, as the package doc says: argv[0] through
// LookPath (or Options.Path), an environment of PATH, LC_ALL=C and
// Options.Env only, stdin /dev/null, in "/", in a process group of its own
// that is killed whole when ctx ends or the timeout passes.
//
// A program that exits by itself has answered, whatever its status:
// Result.Code says it, and the error is nil (`systemctl is-system-running`
// says "degraded" with exit 1; getent says "no such entry" with 2). An error
// means the program could not be found or started, or did not exit by
// itself: killed at the deadline or cancellation, or by a signal. It names
// argv, and wraps ErrNotFound, context.DeadlineExceeded or context.Canceled
// where one of those is why.
func Run(ctx context.Context, argv []string, opts Options) (Result, error) {
	res := Result{Argv: argv, Code: -1}
	if len(argv) == 0 {
		return res, errors.New("command: no program to run")
	}
	path := opts.Path
	if path == "" {
		path = SearchPath
	}
	for _, kv := range opts.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || name == "PATH" || name == "LC_ALL" {
			return res, fmt.Errorf("command: %q: %q is not an extra variable it may be given", argv, kv)
		}
	}
	bin, err := lookPath(argv[0], path)
	if err != nil {
		return res, err
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, bin, argv[1:]...)
	cmd.Args[0] = argv[0] // the name as the caller gave it
	cmd.Env = append([]string{"PATH=" + SafePath(path), "LC_ALL=C"}, opts.Env...)
	cmd.Dir = "/"
	// A nil Stdin is /dev/null to exec.Cmd.
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Setsid also makes the program the leader of a new process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !opts.Session, Setsid: opts.Session}
	cmd.Cancel = func() error {
		// The negative pid names the group: the program and what it forked.
		target, sig := -cmd.Process.Pid, syscall.SIGKILL
		if opts.Gentle {
			target, sig = cmd.Process.Pid, syscall.SIGTERM
		}
		err := syscall.Kill(target, sig)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = waitDelay
	if opts.Gentle {
		cmd.WaitDelay = gentleGrace // then the program itself is killed
	}

	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("command: cannot start %q: %w", argv, err)
	}
	deadline, _ := ctx.Deadline()
	how := ""
	if opts.Gentle {
		how = stopGentle
	}
	defer note(ctx, cmd.Process.Pid, argv, deadline, how)()
	err = cmd.Wait()
	res.Stdout, res.Stderr = strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String())
	st := cmd.ProcessState
	if st != nil {
		res.Code = st.ExitCode()
	}
	switch {
	case st != nil && st.Exited():
		// Its own answer, even if the context ended as it exited, or
		// something it left behind held the output past waitDelay.
		return res, nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return res, fmt.Errorf("command: %q killed, no answer in time (%w)", argv, ctx.Err())
	case ctx.Err() != nil:
		return res, fmt.Errorf("command: %q killed: %w", argv, ctx.Err())
	default:
		return res, fmt.Errorf("command: %q: %w", argv, err)
	}
}

// capped keeps the first OutputLimit bytes written and accepts the rest, so
// the program never blocks on its output.
type capped struct{ buf bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := OutputLimit - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }
