package store

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// An apply begun, whose records and what it said reached the journal and
// whose end did not (a power cut before its report was sent): the next
// apply notes what it said in the history, once, under "interrupted";
// an apply that ended leaves nothing to note; what changed nothing is
// not kept.
func TestWhatAnInterruptedApplySaidIsNotedByTheNext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	if _, err := s.Begin(Began{Source: Link, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	s.Said(shapes.Line{Module: "m", ID: "a", Type: "file", Outcome: shapes.Applied, Detail: "created"})
	s.Said(shapes.Line{Module: "m", ID: "b", Type: "file", Outcome: shapes.Unchanged})
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d1"})
	s.Said(shapes.Line{Module: "m", ID: "c", Type: "file", Outcome: shapes.Removed, Detail: "removed"})
	if err := s.Sync(); err != nil { // the lines kept since the last record go with the sync
		t.Fatal(err)
	}
	s.Unlock() // the cut: no end

	s = open(t, dir)
	if got := len(s.unfinished); got != 1 || len(s.unfinished[0].Lines) != 2 || s.unfinished[0].Seq != 1 {
		t.Fatalf("the journal read again holds %+v", s.unfinished)
	}
	if noted, err := s.Begin(Began{Source: Link, Seq: 2}); err != nil || len(noted) != 1 {
		t.Fatal(noted, err)
	}
	s.End()
	s.Unlock()
	part, err := Since(dir, 0, Newest(dir), 10, nil)
	if err != nil || len(part.Acts) != 1 {
		t.Fatalf("history %+v %v", part, err)
	}
	a := part.Acts[0]
	if a.Trigger != TriggerInterrupted || a.Source != "link" || a.Seq != 1 || a.Changed != 2 || len(a.Lines) != 2 || a.Lines[0].ID != "a" || a.Lines[1].ID != "c" {
		t.Fatalf("noted %+v", a)
	}

	// Ended: the next apply notes nothing.
	s = open(t, dir)
	if len(s.unfinished) != 0 {
		t.Fatalf("an ended apply is still unfinished: %+v", s.unfinished)
	}
	s.Begin(Began{Source: Link, Seq: 3})
	s.End()
	s.Unlock()
	if n := Newest(dir); n != 1 {
		t.Fatalf("history has %d activities, want the one", n)
	}
}

// A note that fails (the history cannot be written) leaves the apply cut
// short unfinished, begins nothing, and the next apply notes it.
func TestANoteThatFailsIsMadeByTheNextApply(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Begin(Began{Source: Link, Seq: 1})
	s.Said(shapes.Line{Module: "m", ID: "a", Type: "file", Outcome: shapes.Applied})
	s.Sync()
	s.Unlock() // cut short

	hist := filepath.Join(dir, historyFile)
	if err := os.Mkdir(hist, 0o700); err != nil { // the history cannot be written
		t.Fatal(err)
	}
	s = open(t, dir)
	if _, err := s.Begin(Began{Source: Link, Seq: 2}); err == nil {
		t.Fatal("a note that failed was not said")
	}
	s.Unlock()
	os.Remove(hist)
	s = open(t, dir)
	if noted, err := s.Begin(Began{Source: Link, Seq: 2}); err != nil || len(noted) != 1 || noted[0].Seq != 1 {
		t.Fatalf("noted %+v %v", noted, err)
	}
	s.End()
	s.Unlock()
	if s = open(t, dir); len(s.unfinished) != 0 {
		t.Fatalf("still unfinished: %+v", s.unfinished)
	}
	s.Unlock()
}

// An apply cut short that said more than an activity names is noted in
// as many as name every line (up to interruptedNotes, the last counting
// the rest).
func TestALargeInterruptedApplyIsNotedWhole(t *testing.T) {
	for _, n := range []int{shapes.MaxActivityLines + 1, 40, interruptedNotes*shapes.MaxActivityLines + 5} {
		dir := filepath.Join(t.TempDir(), "state")
		s := open(t, dir)
		s.Begin(Began{Source: Link, Seq: 1})
		for i := range n {
			s.Said(shapes.Line{Module: "m", ID: fmt.Sprint("f", i), Type: "file", Outcome: shapes.Applied})
		}
		s.Sync()
		s.Unlock()
		s = open(t, dir)
		noted, err := s.Begin(Began{Source: Link, Seq: 2})
		s.Unlock()
		named, counted := 0, 0
		for _, a := range noted {
			named += len(a.Lines)
			counted += a.Changed
		}
		want := min(n, interruptedNotes*shapes.MaxActivityLines)
		if err != nil || counted != n || named != want || len(noted) != min((n+shapes.MaxActivityLines-1)/shapes.MaxActivityLines, interruptedNotes) {
			t.Fatalf("%d lines: %d notes, %d named, %d counted, %v", n, len(noted), named, counted, err)
		}
	}
}
