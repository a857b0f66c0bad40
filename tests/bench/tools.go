package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// The tools' names as printed. Ratios are taken against cfAgentName and
// floorName; floorBatchedName is shown for what per-file durability costs.
const (
	executorName     = "mesh-executor"
	floorName        = "floor"
	floorBatchedName = "floor (batched sync)"
	cfAgentName      = "cf-agent"
)

// A tool is one contender in the bench. Each has its own directory under
// run/, holding the tree it manages and whatever it remembers between runs.
type tool struct {
	name string
	home string // run/<slug>
	tree string // home/tree: the managed tree

	// argv is the command for scenario s, or nil when the tool sits s out.
	argv func(s scenario) []string
	// state is where the tool remembers what it applied, wiped for the
	// scenarios that start from an empty state. Empty when it remembers
	// nothing between runs that matters (cf-agent's locks are off, -K).
	state string
	// checkOutput judges the tool's standard output for scenario s. Nil when
	// the tree alone is the evidence.
	checkOutput func(s scenario, stdout []byte) error

	// snapshot is the tree as the no-op found it, to prove it rewrote nothing.
	snapshot map[string]statKey
}

// newTool makes the tool's directories: home 0755 (mesh-executor checks every
// directory above its declaration) and an empty tree.
func newTool(run, slug, name string) (*tool, error) {
	t := &tool{name: name, home: filepath.Join(run, slug)}
	t.tree = filepath.Join(t.home, "tree")
	if err := os.Mkdir(t.home, 0o755); err != nil {
		return nil, err
	}
	return t, wipeTree(t.tree)
}

// newExecutor sets up mesh-executor: two declarations (the full tree and the
// one file) and a state directory it creates itself.
func newExecutor(run, bin string, files []benchtree.File) (*tool, error) {
	t, err := newTool(run, "executor", executorName)
	if err != nil {
		return nil, err
	}
	t.state = filepath.Join(t.home, "state")
	full := filepath.Join(t.home, "full.json")
	one := filepath.Join(t.home, "one.json")
	if err := writeDeclaration(full, fullDeclaration(t.tree, files)); err != nil {
		return nil, err
	}
	if err := writeDeclaration(one, oneDeclaration(t.tree)); err != nil {
		return nil, err
	}
	t.argv = func(s scenario) []string {
		decl := full
		if s == oneFile {
			decl = one
		}
		return []string{bin, "apply", "--state", t.state, "--json", decl}
	}
	t.checkOutput = checkExecutorReport
	return t, nil
}

// checkExecutorReport holds the executor to its report: a no-op must say
// "unchanged" (engine rule 7: the second apply changes nothing and says so);
// anything that wrote must say "applied" or "repaired".
func checkExecutorReport(s scenario, stdout []byte) error {
	var rep struct {
		Outcome string            `json:"outcome"`
		Lines   []json.RawMessage `json:"lines"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout), &rep); err != nil {
		return fmt.Errorf("--json output is not the report: %v", err)
	}
	switch {
	case s == noop && rep.Outcome != "unchanged":
		return fmt.Errorf("no-op re-apply reported outcome %q, want \"unchanged\"", rep.Outcome)
	case s != noop && rep.Outcome != "applied" && rep.Outcome != "repaired":
		return fmt.Errorf("reported outcome %q, want \"applied\" or \"repaired\"", rep.Outcome)
	}
	return nil
}

// newFloor sets up the floor program. With batched set it is the variant that
// replaces per-file fsync by one syncfs; that variant only has work to compare
// where several files are written (converge and drift repair).
func newFloor(run, bin string, n int, batched bool) (*tool, error) {
	slug, name, suffix := "floor", floorName, ""
	if batched {
		slug, name, suffix = "floor-batched", floorBatchedName, "-batched"
	}
	t, err := newTool(run, slug, name)
	if err != nil {
		return nil, err
	}
	count := strconv.Itoa(n)
	t.argv = func(s scenario) []string {
		switch {
		case s == converge:
			return []string{bin, "converge" + suffix, t.tree, count}
		case s == drift:
			return []string{bin, "repair" + suffix, t.tree, count}
		case batched:
			return nil
		case s == noop:
			return []string{bin, "check", t.tree, count}
		case s == oneFile:
			return []string{bin, "one", t.tree}
		}
		return nil
	}
	return t, nil
}

// newCFAgent sets up cf-agent to run standalone on our policy, and nothing of
// the host's own CFEngine:
//
//   - the policy is given with -f, as a file named on the command line: that
//     is cf-agent's equivalent of the rescue command `mesh-executor apply
//     FILE`. Like the executor, which validates the whole declaration before
//     touching anything, cf-agent then validates the policy (by running
//     cf-promises) on every run. (An agent driven by cf-execd from its
//     inputs/promises.cf caches that validation; measured here, that is about
//     20 ms less per run, e.g. 30 instead of 50 ms for the one file.)
//   - a work directory of its own (-w), so /var/lib/cfengine3 is untouched;
//   - its own key pair, made once with cf-key: without one, cf-agent falls
//     back to its failsafe policy and aborts ("No public/private key pair");
//   - bin/ pointing at the directory holding cf-promises, which cf-agent runs
//     from $(workdir)/bin and nowhere else;
//   - -K (--no-lock), so it runs again at once; without it, a promise kept less
//     than a minute ago is skipped as "too soon" and the run does no work.
func newCFAgent(run, bin string, files []benchtree.File) (*tool, string, error) {
	t, err := newTool(run, "cfengine", cfAgentName)
	if err != nil {
		return nil, "", err
	}
	work := filepath.Join(t.home, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, "", err
	}
	if err := os.Symlink(filepath.Dir(bin), filepath.Join(work, "bin")); err != nil {
		return nil, "", err
	}
	key := exec.Command(filepath.Join(filepath.Dir(bin), "cf-key"))
	key.Env = append(os.Environ(), "CFENGINE_TEST_OVERRIDE_WORKDIR="+work)
	if out, err := key.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("running %q failed: %v\n%s", key.Args, err, out)
	}
	full := filepath.Join(t.home, "full.cf")
	one := filepath.Join(t.home, "one.cf")
	if err := os.WriteFile(full, fullPolicy(t.tree, files), 0o600); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(one, onePolicy(t.tree), 0o600); err != nil {
		return nil, "", err
	}
	t.argv = func(s scenario) []string {
		policy := full
		if s == oneFile {
			policy = one
		}
		return []string{bin, "--no-lock", "--workdir", work, "--file", policy}
	}
	version, _ := exec.Command(bin, "--version").Output()
	return t, strings.TrimSpace(string(version)), nil
}

// wipeTree leaves an empty tree directory, 0755 and root's, as every scenario
// that starts from nothing needs.
func wipeTree(tree string) error {
	if err := os.RemoveAll(tree); err != nil {
		return err
	}
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	return os.Chmod(tree, 0o755)
}
