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
// as many as name every line (up to shapes.MaxActivityParts, the last
// counting the rest).
func TestALargeInterruptedApplyIsNotedWhole(t *testing.T) {
	for _, n := range []int{shapes.MaxActivityLines + 1, 40, shapes.MaxActivityParts*shapes.MaxActivityLines + 5} {
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
		want := min(n, shapes.MaxActivityParts*shapes.MaxActivityLines)
		if err != nil || counted != n || named != want || len(noted) != min((n+shapes.MaxActivityLines-1)/shapes.MaxActivityLines, shapes.MaxActivityParts) {
			t.Fatalf("%d lines: %d notes, %d named, %d counted, %v", n, len(noted), named, counted, err)
		}
	}
}

// cutShort leaves in dir an apply of seq begun, that created /a and said
// so, and never ended.
func cutShort(t *testing.T, dir string, seq uint64) {
	t.Helper()
	s := open(t, dir)
	if _, err := s.Begin(Began{Source: Link, Seq: seq}); err != nil {
		t.Fatal(err)
	}
	s.Said(shapes.Line{Module: "m", ID: "a", Type: "file", Outcome: shapes.Applied, Detail: "created"})
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d1"})
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	s.Unlock()
}

// The journal is not compacted while an apply is begun and not ended —
// the snapshot holds entries, not what an apply said — neither in the
// apply (an action's commit) nor by an apply that could not begin while
// one cut short waits to be noted: what it said survives the cut.
func TestAnApplyBegunIsNotCompactedAway(t *testing.T) {
	defer func(n int) { CompactAfter = n }(CompactAfter)
	CompactAfter = 1
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Begin(Began{Source: Link, Seq: 1})
	s.Said(shapes.Line{Module: "m", ID: "a", Type: "file", Outcome: shapes.Applied})
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d1"})
	if err := s.Commit(); err != nil { // an action's, mid-apply
		t.Fatal(err)
	}
	s.Said(shapes.Line{Module: "m", ID: "b", Type: "file", Outcome: shapes.Applied})
	s.Put(&Entry{Target: "path:/b", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d2"})
	s.Sync()
	s.Unlock() // cut short

	// An apply that cannot note it (the history cannot be written), so
	// begins nothing, and commits at its end.
	hist := filepath.Join(dir, historyFile)
	os.Mkdir(hist, 0o700)
	s = open(t, dir)
	if _, err := s.Begin(Began{Source: Link, Seq: 2}); err == nil {
		t.Fatal("a note that failed was not said")
	}
	s.Put(&Entry{Target: "path:/c", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d3"})
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	s.Sync()
	s.Unlock()
	os.Remove(hist)

	s = open(t, dir)
	noted, err := s.Begin(Began{Source: Link, Seq: 3})
	if err != nil || len(noted) != 1 || len(noted[0].Lines) != 2 {
		t.Fatalf("noted %+v %v", noted, err)
	}
	s.End()
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	s.Unlock()
	if fi, err := os.Stat(filepath.Join(dir, "journal")); err != nil || fi.Size() != 0 {
		t.Fatalf("the journal is not compacted once the apply ended: %v %v", fi.Size(), err)
	}
	if s = open(t, dir); len(s.unfinished) != 0 || s.Get("path:/c") == nil {
		t.Fatalf("after the compaction: unfinished %+v, /c %v", s.unfinished, s.Get("path:/c"))
	}
	s.Unlock()
}

// A note made but whose "noted" record was lost (a cut between the two; a
// store loaded before another process noted it, then locked) is not made
// again; nor is one whose history could not be cut to its newest after.
func TestAnInterruptedApplyIsNotedOnce(t *testing.T) {
	t.Run("noted lost", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		cutShort(t, dir, 1)
		j := filepath.Join(dir, "journal")
		fi, _ := os.Stat(j)
		s := open(t, dir)
		if noted, err := s.Begin(Began{Source: Link, Seq: 2}); err != nil || len(noted) != 1 {
			t.Fatal(noted, err)
		}
		s.Unlock()
		os.Truncate(j, fi.Size()) // the cut: the notes durable, "noted" and the begin not
		s = open(t, dir)
		if noted, err := s.Begin(Began{Source: Link, Seq: 2}); err != nil || len(noted) != 0 {
			t.Fatalf("noted again: %+v %v", noted, err)
		}
		s.End()
		s.Unlock()
		if n := Newest(dir); n != 1 {
			t.Fatalf("the history holds %d activities, want the one note", n)
		}
	})
	t.Run("loaded before", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		cutShort(t, dir, 1)
		waiting, err := Open(dir) // loads the apply cut short, then waits for the lock
		if err != nil {
			t.Fatal(err)
		}
		s := open(t, dir) // a rescue apply, which notes it
		if noted, err := s.Begin(Began{Source: Local, Seq: 1}); err != nil || len(noted) != 1 {
			t.Fatal(noted, err)
		}
		s.End()
		if err := s.Compact(); err != nil { // as its end's commit may
			t.Fatal(err)
		}
		s.Unlock()
		if err := waiting.Lock(0); err != nil {
			t.Fatal(err)
		}
		noted, err := waiting.Begin(Began{Source: Link, Seq: 2})
		waiting.End()
		waiting.Unlock()
		if err != nil || len(noted) != 0 || Newest(dir) != 1 {
			t.Fatalf("noted again: %+v %v; the history holds %d", noted, err, Newest(dir))
		}
	})
	t.Run("history not cut", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		cutShort(t, dir, 1)
		var b []byte
		for i := range 700 {
			b = fmt.Appendf(b, `{"format":1,"n":%d,"source":"link","trigger":"drift","outcome":"applied","changed":1,"failed":0,"at":"2026-01-01T00:00:00Z","detail":"%0100d"}`+"\n", i+1, 0)
		}
		hist := filepath.Join(dir, historyFile)
		os.WriteFile(hist, b, 0o600)
		os.Mkdir(hist+".tmp", 0o700) // the history cannot be rewritten to its newest
		before := Newest(dir)
		for seq := uint64(2); seq < 5; seq++ {
			s := open(t, dir)
			if _, err := s.Begin(Began{Source: Link, Seq: seq}); err != nil {
				t.Fatalf("seq %d: %v", seq, err)
			}
			s.End()
			s.Unlock()
		}
		if n := Newest(dir) - before; n != 1 {
			t.Fatalf("the apply cut short was noted %d times", n)
		}
	})
}

// A journal write cut short by a full disk is taken back: the journal is
// as before it, what it would have said stays kept for the next write, and
// records written once there is room follow whole ones (a reader stops at
// a torn record: what followed it would be lost).
func TestAJournalWriteCutShortIsTakenBack(t *testing.T) {
	dir := smallDisk(t)
	s := open(t, dir)
	if _, err := s.Begin(Began{Source: Link, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	j := filepath.Join(dir, "journal")
	before, _ := os.Stat(j)
	fillDisk(t, dir)
	// More than the journal's last page has room for: a write cut short.
	for i := range 40 {
		s.Said(shapes.Line{Module: "m", ID: fmt.Sprint("f", i), Type: "file", Outcome: shapes.Applied, Detail: fmt.Sprintf("%0150d", i)})
	}
	if err := s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d1"}); err == nil {
		t.Fatal("a record written on a full disk")
	}
	if fi, _ := os.Stat(j); fi.Size() != before.Size() {
		t.Fatalf("the journal after a write cut short: %d bytes, %d before", fi.Size(), before.Size())
	}
	os.Remove(filepath.Join(dir, "filler"))
	if err := s.Put(&Entry{Target: "path:/b", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d2"}); err != nil {
		t.Fatal(err)
	}
	s.Sync()
	s.Unlock() // cut short
	s = open(t, dir)
	defer s.Unlock()
	if s.Get("path:/b") == nil || s.Get("path:/a") != nil || len(s.unfinished) != 1 || len(s.unfinished[0].Lines) != 40 {
		t.Fatalf("read again: /a %v, /b %v, unfinished %d", s.Get("path:/a"), s.Get("path:/b"), len(s.unfinished))
	}
}

// What a cut apply changed is kept for its own source's restarts
// (CutChanged) by the Begin that notes it, whichever source that Begin's
// apply is of: kept through that apply's own cut, until an apply of the
// source gives the restarts (SetRestartsOwed). A restarts-owed.json that
// does not read keeps the cut apply in the journal instead, unnoted, and
// the apply begins all the same (ErrNotNoted).
func TestACutApplysChangesAreKeptForItsSource(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	cutLocal := func() {
		s := open(t, dir)
		if _, err := s.Begin(Began{Source: Local, Seq: 0}); err != nil {
			t.Fatal(err)
		}
		s.Said(shapes.Line{Module: "base", ID: "conf", Type: "file", Outcome: shapes.Applied})
		s.Said(shapes.Line{Module: "base", ID: "same", Type: "file", Outcome: shapes.Unchanged})
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		s.Unlock() // the cut: no end
	}
	want := func(s *Store, src Source, keys ...string) {
		t.Helper()
		got := s.CutChanged(src, true)
		if len(got) != len(keys) {
			t.Fatalf("%s: cut changes %v, want %v", src, got, keys)
		}
		for _, k := range keys {
			if !got[k] {
				t.Fatalf("%s: cut changes %v, want %v", src, got, keys)
			}
		}
	}
	cutLocal()
	s := open(t, dir)
	want(s, Local, "base.conf") // before any Begin: the journal's
	if _, err := s.Begin(Began{Source: Bundle, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	want(s, Bundle)
	want(s, Local, "base.conf")
	s.Unlock() // the bundle's apply cut too

	s = open(t, dir)
	want(s, Local, "base.conf")
	if _, err := s.Begin(Began{Source: Local, Seq: 0}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRestartsOwed(Local, nil); err != nil {
		t.Fatal(err)
	}
	want(s, Local)
	s.End()
	s.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "restarts-owed.json")); !os.IsNotExist(err) {
		t.Fatalf("restarts-owed.json holding nothing is left: %v", err)
	}

	cutLocal()
	os.WriteFile(filepath.Join(dir, "restarts-owed.json"), []byte("{not json"), 0o600)
	s = open(t, dir)
	if _, err := s.Begin(Began{Source: Bundle, Seq: 2}); err != nil {
		t.Fatalf("begin with restarts-owed.json that does not read: %v", err)
	}
	if got := s.Unended(); len(got) != 1 || got[0].Source != Bundle {
		t.Fatalf("the cut apply was not noted: %+v", got)
	}
	want(s, Local, "base.conf")
	s.End()
	s.Unlock()
	if b, _ := os.ReadFile(filepath.Join(dir, OwedAside)); string(b) != "{not json" {
		t.Fatalf("not kept aside: %q", b)
	}
}
