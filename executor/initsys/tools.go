package initsys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The inits other than systemd are driven through their own programs
// (rc-service, sv, s6-svc, ...). Each runs from a fixed search path, never
// the executor's inherited PATH, with an environment of only PATH, standard
// input from /dev/null, its output captured up to a limit, in its own
// process group, which is killed whole when its time is up.

// toolPath is where the init's programs are looked for.
var toolPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// toolOutputLimit caps what is kept of a program's output.
const toolOutputLimit = 64 << 10

// toolTimeout bounds one program unless the caller's context is shorter.
const toolTimeout = 60 * time.Second

// tools runs one init's programs.
type tools struct {
	init    string   // "openrc", for messages
	path    []string // search path; toolPath unless a test says otherwise
	timeout time.Duration
}

func newTools(init string) tools { return tools{init: init, path: toolPath, timeout: toolTimeout} }

// result is what one program did.
type result struct {
	argv           []string
	stdout, stderr string // trimmed, capped
	code           int    // exit status
}

// output is the program's output for a message: stdout and stderr together.
func (r result) output() string {
	switch {
	case r.stdout == "":
		return r.stderr
	case r.stderr == "":
		return r.stdout
	}
	return r.stdout + "\n" + r.stderr
}

// failure is the error for a program that answered something the backend
// cannot accept: its argv, exit status and output.
func (t tools) failure(r result, why string) error {
	msg := fmt.Sprintf("initsys: %s: %q exited %d", t.init, r.argv, r.code)
	if why != "" {
		msg += " (" + why + ")"
	}
	if out := r.output(); out != "" {
		msg += ": " + out
	} else {
		msg += " with no output"
	}
	return errors.New(msg)
}

// lookPath finds an executable regular file named name in the search path.
func (t tools) lookPath(name string) (string, error) {
	for _, dir := range t.path {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("initsys: %s: %s is not installed (looked in %s)", t.init, name, strings.Join(t.path, ":"))
}

// run runs argv and waits for it. A non-zero exit is not an error here (the
// caller reads result.code: `rc-service x status` says "stopped" with 3); an
// error means the program could not be run or did not finish in time.
func (t tools) run(ctx context.Context, argv ...string) (result, error) {
	res := result{argv: argv, code: -1}
	bin, err := t.lookPath(argv[0])
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = []string{"PATH=" + strings.Join(t.path, ":")}
	cmd.Dir = "/"
	// Stdin nil is /dev/null.
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A daemon the program leaves behind (OpenRC's supervise-daemon) may
	// keep its output open; the program's own exit is what counts.
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Run()
	res.stdout, res.stderr = strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String())
	if cmd.ProcessState != nil {
		res.code = cmd.ProcessState.ExitCode()
	}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil && (err != nil || res.code != 0):
		return res, fmt.Errorf("initsys: %s: %q killed, no answer in time (%v): %s", t.init, argv, ctx.Err(), res.output())
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		return res, nil
	case errors.As(err, &exit) && exit.Exited():
		return res, nil
	default:
		return res, fmt.Errorf("initsys: %s: %q: %v: %s", t.init, argv, err, res.output())
	}
}

// must runs argv and fails unless it exits 0.
func (t tools) must(ctx context.Context, argv ...string) (result, error) {
	r, err := t.run(ctx, argv...)
	if err != nil {
		return r, err
	}
	if r.code != 0 {
		return r, t.failure(r, "")
	}
	return r, nil
}

// capped keeps the first toolOutputLimit bytes and accepts the rest, so a
// chatty program never blocks on its output.
type capped struct{ buf bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := toolOutputLimit - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }

// serviceName turns a declared unit into the name an init other than
// systemd knows: "x.service" means "x". A name that could leave the
// init's directory, be taken for an option, or be hidden from a scanner
// (runsvdir and s6-svscan skip names starting with a dot) is refused.
func serviceName(init, unit string) (string, error) {
	name := strings.TrimSuffix(unit, ".service")
	if name == "" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "-") ||
		strings.ContainsAny(name, "/\x00 \t\n") {
		return "", fmt.Errorf("initsys: %s: %q is not a service name %s can have", init, unit, init)
	}
	return name, nil
}

// exists reports whether p exists, not following a final symbolic link.
func exists(p string) (bool, error) {
	_, err := os.Lstat(p)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, err
}

// isDir reports whether p is a directory, following symbolic links.
func isDir(p string) (bool, error) {
	fi, err := os.Stat(p)
	if err == nil {
		return fi.IsDir(), nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, err
}

// touch creates an empty file p (mode 0644) if it is missing. A final
// symbolic link is not followed.
func touch(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// removeFile removes p; a missing p is fine.
func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// poll calls ready every interval until it says true, fails, or wait is over.
func poll(ctx context.Context, wait time.Duration, ready func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		ok, err := ready()
		if err != nil || ok {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// process is a running process as /proc shows it.
type process struct {
	pid, ppid int
	comm      string
	args      []string
}

// processes lists the processes whose comm is name.
func processes(proc, name string) ([]process, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	var out []process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != name {
			continue
		}
		p := process{pid: pid, comm: name, ppid: -1}
		if st, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat")); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces and parentheses.
			if i := bytes.LastIndexByte(st, ')'); i >= 0 {
				if f := strings.Fields(string(st[i+1:])); len(f) >= 2 {
					p.ppid, _ = strconv.Atoi(f[1])
				}
			}
		}
		if cl, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline")); err == nil {
			p.args = strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		}
		out = append(out, p)
	}
	return out, nil
}
