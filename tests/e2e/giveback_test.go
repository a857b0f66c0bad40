package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A module the node refuses is not kept assigned, with real processes: an
// `assign --plan` shows the refusal and keeps nothing; an assign the
// executor refuses (a path in its own state) is given back and said so,
// by the command that waits and by serve for one that does not; a module
// assigned in place and refused is given back as it was before; and the
// next assignment goes out and is applied, where it used to be refused
// with the module that stayed.
func TestARefusedModuleIsGivenBack(t *testing.T) {
	if _, err := exec.LookPath("wireguard-go"); err != nil {
		t.Fatal("wireguard-go is missing (tests/install-deps.sh installs it)")
	}
	m := newBareMesh(t)
	m.isolatedExecutor()
	m.startAgent("--config", m.agentConfig())
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	m.run("mesh-control", "overlay", "set", "--dir", m.ctl, "--network", "10.231.78.0/24", "--interface", fmt.Sprintf("e2e%d", m.port))
	eventually(t, "n1 applied its overlay", func() bool { return len(m.reportsOf("n1")) > 0 })

	module := func(name, content, path string) string {
		f := filepath.Join(m.base, name+".json")
		os.WriteFile(f, []byte(fmt.Sprintf(`{"version":1,"resources":[{"module":%q,"id":"f","type":"file","path":%q,"content":%q}]}`, name, path, content)), 0o600)
		return f
	}
	ctl := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "mesh-control"), append(args, "--dir", m.ctl)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Run()
		return out.String(), cmd.ProcessState.ExitCode()
	}
	assignments := func() string { return fmt.Sprint(m.nodeNamed("n1")["assignments"]) }
	declared := func() any { return m.nodeNamed("n1")["declared"] }

	good := module("good", "v1\n", filepath.Join(m.tree, "good"))
	if out, code := ctl("assign", "n1", good, "--wait=60s"); code != 0 {
		t.Fatalf("assign good: exit %d\n%s", code, out)
	}
	bad := module("bad", "x\n", filepath.Join(m.state, "planted"))

	// --plan: the node's answer, nothing kept.
	before := declared()
	out, code := ctl("assign", "n1", bad, "--plan", "--wait=60s")
	if code != 2 || !strings.Contains(out, "resource bad.f") {
		t.Fatalf("assign --plan of a module the node refuses: exit %d\n%s", code, out)
	}
	if a, d := assignments(), declared(); a != "good" || d != before {
		t.Fatalf("assign --plan kept something: assignments %q, declared %v (was %v)", a, d, before)
	}
	if out, code := ctl("assign", "n1", good, "--plan", "--wait=60s"); code != 0 || !strings.Contains(out, "good.f  file  would change nothing") {
		t.Fatalf("assign --plan of the module as it is: exit %d\n%s", code, out)
	}

	// Waited for: refused, given back by the command, said so.
	out, code = ctl("assign", "n1", bad, "--wait=60s")
	if code != 2 || !strings.Contains(out, "the node refused module bad: its assignment is given back") {
		t.Fatalf("assign of a module the node refuses: exit %d\n%s", code, out)
	}
	if a := assignments(); !strings.HasPrefix(a, "good; bad given back (refused at seq") {
		t.Fatalf("nodes says of n1's assignments: %q", a)
	}
	if _, err := os.Stat(filepath.Join(m.state, "planted")); err == nil {
		t.Fatal("the refused module wrote into the executor's state")
	}

	// Not waited for: serve gives it back when the report comes.
	bad2 := module("bad2", "x\n", filepath.Join(m.state, "planted2"))
	if out, code := ctl("assign", "n1", bad2); code != 0 {
		t.Fatalf("assign bad2: exit %d\n%s", code, out)
	}
	eventually(t, "serve gave bad2 back", func() bool { return strings.HasPrefix(assignments(), "good; bad2 given back") })

	// Refused in place: given back as it was before (v1 stays applied).
	good2 := module("good", "v2\n", filepath.Join(m.state, "planted3"))
	if out, code := ctl("assign", "n1", good2, "--wait=60s"); code != 2 || !strings.Contains(out, "module good: its assignment is given back") {
		t.Fatalf("assign of good refused in place: exit %d\n%s", code, out)
	}
	// The next assignment goes out and is applied, with good as before.
	next := module("next", "n\n", filepath.Join(m.tree, "next"))
	if out, code := ctl("assign", "n1", next, "--wait=60s"); code != 0 || !strings.Contains(out, "good.f  file  unchanged") || !strings.Contains(out, "next.f  file  applied") {
		t.Fatalf("the next assignment after the refusals: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "good")); string(b) != "v1\n" {
		t.Fatalf("good on the machine: %q", b)
	}
	if a := assignments(); a != "good, next" {
		t.Fatalf("nodes says of n1's assignments: %q", a)
	}
}
