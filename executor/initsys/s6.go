package initsys

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// s6 drives plain s6 (s6-svscan over a scan directory, no s6-rc) through
// s6-svstat, s6-svc, s6-svok and s6-svscanctl.
//
// A unit is a service directory SCANDIR/NAME ("NAME.service" means NAME),
// SCANDIR being the directory the running s6-svscan scans. It runs when
// `s6-svstat -o up` says "true". Enabled is s6's own notion: a service
// directory without a `down` file is started by its supervisor when that
// starts (at boot), one with it is not; SetEnabled removes or creates that
// file and neither starts nor stops the service. A service directory that
// s6-svscan has not taken over yet is not running; Start and Restart first
// make s6-svscan rescan (s6-svscanctl -a) and wait for its supervisor.
type s6 struct {
	t       tools
	scanDir string
	timeout time.Duration // how long s6-svc waits for a change to show
	pickUp  time.Duration // how long a rescan may take to supervise a service
}

// S6 is the s6 backend; the scan directory is the running s6-svscan's
// (PID 1's when it is s6-svscan), an error when none runs.
func S6(ctx context.Context) (Manager, error) {
	dir, err := svscanScans("/proc")
	if err != nil {
		return nil, err
	}
	return &s6{t: newTools("s6"), scanDir: dir, timeout: 10 * time.Second, pickUp: 5 * time.Second}, nil
}

// svscanScans finds the directory the running s6-svscan scans: its working
// directory (s6-svscan changes into it), else the directory named on its
// command line.
func svscanScans(proc string) (string, error) {
	ps, err := processes(proc, "s6-svscan")
	if err != nil {
		return "", fmt.Errorf("initsys: s6: list processes: %w", err)
	}
	if len(ps) == 0 {
		return "", errors.New("initsys: s6: no s6-svscan runs, so nothing supervises services")
	}
	for i, p := range ps {
		if p.pid == 1 {
			ps[0], ps[i] = ps[i], ps[0]
			break
		}
	}
	p := ps[0]
	if cwd, err := os.Readlink(filepath.Join(proc, fmt.Sprint(p.pid), "cwd")); err == nil && filepath.IsAbs(cwd) {
		return filepath.Clean(cwd), nil
	}
	if dir, ok := svscanArg(p.args); ok && filepath.IsAbs(dir) {
		return filepath.Clean(dir), nil
	}
	return "", fmt.Errorf("initsys: s6: cannot tell which directory s6-svscan (pid %d, %q) scans", p.pid, p.args)
}

// svscanArg finds the directory in s6-svscan's arguments:
// `s6-svscan [-c max] [-C max] [-L max] [-t rescan] [-d notif] [-X fd] [dir]`.
func svscanArg(args []string) (string, bool) {
	if len(args) < 2 {
		return "", false
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", false
		case strings.HasPrefix(a, "-") && len(a) > 1:
			if len(a) == 2 && strings.ContainsRune("cCLtdX", rune(a[1])) {
				i++ // the option's value
			}
		default:
			return a, true
		}
	}
	return "", false
}

// svstatUp reads `s6-svstat -o up DIR`: "true" or "false" with exit 0;
// exit 1 is s6-svstat's "s6-supervise not running": nothing supervises it,
// so it is not running. Anything else is not understood.
func svstatUp(out string, code int) (running, supervised, ok bool) {
	switch {
	case code == 0 && strings.TrimSpace(out) == "true":
		return true, true, true
	case code == 0 && strings.TrimSpace(out) == "false":
		return false, true, true
	case code == 1:
		return false, false, true
	}
	return false, false, false
}

func (s *s6) Name() string { return "s6" }
func (s *s6) Close() error { return nil }

// dir gives the service directory of unit, and whether it exists.
func (s *s6) dir(unit string) (string, string, bool, error) {
	name, err := serviceName("s6", unit)
	if err != nil {
		return "", "", false, err
	}
	dir := filepath.Join(s.scanDir, name)
	ok, err := isDir(dir)
	if err != nil {
		return "", "", false, fmt.Errorf("initsys: s6: %w", err)
	}
	return name, dir, ok, nil
}

func (s *s6) status(ctx context.Context, dir string) (running, supervised bool, err error) {
	r, err := s.t.run(ctx, "s6-svstat", "-o", "up", dir)
	if err != nil {
		return false, false, err
	}
	running, supervised, ok := svstatUp(r.Stdout, r.Code)
	if !ok {
		return false, false, s.t.failure(r, "not a status s6-svstat gives")
	}
	return running, supervised, nil
}

func (s *s6) State(ctx context.Context, unit string) (State, error) {
	name, dir, known, err := s.dir(unit)
	if err != nil {
		return State{}, err
	}
	st := State{Name: name, Known: known}
	if !known {
		return st, nil
	}
	if st.Running, _, err = s.status(ctx, dir); err != nil {
		return State{}, err
	}
	down, err := exists(filepath.Join(dir, "down"))
	if err != nil {
		return State{}, fmt.Errorf("initsys: s6: %w", err)
	}
	st.Enabled = "enabled"
	if down {
		st.Enabled = "disabled"
	}
	return st, nil
}

// supervised makes sure a supervisor runs for the service, asking
// s6-svscan to rescan when none does yet.
func (s *s6) supervised(ctx context.Context, unit string) (string, bool, error) {
	_, dir, known, err := s.dir(unit)
	if err != nil {
		return "", false, err
	}
	if !known {
		return "", false, fmt.Errorf("initsys: s6: no service directory %s", filepath.Join(s.scanDir, unit))
	}
	running, sup, err := s.status(ctx, dir)
	if err != nil || sup {
		return dir, running, err
	}
	if _, err := s.t.must(ctx, "s6-svscanctl", "-a", s.scanDir); err != nil {
		return "", false, err
	}
	ok, err := poll(ctx, s.pickUp, func() (bool, error) {
		r, err := s.t.run(ctx, "s6-svok", dir)
		return err == nil && r.Code == 0, err
	})
	if err != nil {
		return "", false, err
	}
	if !ok {
		return "", false, fmt.Errorf("initsys: s6: s6-svscan did not supervise %s within %v of a rescan", dir, s.pickUp)
	}
	running, _, err = s.status(ctx, dir)
	return dir, running, err
}

// svc runs `s6-svc -wX -T MS -X DIR`, which waits until the change shows.
func (s *s6) svc(ctx context.Context, wait, cmd, dir string) error {
	_, err := s.t.must(ctx, "s6-svc", "-w"+wait, "-T", fmt.Sprint(s.timeout.Milliseconds()), "-"+cmd, dir)
	return err
}

func (s *s6) Start(ctx context.Context, unit string) error {
	dir, running, err := s.supervised(ctx, unit)
	if err != nil || running {
		return err
	}
	return s.svc(ctx, "u", "u", dir)
}

// Restart restarts a running service; a stopped one is started, as
// systemd's restart does.
func (s *s6) Restart(ctx context.Context, unit string) error {
	dir, running, err := s.supervised(ctx, unit)
	if err != nil {
		return err
	}
	if !running {
		return s.svc(ctx, "u", "u", dir)
	}
	return s.svc(ctx, "r", "r", dir)
}

func (s *s6) Stop(ctx context.Context, unit string) error {
	_, dir, known, err := s.dir(unit)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("initsys: s6: no service directory %s", filepath.Join(s.scanDir, unit))
	}
	_, sup, err := s.status(ctx, dir)
	if err != nil || !sup {
		return err // not supervised: not running
	}
	return s.svc(ctx, "d", "d", dir)
}

func (s *s6) SetEnabled(ctx context.Context, unit string, enabled bool) error {
	name, dir, known, err := s.dir(unit)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("initsys: s6: no service directory %s", filepath.Join(s.scanDir, name))
	}
	down := filepath.Join(dir, "down")
	if enabled {
		err = removeFile(down)
	} else {
		err = touch(down)
	}
	if err != nil {
		return fmt.Errorf("initsys: s6: set %s enabled=%v: %w", name, enabled, err)
	}
	return nil
}

// Reload does nothing: this init reads its service definitions at each use.
func (s *s6) Reload(context.Context) error { return nil }
