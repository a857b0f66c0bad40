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

// Each shell's completion of mesh-control offers a node's name where a
// command takes one — asked of the control side the line names with --dir
// and --nats, or $MESH_CONTROL_DIR — and nothing else there; files where a
// file is taken; elsewhere the commands and flags. A control side that
// does not answer completes nothing and says nothing. bash is asked
// through its completion function and COMPREPLY (its files are
// readline's, past COMPREPLY); fish for real (complete -C); zsh through
// its completion file as zsh's autoload runs it, with compadd and _files
// said as what they are given, since only a zsh reading a terminal
// completes.
func TestShellsCompleteNodeNames(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)
	for _, n := range []string{"alpha", "beta", "web1"} {
		if _, errs, code := cmd("node", "add", n, "--out", filepath.Join(t.TempDir(), n, "agent.json")); code != 0 {
			t.Fatalf("node add %s: %s", n, errs)
		}
	}
	scripts := map[string]string{}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script, _, code := run(t, ctx, "completion", shell)
		if code != 0 || !strings.Contains(script, "__complete") {
			t.Fatalf("completion %s: exit %d\n%s", shell, code, script)
		}
		scripts[shell] = filepath.Join(t.TempDir(), "mesh-control."+shell)
		os.WriteFile(scripts[shell], []byte(script), 0o644)
	}
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
	// Where the shells run: one file, for where a file is taken.
	cwd := t.TempDir()
	os.WriteFile(filepath.Join(cwd, "apple.json"), nil, 0o644)
	// The shells' words for one line, as each completes it.
	complete := map[string]string{
		"bash": `source "$1"
COMP_LINE=$2
COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<<"$COMP_LINE"
if [[ $COMP_LINE == *" " ]]; then COMP_WORDS+=(""); fi
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_mesh_control
echo "${COMPREPLY[*]}"`,
		"zsh": `compadd() { [[ $1 == -- ]] && shift; local w; for w; do [[ $w == ${PREFIX}* ]] && print -r -- $w; done; }
_files() { print -r -- '<files>'; }
words=(${(z)2})
[[ $2 == *' ' ]] && words+=('')
CURRENT=${#words}
PREFIX=${words[CURRENT]}
source "$1" | xargs`,
		"fish": `source $argv[1]
complete -C $argv[2] | string replace -r '\t.*' '' | string join ' '; true`,
	}
	url := s.url
	for _, c := range []struct {
		line string
		// dirEnv: $MESH_CONTROL_DIR names the key directory.
		dirEnv bool
		want   string
		// files: a file is taken here: the shell offers files (bash's
		// readline does, past COMPREPLY), and no names.
		files bool
	}{
		{"mesh-control declare --nats " + url + " ", true, "alpha beta web1", false},
		{"mesh-control declare --nats " + url + " w", true, "web1", false},
		{"mesh-control declare --nats=" + url + " alpha,b", true, "alpha,beta", false},
		{"mesh-control declare --nats " + url + " alpha,beta,", true, "alpha,beta,alpha alpha,beta,beta alpha,beta,web1", false},
		{"mesh-control plan --json --wait=5m --nats " + url + " a", true, "alpha", false},
		{"mesh-control publish -v --nats " + url + " b", true, "beta", false},
		{"mesh-control node revoke --dir " + dir + " --nats " + url + " b", false, "beta", false},
		{"mesh-control reports --nats " + url + " --dir=" + dir + " ", false, "alpha beta web1", false},
		// Not a node's place: the file, the module, a node to be, a flag.
		{"mesh-control declare --nats " + url + " alpha a", true, "", true},
		{"mesh-control plan --nats " + url + " alpha a", true, "", true},
		{"mesh-control unassign --nats " + url + " alpha b", true, "", false},
		{"mesh-control node add --nats " + url + " a", true, "", false},
		{"mesh-control assign --nats " + url + " --d", true, "--despite-briefing --dir", false},
		{"mesh-control node sh", true, "show", false},
		// A flag's value: files.
		{"mesh-control declare --dir a", true, "", true},
		// No control side here: nothing, silently, and no files.
		{"mesh-control declare --nats " + url + " a", false, "", false},
	} {
		for _, shell := range []string{"bash", "zsh", "fish"} {
			t.Run(shell+" "+c.line, func(t *testing.T) {
				want := c.want
				if c.files {
					want = map[string]string{"bash": "", "zsh": "<files>", "fish": "apple.json"}[shell]
				}
				flag := map[string]string{"bash": "-c", "zsh": "-fc", "fish": "-c"}[shell]
				run := exec.Command(shell, flag, complete[shell], shell, scripts[shell], c.line)
				if shell == "fish" {
					run = exec.Command("fish", "--no-config", "-c", complete[shell], scripts[shell], c.line)
				}
				run.Dir = cwd
				run.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MESH_CONTROL_TEST_CLI=1", "MESH_CONTROL_DIR=")
				if c.dirEnv {
					run.Env = append(run.Env, "MESH_CONTROL_DIR="+dir)
				} else {
					run.Env = append(run.Env, "MESH_CONTROL_DIR="+filepath.Join(t.TempDir(), "none"))
				}
				out, err := run.CombinedOutput()
				if got := strings.TrimSpace(string(out)); err != nil || got != want {
					t.Errorf("%q<TAB>: %q, want %q (%v)", c.line, got, want, err)
				}
			})
		}
	}
}
