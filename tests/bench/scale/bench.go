package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/tests/fleet"
	"github.com/nox-mesh/nox-mesh-host/tests/ports"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// bench is one run.
type bench struct {
	cfg config
	// burner keeps one core busy (-contended).
	burner *burner
	log    *slog.Logger
	res    *results
	ctl    *controlProc
	keys   *control.Keys
	cl     *control.Client
	fleet  *fleet.Fleet

	active []*fleet.Node // the nodes whose agents run (registered, and within the file descriptors)

	agentsCtx  context.Context
	stopAgents context.CancelFunc
	watchStop  func()
	baseline   memory // serve before any node was registered
	profiles   int    // CPU profiles written (-profile)

	// pauseMidFanout: this fan-out stops one of the cluster's servers for
	// a while (fanoutIdle, CLUSTER=1).
	pauseMidFanout bool
	// CLUSTER=1: the three servers, and the accounts file serve keeps
	// for them.
	servers  *clusterServers
	accounts string
	// resolvers are the servers' account resolvers' directories, with
	// -resolver (operator mode): each holds every node's account.
	resolvers []string
}

// results are the figures, as -json writes them.
type results struct {
	Host      host `json:"host"`
	Requested int  `json:"nodes_requested"`
	// Contended: a burner kept one core busy (-contended); BurnerCPU is
	// the share of a core it took over the run.
	Contended   bool    `json:"contended,omitempty"`
	BurnerCPU   float64 `json:"burner_cpu_percent,omitempty"`
	BaselineCPU float64 `json:"control_cpu_percent_before_nodes"`
	// ServersBaselineCPU: each cluster server's, before any node
	// (CLUSTER=1).
	ServersBaselineCPU []float64 `json:"cluster_servers_cpu_percent_before_nodes,omitempty"`

	Registered       int     `json:"nodes_registered"`
	RegisterSeconds  float64 `json:"register_seconds"`
	RegisterRefused  int     `json:"register_refused"`
	RegisterFirstErr string  `json:"register_first_error,omitempty"`
	RegisterStopped  bool    `json:"register_stopped,omitempty"`

	FDLimited   int     `json:"agents_left_out_for_file_descriptors,omitempty"`
	FDsHere     int     `json:"open_files_agents_process"`
	FDsControl  int     `json:"open_files_control"`
	Agents      int     `json:"agents"`
	Linked      int     `json:"agents_linked"`
	LinkSeconds float64 `json:"link_seconds"`

	Fanout     *fanoutResult `json:"fanout_just_linked,omitempty"`
	FanoutIdle *fanoutResult `json:"fanout_after_idle,omitempty"`
	// FanoutAllUp, CLUSTER=1: the fan-out after idle with every server
	// running, before the one that stops a server (FanoutIdle there).
	FanoutAllUp *fanoutResult `json:"fanout_after_idle_all_up,omitempty"`
	// DeclaresOnly: the fan-outs' declares with no agent linked
	// (-declares-only).
	DeclaresOnly []*fanoutResult `json:"declares_no_agent,omitempty"`
	Idle         *idleResult     `json:"idle,omitempty"`
	Restart      *restartResult  `json:"restart,omitempty"`
	Overlay      *overlayResult  `json:"overlay,omitempty"`
	AgentLog     []string        `json:"agent_warnings,omitempty"`
	Notes        []string        `json:"notes,omitempty"`
	Targets      map[string]rowJ `json:"targets,omitempty"`
}

type rowJ struct {
	Result  string `json:"result"`
	Target  string `json:"target"`
	Verdict string `json:"verdict"`
}

type fanoutResult struct {
	Nodes          int     `json:"nodes"`
	DeclareSeconds float64 `json:"declare_seconds"`
	DeclareErrors  int     `json:"declare_errors"`
	FirstError     string  `json:"first_error,omitempty"`
	Received       int     `json:"received"`
	Recorded       int     `json:"recorded"`
	ReceivedP50    float64 `json:"received_p50_seconds"`
	ReceivedP100   float64 `json:"received_p100_seconds"`
	RecordedP50    float64 `json:"recorded_p50_seconds"`
	RecordedP100   float64 `json:"recorded_p100_seconds"`
	// Stored: the reports of this fan-out's sequence the report stream
	// holds, and when it stored them (reportsStored).
	Stored     int     `json:"stored"`
	StoredP50  float64 `json:"stored_p50_seconds"`
	StoredP100 float64 `json:"stored_p100_seconds"`
	// The CPU each process used from the first declare until every node's
	// report was recorded (or the wait ended): what the two cores went to.
	ControlCPUSeconds float64 `json:"control_cpu_seconds"`
	AgentsCPUSeconds  float64 `json:"agents_cpu_seconds"`
	// ServersCPUSeconds is each cluster server's (CLUSTER=1; the embedded
	// broker's is serve's).
	ServersCPUSeconds []float64 `json:"servers_cpu_seconds,omitempty"`
	WallSeconds       float64   `json:"wall_seconds"`
	Cores             int       `json:"cores"`
	// VerifyMicros is this machine's speed just before the fan-out: one
	// ed25519 verification's time, on one goroutine. The same tree's
	// fan-out has measured 5 s and 9 s on this machine an hour apart, and
	// a fixed piece of work took as much longer in the profiles (its host
	// is shared): runs are compared on the work they did, with this beside.
	VerifyMicros float64 `json:"verify_micros"`
	// Paused, CLUSTER=1's fan-out after idle: the server stopped
	// (SIGSTOP) for PausedSeconds from PausedAt seconds after the first
	// declare, then continued — a server of the cluster that stops
	// answering mid fan-out, and every node must still record.
	Paused        string  `json:"paused_server,omitempty"`
	PausedAt      float64 `json:"paused_at_seconds,omitempty"`
	PausedSeconds float64 `json:"paused_seconds,omitempty"`
}

type idleResult struct {
	WindowSeconds float64 `json:"window_seconds"`
	ControlCPU    float64 `json:"control_cpu_percent"`
	AgentsCPU     float64 `json:"agents_process_cpu_percent"`
	Heartbeats    uint64  `json:"heartbeats_in_window"`
	BaselineKiB   uint64  `json:"control_rss_before_nodes_kib"`
	RSSKiB        uint64  `json:"control_rss_kib"`
	HWMKiB        uint64  `json:"control_rss_peak_kib"`
	PerNodeKiB    float64 `json:"control_kib_per_node"`
	AgentsRSSKiB  uint64  `json:"agents_process_rss_kib"`
	// Servers are the cluster's servers (CLUSTER=1).
	Servers []clusterServerResult `json:"cluster_servers,omitempty"`
}

type restartResult struct {
	Nodes            int     `json:"nodes"`
	StopSeconds      float64 `json:"stop_seconds"`
	Killed           bool    `json:"killed"`
	StartSeconds     float64 `json:"start_seconds"`
	StartError       string  `json:"start_error,omitempty"`
	Reconnected      int     `json:"reconnected"`
	LinkedP100       float64 `json:"all_linked_after_serving_seconds"`
	TotalSeconds     float64 `json:"stop_to_all_linked_seconds"`
	Reconciled       int     `json:"executors_told"`
	ReconciledP100   float64 `json:"stop_to_all_executors_told_seconds"`
	ReconnectTimeout bool    `json:"cut_off"`
}

type overlayResult struct {
	Nodes          int     `json:"nodes"`
	BindSeconds    float64 `json:"bind_keys_seconds"`
	CommandSeconds float64 `json:"command_seconds"`
	CommandDone    bool    `json:"command_done"`
	CommandError   string  `json:"command_error,omitempty"`
	Applied        int     `json:"applied"`
	Recorded       int     `json:"recorded"`
	AppliedP50     float64 `json:"applied_p50_seconds"`
	AppliedP100    float64 `json:"applied_p100_seconds"`
	RecordedP100   float64 `json:"recorded_p100_seconds"`
	CutOff         bool    `json:"cut_off"`
	Skipped        string  `json:"skipped,omitempty"`
	// RosterBytes is the size of the roster the first node took last.
	RosterBytes int `json:"roster_bytes,omitempty"`
	// The CPU each process used from the command's start until every
	// node had applied and recorded (or the time was up): serve, this
	// process (the agents), the command itself (to its end).
	ControlCPUSeconds float64 `json:"control_cpu_seconds"`
	AgentsCPUSeconds  float64 `json:"agents_cpu_seconds"`
	CommandCPUSeconds float64 `json:"command_cpu_seconds"`
	// RostersHanded is how many rosters the agents handed their
	// stand-ins meanwhile (each one read of the broker).
	RostersHanded int64 `json:"rosters_handed"`
}

// setup starts the control side in work, connects the bench to it and
// reads its memory before any node exists.
func (b *bench) setup(ctx context.Context, work string) error {
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	logs := filepath.Join(work, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	bin := b.cfg.controlBin
	if bin == "" {
		var err error
		if bin, err = buildControl(ctx, filepath.Join(work, "bin"), b.cfg.profile != "", b.cfg.syncDefault); err != nil {
			return err
		}
	}
	if b.cfg.cluster {
		if err := b.setupCluster(ctx, work, bin); err != nil {
			return err
		}
	} else {
		port, err := ports.Free()
		if err != nil {
			return err
		}
		b.ctl = &controlProc{profile: b.cfg.profile, bin: bin, dir: filepath.Join(work, "control"), logs: logs, listen: fmt.Sprintf("127.0.0.1:%d", port)}
		if _, err := b.ctl.run(ctx, "init", "init", "--dir", b.ctl.dir, "--url", b.ctl.url()); err != nil {
			return err
		}
		if err := b.ctl.start(); err != nil {
			return err
		}
		if err := b.ctl.waitServing(ctx, time.Minute); err != nil {
			return err
		}
		if b.keys, err = keysOf(b.ctl.dir); err != nil {
			return err
		}
		if b.cl, err = control.Connect(ctx, b.keys, b.ctl.url(), quiet); err != nil {
			return fmt.Errorf("connecting to the control side's broker: %w", err)
		}
	}
	b.fleet = fleet.New(b.keys.ControlPublic(), b.cfg.heartbeat)
	b.agentsCtx, b.stopAgents = context.WithCancel(context.Background())
	if err := b.watchReports(ctx); err != nil {
		return err
	}
	// Before any node: the control side's own idle CPU over a window, and
	// its memory after it.
	sleep(ctx, 2*time.Second)
	pid := b.ctl.pid()
	c0, err := sampleCPU(pid)
	if err != nil {
		return err
	}
	var s0 serverSample
	if b.servers != nil {
		if s0, err = b.sampleServers(); err != nil {
			return err
		}
	}
	sleep(ctx, baselineWindow)
	c1, err := sampleCPU(pid)
	if err != nil {
		return err
	}
	b.res.BaselineCPU = cpuPercent(c0, c1)
	if b.servers != nil {
		s1, err := b.sampleServers()
		if err != nil {
			return err
		}
		for i := range s0 {
			b.res.ServersBaselineCPU = append(b.res.ServersBaselineCPU, cpuPercent(s0[i], s1[i]))
		}
	}
	if b.baseline, err = readMemory(pid); err != nil {
		return err
	}
	return ctx.Err()
}

// brokerURL is what a node is given as its broker: every server's
// address on a cluster ("" is the control side's own).
func (b *bench) brokerURL() string {
	if b.servers != nil {
		return b.servers.urls
	}
	return ""
}

// baselineWindow is how long the control side's CPU is read before any
// node is registered.
const baselineWindow = 10 * time.Second

// watchReports follows the registry's report.<node> keys, which the
// control side's recorder writes once it has taken a node's report in:
// what "recorded" means in the fan-out and the overlay.
func (b *bench) watchReports(ctx context.Context) error {
	if b.watchStop != nil {
		b.watchStop()
	}
	w, err := b.cl.KV.WatchFiltered(ctx, []string{"report.*"}, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("watching the recorded reports: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			at := time.Now()
			var r fleet.ReportHead
			if json.Unmarshal(e.Value(), &r) != nil {
				continue
			}
			if n := b.fleet.ByName[r.Node]; n != nil && "report."+r.Node == e.Key() {
				n.NoteRecorded(fleet.Event{Seq: r.Seq, At: at, Trigger: r.Trigger, Overlay: r.OverlayApplied()})
			}
		}
	}()
	b.watchStop = func() {
		w.Stop()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	return nil
}

func nodeName(i int) string { return fmt.Sprintf("n%05d", i+1) }

// register adds the nodes as `node add` does, a few at a time, until they
// are all in or the control side has refused maxRefusals in a row.
func (b *bench) register(ctx context.Context) error {
	n := b.cfg.nodes
	cfgs := make([]*agent.Config, n)
	next := make(chan int)
	var (
		mu        sync.Mutex
		inARow    int
		refused   int
		firstErr  string
		stopped   atomic.Bool
		wg        sync.WaitGroup
		progress  atomic.Int64
		lastPrint = time.Now()
	)
	start := time.Now()
	for w := 0; w < b.cfg.registerWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cfg, _, err := b.addNode(ctx, nodeName(i))
				mu.Lock()
				if err != nil {
					refused++
					inARow++
					if firstErr == "" {
						firstErr = fmt.Sprintf("%s: %v", nodeName(i), err)
					}
					if inARow >= b.cfg.maxRefusals {
						stopped.Store(true)
					}
				} else {
					inARow = 0
					cfgs[i] = cfg
				}
				if p := progress.Add(1); time.Since(lastPrint) > 5*time.Second {
					lastPrint = time.Now()
					b.log.Info("registering", "done", p, "of", n, "refused", refused)
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n && !stopped.Load() && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	b.res.RegisterSeconds = time.Since(start).Seconds()
	b.res.RegisterRefused, b.res.RegisterFirstErr, b.res.RegisterStopped = refused, firstErr, stopped.Load()
	for _, cfg := range cfgs {
		if cfg == nil {
			continue
		}
		if _, err := b.fleet.Add(cfg); err != nil {
			return err
		}
	}
	b.res.Registered = len(b.fleet.Nodes)
	b.log.Info("registered", "nodes", b.res.Registered, "of", n, "refused", refused, "seconds", fmt.Sprintf("%.1f", b.res.RegisterSeconds), "first_refusal", firstErr)
	if b.res.Registered == 0 {
		return fmt.Errorf("no node could be registered: %s", firstErr)
	}
	return ctx.Err()
}

// fdMargin is what the bench keeps of its file descriptors for itself
// (its own connection, logs, the Go runtime) beyond one per agent.
const fdMargin = 200

// link starts the agents in batches, each waited for until every agent in
// it says it linked. Each holds one NATS connection (one file descriptor
// here; its executor is a pipe, none): as many as the process's open-file
// limit allows.
func (b *bench) link(ctx context.Context) error {
	soft, _, err := openFiles()
	if err != nil {
		return err
	}
	fit := int(soft) - fdsInUse() - fdMargin
	if fit < 1 {
		return fmt.Errorf("the open-file limit (%d) leaves no room for an agent's connection", soft)
	}
	nodes := b.fleet.Nodes
	if len(nodes) > fit {
		b.res.FDLimited = len(nodes) - fit
		note := fmt.Sprintf("file descriptors: %s agents (one NATS connection each) do not fit this process's open-file limit of %d; %s are started, %s left out",
			thousands(len(nodes)), soft, thousands(fit), thousands(len(nodes)-fit))
		b.res.Notes = append(b.res.Notes, note)
		b.log.Warn(note)
		nodes = nodes[:fit]
	}
	b.active = nodes
	b.res.Agents = len(nodes)
	if err := b.waitAccounts(ctx); err != nil {
		return err
	}
	start := time.Now()
	var last time.Time
	for i := 0; i < len(nodes); i += b.cfg.startBatch {
		batch := nodes[i:min(i+b.cfg.startBatch, len(nodes))]
		for _, n := range batch {
			n.Start(b.agentsCtx)
		}
		waitFor(ctx, b.cfg.linkTimeout, func() bool {
			for _, n := range batch {
				if _, ok := n.LinkedAfter(start); !ok {
					return false
				}
			}
			return true
		})
		b.log.Info("agents started", "started", i+len(batch), "of", len(nodes))
	}
	linked := 0
	for _, n := range nodes {
		if t, ok := n.LinkedAfter(start); ok {
			linked++
			if t.After(last) {
				last = t
			}
		}
	}
	b.res.Linked = linked
	b.res.FDsHere, b.res.FDsControl = fdsInUse(), fdsOf(fmt.Sprint(b.ctl.pid()))
	if !last.IsZero() {
		b.res.LinkSeconds = last.Sub(start).Seconds()
	}
	if linked < len(nodes) {
		note := fmt.Sprintf("%s of %s agents never linked (within %s a batch)", thousands(len(nodes)-linked), thousands(len(nodes)), b.cfg.linkTimeout)
		b.res.Notes = append(b.res.Notes, note)
		b.log.Warn(note)
	}
	if linked == 0 {
		return fmt.Errorf("no agent linked: %v", b.fleet.LogSummary())
	}
	return ctx.Err()
}

// verifyMicros times ed25519 verifications on this goroutine (the work
// the fan-out does most of, 30,000 times) and returns one's time in µs:
// the best of five rounds, so a moment's preemption does not count.
func verifyMicros() float64 {
	pub, priv, _ := ed25519.GenerateKey(nil)
	msg := []byte("the machine's speed")
	sig := ed25519.Sign(priv, msg)
	const n = 400
	best := time.Duration(1<<63 - 1)
	for range 5 {
		start := time.Now()
		for range n {
			ed25519.Verify(pub, msg, sig)
		}
		best = min(best, time.Since(start))
	}
	return float64(best.Microseconds()) / n
}

// fanoutBody is the declaration declared to every node: one small file.
func fanoutBody() []byte {
	return fmt.Appendf(nil, `{"version":1,"resources":[{"module":"bench","id":"fanout","type":"file","path":"/var/lib/mesh-bench/fanout","content":"fan-out %d\n","mode":"0644"}]}`, time.Now().UnixNano())
}

// fanoutFresh is the fan-out to a fleet that has just linked: every agent
// is waiting on its first pull.
func (b *bench) fanoutFresh(ctx context.Context) error {
	r, err := b.fanout(ctx)
	b.res.Fanout = r
	return err
}

// fanoutAllUp is CLUSTER=1's fan-out after idle with every server
// running, beside the one just linked (the one after it stops a server).
func (b *bench) fanoutAllUp(ctx context.Context) error {
	r, err := b.fanout(ctx)
	b.res.FanoutAllUp = r
	return err
}

// fanoutIdle is the fan-out to a fleet that has been idle for the settle
// and the idle window (a fleet's usual state when a declaration comes).
func (b *bench) fanoutIdle(ctx context.Context) error {
	if b.servers != nil {
		// Idle again after the fan-out with every server up, as the
		// fleet was before it.
		sleep(ctx, b.cfg.settle)
		b.pauseMidFanout = true
		defer func() { b.pauseMidFanout = false }()
	}
	r, err := b.fanout(ctx)
	b.res.FanoutIdle = r
	return err
}

// The cluster's server stopped mid fan-out (pauseMidFanout): which, when,
// for how long.
const (
	pausedServer = 1
	pauseAfter   = time.Second
	pauseFor     = 10 * time.Second
)

// pauseServer stops the cluster's pausedServer pauseAfter from now for
// pauseFor, then continues it, and says so in r; done is closed once it
// runs again.
func (b *bench) pauseServer(ctx context.Context, r *fanoutResult) (done chan struct{}) {
	done = make(chan struct{})
	pid := b.servers.pid(pausedServer)
	if pid == 0 {
		close(done)
		return done
	}
	r.Paused, r.PausedAt, r.PausedSeconds = b.servers.names[pausedServer], pauseAfter.Seconds(), pauseFor.Seconds()
	go func() {
		defer close(done)
		sleep(ctx, pauseAfter)
		syscall.Kill(pid, syscall.SIGSTOP)
		b.log.Info("cluster server stopped (SIGSTOP)", "server", r.Paused)
		sleep(ctx, pauseFor)
		syscall.Kill(pid, syscall.SIGCONT)
		b.log.Info("cluster server continued (SIGCONT)", "server", r.Paused)
	}()
	return done
}

// fanout declares one declaration to every running node, several declares
// in flight, and times each node's receipt and recorded report from the
// first declare.
func (b *bench) fanout(ctx context.Context) (*fanoutResult, error) {
	// This process holds the 10,000 simulated agents in one heap (2 GB):
	// a collection of it landing in the window by chance was up to 0.9 s
	// of CPU on the two cores the fan-out shares, a cost of
	// the simulation — each real agent collects its own small heap, on
	// its own machine. Collected before the window (and its profiles),
	// not in it.
	runtime.GC()
	defer b.profiled("fanout")()
	nodes := b.active
	body := fanoutBody()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	speed := verifyMicros()
	cpu0 := b.markCPU()
	// What `mesh-control declare n1,n2,... FILE` does: one DeclareAll.
	start := time.Now()
	var paused fanoutResult
	if b.pauseMidFanout {
		pausing := b.pauseServer(ctx, &paused)
		defer func() { <-pausing }() // running again before the next measure
	}
	seqs, derrs := b.cl.DeclareAll(ctx, names, body)
	errs, firstErr := declareFailures(names, derrs)
	declared := time.Since(start)
	b.log.Info("declared", "nodes", len(nodes), "seconds", fmt.Sprintf("%.2f", declared.Seconds()), "errors", errs)
	var received, recorded []time.Duration
	tally := func() bool {
		received, recorded = received[:0], recorded[:0]
		for i, n := range nodes {
			if seqs[i] == 0 {
				continue
			}
			if t, ok := n.ReceivedAt(seqs[i]); ok {
				received = append(received, t.Sub(start))
			}
			if t, ok := n.RecordedAt(seqs[i]); ok {
				recorded = append(recorded, t.Sub(start))
			}
		}
		return len(received) == len(nodes) && len(recorded) == len(nodes)
	}
	waitFor(ctx, b.cfg.fanoutTimeout-time.Since(start), tally)
	tally()
	cpu1 := b.markCPU()
	wall := time.Since(start) // the CPU's window: not the reading of the stored times below
	want := make(map[string]uint64, len(nodes))
	for i, n := range nodes {
		if seqs[i] != 0 {
			want[n.Name] = seqs[i]
		}
	}
	stored, serr := b.reportsStored(ctx, want, start)
	if serr != nil {
		b.log.Warn("reading when the reports were stored", "err", serr)
	}
	r := &fanoutResult{Nodes: len(nodes), DeclareSeconds: declared.Seconds(), DeclareErrors: errs, FirstError: firstErr,
		WallSeconds: wall.Seconds(), Cores: runtime.NumCPU(), VerifyMicros: speed,
		Received: len(received), Recorded: len(recorded),
		ReceivedP50: percentile(received, 50).Seconds(), ReceivedP100: percentile(received, 100).Seconds(),
		RecordedP50: percentile(recorded, 50).Seconds(), RecordedP100: percentile(recorded, 100).Seconds(),
		Stored: len(stored), StoredP50: percentile(stored, 50).Seconds(), StoredP100: percentile(stored, 100).Seconds()}
	r.Paused, r.PausedAt, r.PausedSeconds = paused.Paused, paused.PausedAt, paused.PausedSeconds
	cpu1.since(cpu0, r)
	b.log.Info("fan-out", "received", r.Received, "recorded", r.Recorded, "of", len(nodes),
		"received_p100", seconds(percentile(received, 100)), "stored_p100", seconds(percentile(stored, 100)),
		"recorded_p100", seconds(percentile(recorded, 100)))
	return r, ctx.Err()
}

// reportsStored reads, for each node of want, when the report stream
// stored its report of the sequence wanted (the broker's timestamp, on
// this machine's clock), from start: between a node's receipt and its
// recorded report are two writes, the agent's report into the stream and
// the recorder's copy into the registry, and this says which of them the
// time went to.
func (b *bench) reportsStored(ctx context.Context, want map[string]uint64, start time.Time) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out []time.Duration
	for _, p := range link.ReportPlaces() {
		// As many as the stream has subjects (nodes) when asked: a
		// replicated stream's consumer may have nothing at hand the moment
		// it is asked, and an empty fetch is no end of it.
		st, err := b.cl.JS.Stream(ctx, p.Stream)
		if err != nil {
			return out, err
		}
		subjects := st.CachedInfo().State.NumSubjects
		if subjects == 0 {
			continue
		}
		cons, err := b.cl.JS.OrderedConsumer(ctx, p.Stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{p.Subjects}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
		if err != nil {
			return out, err
		}
		for read := uint64(0); read < subjects; {
			if ctx.Err() != nil {
				return out, fmt.Errorf("%s: %d of its %d nodes' last reports read: %w", p.Stream, read, subjects, ctx.Err())
			}
			batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				return out, err
			}
			for m := range batch.Messages() {
				read++
				md, err := m.Metadata()
				if err != nil {
					continue
				}
				var r struct {
					Node string `json:"node"`
					Seq  uint64 `json:"seq"`
				}
				if json.Unmarshal(m.Data(), &r) == nil && r.Seq != 0 && want[r.Node] == r.Seq && link.ReportNode(m.Subject()) == r.Node {
					out = append(out, md.Timestamp.Sub(start))
				}
			}
			if batch.Error() != nil && !errors.Is(batch.Error(), nats.ErrTimeout) {
				return out, batch.Error()
			}
		}
	}
	return out, nil
}

// idleWindow lets the fleet settle, then reads the control side's CPU over
// the window and its memory after it.
func (b *bench) idleWindow(ctx context.Context) error {
	sleep(ctx, b.cfg.settle)
	defer b.profiled("idle")()
	pid := b.ctl.pid()
	if pid == 0 {
		return errors.New("mesh-control serve is not running")
	}
	hb0 := b.heartbeatSeq(ctx)
	c0, err := sampleCPU(pid)
	if err != nil {
		return err
	}
	var s0 serverSample
	if b.servers != nil {
		if s0, err = b.sampleServers(); err != nil {
			return err
		}
	}
	a0, err := sampleCPU(os.Getpid())
	if err != nil {
		return err
	}
	b.log.Info("idle window", "seconds", b.cfg.idle.Seconds())
	sleep(ctx, b.cfg.idle)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c1, err := sampleCPU(pid)
	if err != nil {
		return err
	}
	var servers []clusterServerResult
	if b.servers != nil {
		s1, err := b.sampleServers()
		if err != nil {
			return err
		}
		if servers, err = b.serversIdle(s0, s1); err != nil {
			return err
		}
	}
	a1, err := sampleCPU(os.Getpid())
	if err != nil {
		return err
	}
	hb1 := b.heartbeatSeq(ctx)
	mem, err := readMemory(pid)
	if err != nil {
		return err
	}
	own, err := readMemory(os.Getpid())
	if err != nil {
		return err
	}
	r := &idleResult{WindowSeconds: c1.at.Sub(c0.at).Seconds(), ControlCPU: cpuPercent(c0, c1), AgentsCPU: cpuPercent(a0, a1),
		BaselineKiB: b.baseline.RSS, RSSKiB: mem.RSS, HWMKiB: mem.HWM, AgentsRSSKiB: own.RSS, Servers: servers}
	if hb1 >= hb0 {
		r.Heartbeats = hb1 - hb0
	}
	if n := len(b.active); n > 0 && mem.RSS > b.baseline.RSS {
		r.PerNodeKiB = float64(mem.RSS-b.baseline.RSS) / float64(n)
	}
	b.res.Idle = r
	b.log.Info("idle", "control_cpu_percent", fmt.Sprintf("%.2f", r.ControlCPU), "control_rss_mib", r.RSSKiB/1024, "per_node_kib", fmt.Sprintf("%.1f", r.PerNodeKiB), "heartbeats", r.Heartbeats)
	return nil
}

// heartbeatSeq is the heartbeat stream's last sequence: how many
// heartbeats the broker has stored so far.
func (b *bench) heartbeatSeq(ctx context.Context) uint64 {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := b.cl.JS.Stream(cctx, link.HeartbeatStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(cctx)
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

// restart stops serve as an init would, starts it again, and waits for
// every agent to link again.
func (b *bench) restart(ctx context.Context) error {
	nodes := b.active
	r := &restartResult{Nodes: len(nodes)}
	b.res.Restart = r
	stopAt := time.Now()
	endProfile := b.profiledRestart()
	defer endProfile()
	stopped, killed := b.ctl.stop(b.cfg.stopTimeout)
	r.StopSeconds, r.Killed = stopped.Seconds(), killed
	b.log.Info("serve stopped", "seconds", fmt.Sprintf("%.1f", r.StopSeconds), "killed", killed)
	startAt := time.Now()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if err = b.ctl.start(); err == nil {
			err = b.ctl.waitServing(ctx, 2*time.Minute)
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		if r.StartError == "" {
			r.StartError = err.Error()
		}
		b.log.Warn("serve did not start again; trying once more", "err", err)
		b.ctl.stop(10 * time.Second)
	}
	if err != nil {
		r.StartError = err.Error()
		return nil // measured: it does not come back
	}
	servingAt := time.Now()
	r.StartSeconds = servingAt.Sub(startAt).Seconds()
	b.log.Info("serve started", "seconds", fmt.Sprintf("%.1f", r.StartSeconds))
	tally := func() bool {
		r.Reconnected, r.Reconciled = 0, 0
		var lastLink, lastTold time.Time
		for _, n := range nodes {
			if t, ok := n.LinkedAfter(stopAt); ok {
				r.Reconnected++
				if t.After(lastLink) {
					lastLink = t
				}
			}
			if t, ok := n.ReconciledAfter(stopAt); ok {
				r.Reconciled++
				if t.After(lastTold) {
					lastTold = t
				}
			}
		}
		if !lastLink.IsZero() {
			r.TotalSeconds = lastLink.Sub(stopAt).Seconds()
			r.LinkedP100 = max(0, lastLink.Sub(servingAt).Seconds())
		}
		if !lastTold.IsZero() {
			r.ReconciledP100 = lastTold.Sub(stopAt).Seconds()
		}
		return r.Reconnected == len(nodes) && r.Reconciled == len(nodes)
	}
	r.ReconnectTimeout = !waitFor(ctx, b.cfg.restartTimeout-time.Since(stopAt), tally)
	tally()
	endProfile()
	b.log.Info("reconnected", "linked", r.Reconnected, "executors_told", r.Reconciled, "of", len(nodes), "stop_to_all_linked_seconds", fmt.Sprintf("%.1f", r.TotalSeconds))
	// The bench's own watch of the registry is made again on the new
	// broker, whatever the client library did with the old one.
	if err := b.watchReports(ctx); err != nil {
		return err
	}
	return ctx.Err()
}

// overlay binds a WireGuard key to up to overlayNodes node records (what
// enrolment records; the nodes were registered by hand, which binds none),
// then runs `mesh-control overlay set` as an operator does, and times
// every node's receipt of its overlay and the record of its report.
func (b *bench) overlay(ctx context.Context) error {
	r := &overlayResult{}
	b.res.Overlay = r
	if b.res.Restart != nil && b.res.Restart.StartError != "" && b.ctl.pid() == 0 {
		r.Skipped = "serve did not start again"
		return nil
	}
	nodes := b.active
	if b.cfg.overlayNodes > 0 && len(nodes) > b.cfg.overlayNodes {
		nodes = nodes[:b.cfg.overlayNodes]
	}
	r.Nodes = len(nodes)
	bindAt := time.Now()
	for _, n := range nodes {
		if err := b.bindKey(ctx, n.Name); err != nil {
			return err
		}
	}
	r.BindSeconds = time.Since(bindAt).Seconds()
	b.log.Info("WireGuard keys bound", "nodes", len(nodes), "seconds", fmt.Sprintf("%.1f", r.BindSeconds))
	sleep(ctx, 2*time.Second)

	endProfile := b.profiled("overlay")
	cpu0 := b.markCPU()
	rosters0 := b.fleet.Rosters.Load()
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, b.cfg.overlayTimeout)
	defer cancel()
	cmdDone := make(chan error, 1)
	go func() {
		took, cpu, err := b.ctl.runCPU(cctx, "overlay-set", "overlay", "set", "--dir", b.ctl.dir)
		r.CommandSeconds, r.CommandCPUSeconds = took.Seconds(), cpu.Seconds()
		cmdDone <- err
	}()
	var applied, recorded []time.Duration
	tally := func() bool {
		applied, recorded = applied[:0], recorded[:0]
		for _, n := range nodes {
			a, rec := n.OverlayAt(start, len(nodes))
			if !a.IsZero() {
				applied = append(applied, a.Sub(start))
			}
			if !rec.IsZero() {
				recorded = append(recorded, rec.Sub(start))
			}
		}
		return len(applied) == len(nodes) && len(recorded) == len(nodes)
	}
	lastPrint := time.Now()
	r.CutOff = !waitFor(ctx, b.cfg.overlayTimeout, func() bool {
		done := tally()
		if time.Since(lastPrint) > 10*time.Second {
			lastPrint = time.Now()
			b.log.Info("overlay", "applied", len(applied), "recorded", len(recorded), "of", len(nodes))
		}
		return done
	})
	tally()
	var cpu fanoutResult
	b.markCPU().since(cpu0, &cpu)
	r.ControlCPUSeconds, r.AgentsCPUSeconds = cpu.ControlCPUSeconds, cpu.AgentsCPUSeconds
	r.RostersHanded = b.fleet.Rosters.Load() - rosters0
	endProfile()
	if len(nodes) > 0 {
		r.RosterBytes = nodes[0].RosterBytes()
	}
	r.Applied, r.Recorded = len(applied), len(recorded)
	r.AppliedP50, r.AppliedP100 = percentile(applied, 50).Seconds(), percentile(applied, 100).Seconds()
	r.RecordedP100 = percentile(recorded, 100).Seconds()
	// Every node has it (or the time is up): the command may still be
	// publishing; it has what is left of the time to end by itself, and
	// is ended (SIGTERM) after.
	var cmdErr error
	select {
	case cmdErr = <-cmdDone:
	case <-cctx.Done():
		cmdErr = <-cmdDone
	}
	r.CommandDone = cmdErr == nil
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case cmdErr != nil && cctx.Err() != nil:
		r.CommandError = fmt.Sprintf("still running when cut off at %s, and ended", b.cfg.overlayTimeout)
	case cmdErr != nil:
		r.CommandError = cmdErr.Error()
	}
	b.log.Info("overlay set", "applied", r.Applied, "recorded", r.Recorded, "of", r.Nodes, "applied_p100", fmt.Sprintf("%.1f", r.AppliedP100), "cut_off", r.CutOff)
	return ctx.Err()
}

// bindKey gives node's registry record a WireGuard public key, as
// enrolment records the one its executor made.
func (b *bench) bindKey(ctx context.Context, node string) error {
	var k [32]byte
	rand.Read(k[:])
	for attempt := 0; attempt < 10; attempt++ {
		rec, rev, err := b.cl.Node(ctx, node)
		if err != nil {
			return err
		}
		rec.Keys = &wire.EnrolKeys{WireGuard: base64.StdEncoding.EncodeToString(k[:])}
		data, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if _, err = b.cl.KV.Update(ctx, "node."+node, data, rev); err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("binding a WireGuard key to %s: %w", node, err)
		}
	}
	return fmt.Errorf("binding a WireGuard key to %s: the record kept changing", node)
}

// teardown ends the agents and serve, and removes the work directory.
func (b *bench) teardown(work string) {
	if b.stopAgents != nil {
		b.stopAgents()
		deadline := time.After(30 * time.Second)
		for _, n := range b.fleet.Nodes {
			if !n.Stopped(deadline) {
				b.log.Warn("agents did not all stop within 30s")
				break
			}
		}
	}
	if b.watchStop != nil {
		b.watchStop()
	}
	if b.cl != nil {
		b.cl.Close()
	}
	if b.ctl != nil {
		if took, killed := b.ctl.stop(b.cfg.stopTimeout); killed {
			b.log.Warn("serve did not stop; killed", "after", took)
		}
	}
	if b.servers != nil {
		b.servers.stop()
	}
	if b.cfg.keep {
		b.log.Info("kept " + work)
		return
	}
	if err := os.RemoveAll(work); err != nil {
		b.log.Warn("removing the work directory", "dir", work, "err", err)
	}
}

// finish writes the JSON, if asked, and the agents' warnings, and returns
// code.
func (b *bench) finish(stdout, stderr io.Writer, code int) int {
	if b.fleet != nil {
		b.res.AgentLog = b.fleet.LogSummary()
		if len(b.res.AgentLog) > 0 {
			fmt.Fprintln(stdout, "\nwhat the agents and stand-ins said (warnings and errors, by message):")
			for _, l := range b.res.AgentLog {
				fmt.Fprintln(stdout, "  "+l)
			}
		}
	}
	for _, n := range b.res.Notes {
		fmt.Fprintln(stdout, "note: "+n)
	}
	if b.cfg.jsonOut != "" {
		data, err := json.MarshalIndent(b.res, "", "  ")
		if err == nil {
			err = os.WriteFile(b.cfg.jsonOut, append(data, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintln(stderr, "scale bench: writing the figures:", err)
			return exitBroken
		}
		fmt.Fprintf(stdout, "\nfigures written to %s\n", b.cfg.jsonOut)
	}
	return code
}

// waitFor calls done every 200 ms until it says true (true), or within
// passes or ctx ends (false).
func waitFor(ctx context.Context, within time.Duration, done func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if done() {
			return true
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// declaresOnly times three fan-outs' declares to every registered node
// with no agent linked: what the control side and the broker take to sign
// and store the declarations, with no notice heard, no report sent, none
// recorded. Beside a fan-out's own figures it says how much of a fan-out
// is its writes' and how much the fleet's answering them (on this machine
// the agents, serve and the brokers share the cores).
func (b *bench) declaresOnly(ctx context.Context) error {
	names := make([]string, len(b.fleet.Nodes))
	for i, n := range b.fleet.Nodes {
		names[i] = n.Name
	}
	for range 3 {
		runtime.GC()
		speed := verifyMicros()
		cpu0 := b.markCPU()
		start := time.Now()
		_, derrs := b.cl.DeclareAll(ctx, names, fanoutBody())
		took := time.Since(start)
		r := &fanoutResult{Nodes: len(names), DeclareSeconds: took.Seconds(), WallSeconds: took.Seconds(), Cores: runtime.NumCPU(), VerifyMicros: speed}
		r.DeclareErrors, r.FirstError = declareFailures(names, derrs)
		b.markCPU().since(cpu0, r)
		b.log.Info("declared, no agent linked", "nodes", len(names), "seconds", fmt.Sprintf("%.2f", took.Seconds()), "errors", r.DeclareErrors)
		b.res.DeclaresOnly = append(b.res.DeclaresOnly, r)
	}
	return nil
}

// printDeclares is declaresOnly's table.
func (b *bench) printDeclares(w io.Writer) {
	fmt.Fprintf(w, "\n| declares to %s nodes, no agent linked | took | CPU |\n|---|---|---|\n", thousands(b.res.Registered))
	for i, r := range b.res.DeclaresOnly {
		fmt.Fprintf(w, "| run %d | %.2f s%s | %s |\n", i+1, r.DeclareSeconds, declareErrors(r), strings.TrimPrefix(fanoutCPU(r), "; CPU meanwhile: "))
	}
}

// cpuMark is the CPU each process had used at a moment: serve's, this
// process's (the agents'), and each cluster server's (CLUSTER=1); a
// sample that could not be read leaves its figure out.
type cpuMark struct {
	ctl, here       cpuSample
	ctlErr, hereErr error
	servers         serverSample
	serversErr      error
}

func (b *bench) markCPU() cpuMark {
	var m cpuMark
	m.ctl, m.ctlErr = sampleCPU(b.ctl.pid())
	m.here, m.hereErr = sampleCPU(os.Getpid())
	if b.servers != nil {
		m.servers, m.serversErr = b.sampleServers()
	}
	return m
}

// since fills r's CPU figures with what each process used from m0 to m.
func (m cpuMark) since(m0 cpuMark, r *fanoutResult) {
	if m0.ctlErr == nil && m.ctlErr == nil && m.ctl.ticks >= m0.ctl.ticks {
		r.ControlCPUSeconds = float64(m.ctl.ticks-m0.ctl.ticks) / clockTicks
	}
	if m0.hereErr == nil && m.hereErr == nil && m.here.ticks >= m0.here.ticks {
		r.AgentsCPUSeconds = float64(m.here.ticks-m0.here.ticks) / clockTicks
	}
	if m0.serversErr == nil && m.serversErr == nil && len(m0.servers) == len(m.servers) {
		for i := range m.servers {
			r.ServersCPUSeconds = append(r.ServersCPUSeconds, float64(m.servers[i].ticks-m0.servers[i].ticks)/clockTicks)
		}
	}
}

// declareFailures counts the declares of a DeclareAll that failed (errs,
// in names' order) and says the first.
func declareFailures(names []string, errs []error) (n int, first string) {
	for i, err := range errs {
		if err != nil {
			n++
			if first == "" {
				first = fmt.Sprintf("%s: %v", names[i], err)
			}
		}
	}
	return n, first
}
