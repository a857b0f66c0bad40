package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/tests/ports"
)

// The three binaries, as built by run.sh.
var binaries = []string{"mesh-control", "mesh-executor", "mesh-agent"}

// node is the name the bench registers.
const node = "n1"

// mesh is the running system: the control side with its embedded broker,
// the executor as root and the agent as an unprivileged user, all real
// processes, and the driver's own two control-side connections.
type mesh struct {
	cfg   config
	work  string // dir/link: everything the bench makes
	ctl   string // the control side's key directory
	state string // the executor's state directory
	tree  string // where the declarations put their files
	logs  string
	url   string
	build string

	procs map[string]*proc // by binary name
	order []string         // start order; stopped in reverse

	cl      *control.Client // declares, requests (floor), subscribes to reports
	echo    *control.Client // the floor's responder: a second connection
	rec     *control.NodeRecord
	reports chan arrival
	subs    []*nats.Subscription
	hb      chan link.Heartbeat
	hbSub   *nats.Subscription

	mu      sync.Mutex
	stopped bool
}

// proc is a daemon the bench started; done is closed once it is reaped.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// arrival is a message on mesh.report.<node>, stamped when the driver's
// connection handed it over.
type arrival struct {
	at   time.Time
	data []byte
	sig  string
}

// startMesh starts the system as the end-to-end test does, with the
// binaries' own command lines. On error the mesh returned (if any) still
// needs stop.
func startMesh(ctx context.Context, c config) (*mesh, error) {
	syscall.Umask(0o022)
	if err := prepareWorkDir(c.dir); err != nil {
		return nil, err
	}
	work := filepath.Join(c.dir, "link")
	killStale(c, work)
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	m := &mesh{cfg: c, work: work, ctl: filepath.Join(work, "control"), state: filepath.Join(work, "executor"),
		tree: filepath.Join(work, "tree"), logs: filepath.Join(work, "logs"), procs: map[string]*proc{},
		reports: make(chan arrival, 1<<16), hb: make(chan link.Heartbeat, 64)}
	// 0755 all the way down, so the agent (as nobody) reaches the socket
	// directory, which the executor makes root:<agent's group> 0750.
	for _, d := range []string{work, m.logs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	build := c.build
	if build == "" {
		out, err := exec.Command(m.bin("mesh-agent"), "--version").Output()
		f := strings.Fields(string(out))
		if err != nil || len(f) != 4 || f[2] != "build" {
			return m, fmt.Errorf("mesh-agent --version: %q %v", out, err)
		}
		build = f[3]
	}
	m.build = build
	port, err := ports.Free()
	if err != nil {
		return m, err
	}
	m.url = fmt.Sprintf("tls://127.0.0.1:%d", port)

	if _, err := m.run(ctx, "mesh-control", "init", "--dir", m.ctl, "--url", m.url); err != nil {
		return m, err
	}
	if err := m.start("mesh-control", "serve", "--dir", m.ctl, "--listen", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		return m, err
	}
	keys, err := control.LoadKeys(m.ctl)
	if err != nil {
		return m, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := eventually(ctx, 30*time.Second, "the control side serves", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		cl, err := control.Connect(cctx, keys, m.url, quiet)
		if err != nil {
			return err
		}
		m.cl = cl
		return nil
	}); err != nil {
		return m, err
	}
	if m.echo, err = control.Connect(ctx, keys, m.url, quiet); err != nil {
		return m, err
	}

	agentConf := filepath.Join(work, "agent.json")
	if _, err := m.run(ctx, "mesh-control", "node", "add", node, "--dir", m.ctl, "--out", agentConf); err != nil {
		return m, err
	}
	if m.rec, _, err = m.cl.Node(ctx, node); err != nil {
		return m, err
	}
	// The executor pins what the control side wrote for it: root's file.
	id, err := os.ReadFile(filepath.Join(work, "executor-identity.json"))
	if err != nil {
		return m, err
	}
	if err := os.Mkdir(m.state, 0o700); err != nil {
		return m, err
	}
	if err := os.WriteFile(filepath.Join(m.state, "identity.json"), id, 0o600); err != nil {
		return m, err
	}

	// The driver listens before anything can report, where CONTROL has
	// the node's reports: the node publishes on its report subject, and
	// CONTROL's mapping puts them on its partition's (link.NodeReports).
	s := link.SubjectsOf(node)
	for _, at := range link.NodeReports(node) {
		sub, err := m.cl.NC.Subscribe(at.Subject, func(msg *nats.Msg) {
			m.reports <- arrival{at: time.Now(), data: msg.Data, sig: msg.Header.Get(link.SignatureHeader)}
		})
		if err != nil {
			return m, err
		}
		sub.SetPendingLimits(-1, -1)
		m.subs = append(m.subs, sub)
	}
	if m.hbSub, err = m.cl.NC.Subscribe(s.Heartbeat, func(msg *nats.Msg) {
		var h link.Heartbeat
		if link.VerifySignature(m.rec.NKey, msg.Data, msg.Header.Get(link.SignatureHeader)) == nil &&
			json.Unmarshal(msg.Data, &h) == nil {
			select {
			case m.hb <- h:
			default:
			}
		}
	}); err != nil {
		return m, err
	}
	if err := m.cl.NC.Flush(); err != nil {
		return m, err
	}

	sock := filepath.Join(work, "run", "executor.sock")
	if err := m.start("mesh-executor", "serve", "--state", m.state, "--socket", sock,
		"--agent-user", c.agentUser, "--drift", "0", "--build", build); err != nil {
		return m, err
	}
	if err := eventually(ctx, 30*time.Second, "the executor's socket", func() error { _, err := os.Stat(sock); return err }); err != nil {
		return m, err
	}
	if err := m.start("mesh-agent", "--config", agentConf, "--socket", sock, "--user", c.agentUser,
		"--state", filepath.Join(work, "agent-state"), "--heartbeat", c.heartbeat.String()); err != nil {
		return m, err
	}
	// Up: a heartbeat signed by the node, carrying the executor's build.
	deadline := time.After(60 * time.Second)
	for {
		select {
		case h := <-m.hb:
			if h.Executor != nil && h.Executor.Build == build && h.State == link.StateEnrolled {
				m.hbSub.Unsubscribe()
				return m, nil
			}
		case <-deadline:
			return m, fmt.Errorf("the node was never heard from with the executor's build %q", build)
		case <-ctx.Done():
			return m, ctx.Err()
		}
		if err := m.exited(); err != nil {
			return m, err
		}
	}
}

func (m *mesh) bin(name string) string { return filepath.Join(m.cfg.bin, name) }

// run runs a command of the system to its end.
func (m *mesh) run(ctx context.Context, name string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, m.bin(name), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// start starts a daemon, its output in logs/<name>.log. It dies with the
// driver (PR_SET_PDEATHSIG) and gets its own process group.
func (m *mesh) start(name string, args ...string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return fmt.Errorf("stopping")
	}
	logf, err := os.Create(filepath.Join(m.logs, name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(m.bin(name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	// The pid file outlives a driver killed outright: the agent drops
	// privileges, which clears its parent-death signal, so the next run
	// ends what this one could not (killStale).
	if f, err := os.OpenFile(pidFile(m.cfg), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		fmt.Fprintf(f, "%d\n", cmd.Process.Pid)
		f.Close()
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	m.procs[name] = p
	m.order = append(m.order, name)
	return nil
}

// exited says which daemon is gone, if one is.
func (m *mesh) exited() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range m.order {
		select {
		case <-m.procs[name].done:
			return fmt.Errorf("%s exited: %v", name, m.procs[name].cmd.ProcessState)
		default:
		}
	}
	return nil
}

// pid is a daemon's process id.
func (m *mesh) pid(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.procs[name]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// stop ends every process the bench started, newest first (SIGTERM, then
// SIGKILL to its group after 10 s), closes the driver's connections and
// removes the work directory.
func (m *mesh) stop() {
	m.mu.Lock()
	m.stopped = true
	order := append([]string(nil), m.order...)
	m.mu.Unlock()
	for _, s := range m.subs {
		s.Unsubscribe()
	}
	for i := len(order) - 1; i >= 0; i-- {
		p := m.procs[order[i]]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			fmt.Fprintf(os.Stderr, "link bench: %s did not stop within 10s; killed\n", order[i])
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	os.Remove(pidFile(m.cfg))
	if m.cl != nil {
		m.cl.Close()
	}
	if m.echo != nil {
		m.echo.Close()
	}
	if m.cfg.keep {
		fmt.Fprintf(os.Stderr, "link bench: kept %s\n", m.work)
		return
	}
	if err := os.RemoveAll(m.work); err != nil {
		fmt.Fprintf(os.Stderr, "link bench: removing %s: %v\n", m.work, err)
	}
}

// dumpLogs prints the end of each daemon's log.
func (m *mesh) dumpLogs(w io.Writer) {
	for _, name := range binaries {
		b, err := os.ReadFile(filepath.Join(m.logs, name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		fmt.Fprintf(w, "--- %s log (last %d lines) ---\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
}

func eventually(ctx context.Context, within time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("never: %s: %v", what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// prepareWorkDir makes the work directory root-owned and 0755 and refuses a
// filesystem in memory, where fsync costs nothing and the figures would lie.
func prepareWorkDir(dir string) error {
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

// busyRefusals counts the executor's refusals of the agent's connection for
// too many requests, from its log.
func (m *mesh) busyRefusals() int {
	b, err := os.ReadFile(filepath.Join(m.logs, "mesh-executor.log"))
	if err != nil {
		return -1
	}
	return bytes.Count(b, []byte("code=busy"))
}

func pidFile(c config) string { return filepath.Join(c.dir, "link.pids") }

// killStale ends the daemons a previous run started and could not stop (it
// was killed outright), by the pids it wrote, and only those that still are
// one of the bench's binaries working in the bench's directory.
func killStale(c config, work string) {
	data, err := os.ReadFile(pidFile(c))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue
		}
		exe = strings.TrimSuffix(exe, " (deleted)") // rebuilt since
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		ours := false
		for _, n := range binaries {
			ours = ours || exe == filepath.Join(c.bin, n)
		}
		if !ours || !bytes.Contains(cmdline, []byte(work)) {
			continue
		}
		fmt.Fprintf(os.Stderr, "link bench: ending pid %d (%s), left by an earlier run\n", pid, filepath.Base(exe))
		syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	os.Remove(pidFile(c))
}

// executorTimes are, for the given sequences, the time from the agent
// forwarding a declaration to the executor's verdict, read from the agent's
// log (millisecond timestamps): the executor's share of a push, verify,
// apply and read back included. Empty if the log says otherwise.
func (m *mesh) executorTimes(seqs map[uint64]bool) []float64 {
	f, err := os.Open(filepath.Join(m.logs, "mesh-agent.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	forwarded := map[uint64]time.Time{}
	var out []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fw := strings.Contains(line, `msg="forwarding the newest declaration"`)
		if !fw && !strings.Contains(line, `msg="the executor's verdict"`) {
			continue
		}
		var at time.Time
		var seq uint64
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "time":
				at, _ = time.Parse(time.RFC3339Nano, v)
			case "seq":
				seq, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		if at.IsZero() || !seqs[seq] {
			continue
		}
		if fw {
			forwarded[seq] = at
		} else if t, ok := forwarded[seq]; ok {
			out = append(out, ms(at.Sub(t)))
			delete(forwarded, seq)
		}
	}
	return out
}
