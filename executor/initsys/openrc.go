package initsys

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// openrc drives OpenRC through its own programs: rc-service for the state
// and for starting and stopping, rc-update for the runlevels.
//
// A unit is a script /etc/init.d/NAME ("NAME.service" means NAME; State.Name
// is the bare name). It runs when `rc-service NAME status` exits 0 and is
// stopped when it exits 3; any other answer (starting, stopping, inactive,
// crashed) is an error that carries rc-service's words, never a guess.
// Enabled means started at boot: the script is in one of the runlevels a
// boot passes through (sysinit, boot, default); enabling adds it to
// default, disabling removes it from each of those that holds it. Neither
// starts nor stops it.
type openrc struct {
	t         tools
	initd     string   // where the scripts are: /etc/init.d
	runlevels string   // /etc/runlevels
	bootLevel []string // the runlevels a boot passes through, in order
}

// OpenRC is the OpenRC backend. It needs OpenRC to be the running init
// (rc-service refuses otherwise); Detect checks that.
func OpenRC() Manager {
	return &openrc{t: newTools("openrc"), initd: "/etc/init.d", runlevels: "/etc/runlevels",
		bootLevel: []string{"sysinit", "boot", "default"}}
}

func (o *openrc) Name() string { return "openrc" }
func (o *openrc) Close() error { return nil }

// openrcStatus reads the exit status of `rc-service NAME status`
// (openrc-run's _status: 0 started, 3 stopped, 4 stopping, 8 starting,
// 16 inactive, 32 crashed).
func openrcStatus(code int) (running, ok bool) {
	switch code {
	case 0:
		return true, true
	case 3:
		return false, true
	}
	return false, false
}

// levels lists the boot runlevels that hold name.
func (o *openrc) levels(name string) ([]string, error) {
	var in []string
	for _, l := range o.bootLevel {
		ok, err := exists(filepath.Join(o.runlevels, l, name))
		if err != nil {
			return nil, fmt.Errorf("initsys: openrc: runlevel %s: %w", l, err)
		}
		if ok {
			in = append(in, l)
		}
	}
	return in, nil
}

func (o *openrc) State(ctx context.Context, unit string) (State, error) {
	name, err := serviceName("openrc", unit)
	if err != nil {
		return State{}, err
	}
	st := State{Name: name}
	fi, err := os.Stat(filepath.Join(o.initd, name))
	switch {
	case os.IsNotExist(err):
		return st, nil
	case err != nil:
		return State{}, fmt.Errorf("initsys: openrc: %w", err)
	case !fi.Mode().IsRegular():
		return st, nil
	}
	st.Known = true
	r, err := o.t.run(ctx, "rc-service", name, "status")
	if err != nil {
		return State{}, err
	}
	running, ok := openrcStatus(r.Code)
	if !ok {
		return State{}, o.t.failure(r, "neither started (0) nor stopped (3)")
	}
	st.Running = running
	levels, err := o.levels(name)
	if err != nil {
		return State{}, err
	}
	st.Enabled = "disabled"
	if len(levels) > 0 {
		st.Enabled = "enabled"
	}
	return st, nil
}

// script checks unit names a script OpenRC has, and gives its name.
func (o *openrc) script(unit string) (string, error) {
	name, err := serviceName("openrc", unit)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(filepath.Join(o.initd, name))
	if err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("initsys: openrc: no script %s", filepath.Join(o.initd, name))
	}
	return name, nil
}

func (o *openrc) do(ctx context.Context, unit, verb string) error {
	name, err := o.script(unit)
	if err != nil {
		return err
	}
	_, err = o.t.must(ctx, "rc-service", name, verb)
	return err
}

func (o *openrc) Start(ctx context.Context, unit string) error   { return o.do(ctx, unit, "start") }
func (o *openrc) Stop(ctx context.Context, unit string) error    { return o.do(ctx, unit, "stop") }
func (o *openrc) Restart(ctx context.Context, unit string) error { return o.do(ctx, unit, "restart") }

// SetEnabled adds the script to the default runlevel, or removes it from
// every boot runlevel that holds it, with rc-update.
func (o *openrc) SetEnabled(ctx context.Context, unit string, enabled bool) error {
	name, err := o.script(unit)
	if err != nil {
		return err
	}
	levels, err := o.levels(name)
	if err != nil {
		return err
	}
	if enabled {
		if len(levels) > 0 {
			return nil
		}
		_, err := o.t.must(ctx, "rc-update", "add", name, "default")
		return err
	}
	for _, l := range levels {
		if _, err := o.t.must(ctx, "rc-update", "del", name, l); err != nil {
			return err
		}
	}
	return nil
}

// Reload does nothing: this init reads its service definitions at each use.
func (o *openrc) Reload(context.Context) error { return nil }
