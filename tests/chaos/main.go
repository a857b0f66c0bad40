// Command chaos runs the mesh as an operator and a bad day would: a
// control side (mesh-control serve, its broker embedded), several nodes
// (each a mesh-executor serve as root in a network namespace of its own,
// and a mesh-agent, each in its own state directories and socket) and the
// real CLI, all real binaries built once. From a seed it draws a list of
// steps — declare, assign, unassign, publish, plan, overlay set, revoke,
// re-enrol, token issue, rescue apply, and faults: kill -9 and
// SIGSTOP/SIGCONT of any process, serve restarted or killed, a second
// instance of any daemon, a node's state disk full, the control side's
// disk full, a power cut of the control side — and after each step
// checks the invariants an operator relies on: nothing panicked or exited
// unasked; what the control side acknowledged is there; what each store
// says it owns is on its machine exactly, and the reverse; the control
// side's view of each quiet node converges to the node's own; every
// change to a node's tree is one a report line says, inside what the
// mesh declares.
//
// The steps derive from the seed alone, so a failure's seed replays it:
// make chaos SEED=N. It is a program, not only a test, because a long run
// (make chaos STEPS=2000) is something to watch; TestChaosShort runs a
// few seeds of it under go test.
//
// Out of scope: a clock off by hours (the binaries are static, so no fake
// clock can be put in, and Linux has no namespace for the wall clock, so
// it would mean changing the machine's own); a second mesh-launch (the
// run starts the executor itself, not through the launcher).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

type config struct {
	seed   uint64
	steps  int
	nodes  int
	bound  time.Duration
	strict bool
	keep   bool
	bin    string
}

func main() {
	var c config
	flag.Uint64Var(&c.seed, "seed", 0, "the seed the steps are drawn from (0: one drawn from the time, and printed)")
	flag.IntVar(&c.steps, "steps", 60, "how many steps")
	flag.IntVar(&c.nodes, "nodes", 3, "how many nodes")
	flag.DurationVar(&c.bound, "bound", 2*time.Minute, "how long a quiet node's view may take to converge")
	flag.BoolVar(&c.strict, "strict", false, "count the known faults' violations as failures (to see one fixed)")
	flag.BoolVar(&c.keep, "keep", false, "keep the work directory (logs, declarations) after the run")
	flag.StringVar(&c.bin, "bin", "", "the binaries' directory (default: built into the work directory)")
	flag.IntVar(&nodeCutEvery, "node-cuts", nodeCutEvery, "one step in about this many cuts a node's power (a seed replays with the same value)")
	flag.IntVar(&nodeCutAt, "node-cut-at", nodeCutAt, "cut a node's power this many ms after its declaration was acknowledged, not the seed's draw (-1), to meet a timing another machine met")
	flag.IntVar(&sysDiskEvery, "sys-fulls", sysDiskEvery, "one step in about this many fills a node's system disk (a seed replays with the same value)")
	var sc soakConfig
	flag.DurationVar(&sc.length, "soak", 0, "soak for this long instead: no faults, many declarations, every state sampled, and a fail for whatever grows (make soak)")
	flag.DurationVar(&sc.every, "soak-every", 10*time.Second, "how often the soak samples")
	flag.DurationVar(&sc.revoke, "soak-revoke", 2*time.Minute, "how often the soak revokes a node and enrols it again (0: never)")
	flag.Parse()
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano()) % 1000000
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "chaos: runs as root (the executor is root; nodes get network namespaces and tmpfs state)")
		os.Exit(2)
	}
	if sc.length > 0 {
		res, err := soak(c, sc, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(2)
		}
		if len(res.grew) > 0 || len(res.failed) > 0 || len(res.violations) > 0 {
			os.Exit(1)
		}
		return
	}
	res, err := run(c, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if len(res.violations) > 0 {
		os.Exit(1)
	}
}

// result is what a run found.
type result struct {
	violations []string
	known      map[string]int
	figures    string
}

// run draws c.seed's steps, runs them against a fresh mesh and checks
// the invariants after each; it returns an error only when the mesh
// could not be set up.
func run(c config, out io.Writer) (result, error) {
	w, mw, done, err := newWorld(c, out, "chaos")
	if err != nil {
		return result{}, err
	}
	defer done()
	steps := planSteps(c.seed, c.steps, c.nodes, w.loop)
	fmt.Fprintf(mw, "chaos: seed %d, %d steps, %d nodes, work directory %s\n", c.seed, c.steps, c.nodes, w.base)
	if err := w.setup(); err != nil {
		return result{}, fmt.Errorf("setting the mesh up: %w (logs in %s)", err, w.base)
	}
	start := time.Now()
	for _, s := range steps {
		w.stepN = s.N
		fmt.Fprintf(mw, "%s\n", s)
		w.do(s)
		w.afterStep()
	}
	res := result{violations: w.violations, known: w.known, figures: w.figures(steps)}
	fmt.Fprintf(mw, "\nseed %d: %d steps in %s\n%s", c.seed, len(steps), time.Since(start).Round(time.Second), res.figures)
	fmt.Fprintf(mw, "known faults (their violations are counted, not failed; -strict fails them):\n")
	for _, k := range sortedKeys(knownFaults) {
		fmt.Fprintf(mw, "  %-22s %s\n", k, knownFaults[k])
	}
	if len(w.violations) > 0 {
		fmt.Fprintf(mw, "\nFAILED: seed %d (replay: make chaos SEED=%d STEPS=%d)\n", c.seed, c.seed, c.steps)
		for _, v := range w.violations {
			fmt.Fprintf(mw, "  %s\n", v)
		}
		fmt.Fprintf(mw, "the steps:\n")
		for _, s := range steps {
			fmt.Fprintf(mw, "  %s\n", s)
		}
		fmt.Fprintf(mw, "logs: %s\n", w.base)
	}
	return res, nil
}

// newWorld makes the run's work directory and binaries, and a world that
// writes to out and to its run.log; done ends what the run started (also
// on an interrupt) and removes the directory unless kept or failed.
func newWorld(c config, out io.Writer, kind string) (w *world, mw io.Writer, done func(), err error) {
	if c.nodes == 0 {
		c.nodes = 3
	}
	if c.bound == 0 {
		c.bound = 2 * time.Minute
	}
	// Named chaos-SEED-N whatever the kind: the executors' mount namespaces
	// detach every such run's control disk (executorArgv).
	base, err := os.MkdirTemp("", fmt.Sprintf("chaos-%d-", c.seed))
	if err != nil {
		return nil, nil, nil, err
	}
	os.Chmod(base, 0o755) // the agent, as nobody, reaches its socket below
	logf, err := os.Create(filepath.Join(base, "run.log"))
	if err != nil {
		return nil, nil, nil, err
	}
	w = &world{cfg: c, base: base, faults: map[string]int{}, checks: map[string]int{}, known: map[string]int{}}
	mw = io.MultiWriter(out, logf)
	w.out = mw
	w.bin = c.bin
	if w.bin == "" {
		w.bin = filepath.Join(base, "bin")
		if err := build(w.bin); err != nil {
			logf.Close()
			return nil, nil, nil, err
		}
	}
	var why string
	w.loop, why = loopAvailable()
	if !w.loop {
		fmt.Fprintf(mw, "%s: %s: the control side is on a tmpfs, and no power cut is drawn\n", kind, why)
	}
	// Interrupted, the run still ends what it started: the agents have
	// dropped to another user, so the parent's death does not reach them.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-sig; ok {
			fmt.Fprintf(mw, "%s: interrupted at step %d; ending what the run started\n", kind, w.stepN)
			w.close()
			os.Exit(130)
		}
	}()
	done = func() {
		signal.Stop(sig)
		close(sig)
		w.close()
		if !c.keep && len(w.violations) == 0 && !w.failedRun {
			os.RemoveAll(base)
		}
		logf.Close()
	}
	return w, mw, done, nil
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// build makes the three binaries into dir, stamped with one build id as
// a release would be (the agent compares its build with the executor's),
// with the tag chaosclock: a node's programs then read their clock off by
// clock.SkewEnv, which is how the run gives a node a clock hours off.
func build(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range []string{"mesh-executor", "mesh-agent", "mesh-control", "mesh-launch"} {
		b := exec.Command("go", "build", "-tags", "chaosclock", "-ldflags", "-X main.version=chaos -X main.build=chaos", "-o", filepath.Join(dir, c), "./cmd/"+c)
		b.Dir = root
		b.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := b.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", c, err, out)
		}
	}
	return nil
}

func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		d = p
	}
}
