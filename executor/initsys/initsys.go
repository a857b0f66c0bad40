// Package initsys is the executor's one seam to the machine's init: what
// state a unit is in, and starting, stopping, restarting, enabling and
// disabling it. The engine talks to a Manager and never to D-Bus or an
// init's tools directly, so its logic (ADR 0118's giving back) is tested
// against a transcript, and each backend against a real init in the lab.
//
// Backends: systemd over D-Bus (godbus); OpenRC, runit and s6 through
// their own tools (openrc.go, runit.go, s6.go), chosen by Detect from PID 1
// — never from directories a package install may have left behind.
package initsys

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// State is what the init says of a unit.
type State struct {
	Name    string // the unit's canonical name, aliases resolved
	Known   bool   // the init has the unit (a unit file or script exists)
	Running bool
	// Enabled is the enablement at boot: "enabled", "disabled", "static",
	// "masked", "indirect", or "" when the init has no such notion.
	Enabled string
}

// IsEnabled reports whether the unit starts at boot.
func (s State) IsEnabled() bool { return s.Enabled == "enabled" || s.Enabled == "enabled-runtime" }

// Manager is an init the executor can drive. Every method waits until the
// init says the change is done (or failed).
type Manager interface {
	Name() string
	// State reads a unit's state; an unknown unit is Known=false, no error.
	State(ctx context.Context, unit string) (State, error)
	Start(ctx context.Context, unit string) error
	Stop(ctx context.Context, unit string) error
	Restart(ctx context.Context, unit string) error
	SetEnabled(ctx context.Context, unit string, enabled bool) error
	// Reload makes the init read its unit files again, after the host
	// changed one (systemd's daemon-reload; the others read their
	// scripts at each use, and do nothing).
	Reload(ctx context.Context) error
	Close() error
}

// ErrNoInit is returned by Detect where no init this host can drive runs.
var ErrNoInit = errors.New("initsys: no init this host can drive")

// Detect finds the machine's init by what runs as PID 1, never by what
// directories a package left behind (installing openrc creates
// /etc/runlevels and /run/openrc on any host): systemd when it is running
// (its runtime directory /run/systemd/system exists) and its bus answers;
// OpenRC when PID 1 is openrc-init, or sysvinit's init with OpenRC's
// /run/openrc/softlevel present; runit when PID 1 is runit; s6 when PID 1 is
// s6-svscan. Anything else is ErrNoInit, naming PID 1.
func Detect(ctx context.Context) (Manager, error) {
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		m, err := Systemd(ctx, "")
		if err != nil {
			return nil, fmt.Errorf("%w: systemd is running but its bus did not answer: %v", ErrNoInit, err)
		}
		return m, nil
	}
	comm, _ := os.ReadFile("/proc/1/comm")
	exe, _ := os.Readlink("/proc/1/exe")
	_, err := os.Stat("/run/openrc/softlevel")
	switch pid1Init(string(trim(comm)), exe, err == nil) {
	case "openrc":
		return OpenRC(), nil
	case "runit":
		return Runit(ctx)
	case "s6":
		return S6(ctx)
	}
	pid1 := fmt.Sprintf("%q", trim(comm))
	if exe != "" {
		pid1 += " (" + exe + ")"
	}
	return nil, fmt.Errorf("%w (pid 1 is %s; this host drives systemd, OpenRC, runit and s6)", ErrNoInit, pid1)
}

// pid1Init names the init PID 1 is, from its comm and its executable's path
// ("" when it is none this host drives). openrc tells whether OpenRC has
// booted the machine (/run/openrc/softlevel exists), which is what makes
// sysvinit's init an OpenRC machine.
func pid1Init(comm, exe string, openrc bool) string {
	base := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
	is := func(name string) bool { return comm == name || base == name }
	switch {
	case is("openrc-init"):
		return "openrc"
	case is("init") && openrc:
		return "openrc"
	case is("runit"):
		return "runit"
	case is("s6-svscan"):
		return "s6"
	}
	return ""
}

func trim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// Android reports whether this machine is Android, where the host may drive
// no init (init.rc services answer to the platform, not to a root helper):
// the executor is then a partial host by itself. root prefixes the paths
// read ("" for "/"): Android's build properties, and PID 1 being
// /system/bin/init.
func Android(root string) bool {
	if _, err := os.Stat(filepath.Join(root, "/system/build.prop")); err != nil {
		return false
	}
	exe, err := os.Readlink(filepath.Join(root, "/proc/1/exe"))
	if err != nil {
		// Not allowed to look (SELinux): the build properties are enough.
		return true
	}
	return strings.TrimSuffix(exe, " (deleted)") == "/system/bin/init" || strings.HasSuffix(exe, "/init")
}
