// Package serve is the executor daemon: it listens on the local socket,
// speaks the wire protocol with the agent, and applies what the control
// plane signed — after verifying it again itself. It also runs the other
// reconcile triggers: at start, when the agent says the link came back, on
// the drift timer, and when the host's firewall takes a rule of the mesh's.
//
// It trusts the agent for nothing. A connection is accepted only from root
// or the agent's uid (peer credentials); a message not in the protocol's
// table, going the wrong way, over its limit, or not allowed in the
// connection's state closes the connection with a coded error; and a
// declaration is applied only if the envelope bytes verify under the pinned
// control-plane key, are addressed to this node and enrolment, carry a
// sequence newer than the last applied, and contain no action. The pinned
// key, node and enrolment come from the executor's own identity file, never
// from a message.
//
// Only cmd/mesh-executor (through executor/cli) imports this package.
package serve

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/executor/profile"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/launcher"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Config is the daemon's own configuration: its policy comes from here,
// never from a request.
type Config struct {
	StateDir string
	Version  string
	Build    string
	// AgentUID may connect besides root; -1 for nobody but root.
	AgentUID int
	// DriftEvery is the drift timer; 0 turns it off.
	DriftEvery time.Duration
	// MaxConns bounds concurrent connections (default 4).
	MaxConns int
	// Rate and Burst bound requests per peer per second (root, the
	// agent, a vsock peer), over all its connections.
	Rate  float64
	Burst int
	// LockWait is how long an apply waits for another applier (a rescue
	// command) to finish.
	LockWait time.Duration
	Partial  bool
	Log      *slog.Logger
	// Healthy, when set, is called each time a reconcile runs to its end,
	// whatever its outcome: the launcher's known-good copy is written and
	// its start counter cleared there (launcher.Healthy).
	Healthy func() error
	// HostBinary is where the host's package installs the executor
	// (engine.DefaultHostBinary when ""): an upgrade runs it to check it.
	HostBinary string
	// VsockCIDs are the context ids that may connect over vsock, and
	// VsockSecret the secret each connection's hello must present.
	VsockCIDs   []uint32
	VsockSecret []byte
	// ArchiveCacheMax bounds the archive cache, streams in flight
	// included (engine.MaxArchiveCacheBytes when 0).
	ArchiveCacheMax uint64
	// AgentBinary is the agent as installed (beside the executor): the
	// binary an agent that stays up AgentProofAfter proves good
	// (DefaultAgentProofAfter when 0). "" proves nothing.
	AgentBinary     string
	AgentProofAfter time.Duration
	// AgentUser is the agent's user name: an upgrade's new agent is tried
	// dropping to it (engine.Options.AgentUser).
	AgentUser string
	// MetricsFile, when set, is written after each apply in Prometheus'
	// text format, for node_exporter's textfile collector (metrics.go).
	MetricsFile string
	// AgentState is the agent's state directory, which the protected set
	// covers wherever it is.
	AgentState string
}

// handlers is the executor's half of the protocol table: one handler per
// request kind. A test holds it, the table and the codec to the same set.
var handlers = map[wire.Kind]handler{
	wire.KindHello:       (*Server).hello,
	wire.KindDeclaration: (*Server).declaration,
	wire.KindReconnected: (*Server).reconnected,
	wire.KindRoster:      (*Server).roster,
	wire.KindStatus:      (*Server).status,
	wire.KindArchive:     (*Server).archiveChunk,
	wire.KindEnrol:       (*Server).enrol,
	wire.KindGrant:       (*Server).grant,
	wire.KindProfile:     (*Server).profile,
	wire.KindPlan:        (*Server).plan,
	wire.KindKeyRotation: (*Server).keyRotation,
	wire.KindRekey:       (*Server).rekey,
	wire.KindActivity:    (*Server).activity,
	wire.KindLastApplied: (*Server).lastApplied,
}

// Handled lists the request kinds the executor serves.
func Handled() []wire.Kind {
	var ks []wire.Kind
	for k := range handlers {
		ks = append(ks, k)
	}
	return ks
}

// Server is the executor daemon.
type Server struct {
	cfg   Config
	log   *slog.Logger
	conns chan struct{}
	// applyMu makes this process apply one thing at a time; the store's
	// lock keeps the rescue command out while it does.
	applyMu sync.Mutex
	// linkFileMu: one writer of LinkFile at a time (keepLink).
	linkFileMu sync.Mutex
	// rates: each peer's request rate (rateFor).
	// +checklocks:ratesMu
	rates   map[string]*rate.Limiter
	ratesMu sync.Mutex
	// +checklocks:lastMu
	last lastApplied
	// +checklocks:lastMu
	lastReconnect time.Time
	// tidied: when a stream past the archive cache's bound last made it
	// look at what the cache keeps (tidyCache).
	// +checklocks:applyMu
	tidied time.Time
	// upgradeTo: an apply installed another version of the host and saw
	// it run; once the apply is answered, the daemon exits 0 onto it.
	// +checklocks:lastMu
	upgradeTo string
	// link is the agent's link as it last said it (linkstate.go).
	// +checklocks:lastMu
	link   LinkState
	lastMu sync.Mutex
	// quiet fires a moment after the last apply, to give its memory back
	// (giveBack).
	// +checklocks:quietMu
	quiet   *time.Timer
	quietMu sync.Mutex
	// stop ends Run (set by Run): the clean exit of an upgrade.
	stop context.CancelFunc
	// stopping is closed once the daemon is asked to stop (Run's context
	// ends): an apply in progress ends before its next resource
	// (engine.Options.Stop).
	stopping chan struct{}
	stopOnce sync.Once
	// stateAt is the state directory this daemon started on (Run): one
	// moved, removed or replaced since is not applied to (openStore).
	stateAt   *syscall.Stat_t
	stateGone sync.Once
	// tasks is what Run waits for before it returns: every connection's
	// handler and the daemon's own work (spawn). A stop that returned
	// before them would end the process in the middle of an apply.
	tasks sync.WaitGroup
	// streaming names the archives being streamed into the cache now, on
	// any connection: one stream per digest.
	// +checklocks:streamMu
	streaming map[string]bool
	// streamed names the archives each connection has stored in the cache
	// since it last handed a declaration over: streamed for the one it
	// hands next, which an apply running meanwhile (handed on another
	// connection, by an agent before this one) must not clean away
	// (pruneArchives). Dropped as the connection hands a declaration over
	// or ends; bounded by the cache's own bound.
	// +checklocks:streamMu
	streamed map[*conn]map[string]bool
	streamMu sync.Mutex
	// found is the machine's profile and inventory as last found (after
	// each reconcile): the agent reports them when their digest changes.
	// +checklocks:foundMu
	found wire.ProfileReply
	// +checklocks:foundMu
	foundProfile []byte
	// +checklocks:foundMu
	foundInv profile.Inventory
	// +checklocks:foundMu
	foundAt time.Time
	foundMu sync.Mutex
	// budget bounds the bytes of large frames read at once, across all
	// connections (wire.FrameBudget).
	budget *wire.Budget
	// open is every connection holding a slot (conns), for admit to find
	// one to give up.
	// +checklocks:slotMu
	open map[*conn]bool
	// draining: Run is stopping; no connection is admitted, no request
	// begun, no task spawned.
	// +checklocks:slotMu
	draining bool
	slotMu   sync.Mutex
	// reconciled: a reconcile of this process ran to its end (Healthy was
	// called), so the release's executor half is proven.
	reconciled atomic.Bool
	// agentSeen is when each agent process was first heard from, and
	// agentProven the installed agent binary last proven (agentproof.go).
	// +checklocks:agentMu
	agentSeen map[int32]time.Time
	// +checklocks:agentMu
	agentProven agentKey
	// agentSameBytes: by agent pid, whether its binary's bytes are the
	// installed file's, when that file is another (agentproof.go).
	// +checklocks:agentMu
	agentSameBytes map[int32]sameBytes
	agentMu        sync.Mutex
	// metrics is what the metrics file says (metrics.go).
	metrics execMetrics
	// faultMu orders the writes of FaultsFile (recover.go).
	faultMu sync.Mutex
	// newest is the history's newest count, as last read (activity.go).
	newest newestSeen
}

type lastApplied struct {
	Seq     uint64
	Outcome shapes.Outcome
}

// New returns a daemon with cfg, defaults filled in.
func New(cfg Config) *Server {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 4
	}
	if cfg.Rate == 0 {
		// The agent asks one thing at a time and waits for the answer, so
		// a genuine link never comes near this; it bounds a flood of cheap
		// requests from a compromised agent. (20 a second, the first
		// choice, refused a genuine flurry of pushes.)
		cfg.Rate, cfg.Burst = 500, 1000
	}
	if cfg.AgentProofAfter == 0 {
		cfg.AgentProofAfter = DefaultAgentProofAfter
	}
	if cfg.ArchiveCacheMax == 0 {
		cfg.ArchiveCacheMax = engine.MaxArchiveCacheBytes
	}
	if cfg.LockWait == 0 {
		cfg.LockWait = 10 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Log, conns: make(chan struct{}, cfg.MaxConns), streaming: map[string]bool{}, streamed: map[*conn]map[string]bool{}, rates: map[string]*rate.Limiter{},
		budget: wire.NewBudget(wire.FrameBudget), open: map[*conn]bool{}, agentSeen: map[int32]time.Time{}, agentSameBytes: map[int32]sameBytes{}, stopping: make(chan struct{})}
	if f, err := identity.ReadFloor(cfg.StateDir); err == nil {
		s.last.Seq = f.Seq
	}
	return s
}

// Run reconciles once (the start trigger) while it serves ln, and more
// (a vsock listener), and runs the drift timer and the firewall's watch,
// until ctx ends. Every listener is served only once the daemon is set up
// (its protected set, the start reconcile holding the apply lock), and
// each ends with Run.
func (s *Server) Run(ctx context.Context, ln net.Listener, more ...net.Listener) error {
	ctx, s.stop = context.WithCancel(ctx)
	defer s.stop()
	go func() {
		<-ctx.Done()
		s.stopOnce.Do(func() { close(s.stopping) })
	}()
	s.protectRunning(ln)
	if fi, err := os.Stat(s.cfg.StateDir); err == nil {
		s.stateAt = fi.Sys().(*syscall.Stat_t)
	}
	engine.DropLeftovers(s.cfg.StateDir, true)
	// The start reconcile runs beside the socket, not before it: it may
	// wait long — for a program a killed executor left running (up to that
	// program's deadline; an action's may be an hour), for a rescue apply
	// holding the store — and meanwhile an agent that found no socket
	// would say the executor gone. It takes the apply lock before the
	// first connection is accepted, so every request that applies or
	// reads an apply's end (a declaration, lastApplied, a plan, a grant)
	// comes after it, as before; hello and status are answered at once.
	held := make(chan struct{})
	if !s.spawn(func() {
		s.guard("the start reconcile", func() {
			s.applyMu.Lock()
			close(held)
			defer s.applyMu.Unlock()
			s.reconcile(ctx, triggerStart, nil, false)
			// Under the lock still: a declaration waiting for it is
			// refused for the stop, not applied by the old binary.
			s.restartIfUpgraded()
		})
		s.guard("finding the profile", func() { s.findProfile(ctx) })
	}) {
		close(held)
	}
	<-held
	if !s.cfg.Partial {
		s.spawn(func() { s.watchFirewall(ctx) })
	}
	if s.cfg.DriftEvery > 0 {
		s.spawn(func() {
			t := time.NewTicker(s.cfg.DriftEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if ctx.Err() != nil {
						return // the tick and the stop came together
					}
					s.guard("the drift reconcile", func() {
						s.Reconcile(ctx, triggerDrift, nil)
						s.restartIfUpgraded()
						s.findProfile(ctx)
					})
				}
			}
		})
	}
	for _, l := range more {
		s.spawn(func() {
			if err := s.accept(ctx, l); err != nil {
				s.log.Error("executor: serving "+l.Addr().String()+" ended", "err", err)
			}
		})
	}
	err := s.accept(ctx, ln)
	s.drain()
	return err
}

// spawn runs f as one of the daemon's own tasks, which Run waits for;
// not once Run is stopping (it says whether f runs).
func (s *Server) spawn(f func()) bool {
	s.slotMu.Lock()
	defer s.slotMu.Unlock()
	if s.draining {
		return false
	}
	s.tasks.Add(1)
	go func() {
		defer s.tasks.Done()
		f()
	}()
	return true
}

// drain stops what Run started and waits for it: no new connection or
// request, every connection's reading side shut (one waiting for its next
// request ends at once, one running a request once it is answered), an
// apply in progress ended before its next resource.
func (s *Server) drain() {
	s.stop()
	s.stopOnce.Do(func() { close(s.stopping) })
	s.slotMu.Lock()
	s.draining = true
	busy := 0
	for c := range s.open {
		shutRead(c.NetConn())
		if c.busy {
			busy++
		}
	}
	s.slotMu.Unlock()
	applying := !s.applyMu.TryLock()
	if !applying {
		s.applyMu.Unlock()
	}
	if busy > 0 || applying {
		s.log.Info("stopping: waiting for what is in progress (an apply ends before its next resource; a second SIGTERM or SIGINT ends the process at once)", "requests", busy, "applying", applying)
	}
	s.tasks.Wait()
}

// openStore opens the state's store, if the directory is still the one
// this daemon started on. Moved or removed under it, the store would be
// made anew, empty, and the machine's holdings taken for found — and its
// lock (serve.lock, in the directory moved) would no longer keep a second
// daemon off the path: so nothing is applied, and the daemon stops, said
// in its log; its next start takes the directory as it is then.
func (s *Server) openStore() (*store.Store, error) {
	if err := s.stateHere(); err != nil {
		return nil, err
	}
	return store.Open(s.cfg.StateDir)
}

// stateHere fails once the state directory is not the one this daemon
// started on (openStore), and stops the daemon the first time.
func (s *Server) stateHere() error {
	if s.stateAt != nil {
		fi, err := os.Stat(s.cfg.StateDir)
		if err != nil || fi.Sys().(*syscall.Stat_t).Dev != s.stateAt.Dev || fi.Sys().(*syscall.Stat_t).Ino != s.stateAt.Ino {
			what := "replaced by another directory"
			if err != nil {
				what = "gone (" + err.Error() + ")"
			}
			err := fmt.Errorf("executor: the state directory %s is not the one this daemon started on: %s since; nothing is applied, and the daemon stops (its next start takes the directory as it is then)", s.cfg.StateDir, what)
			s.stateGone.Do(func() {
				s.log.Error("the state directory was moved or replaced under the daemon", "err", err)
				if s.stop != nil {
					s.stop()
				}
			})
			return err
		}
	}
	return nil
}

// lockStore takes st's lock, waiting up to LockWait for a rescue apply
// that holds it, and no longer once the daemon is asked to stop: a stop
// waits for what runs, not for what has yet to begin.
func (s *Server) lockStore(st *store.Store) error {
	deadline := clock.Deadline(s.cfg.LockWait)
	for {
		err := st.Lock(0)
		if !errors.Is(err, store.ErrBusy) || clock.Past(deadline) {
			return err
		}
		select {
		case <-s.stopping:
			return fmt.Errorf("asked to stop while waiting for the store's lock (%w); nothing was changed", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// applyContext is the context an apply runs under: not ended by the
// daemon's stop, which ends the apply between two resources instead
// (engine.Options.Stop). Cancelled, it would kill the package manager or
// the action in progress (command.Run kills its process group), leaving
// a half-installed package for a stop asked by an upgrade or a reboot.
func applyContext(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// shutRead ends what a connection reads, leaving its writes: a reply
// queued is still written. A connection with no reading side of its own
// to shut is closed.
func shutRead(nc net.Conn) {
	if c, ok := nc.(interface{ CloseRead() error }); ok && c.CloseRead() == nil {
		return
	}
	nc.Close()
}

// protectRunning adds to the protected set, before the first apply, the
// paths this daemon runs from beyond its state and binary (which every
// apply adds): its socket's directory, the agent's state, and the
// launcher's binary and known-good copies as its launch state names them.
func (s *Server) protectRunning(ln net.Listener) {
	engine.ProtectRunning("state directory", s.cfg.StateDir)
	paths := []engine.RunningPath{{What: "agent's state directory", Path: s.cfg.AgentState}}
	socket := wire.ServedPath(ln)
	if socket != "" {
		paths = append(paths, engine.RunningPath{What: "socket directory", Path: filepath.Dir(socket)})
	}
	if st, err := launcher.ReadState(s.cfg.StateDir); err == nil {
		paths = append(paths, engine.RunningPath{What: "launcher's known-good directory", Path: st.KnownGoodDir},
			engine.RunningPath{What: "launcher", Path: st.Launcher})
	}
	// Kept for a rescue apply of this state, a process of its own.
	if err := engine.RecordRunning(s.cfg.StateDir, socket, paths); err != nil {
		s.log.Warn("where this daemon runs from could not be kept for a rescue apply to refuse; it refuses them itself", "err", err)
	}
	s.log.Debug("the protected set covers the running instance", "paths", shapes.Running())
}

// accept takes connections on ln until ctx ends.
func (s *Server) accept(ctx context.Context, ln net.Listener) error {
	closed := make(chan struct{})
	go func() {
		<-ctx.Done()
		ln.Close()
		close(closed)
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				// The listener is closed (and its socket file removed)
				// before accept returns, so a new executor can take the path.
				<-closed
				return nil
			}
			return fmt.Errorf("executor: accept: %w", err)
		}
		c, refused := s.admit(nc)
		if c == nil {
			// Every slot is running a handler (no connection waits
			// idle), or the daemon is stopping.
			nc.SetWriteDeadline(clock.Deadline(wire.ReplyWithin))
			wire.NewConn(nc, wire.AgentToExecutor).Write(wire.KindError, &wire.Error{Code: wire.CodeBusy, Message: refused})
			nc.Close()
			continue
		}
		// Begun, a request is answered as if no stop had come: a plan
		// or a profile made on a context the stop cancelled says
		// failures the stop caused (the stop waits for it: drain).
		go s.handle(context.WithoutCancel(ctx), c)
	}
}

// identity is the node's identity, from the state this daemon started on:
// a state moved away would read as no identity, a host never enrolled —
// and the agent told "not enrolled" takes its node for retired. So an
// error here (that, or an identity that does not read) is said as one,
// never as "hosted", by every request, hello and status included.
func (s *Server) identity() (*identity.Identity, error) {
	if err := s.stateHere(); err != nil {
		return nil, err
	}
	return identity.Load(s.cfg.StateDir)
}

// hostIdentity is identity for hello and status: an identity that does
// not read is refused by them (never "hosted") — unless root has begun an
// enrolment, which is how such a host gets one that reads again: then it
// is said hosted, the enrolment pending (status), for the agent to carry
// out. A state moved away is refused whatever it holds.
func (s *Server) hostIdentity() (*identity.Identity, error) {
	id, err := s.identity()
	if err != nil && s.stateHere() == nil && enrol.IsPending(s.cfg.StateDir) {
		return nil, nil
	}
	return id, err
}

func (s *Server) hello(_ context.Context, c *conn, body any) (wire.Kind, any, error) {
	h := body.(*wire.Hello)
	if c.vsock {
		if err := wire.CheckSecret(h.Secret, s.cfg.VsockSecret); err != nil {
			return 0, nil, &wire.Refusal{Code: wire.CodeProtocol, Reason: err.Error()}
		}
	}
	if h.Protocol != wire.ProtocolVersion {
		return 0, nil, &wire.Refusal{Code: wire.CodeProtocol, Reason: fmt.Sprintf("protocol %d; this executor speaks %d", h.Protocol, wire.ProtocolVersion)}
	}
	reply := &wire.HelloReply{Protocol: wire.ProtocolVersion, Version: s.cfg.Version, Build: s.cfg.Build, State: "hosted"}
	id, err := s.hostIdentity()
	if err != nil { // not "hosted": identity says why
		return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: err.Error()}
	}
	if id != nil {
		reply.Node, reply.State = id.Node, "enrolled"
	}
	return wire.KindHelloReply, reply, nil
}

func (s *Server) status(_ context.Context, c *conn, body any) (wire.Kind, any, error) {
	s.spawn(func() { s.proveAgent(c.pid, c.uid) })
	s.noteLink(body.(*wire.Status).Link)
	s.lastMu.Lock()
	last := s.last
	s.lastMu.Unlock()
	reply := &wire.StatusReply{Version: s.cfg.Version, Build: s.cfg.Build, State: "hosted", Seq: last.Seq, Outcome: last.Outcome}
	id, err := s.hostIdentity()
	if err != nil { // as hello
		return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: err.Error()}
	}
	if id != nil {
		reply.Node, reply.State, reply.ControlKeyID = id.Node, "enrolled", wire.KeyID(id.ControlKey)
	}
	if k, ok, err := overlay.LoadKey(s.cfg.StateDir); err == nil && ok {
		reply.WireGuardKey = k.PublicKey().String()
	}
	reply.Activity = s.newestActivity()
	reply.Enrolling = enrol.IsPending(s.cfg.StateDir)
	if !reply.Enrolling {
		if r, err := enrol.RekeyRequest(s.cfg.StateDir); err == nil {
			reply.Rekey = r
		} else {
			s.log.Warn("the pending rekey's request could not be made", "err", err.Error())
		}
	}
	if st, err := launcher.ReadState(s.cfg.StateDir); err == nil && st.Failed != nil {
		reply.RolledBackFrom, reply.RollbackReason = st.Failed.Version, clip(st.Failed.Reason, 1024)
	}
	s.foundMu.Lock()
	reply.ProfileDigest = s.found.Digest
	s.foundMu.Unlock()
	return wire.KindStatusReply, reply, nil
}

// findProfile looks at what the machine can do and what it is, and keeps
// it with its digest. It runs after the start and drift reconciles (the
// probes ask the init, the runtime, the firewall: not for every request).
func (s *Server) findProfile(ctx context.Context) {
	prof, _ := json.Marshal(profile.Detect(ctx, profile.Options{}))
	inv, err := profile.Collect(ctx, s.cfg.Version)
	if err != nil {
		s.log.Debug("inventory incomplete", "err", err)
	}
	s.foundMu.Lock()
	s.foundProfile, s.foundInv, s.foundAt = prof, inv, clock.Now()
	s.foundMu.Unlock()
	holds := -1
	if st, err := s.openStore(); err == nil {
		holds = len(st.Entries())
	}
	s.countHolds(holds)
}

// countHolds puts how many things the host holds (-1: unknown, keep the
// last count) into the inventory — after every apply, from the store the
// apply already has open — and names the result with a digest.
func (s *Server) countHolds(holds int) {
	s.foundMu.Lock()
	defer s.foundMu.Unlock()
	if s.foundProfile == nil {
		return // not found yet
	}
	if holds >= 0 {
		s.foundInv.Holds = holds
	}
	invJSON, _ := json.Marshal(s.foundInv)
	// The digest leaves out when the profile was found: only what was.
	var p struct {
		Capabilities json.RawMessage `json:"capabilities"`
	}
	json.Unmarshal(s.foundProfile, &p)
	sum := sha256.Sum256(append(append([]byte(nil), p.Capabilities...), invJSON...))
	s.found = wire.ProfileReply{Profile: s.foundProfile, Inventory: invJSON, Digest: hex.EncodeToString(sum[:8])}
}

func (s *Server) profile(_ context.Context, _ *conn, _ any) (wire.Kind, any, error) {
	s.foundMu.Lock()
	reply := s.found
	s.foundMu.Unlock()
	return wire.KindProfileReply, &reply, nil
}

// failedRelease is the host release the launcher rolled back from, if
// any, and why.
func (s *Server) failedRelease() (version, why string) {
	if st, err := launcher.ReadState(s.cfg.StateDir); err == nil && st.Failed != nil {
		return st.Failed.Version, st.Failed.Reason
	}
	return "", ""
}

// noteUpgrade keeps what an apply reported about the host's own package.
func (s *Server) noteUpgrade(rep *shapes.Report) {
	if rep.Upgraded == "" {
		return
	}
	s.lastMu.Lock()
	s.upgradeTo = rep.Upgraded
	s.lastMu.Unlock()
}

// restartIfUpgraded ends the daemon cleanly (exit 0) when an apply has
// installed another version of the host and seen it run: the host stops
// by finishing, never part-way through an apply, and never asks the init
// to restart it — the launcher starts the new binary at once.
func (s *Server) restartIfUpgraded() {
	s.lastMu.Lock()
	to := s.upgradeTo
	s.lastMu.Unlock()
	if to == "" || s.stop == nil {
		return
	}
	s.log.Info("upgraded: the apply is finished and reported; exiting 0 so the launcher starts the new host", "running", s.cfg.Version, "installed", to)
	s.stop()
}

// enrol answers an agent asking whether an enrolment is pending: with
// none, an empty offer; with one, the network half of the token, the
// public keys and the proof made for the agent's NKey (never the secret),
// and the machine's profile and inventory for the control side.
func (s *Server) enrol(ctx context.Context, _ *conn, body any) (wire.Kind, any, error) {
	e := body.(*wire.Enrol)
	if !enrol.IsPending(s.cfg.StateDir) {
		if g, err := enrol.Granted(s.cfg.StateDir, e.AgentNKey); err == nil && g != nil {
			return wire.KindEnrolOffer, g, nil
		}
		return wire.KindEnrolOffer, &wire.EnrolOffer{}, nil
	}
	prof, inv := s.offerProfile(ctx)
	invJSON, _ := json.Marshal(inv)
	offer, err := enrol.Offer(s.cfg.StateDir, e.AgentNKey, inv.Hostname, prof, invJSON)
	if err != nil {
		return 0, nil, &wire.Refusal{Code: wire.CodeInvalid, Reason: err.Error()}
	}
	if offer == nil {
		offer = &wire.EnrolOffer{}
	}
	s.log.Info("enrolment offered to the agent", "token", offer.Token, "agent_nkey", e.AgentNKey)
	return wire.KindEnrolOffer, offer, nil
}

// offerProfile is the machine's profile and inventory for an enrolment
// offer: the ones found in the last minute, not found anew at each ask —
// the agent asks every few seconds while an enrolment is pending (a
// compromised one as often as the rate allows), and finding them runs
// commands as root. The enrolment root just began still gets the machine
// as it is now, not as the daemon found it at its start.
func (s *Server) offerProfile(ctx context.Context) ([]byte, profile.Inventory) {
	s.foundMu.Lock()
	prof, inv, at := s.foundProfile, s.foundInv, s.foundAt
	s.foundMu.Unlock()
	if prof != nil && clock.Since(at) <= time.Minute {
		return prof, inv
	}
	s.findProfile(ctx)
	s.foundMu.Lock()
	defer s.foundMu.Unlock()
	return s.foundProfile, s.foundInv
}

// grant takes what the agent brought back from the control side: a grant,
// verified and matched to this enrolment before anything is recorded, or
// why there is none.
func (s *Server) grant(_ context.Context, _ *conn, body any) (wire.Kind, any, error) {
	g := body.(*wire.GrantHandover)
	if len(g.Envelope) == 0 {
		// The agent's word, shown to root by enrol and status: who it
		// says refused is one of the three it can speak for, and its
		// reason is text alone (no terminal's control sequence), bounded.
		by := g.RefusedBy
		switch by {
		case "agent", "broker", "control":
		default:
			by = "agent"
		}
		reason := wire.LinkErrorText(g.Reason)
		if err := enrol.Refused(s.cfg.StateDir, by, reason, g.Final); err != nil {
			return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: err.Error()}
		}
		s.log.Warn("enrolment: no grant", "refused_by", by, "reason", reason, "final", g.Final)
		return wire.KindGrantReply, &wire.GrantReply{Reason: "noted: " + reason}, nil
	}
	reply := s.acceptGrant(g)
	return wire.KindGrantReply, reply, nil
}

// acceptGrant records a grant under the apply lock, and returns the answer
// for the loop to write once the lock is released.
func (s *Server) acceptGrant(g *wire.GrantHandover) *wire.GrantReply {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	id, err := enrol.Accept(s.cfg.StateDir, g.Envelope)
	if err != nil {
		s.log.Warn("enrolment: grant refused", "reason", err.Error())
		return &wire.GrantReply{Reason: "executor: " + err.Error()}
	}
	reply := &wire.GrantReply{Enrolled: true, Node: id.Node, Enrolment: id.Enrolment}
	if len(g.StoreCopy) > 0 {
		// A re-enrolment after a lost store: the control side's copy of
		// what the node owned goes into an empty store, never over one.
		rec, err := enrol.Recover(s.cfg.StateDir, id, g.StoreCopy, s.cfg.LockWait)
		switch {
		case err != nil:
			s.log.Warn("enrolment: the store copy was not taken in", "reason", err.Error())
		case rec.Intact:
			s.log.Info("enrolment: the store is intact; the control side's copy is not used (the node wins)")
		default:
			reply.Recovered = rec.Taken
			s.log.Info("enrolment: the lost store recovered from the control side's copy", "entries", rec.Taken, "skipped", len(rec.Skipped))
			for _, sk := range rec.Skipped {
				s.log.Info("enrolment: not recovered: " + sk)
			}
		}
	}
	if f, err := identity.ReadFloor(s.cfg.StateDir); err == nil {
		s.lastMu.Lock()
		s.last = lastApplied{Seq: f.Seq}
		s.lastMu.Unlock()
	}
	s.log.Info("enrolled", "node", id.Node, "enrolment", id.Enrolment, "control_key", wire.KeyID(id.ControlKey))
	return reply
}

// reconnectEvery bounds how often the agent can make the executor
// reconcile everything: a compromised agent must not turn reconnects into
// a loop of full reconciles.
const reconnectEvery = 10 * time.Second

func (s *Server) declaration(ctx context.Context, c *conn, body any) (wire.Kind, any, error) {
	defer s.giveBack()
	// What this connection streamed was for this declaration: it keeps
	// what it names, and the cache lets go of the rest. Let go under the
	// apply lock, not before it: a prune in between (another's apply, a
	// stream's room) would drop what this apply is about to read.
	handedOver := func() {
		s.streamMu.Lock()
		delete(s.streamed, c)
		s.streamMu.Unlock()
	}
	return wire.KindVerdict, s.applyEnvelope(ctx, body.(*wire.Declaration).Envelope, c.line, handedOver), nil
}

// quietAfter is how long the daemon waits after an apply before it gives
// the apply's memory back.
const quietAfter = time.Second

// giveBack returns to the system, once applies have stopped coming for a
// moment, the heap a burst of them grew to: the daemon lives for months,
// often on small machines, and Go's scavenger would return it only
// gradually. One collection per quiet moment, not per apply.
func (s *Server) giveBack() {
	s.quietMu.Lock()
	defer s.quietMu.Unlock()
	if s.quiet == nil {
		s.quiet = time.AfterFunc(quietAfter, debug.FreeOSMemory)
		return
	}
	s.quiet.Reset(quietAfter)
}

func (s *Server) reconnected(ctx context.Context, c *conn, body any) (wire.Kind, any, error) {
	r := body.(*wire.Reconnected)
	s.lastMu.Lock()
	recent := clock.Since(s.lastReconnect) < reconnectEvery
	if !recent {
		s.lastReconnect = clock.Now()
	}
	s.lastMu.Unlock()
	var v *wire.Verdict
	began, before := clock.Now(), s.newestActivity()
	if recent {
		// Answered, not refused: a link that flaps is not an attack.
		v = &wire.Verdict{Outcome: shapes.Unchanged, Reason: "executor: reconciled less than 10s ago; not again yet"}
	} else {
		v = s.Reconcile(ctx, triggerReconnect, c.line)
	}
	// What this executor did on its own since the agent last reported
	// (activity.go): by count when the agent keeps one, else while the
	// link was down by the clock, up to this reconcile — a start's that
	// ended after the link came back (both begun at a boot) was done
	// unlinked all the same.
	newest := s.newestActivity()
	switch {
	case r.After != nil:
		part, err := store.Newer(s.cfg.StateDir, *r.After, before, wire.MaxMeanwhile, unsaid)
		since, serr := store.Newer(s.cfg.StateDir, before, newest, wire.MaxMeanwhile, ownActivity)
		if err = cmp.Or(err, serr); err != nil {
			s.log.Warn("the history of applies could not be read whole", "err", err)
		}
		acts, lost := append(part.Acts, since.Acts...), part.Lost+since.Lost
		if n := len(acts) - wire.MaxMeanwhile; n > 0 {
			acts, lost = acts[n:], lost+uint64(n)
		}
		v.Meanwhile, v.MeanwhileMore = acts, int(min(lost, 1<<20))
	case !r.From.IsZero() && !r.To.Before(r.From):
		if began.After(r.To) {
			r.To = began
		}
		acts, more, err := store.History(s.cfg.StateDir, r.From, r.To, wire.MaxMeanwhile)
		if err != nil {
			s.log.Warn("the history of applies could not be read", "err", err)
		}
		v.Meanwhile, v.MeanwhileMore = acts, more
	}
	v.Activity = newest
	return wire.KindVerdict, v, nil
}

// archiveChunk takes one chunk of an archive stream into the cache. The
// stream is the agent's word for nothing: its digest only names the file,
// which is kept only if what was written has that digest; whether and
// where an archive is unpacked comes from a signed declaration alone.
// Only an enrolled executor takes a stream (a hosted one takes nothing
// from the link); chunks come in order, one stream per connection and per
// digest, each bounded, the whole bounded; anything else ends the stream,
// leaving nothing, and closes the connection.
//
// A refusal's code says whose it is (wire.Code.Passing): see cacheFull
// for the cache's bound. The state disk's room, or a write the disk
// refused, is of the moment (internal): streamed again after the
// back-off. A stream past the 4 GiB one may carry comes only from an
// agent that lies (its own check of the object's size refuses the
// declaration first).
func (s *Server) archiveChunk(_ context.Context, c *conn, body any) (wire.Kind, any, error) {
	a := body.(*wire.Archive)
	if c.archive == nil {
		if !engine.ValidDigest(a.SHA256) {
			return 0, nil, &wire.Refusal{Code: wire.CodeMalformed, Reason: fmt.Sprintf("archive digest %q is not 64 lower-case hex digits", a.SHA256)}
		}
		id, err := s.identity()
		if err != nil {
			return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: err.Error()}
		}
		if id == nil {
			return 0, nil, &wire.Refusal{Code: wire.CodeNotEnrolled, Reason: "this host has no identity (hosted): it takes no archive from the link"}
		}
		if a.Offset != 0 {
			return 0, nil, &wire.Refusal{Code: wire.CodeProtocol, Reason: fmt.Sprintf("archive %s: a stream starts at offset 0, not %d", a.SHA256, a.Offset)}
		}
		s.streamMu.Lock()
		busy := s.streaming[a.SHA256]
		if !busy {
			s.streaming[a.SHA256] = true
		}
		s.streamMu.Unlock()
		if busy {
			return 0, nil, &wire.Refusal{Code: wire.CodeBusy, Reason: fmt.Sprintf("archive %s is being streamed on another connection", a.SHA256)}
		}
		w, err := engine.NewCacheWriter(s.cfg.StateDir, a.SHA256, engine.StreamSuffix, engine.MaxArchiveBytes)
		if err != nil {
			s.release(a.SHA256, c, false)
			return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: err.Error()}
		}
		c.archive, c.sum = w, a.SHA256
	} else if a.SHA256 != c.sum {
		return 0, nil, &wire.Refusal{Code: wire.CodeProtocol, Reason: fmt.Sprintf("archive %s while %s is streaming: one stream at a time", a.SHA256, c.sum)}
	}
	// The cache's bound is checked at every chunk against what is in it
	// now — streams on other connections included, each .part as far as
	// it got — not once when a stream starts: streams that start together
	// must not each be promised the room that is left.
	if r := s.cacheFull(c.sum, uint64(len(a.Chunk))); r != nil {
		return 0, nil, r
	}
	// Nor past the room the state's disk keeps for what must be written
	// there whatever the agent streams: the journal, a drift's repair,
	// root's rescue. The cache's bound is a size, and a disk smaller than
	// it, or fuller, would fill first.
	if free, keep, err := stateRoom(s.cfg.StateDir); err == nil && free < keep+uint64(len(a.Chunk)) {
		return 0, nil, &wire.Refusal{Code: wire.CodeInternal, Reason: fmt.Sprintf("archive %s: the state's disk has %d bytes free, and keeps %d for the store and root's rescue; this chunk would take it below", c.sum, free, keep)}
	}
	if err := c.archive.Write(a.Offset, a.Chunk); err != nil {
		code := wire.CodeProtocol
		if a.Offset == c.archive.Written() {
			code = wire.CodeInternal // in order: the disk's
		}
		return 0, nil, &wire.Refusal{Code: code, Reason: err.Error()}
	}
	if !a.Last {
		return 0, nil, nil
	}
	w, sum := c.archive, c.sum
	c.archive, c.sum = nil, ""
	_, err := w.Commit()
	s.release(sum, c, err == nil)
	ack := &wire.ArchiveAck{SHA256: sum, Stored: err == nil}
	if err != nil {
		ack.Reason = "executor: " + err.Error()
		s.log.Warn("an archive stream was not kept", "sha256", sum, "err", err)
	} else {
		s.log.Info("archive stored in the cache", "sha256", sum, "bytes", w.Written())
	}
	return wire.KindArchiveAck, ack, nil
}

// endArchive drops a stream the connection did not finish, and its hold
// on what it streamed: a connection gone hands nothing over.
func (s *Server) endArchive(c *conn) {
	s.streamMu.Lock()
	delete(s.streamed, c)
	s.streamMu.Unlock()
	if c.archive != nil {
		c.archive.Abort()
		s.release(c.sum, c, false)
		s.log.Warn("an archive stream ended before its last chunk; nothing kept", "sha256", c.sum, "bytes", c.archive.Written())
		c.archive, c.sum = nil, ""
	}
}

// cacheFull is the refusal of n more bytes of a stream of archive sum
// that would take the cache past its bound, nil when they fit. What it
// counts is what it keeps: not an archive cached already that this stream
// replaces with the same bytes, nor, once it has looked, what nothing
// names any more (pruneArchives: a refused declaration's archives, a
// connection's that went). Past the bound with only the archives the
// declarations applied here name, and those streamed for the next, the
// refusal is the declaration's (too-large): they stay until a newer
// declaration applies, so the agent refuses it, said to the control side,
// rather than stream it again at every back-off. Past it with other
// streams or fetches in flight, or an apply running (nothing dropped
// meanwhile), it is of the moment (internal): streamed again later.
func (s *Server) cacheFull(sum string, n uint64) *wire.Refusal {
	kept, own, others := engine.ArchiveCacheUse(s.cfg.StateDir, sum)
	looked := kept+own+others+n > s.cfg.ArchiveCacheMax && s.applyMu.TryLock()
	if looked {
		looked = s.tidyCache()
		s.applyMu.Unlock()
		flight := others
		if kept, own, others = engine.ArchiveCacheUse(s.cfg.StateDir, sum); flight > 0 {
			looked = false // one may have ended meanwhile, kept now
		}
	}
	switch {
	case kept+own+others+n <= s.cfg.ArchiveCacheMax:
		return nil
	case !looked || kept+own+n <= s.cfg.ArchiveCacheMax:
		return &wire.Refusal{Code: wire.CodeInternal, Reason: fmt.Sprintf("archive %s: the archive cache holds %d bytes with the streams and applies in flight; this chunk would take it past its bound of %d: streamed again later", sum, kept+own+others, s.cfg.ArchiveCacheMax)}
	}
	why := fmt.Sprintf("archive %s: the archive cache holds %d bytes of the archives the declarations applied here name and this one so far; this chunk would take it past its bound of %d: declare fewer or smaller archives, or drop one in a declaration of its own first", sum, kept+own, s.cfg.ArchiveCacheMax)
	if st, err := s.openStore(); err == nil {
		if id, err := s.identity(); err == nil {
			if sums, n := KeptForRecords(s.cfg.StateDir, st, id); n > 0 {
				why += fmt.Sprintf("; of them, %d bytes (%d archives) no declaration names any more, kept for what their removal left on the machine (mesh-executor owned lists it): they go once it is gone, not by declaring fewer", n, len(sums))
			}
		}
	}
	return &wire.Refusal{Code: wire.CodeTooLarge, Reason: why}
}

// tidyCache, with the apply lock held, drops from the archive cache what
// nothing names any more (pruneArchives, the link's target read as the
// reconcile reads it) and, when no apply of a rescue's holds the store,
// the temporaries of fetches a kill cut short. Once in tidyEvery at most:
// it reads the store under the apply lock, and chunks past the bound are
// the agent's to send, as many as it likes. false: it did not look.
func (s *Server) tidyCache() bool {
	if !s.tidied.IsZero() && clock.Since(s.tidied) < tidyEvery {
		return false
	}
	s.tidied = clock.Now()
	st, err := s.openStore()
	if err != nil || !s.pruneArchives(st, nil) {
		return false
	}
	if st.Lock(0) == nil {
		engine.DropLeftovers(s.cfg.StateDir, false)
		st.Unlock()
	}
	return true
}

// tidyEvery bounds how often a stream past the cache's bound makes the
// daemon look at what the cache keeps.
const tidyEvery = 10 * time.Second

// release ends the stream of sum, holding what it stored for c's next
// declaration in the same step: a prune between the two would drop what
// the ack says stored.
func (s *Server) release(sum string, c *conn, stored bool) {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if stored {
		if s.streamed[c] == nil {
			s.streamed[c] = map[string]bool{}
		}
		s.streamed[c][sum] = true
	}
	delete(s.streaming, sum)
}

// sayAgain is the answer that says again the last declaration applied from
// the link, f (the floor): its outcome, the lines kept of its apply, and
// what the store owns now. It is the answer to that declaration handed
// over again and to the agent's LastApplied: one answer, however asked.
func (s *Server) sayAgain(f identity.Floor, emit func(shapes.Line)) *wire.Verdict {
	v := &wire.Verdict{Seq: f.Seq, Outcome: s.lastOutcome(), Duplicate: true, Prior: f.Prior}
	if kept := readKeptLines(s.cfg.StateDir, f.Seq, f.Digest); kept != nil {
		if kept.Outcome != "" {
			v.Outcome = kept.Outcome
		}
		for _, l := range kept.Lines {
			if emit != nil {
				emit(l)
			}
		}
	}
	// And what the store owns now, as an apply's verdict says it: the
	// report said again is the newest, and the control side keeps the
	// newest report's copy to hand back to a node that lost its store
	// (one without it left an older apply's copy as the newest).
	if st, err := s.openStore(); err == nil {
		v.Owned = enrol.Owned(st)
	}
	return v
}

// lastApplied answers the agent's LastApplied: the last declaration
// applied from the link, said again, when it is past the sequence the
// agent names; else a verdict naming the floor, with no outcome. Under
// the apply lock, as a declaration handed over again is: the floor, the
// lines kept and the outcome are then of one apply.
func (s *Server) lastApplied(_ context.Context, c *conn, body any) (wire.Kind, any, error) {
	after := body.(*wire.LastApplied).After
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	id, err := s.identity()
	if err != nil {
		return wire.KindVerdict, refusal(wire.CodeInternal, "%v", err), nil
	}
	if id == nil {
		return wire.KindVerdict, refusal(wire.CodeNotEnrolled, "this host has no identity (hosted): it has applied nothing from the link"), nil
	}
	f, err := identity.ReadFloor(s.cfg.StateDir)
	if err != nil {
		return wire.KindVerdict, refusal(wire.CodeInternal, "read the sequence floor: %v", err), nil
	}
	if f.Seq <= after || f.Digest == "" || !f.Of(id.Enrolment) {
		// None past it, or a floor an enrolment set: no apply to say.
		return wire.KindVerdict, &wire.Verdict{Seq: f.Seq}, nil
	}
	return wire.KindVerdict, s.sayAgain(f, c.line), nil
}

// lastOutcome is the outcome of the last link apply: this process's, or
// the one the store kept from before a restart.
func (s *Server) lastOutcome() shapes.Outcome {
	s.lastMu.Lock()
	o := s.last.Outcome
	s.lastMu.Unlock()
	if o != "" {
		return o
	}
	if st, err := s.openStore(); err == nil {
		if b, _ := st.Report(store.Link); b != nil {
			var sum store.ReportSummary
			if json.Unmarshal(b, &sum) == nil {
				return sum.Outcome
			}
		}
	}
	return ""
}

// openRefusal is the refusal of an envelope that does not open under the
// pinned key for the purpose expected.
func openRefusal(err error) *wire.Verdict {
	code := wire.CodeMalformed
	switch {
	case errors.Is(err, wire.ErrWrongKey):
		code = wire.CodeWrongKey
	case errors.Is(err, wire.ErrBadSignature):
		code = wire.CodeSignature
	case errors.Is(err, wire.ErrWrongPurpose):
		code = wire.CodePurpose
	}
	return refusal(code, "%v", err)
}

func refusal(code wire.Code, format string, args ...any) *wire.Verdict {
	return &wire.Verdict{Outcome: shapes.Refused, Code: code, Reason: "executor: " + strings.TrimPrefix(fmt.Sprintf(format, args...), "executor: ")}
}

// ApplyEnvelope verifies envelope bytes as the control plane published
// them and, if every check passes, applies the declaration, giving each
// report line to emit (which may be nil).
func (s *Server) ApplyEnvelope(ctx context.Context, env []byte, emit func(shapes.Line)) *wire.Verdict {
	return s.applyEnvelope(ctx, env, emit, nil)
}

// applyEnvelope is ApplyEnvelope, calling handedOver (when set) once it
// holds the apply lock.
func (s *Server) applyEnvelope(ctx context.Context, env []byte, emit func(shapes.Line), handedOver func()) *wire.Verdict {
	// Under the apply lock from the identity on: a grant or a key's
	// rotation waiting on it ahead of this declaration changes the node,
	// its enrolment and the pinned key, and a declaration checked against
	// the ones before would be applied under the ones after.
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if handedOver != nil {
		handedOver()
	}
	id, err := s.identity()
	if err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	if id == nil {
		return refusal(wire.CodeNotEnrolled, "this host has no identity (hosted): it takes no declaration from the link")
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeDeclaration, env)
	if err != nil {
		return openRefusal(err)
	}
	d, err := shapes.Parse(payload)
	if err != nil {
		if errors.Is(err, shapes.ErrAction) {
			return refusal(wire.CodeAction, "%v", err)
		}
		return refusal(wire.CodeInvalid, "%v", err)
	}
	v := &wire.Verdict{Seq: d.Seq}
	if d.Node != id.Node || d.Enrolment != id.Enrolment {
		v = refusal(wire.CodeAddress, "addressed to node %q enrolment %q; this is node %q enrolment %q", d.Node, d.Enrolment, id.Node, id.Enrolment)
		v.Seq = d.Seq
		return v
	}
	sum := sha256.Sum256(env)
	digest := hex.EncodeToString(sum[:])

	f, err := identity.ReadFloor(s.cfg.StateDir)
	if err != nil {
		return refusal(wire.CodeInternal, "read the sequence floor: %v", err)
	}
	if !f.Of(id.Enrolment) {
		// Its floor may be lower than this identity's own: nothing is
		// taken against it.
		v = refusal(wire.CodeInternal, "the sequence floor is enrolment %s's, not this identity's (%s): that enrolment was cut short (a crash, a full disk) and finishes when the agent hands its grant over again; no declaration is taken meanwhile", f.Enrolment, id.Enrolment)
		v.Seq = d.Seq
		return v
	}
	switch {
	case d.Seq == f.Seq && digest == f.Digest && f.Seq > 0:
		// Applied already (the agent hands it over again after a
		// connection broke before the verdict): nothing is done, and the
		// report says what that apply did, so it never loses its lines.
		if d.Retire {
			// A retirement is said, and finished if a kill cut it after
			// its apply, only as its own apply ended: one cut before
			// its end is ended by the reconcile (finishRetirement), and
			// taken when handed over after that.
			kept := readKeptLines(s.cfg.StateDir, f.Seq, f.Digest)
			if kept == nil {
				v = refusal(wire.CodeInternal, "the retirement's apply was cut short before its end; the executor's reconcile ends it, and it is said when handed over again")
				v.Seq = d.Seq
				return v
			}
			v = s.sayAgain(f, emit)
			s.retireAfter(d, kept.Outcome, id)
			return v
		}
		return s.sayAgain(f, emit)
	case d.Seq == f.Seq && f.Seq > 0:
		v = refusal(wire.CodeConflict, "sequence %d was applied already with other bytes; refused", d.Seq)
		v.Seq = d.Seq
		return v
	case d.Seq <= f.Seq:
		v = refusal(wire.CodeReplay, "sequence %d is not newer than the last applied, %d", d.Seq, f.Seq)
		v.Seq = d.Seq
		return v
	}
	st, err := s.openStore()
	if err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	if err := s.lockStore(st); err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	defer st.Unlock()
	// The floor moves once the declaration has passed every check and is
	// saved as the target, before the machine changes: no crash can then
	// let an older one in, and a passing refusal burns nothing.
	accepted := func() error {
		prior := f.Seq
		if err := identity.WriteFloor(s.cfg.StateDir, identity.Floor{Seq: d.Seq, Digest: digest, Prior: &prior, Enrolment: id.Enrolment}); err != nil {
			return fmt.Errorf("record the sequence floor: %w", err)
		}
		return nil
	}
	failed, failedWhy := s.failedRelease()
	began := clock.Now()
	// The report kept before the apply's end is journaled: the agent
	// hands a declaration whose verdict it never had over again, and the
	// lines kept (durably) are then its report. (A refused declaration
	// applied nothing, and keeps nothing.)
	var kept shapes.Outcome
	keptCount := -1
	keepLinesOf := func(rep *shapes.Report) {
		if err := keepLines(s.cfg.StateDir, d.Seq, digest, rep); err != nil {
			s.log.Warn("the apply's lines could not be kept for a report sent again", "seq", d.Seq, "err", err)
		}
		kept, keptCount = rep.Outcome, len(rep.Lines)
	}
	keep := func(rep *shapes.Report) {
		if err := st.SaveReport(store.Link, triggerDeclaration, rep); err != nil {
			s.log.Warn("the apply's summary and history could not be kept", "source", store.Link, "seq", rep.Seq, "err", err)
		}
		keepLinesOf(rep)
	}
	rep := engine.Apply(applyContext(ctx), st, d, env, engine.Options{Source: store.Link, NodeID: id.Node, Partial: s.cfg.Partial, Log: s.log, OnLine: emit, Accepted: accepted, Roster: heldRoster(s.cfg.StateDir, id), Stop: s.stopping,
		Unseal: Unsealer(s.cfg.StateDir, d.Node, d.Seq), HostBinary: s.cfg.HostBinary, HostVersion: s.cfg.Version, AgentUser: s.cfg.AgentUser, FailedHostRelease: failed, FailedHostReason: failedWhy, Keep: keep})
	if keptCount >= 0 && (kept != rep.Outcome || keptCount != len(rep.Lines)) {
		// What the apply said after it kept its report (its records'
		// commit failed: a full disk) is part of it: the report said
		// again is the apply's last word.
		keepLinesOf(rep)
	}
	s.record(st, store.Link, triggerDeclaration, rep, clock.Since(began))
	s.noteUpgrade(rep)
	if rep.Outcome != shapes.Refused {
		s.pruneArchives(st, d)
	}
	if rep.Outcome == shapes.Refused {
		code := wire.CodeInvalid
		if rep.Passing {
			code = wire.CodeInternal // no floor moved: it may be delivered again
		}
		v = refusal(code, "%s", strings.TrimPrefix(rep.Refused, "executor: "))
		v.Seq = d.Seq
		return v
	}
	v.Outcome = rep.Outcome
	v.Briefing = rep.Briefing.Summary(100)
	v.Owned = enrol.Owned(st)
	v.Prior = &f.Seq                // the declarations between it and this one never ran
	s.countHolds(len(st.Entries())) // the store at hand: not opened again
	s.retireAfter(d, rep.Outcome, id)
	return v
}

// retireAfter ends the node when d, the link's declaration, retires it
// and its own apply ended with outcome, not failed: it holds nothing now,
// drops the node's keys and then its identity, and, back to hosted, takes
// nothing more from the link. A kill anywhere in it leaves the identity
// until both are gone: the retirement, handed over again by the agent or
// reconciled at the next start, comes here again and finishes. What
// decides is the outcome of the retirement's own apply, as its verdict or
// the lines kept of it say, never a later reconcile's: a retirement that
// failed, and was reported failed, is not carried out unsaid by a drift
// reconcile that succeeds.
func (s *Server) retireAfter(d *shapes.Declaration, outcome shapes.Outcome, id *identity.Identity) {
	if !d.Retire || outcome == shapes.Failed || outcome == shapes.Refused || outcome == "" {
		return
	}
	if err := enrol.Forget(s.cfg.StateDir); err != nil {
		s.log.Error("retire: the node's keys could not all be dropped, and its identity is kept until they are (the next start, or the retirement handed over again, tries again)", "err", err)
		return
	}
	if err := identity.Remove(s.cfg.StateDir); err != nil {
		s.log.Error("retire: the node's keys are dropped, and its identity could not be", "err", err)
		return
	}
	s.log.Info("retired: the node's identity and keys are dropped; this host is hosted again", "node", id.Node)
}

// finishRetirement is the reconcile's part in a retirement, d, the link's
// target, which the reconcile just applied (rep): when the lines kept of
// the retirement's own apply are there, that apply ended and says whether
// the node retires (a kill between it and dropping the keys); when they
// are not, a kill cut the apply before its end, and this reconcile, which
// did what it left undone, ends it — its lines are the retirement's, said
// when the agent hands it over again.
func (s *Server) finishRetirement(d *shapes.Declaration, raw []byte, rep *shapes.Report, id *identity.Identity) {
	sum := sha256.Sum256(raw)
	digest := hex.EncodeToString(sum[:])
	if kept := readKeptLines(s.cfg.StateDir, d.Seq, digest); kept != nil {
		s.retireAfter(d, kept.Outcome, id)
		return
	}
	if rep.Outcome == shapes.Refused {
		return
	}
	if err := keepLines(s.cfg.StateDir, d.Seq, digest, rep); err != nil {
		s.log.Warn("the retirement's apply, ended by the reconcile, could not be kept: it is ended again at the next", "seq", d.Seq, "err", err)
		return
	}
	s.retireAfter(d, rep.Outcome, id)
}

// sealedDigestLabel is what the key of sealed content's digests is
// derived under (engine.Unsealer.DigestKey).
const sealedDigestLabel = "nox-mesh sealed content digest v1"

// Unsealer returns what the engine opens sealed file content with, for a
// declaration that names node and sequence seq: the sealing key enrolment
// made (keys.json in stateDir), with node and seq bound, so content sealed
// for another node, declaration or file does not open. The node and seq
// are the declaration's own word; the caller has checked its address.
//
// It is nil when this host has no sealing key (hosted, or a node
// registered by hand): the engine then refuses sealed content. A key that
// cannot be read makes sealed content fail to open, saying why, and leaves
// a declaration without sealed content alone.
//
// The digest key is derived from the sealing key, so it is secret to this
// host and the same across applies and restarts; a new enrolment (a new
// key) records sealed content under a new digest, which the engine notes
// without touching the file.
func Unsealer(stateDir, node string, seq uint64) *engine.Unsealer {
	keys, err := enrol.LoadKeys(stateDir)
	if err != nil {
		return &engine.Unsealer{Open: func(string, string, string) ([]byte, error) {
			return nil, fmt.Errorf("the sealing key cannot be read: %w", err)
		}}
	}
	if keys == nil {
		return nil
	}
	u := &engine.Unsealer{Open: func(module, id, sealed string) ([]byte, error) {
		return wire.OpenSealed(keys.Sealing, node, seq, module, id, sealed)
	}}
	if b, err := keys.Sealing.Bytes(); err == nil {
		m := hmac.New(sha256.New, b)
		m.Write([]byte(sealedDigestLabel))
		u.DigestKey = m.Sum(nil)
	}
	return u
}

// SavedTarget is the declaration src last saved as its target in the
// store st of stateDir, as the reconcile applies it, or nil: none saved, or
// one the reconcile skips (skipped says why: no identity, no longer
// verifies or parses, not this enrolment's newest accepted — after a
// re-enrolment the old one is not applied). err: the target could not be
// read. The commands that say what the store holds read it so too.
func SavedTarget(stateDir string, st *store.Store, src store.Source, id *identity.Identity) (d *shapes.Declaration, raw []byte, skipped string, err error) {
	raw, err = st.Target(src)
	if err != nil || raw == nil {
		return nil, nil, "", err
	}
	if src != store.Link {
		if d, err = shapes.ParseTrusted(raw); err != nil {
			return nil, nil, "a saved target no longer parses: " + err.Error(), nil
		}
		return d, raw, "", nil
	}
	if id == nil {
		return nil, nil, "a link target is saved but this host has no identity", nil
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeDeclaration, raw)
	if err != nil {
		return nil, nil, "the saved link target no longer verifies: " + err.Error(), nil
	}
	if d, err = shapes.Parse(payload); err != nil {
		return nil, nil, "the saved link target no longer parses: " + err.Error(), nil
	}
	if f, _ := identity.ReadFloor(stateDir); !AddressedHere(d, id) || d.Seq != f.Seq || !f.Of(id.Enrolment) {
		return nil, nil, fmt.Sprintf("the saved link target (node %s, enrolment %s, seq %d) is not addressed to this enrolment, or not the newest accepted (floor %d)", d.Node, d.Enrolment, d.Seq, f.Seq), nil
	}
	return d, raw, "", nil
}

// ReconcileNodeID is the node a reconcile holds src's saved target d to
// (engine.Options.NodeID) on a host of identity id: an enrolled host's, for
// the link's target and for a rescue file that names a node; none on a
// hosted one, or for a rescue file that names none (applied before the
// host was enrolled, it is reconciled still). doctor reads it too.
func ReconcileNodeID(src store.Source, d *shapes.Declaration, id *identity.Identity) string {
	if id != nil && (src == store.Link || d.Node != "") {
		return id.Node
	}
	return ""
}

// pruneArchives keeps in the cache only the archives that the link
// declaration just accepted (nil: the link's target), or the bundle's or a
// rescue file's target, names, and those a connection streamed for the
// declaration it has yet to hand over or is streaming: what was streamed
// and is declared by nothing goes.
func (s *Server) pruneArchives(st *store.Store, link *shapes.Declaration) (looked bool) {
	id, err := s.identity()
	if err != nil {
		return false
	}
	keep, ok := NamedArchives(s.cfg.StateDir, st, id, link)
	if !ok {
		return false
	}
	s.streamMu.Lock()
	for _, sums := range s.streamed {
		for sum := range sums {
			keep[sum] = true
		}
	}
	for sum := range s.streaming {
		keep[sum] = true // one cached already, streamed again
	}
	s.streamMu.Unlock()
	if gone := engine.PruneArchiveCache(s.cfg.StateDir, keep); len(gone) > 0 {
		s.log.Info("archives no declaration names were dropped from the cache", "sha256", gone)
	}
	return true
}

// NamedArchives is the archives the saved targets of the store st in
// stateDir name — the bundle's, a rescue file's, and the link's (link, the
// declaration just accepted, in place of its saved target when not nil) —
// and those the store still records unpacked on the machine: what the
// archive cache keeps; ok is false when a target could not be read, and
// then nothing is to be pruned. A target the reconcile skips names
// nothing. An archive recorded is kept though no target names it (its
// undeclaring failed, or waits on a directory that holds what it did not
// write): its bytes are what tells, when its files go, which of them a
// person edited since.
func NamedArchives(stateDir string, st *store.Store, id *identity.Identity, link *shapes.Declaration) (keep map[string]bool, ok bool) {
	keep, ok = namedByTargets(stateDir, st, id, link)
	for _, e := range st.Entries() {
		if ok && e.Type == shapes.TypeArchive && engine.ValidDigest(e.Digest) {
			keep[e.Digest] = true
		}
	}
	return keep, ok
}

// KeptForRecords is the archives in the cache that only the store's
// records keep — of archives no saved target names any more, whose
// removal left something (a directory holding a person's file, an edit
// larger than the host keeps a copy of, a link on the way) — and their
// bytes: what declaring fewer archives does not free.
func KeptForRecords(stateDir string, st *store.Store, id *identity.Identity) (sums []string, bytes uint64) {
	named, ok := namedByTargets(stateDir, st, id, nil)
	if !ok {
		return nil, 0
	}
	for _, e := range st.Entries() {
		if e.Type != shapes.TypeArchive || !engine.ValidDigest(e.Digest) || named[e.Digest] || slices.Contains(sums, e.Digest) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(engine.ArchiveCacheDir(stateDir), e.Digest)); err == nil {
			sums, bytes = append(sums, e.Digest), bytes+uint64(fi.Size())
		}
	}
	return sums, bytes
}

// namedByTargets is NamedArchives but for the store's records.
func namedByTargets(stateDir string, st *store.Store, id *identity.Identity, link *shapes.Declaration) (keep map[string]bool, ok bool) {
	keep = map[string]bool{}
	srcs := []store.Source{store.Bundle, store.Local}
	if link != nil {
		engine.ArchiveDigests(link, keep)
	} else {
		srcs = append(srcs, store.Link) // its target: the one applied last
	}
	for _, src := range srcs {
		d, _, _, err := SavedTarget(stateDir, st, src, id)
		if err != nil {
			return nil, false
		}
		if d != nil {
			engine.ArchiveDigests(d, keep)
		}
	}
	return keep, true
}

// record counts an apply and says it in the daemon's log; its report is
// kept by then (keepReport, or the apply's Keep).
func (s *Server) record(st *store.Store, src store.Source, trigger string, rep *shapes.Report, took time.Duration) {
	s.noteApply(string(src), string(rep.Outcome), rep.Seq, took, len(st.Entries()))
	if src == store.Link && rep.Outcome != shapes.Refused {
		// The last applied: a refused declaration (a full disk refuses
		// one before the floor moves) is not, and the status the agent
		// reports upward must not say it was.
		s.lastMu.Lock()
		s.last = lastApplied{Seq: rep.Seq, Outcome: rep.Outcome}
		s.lastMu.Unlock()
	}
	s.log.Info("applied", "source", src, "seq", rep.Seq, "outcome", rep.Outcome, "lines", len(rep.Lines))
	// A failure is said where an operator looks first, the daemon's log,
	// whether or not a report goes upward (a start or drift reconcile's
	// does not); and so is a repair: what the machine lost (a boot takes
	// the firewall's rules and the overlay's interface) or someone
	// changed, put back with no declaration asking.
	for _, l := range rep.Lines {
		switch l.Outcome {
		case shapes.Failed:
			s.log.Warn("failed: "+l.Detail, "source", src, "trigger", trigger, "seq", rep.Seq, "module", l.Module, "id", l.ID, "type", l.Type)
		case shapes.Repaired:
			s.log.Info("repaired: "+l.Detail, "source", src, "trigger", trigger, "seq", rep.Seq, "module", l.Module, "id", l.ID, "type", l.Type)
		}
	}
}

// Reconcile applies again what each source last declared — the bundle, the
// link (whose envelope is verified again under the pinned key), a rescue
// file — for one of the triggers: start, reconnect, drift. Its verdict's
// outcome is the worst of the three.
func (s *Server) Reconcile(ctx context.Context, why string, emit func(shapes.Line)) *wire.Verdict {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	return s.reconcile(ctx, why, emit, false)
}

// reconcile is Reconcile with the apply lock held; onlyRoster applies
// again only the targets whose overlay takes its peers from the roster.
func (s *Server) reconcile(ctx context.Context, why string, emit func(shapes.Line), onlyRoster bool) *wire.Verdict {
	v := &wire.Verdict{Outcome: shapes.Unchanged}
	st, err := s.openStore()
	if err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	if err := s.lockStore(st); err != nil {
		s.log.Warn("reconcile: not run", "trigger", why, "err", err)
		return refusal(wire.CodeInternal, "%v", err)
	}
	defer st.Unlock()
	id, err := s.identity()
	if err != nil {
		return refusal(wire.CodeInternal, "%v", err)
	}
	// The roster is read once for every target it applies to.
	roster := heldRoster(s.cfg.StateDir, id)
	var all []shapes.Line
	cut := false // an apply not run to its end: refused for the moment, or stopped
	for _, src := range []store.Source{store.Bundle, store.Link, store.Local} {
		d, raw, skipped, err := SavedTarget(s.cfg.StateDir, st, src, id)
		if d == nil {
			if err == nil && skipped != "" {
				s.log.Warn("reconcile: "+skipped+"; skipped", "trigger", why, "source", src)
			}
			continue
		}
		if src == store.Link {
			v.Seq = d.Seq
		}
		if onlyRoster && !d.UsesRoster() {
			continue
		}
		failed, failedWhy := s.failedRelease()
		opt := engine.Options{Source: src, Partial: s.cfg.Partial, Log: s.log, OnLine: emit, Unseal: Unsealer(s.cfg.StateDir, d.Node, d.Seq),
			HostBinary: s.cfg.HostBinary, HostVersion: s.cfg.Version, AgentUser: s.cfg.AgentUser, FailedHostRelease: failed, FailedHostReason: failedWhy, Roster: roster,
			Restore: restores(why), Stop: s.stopping}
		opt.NodeID = ReconcileNodeID(src, d, id)
		began := clock.Now()
		// Said through the history alone: durable before the apply's
		// end is journaled.
		opt.Keep = func(rep *shapes.Report) {
			if err := st.KeepReport(src, why, rep); err != nil {
				s.log.Warn("the apply's summary and history could not be kept", "source", src, "seq", rep.Seq, "err", err)
			}
		}
		rep := engine.Apply(applyContext(ctx), st, d, raw, opt)
		s.record(st, src, why, rep, clock.Since(began))
		s.noteUpgrade(rep)
		if src == store.Link && d.Retire {
			s.finishRetirement(d, raw, rep, id)
		}
		all = append(all, rep.Lines...)
		if rep.Outcome == shapes.Refused {
			s.log.Warn("reconcile refused", "source", src, "reason", rep.Refused)
		}
		cut = cut || rep.Passing && rep.Outcome == shapes.Refused
	}
	v.Outcome = shapes.Derive(all)
	// What the store owns after it, as a declaration's verdict says it: a
	// reconcile the roster or a reconnect set off applies the link target
	// again, and may finish what its declaration's apply left undone; the
	// report of it is then the newest, and the control side's copy (the
	// one handed back after a lost store) must be this one.
	if id != nil {
		v.Owned = enrol.Owned(st)
	}
	s.log.Info("reconciled", "trigger", why, "outcome", v.Outcome, "lines", len(all))
	// Healthy only for a reconcile run to its end: one a stop ended (its
	// applies stopped between two resources, or refused before they
	// began) or one refused for the moment proves nothing of this build,
	// and taking it for healthy would make it the known-good copy — a
	// release stopped in its first start reconcile (a shutdown) that
	// crashes after would be rolled back onto itself.
	select {
	case <-s.stopping:
		cut = true
	default:
	}
	if cut {
		s.log.Info("this reconcile did not run to its end: this build is not taken for healthy by it", "trigger", why)
		return v
	}
	s.reconciled.Store(true)
	if s.cfg.Healthy != nil {
		if err := s.cfg.Healthy(); err != nil {
			s.log.Warn("could not record this build as known-good", "err", err)
		}
	}
	return v
}

// AddressedHere says whether d is addressed to the node and enrolment id
// holds: only such a link declaration is reconciled (the trust rule), so
// one of an enrolment a re-enrolment replaced is not held against drift.
func AddressedHere(d *shapes.Declaration, id *identity.Identity) bool {
	return d.Node == id.Node && d.Enrolment == id.Enrolment
}

// clip bounds a string carried in a reply of bounded size.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// stateRoom is what the state's filesystem has free, and what of it the
// archive cache leaves alone: a tenth of the filesystem, at most 128 MiB.
func stateRoom(dir string) (free, keep uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	size := st.Blocks * uint64(st.Bsize)
	return st.Bavail * uint64(st.Bsize), min(size/10, 128<<20), nil
}
