package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/tests/ports"
)

// proc is a daemon of the run: its log, and how it ended.
type proc struct {
	name string // serve, n1/executor, n1/agent
	log  string
	cmd  *exec.Cmd
	// ended is closed when the process has been waited for.
	ended chan struct{}
	// expected is set before the run ends it on purpose: its exit is no
	// violation.
	expected bool
	stopped  bool
	// stoppedPid is the process SIGSTOP went to when it is not this one
	// (a launcher's executor).
	stoppedPid int
	// scanned is how much of the log the panic scan has read.
	scanned int64
}

func (p *proc) running() bool {
	select {
	case <-p.ended:
		return false
	default:
		return true
	}
}

// node is one machine: its own state directories and socket, its own
// network namespace (the executor's, with a private /run/wireguard, so
// that its overlay touches nothing of the machine's), its scratch tree.
type node struct {
	name  string
	base  string
	state string // the executor's state: a disk of its own, small, so it can be filled
	// sys is the node's system disk, holding the agent's state directory
	// and the tree. With loop devices, both disks are ext4 images
	// (stateImg, sysImg), so that the node's power can be cut.
	sys      string
	stateImg string
	sysImg   string
	agent    string // the agent's state directory
	sock     string
	tree     string
	wg       string // bind-mounted on /run/wireguard in the executor's mount namespace
	netns    string // /run/netns name
	exec     *proc
	agentP   *proc
	// revoked is what the control side acknowledged.
	revoked bool
	// acked is the newest sequence the control side acknowledged for it.
	acked uint64
	// filler is the file that fills the state's disk; sysFiller the
	// system disk's.
	filler    string
	sysFiller string
	// known, until knownUntil, is the known fault a violation on this node
	// is counted under.
	known      string
	knownUntil int
	// Between convergences: the tree and the newest report seen when the
	// node was last quiet, and the rescue lines since.
	before     map[string]entry
	lastReport uint64
	// enrolment is the node's as the control side last said it: reports
	// of an earlier one are not this one's state.
	enrolment string
	// histBase is the count of the executor's history when the control
	// side first said that enrolment: the applies past it are of it.
	histBase uint64
	// keepBefore: this look's reports could not be read, so before and
	// lastReport stay as they were for the next look.
	keepBefore bool
	rescue     []line
	// diverged is a node whose last convergence check hit its bound.
	diverged bool
	// skew is how far the node's clock is off now (the clock-off step):
	// its executor, agent and commands run with clock.SkewEnv set to it.
	// skewShown: the control side showed it, so a plan refused for its
	// time must say the clocks differ.
	skew      time.Duration
	skewShown bool
	// childKilled: the executor under n's launcher was killed, and the
	// step that looks for the launcher's new one has not come yet.
	childKilled bool
	// rekeyOnRoom: a rekey began while the node's system disk was full,
	// pending until there is room (its agent cannot keep its new key);
	// the view before it, to tell its new enrolment by.
	rekeyOnRoom *nodeView
	// enrolOnRoom: an enrolment with a token --node began while the
	// node's system disk was full: the token revoked the node, and its
	// agent keeps the new enrolment's NKey, and finishes it, once there is
	// room; the node's view before it.
	enrolOnRoom *nodeView
}

// env is what n's programs run with: its clock's skew.
func (n *node) env() []string {
	return append(os.Environ(), clock.SkewEnv+"="+n.skew.String())
}

// world is the whole run: the control side, the nodes, the figures.
type world struct {
	cfg    config
	bin    string
	base   string
	ctl    string
	port   int
	serve  *proc
	nodes  []*node
	procs  []*proc
	out    io.Writer
	mu     sync.Mutex
	faults map[string]int
	checks map[string]int
	// violations and known are the invariants that failed: each fails
	// the run, or is counted under its known fault.
	violations []string
	known      map[string]int
	stepN      int
	cleanup    []func()
	overlay    bool
	lastNodes  string // what mesh-control nodes --json said last
	// serveStarted: when serve was last started; a node's link that
	// began before it is the link the old serve ended, whatever the
	// executor was last told.
	serveStarted time.Time
	spares       int
	// pinsSeq is the newest statement of the broker's certificates the
	// control side made (cert rotate; 0: none): every quiet enrolled node
	// holds it within the bound (pins-in-force).
	pinsSeq uint64
	// The control side's disk: loop, whether it is an ext4 image (img,
	// the one mounted now) or a tmpfs; ctlFull, whether it is full now
	// (ctlFiller fills it); cuts, the power cuts so far.
	loop      bool
	img       string
	ctlFiller string
	ctlFull   bool
	cuts      int
	// drift is how often each executor looks for drift: never in the
	// chaos run (a repair would be a change no step made), often in the
	// soak.
	drift time.Duration
	// failedRun: the run failed (a soak's step, not only an invariant):
	// its work directory is kept for its logs.
	failedRun bool
	// archiveGrace is serve's: never in the chaos run (its archives, put
	// once at setup, are declared at any step), a minute in the soak, so
	// that what it puts is pruned within the run.
	archiveGrace time.Duration
	// archives are the run's, put at setup (putArchives).
	archives []archiveRef
	// reopenUntil is the last step at which serve may still be opening
	// the broker's store anew after the control side's disk was freed.
	reopenUntil int
}

func (w *world) logf(format string, a ...any) {
	fmt.Fprintf(w.out, format+"\n", a...)
}

func (w *world) cli(timeout time.Duration, stdin string, name string, args ...string) (string, int, error) {
	return w.cliEnv(nil, timeout, stdin, name, args...)
}

// onNode runs a mesh-executor command on n's machine (with its clock).
func (w *world) onNode(n *node, timeout time.Duration, stdin string, args ...string) (string, int, error) {
	return w.cliEnv(n.env(), timeout, stdin, "mesh-executor", args...)
}

func (w *world) cliEnv(env []string, timeout time.Duration, stdin string, name string, args ...string) (string, int, error) {
	return runProg(env, timeout, stdin, filepath.Join(w.bin, name), args...)
}

// inNetns runs one of the run's programs in n's network namespace, as its
// executor runs.
func (w *world) inNetns(n *node, timeout time.Duration, name string, args ...string) (string, int, error) {
	return runProg(n.env(), timeout, "", "nsenter", append([]string{"--net=/run/netns/" + n.netns, "--", filepath.Join(w.bin, name)}, args...)...)
}

// runProg runs prog with env and stdin, and says what it printed (its
// standard error after its output) and its exit code; an error is a
// program that could not run or did not end in timeout.
func runProg(env []string, timeout time.Duration, stdin string, prog string, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	out.Write(errb.Bytes())
	if ctx.Err() != nil {
		return out.String(), -1, fmt.Errorf("%s %s: no answer in %s", filepath.Base(prog), strings.Join(args, " "), timeout)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
		err = nil
	}
	return out.String(), code, err
}

// control runs a mesh-control client command against the run's control
// side.
func (w *world) control(args ...string) (string, int, error) {
	args = append(args, "--dir", w.ctl)
	return w.cli(90*time.Second, "", "mesh-control", args...)
}

func (w *world) start(name string, argv []string) *proc {
	logPath := filepath.Join(w.base, "logs", strings.ReplaceAll(name, "/", "-")+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if n := w.nodeNamed(strings.Split(name, "/")[0]); n != nil {
		cmd.Env = n.env()
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fi, _ := f.Stat()
	p := &proc{name: name, log: logPath, cmd: cmd, ended: make(chan struct{}), scanned: fi.Size()}
	if err := cmd.Start(); err != nil {
		panic(fmt.Sprintf("start %s: %v", name, err))
	}
	go func() { cmd.Wait(); f.Close(); close(p.ended) }()
	w.procs = append(w.procs, p)
	return p
}

// end stops p on purpose and waits for it.
func (w *world) end(p *proc, sig syscall.Signal) {
	p.expected = true
	if p.stopped {
		p.cmd.Process.Signal(syscall.SIGCONT)
		if p.stoppedPid != 0 {
			syscall.Kill(p.stoppedPid, syscall.SIGCONT)
		}
		p.stopped, p.stoppedPid = false, 0
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.ended:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.ended
	}
}

// freePort is a loopback port for a server the run starts.
func freePort() int {
	p, err := ports.Free()
	if err != nil {
		panic(err)
	}
	return p
}

// eventually polls f until it holds or bound passes; a bound hit is said.
func (w *world) eventually(bound time.Duration, f func() bool) bool {
	deadline := time.Now().Add(bound)
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

func (w *world) startServe() {
	w.serveStarted = time.Now()
	w.serve = w.start("serve", []string{filepath.Join(w.bin, "mesh-control"), "serve", "--dir", w.ctl,
		"--listen", fmt.Sprintf("127.0.0.1:%d", w.port), "--archive-grace", w.archiveGrace.String()})
	if !w.eventually(60*time.Second, func() bool { _, code, err := w.control("nodes"); return err == nil && code == 0 }) {
		w.violate(nil, "serve-up", "mesh-control serve did not answer `nodes` within 60s of its start")
	}
}

// executorArgv is the executor's command line, as the init starts it:
// mesh-launch, which starts and supervises mesh-executor serve (restarts
// it after it dies, counts its starts, rolls back, halts), in a mount
// namespace of its own where the node's wireguard directory is
// /run/wireguard, and in the node's network namespace, so that the
// wireguard-go the executor starts is the node's alone and outlives the
// executor as it would on a machine. A rollback reinstalls by copying
// (no package here) over the run's binaries, the same bytes.
func (w *world) executorArgv(n *node, state, sock string) []string {
	// The new mount namespace starts as a copy of the machine's, with
	// every control side's disk and every other node's mounted in it
	// (this run's and any other run's): each is detached there, or the
	// executor and the wireguard-go it leaves behind would hold a disk a
	// power cut has unmounted, and its loop device and deleted image, for
	// as long as they live.
	script := fmt.Sprintf(`awk '$5 ~ /\/chaos-[0-9]+-[0-9]+\/(control|n[0-9]+\/(executor|sys))$/ && index($5, %q) != 1 {print $5}' /proc/self/mountinfo | while read m; do umount -l "$m"; done; `+
		`mount --bind %q /run/wireguard && exec nsenter --net=/run/netns/%s "$0" "$@"`, n.base+"/", n.wg, n.netns)
	return []string{"unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
		filepath.Join(w.bin, "mesh-launch"), "--state", state,
		"--executor", filepath.Join(w.bin, "mesh-executor"), "--agent", filepath.Join(w.bin, "mesh-agent"),
		"--package-rollback=false", "--agent-user", "", "--notice", "", "--backoff", "1s", "--stop-timeout", "10s", "--",
		"serve", "--state", state, "--socket", sock,
		"--agent-user", "nobody", "--agent-state", n.agent, "--drift", w.drift.String(), "--build", "chaos"}
}

// executorPid is the pid of the executor n's launcher runs now, 0 when
// none does (between a death and the launcher's restart).
func (w *world) executorPid(n *node) int {
	launcher := n.exec.cmd.Process.Pid
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so after the ")".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		j := strings.IndexByte(s, '(')
		if i < 0 || j < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 || s[j+1:i] != "mesh-executor" {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == launcher {
			pid, _ := strconv.Atoi(strings.TrimSpace(s[:j]))
			return pid
		}
	}
	return 0
}

func (w *world) startExecutor(n *node) {
	argv := w.executorArgv(n, n.state, n.sock)
	p := w.start(n.name+"/executor", argv)
	n.exec = p
	if !w.eventually(30*time.Second, func() bool { _, err := os.Stat(n.sock); return err == nil || !p.running() }) || !p.running() {
		w.violate(n, "executor-up", "%s: the executor's socket %s did not appear within 30s of its start", n.name, n.sock)
	}
}

func (w *world) agentArgv(n *node) []string {
	return []string{filepath.Join(w.bin, "mesh-agent"), "--socket", n.sock, "--user", "nobody",
		"--state", n.agent, "--config", filepath.Join(n.agent, "config.json"), "--heartbeat", "1s", "--enrol-poll", "200ms"}
}

func (w *world) startAgent(n *node) {
	n.agentP = w.start(n.name+"/agent", w.agentArgv(n))
}

// setup makes the control side and the nodes, each enrolled with a token
// as an operator would.
func (w *world) setup() error {
	w.ctl = filepath.Join(w.base, "control")
	w.port = freePort()
	os.MkdirAll(filepath.Join(w.base, "logs"), 0o755)
	if out, code, err := w.cli(time.Minute, "", "mesh-control", "init", "--dir", w.ctl, "--url", fmt.Sprintf("tls://127.0.0.1:%d", w.port)); err != nil || code != 0 {
		return fmt.Errorf("mesh-control init: %v %d\n%s", err, code, out)
	}
	if err := w.moveControl(); err != nil {
		return fmt.Errorf("the control side's disk: %w", err)
	}
	w.startServe()
	if err := w.putArchives(); err != nil {
		return err
	}
	if err := os.MkdirAll("/run/wireguard", 0o755); err != nil {
		return err
	}
	for i := 1; i <= w.cfg.nodes; i++ {
		n := &node{name: fmt.Sprintf("n%d", i)}
		n.base = filepath.Join(w.base, n.name)
		n.state = filepath.Join(n.base, "executor")
		n.sys = filepath.Join(n.base, "sys")
		n.agent = filepath.Join(n.sys, "agent")
		n.sock = filepath.Join(n.base, "run", "executor.sock")
		n.tree = filepath.Join(n.sys, "tree")
		n.wg = filepath.Join(n.base, "wireguard")
		n.netns = fmt.Sprintf("chaos%d-%s", os.Getpid()%100000, n.name)
		n.filler = filepath.Join(n.state, "zz-filler")
		n.sysFiller = filepath.Join(n.sys, "zz-filler")
		if err := w.nodeDisks(n); err != nil {
			return fmt.Errorf("%s's disks: %w", n.name, err)
		}
		for _, d := range []string{n.tree, n.wg, filepath.Join(n.tree, "L"), filepath.Join(n.tree, "R"), filepath.Join(n.tree, "found")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		os.Chmod(n.base, 0o755)
		if out, err := exec.Command("ip", "netns", "add", n.netns).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %v %s", n.netns, err, out)
		}
		w.cleanup = append(w.cleanup, func() { w.endNetns(n) })
		// What the host did not create: never declared, never touched.
		os.WriteFile(filepath.Join(n.tree, "found", "notes"), []byte("the machine's own\n"), 0o600)
		os.WriteFile(filepath.Join(n.tree, "L", "found-beside"), []byte("found beside the mesh's\n"), 0o644)
		if err := makeShared(n); err != nil {
			return fmt.Errorf("%s's shared file: %w", n.name, err)
		}
		if err := setupFirewall(n); err != nil {
			return fmt.Errorf("%s's firewall: %w", n.name, err)
		}
		// What the host made is on its disk long before any power cut.
		if err := syncfs(n.sys); err != nil {
			return fmt.Errorf("%s's system disk: %w", n.name, err)
		}
		w.nodes = append(w.nodes, n)
		w.startExecutor(n)
		w.startAgent(n)
		if err := w.enrol(n, "--new", "--name", n.name); err != nil {
			return err
		}
	}
	for _, n := range w.nodes {
		if !w.converged(n, w.cfg.bound) {
			return fmt.Errorf("%s never heard from after enrolment", n.name)
		}
		n.lastReport = w.newestReport(n) // before the look, as checkMachine does
		before, err := snapshotNode(n)
		if err != nil {
			return err
		}
		n.before = before
	}
	return nil
}

// enrol issues a token (tokenArgs) and enrols n's executor with it.
func (w *world) enrol(n *node, tokenArgs ...string) error {
	var before nodeView
	if vs, err := w.nodesView(); err == nil {
		before = vs[n.name]
	}
	tok, code, err := w.control(append([]string{"token", "issue"}, tokenArgs...)...)
	if err != nil || code != 0 {
		return fmt.Errorf("token issue %v: %v exit %d\n%s", tokenArgs, err, code, tok)
	}
	token := lastLine(tok)
	out, code, err := w.onNode(n, 2*time.Minute, token+"\n", "enrol", "--state", n.state, "--socket", n.sock, "--wait", "60s")
	if err == nil && code == 3 && sysFull(n) && strings.Contains(out, "the enrolment is pending") {
		// The agent cannot keep the new enrolment's NKey on a full disk
		// (its log says so), and the token revoked the node it was:
		// pending, said, and finished once there is room (sys-disk-free).
		w.check("refused-legibly")
		n.revoked, n.enrolOnRoom = true, &before
		return nil
	}
	if err != nil || code != 0 {
		return fmt.Errorf("enrol %s: %v exit %d\n%s", n.name, err, code, out)
	}
	n.revoked = false
	return w.firstComposition(n, before)
}

// firstComposition waits, once n is enrolled anew, for the control side
// to publish the new enrolment's first composition (it does so on its
// own, after the grant): until then the node looks converged — the
// control side's view and the node's store both name the old enrolment's
// last sequence — while the declaration that replaces it is on its way,
// and a look at the machine would race its apply. Without an overlay no
// composition is published.
func (w *world) firstComposition(n *node, before nodeView) error {
	if !w.overlay || w.ctlFull {
		return nil
	}
	var last nodeView
	if w.eventually(w.cfg.bound, func() bool {
		vs, err := w.nodesView()
		if err != nil {
			return false
		}
		last = vs[n.name]
		return last.Enrolment != "" && last.Enrolment != before.Enrolment && last.Declared > before.Declared
	}) {
		return nil
	}
	return fmt.Errorf("%s re-enrolled, and no composition of its new enrolment was published within %s (before: enrolment %s declared %d; now: enrolment %s declared %d)",
		n.name, w.cfg.bound, before.Enrolment, before.Declared, last.Enrolment, last.Declared)
}

func lastLine(s string) string {
	// The token is what token issue prints on standard output; the rest
	// (what to do with it) is on standard error, merged here.
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.Contains(l, " ") {
			return l
		}
	}
	return strings.TrimSpace(s)
}

// endNetns ends what lives on in the node's network namespace (its
// wireguard-go) and removes the namespace.
func (w *world) endNetns(n *node) {
	for _, pid := range netnsPids(n) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	exec.Command("ip", "netns", "del", n.netns).Run()
}

// netnsPids is every process in n's network namespace but the run's own.
func netnsPids(n *node) []int {
	target, err := os.Stat("/run/netns/" + n.netns)
	if err != nil {
		return nil
	}
	var pids []int
	nets, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range nets {
		if fi, err := os.Stat(p); err == nil && os.SameFile(fi, target) {
			if pid, err := strconv.Atoi(strings.Split(p, "/")[2]); err == nil && pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func (w *world) close() {
	for _, p := range w.procs {
		if p.running() {
			w.end(p, syscall.SIGTERM)
		}
	}
	for i := len(w.cleanup) - 1; i >= 0; i-- {
		w.cleanup[i]()
	}
}

// The tree, as an operator would compare it: each path's type, mode and
// content digest.
type entry struct {
	dir    bool
	mode   os.FileMode
	digest [32]byte
}

func snapshot(root string) map[string]entry {
	m := map[string]entry{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return nil
		}
		e := entry{dir: fi.IsDir(), mode: fi.Mode()}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			e.digest = sha256.Sum256(b)
		}
		m[p] = e
		return nil
	})
	return m
}

// panicLine is what a Go runtime crash leaves in a log.
var panicLine = regexp.MustCompile(`(?m)^(panic: |fatal error: |goroutine \d+ \[)`)

// scanPanics reads what each log gained since the last scan.
func (w *world) scanPanics() {
	for _, p := range w.procs {
		f, err := os.Open(p.log)
		if err != nil {
			continue
		}
		f.Seek(p.scanned, 0)
		var buf bytes.Buffer
		n, _ := buf.ReadFrom(f)
		f.Close()
		p.scanned += n
		w.check("no-panic")
		if loc := panicLine.FindIndex(buf.Bytes()); loc != nil {
			end := loc[0] + 1500
			if end > buf.Len() {
				end = buf.Len()
			}
			w.violate(w.nodeOfProc(p), "no-panic", "%s panicked:\n%s", p.name, buf.Bytes()[loc[0]:end])
		}
	}
}

func (w *world) nodeOfProc(p *proc) *node {
	for _, n := range w.nodes {
		if strings.HasPrefix(p.name, n.name+"/") {
			return n
		}
	}
	return nil
}

func (w *world) check(name string) {
	w.checks[name]++
}

// violate records an invariant that failed, under the node's known fault
// if one is in force there.
func (w *world) violate(n *node, inv string, format string, a ...any) {
	msg := fmt.Sprintf("step %d: invariant %s: %s", w.stepN, inv, fmt.Sprintf(format, a...))
	timedOut := strings.Contains(msg, "context deadline exceeded") || strings.Contains(msg, "no responders available")
	if timedOut && strings.Contains(msg, "opened anew") {
		// Said why, as a command must: the store was opened anew a moment
		// ago (serve says so only in the seconds after it did, whenever
		// its look found the disk with room again), and the command is to
		// be run again.
		w.logf("  (said why, in the seconds after the store was opened anew) %s", msg)
		return
	}
	if w.stepN <= w.reopenUntil && timedOut {
		w.knownViolation("control-reopen-timeout", inv, format, a...)
		return
	}
	if n != nil && n.known != "" && w.stepN <= n.knownUntil && !w.cfg.strict {
		w.known[n.known]++
		w.logf("  KNOWN (%s) %s", n.known, msg)
		return
	}
	w.violations = append(w.violations, msg)
	w.logf("  VIOLATION %s", msg)
}

// knownViolation records an invariant that failed for the known fault
// name, met where no step on a node provoked it (the control side's): it
// is counted under name, or fails the run under -strict.
func (w *world) knownViolation(name, inv string, format string, a ...any) {
	msg := fmt.Sprintf("step %d: invariant %s: %s", w.stepN, inv, fmt.Sprintf(format, a...))
	if w.cfg.strict {
		w.violations = append(w.violations, msg)
		w.logf("  VIOLATION %s", msg)
		return
	}
	w.known[name]++
	w.logf("  KNOWN (%s) %s", name, msg)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
