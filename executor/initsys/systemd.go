package initsys

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
)

const (
	sdDest    = "org.freedesktop.systemd1"
	sdPath    = dbus.ObjectPath("/org/freedesktop/systemd1")
	sdManager = "org.freedesktop.systemd1.Manager"
	sdUnit    = "org.freedesktop.systemd1.Unit"
)

// systemd drives systemd over its D-Bus API on the system bus.
type systemd struct {
	conn *dbus.Conn
	obj  dbus.BusObject
}

// Systemd connects to systemd on the system bus at address (a D-Bus
// address such as "unix:path=/run/dbus/system_bus_socket"; "" for the
// default).
func Systemd(ctx context.Context, address string) (Manager, error) {
	if address == "" {
		address = "unix:path=/run/dbus/system_bus_socket"
	}
	conn, err := dbus.Connect(address, dbus.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("initsys: systemd: connect %s: %w", address, err)
	}
	return &systemd{conn: conn, obj: conn.Object(sdDest, sdPath)}, nil
}

func (s *systemd) Name() string { return "systemd" }
func (s *systemd) Close() error { return s.conn.Close() }

func (s *systemd) call(ctx context.Context, method string, args ...any) *dbus.Call {
	return s.obj.CallWithContext(ctx, sdManager+"."+method, 0, args...)
}

// State loads the unit (LoadUnit resolves an alias to the unit it names)
// and reads its properties.
func (s *systemd) State(ctx context.Context, unit string) (State, error) {
	var path dbus.ObjectPath
	if err := s.call(ctx, "LoadUnit", unit).Store(&path); err != nil {
		return State{}, fmt.Errorf("initsys: systemd: load %s: %w", unit, err)
	}
	u := s.conn.Object(sdDest, path)
	get := func(prop string) (string, error) {
		v, err := u.GetProperty(sdUnit + "." + prop)
		if err != nil {
			return "", fmt.Errorf("initsys: systemd: %s of %s: %w", prop, unit, err)
		}
		str, _ := v.Value().(string)
		return str, nil
	}
	id, err := get("Id")
	if err != nil {
		return State{}, err
	}
	load, err := get("LoadState")
	if err != nil {
		return State{}, err
	}
	active, err := get("ActiveState")
	if err != nil {
		return State{}, err
	}
	enabled, err := get("UnitFileState")
	if err != nil {
		return State{}, err
	}
	return State{
		Name:    id,
		Known:   load == "loaded" || load == "masked",
		Running: active == "active" || active == "activating" || active == "reloading",
		Enabled: enabled,
	}, nil
}

// job runs a unit job and waits for systemd to say it finished.
func (s *systemd) job(ctx context.Context, method, unit string) error {
	ch := make(chan *dbus.Signal, 16)
	s.conn.Signal(ch)
	defer s.conn.RemoveSignal(ch)
	if err := s.conn.AddMatchSignalContext(ctx, dbus.WithMatchInterface(sdManager), dbus.WithMatchMember("JobRemoved")); err != nil {
		return fmt.Errorf("initsys: systemd: watch jobs: %w", err)
	}
	defer s.conn.RemoveMatchSignalContext(context.Background(), dbus.WithMatchInterface(sdManager), dbus.WithMatchMember("JobRemoved"))
	// Subscribe makes systemd emit job signals to us.
	s.call(ctx, "Subscribe")
	var job dbus.ObjectPath
	if err := s.call(ctx, method, unit, "replace").Store(&job); err != nil {
		return fmt.Errorf("initsys: systemd: %s %s: %w", strings.ToLower(strings.TrimSuffix(method, "Unit")), unit, err)
	}
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case sig := <-ch:
			if sig.Name != sdManager+".JobRemoved" || len(sig.Body) < 4 {
				continue
			}
			if p, _ := sig.Body[1].(dbus.ObjectPath); p != job {
				continue
			}
			if result, _ := sig.Body[3].(string); result != "done" {
				return fmt.Errorf("initsys: systemd: %s %s: the job ended %q", strings.ToLower(strings.TrimSuffix(method, "Unit")), unit, result)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fmt.Errorf("initsys: systemd: %s %s: no answer in 5 minutes", method, unit)
		}
	}
}

func (s *systemd) Start(ctx context.Context, unit string) error { return s.job(ctx, "StartUnit", unit) }
func (s *systemd) Stop(ctx context.Context, unit string) error  { return s.job(ctx, "StopUnit", unit) }
func (s *systemd) Restart(ctx context.Context, unit string) error {
	return s.job(ctx, "RestartUnit", unit)
}

// SetEnabled enables or disables the unit's files, then reloads the
// manager so it sees the new links.
func (s *systemd) SetEnabled(ctx context.Context, unit string, enabled bool) error {
	var err error
	if enabled {
		var carries bool
		var changes [][]any
		err = s.call(ctx, "EnableUnitFiles", []string{unit}, false, true).Store(&carries, &changes)
	} else {
		var changes [][]any
		err = s.call(ctx, "DisableUnitFiles", []string{unit}, false).Store(&changes)
	}
	if err != nil {
		return fmt.Errorf("initsys: systemd: set %s enabled=%v: %w", unit, enabled, err)
	}
	if err := s.call(ctx, "Reload").Err; err != nil {
		return fmt.Errorf("initsys: systemd: reload: %w", err)
	}
	return nil
}

// Reload is systemd's daemon-reload: it reads changed unit files again.
func (s *systemd) Reload(ctx context.Context) error {
	if err := s.call(ctx, "Reload").Err; err != nil {
		return fmt.Errorf("initsys: systemd: reload: %w", err)
	}
	return nil
}
