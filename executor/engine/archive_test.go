package engine

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

type tarEntry struct {
	name string
	typ  byte
	body string
	mode int64
}

// makeArchive writes a gzipped tar into dir and returns its path and digest.
func makeArchive(t *testing.T, dir, name string, entries ...tarEntry) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if e.typ == tar.TypeSymlink || e.typ == tar.TypeLink {
			hdr.Linkname, hdr.Size = e.body, 0
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	gz.Close()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return p, hex.EncodeToString(sum[:])
}

func archiveRes(p, sum, dest string) string {
	return fmt.Sprintf(`{"module":"ui","id":"theme","type":"archive","url":"file://%s","sha256":%q,"destination":%q}`, p, sum, dest)
}

var theme = []tarEntry{
	{name: "theme/", typ: tar.TypeDir, mode: 0o755},
	{name: "theme/index.theme", typ: tar.TypeReg, body: "[Theme]\n"},
	{name: "theme/icons/", typ: tar.TypeDir, mode: 0o755},
	{name: "theme/icons/a.svg", typ: tar.TypeReg, body: "<svg/>", mode: 0o600},
}

func TestArchiveUnpackRepairRemove(t *testing.T) {
	h := newHarness(t)
	dest := h.p("themes")
	os.Mkdir(dest, 0o755)
	os.Chown(dest, 1000, 1000) // a home's directory: what is unpacked is its owner's
	p, sum := makeArchive(t, h.root, "t1.tgz", theme...)
	doc := h.doc(archiveRes(p, sum, dest))
	h.expect(h.apply(doc), shapes.Applied, "ui.theme=applied")
	if h.read("themes/theme/icons/a.svg") != "<svg/>" || h.mode("themes/theme/icons/a.svg") != 0o600 || ownerOf(t, h.p("themes/theme/index.theme")) != "1000:1000" {
		t.Fatal("not unpacked as the archive says, owned by the destination's owner")
	}
	h.expect(h.apply(doc), shapes.Unchanged, "ui.theme=unchanged")
	os.WriteFile(h.p("themes/theme/index.theme"), []byte("vandal"), 0o644)
	os.Remove(h.p("themes/theme/icons/a.svg"))
	h.expect(h.apply(doc), shapes.Repaired, "ui.theme=repaired")
	if h.read("themes/theme/index.theme") != "[Theme]\n" || h.read("themes/theme/icons/a.svg") != "<svg/>" {
		t.Fatal("drift not repaired")
	}
	// A new version: what the old one wrote and the new one lacks goes.
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", theme[0], theme[1])
	h.expect(h.apply(h.doc(archiveRes(p2, sum2, dest))), shapes.Applied, "ui.theme=applied")
	h.absent("themes/theme/icons")
	// Undeclared: the files it wrote are removed; what someone else put in
	// its directories keeps them.
	// The directory it made that holds such a file is kept, and the
	// archive's record with it: every later report names it, and it goes
	// once it is empty.
	os.WriteFile(h.p("themes/theme/mine"), []byte("operator"), 0o644)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Kept, "ui.theme=kept")
	if want := "1 of the 2 paths it wrote removed; the directories it made that hold what it did not write are kept, and removed once empty: " + h.p("themes/theme") + " (holds mine)"; rep.Lines[0].Detail != want || plan.Lines[0].Detail != want {
		t.Fatalf("plan %q\napply %q\nwant %q", plan.Lines[0].Detail, rep.Lines[0].Detail, want)
	}
	h.absent("themes/theme/index.theme")
	if h.read("themes/theme/mine") != "operator" {
		t.Fatal("a file the archive did not write was removed")
	}
	h.expect(h.apply(h.doc()), shapes.Kept, "ui.theme=kept")
	os.Remove(h.p("themes/theme/mine"))
	h.expect(h.apply(h.doc()), shapes.Removed, "ui.theme=removed")
	h.absent("themes/theme")
	if _, err := os.Stat(dest); err != nil {
		t.Fatal("the destination, which the host did not create, was removed")
	}
	h.expect(h.apply(h.doc()), shapes.Unchanged, "")
}

func TestArchiveRefusedWholeBeforeAByteIsWritten(t *testing.T) {
	cases := []struct {
		name    string
		entries []tarEntry
		want    string
	}{
		{"dot-dot", []tarEntry{{name: "ok", typ: tar.TypeReg, body: "x"}, {name: "../escape", typ: tar.TypeReg, body: "x"}}, `entry "../escape" names a path outside the destination; refused, not relocated`},
		{"absolute", []tarEntry{{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}}, "outside the destination"},
		{"sneaky", []tarEntry{{name: "a/", typ: tar.TypeDir}, {name: "a/../../b", typ: tar.TypeReg, body: "x"}}, "outside the destination"},
		{"symlink", []tarEntry{{name: "ok", typ: tar.TypeReg, body: "x"}, {name: "l", typ: tar.TypeSymlink, body: "/etc/shadow"}}, `entry "l" is a symbolic link`},
		{"hardlink", []tarEntry{{name: "h", typ: tar.TypeLink, body: "/etc/shadow"}}, "is a hard link"},
		{"device", []tarEntry{{name: "d", typ: tar.TypeChar}}, "is a device node"},
		{"fifo", []tarEntry{{name: "f", typ: tar.TypeFifo}}, "is a FIFO"},
		{"orphan", []tarEntry{{name: "nodir/x", typ: tar.TypeReg, body: "x"}}, `which the archive does not hold`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			dest := h.p("dest")
			os.Mkdir(dest, 0o755)
			p, sum := makeArchive(t, h.root, "a.tgz", c.entries...)
			rep := h.apply(h.doc(archiveRes(p, sum, dest)))
			if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, c.want) {
				t.Fatalf("%+v, want failure %q", rep.Lines, c.want)
			}
			if ents, _ := os.ReadDir(dest); len(ents) != 0 {
				t.Fatalf("something was written: %v", ents)
			}
		})
	}
}

func TestArchiveDigestAndOwnership(t *testing.T) {
	h := newHarness(t)
	dest := h.p("dest")
	os.Mkdir(dest, 0o755)
	p, sum := makeArchive(t, h.root, "a.tgz", tarEntry{name: "f", typ: tar.TypeReg, body: "x"})
	wrong := strings.Repeat("0", 64)
	// Planned as applied: the digest checked, not what a mismatched file
	// would unpack.
	rep := h.run(store.Local, h.doc(archiveRes(p, wrong, dest)), true)
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "archive digest mismatch") || !strings.Contains(rep.Lines[0].Detail, sum) {
		t.Fatalf("plan: %+v", rep.Lines)
	}
	rep = h.apply(h.doc(archiveRes(p, wrong, dest)))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "archive digest mismatch") || !strings.Contains(rep.Lines[0].Detail, sum) {
		t.Fatalf("%+v", rep.Lines)
	}
	// An obj:// archive not in the cache, from a local file: no agent
	// streams one for it; planned and applied alike, failed.
	obj := strings.Replace(archiveRes(p, sum, dest), "file://"+p, "obj://"+sum, 1)
	for _, r := range []*shapes.Report{h.run(store.Local, h.doc(obj), true), h.apply(h.doc(obj))} {
		if r.Outcome != shapes.Failed || !strings.Contains(r.Lines[0].Detail, "never for a local file or the bundle") {
			t.Fatalf("obj:// from a local file: %+v", r.Lines)
		}
	}
	h.absent("dest/f")
	// Something already there that the host did not write is not overwritten.
	os.WriteFile(filepath.Join(dest, "f"), []byte("operator's"), 0o644)
	rep = h.apply(h.doc(archiveRes(p, sum, dest)))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "is not the host's; an archive does not overwrite") {
		t.Fatalf("%+v", rep.Lines)
	}
	if h.read("dest/f") != "operator's" {
		t.Fatal("overwritten")
	}
	// Over the link, the executor fetches nothing itself.
	p3, sum3 := makeArchive(t, h.root, "b.tgz", tarEntry{name: "g", typ: tar.TypeReg, body: "y"})
	d, _ := shapes.Parse([]byte(h.doc(archiveRes(p3, sum3, dest))))
	st := mustStore(t, h.state)
	st.Lock(0)
	defer st.Unlock()
	r := &run{st: st, opt: Options{Source: store.Link}}
	if _, err := r.fetchArchive(d.Resources[0].(*shapes.Archive)); err == nil || !strings.Contains(err.Error(), "not over the link") {
		t.Fatalf("fetch over the link: %v", err)
	}
}

// The cache writer takes chunks in order, bounded, and keeps the bytes only
// under their own digest; anything else leaves nothing.
func TestCacheWriter(t *testing.T) {
	state := t.TempDir()
	body := []byte("some archive bytes")
	s := sha256.Sum256(body)
	sum := hex.EncodeToString(s[:])
	if _, err := NewCacheWriter(state, "../../etc/x", ".part", 100); err == nil {
		t.Fatal("a digest that is not one named a file")
	}
	w, err := NewCacheWriter(state, sum, ".part", uint64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(3, body); err == nil || !strings.Contains(err.Error(), "in order") {
		t.Fatalf("out of order: %v", err)
	}
	if err := w.Write(0, body[:5]); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(5, append(body[5:], 'x')); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("past the bound: %v", err)
	}
	w.Write(5, body[5:])
	p, err := w.Commit()
	if err != nil || p != filepath.Join(state, "archives", sum) {
		t.Fatal(p, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// Another digest's name for these bytes: nothing kept.
	other := strings.Repeat("0", 64)
	w, _ = NewCacheWriter(state, other, ".part", 100)
	w.Write(0, body)
	if _, err := w.Commit(); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("%v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "archives"))
	if len(ents) != 1 || ents[0].Name() != sum {
		t.Fatalf("the cache holds %v", ents)
	}
	// Pruned: what keep lacks goes.
	if gone := PruneArchiveCache(state, map[string]bool{}); len(gone) != 1 {
		t.Fatalf("pruned %v", gone)
	}
}

// A file declared at a path an archive of the same declaration also
// writes (a default configuration the archive brings, the module's own
// over it) is the file's: the archive leaves it, in either order. Written
// by both, each apply put back the other's — both lines repaired at every
// apply, and restart_on firing with them; with the file first, the archive
// failed ("not the host's"). Undeclared, the file goes (or its original,
// the archive's, comes back) before the archive is looked at: removed at
// the end, it stood in the archive's way, whose failure stopped the apply
// before the removal, at every apply. The archive undeclared while the
// file stays does not take the file's path. Each step is planned first,
// and the plan gives each line the apply's outcome.
// fileStep is one apply of a test of a file and an archive at one path:
// the resources declared, the lines the plan and the apply give, and what
// the file holds after ("" for gone).
type fileStep struct {
	res         []string
	lines, want string
}

// fileSteps applies each step, its plan first, and holds both and the
// file at conf to it.
func fileSteps(t *testing.T, h *harness, conf string, steps []fileStep) {
	t.Helper()
	for i, c := range steps {
		doc := h.doc(c.res...)
		plan := h.run(store.Local, doc, true)
		rep := h.apply(doc)
		if got := outcomes(rep); got != c.lines || outcomes(plan) != got {
			t.Fatalf("step %d: plan [%s], apply [%s], want [%s]\n%+v", i+1, outcomes(plan), got, c.lines, rep.Lines)
		}
		b, err := os.ReadFile(conf)
		if string(b) != c.want || (c.want == "") != os.IsNotExist(err) {
			t.Fatalf("step %d: %s holds %q (%v), want %q", i+1, conf, b, err, c.want)
		}
	}
}

func TestAnArchiveAndAFileOfOnePath(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	arch := archiveRes(p, sum, dest)
	conf := h.p("themes/theme/index.theme")
	file := `{"module":"m","id":"f","type":"file","path":"` + conf + `","content":"mine\n"}`
	dir := `{"module":"m","id":"d","type":"directory","path":"` + h.p("themes/theme") + `"}`
	fileSteps(t, h, conf, []fileStep{
		{[]string{arch}, "ui.theme=applied", "[Theme]\n"},
		{[]string{arch, file}, "ui.theme=unchanged m.f=applied", "mine\n"},
		{[]string{arch, file}, "ui.theme=unchanged m.f=unchanged", "mine\n"},
		{[]string{arch}, "m.f=restored ui.theme=unchanged", "[Theme]\n"},
		{nil, "ui.theme=removed", ""},
		{[]string{dir, file, arch}, "m.d=applied m.f=applied ui.theme=applied", "mine\n"},
		{[]string{dir, file, arch}, "m.d=unchanged m.f=unchanged ui.theme=unchanged", "mine\n"},
		{[]string{dir, file}, "m.d=unchanged m.f=unchanged ui.theme=removed", "mine\n"},
		{[]string{dir, file, arch}, "m.d=unchanged m.f=unchanged ui.theme=applied", "mine\n"},
		{[]string{arch}, "m.f=removed ui.theme=repaired m.d=kept", "[Theme]\n"},
	})
}

// A path the mesh made a directory, declared a file next (and the other
// way): the old shape is undone first, so the new one has its way. Undone
// last, with the other removals, the new one's step found the old one in
// its way, failed, and stopped the apply before the removal: at every
// apply. A directory the mesh made that holds what it did not make stays,
// and the file fails on it, saying so; a found directory is the person's.
// Each step's plan says what its apply does.
func TestADirectoryTheMeshMadeDeclaredAFile(t *testing.T) {
	h := newHarness(t)
	x := h.p("x")
	dir := `{"module":"m","id":"d","type":"directory","path":"` + x + `"}`
	file := `{"module":"m","id":"f","type":"file","path":"` + x + `","content":"now a file\n"}`
	isDir := func() bool { info, err := os.Lstat(x); return err == nil && info.IsDir() }
	isFile := func() bool { b, err := os.ReadFile(x); return err == nil && string(b) == "now a file\n" }
	for i, c := range []struct {
		res   string
		lines string
		is    func() bool
		hands func()
	}{
		{dir, "m.d=applied", isDir, nil},
		{file, "m.d=removed m.f=applied", isFile, nil},
		{file, "m.f=unchanged", isFile, nil},
		{dir, "m.f=removed m.d=applied", isDir, nil},
		// Someone puts a file of theirs in it: kept, and the file fails.
		{file, "m.d=kept m.f=failed", isDir, func() { os.WriteFile(filepath.Join(x, "theirs"), nil, 0o644) }},
		{file, "m.d=kept m.f=failed", isDir, nil},
		// Taken out again, the directory goes and the file comes.
		{file, "m.d=removed m.f=applied", isFile, func() { os.Remove(filepath.Join(x, "theirs")) }},
	} {
		if c.hands != nil {
			c.hands()
		}
		doc := h.doc(c.res)
		plan := h.run(store.Local, doc, true)
		rep := h.apply(doc)
		if got := outcomes(rep); got != c.lines || outcomes(plan) != got {
			t.Fatalf("step %d: plan [%s], apply [%s], want [%s]\n%+v", i+1, outcomes(plan), got, c.lines, rep.Lines)
		}
		if !c.is() {
			t.Fatalf("step %d: %s is not what was declared", i+1, x)
		}
	}
}

// A directory the host found, taken away by someone: made again while
// declared (repaired, as a file the host holds is), and undeclared while
// gone, forgotten — nothing of the host's is left to give back — rather
// than a failure that would stop every later apply's removals at it.
func TestADirectoryTheHostFoundTakenAway(t *testing.T) {
	h := newHarness(t)
	x := h.p("x")
	if err := os.Mkdir(x, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := h.doc(`{"module":"m","id":"d","type":"directory","path":"` + x + `"}`)
	gone := func() { os.Remove(x) }
	for i, c := range []struct {
		doc, lines string
		hands      func()
	}{
		{dir, "m.d=unchanged", nil},
		{dir, "m.d=repaired", gone},
		{dir, "m.d=unchanged", nil},
		{h.doc(), "m.d=forgotten", gone},
		{h.doc(), "", nil},
	} {
		if c.hands != nil {
			c.hands()
		}
		plan := h.run(store.Local, c.doc, true)
		rep := h.apply(c.doc)
		if got := outcomes(rep); got != c.lines || outcomes(plan) != got {
			t.Fatalf("step %d: plan [%s], apply [%s], want [%s]\n%+v", i+1, outcomes(plan), got, c.lines, rep.Lines)
		}
	}
}

// A path an archive wrote and a file declares over it is never left where
// nothing accounts for it: the archive undeclared while the file stays
// hands the path to the file as the host's own, so the file undeclared
// takes it away (and the archive's directory it held with it) rather than
// put the archive's entry back as an original; a version of the archive
// without the entry keeps the path its own while the file declares it, and
// takes it away once the file no longer does.
func TestAnArchivesPathAFileTookOver(t *testing.T) {
	for _, sc := range []struct {
		name  string
		steps []fileStep // resources by name: a1, a2 (the archive's versions), file
	}{
		{"the archive undeclared first", []fileStep{
			{[]string{"a1"}, "ui.theme=applied", "[Theme]\n"},
			{[]string{"a1", "file"}, "ui.theme=unchanged m.f=applied", "mine\n"},
			{[]string{"file"}, "m.f=unchanged ui.theme=kept", "mine\n"},
			{nil, "m.f=removed ui.theme=removed", ""},
		}},
		{"a version without the entry", []fileStep{
			{[]string{"a1"}, "ui.theme=applied", "[Theme]\n"},
			{[]string{"a1", "file"}, "ui.theme=unchanged m.f=applied", "mine\n"},
			{[]string{"a2", "file"}, "ui.theme=applied m.f=unchanged", "mine\n"},
			{[]string{"a2", "file"}, "ui.theme=unchanged m.f=unchanged", "mine\n"},
			{[]string{"a2"}, "m.f=restored ui.theme=applied", ""},
			{nil, "ui.theme=removed", ""},
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			h := newHarness(t)
			dest := h.p("themes")
			os.Mkdir(dest, 0o755)
			conf := h.p("themes/theme/index.theme")
			p1, sum1 := makeArchive(t, h.root, "t1.tgz", theme...)
			p2, sum2 := makeArchive(t, h.root, "t2.tgz",
				tarEntry{name: "theme/", typ: tar.TypeDir, mode: 0o755},
				tarEntry{name: "theme/README", typ: tar.TypeReg, body: "v2\n"})
			resources := map[string]string{"a1": archiveRes(p1, sum1, dest), "a2": archiveRes(p2, sum2, dest),
				"file": `{"module":"m","id":"f","type":"file","path":"` + conf + `","content":"mine\n"}`}
			for i := range sc.steps {
				for j, n := range sc.steps[i].res {
					sc.steps[i].res[j] = resources[n]
				}
			}
			fileSteps(t, h, conf, sc.steps)
			if left, _ := os.ReadDir(dest); len(left) > 0 {
				t.Fatalf("%s still holds %v after everything was undeclared", dest, left)
			}
		})
	}
}

// A directory an archive made that a directory resource of the same
// declaration declares is left to it when the archive goes: not removed
// (the declaration that still declares it then refused at every apply, its
// parent gone), and taken away with the directory resource once that is
// undeclared, the host having made it. Each step's plan says what its
// apply does.
func TestAnArchiveAndADirectoryOfOnePath(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	arch := archiveRes(p, sum, dest)
	icons := h.p("themes/theme/icons")
	dir := `{"module":"m","id":"icons","type":"directory","path":"` + icons + `","mode":"0750"}`
	for i, c := range []struct {
		res   []string
		lines string
		there bool // icons
	}{
		{[]string{arch, dir}, "ui.theme=applied m.icons=applied", true},
		{[]string{dir}, "m.icons=unchanged ui.theme=kept", true},
		{[]string{dir}, "m.icons=unchanged ui.theme=kept", true},
		{nil, "m.icons=removed ui.theme=removed", false},
	} {
		doc := h.doc(c.res...)
		plan := h.run(store.Local, doc, true)
		rep := h.apply(doc)
		if got := outcomes(rep); got != c.lines || outcomes(plan) != got || rep.Refused != "" {
			t.Fatalf("step %d: plan [%s], apply [%s] %s, want [%s]\n%+v", i+1, outcomes(plan), got, rep.Refused, c.lines, rep.Lines)
		}
		if _, err := os.Lstat(icons); (err == nil) != c.there {
			t.Fatalf("step %d: %s there: %v, want %v", i+1, icons, err == nil, c.there)
		}
	}
	h.absent("themes/theme")
}

// An archive of one source and a file of another at one path: the source
// above has the path (a rescue file or the link's over the bundle's
// archive; the link's archive over the bundle's file), neither rewrites
// the other at each reconcile, neither's going takes away what the other
// still declares, and once both are gone nothing either made is left —
// whichever applied first and whichever goes first.
func TestAnArchiveAndAFileOfAnotherSource(t *testing.T) {
	pairs := []struct{ arch, file store.Source }{
		{store.Bundle, store.Link}, {store.Bundle, store.Local}, {store.Link, store.Local}, {store.Link, store.Bundle}, {store.Local, store.Link},
	}
	for _, c := range pairs {
		for _, archFirst := range []bool{true, false} {
			for _, archGoesFirst := range []bool{true, false} {
				name := fmt.Sprintf("%s archive, %s file, archive applied first %v, archive goes first %v", c.arch, c.file, archFirst, archGoesFirst)
				t.Run(name, func(t *testing.T) {
					h := newHarness(t)
					dest := h.p("themes")
					os.Mkdir(dest, 0o755)
					p, sum := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "index.theme", typ: tar.TypeReg, body: "[Theme]\n"},
						tarEntry{name: "theme/", typ: tar.TypeDir, mode: 0o755}, tarEntry{name: "theme/a.svg", typ: tar.TypeReg, body: "<svg/>"})
					arch := h.doc(archiveRes(p, sum, dest))
					if c.arch == store.Link {
						arch = overTheLink(t, h, arch, p, sum)
					}
					file := h.doc(`{"module":"f","id":"idx","type":"file","path":"` + h.p("themes/index.theme") + `","content":"mine\n"}`)
					none := h.doc()
					want := "[Theme]\n"
					if precedence[c.file] > precedence[c.arch] {
						want = "mine\n"
					}
					apply := func(step string, src store.Source, doc string) *shapes.Report {
						t.Helper()
						plan := h.run(src, doc, true)
						rep := h.run(src, doc, false)
						if rep.Refused != "" {
							t.Fatalf("%s: %s refused: %s", step, src, rep.Refused)
						}
						for _, l := range rep.Lines {
							if l.Outcome == shapes.Failed {
								t.Fatalf("%s: %s failed: %s\n[%s]", step, src, l.Detail, outcomes(rep))
							}
						}
						if outcomes(plan) != outcomes(rep) {
							t.Fatalf("%s: %s planned [%s], applied [%s]", step, src, outcomes(plan), outcomes(rep))
						}
						return rep
					}
					first, second := []any{c.arch, arch}, []any{c.file, file}
					if !archFirst {
						first, second = second, first
					}
					apply("first", first[0].(store.Source), first[1].(string))
					apply("second", second[0].(store.Source), second[1].(string))
					for round := range 2 {
						for _, s := range []sourced{{c.arch, arch}, {c.file, file}} {
							rep := apply(fmt.Sprintf("reconcile %d", round+1), s.src, s.doc)
							if round == 1 {
								for _, l := range rep.Lines {
									if l.Outcome.Changes() {
										t.Fatalf("reconcile 2: %s rewrote: %s.%s %s %s", s.src, l.Module, l.ID, l.Outcome, l.Detail)
									}
								}
							}
						}
						if got := h.read("themes/index.theme"); got != want {
							t.Fatalf("reconcile %d: index.theme holds %q, want %q (the source above's)", round+1, got, want)
						}
					}
					// One goes, the other stays and has the path, then the
					// other goes, and its source applies once more (a
					// directory kept while it held the other's file).
					goes, stays := []any{c.arch, "the archive", "mine\n"}, []any{c.file, file, "the file", "[Theme]\n"}
					if !archGoesFirst {
						goes, stays = []any{c.file, "the file", "[Theme]\n"}, []any{c.arch, arch, "the archive", "mine\n"}
					}
					apply(goes[1].(string)+" dropped", goes[0].(store.Source), none)
					apply(stays[2].(string)+" reconciled", stays[0].(store.Source), stays[1].(string))
					if got := h.read("themes/index.theme"); got != goes[2] {
						t.Fatalf("%s gone, %s still declared: index.theme holds %q", goes[1], stays[2], got)
					}
					apply(stays[2].(string)+" dropped", stays[0].(store.Source), none)
					apply(goes[1].(string)+"'s source again", goes[0].(store.Source), none)
					h.absent("themes/theme")
					h.absent("themes/index.theme")
				})
			}
		}
	}
}

// A version of an archive that no longer has a path a file of another
// source declares gives the path back to that source: a source below
// writes its own content again, and nothing of the archive's stays where
// no declaration has it; a source above keeps its file.
func TestAnArchivesNewVersionGivesAnotherSourcesPathBack(t *testing.T) {
	for _, c := range []struct{ arch, file store.Source }{{store.Local, store.Bundle}, {store.Bundle, store.Link}} {
		t.Run(fmt.Sprintf("%s archive, %s file", c.arch, c.file), func(t *testing.T) {
			h := newHarness(t)
			dest := h.p("themes")
			os.Mkdir(dest, 0o755)
			p1, sum1 := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "index.theme", typ: tar.TypeReg, body: "[Theme]\n"})
			p2, sum2 := makeArchive(t, h.root, "t2.tgz", tarEntry{name: "README", typ: tar.TypeReg, body: "v2\n"})
			v1, v2 := h.doc(archiveRes(p1, sum1, dest)), h.doc(archiveRes(p2, sum2, dest))
			file := h.doc(`{"module":"f","id":"idx","type":"file","path":"` + h.p("themes/index.theme") + `","content":"mine\n"}`)
			for i, s := range []sourced{{c.file, file}, {c.arch, v1}, {c.file, file}, {c.arch, v2}, {c.file, file}, {c.arch, v2}, {c.file, file}} {
				if rep := h.run(s.src, s.doc, false); rep.Refused != "" || rep.Outcome == shapes.Failed {
					t.Fatalf("apply %d (%s): %s %s [%s]", i+1, s.src, rep.Outcome, rep.Refused, outcomes(rep))
				}
			}
			if got := h.read("themes/index.theme"); got != "mine\n" {
				t.Fatalf("the archive's new version has no index.theme; it holds %q, not the file's", got)
			}
			for i, s := range []sourced{{c.file, file}, {c.arch, v2}} {
				rep := h.run(s.src, s.doc, false)
				for _, l := range rep.Lines {
					if l.Outcome.Changes() {
						t.Fatalf("reconcile %d: %s rewrote %s.%s: %s", i+1, s.src, l.Module, l.ID, l.Detail)
					}
				}
			}
			h.run(c.file, h.doc(), false)
			h.run(c.arch, h.doc(), false)
			if left, _ := os.ReadDir(dest); len(left) > 0 {
				t.Fatalf("%s still holds %v after everything was undeclared", dest, left)
			}
		})
	}
}

// An archive whose first apply a cut stopped before its record (its paths
// only in its intent) wrote what it wrote all the same: another source's
// file found there is the host's creation, not an original to give back —
// undeclared once the archive is gone, it goes.
func TestAnInterruptedArchivesPathsAreTheHosts(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, tarEntry{name: "index.theme", typ: tar.TypeReg, body: "[Theme]\n"})
	arch := h.doc(archiveRes(p, sum, dest))
	if rep := h.run(store.Bundle, arch, false); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep)
	}
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasPrefix(target, "archive:") })
	file := h.doc(`{"module":"f","id":"idx","type":"file","path":"` + h.p("themes/index.theme") + `","content":"mine\n"}`)
	for _, s := range []sourced{{store.Link, file}, {store.Bundle, arch}, {store.Bundle, h.doc()}, {store.Link, h.doc()}} {
		if rep := h.run(s.src, s.doc, false); rep.Refused != "" || rep.Outcome == shapes.Failed {
			t.Fatalf("%s: %s %s [%s]", s.src, rep.Outcome, rep.Refused, outcomes(rep))
		}
	}
	h.absent("themes/index.theme")
}

// A file of a source below that an archive wrote over is, once the path is
// its own again, written as the source's own change — applied, not a hand
// edit put right — and undeclared, removed with nothing kept aside as a
// person's edit: what the host last wrote there was the archive's.
func TestAFileAnArchiveWroteOverIsNotTakenForAHandEdit(t *testing.T) {
	for _, archGoes := range []bool{true, false} {
		t.Run(fmt.Sprintf("the archive goes first %v", archGoes), func(t *testing.T) {
			h := newHarness(t)
			dest, p, sum := themesArchive(t, h, tarEntry{name: "index.theme", typ: tar.TypeReg, body: "[Theme]\n"})
			arch := h.doc(archiveRes(p, sum, dest))
			file := h.doc(`{"module":"f","id":"idx","type":"file","path":"` + h.p("themes/index.theme") + `","content":"mine\n"}`)
			h.run(store.Bundle, file, false)
			h.run(store.Local, arch, false)
			var rep *shapes.Report
			if archGoes {
				h.run(store.Local, h.doc(), false)
				rep = h.run(store.Bundle, file, false)
				if got := outcomes(rep); got != "f.idx=applied" || strings.Contains(rep.Lines[0].Detail, "something else") {
					t.Fatalf("the file's again: [%s] %s", got, rep.Lines[0].Detail)
				}
				rep = h.run(store.Bundle, h.doc(), false)
			} else {
				h.run(store.Bundle, h.doc(), false)
				h.run(store.Local, h.doc(), false)
				rep = h.run(store.Bundle, h.doc(), false)
			}
			for _, l := range rep.Lines {
				if strings.Contains(l.Detail, "edited by hand") {
					t.Fatalf("%s.%s %s: %s", l.Module, l.ID, l.Outcome, l.Detail)
				}
			}
			h.absent("themes/index.theme")
			st, err := store.Open(h.state)
			if err != nil {
				t.Fatal(err)
			}
			if kept := st.Salvaged(); len(kept) > 0 {
				t.Fatalf("kept aside as a person's edit: %+v", kept)
			}
		})
	}
}

// An archive that brings a file and a region or keys that edit it (its
// default configuration, a block of the mesh's in it), of one source or
// two: the archive writes the file, the edit goes in, and neither undoes
// the other at the next apply — before, both were repaired at every apply
// (and restart_on fired with them). A new version of the archive writes
// the file again, and the edit goes back in.
func TestAnArchiveAndAnEditOfItsFile(t *testing.T) {
	for _, c := range []struct{ arch, edit store.Source }{{store.Local, store.Local}, {store.Bundle, store.Link}, {store.Link, store.Bundle}} {
		for _, kind := range []string{"region", "keys"} {
			t.Run(fmt.Sprintf("%s archive, %s %s", c.arch, c.edit, kind), func(t *testing.T) {
				h := newHarness(t)
				dest := h.p("etc")
				os.Mkdir(dest, 0o755)
				version := func(name, body string) string {
					p, sum := makeArchive(t, h.root, name, tarEntry{name: "conf", typ: tar.TypeReg, body: body})
					res := archiveRes(p, sum, dest)
					if c.arch == store.Link {
						res = overTheLink(t, h, res, p, sum)
					}
					return res
				}
				v1, v2 := version("v1.tgz", "Port 22\n"), version("v2.tgz", "Port 2222\n")
				edit := `{"module":"r","id":"e","type":"region","path":"` + h.p("etc/conf") + `","content":"Banner mesh\n"}`
				if kind == "keys" {
					edit = `{"module":"r","id":"e","type":"keys","path":"` + h.p("etc/conf") + `","format":"space","set":{"Banner":"mesh"}}`
				}
				apply := func(arch string) (string, string) {
					if c.arch == c.edit {
						rep := h.run(c.arch, h.doc(arch, edit), false)
						return outcomes(rep), outcomes(rep)
					}
					return outcomes(h.run(c.arch, h.doc(arch), false)), outcomes(h.run(c.edit, h.doc(edit), false))
				}
				apply(v1)
				for i := range 2 {
					a, e := apply(v1)
					if strings.Contains(a+" "+e, "repaired") || strings.Contains(a+" "+e, "applied") {
						t.Fatalf("apply %d: [%s] [%s]: one undid the other", i+2, a, e)
					}
				}
				if got := h.read("etc/conf"); !strings.Contains(got, "Port 22\n") || !strings.Contains(got, "Banner") {
					t.Fatalf("conf holds %q", got)
				}
				apply(v2)
				apply(v2)
				if got := h.read("etc/conf"); !strings.Contains(got, "Port 2222\n") || !strings.Contains(got, "Banner") {
					t.Fatalf("after the archive's new version, conf holds %q", got)
				}
			})
		}
	}
}

// A file of the archive's own declaration held its path over a new
// version, and is undeclared: its original (the old version's entry, the
// edit in it) is put back before the archive looks, which then writes its
// own version — an edit in the file does not make it take the old one for
// its own.
func TestAnEditedArchiveFileAFileHeldIsTheNewVersionsAfter(t *testing.T) {
	h := newHarness(t)
	dest := h.p("etc")
	os.Mkdir(dest, 0o755)
	p1, sum1 := makeArchive(t, h.root, "v1.tgz", tarEntry{name: "conf", typ: tar.TypeReg, body: "Port 22\n"})
	p2, sum2 := makeArchive(t, h.root, "v2.tgz", tarEntry{name: "conf", typ: tar.TypeReg, body: "Port 2222\n"})
	v1, v2 := archiveRes(p1, sum1, dest), archiveRes(p2, sum2, dest)
	region := h.doc(`{"module":"r","id":"e","type":"region","path":"` + h.p("etc/conf") + `","content":"Banner mesh\n"}`)
	file := `{"module":"m","id":"f","type":"file","path":"` + h.p("etc/conf") + `","content":"mine\n"}`
	h.run(store.Local, h.doc(v1), false)
	h.run(store.Bundle, region, false)
	h.run(store.Local, h.doc(v2, file), false)
	for range 2 {
		h.run(store.Local, h.doc(v2), false)
		h.run(store.Bundle, region, false)
	}
	if got := h.read("etc/conf"); !strings.Contains(got, "Port 2222\n") || !strings.Contains(got, "Banner mesh") {
		t.Fatalf("conf holds %q, want the new version with the edit in it", got)
	}
}

// The same when the archive's entry differs from the file only in its
// mode: the file's again, its mode set is its source's own change.
func TestAFileAnArchiveGaveAnotherModeIsNotTakenForAHandEdit(t *testing.T) {
	h := newHarness(t)
	dest := h.p("themes")
	os.Mkdir(dest, 0o755)
	p1, sum1 := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "index.theme", typ: tar.TypeReg, body: "mine\n", mode: 0o600})
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", tarEntry{name: "README", typ: tar.TypeReg, body: "v2\n"})
	file := h.doc(`{"module":"f","id":"idx","type":"file","path":"` + h.p("themes/index.theme") + `","content":"mine\n","mode":"0644"}`)
	h.run(store.Bundle, file, false)
	h.run(store.Local, h.doc(archiveRes(p1, sum1, dest)), false)
	h.run(store.Local, h.doc(archiveRes(p2, sum2, dest)), false)
	if rep := h.run(store.Bundle, file, false); outcomes(rep) != "f.idx=applied" {
		t.Fatalf("the file's again: [%s] %+v", outcomes(rep), rep.Lines)
	}
}

// sourced is a declaration and the source it is applied as.
type sourced struct {
	src store.Source
	doc string
}

// overTheLink makes res, an archive resource naming the file:// archive p,
// one the link declares: obj://, its bytes in the executor's cache as the
// agent streams them.
func overTheLink(t *testing.T, h *harness, res, p, sum string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(ArchiveCacheDir(h.state), 0o700)
	if err := os.WriteFile(filepath.Join(ArchiveCacheDir(h.state), sum), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(res, "file://"+p, "obj://"+sum, 1)
}

// An archive whose URL no archive comes by (file:// with a host part, a
// relative path) fails its own step, planned and applied alike; the rest
// of the declaration applies. Not a refusal of the parse: a target an
// earlier release saved with one is reconciled still, the rest held.
func TestAnArchiveURLOfNoFormFailsItsStep(t *testing.T) {
	h := newHarness(t)
	dest := h.p("dest")
	os.Mkdir(dest, 0o755)
	p, sum := makeArchive(t, h.root, "a.tgz", tarEntry{name: "f", typ: tar.TypeReg, body: "x"})
	bad := strings.Replace(archiveRes(p, sum, dest), "file://"+p, "file://localhost"+p, 1)
	motd := `{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"hi\n"}`
	for _, plan := range []bool{true, false} {
		rep := h.run(store.Local, h.doc(motd, bad), plan)
		if rep.Outcome != shapes.Failed || len(rep.Lines) != 2 || rep.Lines[0].Outcome != shapes.Applied || !strings.Contains(rep.Lines[1].Detail, "is not file:// and a clean absolute path") {
			t.Fatalf("plan %v: %+v", plan, rep.Lines)
		}
	}
	h.absent("dest/f")
}

// A file an archive wrote, edited by hand, that the next version no
// longer has is removed with a word, and what it held kept for 30 days as
// a file's is; an unedited one goes without one. The plan says the same.
func TestArchiveVersionKeepsWhatWasEditedByHand(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	h.expect(h.apply(h.doc(archiveRes(p, sum, dest))), shapes.Applied, "ui.theme=applied")
	os.WriteFile(h.p("themes/theme/icons/a.svg"), []byte("<svg>the operator's</svg>"), 0o600)
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", theme[0], theme[1])
	doc := h.doc(archiveRes(p2, sum2, dest))
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	h.expect(rep, shapes.Applied, "ui.theme=applied")
	const said = "of those removed, 1 was edited by hand since the version before wrote it: what it held is kept for 30 days"
	if !strings.Contains(rep.Lines[0].Detail, said) || plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan %q\napply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	h.absent("themes/theme/icons/a.svg")
	expectKeptOfTheme(t, h, "themes/theme/icons/a.svg", "<svg>the operator's</svg>")
	// Unedited, nothing is kept and nothing said.
	p3, sum3 := makeArchive(t, h.root, "t3.tgz", theme[0])
	rep = h.apply(h.doc(archiveRes(p3, sum3, dest)))
	if strings.Contains(rep.Lines[0].Detail, "edited by hand") || len(mustStore(t, h.state).Salvaged()) != 1 {
		t.Fatalf("%+v", rep.Lines)
	}
}

// A directory of the archive's that another makes between the look and
// the unpack is used as it is, as one there before: not the archive's, so
// the archive undeclared leaves it and what it holds.
func TestArchiveDirectoryMadeMeanwhileIsNotItsOwn(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	doc := h.doc(archiveRes(p, sum, dest))
	rep := h.applyMeanwhile(doc, "themes/theme/icons", func() {
		os.Mkdir(h.p("themes/theme/icons"), 0o755)
	})
	h.expect(rep, shapes.Applied, "ui.theme=applied")
	var e *store.Entry
	for _, x := range mustStore(t, h.state).Entries() {
		if x.Type == shapes.TypeArchive {
			e = x
		}
	}
	if e == nil || slices.Contains(e.Paths, h.p("themes/theme/icons")) || !slices.Contains(e.Paths, h.p("themes/theme/icons/a.svg")) {
		t.Fatalf("the archive's paths: %+v", e)
	}
	h.apply(h.doc())
	if _, err := os.Stat(h.p("themes/theme/icons")); err != nil {
		t.Fatalf("the directory made meanwhile went with the archive: %v", err)
	}
}

// An entry put there by a person between the unpack's look and its write
// is not written over, and the unpack that fails on it claims only what it
// made: not the person's file, and not the paths it never reached, which a
// person may make after.
func TestArchiveFileMadeMeanwhileIsNotWrittenOverNorClaimed(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	doc := h.doc(archiveRes(p, sum, dest))
	rep := h.applyMeanwhile(doc, "themes/theme/index.theme", func() {
		os.WriteFile(h.p("themes/theme/index.theme"), []byte("a person's\n"), 0o644)
	})
	h.expect(rep, shapes.Failed, "ui.theme=failed")
	if l := rep.Lines[0]; !strings.Contains(l.Detail, "put there by something else since this apply looked") {
		t.Fatalf("the line: %s", l.Detail)
	}
	if b, _ := os.ReadFile(h.p("themes/theme/index.theme")); string(b) != "a person's\n" {
		t.Fatalf("the person's file was written over: %q", b)
	}
	var e *store.Entry
	for _, x := range mustStore(t, h.state).Entries() {
		if x.Type == shapes.TypeArchive {
			e = x
		}
	}
	if e == nil || e.Pending != nil || !slices.Equal(e.Paths, []string{h.p("themes/theme")}) || e.Digest != sum {
		t.Fatalf("the archive's record after the failed unpack: %+v", e)
	}
	// What the unpack never reached, made by a person after.
	os.Mkdir(h.p("themes/theme/icons"), 0o755)
	os.WriteFile(h.p("themes/theme/icons/a.svg"), []byte("mine"), 0o644)
	h.apply(h.doc())
	for _, p := range []string{"themes/theme/index.theme", "themes/theme/icons/a.svg"} {
		if _, err := os.Stat(h.p(p)); err != nil {
			t.Fatalf("%s went with the archive: %v", p, err)
		}
	}
}

// An archive undeclared whole keeps what a person edited in the files it
// wrote, as a version that drops them does.
func TestArchiveUndeclaredKeepsWhatWasEditedByHand(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	h.expect(h.apply(h.doc(archiveRes(p, sum, dest))), shapes.Applied, "ui.theme=applied")
	os.WriteFile(h.p("themes/theme/index.theme"), []byte("[Theme]\nName=the operator's\n"), 0o644)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Removed, "ui.theme=removed")
	const said = "of those removed, 1 was edited by hand since the archive wrote it: what it held is kept for 30 days"
	if !strings.Contains(rep.Lines[0].Detail, said) || plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan %q\napply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	h.absent("themes/theme")
	expectKeptOfTheme(t, h, "themes/theme/index.theme", "[Theme]\nName=the operator's\n")
}

// expectKeptOfTheme fails t unless the store keeps, as ui.theme's, one
// file removed edited by hand: rel, holding content.
func expectKeptOfTheme(t *testing.T, h *harness, rel, content string) {
	t.Helper()
	st := mustStore(t, h.state)
	sv := st.Salvaged()
	if len(sv) != 1 || sv[0].Path != h.p(rel) || sv[0].Module != "ui" || sv[0].ID != "theme" {
		t.Fatalf("salvaged %+v", sv)
	}
	if b, err := os.ReadFile(st.OriginalPath(sv[0].Digest)); err != nil || string(b) != content {
		t.Fatalf("kept %q %v", b, err)
	}
}

// A file the archive wrote, taken away, and put back by a person between
// the look and the write: not written over, and no longer claimed, so
// the archive undeclared leaves it.
func TestArchiveFileOfItsOwnPutBackMeanwhileIsNotWrittenOver(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	doc := h.doc(archiveRes(p, sum, dest))
	h.expect(h.apply(doc), shapes.Applied, "ui.theme=applied")
	os.Remove(h.p("themes/theme/index.theme"))
	rep := h.applyMeanwhile(doc, "themes/theme/index.theme", func() {
		os.WriteFile(h.p("themes/theme/index.theme"), []byte("a person's\n"), 0o644)
	})
	h.expect(rep, shapes.Failed, "ui.theme=failed")
	if b, _ := os.ReadFile(h.p("themes/theme/index.theme")); string(b) != "a person's\n" {
		t.Fatalf("written over: %q", b)
	}
	h.apply(h.doc())
	if b, _ := os.ReadFile(h.p("themes/theme/index.theme")); string(b) != "a person's\n" {
		t.Fatalf("removed with the archive: %q", b)
	}
}

// An unpack a cut (a kill, the power) stops part way leaves its intent
// pending, naming every path it might make. The next apply claims of
// those only what the unpack made: not a path it never reached, nor what
// is there that the version does not unpack there — a person's own put
// since at a path it had yet to reach, or a file it wrote that someone
// rewrote since, which cannot be told from one. The archive's going then
// leaves those, and the directories holding them; plan and apply say so
// alike.
func TestAnUnpackCutPartWayClaimsOnlyWhatItMade(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since func(h *harness) // between the cut and the next apply
		// kept is what the archive's going leaves, by path, with its
		// content ("" a directory); removed, the line's start.
		kept    map[string]string
		removed string
	}{
		{name: "what it never reached", since: func(h *harness) {}, kept: map[string]string{}, removed: "2 paths it wrote removed"},
		{name: "a person's own where it had yet to reach", since: func(h *harness) {
			os.Mkdir(h.p("themes/theme/icons"), 0o755)
			os.WriteFile(h.p("themes/theme/icons/a.svg"), []byte("<svg>mine</svg>"), 0o644)
		}, kept: map[string]string{"themes/theme/icons/a.svg": "<svg>mine</svg>", "themes/theme/icons": "", "themes/theme": ""}, removed: "1 of the 3 paths it wrote removed"},
		{name: "what it wrote rewritten since", since: func(h *harness) {
			// Not what the version has there: not told from a person's
			// own, and left.
			os.WriteFile(h.p("themes/theme/index.theme"), []byte("[Theme]\nName=edited\n"), 0o644)
		}, kept: map[string]string{"themes/theme/index.theme": "[Theme]\nName=edited\n", "themes/theme": ""}, removed: "0 of the 1 path it wrote removed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			dest, p, sum := themesArchive(t, h, theme...)
			h.expect(h.apply(h.doc(archiveRes(p, sum, dest))), shapes.Applied, "ui.theme=applied")
			// The cut: before the record; icons/ and a.svg not reached yet.
			cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasPrefix(target, "archive:") })
			os.RemoveAll(h.p("themes/theme/icons"))
			tc.since(h)

			plan := h.run(store.Local, h.doc(), true)
			rep := h.apply(h.doc())
			if !strings.HasPrefix(rep.Lines[0].Detail, tc.removed) || plan.Lines[0].Detail != rep.Lines[0].Detail {
				t.Fatalf("plan %q\napply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
			}
			if len(tc.kept) == 0 {
				h.absent("themes/theme")
			}
			for rel, content := range tc.kept {
				b, err := os.ReadFile(h.p(rel))
				if content == "" {
					if fi, err := os.Stat(h.p(rel)); err != nil || !fi.IsDir() {
						t.Fatalf("%s not kept: %v", rel, err)
					}
				} else if err != nil || string(b) != content {
					t.Fatalf("%s: %q %v; want it kept as it was", rel, b, err)
				}
			}
			if _, err := os.Lstat(h.p("themes/theme/index.theme")); tc.kept["themes/theme/index.theme"] == "" && !os.IsNotExist(err) {
				t.Fatalf("index.theme as the unpack wrote it left: %v", err)
			}
		})
	}
}

// An unpack cut as it wrote a file leaves the file's temporary beside it
// (the host's own: root's, one name): the next apply removes it as it
// settles the unpack, so the archive's going leaves no directory kept
// for it; a plan, which removes nothing, says the same.
func TestAnUnpackCutAsItWroteLeavesNoTemporary(t *testing.T) {
	h := newHarness(t)
	dest, p, sum := themesArchive(t, h, theme...)
	h.expect(h.apply(h.doc(archiveRes(p, sum, dest))), shapes.Applied, "ui.theme=applied")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasPrefix(target, "archive:") })
	os.Remove(h.p("themes/theme/icons/a.svg"))
	tmp := h.p("themes/theme/icons/" + fsx.TempName("a.svg"))
	os.WriteFile(tmp, []byte("<sv"), 0o600)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Removed, "ui.theme=removed")
	if plan.Lines[0].Outcome != shapes.Removed || plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan %s %q\napply %q", plan.Lines[0].Outcome, plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	h.absent("themes/theme")
}

// The next apply of the same archive after a cut that left its unpack
// pending records it — whether the unpack had written everything (made
// by the apply the cut stopped) or not (the rest written: applied, not a
// drift repaired, it was never all there) — and claims what it wrote.
func TestAnUnpackACutLeftPendingIsRecordedByTheNext(t *testing.T) {
	for _, reached := range []string{"all", "part"} {
		t.Run(reached, func(t *testing.T) {
			h := newHarness(t)
			dest, p, sum := themesArchive(t, h, theme...)
			doc := h.doc(archiveRes(p, sum, dest))
			h.expect(h.apply(doc), shapes.Applied, "ui.theme=applied")
			cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasPrefix(target, "archive:") })
			if reached == "part" {
				os.RemoveAll(h.p("themes/theme/icons"))
			}
			// Made by the apply the cut stopped, or finished by this one.
			h.expect(h.apply(doc), shapes.Applied, "ui.theme=applied")
			var e *store.Entry
			for _, x := range mustStore(t, h.state).Entries() {
				if x.Type == shapes.TypeArchive {
					e = x
				}
			}
			wantPaths := []string{h.p("themes/theme"), h.p("themes/theme/icons"), h.p("themes/theme/icons/a.svg"), h.p("themes/theme/index.theme")}
			if e == nil || e.Pending != nil || e.Digest != sum || !slices.Equal(e.Paths, wantPaths) {
				t.Fatalf("the record: %+v", e)
			}
		})
	}
}

// v1 unpacked and recorded; v2's unpack, which rewrites index.theme, is
// cut before its record. The record settled names v1, and index.theme
// holds v2's content, written by the host: the archive undeclared then
// removes it as the host's, not as a hand edit kept aside.
func TestACutUpgradesOwnWriteIsNotTakenForAHandEdit(t *testing.T) {
	h := newHarness(t)
	dest := h.p("themes")
	os.Mkdir(dest, 0o755)
	p1, sum1 := makeArchive(t, h.root, "t1.tgz", theme...)
	h.expect(h.apply(h.doc(archiveRes(p1, sum1, dest))), shapes.Applied, "ui.theme=applied")
	v2 := slices.Clone(theme)
	v2[1].body = "[Theme]\nName=v2\n"
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", v2...)
	h.apply(h.doc(archiveRes(p2, sum2, dest)))
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.HasPrefix(target, "archive:") })
	rep := h.apply(h.doc())
	if sv := mustStore(t, h.state).Salvaged(); len(sv) != 0 || strings.Contains(rep.Lines[0].Detail, "edited by hand") {
		t.Fatalf("the host's own v2 write taken for a hand edit: salvaged %+v; %q", sv, rep.Lines[0].Detail)
	}
	h.absent("themes/theme/index.theme")
}

// themesArchive makes the directory most archive tests unpack into
// (themes, under the harness's root) and the archive t1.tgz of entries.
func themesArchive(t *testing.T, h *harness, entries ...tarEntry) (dest, p, sum string) {
	t.Helper()
	dest = h.p("themes")
	os.Mkdir(dest, 0o755)
	p, sum = makeArchive(t, h.root, "t1.tgz", entries...)
	return dest, p, sum
}

// A directory of the host's holding an archive's files, undeclared as the
// archive's next version drops those files: the plan counts them gone, as
// the apply finds them, and says the directory removed (it said kept, for
// entries "declared still").
func TestAPlanCountsWhatANewVersionTakesAway(t *testing.T) {
	h := newHarness(t)
	dest := h.p("app")
	os.Mkdir(dest, 0o755)
	p1, sum1 := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "sub/", typ: tar.TypeDir, mode: 0o755}, tarEntry{name: "sub/a", typ: tar.TypeReg, body: "a"}, tarEntry{name: "sub/b", typ: tar.TypeReg, body: "b"})
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", tarEntry{name: "x", typ: tar.TypeReg, body: "x"})
	sub := `{"module":"m3","id":"sub","type":"directory","path":"` + h.p("app/sub") + `"}`
	h.expect(h.apply(h.doc(sub, archiveRes(p1, sum1, dest))), shapes.Applied, "m3.sub=applied ui.theme=applied")
	doc := h.doc(archiveRes(p2, sum2, dest))
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	if outcomes(plan) != outcomes(rep) {
		t.Fatalf("plan [%s] %+v\napply [%s] %+v", outcomes(plan), plan.Lines, outcomes(rep), rep.Lines)
	}
	h.absent("app/sub")
}

// A directory an archive makes that a directory resource after it
// declares: the host's making, not a directory found — its next version
// without it leaves it to the resource (not taken away and made again as
// "removed by something else"), and the whole undeclared removes it
// rather than give it back as found and leave it behind.
func TestAnArchivesDirectoryADirectoryDeclaresIsTheHostsMaking(t *testing.T) {
	h := newHarness(t)
	dest := h.p("app")
	os.Mkdir(dest, 0o755)
	p1, sum1 := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "sub/", typ: tar.TypeDir, mode: 0o755}, tarEntry{name: "sub/a", typ: tar.TypeReg, body: "a"}, tarEntry{name: "conf", typ: tar.TypeReg, body: "c"})
	p2, sum2 := makeArchive(t, h.root, "t2.tgz", tarEntry{name: "x", typ: tar.TypeReg, body: "x"})
	sub := `{"module":"m2","id":"sub","type":"directory","path":"` + h.p("app/sub") + `"}`
	rep := h.apply(h.doc(archiveRes(p1, sum1, dest), sub))
	h.expect(rep, shapes.Applied, "ui.theme=applied m2.sub=unchanged")
	if !strings.Contains(lineOf(rep, "m2", "sub").Detail, "made by the archive before it") {
		t.Fatalf("%+v", rep.Lines)
	}
	v2 := h.doc(archiveRes(p2, sum2, dest), sub)
	plan := h.run(store.Local, v2, true)
	rep = h.apply(v2)
	if outcomes(plan) != outcomes(rep) || outcomes(rep) != "ui.theme=applied m2.sub=unchanged" {
		t.Fatalf("plan [%s]\napply [%s] %+v", outcomes(plan), outcomes(rep), rep.Lines)
	}
	h.expect(h.apply(h.doc()), shapes.Removed, "m2.sub=removed ui.theme=removed")
	h.absent("app/sub")
}

// A directory the host made, no longer declared, where an archive now has
// a file: undone before the archive is looked at, in the one apply (it
// was in the archive's way, and the failure stopped the apply before the
// removal that would clear it, at every apply). Plan and apply agree.
func TestAHostDirectoryInAnArchivesWayIsUndoneFirst(t *testing.T) {
	h := newHarness(t)
	dest := h.p("app")
	os.Mkdir(dest, 0o755)
	h.expect(h.apply(h.doc(`{"module":"m1","id":"d","type":"directory","path":"`+h.p("app/x")+`"}`)), shapes.Applied, "m1.d=applied")
	p, sum := makeArchive(t, h.root, "t1.tgz", tarEntry{name: "x", typ: tar.TypeReg, body: "x"})
	doc := h.doc(archiveRes(p, sum, dest))
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	if outcomes(plan) != outcomes(rep) || rep.Outcome != shapes.Applied || h.read("app/x") != "x" {
		t.Fatalf("plan [%s]\napply [%s] %+v", outcomes(plan), outcomes(rep), rep.Lines)
	}
}
