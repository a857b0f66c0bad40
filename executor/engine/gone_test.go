package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// planThenApply plans doc, then applies it, and fails t unless the two
// say the same lines, outcome by outcome and word by word.
func planThenApply(t *testing.T, h *harness, doc string) *shapes.Report {
	t.Helper()
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	if len(plan.Lines) != len(rep.Lines) {
		t.Fatalf("plan %+v\napply %+v", plan.Lines, rep.Lines)
	}
	for i := range rep.Lines {
		if plan.Lines[i].Outcome != rep.Lines[i].Outcome || plan.Lines[i].Detail != rep.Lines[i].Detail {
			t.Fatalf("line %d:\nplan  %s %q\napply %s %q", i, plan.Lines[i].Outcome, plan.Lines[i].Detail, rep.Lines[i].Outcome, rep.Lines[i].Detail)
		}
	}
	return rep
}

// A directory or a file declared where an archive of the same
// declaration puts the other kind: the plan fails where the apply does,
// saying the same.
func TestAPlanSeesWhatAnArchiveBeforeItMakes(t *testing.T) {
	for _, tc := range []struct{ name, res, want string }{
		{"a directory at an archive's file", `{"module":"m","id":"d","type":"directory","path":"{root}/themes/theme/index.theme"}`, "is a regular file, not a directory"},
		{"a file at an archive's directory", `{"module":"m","id":"f","type":"file","path":"{root}/themes/theme/icons","content":"x"}`, "is a directory; the host writes only regular files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			os.Mkdir(h.p("themes"), 0o755)
			p, sum := makeArchive(t, h.root, "t1.tgz", theme...)
			rep := planThenApply(t, h, h.doc(archiveRes(p, sum, h.p("themes")), tc.res))
			if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[1].Detail, tc.want) {
				t.Fatalf("%+v", rep.Lines)
			}
		})
	}
}

// What the host wrote, replaced since by something it did not make (a
// link, a directory), is not removed or written over when undeclared:
// forgotten, left as it is, the same in the plan — and it stops no later
// apply. A found file's original with nowhere to go back to (that, or its
// directory removed) is kept for a person, not thrown away.
func TestWhatWasReplacedSinceIsLeftAndTheOriginalKept(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		found      bool
		then       func(h *harness)
	}{
		{"made, a link there now", "the host created it; a symbolic link is there now, which the host did not make: left as it is", false, func(h *harness) {
			os.Remove(h.p("d/f"))
			os.Symlink(h.p("elsewhere"), h.p("d/f"))
		}},
		{"made, a directory there now", "the host created it; a directory is there now, which the host did not make: left as it is", false, func(h *harness) {
			os.Remove(h.p("d/f"))
			os.Mkdir(h.p("d/f"), 0o755)
		}},
		{"found, a link there now", "a symbolic link is there now, which the host did not make; the original the host found is not put back: it is kept for 30 days", true, func(h *harness) {
			os.Remove(h.p("d/f"))
			os.Symlink(h.p("elsewhere"), h.p("d/f"))
		}},
		{"found, its directory removed", "its directory " + "{root}/d" + " was removed by something else; the original the host found is not put back: it is kept for 30 days", true, func(h *harness) {
			os.RemoveAll(h.p("d"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := declaredInD(t, tc.found)
			tc.then(h)
			rep := planThenApply(t, h, h.doc())
			want := strings.ReplaceAll(tc.want, "{root}", h.root)
			if rep.Outcome == shapes.Failed || len(rep.Lines) != 1 || rep.Lines[0].Outcome != shapes.Forgotten || !strings.Contains(rep.Lines[0].Detail, want) {
				t.Fatalf("%+v", rep.Lines)
			}
			if fi, err := os.Lstat(h.p("d/f")); tc.name != "found, its directory removed" && (err != nil || fi.Mode().IsRegular()) {
				t.Fatalf("what was put there since was touched: %v %v", fi, err)
			}
			st := mustStore(t, h.state)
			if st.Get("path:"+h.p("d/f")) != nil {
				t.Fatal("still recorded")
			}
			if sv := st.Salvaged(); tc.found != (len(sv) == 1) {
				t.Fatalf("kept: %+v", sv)
			} else if tc.found {
				if b, err := os.ReadFile(st.OriginalPath(sv[0].Digest)); err != nil || string(b) != "a person's\n" {
					t.Fatalf("the original kept: %q %v", b, err)
				}
			}
			// And it stops nothing after.
			h.expect(h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)), shapes.Applied, "m.g=applied")
		})
	}
}

// An archive undeclared, one of whose files a person replaced with a link
// since: the link is left as it is, the rest removed, the directory that
// holds it kept; the plan says so as the apply does, and nothing after is
// stopped.
func TestAnArchiveFileReplacedByALinkIsLeft(t *testing.T) {
	h := unpackedTheme(t)
	link := h.p("themes/theme/icons/a.svg")
	os.Remove(link)
	os.Symlink(h.p("elsewhere"), link)
	rep := planThenApply(t, h, h.doc())
	if rep.Outcome == shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "1 is a link or special file now, which the host did not make: left as it is ("+link+")") {
		t.Fatalf("%+v", rep.Lines)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link: %v %v", fi, err)
	}
	h.absent("themes/theme/index.theme")
	// Its directories kept while they hold the link, said again.
	h.expect(h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)), shapes.Kept, "m.g=applied ui.theme=kept")
}

// An archive undeclared, one of whose directories a person replaced with
// a link since: what is reached through the link is never followed nor
// removed — kept, with the archive's record, for the host's files may be
// where the directory went — the rest removed, in the plan as in the
// apply; no later apply fails; once the link is gone, it goes.
func TestAnArchiveDirectoryReplacedByALinkIsLeft(t *testing.T) {
	h := unpackedTheme(t)
	os.Mkdir(h.p("elsewhere"), 0o755)
	os.WriteFile(h.p("elsewhere/a.svg"), []byte("not the archive's"), 0o644)
	os.RemoveAll(h.p("themes/theme/icons"))
	os.Symlink(h.p("elsewhere"), h.p("themes/theme/icons"))
	rep := planThenApply(t, h, h.doc())
	if rep.Outcome != shapes.Kept || !strings.Contains(rep.Lines[0].Detail, "1 path is reached through a link now, never followed: kept, and removed once the link is gone ("+h.p("themes/theme/icons/a.svg")+")") {
		t.Fatalf("%+v", rep.Lines)
	}
	if b, err := os.ReadFile(h.p("elsewhere/a.svg")); err != nil || string(b) != "not the archive's" {
		t.Fatalf("through the link: %q %v", b, err)
	}
	h.absent("themes/theme/index.theme")
	if rep := h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)); rep.Outcome == shapes.Failed {
		t.Fatalf("a later apply: %+v", rep.Lines)
	}
	os.Remove(h.p("themes/theme/icons"))
	h.expect(h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)), shapes.Removed, "m.g=unchanged ui.theme=removed")
	h.absent("themes/theme")
}

// A file the host created, or one it changed, whose directory a person
// replaced with a link since: never followed — kept, for the host's file
// may be where the directory went, not failed (which would fail every
// apply after), in the plan as in the apply; once the link is gone, undone.
func TestWhatIsBehindALinkNowIsKeptUntilItIsGone(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		found      bool
		then       shapes.Outcome
	}{
		{"made", "the host created it; a link is on its way now, which the host never follows: kept, and removed once the link is gone", false, shapes.Removed},
		{"found", "the host changed it; a link is on its way now, which the host never follows: kept, and its original given back once the link is gone", true, shapes.Restored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := declaredInD(t, tc.found)
			os.Rename(h.p("d"), h.p("d.away"))
			os.Mkdir(h.p("elsewhere"), 0o755)
			os.WriteFile(h.p("elsewhere/f"), []byte("not the host's\n"), 0o644)
			os.Symlink(h.p("elsewhere"), h.p("d"))
			rep := planThenApply(t, h, h.doc())
			if rep.Outcome != shapes.Kept || rep.Lines[0].Detail != tc.want {
				t.Fatalf("%+v", rep.Lines)
			}
			if b, _ := os.ReadFile(h.p("elsewhere/f")); string(b) != "not the host's\n" {
				t.Fatalf("through the link: %q", b)
			}
			os.Remove(h.p("d"))
			os.Rename(h.p("d.away"), h.p("d"))
			h.expect(h.apply(h.doc()), tc.then, "m.f="+string(tc.then))
		})
	}
}

// A found file whose directory was removed since, and a region declared
// in it after: the plan says the original is not put back, and the
// region fails for want of its file, as the apply does.
func TestAPlanDoesNotPutBackAnOriginalItKeeps(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("d"), 0o755)
	os.WriteFile(h.p("d/hosts"), []byte("a person's\n"), 0o644)
	h.expect(h.apply(h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/d/hosts","content":"declared\n"}`)), shapes.Applied, "m.f=applied")
	os.RemoveAll(h.p("d"))
	rep := planThenApply(t, h, h.doc(`{"module":"m","id":"r","type":"region","path":"{root}/d/hosts","content":"10.0.0.5 db\n"}`))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[len(rep.Lines)-1].Detail, "does not exist") {
		t.Fatalf("%+v", rep.Lines)
	}
}

// declaredInD is a harness whose tree has d/f declared and applied: found
// there before (a person's) or made by the host.
func declaredInD(t *testing.T, found bool) *harness {
	t.Helper()
	h := newHarness(t)
	os.Mkdir(h.p("d"), 0o755)
	if found {
		os.WriteFile(h.p("d/f"), []byte("a person's\n"), 0o644)
	}
	h.expect(h.apply(h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/d/f","content":"declared\n"}`)), shapes.Applied, "m.f=applied")
	return h
}

// A directory the host created, replaced since by a link or a file: left
// as it is and forgotten, in the plan as in the apply, and no apply after
// fails on it.
func TestADirectoryReplacedSinceIsLeft(t *testing.T) {
	for _, kind := range []string{"link", "file"} {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			h.expect(h.apply(h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/dd"}`)), shapes.Applied, "m.d=applied")
			os.Rename(h.p("dd"), h.p("dd.real"))
			if kind == "link" {
				os.Symlink(h.p("dd.real"), h.p("dd"))
			} else {
				os.WriteFile(h.p("dd"), []byte("a person's\n"), 0o644)
			}
			rep := planThenApply(t, h, h.doc())
			if rep.Outcome != shapes.Forgotten || !strings.Contains(rep.Lines[0].Detail, "which the host did not make: left as it is") {
				t.Fatalf("%+v", rep.Lines)
			}
			if _, err := os.Lstat(h.p("dd")); err != nil {
				t.Fatal(err)
			}
			h.expect(h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)), shapes.Applied, "m.g=applied")
		})
	}
}

// An edit larger than the host keeps a copy of — of a found file the host
// changed, or of a file an archive wrote — is never thrown away unsaid on
// undeclare: the original is not put back over it, the archive's file not
// removed; kept, in the plan as in the apply.
func TestAnEditTooLargeToKeepIsNotThrownAway(t *testing.T) {
	grow := func(t *testing.T, p string) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(maxOriginal + 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("a found file", func(t *testing.T) {
		h := declaredInD(t, true)
		grow(t, h.p("d/f"))
		rep := planThenApply(t, h, h.doc())
		if rep.Outcome != shapes.Kept || !strings.Contains(rep.Lines[0].Detail, "so its original is not put back over it") {
			t.Fatalf("%+v", rep.Lines)
		}
		if fi, _ := os.Stat(h.p("d/f")); fi.Size() != maxOriginal+1<<20 {
			t.Fatalf("the edit is gone: %d bytes", fi.Size())
		}
	})
	t.Run("an archive's file", func(t *testing.T) {
		h := newHarness(t)
		os.Mkdir(h.p("themes"), 0o755)
		p, sum := makeArchive(t, h.root, "t1.tgz", theme...)
		h.expect(h.apply(h.doc(archiveRes(p, sum, h.p("themes")))), shapes.Applied, "ui.theme=applied")
		grow(t, h.p("themes/theme/index.theme"))
		rep := planThenApply(t, h, h.doc())
		if rep.Outcome != shapes.Kept || !strings.Contains(rep.Lines[0].Detail, "1 was edited by hand since, larger than the host keeps a copy of (64 MiB): not removed") {
			t.Fatalf("%+v", rep.Lines)
		}
		if fi, err := os.Stat(h.p("themes/theme/index.theme")); err != nil || fi.Size() != maxOriginal+1<<20 {
			t.Fatalf("the edit is gone: %v %v", fi, err)
		}
	})
}

// A plan of an archive meeting what the same declaration declares before
// it, or what another archive makes, says what the apply then does.
func TestAPlanOfAnArchiveAfterWhatMakesItsWay(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  func(h *harness, a, sum string) []string
	}{
		{"a file where it has a directory", func(h *harness, a, sum string) []string {
			return []string{`{"module":"m","id":"f","type":"file","path":"{root}/themes/theme","content":"x"}`, archiveRes(a, sum, h.p("themes"))}
		}},
		{"a directory where it has one", func(h *harness, a, sum string) []string {
			return []string{`{"module":"m","id":"d","type":"directory","path":"{root}/themes/theme"}`, archiveRes(a, sum, h.p("themes"))}
		}},
		{"a destination another archive makes", func(h *harness, a, sum string) []string {
			second := strings.Replace(archiveRes(a, sum, h.p("themes/theme/icons")), `"id":"theme"`, `"id":"icons"`, 1)
			return []string{archiveRes(a, sum, h.p("themes")), second}
		}},
		{"a directory inside what it makes", func(h *harness, a, sum string) []string {
			return []string{archiveRes(a, sum, h.p("themes")), `{"module":"m","id":"d","type":"directory","path":"{root}/themes/theme/icons","mode":"0700"}`}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			os.Mkdir(h.p("themes"), 0o755)
			a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
			planThenApply(t, h, h.doc(tc.res(h, a, sum)...))
		})
	}
}

// Keys or a region declared in a file an archive of the same source
// wrote, the archive no longer declared: refused whole, as in a file the
// mesh made whole — undeclared, the archive takes its file away, and the
// edit would fail at every apply after on a file not there.
func TestAnEditInAnUndeclaredArchivesFileIsRefused(t *testing.T) {
	for _, edit := range []string{
		`{"module":"m","id":"k","type":"keys","path":"{root}/themes/theme/index.theme","format":"equals","set":{"Name":"x"}}`,
		`{"module":"m","id":"r","type":"region","path":"{root}/themes/theme/index.theme","content":"Name=x\n"}`,
	} {
		h := newHarness(t)
		os.Mkdir(h.p("themes"), 0o755)
		a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
		if rep := h.apply(h.doc(archiveRes(a, sum, h.p("themes")), edit)); rep.Outcome == shapes.Failed || rep.Outcome == shapes.Refused {
			t.Fatalf("%+v", rep)
		}
		before := h.tree()
		rep := h.apply(h.doc(edit))
		if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "was unpacked by the mesh's archive local:ui.theme, which this declaration no longer declares") {
			t.Fatalf("%+v", rep)
		}
		if h.tree() != before {
			t.Fatal("the refusal changed the tree")
		}
	}
}

// The rest of what the sweeps and reviews found where features meet, each
// in the plan as in the apply.
func TestWhereArchivesMeetTheRest(t *testing.T) {
	t.Run("an archive renamed, keys added in its file: not refused", func(t *testing.T) {
		h := newHarness(t)
		os.Mkdir(h.p("themes"), 0o755)
		a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
		h.expect(h.apply(h.doc(archiveRes(a, sum, h.p("themes")))), shapes.Applied, "ui.theme=applied")
		renamed := strings.Replace(archiveRes(a, sum, h.p("themes")), `"id":"theme"`, `"id":"theme2"`, 1)
		keys := `{"module":"m","id":"k","type":"keys","path":"{root}/themes/theme/index.theme","format":"equals","set":{"Name":"x"}}`
		plan := h.run(store.Local, h.doc(renamed, keys), true)
		if rep := h.apply(h.doc(renamed, keys)); rep.Outcome == shapes.Refused || rep.Outcome == shapes.Failed || plan.Outcome != rep.Outcome {
			t.Fatalf("plan %+v\napply %+v", plan, rep)
		}
	})
	t.Run("a file the host made, its directory replaced by a file", func(t *testing.T) {
		h := declaredInD(t, false)
		os.RemoveAll(h.p("d"))
		os.WriteFile(h.p("d"), []byte("a person's\n"), 0o644)
		rep := planThenApply(t, h, h.doc())
		if rep.Outcome != shapes.Forgotten || !strings.Contains(rep.Lines[0].Detail, "its directory is not a directory now") {
			t.Fatalf("%+v", rep.Lines)
		}
		h.expect(h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"g\n"}`)), shapes.Applied, "m.g=applied")
	})
	t.Run("a directory inside an archive whose destination the declaration makes", func(t *testing.T) {
		h := newHarness(t)
		a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
		planThenApply(t, h, h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/themes","owner":"nobody:nogroup"}`,
			archiveRes(a, sum, h.p("themes")),
			`{"module":"m","id":"sub","type":"directory","path":"{root}/themes/theme","owner":"nobody:nogroup"}`))
	})
	t.Run("an edit too large to keep, carried into a version without it", func(t *testing.T) {
		h := newHarness(t)
		os.Mkdir(h.p("themes"), 0o755)
		a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
		h.expect(h.apply(h.doc(archiveRes(a, sum, h.p("themes")))), shapes.Applied, "ui.theme=applied")
		f, _ := os.OpenFile(h.p("themes/theme/icons/a.svg"), os.O_WRONLY, 0)
		f.Truncate(maxOriginal + 1<<20)
		f.Close()
		a2, sum2 := makeArchive(t, h.root, "t2.tgz", theme[0], theme[1])
		v2 := h.doc(archiveRes(a2, sum2, h.p("themes")))
		for range 2 {
			rep := planThenApply(t, h, v2)
			if fi, err := os.Stat(h.p("themes/theme/icons/a.svg")); err != nil || fi.Size() != maxOriginal+1<<20 {
				t.Fatalf("the edit is gone: %v %v (%+v)", fi, err, rep.Lines)
			}
		}
	})
}

// A directory the host made, undeclared while an archive that stays wrote
// into it: what the archive holds is said declared still, not an entry
// the host did not create.
func TestADirectoryHoldingAnArchivesFilesSaysSo(t *testing.T) {
	h := newHarness(t)
	a, sum := makeArchive(t, h.root, "t1.tgz", theme...)
	dir := `{"module":"m","id":"d","type":"directory","path":"{root}/themes"}`
	if rep := h.apply(h.doc(dir, archiveRes(a, sum, h.p("themes")))); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep.Lines)
	}
	rep := h.apply(h.doc(archiveRes(a, sum, h.p("themes"))))
	if rep.Outcome != shapes.Kept || !strings.Contains(rep.Lines[1].Detail, "1 entry declared still (theme)") {
		t.Fatalf("%+v", rep.Lines)
	}
}

// unpackedTheme is a harness whose themes/ holds the theme archive, applied.
func unpackedTheme(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	os.Mkdir(h.p("themes"), 0o755)
	p, sum := makeArchive(t, h.root, "t1.tgz", theme...)
	h.expect(h.apply(h.doc(archiveRes(p, sum, h.p("themes")))), shapes.Applied, "ui.theme=applied")
	return h
}
