package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The history keeps the applies that did something, never says more than
// happened (a line cut short by a crash says nothing), and stays bounded.
func TestHistory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Second)
	did := &shapes.Report{Outcome: shapes.Repaired, Seq: 4, Lines: []shapes.Line{{Outcome: shapes.Repaired}, {Outcome: shapes.Unchanged}, {Outcome: shapes.Failed}}}
	nothing := &shapes.Report{Outcome: shapes.Unchanged, Lines: []shapes.Line{{Outcome: shapes.Unchanged}}}
	s.SaveReport(Link, "drift", did)
	s.SaveReport(Link, "drift", nothing)
	s.SaveReport(Local, "rescue", did)
	// A crash in the middle of an append.
	f, _ := os.OpenFile(filepath.Join(dir, historyFile), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"at":"2026-`)
	f.Close()

	acts, more, err := History(dir, start, time.Now().Add(time.Second), 10)
	if err != nil || more != 0 || len(acts) != 2 {
		t.Fatalf("History = %+v, %d more, %v; want the two applies that did something", acts, more, err)
	}
	if a := acts[0]; a.Trigger != "drift" || a.Source != "link" || a.Seq != 4 || a.Changed != 1 || a.Failed != 1 || a.Outcome != shapes.Repaired {
		t.Errorf("first: %+v", a)
	}
	if acts[1].Trigger != "rescue" || acts[1].Source != "local" {
		t.Errorf("second: %+v", acts[1])
	}
	if acts, _, _ := History(dir, time.Now().Add(time.Hour), time.Now().Add(2*time.Hour), 10); len(acts) != 0 {
		t.Errorf("outside the interval: %+v", acts)
	}
	if acts, more, _ := History(dir, start, time.Now().Add(time.Second), 1); len(acts) != 1 || more != 1 || acts[0].Trigger != "rescue" {
		t.Errorf("bounded to the newest: %+v, %d more", acts, more)
	}

	// Bounded on disk: past historyMaxBytes, the newest historyKeep lines.
	for i := 0; i < 1000; i++ {
		s.SaveReport(Link, "drift", did)
	}
	p := filepath.Join(dir, historyFile)
	fi, _ := os.Stat(p)
	if n := len(readLines(p)); fi.Size() > historyMaxBytes || n < historyKeep {
		t.Errorf("%d lines, %d bytes kept; at least %d lines, at most %d bytes", n, fi.Size(), historyKeep, historyMaxBytes)
	}
	if acts, _, _ := History(dir, start, time.Now().Add(time.Second), 1000); len(acts) < historyKeep {
		t.Errorf("%d activities read back after the trim", len(acts))
	}
}
