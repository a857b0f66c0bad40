package store

import (
	"fmt"
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

// The history counts its activities, and a part of it is read by count:
// from where the last read ended, oldest first within a bound, those a
// filter keeps, across the cut that bounds the file, and from its start
// again once it was started anew — never by the clock, which a node's
// owner may set anywhere.
func TestHistoryByCount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := Newest(dir); n != 0 {
		t.Fatalf("Newest of no history = %d", n)
	}
	did := func(seq uint64) *shapes.Report {
		return &shapes.Report{Seq: seq, Lines: []shapes.Line{{Outcome: shapes.Repaired}}}
	}
	// A line of a release before the count, then counted ones.
	appendFile(t, filepath.Join(dir, historyFile), `{"format":1,"at":"2026-12-02T09:00:00Z","source":"link","trigger":"drift","outcome":"repaired","changed":1}`+"\n")
	for i := uint64(1); i <= 5; i++ {
		trigger := "drift"
		if i%2 == 0 {
			trigger = "declaration"
		}
		s.SaveReport(Link, trigger, did(i))
	}
	if n := Newest(dir); n != 5 {
		t.Fatalf("Newest = %d, want 5", n)
	}
	drift := func(a shapes.Activity) bool { return a.Trigger == "drift" }
	seqs := func(acts []shapes.Activity) (out []uint64) {
		for _, a := range acts {
			out = append(out, a.Seq)
		}
		return out
	}
	for _, c := range []struct {
		name        string
		after, upto uint64
		max         int
		newer       bool
		want        []uint64
		last, lost  uint64
	}{
		{"all, filtered", 0, 5, 10, false, []uint64{1, 3, 5}, 5, 0},
		{"after a count", 3, 5, 10, false, []uint64{5}, 5, 0},
		{"up to a count", 0, 4, 10, false, []uint64{1, 3}, 4, 0},
		{"the oldest within a bound", 0, 5, 2, false, []uint64{1, 3}, 3, 0},
		{"the newest within a bound", 0, 5, 2, true, []uint64{3, 5}, 5, 1},
		{"nothing new", 5, 5, 10, false, nil, 5, 0},
		{"a history started anew", 9, 5, 10, false, []uint64{1, 3, 5}, 5, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := Since
			if c.newer {
				read = Newer
			}
			got, err := read(dir, c.after, c.upto, c.max, drift)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(seqs(got.Acts)) != fmt.Sprint(c.want) || got.Last != c.last || got.Lost != c.lost {
				t.Errorf("got seqs %v, last %d, lost %d; want %v, %d, %d", seqs(got.Acts), got.Last, got.Lost, c.want, c.last, c.lost)
			}
		})
	}

	// Past the cut, the count goes on, and what was cut is counted lost.
	for i := 0; i < 1000; i++ {
		s.SaveReport(Link, "drift", did(100))
	}
	n := Newest(dir)
	if n != 1005 {
		t.Fatalf("Newest after the cut = %d, want 1005", n)
	}
	got, err := Since(dir, 3, n, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Acts) != 10 || got.Lost == 0 || got.Last != 1005-uint64(len(readLines(filepath.Join(dir, historyFile))))+10 {
		t.Errorf("across the cut: %d acts, last %d, lost %d", len(got.Acts), got.Last, got.Lost)
	}
}

// FuzzHistory: whatever the history file holds (a line cut short by a
// crash, a later release's, bytes of no JSON), reading it by count never
// panics, keeps within its bound, and reaches no count past the one asked.
func FuzzHistory(f *testing.F) {
	f.Add([]byte(`{"format":1,"n":1,"at":"2026-12-02T09:00:00Z","source":"link","trigger":"drift","outcome":"repaired","changed":1}`+"\n"+`{"n":2,"trigger":"declaration"}`+"\n"), uint64(0), uint64(2))
	f.Add([]byte(`{"format":9,"n":18446744073709551615}`+"\n"+`{"at":"2026-`), uint64(5), uint64(1))
	f.Fuzz(func(t *testing.T, b []byte, after, upto uint64) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, historyFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, read := range []func(string, uint64, uint64, int, func(shapes.Activity) bool) (Counted, error){Since, Newer} {
			got, _ := read(dir, after, upto, 3, nil)
			if len(got.Acts) > 3 || got.Last > upto && got.Last != after {
				t.Fatalf("read after %d up to %d: %d acts, last %d", after, upto, len(got.Acts), got.Last)
			}
		}
		Newest(dir)
	})
}

// A power cut leaves the history's unsynced tail as it finds it: a line
// cut short, or the zeros of blocks allocated and never written, with no
// newline. The next activity is still read, and counted after the last
// whole line; one appended to the unended tail would have been read as
// part of it and skipped — what the executor did after a boot, never
// reported.
func TestAnActivityAfterATornHistoryIsKept(t *testing.T) {
	for _, tail := range []string{string(make([]byte, 300)), `{"format":1,"n":3,"at":"2026-12-0`} {
		dir := filepath.Join(t.TempDir(), "state")
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(1); i <= 2; i++ {
			s.SaveReport(Link, "drift", &shapes.Report{Seq: i, Lines: []shapes.Line{{Outcome: shapes.Repaired}}})
		}
		appendFile(t, filepath.Join(dir, historyFile), tail)
		s.SaveReport(Link, "start", &shapes.Report{Seq: 3, Lines: []shapes.Line{{Outcome: shapes.Applied}}})
		part, err := Since(dir, 2, Newest(dir), 10, nil)
		if err != nil || len(part.Acts) != 1 || part.Acts[0].Trigger != "start" || part.Last != 3 {
			t.Fatalf("after a tail of %q: %+v %v", tail[:min(len(tail), 12)], part, err)
		}
	}
}

// A start that resumed a declaration a power cut stopped, and changed more
// than an activity names, is named whole in the history, read by count as
// the agent reads it: each file removed by name, not sixteen and a count.
func TestAnApplyThatChangedMuchIsNamedWhole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := &shapes.Report{Seq: 2, Outcome: shapes.Applied}
	for i := range shapes.MaxActivityLines + 4 {
		rep.Lines = append(rep.Lines, shapes.Line{Module: "d", ID: fmt.Sprint("f", i), Type: "file", Outcome: shapes.Removed},
			shapes.Line{Module: "b", ID: fmt.Sprint("g", i), Type: "file", Outcome: shapes.Unchanged})
	}
	s.SaveReport(Link, "start", rep)
	got, err := Since(dir, 0, Newest(dir), 16, func(shapes.Activity) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, a := range got.Acts {
		for _, l := range a.Lines {
			named[l.ID] = true
		}
		if a.LinesMore != 0 || a.Trigger != "start" || a.Seq != 2 {
			t.Errorf("activity %+v", a)
		}
	}
	if len(named) != shapes.MaxActivityLines+4 || shapes.Applies(got.Acts) != 1 {
		t.Fatalf("%d activities (%d applies) name %d of the %d files removed", len(got.Acts), shapes.Applies(got.Acts), len(named), shapes.MaxActivityLines+4)
	}
}
