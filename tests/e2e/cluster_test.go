package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/tests/fleet"
)

// clusterNodes is how many simulated nodes the cluster test links.
const clusterNodes = 500

// A three-server NATS cluster (real nats-server processes, configured by
// `mesh-control broker-config --cluster`), two `mesh-control serve`
// processes against it sharing the work (--replicas 3 --broker-accounts),
// and 500 nodes (the agent's own link code against stand-in executors, in
// this process). During a fan-out of one declaration to every node, one
// server is killed (SIGKILL) and so is one of the serve processes: every
// node still converges on its declaration, and every node's report of it
// is recorded in the registry — nothing is lost. The control side's
// streams and registry are at three replicas; nothing is kept per node on
// the broker (no consumer on the declarations).
//
// Run with both forms of an existing broker's accounts: the file serve
// keeps and the servers reload (nodes sharing NODES), and NATS operator
// mode (--resolver: an account per node, pushed to the servers'
// resolvers — the form a reload could not give, which crashed every
// server of this cluster).
func TestClusterLosesAServerMidFanout(t *testing.T) {
	t.Run("accounts file", func(t *testing.T) { clusterLosesAServerMidFanout(t, false) })
	t.Run("operator mode", func(t *testing.T) { clusterLosesAServerMidFanout(t, true) })
}

func clusterLosesAServerMidFanout(t *testing.T, resolver bool) {
	m := newMeshDirs(t)
	base := m.base
	natsServer := buildNATSServer(t, base)

	// The cluster's configuration, as an operator makes it.
	clients, routes := clusterAddrs(t)
	confDir := filepath.Join(base, "cluster")
	args := []string{"broker-config", "--dir", m.ctl, "--cluster", strings.Join(routes, ","), "--listen", strings.Join(clients, ","), "--out", confDir}
	if resolver {
		args = append(args, "--resolver")
	}
	out := m.run("mesh-control", args...)
	t.Logf("broker-config --cluster:\n%s", out)
	var servers []*exec.Cmd
	var pids []string
	for i := range 3 {
		name := fmt.Sprintf("mesh-broker-%d", i+1)
		pid := filepath.Join(confDir, name+".pid")
		pids = append(pids, pid)
		servers = append(servers, startLogged(m, name, natsServer, nil, "-c", filepath.Join(confDir, name+".conf"), "-P", pid))
	}
	urls := make([]string, len(clients))
	for i, c := range clients {
		urls[i] = "tls://" + c
	}
	urlList := strings.Join(urls, ",")

	// Two control sides on it.
	serveArgs := []string{"serve", "--dir", m.ctl, "--nats", urlList, "--replicas", "3"}
	if !resolver {
		serveArgs = append(serveArgs, "--broker-accounts", filepath.Join(confDir, control.AccountsFile), "--broker-pid", strings.Join(pids, ","))
	}
	controlA := startLogged(m, "control-a", filepath.Join(bin, "mesh-control"), nil, serveArgs...)
	startLogged(m, "control-b", filepath.Join(bin, "mesh-control"), nil, serveArgs...)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	keys, err := control.LoadKeys(m.ctl)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var cl *control.Client
	var lastErr error
	eventually(t, "both control sides serving", func() bool {
		a, _ := os.ReadFile(filepath.Join(base, "control-a.log"))
		b, _ := os.ReadFile(filepath.Join(base, "control-b.log"))
		return bytes.Contains(a, []byte("msg=serving")) && bytes.Contains(b, []byte("msg=serving"))
	})
	waitAll(t, 2*time.Minute, "the control side connected to the cluster", func() (int, bool) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cl, lastErr = control.ConnectReplicas(cctx, keys, urlList, 0, quiet)
		if lastErr != nil {
			t.Logf("connecting: %v", lastErr)
		}
		return 1, lastErr == nil
	})
	defer cl.Close()
	streams := []string{link.DeclStream, link.HeartbeatStream, link.RosterStream, "KV_" + control.Bucket, link.ArchiveStream}
	for _, p := range link.ReportPlaces() {
		streams = append(streams, p.Stream)
	}
	for _, s := range streams {
		eventually(t, s+" at three replicas", func() bool {
			st, err := cl.JS.Stream(ctx, s)
			return err == nil && st.CachedInfo().Config.Replicas == 3
		})
	}
	// The registry is read from its leader: a follower's direct get may
	// not have the record node add wrote a moment before.
	if st, err := cl.JS.Stream(ctx, "KV_"+control.Bucket); err != nil || st.CachedInfo().Config.AllowDirect {
		t.Fatalf("the registry's direct gets at three replicas: still on (%v)", err)
	}

	// The fleet: registered, in the servers' users, linked.
	f := fleet.New(keys.ControlPublic(), 30*time.Second)
	// A node whose server dies is told nothing while it reconnects: a
	// notice sent then is lost (notices are hints), and the node reads its
	// subject at the reconnect and on its timer. The timer is the
	// backstop; here it is short, so the test waits seconds, not minutes.
	f.Poll = 5 * time.Second
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, clusterNodes)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				// The servers reload their users as nodes are added, and
				// a request in that moment may find no responder: the
				// operator runs node add again.
				var cfg *agent.Config
				var err error
				for attempt := 0; attempt < 20; attempt++ {
					actx, cancel := context.WithTimeout(ctx, 10*time.Second)
					cfg, _, err = cl.AddNode(actx, fmt.Sprintf("c%03d", i), urlList)
					cancel()
					if err == nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				if _, err := f.Add(cfg); err != nil {
					errs <- err
				}
				mu.Unlock()
			}
		}()
	}
	for i := range clusterNodes {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("node add: %v", err)
	}
	var nkeys []string
	for _, n := range f.Nodes {
		rec, _, err := cl.Node(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		nkeys = append(nkeys, rec.NKey)
	}
	eventually(t, "every node in the servers' accounts", func() bool {
		if resolver {
			// Each server's resolver holds each node's account: pushed
			// through one, passed on to the others.
			for i := range 3 {
				for _, n := range f.Nodes {
					if _, err := os.Stat(filepath.Join(confDir, fmt.Sprintf("mesh-broker-%d", i+1), "accounts", control.NodeAccountID(n.Name)+".jwt")); err != nil {
						return false
					}
				}
			}
			return true
		}
		b, _ := os.ReadFile(filepath.Join(confDir, control.AccountsFile))
		for _, k := range nkeys {
			if !bytes.Contains(b, []byte(k)) {
				return false
			}
		}
		return true
	})
	actx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	for _, n := range f.Nodes {
		n.Start(actx)
	}
	eventually(t, "every agent linked", func() bool {
		for _, n := range f.Nodes {
			if _, ok := n.LinkedAfter(time.Time{}); !ok {
				return false
			}
		}
		return true
	})

	// The fan-out, and a server and a serve killed a third of the way.
	decl := []byte(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"through a cluster that lost a server\n"}]}`)
	seqs := make([]uint64, len(f.Nodes))
	jobs := make(chan int)
	declErrs := make(chan error, len(f.Nodes))
	var dwg sync.WaitGroup
	for range 16 {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for i := range jobs {
				// A declare in flight when its server dies waits out the
				// streams' elections of new leaders: each is made once,
				// as an operator makes it, with no deadline of its own.
				seq, err := cl.Declare(ctx, f.Nodes[i].Name, decl)
				if err != nil {
					declErrs <- fmt.Errorf("declare %s: %w", f.Nodes[i].Name, err)
				}
				seqs[i] = seq
			}
		}()
	}
	start := time.Now()
	// An operator's command started as the server dies waits out the
	// elections of its streams' new leaders, as the declares do.
	command := make(chan error, 1)
	for i := range f.Nodes {
		if i == len(f.Nodes)/3 {
			servers[0].Process.Signal(syscall.SIGKILL)
			controlA.Process.Signal(syscall.SIGKILL)
			t.Logf("killed mesh-broker-1 and one serve after %d declares, %v in", i, time.Since(start).Round(time.Millisecond))
			go func() {
				out, err := exec.CommandContext(ctx, filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl, "--nats", urlList, "--json").CombinedOutput()
				if err == nil && !bytes.Contains(out, []byte(`"c000"`)) {
					err = errors.New("no node c000 listed")
				}
				if err != nil {
					err = fmt.Errorf("mesh-control nodes as mesh-broker-1 died: %w\n%s", err, out)
				}
				command <- err
			}()
		}
		jobs <- i
	}
	close(jobs)
	dwg.Wait()
	close(declErrs)
	for err := range declErrs {
		t.Fatal(err)
	}
	if err := <-command; err != nil {
		t.Fatal(err)
	}
	t.Logf("declared to %d nodes in %v", len(f.Nodes), time.Since(start).Round(time.Millisecond))

	// Every node converges: its stand-in took its declaration.
	waitAll(t, 2*time.Minute, "every node took its declaration", func() (int, bool) {
		missing := 0
		for i, n := range f.Nodes {
			if _, ok := n.ReceivedAt(seqs[i]); !ok {
				missing++
			}
		}
		return missing, missing == 0
	})
	t.Logf("every node took its declaration %v after the first declare", time.Since(start).Round(time.Millisecond))
	// No report lost: the surviving serve recorded every node's.
	var missed []string
	defer func() {
		if !t.Failed() {
			return
		}
		for _, m := range missed {
			rs, _, err := cl.Reports(ctx, m, 10)
			t.Logf("%s: the registry's report %s; on the stream (%v):", m, lastReport(ctx, cl, m), err)
			for _, r := range rs {
				t.Logf("  seq %d trigger %s outcome %s at %s", r.Seq, r.Trigger, r.Outcome, r.At.Format(time.StampMilli))
			}
		}
	}()
	waitAll(t, 2*time.Minute, "every node's report recorded", func() (int, bool) {
		missed = missed[:0]
		for i, n := range f.Nodes {
			e, err := cl.KV.Get(ctx, "report."+n.Name)
			var r struct {
				Seq uint64 `json:"seq"`
			}
			if err != nil || json.Unmarshal(e.Value(), &r) != nil || r.Seq != seqs[i] {
				missed = append(missed, n.Name)
			}
		}
		return len(missed), len(missed) == 0
	})
	t.Logf("every report recorded %v after the first declare", time.Since(start).Round(time.Millisecond))

	// Nothing per node on the broker: the declarations have no consumer,
	// the reports and heartbeats only the recorder's one, in each of
	// their streams. The servers' configuration (broker-config --cluster)
	// spreads the reports over their partitions: none in the stream of a
	// broker without the mapping, every node's in its partition.
	consumers := map[string]int{link.DeclStream: 0, link.HeartbeatStream: 1, link.RosterStream: 0}
	for _, p := range link.ReportPlaces() {
		consumers[p.Stream] = 1
	}
	for _, n := range f.Nodes {
		part := link.NodeReportPartition(n.Name)
		st, err := cl.JS.Stream(ctx, part.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx, part.Subject); err != nil {
			t.Errorf("%s's reports are not in its partition (%s): %v", n.Name, part.Subject, err)
		}
	}
	for s, want := range consumers {
		st, err := cl.JS.Stream(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Consumers != want {
			t.Errorf("%s has %d consumers, want %d: nothing is kept per node", s, info.State.Consumers, want)
		}
		if s == link.ReportStream && info.State.Msgs != 0 {
			t.Errorf("%s holds %d reports: the servers' configuration does not spread them", s, info.State.Msgs)
		}
	}
}

// startLogged runs path for the test's life (as cred, nil for root), its
// output in logName.log, shown if the test fails (the end of it, when
// long).
func startLogged(m *mesh, logName, path string, cred *syscall.Credential, args ...string) *exec.Cmd {
	m.t.Helper()
	cmd := exec.Command(path, args...)
	logf, _ := os.Create(filepath.Join(m.base, logName+".log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if m.t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			m.t.Logf("%s log (its end):\n%s", logName, b)
		}
	})
	return cmd
}

// clusterAddrs are three servers' client and route addresses, free ports
// of loopback.
func clusterAddrs(t *testing.T) (clients, routes []string) {
	for range 3 {
		clients = append(clients, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	}
	return clients, routes
}

// waitAll waits until cond says done, within d, saying how many are
// missing when it gives up.
func waitAll(t *testing.T, d time.Duration, what string, cond func() (missing int, done bool)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		missing, done := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never: %s (%d missing after %v)", what, missing, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lastReport is what the registry holds as node's last report, briefly.
func lastReport(ctx context.Context, cl *control.Client, node string) string {
	e, err := cl.KV.Get(ctx, "report."+node)
	if err != nil {
		return err.Error()
	}
	var r struct {
		Seq     uint64 `json:"seq"`
		Trigger string `json:"trigger"`
		Outcome string `json:"outcome"`
	}
	json.Unmarshal(e.Value(), &r)
	return fmt.Sprintf("seq %d trigger %s outcome %s", r.Seq, r.Trigger, r.Outcome)
}
