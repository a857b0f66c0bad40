package shapes

import (
	"os"
	"path"
	"strings"
	"testing"
)

// The quick answer of pathReason (mayTouchProtected) must never pass a path
// the full comparison would refuse. Every root, each of its ancestors,
// children, near-misses and drop-ins, and paths built from their
// components, under both kinds of check.
func TestPathReasonQuickAnswerAgreesWithTheScan(t *testing.T) {
	var paths []string
	comps := map[string]bool{}
	for _, list := range [][]string{protectedPaths, binPaths, initRoots} {
		for _, q := range list {
			paths = append(paths, q, q+"/x", q+"x", q+".d", q+"/mesh-agent.service.d",
				q+"/system/mesh-agent.service", q+"/service.d", q+"/mesh-.service.d", q+"/a/b/c")
			for p := q; p != "/"; p = path.Dir(p) {
				paths = append(paths, p, p+"x", p+"/y")
			}
			for _, c := range strings.Split(q, "/") {
				comps[c] = true
			}
		}
	}
	comps["srv"], comps["opt"], comps["mesh-agent"], comps["x.d"] = true, true, true, true
	var words []string
	for c := range comps {
		if c != "" {
			words = append(words, c)
		}
	}
	for _, a := range words {
		for _, b := range words {
			paths = append(paths, "/"+a, "/"+a+"/"+b)
			for _, c := range []string{"mesh-agent", "nox-mesh-host", "system", "x"} {
				paths = append(paths, "/"+a+"/"+b+"/"+c)
			}
		}
	}
	paths = append(paths, "/", "", "relative/etc/systemd", "//etc/systemd/mesh-agent", "/etc//systemd")
	refused := 0
	for _, p := range paths {
		for _, container := range []bool{false, true} {
			got, want := pathReason(p, container), pathReasonScan(p, container)
			if got != want {
				t.Errorf("pathReason(%q, %v) = %q; the full comparison says %q", p, container, got, want)
			}
			if want != "" {
				refused++
			}
		}
	}
	// A positive control: the set above does reach the protected set.
	if refused < 100 {
		t.Fatalf("only %d of %d checks refused: the test no longer reaches the protected set", refused, 2*len(paths))
	}
}

// isCleanAbs answers as path.Clean would, for every absolute path built
// from a few awkward pieces.
func TestIsCleanAbsAgreesWithPathClean(t *testing.T) {
	pieces := []string{"", ".", "..", "...", "a", ".a", "a.", "/"}
	var walk func(p string, depth int)
	n := 0
	walk = func(p string, depth int) {
		if got, want := isCleanAbs(p), path.Clean(p) == p; got != want {
			t.Errorf("isCleanAbs(%q) = %v; path.Clean says %v", p, got, want)
		}
		n++
		if depth == 4 {
			return
		}
		for _, c := range pieces {
			walk(p+"/"+c, depth+1)
			walk(p+c, depth+1)
		}
	}
	walk("/", 0)
	if n < 1000 {
		t.Fatalf("only %d paths tried", n)
	}
}

// The fast reader's written-out table of which keys each shape allows
// says what the shapes' own fields say (every field it reads; env and
// peers it leaves to the slow path).
func TestTypeKeyMaskMatchesTheShapes(t *testing.T) {
	if len(typeKeyMask) != len(typeFields()) {
		t.Fatalf("typeKeyMask has %d shapes, the vocabulary %d", len(typeKeyMask), len(typeFields()))
	}
	for typ, fields := range typeFields() {
		var want uint64
		for i, k := range resourceKeys {
			if fields[k] {
				want |= 1 << i
			}
		}
		if got := typeKeyMask[typ]; got != want {
			t.Errorf("%s: typeKeyMask %b, the shape's fields %b", typ, got, want)
		}
	}
}

// The running instance's paths are refused with everything under them,
// and a path that holds one is refused as a directory, an archive's
// destination or a container's mount; a path beside them passes.
func TestProtectRunning(t *testing.T) {
	t.Cleanup(func() { running.Store(nil) })
	ProtectRunning("state directory", "/srv/mesh/../mesh/state/", "relative/ignored", "/")
	ProtectRunning("binary", "/opt/mesh/bin/mesh-executor", "/srv/mesh/state")
	if got := strings.Join(Running(), ", "); got != "state directory: /srv/mesh/state, binary: /opt/mesh/bin/mesh-executor" {
		t.Fatalf("Running() = %s", got)
	}
	for _, c := range []struct {
		typ, field, path string
		refused          bool
	}{
		{"file", "path", "/srv/mesh/state/identity.json", true},
		{"file", "path", "/srv/mesh/state", true},
		{"directory", "path", "/srv/mesh/state/originals", true},
		{"directory", "path", "/srv/mesh", true},
		{"directory", "path", "/srv", true},
		{"archive", "destination", "/opt", true},
		{"file", "path", "/opt/mesh/bin/mesh-executor", true},
		{"directory", "path", "/opt/mesh/bin", true},
		{"file", "path", "/srv/mesh/stateful", false},
		{"directory", "path", "/srv/mesh/other", false},
		{"file", "path", "/opt/mesh/bin/mesh-executor.bak", false},
		{"directory", "path", "/opt/other", false},
	} {
		extra := ""
		if c.typ == "file" {
			extra = `,"content":"x"`
		}
		if c.typ == "archive" {
			extra = `,"url":"obj://` + strings.Repeat("a", 64) + `","sha256":"` + strings.Repeat("a", 64) + `"`
		}
		d, err := Parse([]byte(`{"version":1,"node":"n","enrolment":"e","seq":1,"resources":[{"module":"m","id":"x","type":"` + c.typ + `","` + c.field + `":"` + c.path + `"` + extra + `}]}`))
		if err == nil {
			err = CheckProtected(d, func(p string) (string, error) { return p, nil })
		}
		if refused := err != nil && strings.Contains(err.Error(), "running host's"); refused != c.refused {
			t.Errorf("%s %s: err %v, refused as the running host's: %v, want %v", c.typ, c.path, err, refused, c.refused)
		}
	}
}

// Every path Android's init file gives the host — its state, its socket's
// directory, its binaries, the init file itself — is in the static
// protected set, so a declaration on a device cannot reach the running
// instance whatever the executor was started with. Read from the init
// file as shipped, so the two cannot drift apart.
func TestAndroidInitPathsAreProtected(t *testing.T) {
	rc, err := os.ReadFile("../init/android/mesh-host.rc")
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{"/system/etc/init/mesh-host.rc": true}
	for _, f := range strings.Fields(string(rc)) {
		if strings.HasPrefix(f, "/data/adb/mesh-host") || strings.HasPrefix(f, "/system/bin/mesh-") {
			paths[strings.TrimRight(f, ",;")] = true
		}
	}
	if len(paths) < 5 {
		t.Fatalf("found only %v in mesh-host.rc", paths)
	}
	for p := range paths {
		for _, target := range []string{p, p + "/x"} {
			d, err := Parse([]byte(`{"version":1,"node":"n","enrolment":"e","seq":1,"resources":[{"module":"m","id":"x","type":"file","path":"` + target + `","content":"x"}]}`))
			if err == nil {
				err = CheckProtected(d, func(p string) (string, error) { return p, nil })
			}
			if err == nil {
				t.Errorf("a file at %s (from mesh-host.rc) is not refused", target)
			}
		}
	}
}
