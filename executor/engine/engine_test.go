package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// harness is a state directory and a scratch tree, both real, on this
// machine's filesystem. Tests run as root, as the executor does.
type harness struct {
	t     *testing.T
	state string
	root  string
	// roster and node, when set, are the Options' Roster and NodeID;
	// restore, the Options' Restore.
	roster  *shapes.Roster
	node    string
	restore bool
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the engine's tests run as root, like the executor (make test runs them so)")
	}
	base := t.TempDir()
	h := &harness{t: t, state: filepath.Join(base, "state"), root: filepath.Join(base, "tree")}
	if err := os.Mkdir(h.root, 0o755); err != nil {
		t.Fatal(err)
	}
	return h
}

// p returns an absolute path in the scratch tree.
func (h *harness) p(rel string) string { return filepath.Join(h.root, rel) }

// doc builds a declaration from resources written with {root} for the tree.
func (h *harness) doc(resources ...string) string {
	if len(resources) == 0 {
		return `{"version":1,"resources":[],"owns_nothing":true}`
	}
	return strings.ReplaceAll(`{"version":1,"resources":[`+strings.Join(resources, ",")+`]}`, "{root}", h.root)
}

// open parses doc and opens the state, locked unless for a plan (the
// caller unlocks it).
func (h *harness) open(doc string, plan bool) (*shapes.Declaration, *store.Store) {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatalf("parse: %v\n%s", err, doc)
	}
	st, err := store.Open(h.state)
	if err != nil {
		h.t.Fatal(err)
	}
	if !plan {
		if err := st.Lock(time.Second); err != nil {
			h.t.Fatal(err)
		}
	}
	return d, st
}

func (h *harness) run(src store.Source, doc string, plan bool) *shapes.Report {
	h.t.Helper()
	d, st := h.open(doc, plan)
	if !plan {
		defer st.Unlock()
	}
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: src, Plan: plan, Roster: h.roster, NodeID: h.node, Restore: h.restore})
}

func (h *harness) apply(doc string) *shapes.Report { return h.run(store.Local, doc, false) }

// applyMeanwhile applies doc with do run just before the change to the
// path rel (relative to the tree): what another applier, or a person,
// does between the apply's look and its change.
func (h *harness) applyMeanwhile(doc, rel string, do func()) *shapes.Report {
	d, st := h.open(doc, false)
	defer st.Unlock()
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local,
		beforeChange: func(target string) {
			if target == "path:"+h.p(rel) {
				do()
			}
		}})
}

// outcomes renders a report as "module.id=outcome" lines, sorted by the
// report's own order.
func outcomes(rep *shapes.Report) string {
	var s []string
	for _, l := range rep.Lines {
		s = append(s, fmt.Sprintf("%s.%s=%s", l.Module, l.ID, l.Outcome))
	}
	return strings.Join(s, " ")
}

func (h *harness) expect(rep *shapes.Report, outcome shapes.Outcome, lines string) {
	h.t.Helper()
	if rep.Outcome != outcome || outcomes(rep) != lines {
		h.t.Fatalf("report %s [%s]\nwant     %s [%s]\n%+v", rep.Outcome, outcomes(rep), outcome, lines, rep)
	}
}

func (h *harness) read(rel string) string {
	h.t.Helper()
	b, err := os.ReadFile(h.p(rel))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

func (h *harness) mode(rel string) os.FileMode {
	h.t.Helper()
	fi, err := os.Lstat(h.p(rel))
	if err != nil {
		h.t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func (h *harness) absent(rel string) {
	h.t.Helper()
	if _, err := os.Lstat(h.p(rel)); !os.IsNotExist(err) {
		h.t.Fatalf("%s exists (%v)", rel, err)
	}
}

// tree lists everything under the scratch tree with mode and content, to
// prove a refusal touched nothing.
func (h *harness) tree() string {
	var out []string
	filepath.Walk(h.root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", strings.TrimPrefix(p, h.root), fi.Mode())
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, "\n")
}

const (
	dirEtc  = `{"module":"base","id":"etc","type":"directory","path":"{root}/etc","mode":"0750"}`
	fileMot = `{"module":"base","id":"motd","type":"file","path":"{root}/etc/motd","content":"hello\n","mode":"0640","owner":"root:root"}`
)

func TestConvergeIdempotentDriftRemove(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(dirEtc, fileMot)
	h.expect(h.apply(doc), shapes.Applied, "base.etc=applied base.motd=applied")
	if h.read("etc/motd") != "hello\n" || h.mode("etc/motd") != 0o640 || h.mode("etc") != 0o750 {
		t.Fatal("machine does not match the declaration")
	}
	// The second apply changes nothing and says so.
	h.expect(h.apply(doc), shapes.Unchanged, "base.etc=unchanged base.motd=unchanged")
	// Drift: content and mode changed by something else, then deleted.
	os.WriteFile(h.p("etc/motd"), []byte("vandal\n"), 0o666)
	os.Chmod(h.p("etc"), 0o777)
	rep := h.run(store.Local, doc, true)
	h.expect(rep, shapes.Repaired, "base.etc=repaired base.motd=repaired")
	if h.read("etc/motd") != "vandal\n" {
		t.Fatal("plan wrote to the machine")
	}
	h.expect(h.apply(doc), shapes.Repaired, "base.etc=repaired base.motd=repaired")
	if h.read("etc/motd") != "hello\n" || h.mode("etc") != 0o750 {
		t.Fatal("drift not repaired")
	}
	os.Remove(h.p("etc/motd"))
	rep = h.apply(doc)
	h.expect(rep, shapes.Repaired, "base.etc=unchanged base.motd=repaired")
	if !strings.Contains(rep.Lines[1].Detail, "deleted by something else") {
		t.Errorf("detail %q", rep.Lines[1].Detail)
	}
	// A changed declaration is applied, not repaired.
	h.expect(h.apply(strings.Replace(doc, `hello\n`, `bye\n`, 1)), shapes.Applied, "base.etc=unchanged base.motd=applied")
	// Undeclared: created things are removed, newest first.
	h.expect(h.apply(h.doc()), shapes.Removed, "base.motd=removed base.etc=removed")
	h.absent("etc")
}

func TestReplacedFileGetsItsOriginalBack(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("the machine's own\n"), 0o600)
	os.Chown(h.p("etc/motd"), 12, 34)
	rep := h.apply(h.doc(fileMot))
	h.expect(rep, shapes.Applied, "base.motd=applied")
	if !strings.Contains(rep.Lines[0].Detail, "original is kept") {
		t.Errorf("detail %q", rep.Lines[0].Detail)
	}
	if strings.Contains(fmt.Sprint(rep), "the machine's own") {
		t.Fatal("a report carries the kept original")
	}
	h.expect(h.apply(h.doc()), shapes.Restored, "base.motd=restored")
	if h.read("etc/motd") != "the machine's own\n" || h.mode("etc/motd") != 0o600 {
		t.Fatal("original not restored")
	}
	if owner := ownerOf(t, h.p("etc/motd")); owner != "12:34" {
		t.Fatalf("owner %s, want 12:34", owner)
	}
	// Its directory was found, not created: it stays.
	if _, err := os.Stat(h.p("etc")); err != nil {
		t.Fatal(err)
	}
	// The kept original is forgotten once given back.
	ents, _ := os.ReadDir(filepath.Join(h.state, "originals"))
	if len(ents) != 0 {
		t.Fatalf("originals left: %v", ents)
	}
}

func TestFoundDirectoryGivenBackItsMode(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o700)
	h.expect(h.apply(h.doc(dirEtc)), shapes.Applied, "base.etc=applied")
	if h.mode("etc") != 0o750 {
		t.Fatal("mode not applied")
	}
	h.expect(h.apply(h.doc()), shapes.Restored, "base.etc=restored")
	if h.mode("etc") != 0o700 {
		t.Fatalf("mode %o not given back", h.mode("etc"))
	}
}

func TestFoundAsDeclaredIsHeldAndLeft(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o750)
	os.WriteFile(h.p("etc/motd"), []byte("hello\n"), 0o640)
	rep := h.apply(h.doc(dirEtc, fileMot))
	h.expect(rep, shapes.Unchanged, "base.etc=unchanged base.motd=unchanged")
	// The host did not create them: undeclaring leaves them as found.
	h.expect(h.apply(h.doc()), shapes.Restored, "base.motd=restored base.etc=restored")
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("found file changed")
	}
}

func TestDirectoryWithForeignContentIsKept(t *testing.T) {
	h := newHarness(t)
	h.apply(h.doc(dirEtc, fileMot))
	os.WriteFile(h.p("etc/operator-notes"), []byte("mine"), 0o644)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Kept, "base.motd=removed base.etc=kept")
	if !strings.Contains(rep.Lines[1].Detail, "holds 1 entry the host did not create (operator-notes); kept, and removed once it is empty") {
		t.Errorf("detail %q", rep.Lines[1].Detail)
	}
	if h.read("etc/operator-notes") != "mine" {
		t.Fatal("foreign file touched")
	}
	// Kept, and still tracked: every later apply names it, and tries again.
	h.expect(h.apply(h.doc()), shapes.Kept, "base.etc=kept")
	// Once it is empty, the next apply removes it.
	os.Remove(h.p("etc/operator-notes"))
	h.expect(h.apply(h.doc()), shapes.Removed, "base.etc=removed")
	h.absent("etc")

	// Nested: the host's own directory kept inside the host's, for what the
	// inner one holds, is said as the host's, not as another's.
	inner := `{"module":"base","id":"inner","type":"directory","path":"{root}/etc/inner"}`
	h.apply(h.doc(dirEtc, inner))
	os.Mkdir(h.p("etc/inner/hand"), 0o755)
	rep = h.apply(h.doc())
	h.expect(rep, shapes.Kept, "base.inner=kept base.etc=kept")
	if d := rep.Lines[1].Detail; !strings.Contains(d, "holds 1 directory of the host's kept in turn (inner); kept") || strings.Contains(d, "did not create (inner)") {
		t.Errorf("the outer directory: %q", d)
	}
}

// A declaration is complete for its own source only: a rescue file fixes
// what it names without undoing what the bundle (or the link) applied.
func TestCompletePerSource(t *testing.T) {
	h := newHarness(t)
	bundle := h.doc(dirEtc, fileMot)
	h.expect(h.run(store.Bundle, bundle, false), shapes.Applied, "base.etc=applied base.motd=applied")
	rescue := h.doc(`{"module":"fix","id":"note","type":"file","path":"{root}/etc/note","content":"x"}`)
	h.expect(h.apply(rescue), shapes.Applied, "fix.note=applied")
	// The rescue source now declares nothing: only its own note goes.
	h.expect(h.apply(h.doc()), shapes.Removed, "fix.note=removed")
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("another source's file was removed")
	}
	// The same file declared by two sources: released by one, kept by the other.
	h.expect(h.apply(h.doc(fileMot)), shapes.Unchanged, "base.motd=unchanged")
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Forgotten, "base.motd=forgotten")
	if !strings.Contains(rep.Lines[0].Detail, "still declared by bundle:base.motd") {
		t.Errorf("detail %q", rep.Lines[0].Detail)
	}
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("file still declared by the bundle was removed")
	}
}

func TestActions(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	flag := h.p("flag")
	act := func(id, run, verify string, timeout int) string {
		return fmt.Sprintf(`{"module":"a","id":%q,"type":"action","run":["/bin/sh","-c",%q],"verify":["/bin/sh","-c",%q],"timeout":%d}`, id, run, verify, timeout)
	}
	ok := act("ok", "echo made > "+flag, "test -f "+flag, 5)
	rep := h.apply(h.doc(ok))
	h.expect(rep, shapes.Applied, "a.ok=applied")
	h.expect(h.apply(h.doc(ok)), shapes.Unchanged, "a.ok=unchanged")
	os.Remove(flag)
	h.expect(h.apply(h.doc(ok)), shapes.Repaired, "a.ok=repaired")

	// Exits 0 into a state its own verify rejects: the apply fails and says so.
	liar := act("liar", "true", "test -f "+h.p("never"), 5)
	rep = h.apply(h.doc(ok, liar, fileMot))
	h.expect(rep, shapes.Failed, "a.ok=unchanged a.liar=failed")
	if d := rep.Lines[1].Detail; !strings.Contains(d, "the action ran without error and its own verify still fails") || !strings.Contains(d, "1 later resource not attempted") {
		t.Errorf("detail %q", d)
	}
	h.absent("etc/motd") // stopped: nothing after the failed step

	// A failing run says its exit status and output.
	bad := act("bad", "echo broken >&2; exit 3", "false", 5)
	rep = h.apply(h.doc(bad))
	if d := rep.Lines[0].Detail; rep.Outcome != shapes.Failed || !strings.Contains(d, "exited 3: broken") {
		t.Fatalf("report %+v", rep)
	}

	// Timeout kills the whole process group, grandchildren included.
	pidfile := h.p("child.pid")
	slow := act("slow", "sh -c 'echo $$ > "+pidfile+"; exec sleep 60' & wait", "false", 1)
	start := time.Now()
	rep = h.apply(h.doc(slow))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "process group was killed") {
		t.Fatalf("report %+v", rep)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatal("the timeout did not stop the action")
	}
	b, _ := os.ReadFile(pidfile)
	var pid int
	fmt.Sscan(string(b), &pid)
	time.Sleep(100 * time.Millisecond)
	if pid > 0 && processAlive(pid) {
		t.Fatalf("grandchild %d survived its group's kill", pid)
	}

	// Something that leaves the group and keeps the output open does not
	// hold the apply past the action's own end.
	start = time.Now()
	escaped := h.p("escaped")
	escaper := act("escaper", "touch "+escaped+"; setsid sleep 30 & exit 0", "test -f "+escaped, 5)
	if rep = h.apply(h.doc(escaper)); rep.Outcome != shapes.Applied || time.Since(start) > 20*time.Second {
		t.Fatalf("a setsid child held the apply: %+v", rep)
	}

	// The environment is PATH alone, standard input is empty.
	envf := h.p("env")
	envAct := act("env", "tr '\\0' '\\n' < /proc/$$/environ > "+envf+"; cat >> "+envf, "test -s "+envf, 5)
	h.apply(h.doc(envAct))
	if got := h.read("env"); got != command.ActionEnv()+"\n" {
		t.Fatalf("action environment %q", got)
	}
	// Undeclared, an action is forgotten.
	rep = h.apply(h.doc())
	for _, l := range rep.Lines {
		if l.Outcome != shapes.Forgotten {
			t.Fatalf("undeclared action: %+v", l)
		}
	}
}

func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie is dead for our purpose.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func TestAdoptionHolds(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("operator's motd\n"), 0o644)
	adopted := func(taken string) string {
		d := h.doc(fileMot)
		return strings.Replace(d, `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	h.expect(h.apply(adopted("")), shapes.Held, "base.motd=held")
	if h.read("etc/motd") != "operator's motd\n" {
		t.Fatal("held file changed")
	}
	h.expect(h.apply(adopted("")), shapes.Held, "base.motd=held")
	os.WriteFile(h.p("etc/motd"), []byte("edited by hand\n"), 0o644)
	h.expect(h.apply(adopted("")), shapes.HeldChanged, "base.motd=held-changed")
	if h.read("etc/motd") != "edited by hand\n" {
		t.Fatal("held file reverted")
	}
	// Taken: it converges like any other; the kept original is what was found.
	h.expect(h.apply(adopted(`"base"`)), shapes.Applied, "base.motd=applied")
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("taken module not converged")
	}
	h.expect(h.apply(h.doc()), shapes.Restored, "base.motd=restored")
	if h.read("etc/motd") != "operator's motd\n" {
		t.Fatalf("original as found not given back: %q", h.read("etc/motd"))
	}

	// Held and then undeclared: forgotten, never removed.
	h.expect(h.apply(adopted("")), shapes.Held, "base.motd=held")
	h.expect(h.apply(h.doc()), shapes.Forgotten, "base.motd=forgotten")
	if h.read("etc/motd") != "operator's motd\n" {
		t.Fatal("held file removed or changed")
	}
}

// Refusals touch nothing: not the machine, not the store.
func TestRefusalsTouchNothing(t *testing.T) {
	h := newHarness(t)
	h.apply(h.doc(dirEtc, fileMot))
	// A link into the protected directory, which need not exist on this
	// host (a dangling link is followed all the same): the test makes
	// nothing outside its own tree (it made an empty /var/lib/mesh-host
	// on the host, which the labs, overlaying the host's root, then saw).
	link := h.p("innocent")
	os.Symlink("/var/lib/mesh-host", link)
	saved := runtimeSockets
	runtimeSockets = []string{h.p("none.sock")}
	defer func() { runtimeSockets = saved }()
	cases := []struct{ name, doc, want string }{
		{"no container runtime", h.doc(fileMot, `{"module":"w","id":"c","type":"container","name":"c","image":"x@sha256:`+strings.Repeat("a", 64)+`"}`), `resource w.c: this host cannot apply 'container': no container runtime answered _ping (` + h.p("none.sock") + `: absent)`},
		{"service without an init", h.doc(`{"module":"w","id":"s","type":"service","unit":"nginx","state":"running"}`), `resource w.s: initsys: no init this host can drive`},
		{"sealed", h.doc(`{"module":"s","id":"k","type":"file","path":"{root}/k","sealed":"AAAA"}`), "sealed content for s.k could not be opened: this host has no sealing key"},
		{"unknown owner", h.doc(`{"module":"s","id":"k","type":"file","path":"{root}/k","content":"x","owner":"no-such-user-here"}`), `resource s.k field owner: user "no-such-user-here" is not known to the name service`},
		{"unknown group", h.doc(`{"module":"s","id":"k","type":"file","path":"{root}/k","content":"x","owner":"root:no-such-group"}`), `group "no-such-group" is not known`},
		{"protected through a symlink", h.doc(`{"module":"s","id":"k","type":"file","path":"{root}/innocent/executor/pinned.key","content":"x"}`), "is inside the host's /var/lib/mesh-host"},
	}
	before := h.tree()
	entries := len(mustStore(t, h.state).Entries())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := h.apply(c.doc)
			if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, c.want) || len(rep.Lines) != 0 {
				t.Fatalf("report %+v\nwant refusal containing %q", rep, c.want)
			}
			if h.tree() != before {
				t.Fatalf("a refusal changed the machine:\n%s\n---\n%s", before, h.tree())
			}
			if n := len(mustStore(t, h.state).Entries()); n != entries {
				t.Fatalf("a refusal changed the store: %d entries, had %d", n, entries)
			}
		})
	}
}

func TestNodeAddress(t *testing.T) {
	h := newHarness(t)
	d, _ := shapes.ParseTrusted([]byte(h.doc(fileMot)))
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	rep := Apply(context.Background(), st, d, nil, Options{Source: store.Local, NodeID: "workstation"})
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, `the declaration names no node, and this machine is enrolled as node "workstation": a local file names the node it is for ("node": "workstation")`) {
		t.Fatalf("%+v", rep)
	}
}

func TestPartialHostRefusesByName(t *testing.T) {
	h := newHarness(t)
	d, _ := shapes.ParseTrusted([]byte(h.doc(`{"module":"p","id":"n","type":"package","name":"nginx"}`)))
	st, _ := store.Open(h.state)
	rep := Apply(context.Background(), st, d, nil, Options{Source: store.Local, Plan: true, Partial: true})
	if !strings.Contains(rep.Refused, `a partial host applies only file, directory, region, keys, action and archive, not "package"`) {
		t.Fatalf("%+v", rep)
	}
}

func TestFailureStopsAndSaysWhere(t *testing.T) {
	h := newHarness(t)
	// A directory stands where the file is declared: found only at the
	// step, which fails; the rest is not attempted.
	os.Mkdir(h.p("b"), 0o755)
	doc := h.doc(`{"module":"m","id":"a","type":"file","path":"{root}/a","content":"1"}`,
		`{"module":"m","id":"b","type":"file","path":"{root}/b","content":"2"}`,
		`{"module":"m","id":"c","type":"file","path":"{root}/c","content":"3"}`)
	rep := h.apply(doc)
	h.expect(rep, shapes.Failed, "m.a=applied m.b=failed")
	if d := rep.Lines[1].Detail; !strings.Contains(d, h.p("b")+" is a directory; the host writes only regular files") || !strings.Contains(d, "(1 later resource not attempted)") {
		t.Fatalf("detail %q", d)
	}
}

// A file or directory whose parent is neither on the machine nor declared
// before it is refused whole, before anything changes: not found out
// half-way at its write. Declared before it, the directory is made first.
func TestAParentNeitherThereNorDeclaredIsRefused(t *testing.T) {
	h := newHarness(t)
	a := `{"module":"m","id":"a","type":"file","path":"{root}/a","content":"1"}`
	b := `{"module":"m","id":"b","type":"file","path":"{root}/missing/b","content":"2"}`
	rep := h.apply(h.doc(a, b))
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "resource m.b field path: the directory "+h.p("missing")+" is not there, and no directory resource before it declares it") {
		t.Fatalf("%+v", rep)
	}
	h.absent("a")
	dir := `{"module":"m","id":"d","type":"directory","path":"{root}/missing"}`
	h.expect(h.apply(h.doc(a, dir, b)), shapes.Applied, "m.a=applied m.d=applied m.b=applied")
	if rep := h.apply(h.doc(`{"module":"m","id":"deep","type":"directory","path":"{root}/x/y"}`)); rep.Outcome != shapes.Refused {
		t.Fatalf("a directory whose parent is not there: %+v", rep)
	}
}

func mustStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func ownerOf(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

func osWriteFile(p, content string) error { return os.WriteFile(p, []byte(content), 0o644) }

// Two sources declaring one file differently do not rewrite it in turn: a
// rescue file's word holds until it no longer declares it, then the link's
// applies again.
func TestRescueTakesPrecedenceUntilReleased(t *testing.T) {
	h := newHarness(t)
	link := h.doc(dirEtc, fileMot)
	h.expect(h.run(store.Link, link, false), shapes.Applied, "base.etc=applied base.motd=applied")
	rescue := h.doc(strings.Replace(fileMot, `hello\n`, `rescued\n`, 1))
	h.expect(h.apply(rescue), shapes.Applied, "base.motd=applied")
	for i := 0; i < 2; i++ { // the link's reconcile, twice: nothing flips
		rep := h.run(store.Link, link, false)
		h.expect(rep, shapes.Held, "base.etc=unchanged base.motd=held")
		if !strings.Contains(rep.Lines[1].Detail, "declared also by local:base.motd, which takes precedence") {
			t.Fatalf("detail %q", rep.Lines[1].Detail)
		}
		if h.read("etc/motd") != "rescued\n" {
			t.Fatal("the link undid the rescue")
		}
	}
	// The rescue releases it: the link's word applies again.
	h.expect(h.apply(h.doc()), shapes.Forgotten, "base.motd=forgotten")
	h.expect(h.run(store.Link, link, false), shapes.Applied, "base.etc=unchanged base.motd=applied")
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("the link's declaration did not come back")
	}
}

// The link declaring a directory where a rescue file holds a file (or the
// other way) yields without claiming it: not the same thing. Claimed, the
// file passed to the link under the directory's name when the rescue let
// it go, and the link's next apply undid it and made the directory, two
// lines of one name; unclaimed, the rescue's release removes the file the
// mesh made, and the link then makes its directory.
func TestALinksDirectoryWhereARescueHasAFile(t *testing.T) {
	h := newHarness(t)
	file := func(module, content string) string {
		return h.doc(`{"module":"` + module + `","id":"x","type":"file","path":"{root}/x","content":"` + content + `"}`)
	}
	dir := h.doc(`{"module":"base","id":"xd","type":"directory","path":"{root}/x"}`)
	h.expect(h.run(store.Link, file("base", `the link's\n`), false), shapes.Applied, "base.x=applied")
	h.expect(h.apply(file("rs", `rescued\n`)), shapes.Applied, "rs.x=applied")
	rep := h.run(store.Link, dir, false)
	h.expect(rep, shapes.Held, "base.xd=held base.x=forgotten")
	if !strings.Contains(rep.Lines[0].Detail, "with a file there") {
		t.Fatalf("detail %q", rep.Lines[0].Detail)
	}
	h.expect(h.apply(h.doc()), shapes.Removed, "rs.x=removed")
	h.absent("x")
	for _, want := range []string{"base.xd=applied", "base.xd=unchanged"} {
		plan := h.run(store.Link, dir, true)
		h.expect(h.run(store.Link, dir, false), shapes.Outcome(strings.SplitN(want, "=", 2)[1]), want)
		if outcomes(plan) != want {
			t.Fatalf("plan [%s], want [%s]", outcomes(plan), want)
		}
	}
	if info, err := os.Stat(h.p("x")); err != nil || !info.IsDir() {
		t.Fatalf("x is not the link's directory: %v", err)
	}
}

// One file in two shapes from two sources — a rescue file's sshd_config
// declared whole and the link's keys in it, or the link's whole file and a
// rescue's keys — is held by the source above as one target is: the
// lower's step is held and changes nothing, its removal waits, and once
// the source above lets the file go the lower one's word applies again.
// Without it each rewrote the other at every apply.
func TestOneFileInTwoShapesFromTwoSources(t *testing.T) {
	keys := func(module string) string {
		return `{"module":"` + module + `","id":"k","type":"keys","path":"{root}/sshd_config","format":"space","set":{"K":"no"}}`
	}
	whole := func(module string) string {
		return `{"module":"` + module + `","id":"f","type":"file","path":"{root}/sshd_config","content":"K yes\nL 1\n"}`
	}
	type step struct {
		src          store.Source
		res          []string
		lines, holds string
	}
	for _, sc := range []struct {
		name  string
		steps []step
	}{
		{"the rescue's whole file over the link's keys", []step{
			{store.Link, []string{keys("base")}, "base.k=applied", "K no\n"},
			{store.Local, []string{whole("rs")}, "rs.f=applied", "K yes\nL 1\n"},
			{store.Link, []string{keys("base")}, "base.k=held", "K yes\nL 1\n"},
			{store.Local, []string{whole("rs")}, "rs.f=unchanged", "K yes\nL 1\n"},
			{store.Link, nil, "base.k=held", "K yes\nL 1\n"},
			{store.Local, nil, "rs.f=restored", "K no\n"},
			{store.Link, nil, "base.k=restored", "K yes\n"},
		}},
		// The link's keys waited for the rescue's file; the link took the
		// file whole meanwhile, then let both go in one apply: the keys
		// are given back in the file as its put-back original has them.
		{"the link's keys and whole file undone in one apply", []step{
			{store.Link, []string{keys("base")}, "base.k=applied", "K no\n"},
			{store.Local, []string{whole("rs")}, "rs.f=applied", "K yes\nL 1\n"},
			{store.Link, []string{whole("base")}, "base.k=held base.f=held", "K yes\nL 1\n"},
			{store.Local, nil, "rs.f=forgotten", "K yes\nL 1\n"},
			{store.Link, nil, "base.f=restored base.k=restored", "K yes\n"},
		}},
		{"the rescue's keys in the link's whole file", []step{
			{store.Link, []string{whole("base")}, "base.f=applied", "K yes\nL 1\n"},
			{store.Local, []string{keys("rs")}, "rs.k=applied", "K no\nL 1\n"},
			{store.Link, []string{whole("base")}, "base.f=held", "K no\nL 1\n"},
			{store.Local, []string{keys("rs")}, "rs.k=unchanged", "K no\nL 1\n"},
			{store.Local, nil, "rs.k=restored", "K yes\nL 1\n"},
			{store.Link, []string{whole("base")}, "base.f=unchanged", "K yes\nL 1\n"},
			{store.Link, nil, "base.f=restored", "K yes\n"},
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			h := newHarness(t)
			os.WriteFile(h.p("sshd_config"), []byte("K yes\n"), 0o600)
			for i, c := range sc.steps {
				doc := h.doc(c.res...)
				plan := h.run(c.src, doc, true)
				rep := h.run(c.src, doc, false)
				if got := outcomes(rep); got != c.lines || outcomes(plan) != got {
					t.Fatalf("step %d (%s): plan [%s], apply [%s], want [%s]\n%+v", i+1, c.src, outcomes(plan), got, c.lines, rep.Lines)
				}
				if got := h.read("sshd_config"); got != c.holds {
					t.Fatalf("step %d (%s): the file holds %q, want %q\n%+v", i+1, c.src, got, c.holds, rep.Lines)
				}
			}
		})
	}
}

// A resource that keeps its id and moves to another path leaves the old
// one undeclared: it is removed, not kept claimed for ever.
func TestMovedResourceRemovesTheOld(t *testing.T) {
	h := newHarness(t)
	at := func(p string) string {
		return h.doc(`{"module":"m","id":"secret","type":"file","path":"{root}/` + p + `","content":"s"}`)
	}
	h.expect(h.apply(at("a")), shapes.Applied, "m.secret=applied")
	h.expect(h.apply(at("b")), shapes.Applied, "m.secret=applied m.secret=removed")
	h.absent("a")
	if len(mustStore(t, h.state).Entries()) != 1 {
		t.Fatal("the old path is still claimed")
	}
}

// The first applies on an adopted node produce a briefing: a line per
// finding, the outcome from the worst, and what to look at.
func TestBriefing(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("operator's motd\n"), 0o644) // differs: kept
	os.WriteFile(h.p("etc/same"), []byte("same\n"), 0o644)            // as declared: ok
	doc := strings.Replace(h.doc(fileMot,
		`{"module":"base","id":"same","type":"file","path":"{root}/etc/same","content":"same\n","mode":"0644"}`,
		`{"module":"base","id":"new","type":"file","path":"{root}/etc/new","content":"n"}`),
		`{"version":1,`, `{"version":1,"adopted":true,`, 1)
	rep := h.apply(doc)
	b := rep.Briefing
	if b == nil || b.Outcome != shapes.MarkKept || len(b.Findings) != 3 {
		t.Fatalf("briefing %+v", b)
	}
	marks := fmt.Sprintln(b.Findings[0].Mark, b.Findings[1].Mark, b.Findings[2].Mark)
	if marks != "kept ok ok\n" || !strings.Contains(strings.Join(b.LookAt, " "), "base.motd (file): what the machine has differs") {
		t.Fatalf("marks %s, look at %q", marks, b.LookAt)
	}
	kept, err := mustStore(t, h.state).Briefing()
	if err != nil || kept == nil || kept.Outcome != shapes.MarkKept {
		t.Fatalf("the briefing was not kept: %+v %v", kept, err)
	}
	// A failing line makes the briefing failed, whatever else it says.
	os.Chmod(h.p("etc"), 0o755)
	os.Mkdir(h.p("etc/adir"), 0o755)
	bad := strings.Replace(doc, h.p("etc/new"), h.p("etc/adir"), 1)
	if rep = h.apply(bad); rep.Briefing.Outcome != shapes.MarkFailed {
		t.Fatalf("%+v", rep.Briefing)
	}
}

// A file the host created and someone edited by hand since is removed when
// undeclared — the host made it — but the line says it had changed, and
// its content is kept in the store for a person to get back.
func TestEditedCreatedFileIsSalvaged(t *testing.T) {
	h := newHarness(t)
	h.apply(h.doc(dirEtc, fileMot))
	os.WriteFile(h.p("etc/motd"), []byte("the operator's words\n"), 0o644)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Removed, "base.motd=removed base.etc=removed")
	want := "the host created it, and it was edited by hand since (sha256:"
	if !strings.Contains(rep.Lines[0].Detail, want) || !strings.Contains(rep.Lines[0].Detail, "its content kept for 30 days") {
		t.Fatalf("detail %q", rep.Lines[0].Detail)
	}
	if plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan said %q, apply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	h.absent("etc")
	st, _ := store.Open(h.state)
	got := st.Salvaged()
	if len(got) != 1 || got[0].Path != h.p("etc/motd") || got[0].Module != "base" || got[0].ID != "motd" {
		t.Fatalf("salvaged %+v", got)
	}
	if b, err := os.ReadFile(st.OriginalPath(got[0].Digest)); err != nil || string(b) != "the operator's words\n" {
		t.Fatalf("salvaged content %q %v", b, err)
	}
	// Not edited: removed with no salvage.
	h.apply(h.doc(dirEtc, fileMot))
	rep = h.apply(h.doc())
	if rep.Lines[0].Detail != "the host created it; removed" || len(st.Salvaged()) != 1 {
		t.Fatalf("%+v %+v", rep.Lines, st.Salvaged())
	}
}

// A found file edited by hand while declared, then undeclared: its
// original goes back (ADR 0118), but what the person wrote is not thrown
// away without a word — the line says so and the content is kept, as a
// created file's is. Not edited since: the original goes back, nothing kept.
func TestAFoundFilesHandEditIsKeptWhenItsOriginalGoesBack(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("the machine's own\n"), 0o644)
	h.expect(h.apply(h.doc(fileMot)), shapes.Applied, "base.motd=applied")
	os.WriteFile(h.p("etc/motd"), []byte("an emergency fix\n"), 0o644)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Restored, "base.motd=restored")
	if d := rep.Lines[0].Detail; !strings.Contains(d, "the original the host found is put back") || !strings.Contains(d, "it was edited by hand since (sha256:") || !strings.Contains(d, "kept for 30 days") {
		t.Fatalf("detail %q", d)
	}
	if plan.Lines[0].Detail != "would be: "+rep.Lines[0].Detail && plan.Lines[0].Detail != rep.Lines[0].Detail {
		t.Fatalf("plan said %q, apply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	if got := h.read("etc/motd"); got != "the machine's own\n" {
		t.Fatalf("given back %q", got)
	}
	st, _ := store.Open(h.state)
	got := st.Salvaged()
	if len(got) != 1 || got[0].Path != h.p("etc/motd") || got[0].Module != "base" || got[0].ID != "motd" {
		t.Fatalf("salvaged %+v", got)
	}
	if b, err := os.ReadFile(st.OriginalPath(got[0].Digest)); err != nil || string(b) != "an emergency fix\n" {
		t.Fatalf("salvaged content %q %v", b, err)
	}
	h.apply(h.doc(fileMot))
	rep = h.apply(h.doc())
	if rep.Lines[0].Detail != "the original the host found is put back (0644 0:0)" || len(st.Salvaged()) != 1 {
		t.Fatalf("%+v %+v", rep.Lines, st.Salvaged())
	}
}

// ADR 0100: what adoption holds stays held. A held file or directory
// deleted by something else is reported held-changed and not made again
// before its module is taken; once taken, it converges.
func TestHeldThingThatVanishesIsNotRecreated(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("operator's motd\n"), 0o644)
	adopted := func(taken string) string {
		return strings.Replace(h.doc(dirEtc, fileMot), `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	h.expect(h.apply(adopted("")), shapes.Held, "base.etc=held base.motd=held")
	os.Remove(h.p("etc/motd"))
	rep := h.apply(adopted(""))
	h.expect(rep, shapes.HeldChanged, "base.etc=held base.motd=held-changed")
	if !strings.Contains(rep.Lines[1].Detail, "deleted by something else since it was found; not made again before the module is taken") {
		t.Fatalf("%q", rep.Lines[1].Detail)
	}
	h.absent("etc/motd")
	os.Remove(h.p("etc"))
	h.expect(h.apply(adopted("")), shapes.HeldChanged, "base.etc=held-changed base.motd=held-changed")
	h.absent("etc")
	if b := rep.Briefing; b == nil || b.Outcome != shapes.MarkKept {
		t.Fatalf("briefing %+v", b)
	}
	// Taken: it converges like any other.
	h.expect(h.apply(adopted(`"base"`)), shapes.Applied, "base.etc=applied base.motd=applied")
	if h.read("etc/motd") != "hello\n" {
		t.Fatal("not converged once taken")
	}
}

// A held package or user removed by something else: held-changed, and not
// installed or made again before its module is taken.
func TestHeldPackageThatVanishesIsNotReinstalled(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{"curl": "7.88"}, repo: map[string]string{"curl": "8.0"}}
	doc := strings.Replace(h.doc(`{"module":"m","id":"curl","type":"package","name":"curl"}`), `{"version":1,`, `{"version":1,"adopted":true,`, 1)
	if rep := h.applyPackages(f, doc); rep.Outcome != shapes.Held {
		t.Fatalf("%+v", rep)
	}
	delete(f.have, "curl")
	rep := h.applyPackages(f, doc)
	if rep.Outcome != shapes.HeldChanged || len(f.log) != 0 || !strings.Contains(rep.Lines[0].Detail, "removed by something else") {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
}

// A failed step on an adopted node stops the apply, not the briefing:
// every later resource is observed (nothing changed) and gets its line;
// one the host cannot tell is marked unknown.
func TestAdoptionBriefingGoesOnAfterAFailure(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("etc"), 0o755)
	os.WriteFile(h.p("etc/motd"), []byte("operator's motd\n"), 0o644)
	os.WriteFile(h.p("etc/same"), []byte("same\n"), 0o644)
	// A directory where a file is declared fails its step; a regular
	// file where a directory would be makes what is below it unknowable.
	os.Mkdir(h.p("adir"), 0o755)
	os.WriteFile(h.p("also-nowhere"), []byte("a file\n"), 0o644)
	doc := strings.Replace(h.doc(
		`{"module":"a","id":"broken","type":"file","path":"{root}/adir","content":"x"}`,
		fileMot,
		`{"module":"base","id":"blocked","type":"file","path":"{root}/also-nowhere/y","content":"y"}`,
		`{"module":"base","id":"same","type":"file","path":"{root}/etc/same","content":"same\n","mode":"0644"}`),
		`{"version":1,`, `{"version":1,"adopted":true,`, 1)
	before := h.tree()
	rep := h.apply(doc)
	if rep.Outcome != shapes.Failed || len(rep.Lines) != 1 {
		t.Fatalf("the apply did not stop at the failure: %+v", rep.Lines)
	}
	if h.tree() != before {
		t.Fatal("observing changed the machine")
	}
	b := rep.Briefing
	var got []string
	for _, f := range b.Findings {
		got = append(got, f.Module+"."+f.ID+"="+string(f.Mark))
	}
	if strings.Join(got, " ") != "a.broken=failed base.motd=kept base.blocked=unknown base.same=ok" || b.Outcome != shapes.MarkFailed {
		t.Fatalf("findings %v (%s)\n%+v", got, b.Outcome, b.Findings)
	}
	if !strings.Contains(b.Findings[1].Detail, "observed only (the apply stopped at a.broken; nothing here was changed)") {
		t.Fatalf("%q", b.Findings[1].Detail)
	}
	// Observing recorded nothing: the next apply after the fix holds them.
	if n := len(mustStore(t, h.state).Entries()); n != 0 {
		t.Fatalf("observing recorded %d entries", n)
	}
}

// A directory another applier (or a person) makes between the step's look
// and its mkdir is not the host's: the apply fails saying so, leaves no
// intent pending, and the apply after — declaring it no more — neither
// removes it nor claims it.
func TestADirectoryMadeMeanwhileIsNotTheHosts(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/d"}`)
	rep := h.applyMeanwhile(doc, "d", func() {
		os.Mkdir(h.p("d"), 0o755)
		os.WriteFile(h.p("d/theirs"), []byte("x\n"), 0o644)
	})
	if rep.Outcome != shapes.Failed || len(rep.Lines) != 1 || !strings.Contains(rep.Lines[0].Detail, "not the host's") {
		t.Fatalf("the apply: %+v", rep)
	}
	if e := mustStore(t, h.state).Get("path:" + h.p("d")); e != nil {
		t.Fatalf("the store holds %+v", e)
	}
	other := h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/f","content":"x\n"}`)
	rep = h.apply(other)
	for _, l := range rep.Lines {
		if l.ID == "d" {
			t.Fatalf("the next apply says of it: %+v", l)
		}
	}
	if _, err := os.Stat(h.p("d/theirs")); err != nil {
		t.Fatalf("what was made meanwhile is gone: %v", err)
	}
}

// A directory the host made and someone deleted since is said so when it
// is undeclared, as a file is, and forgotten.
func TestADirectoryDeletedAlreadyIsSaidSo(t *testing.T) {
	h := newHarness(t)
	h.expect(h.apply(h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/d"}`)), shapes.Applied, "m.d=applied")
	os.Remove(h.p("d"))
	for _, plan := range []bool{true, false} {
		rep := h.run(store.Local, h.doc(), plan)
		if len(rep.Lines) != 1 || rep.Lines[0].Outcome != shapes.Removed || rep.Lines[0].Detail != "the host created it; it was deleted already" {
			t.Fatalf("plan %v: %+v", plan, rep.Lines)
		}
	}
	if e := mustStore(t, h.state).Get("path:" + h.p("d")); e != nil {
		t.Fatalf("still held: %+v", e)
	}
}

// A file someone puts at a declared path between the step's look (absent)
// and its write is not written over nor taken for the host's: the apply
// fails saying so, the person's content stays, and the apply after —
// declaring it no more — leaves it alone.
func TestAFileMadeMeanwhileIsNotWrittenOver(t *testing.T) {
	h := newHarness(t)
	doc := h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/f","content":"the host's\n"}`)
	rep := h.applyMeanwhile(doc, "f", func() {
		os.WriteFile(h.p("f"), []byte("a person's\n"), 0o644)
	})
	if rep.Outcome != shapes.Failed || len(rep.Lines) != 1 || !strings.Contains(rep.Lines[0].Detail, "not the host's") {
		t.Fatalf("the apply: %+v", rep)
	}
	if h.read("f") != "a person's\n" {
		t.Fatalf("written over: %q", h.read("f"))
	}
	if e := mustStore(t, h.state).Get("path:" + h.p("f")); e != nil {
		t.Fatalf("the store holds %+v", e)
	}
	h.apply(h.doc(`{"module":"m","id":"g","type":"file","path":"{root}/g","content":"x\n"}`))
	if h.read("f") != "a person's\n" {
		t.Fatalf("the apply after took it: %q", h.read("f"))
	}
}

// A create an earlier apply was cut in (its intent pending, a stub in the
// store) that meets, when tried again, a directory another made meanwhile
// forgets the stub with the intent: the apply after — declaring it no
// more — neither removes it nor claims it.
func TestACutCreateMetByAnothersDirectoryIsForgotten(t *testing.T) {
	h := newHarness(t)
	target := "path:" + h.p("d")
	st := mustStore(t, h.state)
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := st.Intend(target, store.Intent{Op: "create", Created: true, Type: shapes.TypeDirectory, Claim: store.Claim{Source: store.Local, Module: "m", ID: "d"}}); err != nil {
		t.Fatal(err)
	}
	st.Sync()
	st.Unlock() // the cut: the intent stays pending
	doc := h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/d"}`)
	d, st := h.open(doc, false)
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local,
		beforeChange: func(t string) {
			if t == target {
				os.Mkdir(h.p("d"), 0o755)
				os.WriteFile(h.p("d/theirs"), []byte("x\n"), 0o644)
			}
		}})
	st.Unlock()
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "not the host's") {
		t.Fatalf("the apply: %+v", rep)
	}
	if e := mustStore(t, h.state).Get(target); e != nil {
		t.Fatalf("the store holds %+v", e)
	}
	h.apply(h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/f","content":"x\n"}`))
	if _, err := os.Stat(h.p("d/theirs")); err != nil {
		t.Fatalf("what was made meanwhile is gone: %v", err)
	}
}

// A directory the host made, with a file the host made in it, both
// undeclared while a file is declared at the directory's path: the
// directory is undone first, and what the host made in it with it, in
// the one apply — not kept for "what the host did not create" while the
// new file fails at every apply. What a person put in it keeps it, and
// the new file's step says why it cannot be made. Plan and apply agree.
func TestADirectoryOfTheHostsBecomesAFileInOneApply(t *testing.T) {
	for _, persons := range []bool{false, true} {
		t.Run(fmt.Sprintf("a person's file in it %v", persons), func(t *testing.T) {
			h := newHarness(t)
			dir := `{"module":"m","id":"d","type":"directory","path":"{root}/x"}`
			inner := `{"module":"m","id":"in","type":"file","path":"{root}/x/inner","content":"host's\n"}`
			h.expect(h.apply(h.doc(dir, inner)), shapes.Applied, "m.d=applied m.in=applied")
			if persons {
				os.WriteFile(h.p("x/notes"), []byte("mine\n"), 0o600)
			}
			file := `{"module":"m2","id":"f","type":"file","path":"{root}/x","content":"now a file\n"}`
			plan := h.run(store.Local, h.doc(file), true)
			rep := h.apply(h.doc(file))
			if outcomes(plan) != outcomes(rep) {
				t.Fatalf("plan [%s], apply [%s]", outcomes(plan), outcomes(rep))
			}
			if persons {
				if rep.Outcome != shapes.Failed || h.read("x/notes") != "mine\n" {
					t.Fatalf("%s %+v", rep.Outcome, rep.Lines)
				}
				return
			}
			if rep.Outcome == shapes.Failed || h.read("x") != "now a file\n" {
				t.Fatalf("%s %+v", rep.Outcome, rep.Lines)
			}
			h.expect(h.apply(h.doc(file)), shapes.Unchanged, "m2.f=unchanged")
		})
	}
}

// A file of the host's that a declaration now makes a directory, a file
// declared in it: the plan says what the apply does — the file taken away
// first, the directory made, the file in it written — not that the file's
// path is under a file.
func TestAPlanOfAFileInADirectoryThatWasAFile(t *testing.T) {
	h := newHarness(t)
	h.expect(h.apply(h.doc(`{"module":"m1","id":"f","type":"file","path":"{root}/x","content":"file\n"}`)), shapes.Applied, "m1.f=applied")
	doc := h.doc(`{"module":"m2","id":"d","type":"directory","path":"{root}/x"}`, `{"module":"m3","id":"f","type":"file","path":"{root}/x/in","content":"in\n"}`)
	plan := h.run(store.Local, doc, true)
	rep := h.apply(doc)
	if outcomes(plan) != outcomes(rep) || rep.Outcome != shapes.Applied {
		t.Fatalf("plan [%s] %+v\napply [%s]", outcomes(plan), plan.Lines, outcomes(rep))
	}
}
