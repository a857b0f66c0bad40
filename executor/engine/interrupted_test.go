package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"golang.org/x/sys/unix"
)

// cutJournal cuts the state's journal as a power cut would: before the
// last record cut says to cut at (by its op and target), and all after.
func cutJournal(t *testing.T, state string, at func(op, target string) bool) {
	t.Helper()
	p := filepath.Join(state, "journal")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	cut, off := -1, 0
	for _, rec := range strings.SplitAfter(string(data), "\n") {
		var r struct{ Op, Target string }
		if _, js, ok := strings.Cut(rec, " "); ok && json.Unmarshal([]byte(js), &r) == nil && at(r.Op, r.Target) {
			cut = off
		}
		off += len(rec)
	}
	if cut < 0 {
		t.Fatalf("no record to cut at in\n%s", data)
	}
	if err := os.Truncate(p, int64(cut)); err != nil {
		t.Fatal(err)
	}
}

// A power cut after an apply's changes were durable and before its
// report went out: the next apply finds everything as declared, and
// would say "unchanged" of changes no report ever said. What the journal
// kept of what the cut apply said is noted by the next apply in the
// history (trigger interrupted), which the agent reports upward. And a
// cut after a change was made and before its record was durable: the
// next apply finds it done where a change was begun, and says it made it.
func TestAChangeWhoseReportACutLostIsSaidByTheNextApply(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"a","type":"file","path":"{root}/a","content":"a\n"}`,
		`{"module":"m","id":"b","type":"file","path":"{root}/b","content":"b\n"}`)
	h.expect(h.apply(doc), shapes.Applied, "m.a=applied m.b=applied")
	cutJournal(t, h.state, func(op, _ string) bool { return op == "end" })
	h.expect(h.apply(doc), shapes.Unchanged, "m.a=unchanged m.b=unchanged")
	part, err := store.Since(h.state, 0, store.Newest(h.state), 10, nil)
	if err != nil || len(part.Acts) != 1 {
		t.Fatalf("history %+v %v", part, err)
	}
	if a := part.Acts[0]; a.Trigger != store.TriggerInterrupted || a.Changed != 2 || len(a.Lines) != 2 || a.Lines[0].ID != "a" || a.Lines[0].Outcome != shapes.Applied {
		t.Fatalf("noted %+v", a)
	}

	// The second window: the change made, its record not durable.
	changed := strings.Replace(doc, `"a\n"`, `"a, v2\n"`, 1)
	h.expect(h.apply(changed), shapes.Applied, "m.a=applied m.b=unchanged")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasSuffix(target, "/a") })
	rep := h.apply(changed)
	h.expect(rep, shapes.Applied, "m.a=applied m.b=unchanged")
	if !strings.HasPrefix(rep.Lines[0].Detail, "made by the apply of this declaration a power cut or a kill cut short, before it recorded it; recorded now: ") {
		t.Fatalf("%+v", rep.Lines[0])
	}
	h.expect(h.apply(changed), shapes.Unchanged, "m.a=unchanged m.b=unchanged")
}

// A change begun and never recorded says nothing of what is found now
// when the apply that finds it is of another declaration: the next
// declaration may declare what was there before, and a change cut short
// before it happened leaves just that. Unchanged, not made by anyone.
func TestAChangeBegunForAnotherDeclarationIsNotTakenForMade(t *testing.T) {
	h := newHarness(t)
	first := h.doc(`{"module":"m","id":"a","type":"file","path":"{root}/a","content":"a\n"}`)
	second := strings.Replace(first, `"a\n"`, `"a, v2\n"`, 1)
	h.expect(h.apply(first), shapes.Applied, "m.a=applied")
	h.expect(h.apply(second), shapes.Applied, "m.a=applied")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasSuffix(target, "/a") })
	if err := os.WriteFile(h.p("a"), []byte("a\n"), 0o644); err != nil { // the cut came before the change
		t.Fatal(err)
	}
	h.expect(h.apply(first), shapes.Unchanged, "m.a=unchanged")
}

// The report is handed to Options.Keep whole before the journal says the
// apply ended: a cut before it is kept leaves the apply unfinished, for
// the next to note; once kept, the end may be durable at once (a
// compaction) without the changes being said nowhere.
func TestTheReportIsKeptBeforeTheApplyEnds(t *testing.T) {
	defer func(n int) { store.CompactAfter = n }(store.CompactAfter)
	store.CompactAfter = 1 // every end compacts: durable at once
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"a","type":"file","path":"{root}/a","content":"a\n"}`)
	d, st := h.open(doc, false)
	began := store.Began{Source: store.Local, Seq: d.Seq, Digest: digest([]byte(doc))}
	keeps := 0
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Keep: func(rep *shapes.Report) {
		keeps++
		if outcomes(rep) != "m.a=applied" || rep.Outcome != shapes.Applied {
			t.Errorf("kept %s %s", rep.Outcome, outcomes(rep))
		}
		// What a cut now leaves: the apply begun and not ended.
		now, err := store.Open(h.state)
		if err != nil || len(now.Interrupted(began)) == 0 {
			t.Errorf("the journal said the apply ended before its report was kept (%v)", err)
		}
	}})
	st.Unlock()
	h.expect(rep, shapes.Applied, "m.a=applied")
	if keeps != 1 {
		t.Fatalf("kept %d times", keeps)
	}
	if now, _ := store.Open(h.state); len(now.Interrupted(began)) != 0 {
		t.Fatal("the apply did not end")
	}
}

// A change an earlier apply of the declaration left pending (it ended: its
// report said what became of it) is not taken for one a later apply of the
// same declaration, cut short before it got there, made.
func TestAChangeLeftPendingBeforeIsNotTakenForTheCutApplys(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"a","type":"file","path":"{root}/a","content":"a\n"}`)
	h.expect(h.apply(doc), shapes.Applied, "m.a=applied")
	if err := os.WriteFile(h.p("a"), []byte("a person's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.expect(h.apply(doc), shapes.Repaired, "m.a=repaired")
	// That apply ended with its change unrecorded: the intent pending.
	p := filepath.Join(h.state, "journal")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	recs := strings.SplitAfter(string(data), "\n")
	last := -1
	for i, rec := range recs {
		if strings.Contains(rec, `"op":"put"`) {
			last = i
		}
	}
	recs = slices.Delete(recs, last, last+1)
	if err := os.WriteFile(p, []byte(strings.Join(recs, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	// A later apply of the same declaration, cut short right after it began.
	d, st := h.open(doc, false)
	if _, err := st.Begin(store.Began{Source: store.Local, Seq: d.Seq, Digest: digest([]byte(doc))}); err != nil {
		t.Fatal(err)
	}
	st.Sync()
	st.Unlock()
	if e := mustStore(t, h.state).Get("path:" + h.p("a")); e == nil || e.Pending == nil {
		t.Fatal("the test left no intent pending")
	}
	h.expect(h.apply(doc), shapes.Unchanged, "m.a=unchanged")
}

// A give-back a cut stopped after it was made and before it was recorded
// (a key taken out of a shared file, a block): the next apply of the same
// declaration finds nothing to give back, and says the cut apply gave it
// back, not "forgotten" — the report of the cut apply never went out.
func TestAGiveBackACutLeftUnrecordedIsSaidByTheNextApply(t *testing.T) {
	for _, tc := range []struct {
		name, res, file, found, want string
		undone                       shapes.Outcome
	}{
		{"keys", `{"module":"b","id":"k","type":"keys","path":"{root}/env","format":"equals","set":{"MOD_B":"x"}}`, "env", "HOST = 1\n", "MOD_B is gone already", shapes.Restored},
		{"region", `{"module":"b","id":"k","type":"region","path":"{root}/env","content":"mesh line\n"}`, "env", "HOST = 1\n", "", shapes.Removed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			if err := os.WriteFile(h.p(tc.file), []byte(tc.found), 0o644); err != nil {
				t.Fatal(err)
			}
			file := `{"module":"a","id":"f","type":"file","path":"{root}/f","content":"f\n"}`
			both, one := h.doc(file, tc.res), h.doc(file)
			h.expect(h.apply(both), shapes.Applied, "a.f=applied b.k=applied")
			// The originals as the cut leaves them: forgotten only once the
			// records that no longer need them are durable, which the cut
			// came before.
			originals := filepath.Join(h.state, "originals")
			kept := map[string][]byte{}
			if ents, err := os.ReadDir(originals); err == nil {
				for _, o := range ents {
					kept[o.Name()], _ = os.ReadFile(filepath.Join(originals, o.Name()))
				}
			}
			h.expect(h.apply(one), tc.undone, "a.f=unchanged b.k="+string(tc.undone))
			for name, b := range kept {
				os.WriteFile(filepath.Join(originals, name), b, 0o600)
			}
			// The cut: the give-back made (the file as found), what was said
			// of it and its record lost.
			cutJournal(t, h.state, func(op, _ string) bool { return op == "said" })
			if got, _ := os.ReadFile(h.p(tc.file)); string(got) != tc.found {
				t.Fatalf("the file after the give-back: %q", got)
			}
			rep := h.apply(one)
			h.expect(rep, tc.undone, "a.f=unchanged b.k="+string(tc.undone))
			if d := rep.Lines[1].Detail; !strings.HasPrefix(d, "undone by the apply of this declaration a power cut or a kill cut short") || !strings.Contains(d, tc.want) {
				t.Fatalf("%+v", rep.Lines[1])
			}
			h.expect(h.apply(one), shapes.Unchanged, "a.f=unchanged")
		})
	}
}

// A create a kill cut after its intent and before the file was made,
// then, at the next apply, its new intent written beside another step's
// in one batch and abandoned when that step's change fails first: the cut
// create is in doubt as before — its intent pending, the entry settled
// for it no record of a file made — and the next apply makes the file.
func TestACutIntentReplacedThenAbandonedIsInDoubtAgain(t *testing.T) {
	h := newHarness(t)
	d := `{"module":"m","id":"d","type":"file","path":"{root}/d","content":"1\n"}`
	h.expect(h.apply(h.doc(d)), shapes.Applied, "m.d=applied")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && target == "path:"+h.p("d") })
	os.Remove(h.p("d")) // the kill came before the create
	// A change that fails at its write, after every intent of the batch is
	// written: more content than the filesystem under it holds.
	small := h.p("small")
	os.Mkdir(small, 0o755)
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	big := fmt.Sprintf(`{"module":"m","id":"big","type":"file","path":"{root}/small/big","content":%q}`, strings.Repeat("x", 256<<10))
	if rep := h.apply(h.doc(big, d)); rep.Outcome != shapes.Failed {
		t.Fatalf("the apply whose first change fails: %+v", rep.Lines)
	}
	h.absent("d")
	st, err := store.Open(h.state)
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Get("path:" + h.p("d")); e == nil || e.Pending == nil || e.Pending.Op != "create" {
		t.Fatalf("the cut create after its replacement was abandoned: %+v", e)
	}
	unix.Unmount(small, unix.MNT_DETACH)
	// The big file's intent stayed pending (its change failed half-way,
	// perhaps): settled, it is gone, and undeclared it is said so.
	h.expect(h.apply(h.doc(d)), shapes.Applied, "m.d=applied m.big=removed")
}

// A directory made and cut before its owner and mode were set (a kill
// between its mkdir and its chmod) is there at the root-only mode mkdir
// makes it with, its creation never recorded. The next apply does not
// take that for found (no mode declared: as found, for good): it sets
// what the making would have, and says the cut apply made it. A plan says
// the same first.
func TestADirectoryCutBeforeItsModeIsGivenIt(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/d"}`)
	h.expect(h.apply(doc), shapes.Applied, "m.d=applied")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasSuffix(target, "/d") })
	os.Chmod(h.p("d"), 0o700) // as mkdir left it
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	h.expect(rep, shapes.Applied, "m.d=applied")
	if plan.Lines[0].Outcome != shapes.Applied || rep.Lines[0].Detail != "owner and mode 0700 0:0 → 0755 0:0" || plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan %+v\napply %+v", plan.Lines[0], rep.Lines[0])
	}
	if fi, _ := os.Stat(h.p("d")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	h.expect(h.apply(doc), shapes.Unchanged, "m.d=unchanged")
	// Recorded, a mode a person set since is theirs (none declared).
	os.Chmod(h.p("d"), 0o750)
	h.expect(h.apply(doc), shapes.Unchanged, "m.d=unchanged")
}
