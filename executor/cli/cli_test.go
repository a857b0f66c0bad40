package cli

import (
	"archive/tar"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/serve"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const decl = `{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"%s","content":"x\n"}]}`

// base is a root-owned 0755 directory the tests own.
func base(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	os.Chmod(d, 0o755)
	return d
}

func write(t *testing.T, p, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
	return p
}

// A local file is root's word only if nobody else could have written it.
func TestLocalFileRefusals(t *testing.T) {
	d := base(t)
	good := write(t, filepath.Join(d, "good.json"), "{}", 0o600)
	if _, err := ReadLocalFile(good); err != nil {
		t.Fatalf("a root-owned 0600 file refused: %v", err)
	}
	cases := []struct {
		name string
		make func() string
		want string
	}{
		{"group writable", func() string { return write(t, filepath.Join(d, "gw.json"), "{}", 0o620) }, "has mode 0620; group or others may write it"},
		{"other writable", func() string { return write(t, filepath.Join(d, "ow.json"), "{}", 0o602) }, "has mode 0602"},
		{"owned by another user", func() string {
			p := write(t, filepath.Join(d, "nobody.json"), "{}", 0o600)
			os.Chown(p, 65534, 65534)
			return p
		}, "is owned by uid 65534; only a file root owns is applied"},
		{"symlink to a good file", func() string {
			p := filepath.Join(d, "link.json")
			os.Symlink(good, p)
			return p
		}, "a symbolic link is on the path"},
		{"symlinked directory on the path", func() string {
			p := filepath.Join(d, "linkdir")
			os.Symlink(d, p)
			return filepath.Join(p, "good.json")
		}, "is a symbolic link on the way to it"},
		{"directory others may write", func() string {
			w := filepath.Join(d, "open")
			os.Mkdir(w, 0o777)
			os.Chmod(w, 0o777)
			return write(t, filepath.Join(w, "f.json"), "{}", 0o600)
		}, "writable by others without the sticky bit"},
		{"directory owned by another user", func() string {
			w := filepath.Join(d, "theirs")
			os.Mkdir(w, 0o755)
			os.Chown(w, 65534, 65534)
			return write(t, filepath.Join(w, "f.json"), "{}", 0o600)
		}, "is owned by uid 65534, not root"},
		{"fifo", func() string {
			p := filepath.Join(d, "fifo.json")
			syscall.Mkfifo(p, 0o600)
			return p
		}, "not a regular file"},
		{"hardlinked", func() string {
			p := filepath.Join(d, "hard.json")
			os.Link(good, p)
			return p
		}, "hardlinked"},
		{"missing", func() string { return filepath.Join(d, "nothing.json") }, "does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadLocalFile(c.make())
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "executor: local file") {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main("test", args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestApplyExitStatusAndJSON(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	target := filepath.Join(d, "motd")
	f := write(t, filepath.Join(d, "d.json"), strings.Replace(decl, "%s", target, 1), 0o644)

	code, out, _ := run("apply", "--json", "--state", state, f)
	form(t, "apply --json", out)
	var rep shapes.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != ExitApplied {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	if rep.Outcome != shapes.Applied || len(rep.Lines) != 1 || rep.Lines[0].Module != "m" || rep.Lines[0].ID != "f" || rep.Lines[0].Type != "file" {
		t.Fatalf("report %+v", rep)
	}
	// The JSON field names are exact: the tests and tools depend on them.
	for _, k := range []string{`"outcome"`, `"lines"`, `"module"`, `"id"`, `"type"`, `"detail"`} {
		if !strings.Contains(out, k) {
			t.Errorf("JSON lacks %s", k)
		}
	}

	// Refused: exit 2, "refused" carries the reason, nothing touched.
	bad := write(t, filepath.Join(d, "bad.json"), `{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"`+target+`","content":"y","colour":1}]}`, 0o644)
	code, out, _ = run("apply", "--json", "--state", state, bad)
	form(t, "apply --json (refused)", out)
	rep = shapes.Report{}
	json.Unmarshal([]byte(out), &rep)
	if code != ExitRefused || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "field colour: unknown field") {
		t.Fatalf("exit %d %+v", code, rep)
	}
	if b, _ := os.ReadFile(target); string(b) != "x\n" {
		t.Fatal("a refused declaration changed the machine")
	}

	// Failed: exit 1.
	os.Mkdir(filepath.Join(d, "adir"), 0o755) // a directory where a file is declared: the step fails
	fail := write(t, filepath.Join(d, "fail.json"), strings.Replace(decl, "%s", filepath.Join(d, "adir"), 1), 0o644)
	if code, out, _ = run("apply", "--state", state, fail); code != ExitFailed || !strings.Contains(out, "outcome: failed") {
		t.Fatalf("exit %d\n%s", code, out)
	}

	// plan touches nothing.
	os.WriteFile(target, []byte("drift"), 0o644)
	code, out, _ = run("plan", "--state", state, f)
	if b, _ := os.ReadFile(target); code != 0 || string(b) != "drift" || !strings.Contains(out, "would repair") {
		t.Fatalf("plan: exit %d, file %q\n%s", code, b, out)
	}
	// Its lines and its outcome say what would be, never what is done.
	if strings.Contains(out, "repaired") || !strings.Contains(out, "outcome: would repair (1 would repair)") {
		t.Fatalf("a plan speaks of what it did not do:\n%s", out)
	}
	_, out, _ = run("plan", "--json", "--state", state, f)
	form(t, "plan --json", out)

	// owned and status speak JSON too.
	code, out, _ = run("owned", "--json", "--state", state)
	form(t, "owned --json", out)
	if code != 0 || !strings.Contains(out, `"target": "path:`+target+`"`) {
		t.Fatalf("owned: %d\n%s", code, out)
	}
	// An empty declaration on a state holding nothing of a local file's:
	// said so, not "()".
	empty := write(t, filepath.Join(d, "empty.json"), `{"version":1,"resources":[],"owns_nothing":true}`, 0o644)
	if code, out, _ = run("plan", "--state", filepath.Join(d, "fresh"), empty); code != 0 || !strings.Contains(out, "outcome: would change nothing (nothing declared, nothing of this source's held)") {
		t.Fatalf("plan of nothing: %d\n%s", code, out)
	}
	// A local file's apply has no sequence: none said.
	if _, out, _ = run("status", "--state", state); !strings.Contains(out, "\nlast local apply: ") || strings.Contains(out, "last local apply: seq") {
		t.Errorf("status after a local apply:\n%s", out)
	}
	// No briefing (not an adopted node): an empty object, no null.
	code, out, _ = run("briefing", "--json", "--state", state)
	form(t, "briefing --json", out)
	if code != 0 || strings.TrimSpace(out) != "{}" {
		t.Fatalf("briefing --json with none: %d\n%s", code, out)
	}
	code, out, _ = run("status", "--json", "--state", state)
	form(t, "status --json", out)
	if code != 0 || !strings.Contains(out, `"state": "hosted"`) {
		t.Fatalf("status: %d\n%s", code, out)
	}
	if code, out, _ = run("version"); code != 0 || out != "test\n" {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, _, _ = run("frobnicate"); code != ExitRefused {
		t.Fatalf("unknown command exit %d", code)
	}
}

// A file moved to another path under the same resource: the plan shows
// the new path's diff once, under the line that makes it, and the line
// that undoes the old path names that path — in the plan and the apply.
func TestAPlanOfAMovedFileSaysWhichPathIsUndone(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
	fa := write(t, filepath.Join(d, "a.json"), strings.Replace(decl, "%s", a, 1), 0o644)
	fb := write(t, filepath.Join(d, "b.json"), strings.Replace(decl, "%s", b, 1), 0o644)
	if code, out, _ := run("apply", "--state", state, fa); code != ExitApplied {
		t.Fatalf("apply a: exit %d\n%s", code, out)
	}
	code, out, _ := run("plan", "--state", state, fb)
	if code != 0 || strings.Count(out, "+++ "+b+" (declared)") != 1 || strings.Contains(out, "+++ "+a) ||
		!strings.Contains(out, "would remove         m.f                          file       "+a+": the host created it; removed") {
		t.Fatalf("plan of the moved file: exit %d\n%s", code, out)
	}
	if i, j := strings.Index(out, "+++ "+b), strings.Index(out, "would remove"); i > j {
		t.Fatalf("the new path's diff is not under the line that makes it:\n%s", out)
	}
	if code, out, _ = run("apply", "--state", state, fb); code != ExitApplied || !strings.Contains(out, "removed       m.f                          file       "+a+": the host created it; removed") {
		t.Fatalf("apply of the moved file: exit %d\n%s", code, out)
	}
}

// A resource reshaped at its path (a directory, then a file): its old
// shape's undoing comes first in a plan, and the new shape's diff goes
// under the line that makes it, not the undoing's.
func TestAPlanOfAReshapedResourceShowsItsDiffUnderTheMaking(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	x := filepath.Join(d, "x")
	dir := write(t, filepath.Join(d, "dir.json"), `{"version":1,"resources":[{"module":"m","id":"x","type":"directory","path":"`+x+`"}]}`, 0o644)
	file := write(t, filepath.Join(d, "file.json"), strings.Replace(strings.Replace(decl, "%s", x, 1), `"id":"f"`, `"id":"x"`, 1), 0o644)
	if code, out, _ := run("apply", "--state", state, dir); code != ExitApplied {
		t.Fatalf("apply the directory: exit %d\n%s", code, out)
	}
	code, out, _ := run("plan", "--state", state, file)
	lines := strings.Split(out, "\n")
	undo, make, diff := -1, -1, -1
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "would remove") && strings.Contains(l, "m.x"):
			undo = i
		case strings.HasPrefix(l, "would apply") && strings.Contains(l, "m.x"):
			make = i
		case strings.HasPrefix(l, "    +++ "+x+" (declared)"):
			diff = i
		}
	}
	if code != 0 || undo < 0 || make < 0 || diff != make+2 || strings.Count(out, "+++ ") != 1 {
		t.Fatalf("plan of the reshaped resource: exit %d (undo %d, make %d, diff %d)\n%s", code, undo, make, diff, out)
	}
}

// A local file on an enrolled node must name the node.
func TestLocalFileMustNameAnEnrolledNode(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	os.Mkdir(state, 0o700)
	write(t, filepath.Join(state, "identity.json"), `{"node":"workstation","enrolment":"e-1","control_key":"`+base64.StdEncoding.EncodeToString(make([]byte, 32))+`"}`, 0o600)
	f := write(t, filepath.Join(d, "d.json"), strings.Replace(decl, "%s", filepath.Join(d, "x"), 1), 0o644)
	code, out, _ := run("apply", "--state", state, f)
	if code != ExitRefused || !strings.Contains(out, `names no node, and this machine is enrolled as node "workstation"`) {
		t.Fatalf("exit %d\n%s", code, out)
	}
	named := write(t, filepath.Join(d, "n.json"), strings.Replace(strings.Replace(decl, "%s", filepath.Join(d, "x"), 1), `"version":1,`, `"version":1,"node":"workstation",`, 1), 0o644)
	if code, out, _ = run("apply", "--state", state, named); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

// reconcile applies the carried bundle as its own source: what it made is
// the bundle's, and a rescue file declaring nothing does not undo it.
func TestReconcileAppliesTheCarriedBundle(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	if code, out, _ := run("reconcile", "--state", state, filepath.Join(d, "none.lock")); code != 0 || !strings.Contains(out, "no carried bundle") {
		t.Fatalf("no bundle: exit %d %s", code, out)
	}
	target := filepath.Join(d, "motd")
	bundle := write(t, filepath.Join(d, "foundation.lock"), strings.Replace(decl, "%s", target, 1), 0o644)
	code, out, errOut := run("reconcile", "--state", state, bundle)
	if code != ExitApplied || !strings.Contains(out, "applied") {
		t.Fatalf("reconcile: exit %d\n%s%s", code, out, errOut)
	}
	st, _ := store.Open(state)
	if es := st.Entries(); len(es) != 1 || es[0].Claims[0].Source != store.Bundle {
		t.Fatalf("entries %+v", es)
	}
	// A rescue file that declares nothing leaves the bundle's work be.
	empty := write(t, filepath.Join(d, "empty.json"), `{"version":1,"owns_nothing":true,"resources":[]}`, 0o644)
	if code, out, _ := run("apply", "--state", state, empty); code != ExitApplied {
		t.Fatalf("empty rescue: %d %s", code, out)
	}
	if _, err := os.Stat(target); err != nil {
		t.Fatal("a rescue file undid the bundle's work")
	}
	// A bundle anyone else could write is refused like any local file.
	os.Chmod(bundle, 0o666)
	if code, out, errOut := run("reconcile", "--state", state, bundle); code != ExitRefused || !strings.Contains(out+errOut, "not root's word") {
		t.Fatalf("an open bundle: %d %s%s", code, out, errOut)
	}
}

// A partial host cannot be a first node, and its bundle report says so;
// a full host can.
func TestBundleReport(t *testing.T) {
	d := base(t)
	out := filepath.Join(d, "bundle.json")
	code, _, errOut := run("bundle", "--partial", "--state", filepath.Join(d, "state"), "--out", out)
	var r bundleReport
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &r); err != nil || code != ExitRefused || r.FirstNode || !r.Partial ||
		!strings.Contains(r.Reason, "a partial host cannot be a first node") || !strings.Contains(errOut, "cannot be a first node") {
		t.Fatalf("partial: exit %d %+v %v %s", code, r, err, errOut)
	}
	// A whole host with the bundle: a first node; without one, or with
	// one reconcile would refuse, not, saying why.
	good := write(t, filepath.Join(d, "foundation.lock"), strings.Replace(decl, "%s", filepath.Join(d, "motd"), 1), 0o644)
	code, stdout, _ := run("bundle", "--state", filepath.Join(d, "state"), good)
	r = bundleReport{}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != 0 || !r.FirstNode || r.Partial || !r.Present || r.Resources != 1 || r.Reason != "" {
		t.Fatalf("full: exit %d %+v %v", code, r, err)
	}
	for name, c := range map[string]struct{ path, why string }{
		"no bundle":        {filepath.Join(d, "none.lock"), "there is no carried bundle at " + filepath.Join(d, "none.lock")},
		"not a bundle":     {write(t, filepath.Join(d, "bad.lock"), `{"version":1,`, 0o644), "bad.lock:1:14"},
		"others may write": {write(t, filepath.Join(d, "open.lock"), strings.Replace(decl, "%s", filepath.Join(d, "motd"), 1), 0o666), "group or others may write it"},
	} {
		code, stdout, errOut := run("bundle", "--state", filepath.Join(d, "state"), c.path)
		r = bundleReport{}
		if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != ExitRefused || r.FirstNode || !strings.Contains(r.Reason, c.why) || !strings.Contains(errOut, c.why) {
			t.Errorf("%s: exit %d %+v %v %s", name, code, r, err, errOut)
		}
	}
	// Not the bundle this build carries: reconcile refuses it, and so
	// this says.
	defer func(d string) { BundleDigest = d }(BundleDigest)
	BundleDigest = strings.Repeat("ab", 32)
	code, stdout, _ = run("bundle", "--state", filepath.Join(d, "state"), good)
	r = bundleReport{}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != ExitRefused || r.FirstNode || !strings.Contains(r.Reason, "this build carries the bundle with sha256 "+BundleDigest) {
		t.Fatalf("another bundle: exit %d %+v %v", code, r, err)
	}
}

// `owned` says where salvaged content is kept and until when, in words and
// in JSON: each one an item of the same list as the entries (so a reader
// of the list reads it still), type "salvaged", claimed by nobody, its
// keys snake_case, and no null where a list is meant.
func TestOwnedShowsSalvagedContent(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	target := filepath.Join(d, "motd")
	f := write(t, filepath.Join(d, "d.json"), strings.Replace(decl, "%s", target, 1), 0o644)
	empty := write(t, filepath.Join(d, "empty.json"), `{"version":1,"resources":[],"owns_nothing":true}`, 0o644)
	if code, out, _ := run("apply", "--state", state, f); code != ExitApplied {
		t.Fatalf("apply: %d\n%s", code, out)
	}
	write(t, target, "the operator's words\n", 0o644)
	if code, out, _ := run("apply", "--state", state, empty); code != 0 || !strings.Contains(out, "its content kept for 30 days") {
		t.Fatalf("undeclare: %d\n%s", code, out)
	}
	st, _ := store.Open(state)
	salvaged := st.Salvaged()
	if len(salvaged) != 1 {
		t.Fatalf("salvaged %+v", salvaged)
	}
	x := salvaged[0]
	kept, until := st.OriginalPath(x.Digest), x.Removed.Add(store.SalvageKeep)

	code, out, _ := run("owned", "--state", state)
	want := "the host holds nothing on this machine\n\n" +
		"what the host kept of files when they were undeclared — edited by hand since it wrote them, then removed or given their original back over, or an original with nowhere to go back to — is kept until the date shown:\n" +
		target + " (m.f, undeclared " + x.Removed.Format(time.RFC3339) + "): " + kept + " until " + until.Format("2006-01-02") + "\n"
	if code != 0 || out != want {
		t.Fatalf("owned: %d\n%s\nwant\n%s", code, out, want)
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "the operator's words\n" {
		t.Fatalf("kept at %s: %q %v", kept, b, err)
	}

	code, out, _ = run("owned", "--json", "--state", state)
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 1 {
		t.Fatalf("owned --json: %d %v\n%s", code, err, out)
	}
	got, _ := json.Marshal(list[0])
	wantJSON, _ := json.Marshal(map[string]any{
		"target": "salvaged:" + target, "type": "salvaged", "claims": []any{},
		"how": "salvaged: kept when undeclared (edited by hand since the host wrote it, or an original with nowhere to go back to); what it held is kept at " + kept + " until " + until.Format("2006-01-02"),
		"salvaged": map[string]any{"path": target, "module": "m", "id": "f", "removed": x.Removed, "digest": x.Digest, "written": x.Written,
			"kept_at": kept, "kept_until": until},
	})
	if string(got) != string(wantJSON) {
		t.Fatalf("owned --json item\n got %s\nwant %s", got, wantJSON)
	}

	// Nothing salvaged, nothing held: an empty list, not null.
	code, out, _ = run("owned", "--json", "--state", filepath.Join(d, "other"))
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("owned --json of nothing: %d %q", code, out)
	}
}

// `owned` says a directory the host made and kept when it was undeclared
// (it holds what the host did not make) as undeclared and kept, not as a
// declared one created by the host; its claim is still shown, and a
// declared one beside it is said as before.
func TestOwnedSaysAKeptDirectoryIsUndeclared(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	kept, held := filepath.Join(d, "kept"), filepath.Join(d, "held")
	both := write(t, filepath.Join(d, "both.json"), fmt.Sprintf(`{"version":1,"resources":[
		{"module":"m","id":"kept","type":"directory","path":%q},
		{"module":"m","id":"held","type":"directory","path":%q}]}`, kept, held), 0o644)
	one := write(t, filepath.Join(d, "one.json"), fmt.Sprintf(`{"version":1,"resources":[
		{"module":"m","id":"held","type":"directory","path":%q}]}`, held), 0o644)
	if code, out, _ := run("apply", "--state", state, both); code != ExitApplied {
		t.Fatalf("apply: %d\n%s", code, out)
	}
	write(t, filepath.Join(kept, "theirs"), "not the host's\n", 0o644)
	if code, out, _ := run("apply", "--state", state, one); code != ExitApplied || !strings.Contains(out, "kept") {
		t.Fatalf("undeclare: %d\n%s", code, out)
	}
	code, out, _ := run("owned", "--state", state)
	var keptLine, heldLine string
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "path:"+kept+" "):
			keptLine = l
		case strings.HasPrefix(l, "path:"+held+" "):
			heldLine = l
		}
	}
	if code != 0 || !strings.Contains(keptLine, "local:m.kept") || !strings.HasSuffix(keptLine, "created by the host"+undeclaredSaid) ||
		!strings.HasSuffix(heldLine, "created by the host") {
		t.Fatalf("owned: %d\n%s", code, out)
	}
	code, out, _ = run("owned", "--json", "--state", state)
	var list []ownedEntry
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 2 {
		t.Fatalf("owned --json: %d %v\n%s", code, err, out)
	}
	for _, e := range list {
		if e.Undeclared != (e.Target == "path:"+kept) {
			t.Errorf("%s undeclared: %v\n%s", e.Target, e.Undeclared, out)
		}
	}
	// Declared again, it is said as declared.
	if code, out, _ := run("apply", "--state", state, both); code != ExitApplied {
		t.Fatalf("apply again: %d\n%s", code, out)
	}
	if _, out, _ := run("owned", "--state", state); strings.Contains(out, "undeclared") {
		t.Fatalf("owned after declaring it again:\n%s", out)
	}
}

// Enrolled and disconnected is a state of its own: status says since
// when, as the agent last told the daemon, and says when the agent itself
// has gone quiet.
func TestStatusSaysEnrolledAndDisconnected(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	if _, err := store.Open(state); err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(nil)
	if err := identity.Save(state, &identity.Identity{Node: "n1", Enrolment: "e-1", ControlKey: pub}); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-90 * time.Minute).UTC()
	keep := func(l serve.LinkState) {
		t.Helper()
		b, _ := json.Marshal(l)
		if err := os.WriteFile(filepath.Join(state, serve.LinkFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keep(serve.LinkState{Up: false, Since: since, SaidAt: time.Now().UTC()})
	code, out, _ := run("status", "--state", state)
	// No daemon holds the state: said first, the rest as it last wrote.
	if code != 0 || !strings.HasPrefix(out, "state: enrolled, disconnected\ndaemon: not running (no mesh-executor serve holds "+state+"): what follows is as the daemon, or the last apply, left it") ||
		!strings.Contains(out, "\nlink: disconnected since ") || !strings.Contains(out, "(1h30m0s ago)") || strings.Contains(out, "said nothing") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	// A lock naming a live process that does not hold it (a pid left by
	// a daemon gone, taken since by another process): not running.
	os.WriteFile(filepath.Join(state, ServeLockFile), []byte(fmt.Sprintln(os.Getpid())), 0o600)
	if _, out, _ = run("status", "--state", state); !strings.Contains(out, "\ndaemon: not running") {
		t.Errorf("a stale pid in the lock:\n%s", out)
	}
	// The lock held (this process, as a serve holds it): running.
	lock, err := lockServe(state)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, out, _ = run("status", "--state", state); !strings.HasPrefix(out, fmt.Sprintf("state: enrolled, disconnected\ndaemon: running (pid %d)\nlink: disconnected since ", os.Getpid())) {
		t.Errorf("a daemon running:\n%s", out)
	}
	code, out, _ = run("status", "--json", "--state", state)
	form(t, "status --json (disconnected)", out)
	var s struct {
		State string           `json:"state"`
		Link  *serve.LinkState `json:"link"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.State != "enrolled" || s.Link == nil || s.Link.Up || !s.Link.Since.Equal(since) {
		t.Errorf("exit %d, %v: %s", code, err, out)
	}
	// Refused by the broker: revoked, said as such and not as a
	// disconnection, with when the agent first saw it.
	revoked := since.Add(time.Hour)
	keep(serve.LinkState{Up: false, Since: since, Revoked: revoked, SaidAt: time.Now().UTC()})
	code, out, _ = run("status", "--state", state)
	if code != 0 || !strings.Contains(out, "\nlink: revoked by the control side at "+revoked.Local().Format(time.RFC3339)+" (30m0s ago)") || !strings.HasPrefix(out, "state: enrolled, revoked\n") ||
		strings.Contains(out, "disconnected") || !strings.Contains(out, "token issue --node n1 (--new --name n1 once") {
		t.Errorf("a revoked node: exit %d:\n%s", code, out)
	}
	keep(serve.LinkState{Up: true, Since: since, SaidAt: time.Now().Add(-time.Hour).UTC()})
	if _, out, _ := run("status", "--state", state); !strings.HasPrefix(out, "state: enrolled\n") || !strings.Contains(out, "\nlink: linked since ") || !strings.Contains(out, "the agent has said nothing since") {
		t.Errorf("a linked node whose agent went quiet:\n%s", out)
	}
	// An enrolment refused since (a token used again): said with the
	// identity the host keeps, which the refusal left as it was.
	b, _ := json.Marshal(&enrol.Result{Final: true, Token: "t-1", RefusedBy: "control", Reason: "token t-1 was used already"})
	os.WriteFile(filepath.Join(state, enrol.ResultFile), b, 0o600)
	if _, out, _ := run("status", "--state", state); !strings.Contains(out, "\nlast enrolment: enrolment refused by the control side: token t-1 was used already — this host keeps the identity it holds (node n1, enrolment e-1)\n") {
		t.Errorf("a refused enrolment on an enrolled host:\n%s", out)
	}
}

// The carried bundle is pinned at build time: reconcile applies the one
// the build carries and refuses any other, saying both digests, with
// nothing on the machine changed.
func TestReconcileTakesOnlyThePinnedBundle(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	target := filepath.Join(d, "motd")
	good := strings.Replace(decl, "%s", target, 1)
	bundle := write(t, filepath.Join(d, "foundation.lock"), good, 0o644)
	sum := sha256.Sum256([]byte(good))
	defer func(old string) { BundleDigest = old }(BundleDigest)
	BundleDigest = hex.EncodeToString(sum[:])

	// Another bundle at the same path: refused, both digests said.
	other := strings.Replace(good, `"x\n"`, `"y\n"`, 1)
	write(t, bundle, other, 0o644)
	osum := sha256.Sum256([]byte(other))
	code, out, errOut := run("reconcile", "--state", state, bundle)
	errOut += out
	if code != ExitRefused || !strings.Contains(errOut, "has sha256 "+hex.EncodeToString(osum[:])) || !strings.Contains(errOut, "carries the bundle with sha256 "+BundleDigest) {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatal("a refused bundle changed the machine")
	}
	// The one the build carries: applied.
	write(t, bundle, good, 0o644)
	if code, out, errOut := run("reconcile", "--state", state, bundle); code != ExitApplied {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	if b, _ := os.ReadFile(target); string(b) != "x\n" {
		t.Fatalf("the pinned bundle was not applied: %q", b)
	}
}

// form fails t when out breaks the form every JSON output keeps.
func form(t *testing.T, what, out string) {
	t.Helper()
	if err := jsonform.Check([]byte(out)); err != nil {
		t.Errorf("%s: %v\n%s", what, err, out)
	}
}

// owned lists what an archive wrote, file by file, in both forms: what
// the host holds is each of them, not the archive's record alone.
func TestOwnedListsWhatAnArchiveWrote(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, name := range []string{"one", "two"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
		tw.Write([]byte("hi\n"))
	}
	tw.Close()
	archive := write(t, filepath.Join(d, "a.tar"), tb.String(), 0o644)
	sum := sha256.Sum256(tb.Bytes())
	dest := filepath.Join(d, "dest")
	f := write(t, filepath.Join(d, "a.json"), fmt.Sprintf(`{"version":1,"resources":[{"module":"m","id":"d","type":"directory","path":%q},`+
		`{"module":"m","id":"a","type":"archive","url":"file://%s","sha256":"%x","destination":%q}]}`, dest, archive, sum, dest), 0o644)
	// The first apply makes the state, and says so: a mistyped --state
	// would make a second one.
	if code, out, errs := run("apply", "--state", state, f); code != ExitApplied || !strings.Contains(errs, "no state yet: "+state+" did not exist; made now") {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ := run("owned", "--json", "--state", state)
	var list []struct {
		Type  string   `json:"type"`
		Paths []string `json:"paths"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
		t.Fatalf("owned --json: exit %d %v\n%s", code, err, out)
	}
	var paths []string
	for _, e := range list {
		if e.Type == "archive" {
			paths = e.Paths
		}
	}
	want := []string{filepath.Join(dest, "one"), filepath.Join(dest, "two")}
	if !slices.Equal(paths, want) {
		t.Fatalf("owned --json: the archive's paths %v, want %v\n%s", paths, want, out)
	}
	_, out, _ = run("owned", "--state", state)
	for _, p := range want {
		if !strings.Contains(out, p) {
			t.Fatalf("owned does not list %s:\n%s", p, out)
		}
	}
	// Undeclared by the rescue file, with no daemon running: the cache
	// keeps it no more, and says so.
	cached := filepath.Join(state, "archives", fmt.Sprintf("%x", sum))
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("not cached while declared: %v", err)
	}
	// A rescue file that fails before it undeclares the archive: the
	// archive, still on the machine, stays cached (what tells, when its
	// files go, which a person edited).
	os.Mkdir(filepath.Join(d, "adir"), 0o755)
	failing := write(t, filepath.Join(d, "failing.json"), fmt.Sprintf(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":%q,"content":"x"}]}`, filepath.Join(d, "adir")), 0o644)
	if code, out, errs := run("apply", "--state", state, failing); code != ExitFailed {
		t.Fatalf("the failing apply: exit %d\n%s%s", code, out, errs)
	}
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("an archive still recorded was dropped from the cache by a failed apply: %v", err)
	}
	empty := write(t, filepath.Join(d, "empty.json"), `{"version":1,"owns_nothing":true,"resources":[]}`, 0o644)
	code, out, errs := run("apply", "--state", state, empty)
	if _, err := os.Stat(cached); code != ExitApplied || !os.IsNotExist(err) || !strings.Contains(errs, "the archive cache no longer keeps 1 archive no declaration names") || strings.Contains(errs, "no state yet") {
		t.Fatalf("undeclared: exit %d, cached %v\n%s%s", code, err, out, errs)
	}
}

// A machine enrolled again holds the link's last declaration of the
// enrolment it replaced, which the daemon does not reconcile (the trust
// rule: only this enrolment's): status says the link holds nothing
// against drift until the control side declares to this enrolment.
func TestStatusSaysWhenTheLinksDeclarationIsAnotherEnrolments(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(nil)
	env, err := wire.Seal(priv, wire.PurposeDeclaration, []byte(`{"version":1,"node":"n1","enrolment":"e-1","seq":7,"resources":[],"owns_nothing":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SaveTarget(store.Link, env); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		enrolment string
		unheld    bool
	}{{"e-1", false}, {"e-2", true}} {
		if err := identity.Save(state, &identity.Identity{Node: "n1", Enrolment: c.enrolment, ControlKey: pub}); err != nil {
			t.Fatal(err)
		}
		code, out, _ := run("status", "--state", state)
		if said := strings.Contains(out, "held: nothing the link declared — its last declaration (seq 7) is addressed to node n1, enrolment e-1, not this one"); code != 0 || said != c.unheld {
			t.Errorf("enrolment %s: exit %d, said unheld %v:\n%s", c.enrolment, code, said, out)
		}
		_, out, _ = run("status", "--json", "--state", state)
		var s struct {
			Unheld *struct {
				Seq       uint64 `json:"seq"`
				Enrolment string `json:"enrolment"`
			} `json:"unheld"`
		}
		if json.Unmarshal([]byte(out), &s); (s.Unheld != nil) != c.unheld || c.unheld && (s.Unheld.Seq != 7 || s.Unheld.Enrolment != "e-1") {
			t.Errorf("enrolment %s: status --json unheld %+v", c.enrolment, s.Unheld)
		}
		// And doctor, where an operator looks when a node misbehaves.
		dout, _ := doctor(t, "--state", state, "--socket", filepath.Join(d, "none.sock"))
		want := "ok    held: the link's last declaration is this enrolment's, reconciled at each drift look"
		if c.unheld {
			want = "warn  held: the link's last declaration (seq 7) is addressed to node n1, enrolment e-1, not this one: not reconciled, so a drift of what it made is not put back"
		}
		if got := lineOf(t, dout, "held"); got != want || c.unheld != strings.Contains(dout, "fix: declare to this enrolment: mesh-control declare n1 FILE") {
			t.Errorf("enrolment %s: doctor's held line %q, want %q\n%s", c.enrolment, got, want, dout)
		}
	}
}

// A rescue file is written by hand: its refusal is placed in it as the
// control side's commands place theirs (file:line:column), for JSON cut
// short and for a field the declaration refuses.
func TestARescueFilesRefusalIsPlacedInIt(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	for _, c := range []struct{ text, want string }{
		{"{\"version\":1,\n \"resources\":[{\"module\":\"m\",\"id\":\"f\",\"type\":\"file\",\"path\":\"/tmp/x\",\"content\":\"a\"}\n", "cut.json:2:"},
		{"{\"version\":1,\n \"resources\":[{\"module\":\"m\",\"id\":\"f\",\"type\":\"file\",\"path\":\"tmp/x\",\"content\":\"a\"}]}\n", "rel.json:2:"},
	} {
		name := strings.TrimSuffix(c.want, ":2:")
		f := write(t, filepath.Join(d, name), c.text, 0o644)
		for _, cmd := range []string{"plan", "apply"} {
			code, out, errs := run(cmd, "--state", state, f)
			if code != ExitRefused || !strings.Contains(out+errs, f+":2:") {
				t.Errorf("%s %s: exit %d\n%s%s", cmd, name, code, out, errs)
			}
		}
	}
}

// serve parses its own flags, and answers every form of a request for
// help as the other commands do — its help, exit 0 — before anything
// else (it needs root to do more); a flag's value that reads "help" is a
// value.
func TestServeAnswersHelpInEveryForm(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--h"}, {"--help"}, {"-help"}, {"--help=true"}, {"help"}, {"--drift", "5m", "-h"}} {
		code, out, errOut := run(append([]string{"serve"}, args...)...)
		if code != 0 || !strings.HasPrefix(out, "usage: mesh-executor serve") || errOut != "" {
			t.Errorf("serve %v: exit %d, %q %q", args, code, out, errOut)
		}
	}
	code, out, errOut := run("serve", "--state", "help", "--frob")
	if code != ExitRefused || out != "" || !strings.Contains(errOut, "unknown flag --frob") {
		t.Errorf("serve --state help --frob: exit %d, %q %q", code, out, errOut)
	}
}

// An enrolment with no executor serving the socket cannot finish while
// the command waits: it is left pending and said so at once, not at the
// end of --wait.
func TestEnrolWithNobodyToFinishItSaysSoAtOnce(t *testing.T) {
	d := base(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	tok := &wire.Token{BrokerURL: "tls://127.0.0.1:1", ControlKey: pub, Expires: time.Now().Add(time.Hour).Truncate(time.Second)}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	rand.Read(tok.Credential[:])
	text, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	file := write(t, filepath.Join(d, "token"), text+"\n", 0o600)
	sock := filepath.Join(d, "run", "executor.sock")
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := run("enrol", "--state", filepath.Join(d, "state"), "--socket", sock, "--wait", "1h", "--token-file", file)
		done <- result{code, out, errOut}
	}()
	select {
	case r := <-done:
		if r.code != exitEnrolPending || !strings.Contains(r.err, "the enrolment is pending") || !strings.Contains(r.err, "there is no executor socket at "+sock) {
			t.Fatalf("exit %d\n%s%s", r.code, r.out, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("enrol waited on with nobody to finish the enrolment")
	}
	// --json: one value says it is pending, and why.
	code, out, errOut := run("enrol", "--json", "--state", filepath.Join(d, "state2"), "--socket", sock, "--wait", "1h", "--token-file", file)
	form(t, "enrol --json, pending", out)
	var got struct {
		Pending bool   `json:"pending"`
		Why     string `json:"why"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitEnrolPending || !got.Pending || !strings.Contains(got.Why, "there is no executor socket at "+sock) {
		t.Fatalf("enrol --json, pending: exit %d %v\n%s%s", code, err, out, errOut)
	}
	if strings.Contains(errOut, "expiry") {
		t.Fatalf("a token not expired was said to be: %s", errOut)
	}

	// A token past its expiry by this machine's clock: said at once (the
	// control side, whose clock wrote it, judges it), not refused here.
	tok.Expires = time.Now().Add(-time.Hour).Truncate(time.Second)
	text, _ = tok.Encode()
	write(t, file, text+"\n", 0o600)
	code, out, errOut = run("enrol", "--state", filepath.Join(d, "state3"), "--socket", sock, "--wait", "1h", "--token-file", file)
	if code != exitEnrolPending || !strings.Contains(errOut, "this token's expiry") || !strings.Contains(errOut, "passed 1h0m0s ago by this machine's clock") {
		t.Fatalf("an expired token: exit %d\n%s%s", code, out, errOut)
	}
}

// enrol --cancel and rekey --cancel with nothing pending say so alike in
// --json: {"cancelled": false}, in the one form every output keeps (no
// null).
func TestCancelWithNothingPendingInJSON(t *testing.T) {
	state := filepath.Join(base(t), "state")
	for _, cmd := range []string{"enrol", "rekey"} {
		code, out, errs := run(cmd, "--cancel", "--json", "--state", state)
		form(t, cmd+" --cancel --json", out)
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || got["cancelled"] != false {
			t.Errorf("%s --cancel --json: exit %d %v\n%s%s", cmd, code, err, out, errs)
		}
	}
}

// Every refusal of a rescue apply is said one way: "refused by the
// executor: …", a local file's own refusal among them.
func TestARescueRefusalIsSaidOneWay(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	open := write(t, filepath.Join(d, "open.json"), strings.Replace(decl, "%s", filepath.Join(d, "motd"), 1), 0o666)
	os.Chmod(open, 0o666)
	retire := write(t, filepath.Join(d, "retire.json"), `{"version":1,"resources":[],"owns_nothing":true,"retire":true}`, 0o600)
	for _, f := range []string{open, retire} {
		code, out, errs := run("apply", "--state", state, f)
		if code != ExitRefused || !strings.HasPrefix(out, "refused by the executor: ") || strings.Contains(out, "executor: refused") || strings.Contains(out, "refused: executor") {
			t.Errorf("%s: exit %d\n%s%s", filepath.Base(f), code, out, errs)
		}
	}
}

// An apply that must wait for the store's lock says so before it waits
// (naming the holder's pid when it is another process's), and refuses
// once the wait is over.
func TestAnApplyWaitingForTheLockSaysSo(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	f := write(t, filepath.Join(d, "d.json"), strings.Replace(decl, "%s", filepath.Join(d, "motd"), 1), 0o644)
	holder, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock()
	code, out, errs := run("apply", "--state", state, "--wait", "300ms", f)
	if code != ExitRefused || !strings.Contains(errs, "waiting up to 300ms for the store's lock: another apply is running (the executor daemon or a rescue command)") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
}
