package rescue

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The store tells the truth after kill -9 at any instant.
//
// A world is a tree of 10 declared directories. Five of them (d0..d4) exist
// before the host is ever run, with mode 0750, and hold 20 "found" files
// (owned by 65534, mode 0600, content of their own) that the declaration
// names, plus 10 files nobody declares. The other five (d5..d9) the host
// creates; once they exist, 10 more undeclared files are put in d5 and d6.
// The declaration (v1) names the 10 directories, 1000 files for the host to
// create and the 20 found files; v2 changes every file's content and no
// longer declares 100 of the created ones.
//
// Each kill starts one apply (the first ever on an empty state, a re-apply
// of v2 over v1, or the owns_nothing removal), SIGKILLs it after a random
// delay between 0 and the time the same apply takes uninterrupted, and
// then checks that the store tells the truth:
//
//   - right after the kill, `owned` reads the store and never claims more
//     than happened: an entry not marked pending is on the machine, and
//     a created file is never listed as found;
//   - the next apply converges (exit 0), the one after changes nothing;
//   - `owned` lists exactly the declared paths, with their claims, each
//     created thing as created and each found file with its original;
//   - owns_nothing then gives the machine back: the 1000 created files are
//     gone, the found files have their original content, mode and owner, the
//     undeclared files are untouched (content, mode, owner, inode, mtime),
//     and a directory is left only if it was found (its mode given back) or
//     holds the undeclared files.
//
// Worlds are reused between kills ("continuing" state), so applies also run
// over a store whose journal has grown past compaction; some kills start
// from a fresh world and an empty state.

const (
	crashDirs        = 10
	crashFoundDirs   = 5 // d0..d4 exist before the first apply
	crashCreated     = 100
	crashFoundPerDir = 4
	crashLocalPerDir = 2 // undeclared, in d0..d4, from the start
	crashLateDirs    = 2 // d5, d6 get undeclared files once the host made them
	crashLatePerDir  = 5
	crashDropFrom    = 90 // v2 no longer declares c090..c099
	crashKills       = 24
)

// crashKind is which apply is killed.
type crashKind int

const (
	killFirst             crashKind = iota // v1, the world's first apply since it was given back
	killChange                             // v2 over an applied v1
	killRemoveThenFinish                   // owns_nothing over v1, then owns_nothing to completion
	killRemoveThenDeclare                  // owns_nothing over v1, then v1 to completion
)

func (k crashKind) String() string {
	return [...]string{"first-apply", "re-apply-changed", "removal", "removal-then-redeclare"}[k]
}

// The order kills come in: (kind, fresh world and empty state).
var crashSchedule = []struct {
	kind  crashKind
	fresh bool
}{
	{killFirst, true},
	{killChange, false},
	{killRemoveThenFinish, false},
	{killFirst, false},
	{killRemoveThenDeclare, false},
	{killChange, true},
}

type crashWorld struct {
	root, tree, state string
	v1, v2, none      string // declaration files
	d1, d2            declaration
	found             map[string]snap // path -> as first found
	local             map[string]snap // undeclared files, path -> as made
	late              bool            // the late undeclared files exist
	dirOrig           os.FileMode     // the found directories' mode
}

func (w *crashWorld) dir(i int) string { return filepath.Join(w.tree, fmt.Sprintf("d%d", i)) }

func createdName(j int) string { return fmt.Sprintf("c%03d", j) }
func foundName(j int) string   { return fmt.Sprintf("found%d", j) }

// pad makes a file's content about 200 bytes.
func pad(head string) string {
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < 199 {
		b.WriteString(" the quick brown fox")
	}
	return b.String()[:199] + "\n"
}

func newCrashWorld(t *testing.T) *crashWorld {
	t.Helper()
	root := rootDir(t)
	w := &crashWorld{root: root, tree: filepath.Join(root, "tree"), state: filepath.Join(root, "state"),
		found: map[string]snap{}, local: map[string]snap{}, dirOrig: 0o750}
	if err := os.Mkdir(w.tree, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < crashFoundDirs; i++ {
		d := w.dir(i)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, w.dirOrig); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < crashFoundPerDir; j++ {
			p := filepath.Join(d, foundName(j))
			// Each original differs in length, content and owner from what
			// will be declared.
			content := strings.Repeat(fmt.Sprintf("original %d/%d\n", i, j), 3+i+j)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, attackerUID, attackerGID); err != nil {
				t.Fatal(err)
			}
			w.found[p] = snapshotPath(t, p)
		}
		for j := 0; j < crashLocalPerDir; j++ {
			p := filepath.Join(d, fmt.Sprintf("local%d", j))
			if err := os.WriteFile(p, []byte(fmt.Sprintf("not declared %d/%d\n", i, j)), 0o640); err != nil {
				t.Fatal(err)
			}
			w.local[p] = snapshotPath(t, p)
		}
	}
	w.d1, w.d2 = w.declaration(1), w.declaration(2)
	w.v1 = writeDecl(t, root, "v1.json", w.d1)
	w.v2 = writeDecl(t, root, "v2.json", w.d2)
	w.none = writeDecl(t, root, "none.json", ownsNothing())
	return w
}

// declaration is generation g of the declaration.
func (w *crashWorld) declaration(g int) declaration {
	d := declaration{Version: 1}
	for i := 0; i < crashDirs; i++ {
		d.Resources = append(d.Resources, dirRes("tree", fmt.Sprintf("d%d", i), w.dir(i), "0755"))
	}
	for i := 0; i < crashDirs; i++ {
		if i < crashFoundDirs {
			for j := 0; j < crashFoundPerDir; j++ {
				p := filepath.Join(w.dir(i), foundName(j))
				d.Resources = append(d.Resources, fileRes("tree", fmt.Sprintf("d%d-%s", i, foundName(j)), p,
					pad(fmt.Sprintf("generation %d, declared over a found file %s", g, p)), "0644"))
			}
		}
		for j := 0; j < crashCreated; j++ {
			if g == 2 && j >= crashDropFrom {
				continue
			}
			p := filepath.Join(w.dir(i), createdName(j))
			d.Resources = append(d.Resources, fileRes("tree", fmt.Sprintf("d%d-%s", i, createdName(j)), p,
				pad(fmt.Sprintf("generation %d of %s", g, p)), "0644"))
		}
	}
	return d
}

// isCreated reports whether p is one of the paths the host creates.
func (w *crashWorld) isCreated(p string) bool {
	if _, ok := w.found[p]; ok {
		return false
	}
	rel, err := filepath.Rel(w.tree, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	parts := strings.Split(rel, "/")
	if len(parts) == 1 { // a directory
		n, _ := strconv.Atoi(strings.TrimPrefix(parts[0], "d"))
		return n >= crashFoundDirs
	}
	return strings.HasPrefix(parts[1], "c")
}

// ensureLate puts the undeclared files in the host-created d5 and d6 once
// they exist.
func (w *crashWorld) ensureLate(t *testing.T) {
	t.Helper()
	if w.late {
		return
	}
	for i := crashFoundDirs; i < crashFoundDirs+crashLateDirs; i++ {
		for j := 0; j < crashLatePerDir; j++ {
			p := filepath.Join(w.dir(i), fmt.Sprintf("late%d", j))
			if err := os.WriteFile(p, []byte(fmt.Sprintf("put here by someone else %d/%d\n", i, j)), 0o600); err != nil {
				t.Fatal(err)
			}
			w.local[p] = snapshotPath(t, p)
		}
	}
	w.late = true
}

// undeclaredIn lists the undeclared files' names in directory d.
func (w *crashWorld) undeclaredIn(d string) []string {
	var out []string
	for p := range w.local {
		if filepath.Dir(p) == d {
			out = append(out, filepath.Base(p))
		}
	}
	return out
}

// completeApply runs decl to completion and wants exit 0.
func (w *crashWorld) completeApply(t *testing.T, decl string) (*report, time.Duration) {
	t.Helper()
	rep, res := apply(t, context.Background(), "apply", w.state, decl)
	// Nothing in these worlds is edited by hand: a line saying so took
	// the host's own content for a person's.
	for _, l := range rep.Lines {
		if strings.Contains(l.Detail, "edited by hand") {
			t.Errorf("apply %s: %s.%s: %s", filepath.Base(decl), l.Module, l.ID, l.Detail)
		}
	}
	if res.exit != 0 {
		t.Fatalf("apply %s: exit %d, outcome %s:\n%s", filepath.Base(decl), res.exit, rep.Outcome, failedLines(rep))
	}
	return rep, res.took
}

func failedLines(rep *report) string {
	var b strings.Builder
	if rep.Refused != "" {
		fmt.Fprintf(&b, "refused: %s\n", rep.Refused)
	}
	n := 0
	for _, l := range rep.Lines {
		if l.Outcome == "failed" {
			if n++; n <= 10 {
				fmt.Fprintf(&b, "  failed %s.%s (%s): %s\n", l.Module, l.ID, l.Type, l.Detail)
			}
		}
	}
	return b.String()
}

// killedApply starts `apply decl` and SIGKILLs it after delay. It says
// whether the kill landed before the apply finished.
func (w *crashWorld) killedApply(t *testing.T, decl string, delay time.Duration) (killed bool, exit int) {
	t.Helper()
	cmd := exec.Command(executorBin, "apply", "--state", w.state, "--json", decl)
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return true, -1
	}
	return false, ws.ExitStatus()
}

// The expected declaration after a kill's completion.
type expectation struct {
	decl  *declaration // nil: owns nothing
	label string
}

// crashIteration runs one kill (or, with delay < 0, the same steps without
// one) and returns how long the targeted apply took when it was not killed.
func crashIteration(t *testing.T, w *crashWorld, kind crashKind, delay time.Duration) time.Duration {
	var target, finish string
	var want expectation
	switch kind {
	case killFirst:
		target, finish, want = w.v1, w.v1, expectation{&w.d1, "v1"}
	case killChange:
		w.completeApply(t, w.v1)
		w.ensureLate(t)
		target, finish, want = w.v2, w.v2, expectation{&w.d2, "v2"}
	case killRemoveThenFinish:
		w.completeApply(t, w.v1)
		w.ensureLate(t)
		target, finish, want = w.none, w.none, expectation{nil, "nothing"}
	case killRemoveThenDeclare:
		w.completeApply(t, w.v1)
		w.ensureLate(t)
		target, finish, want = w.none, w.v1, expectation{&w.d1, "v1"}
	}

	var took time.Duration
	if delay < 0 {
		_, took = w.completeApply(t, target)
	} else {
		killed, exit := w.killedApply(t, target, delay)
		if !killed {
			t.Logf("%s: finished (exit %d) before the SIGKILL at %v", kind, exit, delay)
		}
		w.checkAfterKill(t)
	}

	// The next apply converges.
	rep, _ := w.completeApply(t, finish)
	for _, l := range rep.Lines {
		if strings.Contains(l.Detail, "found as declared") {
			t.Errorf("after the kill, %s.%s is reported found: %s", l.Module, l.ID, l.Detail)
		}
	}
	if want.decl != nil {
		w.ensureLate(t)
	}

	// The one after changes nothing.
	rep, _ = w.completeApply(t, finish)
	w.checkUnchanged(t, rep, want)

	// The machine is what was declared, and owned says so.
	w.checkMachine(t, want)
	w.checkOwned(t, want)

	// Undeclaring everything gives the machine back.
	rep, _ = w.completeApply(t, w.none)
	if want.decl != nil {
		w.checkRemovalLines(t, rep, want)
	}
	w.checkGivenBack(t)
	return took
}

// checkAfterKill: the store can be read after the kill, and it never claims
// more than happened.
func (w *crashWorld) checkAfterKill(t *testing.T) {
	t.Helper()
	for _, e := range owned(t, w.state) {
		if e.Pending {
			continue
		}
		p := strings.TrimPrefix(e.Target, "path:")
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
			t.Errorf("after the kill the store holds %s (%s), but it is not on the machine: %v", p, e.How, err)
		case e.Type == "file" && !fi.Mode().IsRegular(), e.Type == "directory" && !fi.IsDir():
			t.Errorf("after the kill the store holds %s as a %s, but it is a %v", p, e.Type, fi.Mode().Type())
		}
		w.checkHow(t, e, "after the kill")
	}
}

// checkHow: a created thing is never listed as found, and a found thing
// always has its original.
func (w *crashWorld) checkHow(t *testing.T, e ownedEntry, when string) {
	t.Helper()
	p := strings.TrimPrefix(e.Target, "path:")
	if len(e.Claims) == 0 || e.Pending {
		return
	}
	if w.isCreated(p) {
		if e.How != "created by the host" || e.Original != nil {
			t.Errorf("%s: %s, which the host created, is listed as %q (original %+v)", when, p, e.How, e.Original)
		}
		return
	}
	if e.Original == nil || e.How == "created by the host" {
		t.Errorf("%s: %s, which the host found, is listed as %q with no original", when, p, e.How)
		return
	}
	if s, ok := w.found[p]; ok {
		if e.Original.Mode != uint32(s.mode.Perm()) || e.Original.UID != s.uid || e.Original.GID != s.gid {
			t.Errorf("%s: %s's original is recorded as %04o %d:%d; it was found %04o %d:%d", when, p,
				e.Original.Mode, e.Original.UID, e.Original.GID, s.mode.Perm(), s.uid, s.gid)
		}
	} else if e.Original.Mode != uint32(w.dirOrig) {
		t.Errorf("%s: directory %s's original mode is recorded as %04o; it was found %04o", when, p, e.Original.Mode, w.dirOrig)
	}
}

// checkUnchanged: the second apply changed nothing and said so.
func (w *crashWorld) checkUnchanged(t *testing.T, rep *report, want expectation) {
	t.Helper()
	kept := 0
	for _, l := range rep.Lines {
		switch {
		case l.Outcome == "unchanged":
		case want.decl == nil && l.Outcome == "kept" && l.Type == "directory":
			// A directory the host made, kept because it holds the
			// undeclared files, is tried again by every removal.
			kept++
		default:
			t.Errorf("the apply after the converging one: %s.%s (%s) is %s: %s", l.Module, l.ID, l.Type, l.Outcome, l.Detail)
		}
	}
	n := 0
	if want.decl != nil {
		n = len(want.decl.Resources)
	}
	if len(rep.Lines)-kept != n || kept > crashLateDirs {
		t.Errorf("the apply after the converging one has %d lines (%d kept); want %d unchanged", len(rep.Lines), kept, n)
	}
}

// checkMachine: every declared path holds what was declared, and each
// directory holds nothing else but the undeclared files.
func (w *crashWorld) checkMachine(t *testing.T, want expectation) {
	t.Helper()
	if want.decl == nil {
		w.checkGivenBack(t)
		return
	}
	inDir := map[string][]string{}
	for _, r := range want.decl.Resources {
		fi, err := os.Lstat(r.Path)
		if err != nil {
			t.Errorf("%s is declared (%s) but missing: %v", r.Path, want.label, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, declared root:root", r.Path, st.Uid, st.Gid)
		}
		switch r.Type {
		case "directory":
			if !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s is %v, declared a directory 0755", r.Path, fi.Mode())
			}
		case "file":
			inDir[filepath.Dir(r.Path)] = append(inDir[filepath.Dir(r.Path)], filepath.Base(r.Path))
			b, err := os.ReadFile(r.Path)
			if err != nil || string(b) != *r.Content || fi.Mode() != 0o644 {
				t.Errorf("%s is %v holding %q; declared 0644 holding %q", r.Path, fi.Mode(), clip(b), clip([]byte(*r.Content)))
			}
		}
	}
	for i := 0; i < crashDirs; i++ {
		d := w.dir(i)
		wantNames := append(inDir[d], w.undeclaredIn(d)...)
		sort.Strings(wantNames)
		if got := names(t, d); !slices.Equal(got, wantNames) {
			t.Errorf("%s holds %s; want exactly %s", d, extra(got, wantNames), "the declared and the undeclared files")
		}
	}
	w.checkLocal(t)
}

// extra describes the difference between what a directory holds and what
// it should.
func extra(got, want []string) string {
	var more, less []string
	for _, g := range got {
		if !slices.Contains(want, g) {
			more = append(more, g)
		}
	}
	for _, x := range want {
		if !slices.Contains(got, x) {
			less = append(less, x)
		}
	}
	s := fmt.Sprintf("%d entries (%d unexpected: %s; %d missing: %s)", len(got), len(more), firstFew(more), len(less), firstFew(less))
	for _, m := range more {
		if strings.Contains(m, ".mesh-host-") {
			s += "; " + m + " is the temporary file of a write the kill interrupted (fsx.WriteFile names them " +
				"\".NAME.mesh-host-PID-N\"): the host made it, no record names it, and nothing ever removes it"
			break
		}
	}
	return s
}

func firstFew(s []string) string {
	if len(s) > 6 {
		return strings.Join(s[:6], ", ") + ", …"
	}
	return strings.Join(s, ", ")
}

// checkLocal: the undeclared files were never touched.
func (w *crashWorld) checkLocal(t *testing.T) {
	t.Helper()
	for p, s := range w.local {
		if d := sameAs(p, s); d != "" {
			t.Errorf("undeclared file %s was touched: %s", p, d)
		}
	}
}

// checkOwned: owned lists exactly the declared paths, with their claims.
func (w *crashWorld) checkOwned(t *testing.T, want expectation) {
	t.Helper()
	list := owned(t, w.state)
	declared := map[string]resource{}
	if want.decl != nil {
		for _, r := range want.decl.Resources {
			declared["path:"+r.Path] = r
		}
	}
	seen := map[string]bool{}
	for _, e := range list {
		seen[e.Target] = true
		r, ok := declared[e.Target]
		if !ok {
			// Only a directory the host made and kept for the undeclared
			// files it holds may stay, still tracked under its own claim
			// and said kept and undeclared (the report says kept; it goes
			// once it is empty).
			p := strings.TrimPrefix(e.Target, "path:")
			if !w.isCreated(p) || e.How != "created by the host" || !e.Undeclared || len(w.undeclaredIn(p)) == 0 || len(e.Claims) != 1 || e.Claims[0].ID != filepath.Base(p) {
				t.Errorf("owned lists %s (%s, claims %v), which %s does not declare", e.Target, e.How, e.Claims, want.label)
			}
			continue
		}
		if len(e.Claims) != 1 || e.Claims[0] != (claim{Source: "local", Module: r.Module, ID: r.ID}) {
			t.Errorf("owned lists %s with claims %+v; want local:%s.%s", e.Target, e.Claims, r.Module, r.ID)
		}
		if e.Type != r.Type {
			t.Errorf("owned lists %s as a %s; declared a %s", e.Target, e.Type, r.Type)
		}
		w.checkHow(t, e, "owned")
	}
	for tgt := range declared {
		if !seen[tgt] {
			t.Errorf("owned does not list %s, which %s declares", tgt, want.label)
		}
	}
}

// checkRemovalLines: undeclaring removed what the host created and gave
// back what it found; nothing created was taken for found.
func (w *crashWorld) checkRemovalLines(t *testing.T, rep *report, want expectation) {
	t.Helper()
	byID := map[string]string{}
	for _, r := range want.decl.Resources {
		byID[r.Module+"."+r.ID] = r.Path
	}
	for _, l := range rep.Lines {
		p, ok := byID[l.Module+"."+l.ID]
		if !ok {
			continue
		}
		var wantOutcome []string
		switch {
		case w.isCreated(p) && l.Type == "directory" && len(w.undeclaredIn(p)) > 0:
			wantOutcome = []string{"kept"}
		case w.isCreated(p):
			wantOutcome = []string{"removed"}
		default:
			wantOutcome = []string{"restored"}
		}
		if !slices.Contains(wantOutcome, l.Outcome) {
			t.Errorf("owns_nothing: %s is %s (%s); want %s", p, l.Outcome, l.Detail, wantOutcome)
		}
	}
}

// checkGivenBack: the machine is as it was before the host, but for the
// directories it made that hold the undeclared files.
func (w *crashWorld) checkGivenBack(t *testing.T) {
	t.Helper()
	var wantTop []string
	for i := 0; i < crashDirs; i++ {
		d := w.dir(i)
		undeclared := w.undeclaredIn(d)
		fi, err := os.Lstat(d)
		switch {
		case i < crashFoundDirs:
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != w.dirOrig {
				t.Errorf("found directory %s is not given back as found (%04o): %v %v", d, w.dirOrig, fi.Mode(), err)
				continue
			}
		case len(undeclared) > 0:
			if err != nil || !fi.IsDir() {
				t.Errorf("directory %s, which holds undeclared files, is gone: %v", d, err)
				continue
			}
		default:
			if err == nil {
				t.Errorf("directory %s, created by the host, is still there holding %s", d, extra(names(t, d), nil))
			}
			continue
		}
		wantTop = append(wantTop, filepath.Base(d))
		want := undeclared
		if i < crashFoundDirs {
			for j := 0; j < crashFoundPerDir; j++ {
				want = append(want, foundName(j))
			}
		}
		sort.Strings(want)
		if got := names(t, d); !slices.Equal(got, want) {
			t.Errorf("after owns_nothing %s holds %s", d, extra(got, want))
		}
	}
	sort.Strings(wantTop)
	if got := names(t, w.tree); !slices.Equal(got, wantTop) {
		t.Errorf("after owns_nothing %s holds %s", w.tree, extra(got, wantTop))
	}
	for p, s := range w.found {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("found file %s is gone after owns_nothing: %v", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		b, _ := os.ReadFile(p)
		if !bytes.Equal(b, s.content) || fi.Mode() != s.mode || st.Uid != s.uid || st.Gid != s.gid {
			t.Errorf("found file %s is not given back: %v %d:%d %q; it was %v %d:%d %q", p,
				fi.Mode(), st.Uid, st.Gid, clip(b), s.mode, s.uid, s.gid, clip(s.content))
		}
	}
	w.checkLocal(t)
	// What stays held is exactly the directories the host made that hold
	// what it did not: kept, and still tracked under their own claim (each
	// later report names them, and they go once empty).
	for _, e := range owned(t, w.state) {
		p := strings.TrimPrefix(e.Target, "path:")
		if !w.isCreated(p) || len(w.undeclaredIn(p)) == 0 || len(e.Claims) != 1 || e.Claims[0].ID != filepath.Base(p) {
			t.Errorf("after owns_nothing the host still holds %s (%s, claims %v)", e.Target, e.How, e.Claims)
		}
	}
	// Kept originals nobody refers to are only logged: they claim nothing.
	if left, _ := os.ReadDir(filepath.Join(w.state, "originals")); len(left) > 0 {
		var n []string
		for _, e := range left {
			n = append(n, e.Name())
		}
		t.Logf("note: %d kept originals remain in the state after owns_nothing: %s", len(n), firstFew(n))
	}
}

func crashSeed(t *testing.T) int64 {
	seed := int64(20260118)
	if s := os.Getenv("RESCUE_CRASH_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("RESCUE_CRASH_SEED: %v", err)
		}
		seed = n
	}
	return seed
}

func TestCrashStoreTellsTheTruthAfterKill9AtAnyInstant(t *testing.T) {
	needRoot(t)
	seed := crashSeed(t)
	t.Logf("seed %d (set RESCUE_CRASH_SEED to repeat another run)", seed)
	rng := rand.New(rand.NewSource(seed))
	start := time.Now()

	// First, each kind of apply uninterrupted: the control, and how long
	// each takes, which is the span the kills are spread over.
	durations := map[crashKind]time.Duration{}
	t.Run("uninterrupted", func(t *testing.T) {
		w := newCrashWorld(t)
		for _, k := range []crashKind{killFirst, killChange, killRemoveThenFinish} {
			durations[k] = crashIteration(t, w, k, -1)
			t.Logf("%s uninterrupted: %v", k, durations[k])
			if t.Failed() {
				t.FailNow()
			}
		}
		durations[killRemoveThenDeclare] = durations[killRemoveThenFinish]
	})
	if t.Failed() {
		t.FailNow()
	}

	var w *crashWorld
	for i := 0; i < crashKills; i++ {
		s := crashSchedule[i%len(crashSchedule)]
		// Spread over the whole apply and a little past its end; the name
		// says where in the apply, which a rerun with the seed repeats.
		frac := rng.Float64() * 1.1
		delay := time.Duration(frac * float64(durations[s.kind]))
		fresh := s.fresh || w == nil
		name := fmt.Sprintf("kill%02d_%s_at_%d%%", i, s.kind, int(frac*100))
		if fresh {
			name += "_fresh_state"
		}
		if fresh {
			// The world belongs to the parent test: later kills continue it.
			w = newCrashWorld(t)
		}
		ok := t.Run(name, func(t *testing.T) {
			t.Logf("seed %d, kill %d: %s, SIGKILL after %v (%.0f%% of the %v it takes uninterrupted)",
				seed, i, s.kind, delay, frac*100, durations[s.kind])
			crashIteration(t, w, s.kind, delay)
		})
		if !ok {
			w = nil // its world may be in any state; start the next afresh
		}
	}
	t.Logf("%d kills in %v", crashKills, time.Since(start).Round(time.Millisecond))
}
