package tests

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The broker the Makefile builds (packaging/nats-overlay.sh) is the
// module's own nats-server with one line changed and nothing else: every
// other file of the copy is the module cache's byte for byte, and the one
// changed line is flushOutbound's array. A carried patch that grew without
// review would fail here.
func TestTheBrokerPatchIsOneLine(t *testing.T) {
	base := t.TempDir()
	cmd := exec.Command("bash", "packaging/nats-overlay.sh")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOWORK=off", "NATS_BASE="+base)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("nats-overlay.sh: %v\n%s%s", err, out, stderr)
	}
	work := strings.TrimSpace(string(out))
	if filepath.Dir(filepath.Dir(work)) != base || filepath.Base(work) != "go.work" {
		t.Fatalf("nats-overlay.sh printed %q, not a go.work under %s", work, base)
	}
	gowork, err := os.ReadFile(work)
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", "github.com/nats-io/nats-server/v2")
	list.Dir = ".."
	list.Env = append(os.Environ(), "GOWORK=off")
	got, err := list.Output()
	if err != nil {
		t.Fatal(err)
	}
	ver, modDir, _ := strings.Cut(strings.TrimSpace(string(got)), " ")
	// The copy is named by a path relative to the workspace file, the same
	// on every machine (it is what the binaries' build information says).
	prefix := "replace github.com/nats-io/nats-server/v2 " + ver + " => ../" + ver + "-"
	i := strings.Index(string(gowork), prefix)
	if i < 0 {
		t.Fatalf("go.work says\n%s\nwithout %q", gowork, prefix)
	}
	rel, _, _ := strings.Cut(string(gowork)[i+len(prefix)-len("../"+ver+"-"):], "\n")
	copyDir := filepath.Join(filepath.Dir(work), rel)
	// Through the workspace, the module resolves to the copy.
	list = exec.Command("go", "list", "-m", "-f", "{{with .Replace}}{{.Dir}}{{end}}", "github.com/nats-io/nats-server/v2")
	list.Dir = ".."
	list.Env = append(os.Environ(), "GOWORK="+work)
	if got, err := list.Output(); err != nil || strings.TrimSpace(string(got)) != copyDir {
		t.Errorf("through the workspace nats-server is %q (%v), want the copy %s", got, err, copyDir)
	}

	checkCopy(t, copyDir, modDir)
	// Under make, the copy the Makefile's workspace builds with is held
	// to the same: the one a release is built from.
	if w := os.Getenv("GOWORK"); w != "" && w != "off" {
		b, err := os.ReadFile(w)
		if err != nil {
			t.Fatalf("GOWORK %s: %v", w, err)
		}
		if i := strings.Index(string(b), prefix); i >= 0 {
			rel, _, _ := strings.Cut(string(b)[i+len(prefix)-len("../"+ver+"-"):], "\n")
			t.Run("make's copy", func(t *testing.T) { checkCopy(t, filepath.Join(filepath.Dir(w), rel), modDir) })
		}
	}
}

// checkCopy fails unless copyDir is the module at modDir with
// flushOutbound's array line changed and nothing else (beside the copy's
// own .made-from and .sums).
func checkCopy(t *testing.T, copyDir, modDir string) {
	t.Helper()
	changed := 0
	err := filepath.WalkDir(copyDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == ".made-from" || d.Name() == ".sums" {
			return err
		}
		rel, _ := filepath.Rel(copyDir, p)
		mine, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		theirs, err := os.ReadFile(filepath.Join(modDir, rel))
		if err != nil {
			t.Errorf("%s is in the copy and not in the module: %v", rel, err)
			return nil
		}
		if bytes.Equal(mine, theirs) {
			return nil
		}
		changed++
		if rel != filepath.Join("server", "client.go") {
			t.Errorf("%s differs from the module's", rel)
			return nil
		}
		a, b := strings.Split(string(theirs), "\n"), strings.Split(string(mine), "\n")
		if len(a) != len(b) {
			t.Errorf("server/client.go: %d lines, the module's %d", len(b), len(a))
			return nil
		}
		for i := range a {
			if a[i] == b[i] {
				continue
			}
			if strings.TrimSpace(a[i]) != "var _orig [nbMaxVectorSize][]byte" || !strings.HasPrefix(strings.TrimSpace(b[i]), "var _orig [8][]byte //") {
				t.Errorf("server/client.go:%d: %q in place of %q", i+1, b[i], a[i])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if changed != 1 {
		t.Errorf("%d files of the copy differ from the module's, want 1 (server/client.go)", changed)
	}
	// The copy holds every non-test Go file the module's packages build from.
	if _, err := os.Stat(filepath.Join(copyDir, "server", "server.go")); err != nil {
		t.Error(err)
	}
}
