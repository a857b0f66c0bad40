package launcher

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// stateIn writes data as the launch state of a private directory of the
// test's own, as the launcher keeps it.
func stateIn(t *testing.T, data []byte) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "state")
	if err := checkDir(d, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, StateFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return d
}

// Every launch state a release wrote is read (golden.Releases).
func TestEveryLaunchStateFormatThatShippedIsRead(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 12, 1, 10, m, 0, 0, time.UTC) }
	first := State{
		Starts:       []time.Time{at(1), at(2)},
		RolledBack:   &RollbackMark{At: at(3), Reason: "crash-looped", Reinstalled: true},
		Halted:       &Mark{At: at(4), Reason: "the known-good release failed too"},
		HealthyAt:    at(5),
		KnownGood:    &KnownGood{At: at(6), Binaries: map[string]string{"mesh-executor": "ab12", "mesh-agent": "cd34"}},
		KnownGoodDir: "/var/lib/mesh-host/executor/known-good",
	}
	last := first.clone()
	last.KnownGood.Package = "0.0.480-1"
	last.Launcher = "/usr/bin/mesh-launch"
	last.Failed = &FailedRelease{Version: "0.0.486-1", At: at(7), Reason: "crash-looped at start"}
	last.LastRollback = &RollbackMark{At: at(8), Reason: "crash-looped", Reinstalled: true}
	last.Agent = &AgentLaunch{Starts: []time.Time{at(9)}, Proven: "cd34", ProvenAt: at(10)}
	goldens := map[string]State{
		"92e28c4": first,            // the first release of the launcher
		"9d97354": last,             // the last release before the format field
		"5d5c15c": withFormat(last), // the first with it
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want State) {
		data, err := os.ReadFile(golden.Path(release, StateFile))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadState(stateIn(t, data))
		if err != nil {
			t.Fatal(err)
		}
		// Compared as the launcher writes them: times by instant.
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("read %s\nwant %s", g, w)
		}
	})
}

// A launch state of a later format is read as far as this release knows
// it: the release a rollback reinstalls starts on what the failed one
// left, and its mark and its starts still count.
func TestALaterLaunchStateFormatIsRead(t *testing.T) {
	d := stateIn(t, []byte(`{"format":2,"starts":["2026-12-01T10:01:00Z"],"rolled_back":{"at":"2026-12-01T10:03:00Z","reason":"crash-looped"},"a_later_field":{"x":1}}`))
	s, err := ReadState(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Starts) != 1 || s.RolledBack == nil || s.RolledBack.Reason != "crash-looped" || s.Format != 2 {
		t.Fatalf("read %+v", s)
	}
	// What it writes is in its own format.
	if err := writeState(d, s); err != nil {
		t.Fatal(err)
	}
	if again, err := ReadState(d); err != nil || again.Format != stateFormat || len(again.Starts) != 1 {
		t.Errorf("read back %+v, %v", again, err)
	}
}

func withFormat(s State) State {
	s.Format = stateFormat
	return s
}
