package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runDemo runs examples/demo.sh with binaries from dir in a scratch
// directory of its own, colourless; it returns the scratch directory, the
// output, what it said on standard error and its exit status.
func runDemo(t *testing.T, dir string) (scratch, out, errs string, code int) {
	t.Helper()
	base, err := os.MkdirTemp("", "demo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755) // the agent, as nobody, reaches the socket below it
	scratch = filepath.Join(base, "mesh-demo")
	cmd := exec.Command("bash", "examples/demo.sh", dir)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MESH_DEMO_DIR="+scratch, "NO_COLOR=1")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Run()
	return scratch, o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// make demo does what the README says, every step that should work works
// and every refusal it shows is refused; it cleans up after itself, and
// its output has no colour (NO_COLOR) and no number in a float's form.
func TestDemo(t *testing.T) {
	scratch, out, errs, code := runDemo(t, bin)
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{
		"enrolled as node demo",
		"was used already",
		"seq 1  applied",
		"seq 2  applied",
		"app.config  file  removed",
		"outcome: applied (5 applied)",
		"has mode 0666",
		"state: enrolled",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo did not say %q\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("colour with NO_COLOR set")
	}
	if f := regexp.MustCompile(`\d\.\d+e[+-]\d`).FindString(out); f != "" {
		t.Errorf("a number printed as %s", f)
	}
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind: %v", scratch, err)
	}
}

// When a step fails, the demo fails, stops what it started, and keeps its
// logs where it says.
func TestDemoKeepsItsLogsOnFailure(t *testing.T) {
	dir, err := os.MkdirTemp("", "demo-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for _, c := range []string{"mesh-agent", "mesh-control"} {
		os.Symlink(filepath.Join(bin, c), filepath.Join(dir, c))
	}
	// An executor that serves, but whose enrol is broken.
	os.WriteFile(filepath.Join(dir, "mesh-executor"), []byte("#!/bin/sh\n"+
		"[ \"$1\" = enrol ] && { echo 'enrol: broken for the test' >&2; exit 1; }\n"+
		"exec "+filepath.Join(bin, "mesh-executor")+" \"$@\"\n"), 0o755)
	scratch, out, errs, code := runDemo(t, dir)
	if code == 0 {
		t.Fatalf("the demo passed with a broken enrol:\n%s", out)
	}
	if want := "make demo failed (exit 1): its logs are kept in " + scratch; !strings.Contains(errs, want) {
		t.Fatalf("the demo did not say where its logs are (want %q)\n%s", want, errs)
	}
	for _, log := range []string{"control.log", "executor.log", "agent.log"} {
		if b, err := os.ReadFile(filepath.Join(scratch, log)); err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", log, err, len(b))
		}
	}
	// Nothing it started is left running.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(scratch)) {
			t.Errorf("left running: %s", bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}

// A second demo on the same scratch directory is refused, saying why,
// and removes nothing of the first's.
func TestSecondDemoRefused(t *testing.T) {
	base, err := os.MkdirTemp("", "demo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	scratch := filepath.Join(base, "mesh-demo")
	os.Mkdir(scratch, 0o755)
	os.WriteFile(filepath.Join(scratch, "control.log"), []byte("the first demo's\n"), 0o644)
	holder := exec.Command("flock", scratch+".lock", "sleep", "30")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	for i := 0; i < 100; i++ { // until flock holds it
		if exec.Command("flock", "-n", scratch+".lock", "true").Run() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd := exec.Command("bash", "examples/demo.sh", bin)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MESH_DEMO_DIR="+scratch, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another demo is running in "+scratch) {
		t.Fatalf("a second demo: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(scratch, "control.log")); string(b) != "the first demo's\n" {
		t.Fatal("the second demo removed the first's scratch directory")
	}
}
