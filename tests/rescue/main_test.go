package rescue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// executorBin is the mesh-executor built once for the package; attackerBin
// is a copy of this test binary that uid 65534 can execute (the original
// sits in go's private build directory).
var executorBin, attackerBin string

// skipReason is set when the tests cannot run here (not root).
var skipReason string

func TestMain(m *testing.M) {
	if ops := os.Getenv(attackerEnv); ops != "" {
		os.Exit(attackerMain(ops))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "these tests drive mesh-executor as root; run them as root"
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "rescue-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "rescue:", err)
		return 2
	}
	defer os.RemoveAll(tmp)
	// The attacker (uid 65534) must be able to execute its copy of the
	// test binary.
	if err := os.Chmod(tmp, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "rescue:", err)
		return 2
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rescue:", err)
		return 2
	}
	executorBin = filepath.Join(tmp, "mesh-executor")
	build := exec.Command("go", "build", "-o", executorBin, "./cmd/mesh-executor")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "rescue: build mesh-executor: %v\n%s", err, out)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rescue:", err)
		return 2
	}
	attackerBin = filepath.Join(tmp, "attacker")
	if err := copyFile(self, attackerBin, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "rescue: copy the test binary for the attacker:", err)
		return 2
	}
	return m.Run()
}

// moduleRoot finds the module's root: `go env GOMOD`, else ../.. from here.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
			return filepath.Dir(gomod), nil
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("cannot find the module root: %w", err)
	}
	return root, nil
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func needRoot(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Fatal(skipReason)
	}
}

// rootDir returns a fresh directory that root owns with mode 0755, every
// ancestor of it up to the system's temporary directory opened to 0755 too,
// so a declaration file below it is accepted and an unprivileged user can
// reach a directory of its own below it.
func rootDir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	stop := filepath.Clean(os.TempDir())
	for p := d; p != stop && p != "/" && strings.HasPrefix(p, stop+"/"); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// The executor's JSON, as the rescue command prints it.

type line struct {
	Module  string `json:"module"`
	ID      string `json:"id"`
	Type    string `json:"type"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail"`
}

type report struct {
	Outcome string `json:"outcome"`
	Source  string `json:"source"`
	Seq     uint64 `json:"seq"`
	Lines   []line `json:"lines"`
	Refused string `json:"refused"`
}

type claim struct {
	Source string `json:"source"`
	Module string `json:"module"`
	ID     string `json:"id"`
}

type original struct {
	Kind   string `json:"kind"`
	Digest string `json:"digest"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
}

type ownedEntry struct {
	Target   string    `json:"target"`
	Type     string    `json:"type"`
	Claims   []claim   `json:"claims"`
	How      string    `json:"how"`
	Original *original `json:"original"`
	// Pending: a change begun and not recorded (the apply died at it).
	Pending bool `json:"pending"`
	// Undeclared: no source's saved declaration names it any more.
	Undeclared bool `json:"undeclared"`
}

// result is one finished run of the executor.
type result struct {
	exit   int
	stdout []byte
	stderr []byte
	took   time.Duration
}

// runExecutor runs mesh-executor with args to completion (or ctx's end).
func runExecutor(ctx context.Context, args ...string) (result, error) {
	cmd := exec.CommandContext(ctx, executorBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Dir = "/"
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.Bytes(), stderr: errb.Bytes(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		r.exit = ee.ExitCode()
	default:
		return r, fmt.Errorf("mesh-executor %s: %v (stderr: %s)", strings.Join(args, " "), err, errb.Bytes())
	}
	return r, nil
}

// apply runs `mesh-executor apply --json` (or plan) and decodes the report.
func apply(t testing.TB, ctx context.Context, verb, state, decl string) (*report, result) {
	t.Helper()
	res, err := runExecutor(ctx, verb, "--state", state, "--json", decl)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(res.stdout, &rep); err != nil {
		t.Fatalf("%s %s: exit %d, cannot decode the report: %v\nstdout: %s\nstderr: %s", verb, decl, res.exit, err, res.stdout, res.stderr)
	}
	if want := map[string]int{"refused": 2, "failed": 1}[rep.Outcome]; res.exit != want {
		t.Fatalf("%s %s: outcome %q with exit %d, want exit %d\n%s", verb, decl, rep.Outcome, res.exit, want, res.stdout)
	}
	return &rep, res
}

// owned runs `mesh-executor owned --json`.
func owned(t testing.TB, state string) []ownedEntry {
	t.Helper()
	res, err := runExecutor(context.Background(), "owned", "--state", state, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if res.exit != 0 {
		t.Fatalf("owned: exit %d: %s%s", res.exit, res.stdout, res.stderr)
	}
	var list []ownedEntry
	if err := json.Unmarshal(res.stdout, &list); err != nil {
		t.Fatalf("owned: %v\n%s", err, res.stdout)
	}
	return list
}

// Declarations.

type resource struct {
	Module  string  `json:"module"`
	ID      string  `json:"id"`
	Type    string  `json:"type"`
	Path    string  `json:"path"`
	Content *string `json:"content,omitempty"`
	Mode    string  `json:"mode,omitempty"`
	Owner   string  `json:"owner,omitempty"`
	// A keys resource's.
	Format string            `json:"format,omitempty"`
	Set    map[string]string `json:"set,omitempty"`
}

type declaration struct {
	Version     int        `json:"version"`
	Resources   []resource `json:"resources"`
	OwnsNothing bool       `json:"owns_nothing,omitempty"`
}

func dirRes(module, id, path, mode string) resource {
	return resource{Module: module, ID: id, Type: "directory", Path: path, Mode: mode, Owner: "root:root"}
}

func fileRes(module, id, path, content, mode string) resource {
	return resource{Module: module, ID: id, Type: "file", Path: path, Content: &content, Mode: mode, Owner: "root:root"}
}

func regionRes(module, id, path, content string) resource {
	return resource{Module: module, ID: id, Type: "region", Path: path, Content: &content}
}

func keysRes(module, id, path string, set map[string]string) resource {
	return resource{Module: module, ID: id, Type: "keys", Path: path, Format: "equals", Set: set}
}

func ownsNothing() declaration {
	return declaration{Version: 1, Resources: []resource{}, OwnsNothing: true}
}

// writeDecl writes d as a root-owned 0644 file in dir (root-owned, 0755)
// and returns its path.
func writeDecl(t testing.TB, dir, name string, d declaration) string {
	t.Helper()
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// snap is what a test remembers of a path to prove it was not touched.
type snap struct {
	kind    string
	content []byte
	mode    os.FileMode
	uid     uint32
	gid     uint32
	ino     uint64
	mtime   time.Time
	target  string // a symlink's
}

func snapshotPath(t testing.TB, p string) snap {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("snapshot %s: %v", p, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	s := snap{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, ino: st.Ino, mtime: fi.ModTime()}
	switch {
	case fi.Mode().IsRegular():
		s.kind = "file"
		if s.content, err = os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
	case fi.IsDir():
		s.kind = "dir"
	case fi.Mode()&os.ModeSymlink != 0:
		s.kind = "symlink"
		s.target, _ = os.Readlink(p)
	default:
		s.kind = "other"
	}
	return s
}

// sameAs reports how p differs from s, or "" if it does not.
func sameAs(p string, s snap) string {
	fi, err := os.Lstat(p)
	if err != nil {
		return err.Error()
	}
	st := fi.Sys().(*syscall.Stat_t)
	var diffs []string
	if fi.Mode() != s.mode {
		diffs = append(diffs, fmt.Sprintf("mode %v, was %v", fi.Mode(), s.mode))
	}
	if st.Uid != s.uid || st.Gid != s.gid {
		diffs = append(diffs, fmt.Sprintf("owner %d:%d, was %d:%d", st.Uid, st.Gid, s.uid, s.gid))
	}
	if st.Ino != s.ino {
		diffs = append(diffs, fmt.Sprintf("inode %d, was %d (replaced)", st.Ino, s.ino))
	}
	if !fi.ModTime().Equal(s.mtime) {
		diffs = append(diffs, fmt.Sprintf("mtime %v, was %v", fi.ModTime(), s.mtime))
	}
	if s.kind == "file" {
		b, err := os.ReadFile(p)
		if err != nil {
			diffs = append(diffs, err.Error())
		} else if !bytes.Equal(b, s.content) {
			diffs = append(diffs, fmt.Sprintf("content %q, was %q", clip(b), clip(s.content)))
		}
	}
	return strings.Join(diffs, "; ")
}

func clip(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "…"
	}
	return string(b)
}

// names lists a directory's entries, sorted.
func names(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
