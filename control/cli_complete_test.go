package control_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// TestMain lets the test binary be mesh-control for a shell that runs it
// (bash completion asks nodes --names): with MESH_CONTROL_TEST_CLI set it
// runs control.Main on its arguments and exits as mesh-control would.
func TestMain(m *testing.M) {
	if os.Getenv("MESH_CONTROL_TEST_CLI") != "" {
		os.Exit(control.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// bash completes a node's name where a command takes one — asked of the
// control side the line names with --dir and --nats, or $MESH_CONTROL_DIR —
// and nothing else there; elsewhere what cmdline's completion offers. A
// control side that does not answer completes nothing and says nothing.
func TestBashCompletesNodeNames(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)
	for _, n := range []string{"alpha", "beta", "web1"} {
		if _, errs, code := cmd("node", "add", n, "--out", filepath.Join(t.TempDir(), n, "agent.json")); code != 0 {
			t.Fatalf("node add %s: %s", n, errs)
		}
	}
	script, _, code := run(t, ctx, "completion", "bash")
	if code != 0 || !strings.Contains(script, "complete -o default -F _mesh_control_nodes mesh-control") {
		t.Fatalf("completion bash: exit %d\n%s", code, script)
	}
	f := filepath.Join(t.TempDir(), "mesh-control.bash")
	os.WriteFile(f, []byte(script), 0o644)
	// mesh-control on the shell's PATH is this test binary, as TestMain
	// makes it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(self, filepath.Join(bin, "mesh-control")); err != nil {
		t.Fatal(err)
	}
	url := s.url
	for _, c := range []struct {
		line string
		// dirEnv: $MESH_CONTROL_DIR names the key directory.
		dirEnv bool
		want   string
	}{
		{"mesh-control declare --nats " + url + " ", true, "alpha beta web1"},
		{"mesh-control declare --nats " + url + " w", true, "web1"},
		{"mesh-control declare --nats=" + url + " alpha,b", true, "alpha,beta"},
		{"mesh-control declare --nats " + url + " alpha,beta,", true, "alpha,beta,alpha alpha,beta,beta alpha,beta,web1"},
		{"mesh-control plan --json --wait=5m --nats " + url + " a", true, "alpha"},
		{"mesh-control publish -v --nats " + url + " b", true, "beta"},
		{"mesh-control node revoke --dir " + dir + " --nats " + url + " b", false, "beta"},
		{"mesh-control reports --nats " + url + " --dir=" + dir + " ", false, "alpha beta web1"},
		// Not a node's place: the file, the module, a node to be, a flag.
		{"mesh-control declare --nats " + url + " alpha a", true, ""},
		{"mesh-control unassign --nats " + url + " alpha b", true, ""},
		{"mesh-control node add --nats " + url + " a", true, ""},
		{"mesh-control assign --nats " + url + " --d", true, "--despite-briefing --dir"},
		// No control side here: nothing, silently.
		{"mesh-control declare --nats " + url + " a", false, ""},
	} {
		t.Run(c.line, func(t *testing.T) {
			words := strings.Fields(c.line)
			if strings.HasSuffix(c.line, " ") {
				words = append(words, "")
			}
			run := exec.Command("bash", "-c", `source "$1"
COMP_LINE=$2
COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<<"$COMP_LINE"
if [[ $COMP_LINE == *" " ]]; then COMP_WORDS+=(""); fi
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_mesh_control_nodes
echo "${COMPREPLY[*]}"`, "bash", f, c.line)
			run.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MESH_CONTROL_TEST_CLI=1", "MESH_CONTROL_DIR=")
			if c.dirEnv {
				run.Env = append(run.Env, "MESH_CONTROL_DIR="+dir)
			} else {
				run.Env = append(run.Env, "MESH_CONTROL_DIR="+filepath.Join(t.TempDir(), "none"))
			}
			out, err := run.CombinedOutput()
			if got := strings.TrimSuffix(string(out), "\n"); err != nil || got != c.want {
				t.Errorf("%q<TAB>: %q, want %q (%v)", c.line, got, c.want, err)
			}
		})
	}
}
