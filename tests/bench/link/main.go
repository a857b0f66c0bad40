// Command mesh-bench-link measures the link (docs/benchmarks.md): the
// real system on one machine — a
// control side with its embedded NATS broker (TLS, JetStream), the executor
// as root and the agent as an unprivileged user, each its own process, over
// loopback, on a real disk — and times what an operator waits for:
//
//  1. Push → applied → report received: a 10-file declaration (a directory
//     and ten files of 200 bytes, two contents alternating so every push
//     rewrites every file) declared 1000 times, one at a time, each waiting
//     for its report before the next. The time runs from the control side's
//     declare (control.Client.Declare: take the sequence, sign with the
//     control key, publish to JetStream — what `mesh-control declare` does)
//     to the report arriving on the control side's connection. Targets:
//     p50 ≤ 10 ms, p99 ≤ 30 ms. Beside it, interleaved sample by sample so
//     the same noise lands on both, the raw NATS request/reply round trip
//     between two control-side connections over the same TLS broker: the
//     floor no push can beat.
//  2. A flurry of 1000 declarations published as fast as the control side
//     declares them: the time until the newest one's report arrives
//     (target ≤ 2 s, from the first declare), and how many were applied and
//     how many reported superseded.
//  3. Steady RSS (VmRSS) of the agent and the executor once the flurry has
//     settled and they are idle (targets ≤ 15 MiB each), the control side's
//     for information, and the sizes of the three binaries as built.
//
// Correctness is checked while measuring: every report must be signed by the
// node, be for the sequence pushed, and say applied with a line per resource
// (ten files applied); after every push the files on disk must hold what it
// declared; in the flurry every declaration must be accounted for (applied,
// or superseded by one that was applied) and the disk must hold the newest.
// A system that did not do the job exits 1; a missed speed target is only
// reported (MISS), exit 0; a bench that could not run exits 2.
//
// It is run by tests/bench/run.sh (`make bench`) after the rescue-command
// bench, which builds the three binaries with one build id:
//
//	mesh-bench-link -dir /var/tmp/mesh-bench -bin DIR/bin/link -build ID
//
// Everything it starts lives under DIR/link (removed at the end, with every
// process it started); the results go to DIR/link-results.json.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// config is what the command line chooses.
type config struct {
	dir       string // the bench's work directory; this bench works in dir/link
	bin       string // the directory holding mesh-control, mesh-executor, mesh-agent
	build     string // the build id the three were stamped with ("" to ask mesh-agent)
	pushes    int
	warmup    int
	flurry    int
	files     int
	heartbeat time.Duration
	settle    time.Duration
	agentUser string
	jsonOut   string
	keep      bool
}

// The exit codes, as the rescue-command bench's.
const (
	exitOK     = 0 // the system did the job (targets may be missed: MISS)
	exitWrong  = 1 // the system did not do the job
	exitBroken = 2 // the bench could not run
)

func main() {
	var c config
	flag.StringVar(&c.dir, "dir", "/var/tmp/mesh-bench", "work `directory`, on a real disk (not tmpfs); the link bench uses DIR/link")
	flag.StringVar(&c.bin, "bin", "", "`directory` of mesh-control, mesh-executor and mesh-agent, built with one build id (default DIR/bin/link)")
	flag.StringVar(&c.build, "build", "", "the build `id` the binaries carry (default: ask mesh-agent --version)")
	flag.IntVar(&c.pushes, "pushes", 1000, "timed pushes, one at a time")
	flag.IntVar(&c.warmup, "warmup", 20, "untimed pushes first")
	flag.IntVar(&c.flurry, "flurry", 1000, "declarations in the flurry")
	flag.IntVar(&c.files, "files", 10, "files in the pushed declaration")
	flag.DurationVar(&c.heartbeat, "heartbeat", time.Second, "the agent's heartbeat period (it asks the executor for its status each time)")
	flag.DurationVar(&c.settle, "settle", 5*time.Second, "idle time after the flurry before reading RSS")
	flag.StringVar(&c.agentUser, "agent-user", "nobody", "the unprivileged user the agent drops to")
	flag.StringVar(&c.jsonOut, "json", "", "results `file` (default DIR/link-results.json)")
	flag.BoolVar(&c.keep, "keep", false, "keep DIR/link (logs, state) for a look afterwards")
	flag.Parse()
	if c.bin == "" {
		c.bin = filepath.Join(c.dir, "bin", "link")
	}
	if c.jsonOut == "" {
		c.jsonOut = filepath.Join(c.dir, "link-results.json")
	}
	// A closed stdout (| head) must not kill the driver before it has
	// stopped what it started: writes fail instead.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	code := run(ctx, c)
	stop()
	os.Exit(code)
}

// run does the whole link bench and returns the exit code. Every process
// and directory it starts is gone when it returns (unless -keep).
func run(ctx context.Context, c config) int {
	if err := checkConfig(&c); err != nil {
		fmt.Fprintln(os.Stderr, "link bench:", err)
		return exitBroken
	}
	start := time.Now()
	b := &bench{cfg: c, res: &results{}}
	b.res.Host = readHostInfo(c.dir)
	m, err := startMesh(ctx, c)
	if m != nil {
		defer m.stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "link bench: starting the system:", err)
		if m != nil {
			m.dumpLogs(os.Stderr)
		}
		return exitBroken
	}
	b.m = m
	b.printHeader(os.Stdout)

	b.sizes()
	if err := b.pushes(ctx); err != nil {
		b.fail("push: %v", err)
	}
	if len(b.res.Failures) == 0 {
		if err := b.runFlurry(ctx); err != nil {
			b.fail("flurry: %v", err)
		}
	}
	if len(b.res.Failures) == 0 {
		if err := b.rss(ctx); err != nil {
			b.fail("rss: %v", err)
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "link bench: interrupted")
		return exitBroken
	}
	b.res.Seconds = time.Since(start).Seconds()
	b.printTable(os.Stdout)
	if len(b.res.Failures) > 0 {
		m.dumpLogs(os.Stderr)
	}
	if err := b.writeJSON(c.jsonOut); err != nil {
		fmt.Fprintln(os.Stderr, "link bench:", err)
		return exitBroken
	}
	fmt.Printf("\nresults written to %s\n", c.jsonOut)
	if len(b.res.Failures) > 0 {
		return exitWrong
	}
	return exitOK
}

func checkConfig(c *config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root: the executor is root, and the agent drops from root to %s", c.agentUser)
	}
	if !filepath.IsAbs(c.dir) || !filepath.IsAbs(c.bin) {
		return fmt.Errorf("-dir and -bin must be absolute")
	}
	if c.pushes < 100 || c.flurry < 2 || c.files < 1 || c.warmup < 0 {
		return fmt.Errorf("-pushes at least 100 (a p99 of fewer means little), -flurry at least 2, -files at least 1")
	}
	for _, n := range binaries {
		if _, err := os.Stat(filepath.Join(c.bin, n)); err != nil {
			return fmt.Errorf("%w (tests/bench/run.sh builds them)", err)
		}
	}
	return nil
}
