// Command mesh-bench-scale measures the fleet side at scale, so every
// change to it is measured against the same instrument. `make bench-scale` runs it
// (NODES=N, default 10000; CLUSTER=1 for a three-server cluster).
//
// The control side is the real `mesh-control serve` with its embedded NATS
// broker and JetStream, a child process, so that its CPU (utime + stime
// from /proc/PID/stat over a window) and memory (VmRSS from
// /proc/PID/status) are its own. The nodes are simulated in this process:
// each runs the agent's own code (agent.Run: its NATS link with its own
// NKey and the pinned certificate, one connection per node as the real
// agent holds, its drain, heartbeat and reports) against an in-process
// stand-in for its executor that speaks the wire protocol (tests/fleet).
//
// In order, it measures:
//
//  1. Registration of NODES nodes with control.Client.AddNode (what `node
//     add` does), a few at a time. A refusal is reported as it is, with
//     how many were registered, and the bench goes on with those.
//  2. The agents linking (information): started in batches, timed until
//     each says "linked".
//  3. Fan-out of one declaration to every node (control.Client.Declare
//     per node, what `declare` does, several at a time): from the first
//     declare, p50 and p100 of the time until each node's stand-in
//     received it, and until the control side recorded its report (the
//     registry's report.<node>, watched). Once as soon as the fleet has
//     linked, and again after the idle window (4), the state a fleet is
//     usually in when a declaration comes.
//  4. Idle: after a settle (20 s: serve gives memory back after a burst
//     first), the control side's CPU over a window (one
//     heartbeat period by default) with every node heartbeating every
//     30 s, and its memory per node: (VmRSS now − VmRSS before any node
//     was registered) / nodes.
//  5. Stop + start + every node reconnected: serve is stopped (SIGTERM,
//     as an init stops it) and started again; the time until every agent
//     says "linked" again, from the stop.
//  6. `overlay set` on up to 1,000 of the nodes: each is given a WireGuard
//     key in its registry record (what enrolment binds; enrolling through
//     tokens is not this measure), then `mesh-control overlay set` is run
//     as an operator runs it; the time until every node's stand-in applied
//     a declaration carrying the overlay, and until its report is recorded.
//
// It prints a table with the fleet's targets and MISS for each one missed
// (a target stated for 10,000 nodes and met on fewer is said so, not
// PASS), and optionally writes the figures as JSON. Exit status: 0 when
// it measured (targets may be missed), 1 when the system did the job
// wrong (a stand-in received a declaration that does not verify, or is
// not its own), 2 when the bench could not run.
package main

import (
	"context"
	"debug/buildinfo"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// config is what the command line chooses.
type config struct {
	nodes           int
	cluster         bool
	dir             string
	controlBin      string
	heartbeat       time.Duration
	registerWorkers int
	maxRefusals     int
	startBatch      int
	settle          time.Duration
	idle            time.Duration
	overlayNodes    int
	linkTimeout     time.Duration
	fanoutTimeout   time.Duration
	stopTimeout     time.Duration
	restartTimeout  time.Duration
	overlayTimeout  time.Duration
	jsonOut         string
	keep            bool
	profile         string
	syncDefault     bool
	contended       bool
	resolver        bool
	declaresOnly    bool
}

// The exit codes, as the other benches'.
const (
	exitOK     = 0 // measured (targets may be missed: MISS)
	exitWrong  = 1 // the system did not do the job
	exitBroken = 2 // the bench could not run
)

func main() {
	if os.Getenv(burnEnv) != "" {
		burn()
	}
	var c config
	flag.IntVar(&c.nodes, "nodes", 10000, "nodes to register and simulate")
	flag.BoolVar(&c.cluster, "cluster", false, "measure against a three-server NATS cluster (nats-server processes built from the module): registration, linking, fan-outs and each server's idle CPU")
	flag.StringVar(&c.dir, "dir", "/var/tmp/mesh-bench", "work `directory` on a real disk; this bench uses DIR/scale (removed at the end unless -keep)")
	flag.StringVar(&c.controlBin, "control", "", "the mesh-control `binary` (default: built into DIR/scale/bin)")
	flag.DurationVar(&c.heartbeat, "heartbeat", 30*time.Second, "the agents' heartbeat period")
	flag.IntVar(&c.registerWorkers, "register-workers", 4, "node adds in flight at once")
	flag.IntVar(&c.maxRefusals, "max-refusals", 20, "stop registering after this many refusals in a row")
	flag.IntVar(&c.startBatch, "start-batch", 250, "agents started at once, each batch waited for until linked")
	// serve gives back what a burst grew it to at its first quiet look
	// (every 5 s) after the burst, two collections of its whole heap
	// (control/memory.go): 5 to 12 s after a fan-out to 10,000 nodes. With
	// 10 s, the idle window began on them in some runs and not in others
	// (the burst's cost, 1.5 s of CPU, read as idle's).
	flag.DurationVar(&c.settle, "settle", 20*time.Second, "quiet time before the idle window")
	flag.DurationVar(&c.idle, "idle", 0, "the idle window (default: one heartbeat period)")
	flag.IntVar(&c.overlayNodes, "overlay-nodes", 1000, "nodes in the overlay (at most the nodes linked; the target is stated for 1,000)")
	flag.DurationVar(&c.linkTimeout, "link-timeout", time.Minute, "how long one batch of agents may take to link")
	flag.DurationVar(&c.fanoutTimeout, "fanout-timeout", 2*time.Minute, "how long the fan-out may take before the missing nodes are counted")
	flag.DurationVar(&c.stopTimeout, "stop-timeout", 3*time.Minute, "how long serve may take to stop before it is killed")
	flag.DurationVar(&c.restartTimeout, "restart-timeout", 3*time.Minute, "how long after the stop every node may take to link again")
	flag.DurationVar(&c.overlayTimeout, "overlay-timeout", 2*time.Minute, "how long `overlay set` may take to reach every node before it is cut off")
	flag.StringVar(&c.jsonOut, "json", "", "also write the figures to this `file` as JSON")
	flag.BoolVar(&c.keep, "keep", false, "keep DIR/scale (logs, the broker's store) for a look afterwards")
	flag.BoolVar(&c.syncDefault, "sync-default", false, "build serve with nats-server's default sync interval (-tags benchnosync), to measure what fsync before each acknowledgement costs; acknowledged writes are then not durable")
	flag.StringVar(&c.profile, "profile", "", "write CPU profiles of the fan-outs to this `directory`: this process's and serve's (built with -tags benchprofile), and with -cluster each server's (nats-server --profile, 10 s from the fan-out's start)")
	flag.BoolVar(&c.resolver, "resolver", false, "with -cluster: the servers in NATS operator mode (broker-config --resolver), an account per node pushed by serve, instead of the accounts file they reload")
	flag.BoolVar(&c.contended, "contended", false, "keep one core busy throughout with a process of the bench's own, and judge by the contended targets (a control machine that is not idle)")
	flag.BoolVar(&c.declaresOnly, "declares-only", false, "register the nodes, link no agent, and time three fan-outs' declares (DeclareAll to every node) with each process's CPU: the control side's and the broker's part of a fan-out, without the fleet's")
	flag.Parse()
	if c.resolver && !c.cluster {
		fmt.Fprintln(os.Stderr, "-resolver is for -cluster: the embedded broker gives each node an account of its own by itself")
		os.Exit(exitBroken)
	}
	if c.profile != "" {
		// Made here, not found missing after the run's first phases.
		if err := os.MkdirAll(c.profile, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "-profile:", err)
			os.Exit(exitBroken)
		}
	}
	if c.contended {
		restartSet := false
		flag.Visit(func(f *flag.Flag) { restartSet = restartSet || f.Name == "restart-timeout" })
		if !restartSet {
			// The contended target is 180 s from serve's return; the
			// timeout runs from the stop.
			c.restartTimeout = 4 * time.Minute
		}
	}
	if c.idle <= 0 {
		c.idle = c.heartbeat
	}
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	code := run(ctx, c, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run does the whole bench and returns the exit code; what it started is
// gone when it returns.
func run(ctx context.Context, c config, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := checkConfig(c); err != nil {
		fmt.Fprintln(stderr, "scale bench:", err)
		return exitBroken
	}
	b := &bench{cfg: c, log: log, res: &results{}}
	b.res.Host = hostInfo()
	b.res.Requested = c.nodes
	work := filepath.Join(c.dir, "scale")
	unlock, err := lockWork(work)
	if err != nil {
		fmt.Fprintln(stderr, "scale bench:", err)
		return exitBroken
	}
	defer unlock()
	defer b.teardown(work)
	if err := b.setup(ctx, work); err != nil {
		fmt.Fprintln(stderr, "scale bench: starting the control side:", err)
		if b.ctl != nil {
			b.ctl.dumpLog(stderr)
		}
		return exitBroken
	}
	fmt.Fprintf(stdout, "fleet scale bench — %s, %d cores, load %s, %s nodes requested, heartbeat %s\n",
		b.res.Host.Date, b.res.Host.Cores, b.res.Host.LoadStart, thousands(c.nodes), c.heartbeat)
	if b.servers != nil {
		form := "its accounts from a file serve keeps, nodes sharing one"
		if c.resolver {
			form = "in NATS operator mode, an account per node"
		}
		fmt.Fprintf(stdout, "control side: mesh-control serve, pid %d, against a three-server NATS cluster (%s; %s); agents: this process, pid %d\n", b.ctl.pid(), b.servers.urls, form, os.Getpid())
	} else {
		fmt.Fprintf(stdout, "control side: mesh-control serve (embedded broker), pid %d; agents: this process, pid %d\n", b.ctl.pid(), os.Getpid())
	}
	if c.contended {
		if b.burner, err = startBurner(); err != nil {
			fmt.Fprintln(stderr, "scale bench:", err)
			return exitBroken
		}
		b.res.Contended = true
		fmt.Fprintf(stdout, "contended: a process of the bench's own (pid %d) spins on one core from now to the end; the contended targets are judged\n", b.burner.cmd.Process.Pid)
	}
	fmt.Fprintf(stdout, "broker: %s\n", brokerBuild(b.ctl.bin))
	fmt.Fprintf(stdout, "JetStream: %s\n", syncMode(b.ctl.bin))
	fmt.Fprintf(stdout, "fan-out window: %s\n\n", windowMode())

	type step struct {
		name string
		f    func(context.Context) error
	}
	steps := []step{
		{"registration", b.register},
		{"linking the agents", b.link},
		{"fan-out, just linked", b.fanoutFresh},
		{"idle", b.idleWindow},
		{"fan-out, after idle", b.fanoutIdle},
		{"stop + start", b.restart},
		{"overlay set", b.overlay},
	}
	if c.declaresOnly {
		steps = []step{steps[0], {"declares, no agent linked", b.declaresOnly}}
	} else if c.cluster {
		// The cluster's target is its servers' idle CPU; the embedded
		// broker's restart and the overlay are not measured on it. After
		// idle, a fan-out with every server up, then the one that stops a
		// server mid-way.
		steps = append(steps[:4:4], step{"fan-out, after idle, every server up", b.fanoutAllUp}, steps[4])
	}
	for _, s := range steps {
		if ctx.Err() != nil {
			break
		}
		log.Info("phase: " + s.name)
		if b.fleet != nil {
			b.fleet.SetPhase(s.name)
		}
		if err := s.f(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			fmt.Fprintf(stderr, "scale bench: %s: %v\n", s.name, err)
			b.ctl.dumpLog(stderr)
			b.printTable(stdout)
			return b.finish(stdout, stderr, exitBroken)
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "scale bench: interrupted")
		return exitBroken
	}
	b.res.Host.LoadEnd = loadAverage()
	b.fleet.SetPhase("teardown")
	if b.burner != nil {
		b.res.BurnerCPU = b.burner.stop()
		b.burner = nil
	}
	if c.declaresOnly {
		b.printDeclares(stdout)
		return b.finish(stdout, stderr, exitOK)
	}
	b.printTable(stdout)
	if b.res.Contended {
		fmt.Fprintf(stdout, "\ncontended: the burner took %.0f %% of a core over the run\n", b.res.BurnerCPU)
	}
	code := exitOK
	if n := b.fleet.Garbage.Load(); n > 0 {
		fmt.Fprintf(stderr, "scale bench: the stand-ins refused %d declarations (not signed, not theirs, or replayed): the system did not do its job\n", n)
		code = exitWrong
	}
	return b.finish(stdout, stderr, code)
}

func checkConfig(c config) error {
	switch {
	case c.nodes < 1:
		return fmt.Errorf("-nodes must be at least 1")
	case !filepath.IsAbs(c.dir):
		return fmt.Errorf("-dir must be absolute")
	case c.registerWorkers < 1 || c.startBatch < 1 || c.maxRefusals < 1:
		return fmt.Errorf("-register-workers, -start-batch and -max-refusals must be at least 1")
	case c.heartbeat < time.Second:
		return fmt.Errorf("-heartbeat must be at least 1s")
	}
	return nil
}

// hostInfo is what the figures were measured on.
type host struct {
	Date      string `json:"date"`
	Cores     int    `json:"cores"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
	NoFile    uint64 `json:"nofile"`
}

func hostInfo() host {
	h := host{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Cores: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAverage()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	h.NoFile, _, _ = openFiles()
	return h
}

// loadAverage is the machine's 1-minute load: others share this machine.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// buildControl builds mesh-control into dir, when no -control was given.
func buildControl(ctx context.Context, dir string, profile, syncDefault bool) (string, error) {
	out := filepath.Join(dir, "mesh-control")
	args := []string{"build", "-trimpath", "-o", out}
	var tags []string
	if profile {
		tags = append(tags, "benchprofile")
	}
	if syncDefault {
		tags = append(tags, "benchnosync")
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/mesh-control")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building mesh-control (run from the repository, or give -control): %w\n%s", err, b)
	}
	return out, nil
}

// windowMode says how this bench's fan-outs hold their window: adapting,
// as shipped, or held constant by a comparison build (TAGS=benchconstwindow).
func windowMode() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-tags" && strings.Contains(s.Value, "benchconstwindow") {
				return "held at 256 (a comparison build: TAGS=benchconstwindow)"
			}
		}
	}
	return "adapting to the broker's answers (as shipped)"
}

// syncMode says how bin's broker syncs JetStream: the fan-out's figures
// include an fsync before each acknowledgement unless it was built for the
// comparison (-sync-default).
func syncMode(bin string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && strings.Contains(s.Value, "benchnosync") {
			return "nats-server's default sync interval (a comparison build: acknowledged writes not durable)"
		}
	}
	return "sync_interval always (an fsync before each acknowledgement, as shipped)"
}

// brokerBuild says which nats-server bin links, and whether it is the
// module as published: a replaced one (a workspace, a replace directive)
// moves the fan-out's and memory's figures, and is said.
func brokerBuild(bin string) string {
	const mod = "github.com/nats-io/nats-server/v2"
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	for _, d := range info.Deps {
		if d.Path != mod {
			continue
		}
		if d.Replace != nil {
			return fmt.Sprintf("nats-server %s REPLACED by %s (not as published)", d.Version, d.Replace.Path)
		}
		return fmt.Sprintf("nats-server %s as published", d.Version)
	}
	return "nats-server not linked"
}

// quiet is a logger for the bench's own control-side connection.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// keysOf loads the control side's keys (the bench declares with them, as
// mesh-control does).
func keysOf(dir string) (*control.Keys, error) {
	k, err := control.LoadKeys(dir)
	if err != nil {
		return nil, fmt.Errorf("the control side's keys: %w", err)
	}
	return k, nil
}

// lockWork takes WORK.lock for this run: the bench empties WORK when it
// starts and removes it when it ends, so a second run on the same
// directory would tear the first one's control side away under it (both
// then failed with a missing log file). The second is refused, naming the
// first.
func lockWork(work string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(work), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(work+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(work + ".lock")
		f.Close()
		return nil, fmt.Errorf("another bench-scale (pid %s) is running in %s; wait for it, or give this one another -dir", strings.TrimSpace(string(pid)), filepath.Dir(work))
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { f.Close() }, nil
}
