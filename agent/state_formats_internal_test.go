package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// Every state file a release wrote is read (golden.Releases).
func TestEveryAgentStateFormatThatShippedIsRead(t *testing.T) {
	first := State{LastLinked: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), LastApplied: 7, LastAppliedOutcome: "applied", LastSeq: 8, LastOutcome: "refused"}
	last := first
	last.ProfileDigest, last.LastStreamSeq, last.LastRosterStreamSeq, last.LastRosterSeq, last.UsesRoster = "sha256:ef56", 41, 12, 5, true
	rotated := last
	rotated.ToldCapability, rotated.PinsSeq = 1, 2
	rotated.BrokerPins = []string{strings.Repeat("a", 64), strings.Repeat("b", 64)}
	goldens := map[string]State{
		"91009a6": first,   // the first release of the agent
		"9d97354": last,    // the last release before the format field
		"5d5c15c": last,    // the first with it
		"3c69c07": rotated, // the first with the capability said and the broker's pins
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want State) {
		st, err := openState(filepath.Join(golden.Dir, release))
		if err != nil {
			t.Fatal(err)
		}
		got := st.get()
		got.Format = 0
		if !got.LastLinked.Equal(want.LastLinked) {
			t.Errorf("last linked %v; want %v", got.LastLinked, want.LastLinked)
		}
		got.LastLinked = want.LastLinked
		if !reflect.DeepEqual(got, want) {
			t.Errorf("read %+v; want %+v", got, want)
		}
	})
}

// A state file of a later format is read as far as this release knows
// it, and the agent is told, naming both formats: a rollback must not
// stop a node for its memory.
func TestALaterAgentStateFormatIsReadAndSaid(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "agent.json"), []byte(`{"format":2,"last_applied":7,"last_stream_seq":41,"a_later_field":true}`), 0o600)
	st, err := openState(dir)
	if st == nil {
		t.Fatalf("no state: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "is in format v2, written by a later release; this agent reads formats up to v1") {
		t.Errorf("said %v", err)
	}
	if s := st.get(); s.LastApplied != 7 || s.LastStreamSeq != 41 {
		t.Errorf("read %+v", s)
	}
	// What it writes next is in its own format.
	if err := st.update(func(s *State) { s.LastApplied = 8 }); err != nil {
		t.Fatal(err)
	}
	if again, err := openState(dir); err != nil || again.get().LastApplied != 8 || again.get().Format != stateFormat {
		t.Errorf("read back %+v, %v", again.get(), err)
	}
}
