// Command bench measures mesh-executor's rescue command, `mesh-executor apply`
// (docs/benchmarks.md): for a tree of 1000 files
// of about 200 bytes in 10 directories it times four scenarios (converge from
// an empty state, no-op re-apply, drift repair, a one-file declaration with an
// empty state) and prints each figure beside two references measured in the
// same run: the physical floor (tests/bench/floor, only the necessary
// filesystem work) and CFEngine's cf-agent on the equivalent policy.
//
// It is normally run by tests/bench/run.sh (`make bench`), which installs
// cfengine3, builds the binaries and passes their paths:
//
//	bench -executor BIN -floor BIN -spawn BIN [-cf-agent PATH] [-runs 7] [-files 1000]
//
// How it measures, and why:
//
//   - Every tool runs as its own process, started through tests/bench/spawn,
//     which reports wall time and peak RSS (ru_maxrss). The driver does not
//     start tools itself because Go's vfork would charge the driver's own RSS
//     to each child.
//   - Each tool works on its own tree under the work directory (a real disk,
//     never tmpfs), so runs of different tools can be interleaved round by
//     round: background noise on a shared machine then lands on every tool
//     alike, and the median of the rounds is reported. Each (scenario, tool)
//     pair also has one untimed warm-up round.
//   - Resetting a scenario (wiping a tree and a state directory, damaging
//     files for the drift) is outside the timed region, and is followed by
//     sync(2), so no run pays for the writeback of the one before. The page
//     cache is deliberately left warm: the scenarios are about a running
//     host's repeated applies, not a cold boot; the output says so.
//   - After every run the driver checks the tree byte for byte (content, mode,
//     owner, no stray entries) and, for the no-op, that nothing was rewritten.
//     A tool that is fast but wrong is a failure, not a result: the driver
//     exits 1. A missed speed target is only reported (loudly, MISS): exit 0.
//
// Out of scope: cold-cache figures, other tree sizes' targets, and the link
// path (the agent and the socket); only the local-file rescue command is timed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// config is what the command line chooses.
type config struct {
	dir      string // the work directory, on a real disk
	files    int
	runs     int
	executor string // mesh-executor binary; empty: leave it out (for working on the bench itself)
	floor    string
	spawn    string
	cfAgent  string // cf-agent binary; empty: leave it out
	jsonOut  string
	timeout  time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.dir, "dir", "/var/tmp/mesh-bench", "work `directory`, on a real disk (not tmpfs)")
	flag.IntVar(&c.files, "files", 1000, "number of managed files")
	flag.IntVar(&c.runs, "runs", 7, "timed runs per scenario and tool (at least 5); the median is reported")
	flag.StringVar(&c.executor, "executor", "", "mesh-executor `binary` (empty: measure only the references)")
	flag.StringVar(&c.floor, "floor", "", "floor `binary` (default DIR/bin/mesh-bench-floor)")
	flag.StringVar(&c.spawn, "spawn", "", "spawn `binary` (default DIR/bin/mesh-bench-spawn)")
	flag.StringVar(&c.cfAgent, "cf-agent", "auto", "cf-agent `binary` (auto: look in PATH; empty: leave it out)")
	flag.StringVar(&c.jsonOut, "json", "", "results `file` (default DIR/results.json)")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "give up on one run after this long")
	only := flag.String("only", "", "run only these `scenarios` (comma-separated: converge,no-op,drift-repair,one-file); the default is all")
	flag.Parse()
	if *only != "" {
		var keep []scenario
		for _, name := range strings.Split(*only, ",") {
			i := slices.Index(scenarios, scenario(name))
			if i < 0 {
				fmt.Fprintf(os.Stderr, "bench: -only: no scenario %q (have %v)\n", name, scenarios)
				os.Exit(2)
			}
			keep = append(keep, scenarios[i])
		}
		scenarios = keep
	}
	if c.floor == "" {
		c.floor = filepath.Join(c.dir, "bin", "mesh-bench-floor")
	}
	if c.spawn == "" {
		c.spawn = filepath.Join(c.dir, "bin", "mesh-bench-spawn")
	}
	if c.jsonOut == "" {
		c.jsonOut = filepath.Join(c.dir, "results.json")
	}
	if c.cfAgent == "auto" {
		c.cfAgent, _ = exec.LookPath("cf-agent")
	}
	ok, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run does the whole bench. It returns false when a tool did not do its job
// (the results are still printed and written), and an error when the bench
// itself could not run.
func run(c config) (bool, error) {
	if c.runs < 5 {
		return false, fmt.Errorf("-runs %d: at least 5, so the median means something", c.runs)
	}
	if c.files < benchtree.MinFiles {
		return false, fmt.Errorf("-files %d: at least %d, so the drift scenario can pick its files", c.files, benchtree.MinFiles)
	}
	if os.Geteuid() != 0 {
		return false, fmt.Errorf("must run as root: mesh-executor applies only root-owned files, and cf-agent runs as root")
	}
	// Every file and directory the bench creates gets the mode it asks for.
	syscall.Umask(0o022)
	if err := prepareWorkDir(c.dir); err != nil {
		return false, err
	}
	for _, p := range []string{c.floor, c.spawn, c.executor, c.cfAgent} {
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) {
			return false, fmt.Errorf("%s: give binaries as absolute paths", p)
		}
		if _, err := os.Stat(p); err != nil {
			return false, err
		}
	}

	b, err := newBench(c)
	if err != nil {
		return false, err
	}
	defer func() {
		if err := b.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: warning: emptying %s: %v\n", b.trash, err)
		}
	}()
	b.printHeader(os.Stdout)
	for _, s := range scenarios {
		b.runScenario(s)
	}
	b.printTable(os.Stdout)
	if err := b.writeJSON(c.jsonOut); err != nil {
		return false, err
	}
	fmt.Printf("\nresults written to %s\n", c.jsonOut)
	return len(b.failures) == 0, nil
}

// prepareWorkDir makes the work directory root-owned and 0755 (mesh-executor
// refuses a declaration under a directory others could write) and refuses a
// filesystem in memory, where fsync costs nothing and the figures would lie.
func prepareWorkDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("-dir %s: must be absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chown(dir, 0, 0); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	name, err := fsType(dir)
	if err != nil {
		return err
	}
	if name == "tmpfs" || name == "ramfs" {
		return fmt.Errorf("%s is on %s: the bench needs a real disk, where fsync costs what it costs", dir, name)
	}
	return nil
}
