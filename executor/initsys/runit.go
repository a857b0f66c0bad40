package initsys

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// runit drives runit through sv and the two directories of its Debian
// layout: the service definitions (/etc/sv/NAME, each a directory with a
// `run` script) and the directory runsvdir scans (/etc/service, which
// Debian points at /etc/runit/runsvdir/current), whose entries are the
// services runit supervises, normally links into /etc/sv.
//
// A unit is known when /etc/sv/NAME or SCANDIR/NAME is a directory
// ("NAME.service" means NAME). It runs when `sv status` says "run:". A
// linked one without a down file that runsv has not taken over yet is
// about to run (runsvdir looks every 5 s): State and Stop wait until runsv
// has it, and answer then.
//
// Runit has no "enable" apart from supervising: runsvdir starts whatever is
// linked into its directory, at once and at every boot, unless the service
// directory holds a file named `down` (runit's own way to keep a service
// from starting on its own). So "enabled" here is: linked into the scanned
// directory and no `down` file; anything else is "disabled". Neither
// SetEnabled starts or stops anything, as with the other inits:
//
//   - enabling a linked service removes its `down` file;
//   - enabling an unlinked one links /etc/sv/NAME into the scanned
//     directory behind a `down` file (so runsv takes it over without
//     starting it), waits until runsvdir has picked it up (it looks every
//     5 s) and `sv status` answers, and then removes the `down` file;
//   - disabling creates the `down` file and leaves the link: removing a
//     link would not stop the service either (runsv waits for it to end),
//     it would only leave it unsupervised.
//
// Start and Restart need the service supervised, that is, linked: runit
// runs nothing it does not supervise, so starting an unlinked service is
// an error that says to declare it enabled. Stopping an unlinked service,
// or a linked one behind a down file that runsv has not taken over yet, is
// nothing to do: it is not running, and will not be.
type runit struct {
	t       tools
	svDir   string        // the service definitions: /etc/sv
	scanDir string        // what runsvdir scans
	pickUp  time.Duration // how long runsvdir may take to take a new link over
	wait    int           // sv -w: seconds sv waits for a change to show
}

// Runit is the runit backend. The scanned directory is the one the running
// runsvdir was given (a child of PID 1 preferred); an error when no
// runsvdir runs.
func Runit(ctx context.Context) (Manager, error) {
	dir, err := runsvdirScans("/proc")
	if err != nil {
		return nil, err
	}
	return &runit{t: newTools("runit"), svDir: "/etc/sv", scanDir: dir, pickUp: 15 * time.Second, wait: 10}, nil
}

// runsvdirScans finds the directory the running runsvdir scans.
func runsvdirScans(proc string) (string, error) {
	ps, err := processes(proc, "runsvdir")
	if err != nil {
		return "", fmt.Errorf("initsys: runit: list processes: %w", err)
	}
	if len(ps) == 0 {
		return "", errors.New("initsys: runit: no runsvdir runs, so nothing supervises services (is runit's stage 2 up?)")
	}
	// runit's stage 2 is PID 1's child; another runsvdir may be a user's.
	for i, p := range ps {
		if p.ppid == 1 {
			ps[0], ps[i] = ps[i], ps[0]
			break
		}
	}
	p := ps[0]
	dir, ok := runsvdirArg(p.args)
	if !ok {
		return "", fmt.Errorf("initsys: runit: runsvdir (pid %d) runs as %q: no directory in it", p.pid, p.args)
	}
	if !filepath.IsAbs(dir) {
		cwd, err := os.Readlink(filepath.Join(proc, fmt.Sprint(p.pid), "cwd"))
		if err != nil {
			return "", fmt.Errorf("initsys: runit: runsvdir (pid %d) scans %q: %w", p.pid, dir, err)
		}
		dir = filepath.Join(cwd, dir)
	}
	return filepath.Clean(dir), nil
}

// runsvdirArg finds the directory in runsvdir's arguments:
// `runsvdir [-P] [-H] dir [log]`.
func runsvdirArg(args []string) (string, bool) {
	if len(args) < 2 {
		return "", false
	}
	for _, a := range args[1:] {
		if a == "-P" || a == "-H" {
			continue
		}
		if a == "" || strings.HasPrefix(a, "-") {
			return "", false
		}
		return a, true
	}
	return "", false
}

// svStatus reads `sv status DIR`: "run: DIR: (pid 96) 1s" runs; "down:"
// and "finish:" do not; "fail: DIR: runsv not running" and "warning: DIR:
// unable to open supervise/ok" say nothing supervises it, so it is not
// running either. Anything else is not understood.
func svStatus(out string, code int) (running, supervised, ok bool) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	switch {
	case code == 0 && strings.HasPrefix(line, "run: "):
		return true, true, true
	case code == 0 && (strings.HasPrefix(line, "down: ") || strings.HasPrefix(line, "finish: ")):
		return false, true, true
	case code != 0 && (strings.HasPrefix(line, "fail: ") && strings.HasSuffix(line, ": runsv not running") ||
		strings.HasPrefix(line, "warning: ") && strings.Contains(line, ": unable to open supervise/ok: ")):
		return false, false, true
	}
	return false, false, false
}

// service is what the backend knows of one service.
type runitService struct {
	name   string
	def    string // /etc/sv/NAME
	linked bool   // SCANDIR/NAME exists
	dir    string // the directory sv is pointed at
}

func (r *runit) service(unit string) (runitService, bool, error) {
	name, err := serviceName("runit", unit)
	if err != nil {
		return runitService{}, false, err
	}
	s := runitService{name: name, def: filepath.Join(r.svDir, name)}
	scanned := filepath.Join(r.scanDir, name)
	if s.linked, err = isDir(scanned); err != nil {
		return s, false, fmt.Errorf("initsys: runit: %w", err)
	}
	if s.linked {
		s.dir = scanned
		return s, true, nil
	}
	known, err := isDir(s.def)
	if err != nil {
		return s, false, fmt.Errorf("initsys: runit: %w", err)
	}
	s.dir = s.def
	return s, known, nil
}

// status asks sv.
func (r *runit) status(ctx context.Context, dir string) (running, supervised bool, err error) {
	res, err := r.t.run(ctx, "sv", "status", dir)
	if err != nil {
		return false, false, err
	}
	running, supervised, ok := svStatus(res.Stdout+"\n"+res.Stderr, res.Code)
	if !ok {
		return false, false, r.t.failure(res, "not a status sv gives")
	}
	return running, supervised, nil
}

func (r *runit) Name() string { return "runit" }
func (r *runit) Close() error { return nil }

func (r *runit) State(ctx context.Context, unit string) (State, error) {
	s, known, err := r.service(unit)
	if err != nil {
		return State{}, err
	}
	st := State{Name: s.name, Known: known}
	if !known {
		return st, nil
	}
	down, err := exists(filepath.Join(s.dir, "down"))
	if err != nil {
		return State{}, fmt.Errorf("initsys: runit: %w", err)
	}
	running, supervised, err := r.status(ctx, s.dir)
	if err != nil {
		return State{}, err
	}
	if s.linked && !down && !supervised {
		// Linked a moment ago (a package's runit-helper did): runsvdir
		// starts it when it next looks. "Not running" would be true for a
		// few seconds only, and a declared stop would be skipped: answer
		// once runsv has it.
		if _, err := r.supervised(ctx, unit); err != nil {
			return State{}, err
		}
		if running, _, err = r.status(ctx, s.dir); err != nil {
			return State{}, err
		}
	}
	st.Running = running
	st.Enabled = "disabled"
	if s.linked && !down {
		st.Enabled = "enabled"
	}
	return st, nil
}

// supervised waits, as long as runsvdir may take, until a linked service
// is supervised; an error when it is not linked or runsvdir does not take
// it over.
func (r *runit) supervised(ctx context.Context, unit string) (runitService, error) {
	s, known, err := r.service(unit)
	if err != nil {
		return s, err
	}
	if !known {
		return s, fmt.Errorf("initsys: runit: no service %s", unit)
	}
	if !s.linked {
		return s, fmt.Errorf("initsys: runit: %s is not linked into %s, and runit runs only what it supervises there: declare it enabled to link it", s.name, r.scanDir)
	}
	ok, err := poll(ctx, r.pickUp, func() (bool, error) {
		_, sup, err := r.status(ctx, s.dir)
		return sup, err
	})
	if err != nil {
		return s, err
	}
	if !ok {
		return s, fmt.Errorf("initsys: runit: runsvdir did not take %s over within %v", s.dir, r.pickUp)
	}
	return s, nil
}

// sv runs `sv -w SECONDS verb DIR`, which waits until the change shows.
func (r *runit) sv(ctx context.Context, verb, dir string) error {
	_, err := r.t.must(ctx, "sv", "-w", fmt.Sprint(r.wait), verb, dir)
	return err
}

func (r *runit) Start(ctx context.Context, unit string) error {
	s, err := r.supervised(ctx, unit)
	if err != nil {
		return err
	}
	return r.sv(ctx, "up", s.dir)
}

// Restart runs `sv restart` and then waits until sv status shows the service
// running under a new pid: sv's own wait compares times in whole seconds,
// so within the second the service last changed it reports success before
// the service has gone down, and runsv waits a second before it starts a
// service again that ran for less than one.
func (r *runit) Restart(ctx context.Context, unit string) error {
	s, err := r.supervised(ctx, unit)
	if err != nil {
		return err
	}
	before, err := r.t.run(ctx, "sv", "status", s.dir)
	if err != nil {
		return err
	}
	old := svPid(before.Stdout)
	if err := r.sv(ctx, "restart", s.dir); err != nil {
		return err
	}
	var last command.Result
	ok, err := poll(ctx, time.Duration(r.wait)*time.Second, func() (bool, error) {
		last, err = r.t.run(ctx, "sv", "status", s.dir)
		pid := svPid(last.Stdout)
		return pid != 0 && pid != old, err
	})
	if err != nil {
		return err
	}
	if !ok {
		return r.t.failure(last, fmt.Sprintf("not running again under a new pid %ds after `sv restart`", r.wait))
	}
	return nil
}

// svPid is the pid of a running service in sv status's first line, "run:
// DIR: (pid 96) 1s"; 0 when it is not running.
func svPid(out string) int {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	rest, ok := strings.CutPrefix(line, "run: ")
	if !ok {
		return 0
	}
	_, rest, ok = strings.Cut(rest, ": (pid ")
	if !ok {
		return 0
	}
	n, _, _ := strings.Cut(rest, ")")
	pid, err := strconv.Atoi(n)
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func (r *runit) Stop(ctx context.Context, unit string) error {
	s, known, err := r.service(unit)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("initsys: runit: no service %s", unit)
	}
	_, supervised, err := r.status(ctx, s.dir)
	if err != nil {
		return err
	}
	if !supervised {
		if !s.linked {
			return nil // runit runs only what it supervises: not running
		}
		down, err := exists(filepath.Join(s.dir, "down"))
		if err != nil {
			return fmt.Errorf("initsys: runit: %w", err)
		}
		if down {
			return nil // runsv will take it over down
		}
		// Saying "stopped" now would be true for a few seconds only:
		// runsvdir starts it when it next looks at its directory.
		if _, err := r.supervised(ctx, unit); err != nil {
			return err
		}
	}
	return r.sv(ctx, "down", s.dir)
}

func (r *runit) SetEnabled(ctx context.Context, unit string, enabled bool) error {
	s, known, err := r.service(unit)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("initsys: runit: no service %s", unit)
	}
	down := filepath.Join(s.dir, "down")
	if !enabled {
		if !s.linked {
			return nil // not supervised, so not started at boot
		}
		if err := touch(down); err != nil {
			return fmt.Errorf("initsys: runit: disable %s: %w", s.name, err)
		}
		return nil
	}
	if s.linked {
		if err := removeFile(down); err != nil {
			return fmt.Errorf("initsys: runit: enable %s: %w", s.name, err)
		}
		return nil
	}
	// Link it behind a down file, so runsv takes it over stopped.
	defDown := filepath.Join(s.def, "down")
	if err := touch(defDown); err != nil {
		return fmt.Errorf("initsys: runit: enable %s: %w", s.name, err)
	}
	link := filepath.Join(r.scanDir, s.name)
	if err := os.Symlink(s.def, link); err != nil {
		return fmt.Errorf("initsys: runit: enable %s: %w", s.name, err)
	}
	if _, err := r.supervised(ctx, s.name); err != nil {
		return fmt.Errorf("%w (linked as %s, with %s left so it does not start on its own)", err, link, defDown)
	}
	if err := removeFile(defDown); err != nil {
		return fmt.Errorf("initsys: runit: enable %s: %w", s.name, err)
	}
	return nil
}

// Reload does nothing: this init reads its service definitions at each use.
func (r *runit) Reload(context.Context) error { return nil }
