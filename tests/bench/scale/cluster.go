package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/tests/fleet"
	"github.com/nox-mesh/nox-mesh-host/tests/ports"
)

// CLUSTER=1: the control side against a three-server NATS cluster, as an
// operator runs one — nats-server processes built from the module,
// configured by `mesh-control broker-config --cluster`, and `mesh-control
// serve --nats URL,URL,URL --replicas 3 --broker-accounts F --broker-pid
// P1,P2,P3`. The nodes, simulated here as for the embedded broker, are
// given every server's address and connect to one of them. Its target
// is each server's idle CPU at 30 s heartbeats; the
// registration, the linking and a fan-out are measured on the way as
// information (their targets are the embedded broker's).

// clusterServers are the three nats-server processes.
type clusterServers struct {
	names []string
	cmds  []*exec.Cmd
	done  []chan struct{}
	pids  []string // their pid files, which serve signals to reload
	urls  string   // the clients' addresses, comma-separated
	// prof are the servers' profiling ports (nats-server --profile),
	// with -profile only.
	prof []int
}

// pid is server i's process id (0 when it is not running).
func (s *clusterServers) pid(i int) int {
	select {
	case <-s.done[i]:
		return 0
	default:
		return s.cmds[i].Process.Pid
	}
}

// stop ends the servers.
func (s *clusterServers) stop() {
	for i, c := range s.cmds {
		c.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done[i]:
		case <-time.After(30 * time.Second):
			c.Process.Kill()
		}
	}
}

// setupCluster builds nats-server, writes the cluster's configuration
// with mesh-control, starts the three servers and serve against them, and
// connects the bench.
func (b *bench) setupCluster(ctx context.Context, work, bin string) error {
	nats := filepath.Join(work, "bin", "nats-server")
	if err := fleet.BuildNATSServer(ctx, nats); err != nil {
		return err
	}
	var clients, routes, urls []string
	for range 3 {
		c, err := ports.Free()
		if err != nil {
			return err
		}
		r, err := ports.Free()
		if err != nil {
			return err
		}
		clients = append(clients, fmt.Sprintf("127.0.0.1:%d", c))
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", r))
		urls = append(urls, fmt.Sprintf("tls://127.0.0.1:%d", c))
	}
	b.ctl = &controlProc{profile: b.cfg.profile, bin: bin, dir: filepath.Join(work, "control"), logs: filepath.Join(work, "logs"), listen: clients[0]}
	if _, err := b.ctl.run(ctx, "init", "init", "--dir", b.ctl.dir, "--url", urls[0]); err != nil {
		return err
	}
	conf := filepath.Join(work, "cluster")
	args := []string{"broker-config", "--dir", b.ctl.dir, "--cluster", strings.Join(routes, ","), "--listen", strings.Join(clients, ","), "--out", conf}
	if b.cfg.resolver {
		args = append(args, "--resolver")
	}
	if _, err := b.ctl.run(ctx, "broker-config", args...); err != nil {
		return err
	}
	s := &clusterServers{urls: strings.Join(urls, ",")}
	b.servers = s
	for i := range 3 {
		name := fmt.Sprintf("mesh-broker-%d", i+1)
		pid := filepath.Join(conf, name+".pid")
		logf, err := os.Create(filepath.Join(b.ctl.logs, name+".log"))
		if err != nil {
			return err
		}
		args := []string{"-c", filepath.Join(conf, name+".conf"), "-P", pid}
		if b.cfg.profile != "" {
			port, err := ports.Free()
			if err != nil {
				return err
			}
			args = append(args, "--profile", strconv.Itoa(port))
			s.prof = append(s.prof, port)
		}
		c := exec.Command(nats, args...)
		c.Stdout, c.Stderr = logf, logf
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			logf.Close()
			return fmt.Errorf("starting %s: %w", name, err)
		}
		logf.Close()
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		s.names, s.cmds, s.done, s.pids = append(s.names, name), append(s.cmds, c), append(s.done, done), append(s.pids, pid)
	}
	b.ctl.serveArgs = []string{"serve", "--dir", b.ctl.dir, "--nats", s.urls, "--replicas", "3"}
	if b.cfg.resolver {
		for _, name := range s.names {
			b.resolvers = append(b.resolvers, filepath.Join(conf, name, "accounts"))
		}
	} else {
		b.ctl.serveArgs = append(b.ctl.serveArgs, "--broker-accounts", filepath.Join(conf, control.AccountsFile), "--broker-pid", strings.Join(s.pids, ","))
		b.accounts = filepath.Join(conf, control.AccountsFile)
	}
	if err := b.ctl.start(); err != nil {
		return err
	}
	// serve waits for the cluster to elect a JetStream leader.
	if err := b.ctl.waitServing(ctx, 3*time.Minute); err != nil {
		return err
	}
	var err error
	if b.keys, err = keysOf(b.ctl.dir); err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		b.cl, err = control.ConnectReplicas(cctx, b.keys, s.urls, 0, quiet)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		sleep(ctx, time.Second)
	}
	if err != nil {
		return fmt.Errorf("connecting to the cluster: %w", err)
	}
	return nil
}

// serverSample is one reading of every cluster server's CPU.
type serverSample []cpuSample

func (b *bench) sampleServers() (serverSample, error) {
	var out serverSample
	for i := range b.servers.cmds {
		pid := b.servers.pid(i)
		if pid == 0 {
			return nil, fmt.Errorf("%s is not running", b.servers.names[i])
		}
		s, err := sampleCPU(pid)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// serversIdle is each server's CPU (% of a core) between two samples,
// and its memory now.
func (b *bench) serversIdle(s0, s1 serverSample) ([]clusterServerResult, error) {
	var out []clusterServerResult
	for i := range s0 {
		mem, err := readMemory(b.servers.pid(i))
		if err != nil {
			return nil, err
		}
		out = append(out, clusterServerResult{Name: b.servers.names[i], CPU: cpuPercent(s0[i], s1[i]), RSSKiB: mem.RSS})
	}
	return out, nil
}

// clusterServerResult is one server's idle figures.
type clusterServerResult struct {
	Name   string  `json:"name"`
	CPU    float64 `json:"cpu_percent"`
	RSSKiB uint64  `json:"rss_kib"`
}

// waitAccounts waits until the cluster's accounts file names every
// registered node's NKey (serve writes it and has the servers reload):
// an agent that dials before its user is loaded is refused and backs off.
func (b *bench) waitAccounts(ctx context.Context) error {
	if len(b.resolvers) > 0 {
		// Operator mode: every server's resolver holds every node's
		// account, pushed through one and passed on to the others.
		ok := waitFor(ctx, 5*time.Minute, func() bool {
			for _, dir := range b.resolvers {
				for _, n := range b.fleet.Nodes {
					if _, err := os.Stat(filepath.Join(dir, control.NodeAccountID(n.Name)+".jwt")); err != nil {
						return false
					}
				}
			}
			return true
		})
		if !ok {
			return errors.New("the servers' resolvers did not hold every node's account within 5 minutes")
		}
		return nil
	}
	if b.accounts == "" {
		return nil
	}
	var keys []string
	for _, n := range b.fleet.Nodes {
		keys = append(keys, n.NKey())
	}
	ok := waitFor(ctx, 5*time.Minute, func() bool {
		data, err := os.ReadFile(b.accounts)
		if err != nil {
			return false
		}
		s := string(data)
		for _, k := range keys {
			if !strings.Contains(s, k) {
				return false
			}
		}
		return true
	})
	if !ok {
		return errors.New("the cluster's accounts file did not name every node within 5 minutes")
	}
	// The servers reload once serve has signalled them.
	sleep(ctx, 3*time.Second)
	return ctx.Err()
}

// addNode registers one node, as `node add` does, with the broker
// address(es) its agent is given. On a cluster, a request made while the
// servers reload their users may find no responder for a moment: the
// operator runs it again, and so does the bench, a few times.
func (b *bench) addNode(ctx context.Context, name string) (*agent.Config, *control.ExecutorIdentity, error) {
	var (
		cfg *agent.Config
		ex  *control.ExecutorIdentity
		err error
	)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cfg, ex, err = b.cl.AddNode(actx, name, b.brokerURL())
		cancel()
		if err == nil || b.servers == nil || attempt >= 10 || ctx.Err() != nil {
			return cfg, ex, err
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// serverProfileFor is how long a cluster server's CPU profile of a phase
// runs: nats-server profiles for a time given in advance (its
// /debug/pprof/profile?seconds=N), not until told to stop; a fan-out at
// three copies takes 6–8 s here, the idle window 30.
func serverProfileFor(phase string) int {
	if phase == "idle" {
		return 30
	}
	return 10
}

// profileServers takes a CPU profile of each cluster server for phase,
// from now, into the -profile directory (nats-NAME-PHASE-N.pprof); the
// function it returns waits for them.
func (b *bench) profileServers(phase string) func() {
	var wg sync.WaitGroup
	for i, port := range b.servers.prof {
		path := filepath.Join(b.cfg.profile, fmt.Sprintf("nats-%s-%s-%d.pprof", b.servers.names[i], phase, b.profiles))
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", port, serverProfileFor(phase))
			resp, err := http.Get(url)
			if err != nil {
				b.log.Warn("profile: " + err.Error())
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(path)
			if err != nil {
				b.log.Warn("profile: " + err.Error())
				return
			}
			defer f.Close()
			if _, err := io.Copy(f, resp.Body); err != nil {
				b.log.Warn("profile: " + err.Error())
			}
		}()
	}
	return wg.Wait
}
