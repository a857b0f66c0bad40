package initsys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// The inits other than systemd are driven through their own programs
// (rc-service, sv, s6-svc, ...), run by executor/command: from a fixed
// search path, never the executor's inherited PATH, with an environment of
// only PATH and LC_ALL=C, standard input from /dev/null, its output
// captured up to a limit, in its own process group, which is killed whole
// when its time is up.

// toolTimeout bounds one program unless the caller's context is shorter.
const toolTimeout = command.DefaultTimeout

// tools runs one init's programs.
type tools struct {
	init    string // "openrc", for messages
	path    string // search path, in PATH's form; command.SearchPath unless a test says otherwise
	timeout time.Duration
}

func newTools(init string) tools {
	return tools{init: init, path: command.SearchPath, timeout: toolTimeout}
}

// output is a program's output for a message: stdout and stderr together.
func output(r command.Result) string {
	switch {
	case r.Stdout == "":
		return r.Stderr
	case r.Stderr == "":
		return r.Stdout
	}
	return r.Stdout + "\n" + r.Stderr
}

// failure is the error for a program that answered something the backend
// cannot accept: its argv, exit status and output.
func (t tools) failure(r command.Result, why string) error {
	msg := fmt.Sprintf("initsys: %s: %q exited %d", t.init, r.Argv, r.Code)
	if why != "" {
		msg += " (" + why + ")"
	}
	if out := output(r); out != "" {
		msg += ": " + out
	} else {
		msg += " with no output"
	}
	return errors.New(msg)
}

// run runs argv and waits for it. A non-zero exit is not an error here (the
// caller reads Result.Code: `rc-service x status` says "stopped" with 3); an
// error means the program is not installed, could not be run or did not
// finish in time.
func (t tools) run(ctx context.Context, argv ...string) (command.Result, error) {
	r, err := command.Run(ctx, argv, command.Options{Path: t.path, Timeout: t.timeout})
	switch {
	case errors.Is(err, command.ErrNotFound):
		return r, fmt.Errorf("initsys: %s: %s is not installed (looked in %s)", t.init, argv[0], t.path)
	case err != nil && output(r) != "":
		return r, fmt.Errorf("initsys: %s: %w: %s", t.init, err, output(r))
	case err != nil:
		return r, fmt.Errorf("initsys: %s: %w", t.init, err)
	}
	return r, nil
}

// must runs argv and fails unless it exits 0.
func (t tools) must(ctx context.Context, argv ...string) (command.Result, error) {
	r, err := t.run(ctx, argv...)
	if err != nil {
		return r, err
	}
	if r.Code != 0 {
		return r, t.failure(r, "")
	}
	return r, nil
}

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
	deadline := clock.Deadline(wait)
	for {
		ok, err := ready()
		if err != nil || ok {
			return ok, err
		}
		if clock.Past(deadline) {
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
