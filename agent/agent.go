package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Options configure Run.
type Options struct {
	// Identity is the node's identity; nil leaves the agent hosted: idle,
	// never dialling, never exiting.
	Identity *Identity
	// Socket is the executor's socket (wire.SocketPath).
	Socket string
	// ExecutorUID is the uid the executor must run as (0: root). Only
	// tests running unprivileged set it.
	ExecutorUID uint32
	// StateDir keeps the agent's memory across restarts; "" keeps it in
	// memory only. One agent holds it at a time: the caller locks it
	// first (LockDir; mesh-agent does, and refuses a second instance).
	StateDir string
	// StateStill, when set, says whether StateDir still names the
	// directory the agent locked as it started (statedir.DirLock.Still):
	// one moved or replaced since is written to no more. nil: the one
	// found at each linked run's start.
	StateStill func() bool
	// ConfigPath is where enrolment writes the identity it brings back
	// ("" keeps it in memory only).
	ConfigPath string
	// EnrolPoll is how often a hosted agent asks the executor whether an
	// enrolment was begun (2s when zero).
	EnrolPoll time.Duration
	// Vsock, when set, is where the executor is instead of Socket.
	Vsock *Vsock
	// DialExecutor, when set, is how a linked agent reaches the executor
	// instead of Socket or Vsock: each call returns a new stream speaking
	// the wire protocol, with no peer credentials to check. mesh-agent
	// never sets it. It is for running many agents in one process against
	// an in-process stand-in of the executor (tests/bench/scale, over
	// net.Pipe), where two unix sockets per agent would not fit the
	// process's file descriptors. Run refuses it without an Identity; an
	// agent that turns hosted (retired, re-enrolling) reaches Socket.
	DialExecutor func() (net.Conn, error)
	// Episodic: the agent runs only now and then (inside an app), and
	// opens the link only while it runs; its heartbeat says so.
	Episodic bool
	// Heartbeat is the heartbeat period (30s when zero).
	Heartbeat time.Duration
	// Poll is how often the agent reads its declaration subject with no
	// notice (2 minutes when zero, jittered by up to a quarter more).
	Poll time.Duration
	// ProfileAgain is how long a profile said stands before a heartbeat
	// says it again though it has not changed (6 hours when zero): a
	// heartbeat is published without an acknowledgement, and the stream
	// that keeps heartbeats is not synced on its own (a power cut of the
	// control side may take the last ones), so a profile said once could
	// be lost with nothing to say it again until it changes.
	ProfileAgain time.Duration
	// Version and Build are this agent's; Build is compared with the
	// executor's on every hello.
	Version, Build string
	// Dialer, when set, opens the link's connections to the broker
	// (nats.SetCustomDialer) in place of the client library's own. The
	// simulated fleet gives each of its nodes a loopback address of its
	// own to dial from, as every real node has an address of its own: ten
	// thousand connections from one address to one port leave the kernel
	// searching a full range of ports at every connect (a third of the
	// bench's CPU while a fleet linked again).
	Dialer nats.CustomDialer
	// RetryWait is the first wait after a failed attempt (1s when zero),
	// doubled up to 30s; the waits between attempts to link are drawn
	// from it (linkWait).
	RetryWait time.Duration
	// RevokedWait is the first wait after the broker refused this node's
	// credential (twice RetryWait when zero: the ordinary reconnect wait),
	// doubled at each wait up to revokedWaitMax, with jitter
	// (revokedDelay).
	RevokedWait time.Duration
	// GiveBack is what the agent calls a quiet second after a drain to
	// return the drain's memory to the system (debug.FreeOSMemory when
	// nil: a full collection of its own small heap). Many agents in one
	// process share one heap, where each agent's call would be a full
	// collection of all of them: the simulated fleet (tests/fleet) gives
	// its own.
	GiveBack func()
	// Look is how often, between heartbeats, the agent asks its executor
	// how it is (2s when zero, never longer than Heartbeat): an upgraded
	// executor ends the agent within seconds, an unlinked agent sees a
	// re-enrolment begun. A request over the local socket, nothing on the
	// link; 10,000 simulated agents in one process (tests/fleet) would
	// make 5,000 a second of them beside the fan-out they measure, which
	// real agents make each on its own machine: the fleet looks less often.
	Look time.Duration
	Log  *slog.Logger

	// fellBack: the control side refused this identity's subjects by
	// node, and it links by kind; at the link's next return it tries by
	// node again (the control side may have been upgraded meanwhile).
	fellBack bool
	// beforeLinked, a test's, is called as linked begins: the client's
	// handlers run on a goroutine of their own, late on a busy machine,
	// and the tests make them late at will (OnLinked).
	beforeLinked func()
}

// Agent is one running agent.
type Agent struct {
	o     Options
	id    *Identity
	log   *slog.Logger
	state *stateStore
	// execDown: the heartbeat found the executor unreachable, and said
	// so in the log (once an outage: the heartbeats' goroutine alone).
	execDown bool
	// ctlKey is the control key in force as the executor last said
	// (controlKey); nil: the identity's.
	ctlKey atomic.Pointer[ed25519.PublicKey]

	pins pinWatch
	nc   *nats.Conn
	js   jetstream.JetStream
	// planning holds back a second plan request while one is answered:
	// plans come from a person at the control side, one at a time; more at
	// once are dropped (the person asks again), never queued without bound.
	planning atomic.Bool
	// runCtx is the linked run's: plans are answered within it, never
	// past the run's end, when the executor's clients are closed.
	runCtx context.Context
	// wake says a notice came (link.Subjects.Notice); noticed is the
	// highest stream sequence notices named since the last read.
	wake    chan struct{}
	noticed atomic.Uint64
	// carried is the newest declaration a notice carried since the last
	// read (link.Subjects.Notice): read from the notice, it needs no
	// direct get. As untrusted as any bytes the broker hands over: it is
	// checked as a read one is.
	carried atomic.Pointer[declMsg]
	// rosterDue says the roster is to be read (a roster notice came, or
	// the last read failed).
	rosterDue atomic.Bool
	// rekeyAnswer is the control side's answer to the executor's rekey
	// request (link.RekeyHeader) and the rotations sent beside it, for
	// the heartbeat loop to hand over when rekeyNow says so: the notice
	// handler makes no request of the executor. Not hbNow: a heartbeat
	// sent for each answer carries the request again, which the control
	// side answers again.
	rekeyAnswer atomic.Pointer[rekeyMsg]
	rekeyNow    chan struct{}
	// readWait is how long the next direct get waits for its answer,
	// when a read the broker was late with made it longer than
	// readWithin (getLast); 0: readWithin. readStop ends the read in
	// flight when the link drops (linkDown): nats.go keeps a request
	// waiting through a reconnection, and a wait grown to a minute would
	// hold the worker that long after the link came back.
	readWait atomic.Int64
	readMu   sync.Mutex
	readStop context.CancelCauseFunc
	// reenrolHeld: an enrolment the executor has pending waits for room
	// to keep the agent's new NKey (mayReenrol), said once.
	reenrolHeld atomic.Bool
	// statements are the control side's statements a message on the
	// notice subject carried alone (link.StatementsHeader), for the
	// heartbeat loop to take when statementsNow says so: the newest only,
	// however many came.
	statements    atomic.Pointer[statementsMsg]
	statementsNow chan struct{}
	// activitySaid is the newest count of the executor's activities its
	// status said, plus one (0: no status heard); activityNow wakes the
	// work loop to report those past the count reported (activity.go).
	activitySaid atomic.Uint64
	activityNow  chan struct{}
	// activityRetry is when a report that failed is tried again, after
	// activityWait (the work loop's alone).
	activityRetry time.Time
	activityWait  time.Duration
	exec          *execClient               // the worker's connection to the executor
	hbExec        *execClient               // the heartbeat's
	ncp           atomic.Pointer[nats.Conn] // the current connection, for the heartbeat
	linkUp        chan struct{}
	hbNow         chan struct{}
	// execBack: the executor answers the heartbeat's look again after it
	// did not (restarted, upgraded in place): a back-off waiting for it
	// ends (backoff).
	execBack chan struct{}
	cancel   context.CancelCauseFunc
	reconc   atomic.Bool // the executor has yet to hear that the link came back
	// reconnectReport is the report of a reconnect's reconcile the broker
	// has not confirmed yet, with its verdict: published again as it is,
	// not asked for again (a second reconcile would find unchanged what
	// the first repaired). The work loop's alone.
	reconnectReport  *link.Report
	reconnectVerdict *wire.Verdict
	// pendingDrain: the same of a declaration the executor answered
	// (drain). The work loop's alone.
	pendingDrain *pendingDrain
	// behind counts the reads in a row a replica behind answered (drain,
	// behindReads). The work loop's alone.
	behind int
	// remembers: the agent's state holds what it settled of this
	// enrolment's link, at least the executor's floor (State.FloorLearnt)
	// — kept by an agent before it, or learnt by this one at its first
	// reconnect (learnFromStatus). The work loop's.
	remembers bool
	linkedAt  atomic.Uint64 // the client's count of reconnections when linked last ran
	linkMu    sync.Mutex
	link      linkInfo
	// lastLog is the last link error logged, lastLogAt when it was last
	// said, and repeats how many times it came since (linkFailed).
	lastLog   string
	lastLogAt time.Time
	repeats   int
	// quiet fires a moment after the last drain, to give the drain's
	// memory back (giveBack).
	quiet *time.Timer
}

// quietAfter is how long the queue stays empty before the agent gives the
// memory of a drain back to the system.
const quietAfter = time.Second

// giveBack returns the heap a burst of declarations grew to the system once
// the queue is quiet. The agent lives for months on machines (and phones)
// where its resident size is its cost, and Go's scavenger would return it
// only gradually: a flurry of a thousand declarations otherwise leaves the
// agent at its high-water mark. One collection after a quiet second costs
// about a millisecond, not per declaration.
func (a *Agent) giveBack() {
	if a.quiet == nil {
		a.quiet = time.AfterFunc(quietAfter, a.o.GiveBack)
		return
	}
	a.quiet.Reset(quietAfter)
}

type linkInfo struct {
	up         bool
	since      time.Time
	downSince  time.Time // when this run's link went down
	lastLinked time.Time // before this link came up
	unlinked   time.Duration
	lastErr    string
	// skew and skewAt are the clock's last measure against the broker's
	// (measureClock), skewAt zero until one; clockTried is when the agent
	// last asked.
	skew               time.Duration
	skewAt, clockTried time.Time
	// clockFrom is when the link's first measure may be made (linked).
	clockFrom time.Time
	// revoked is when the broker first refused this node's credential
	// since the link was last up (zero: it has not), and revokedWaits how
	// many waits the agent has chosen since (revokedDelay).
	revoked      time.Time
	revokedWaits int
}

// Run runs the agent until ctx ends (nil) or the executor turns out to run
// another build (ErrUpgraded: exit 0, the init restarts the new binary).
func Run(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 30 * time.Second
	}
	if o.RetryWait <= 0 {
		o.RetryWait = time.Second
	}
	if o.ProfileAgain <= 0 {
		o.ProfileAgain = 6 * time.Hour
	}
	if o.RevokedWait <= 0 {
		o.RevokedWait = 2 * o.RetryWait
	}
	if o.Socket == "" {
		o.Socket = wire.SocketPath
	}
	if o.EnrolPoll <= 0 {
		o.EnrolPoll = 2 * time.Second
	}
	if o.Look <= 0 || o.Look > o.Heartbeat {
		o.Look = min(o.Heartbeat, 2*time.Second)
	}
	if o.GiveBack == nil {
		o.GiveBack = debug.FreeOSMemory
	}
	if o.Poll <= 0 {
		o.Poll = pollEvery
	}
	if o.DialExecutor != nil && o.Identity == nil {
		return errors.New("agent: DialExecutor is for a linked agent: it needs an Identity")
	}
	if o.Vsock == nil && o.DialExecutor == nil {
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		go watchSocket(ctx, o.Socket, o.EnrolPoll, o.Log)
	}
	for {
		if o.Identity != nil {
			// An enrolment cut off after the executor recorded its grant
			// (the config still names the enrolment it replaced).
			if id := finishGranted(o); id != nil {
				o.Identity = id
			}
		}
		if o.Identity == nil {
			id, err := hosted(ctx, o, false)
			if err != nil || id == nil {
				return err
			}
			o.Identity = id
		}
		err := runLinked(ctx, o)
		if errors.Is(err, errEarlierLayout) {
			// A control side of an earlier version: it knows only the
			// layout by kind, and this agent speaks it too.
			o.Identity, o.fellBack = o.Identity.inLayout(link.LayoutByKind), true
			o.Log.Warn("the broker refused this agent's subjects by node: the control side is of an earlier version; linking again with the subjects by kind (upgrade the control side)", "node", o.Identity.Node)
			continue
		}
		if errors.Is(err, errTryByNode) {
			// The link came back after a fallback: a control side is
			// upgraded by restarting it. By node again; an earlier one
			// refuses, and the fallback above is taken again.
			o.Identity, o.fellBack = o.Identity.inLayout(link.LayoutByNode), false
			o.Log.Info("the link came back: trying the subjects by node again (the control side may have been upgraded)", "node", o.Identity.Node)
			continue
		}
		if errors.Is(err, errReenrol) {
			// Root began an enrolment on a host that has an identity: carry
			// it out; if it ends without a grant, go on as before.
			id, err := hosted(ctx, o, true)
			if err != nil {
				return err
			}
			if id != nil {
				o.Identity = id
			}
			continue
		}
		if !errors.Is(err, ErrRetired) {
			return err
		}
		// The executor dropped its identity (a retire declaration ran to
		// its end, or its state was lost): so does the agent, and it is
		// hosted again, ready for an enrolment.
		if o.ConfigPath != "" {
			if err := os.Remove(o.ConfigPath); err != nil && !errors.Is(err, os.ErrNotExist) {
				o.Log.Error("retired, but the agent's identity could not be dropped: "+err.Error(), "config", o.ConfigPath)
			}
		}
		o.Log.Info("retired: the executor is hosted again; so is the agent", "node", o.Identity.Node, "state", link.StateHosted)
		o.Identity = nil
	}
}

// ErrRetired: the executor says it is hosted while the agent holds an
// identity.
var ErrRetired = errors.New("the executor holds no identity")

// errReenrol: the executor has an enrolment pending for the agent.
var errReenrol = errors.New("an enrolment is pending")

// mayReenrol says whether the agent can carry out the enrolment the
// executor has pending now: the new NKey it would enrol with is kept
// first. While the state directory's disk has no room for it the agent
// stays linked on the identity it holds — the enrolment a rekey or an
// enrol --replace replaces is live until the new one is granted, and
// declarations to it still apply — and tries again at each heartbeat,
// rather than drop the link to wait, unlinked, for room.
func (a *Agent) mayReenrol() bool {
	if a.o.StateStill != nil && a.o.StateDir != "" && !a.o.StateStill() {
		return false
	}
	_, err := hostedKey(a.o.StateDir)
	if err == nil || !diskFull(err) {
		if a.reenrolHeld.Swap(false) {
			a.log.Info("the agent's new NKey is kept: the enrolment pending goes on")
		}
		return true
	}
	if !a.reenrolHeld.Swap(true) {
		a.log.Warn("the executor has an enrolment pending, but the agent's new NKey cannot be kept: its state directory's disk is full; staying linked as the node it is, trying again at each heartbeat", "state", a.o.StateDir, "err", err.Error())
	}
	return false
}

// errEarlierLayout: the broker refused a publish under link.UpPrefix, as a
// control side of an earlier version does (it gives every node the
// layout by kind).
var errEarlierLayout = errors.New("the control side knows only the layout by kind")

// errTryByNode: the link came back to an agent that fell back to the
// layout by kind (Options.fellBack).
var errTryByNode = errors.New("the link came back after a fallback to the layout by kind")

// earlierLayout says whether err is the broker refusing a publish to one
// of id's subjects by node: what a control side of an earlier version
// answers, whatever the connection asked for. (Only an agent publishing
// by node publishes there.)
func earlierLayout(id *Identity, err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), `Publish to "`+link.UpPrefix+"."+id.Node+".")
}

// runLinked runs the agent with its identity until ctx ends, the executor
// turns out to run another build (ErrUpgraded) or to hold no identity
// (ErrRetired).
func runLinked(ctx context.Context, o Options) error {
	if o.StateStill != nil && o.StateDir != "" && !o.StateStill() {
		return fmt.Errorf("%w: %s", errStateMoved, o.StateDir)
	}
	st, err := openState(o.StateDir)
	if err != nil {
		if st == nil {
			return err
		}
		o.Log.Warn(err.Error())
	}
	st.still = o.StateStill
	a := &Agent{
		o: o, id: o.Identity, state: st,
		log:           o.Log.With("node", o.Identity.Node),
		exec:          &execClient{path: o.Socket, uid: o.ExecutorUID, vsock: o.Vsock, dial: o.DialExecutor, version: o.Version, build: o.Build},
		hbExec:        &execClient{path: o.Socket, uid: o.ExecutorUID, vsock: o.Vsock, dial: o.DialExecutor, version: o.Version, build: o.Build},
		linkUp:        make(chan struct{}, 1),
		hbNow:         make(chan struct{}, 1),
		execBack:      make(chan struct{}, 1),
		rekeyNow:      make(chan struct{}, 1),
		statementsNow: make(chan struct{}, 1),
		activityNow:   make(chan struct{}, 1),
		wake:          make(chan struct{}, 1),
	}
	var saidMoved sync.Once
	st.onMoved = func(err error) {
		saidMoved.Do(func() { a.log.Error(err.Error()) })
		if a.cancel != nil {
			a.cancel(errStateMoved)
		}
	}
	// The broker certificates a rotation announced, accepted from the
	// first dial (takePins) — if taken in this enrolment: those of an
	// enrolment before it would stand in for the certificate this one's
	// token pinned, an older one after a switch, and keep the node off
	// the broker for good.
	if s := st.get(); len(s.BrokerPins) > 0 && s.PinsEnrolment != "" && s.PinsEnrolment != a.id.Enrolment {
		if err := st.update(func(s *State) { s.BrokerPins, s.PinsSeq, s.PinsEnrolment = nil, 0, "" }); err != nil {
			a.log.Warn("state: " + err.Error())
		}
	}
	// What the agent learnt of the link's sequences, of this enrolment
	// only (State.Enrolment): the executor's own floor (learnFromStatus)
	// is the new enrolment's, from its grant.
	a.remembers = st.get().Enrolment == a.id.Enrolment && st.get().FloorLearnt
	if s := st.get(); s.Enrolment != a.id.Enrolment {
		if err := st.update(func(s *State) {
			if s.Enrolment != "" {
				s.LastApplied, s.LastAppliedOutcome, s.LastSeq, s.LastOutcome = 0, "", 0, ""
				s.LastStreamSeq, s.LastRosterStreamSeq, s.LastRosterSeq, s.UsesRoster = 0, 0, 0, false
			}
			s.FloorLearnt = false
			s.Enrolment = a.id.Enrolment
		}); err != nil {
			a.log.Warn("state: " + err.Error())
		}
	}
	a.id.setPins(st.get().BrokerPins)
	if s := st.get(); s.UserJWT != "" && a.jwtFor(s.UserJWT) == nil {
		a.id.setJWT(s.UserJWT, s.JWTIssuer)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	a.cancel, a.runCtx = cancel, ctx
	if err := st.here(); err != nil {
		cancel(errStateMoved) // moved before the run began: its writes above were refused
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.heartbeats(ctx)
	}()
	defer func() {
		cancel(nil)
		wg.Wait()
		a.exec.close()
		a.hbExec.close()
		// What of this run may still be going (a notice's handler, a
		// plan's answer) writes the state no more: the next agent on the
		// directory, or the next enrolment's run, holds it now.
		st.end()
	}()
	for {
		nc, closed, err := a.dial(ctx)
		if err != nil {
			break
		}
		a.nc = nc
		a.ncp.Store(nc)
		a.js, _ = jetstream.NewWithAPIPrefix(nc, link.APIPrefix)
		// The notices are heard for the life of the connection (the client
		// subscribes again itself after a reconnect).
		if _, err := nc.Subscribe(a.id.Subjects.Notice, a.notice); err != nil {
			a.log.Warn("notices: " + err.Error())
		}
		if _, err := nc.Subscribe(a.id.Subjects.RosterNotice, a.rosterNotice); err != nil {
			a.log.Warn("roster notices: " + err.Error())
		}
		if _, err := nc.Subscribe(a.id.Subjects.Plan, a.planRequest); err != nil {
			a.log.Warn("plan requests: " + err.Error())
		}
		a.linked()
		a.work(ctx)
		nc.Close()
		// The client's callbacks run on a goroutine of its own: the link's
		// loss is written into the state (linkDown) after Close returns.
		// Waited for, so that nothing of this run writes the state after
		// it ends — an agent started next on the directory, or the next
		// enrolment's run, would have it written over.
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
		}
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(context.Cause(ctx), ErrUpgraded) {
		return ErrUpgraded
	}
	if errors.Is(context.Cause(ctx), ErrRetired) {
		return ErrRetired
	}
	if errors.Is(context.Cause(ctx), errReenrol) {
		return errReenrol
	}
	if errors.Is(context.Cause(ctx), errEarlierLayout) {
		return errEarlierLayout
	}
	if errors.Is(context.Cause(ctx), errTryByNode) {
		return errTryByNode
	}
	if errors.Is(context.Cause(ctx), errStateMoved) {
		return errStateMoved
	}
	return nil
}

// upgraded ends the agent: the executor runs another build.
func (a *Agent) upgraded(err error) {
	a.log.Info("exiting: " + err.Error())
	a.cancel(ErrUpgraded)
}

// backoff waits d (or until ctx ends) and returns the next wait. The
// executor seen again after it was gone ends the wait at once, and the
// next is the first again: what failed for want of it (a declaration to
// hand over) goes as soon as it is back, not up to 30 s later.
func (a *Agent) backoff(ctx context.Context, d time.Duration) time.Duration {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-a.execBack:
		return a.o.RetryWait
	}
	return min(d*2, 30*time.Second)
}

// linkPing is how often the agent pings the broker on a quiet link
// (nats.go's own default).
const linkPing = 2 * time.Minute

// dial connects to the broker, retrying until ctx ends. Every failure is
// logged legibly (and kept for the next heartbeat). closed is closed once
// the connection is, with every callback of it before that run.
func (a *Agent) dial(ctx context.Context) (nc *nats.Conn, closed chan struct{}, err error) {
	attempts := 0
	// One for the attempts and the link they make, which reconnects
	// through it: a connection left open by a failed handshake is closed
	// at the next dial (lastConnDialer).
	dialer := newLastConnDialer(a.o.Dialer)
	for {
		start := clock.Now()
		done := make(chan struct{})
		closeDone := sync.OnceFunc(func() { close(done) })
		opts := append(linkOptions(a.id, &a.pins),
			nats.ClosedHandler(func(*nats.Conn) { closeDone() }),
			nats.MaxReconnects(-1),
			nats.CustomReconnectDelay(a.reconnectDelay),
			nats.IgnoreAuthErrorAbort(),
			nats.ReconnectBufSize(-1), // nothing queued while unlinked: a failure is said, not hidden
			// The library's ping, every 2 minutes (two unanswered: the
			// link is down): a connection that dies says so at once (EOF,
			// reset); a ping finds only a silent path. Every ping is an
			// answer the broker writes: at 20 s, 10,000 nodes were 500
			// writes a second of an idle broker, each growing the
			// connection's writer to 32 KiB of stack until the next
			// collection: a broker's memory per node.
			nats.PingInterval(linkPing),
			nats.SetCustomDialer(dialer),
			nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
				a.linkDown(err, nc.IsClosed())
			}),
			nats.ReconnectHandler(func(*nats.Conn) {
				if a.o.fellBack {
					a.cancel(errTryByNode)
					return
				}
				a.linked()
			}),
			nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
				a.linkFailed(explain(a.id.BrokerURL, err, a.pins.since(clock.Now().Add(-10*time.Second))))
			}),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if earlierLayout(a.id, err) {
					a.cancel(errEarlierLayout)
					return
				}
				if strings.Contains(err.Error(), `"`+a.id.Subjects.HeartbeatGet+`"`) {
					// A control side of an earlier release, which grants
					// no read back of the heartbeat: the clock goes
					// unmeasured (measureClock), nothing more.
					a.log.Debug("the broker refused the heartbeat's read back: " + err.Error())
					return
				}
				if le := explain(a.id.BrokerURL, err, nil); le.Reason == LinkAuthorization {
					a.linkFailed(le) // revoked, most likely: said once, legibly
					return
				}
				if op := (*net.OpError)(nil); errors.As(err, &op) {
					// A reconnection's handshake that failed on the network
					// (its read timed out): no refusal, and said already,
					// explained, by the reconnect's handler.
					return
				}
				a.log.Error("the broker refused: " + err.Error())
			}),
		)
		nc, err = nats.Connect(a.id.BrokerURL, opts...)
		if err == nil {
			return nc, done, nil
		}
		a.linkFailed(explain(a.id.BrokerURL, err, a.pins.since(start)))
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		attempts++
		if d, revoked := a.revokedDelay(); revoked {
			a.sleep(ctx, d)
		} else {
			a.sleep(ctx, a.linkWait(attempts))
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
	}
}

// The waits between attempts to link (linkWait), in RetryWaits: a window
// of linkWindowFirst, doubled at each failed attempt up to linkWindowMax.
const (
	linkWindowFirst = 4
	linkWindowMax   = 60
)

// linkWait is the wait before attempt+1 to link, after attempt failed
// ones (or, for attempt 1, after the link was lost): RetryWait, and a
// part of a window drawn at random (full jitter), the window growing
// with the failed attempts. When the control side restarts, every node
// of the fleet loses its link at the same instant: a window the same for
// every attempt brought them all back within a second of one another, a
// storm the broker answered in 2–14 s, so the nodes that gave up came back
// in the next second's storm; a window that grows spreads each round of
// those that failed over longer than the last. The agent's first dial and
// the client library's reconnection (reconnectDelay) both wait so.
func (a *Agent) linkWait(attempt int) time.Duration {
	w, most := linkWindowFirst*a.o.RetryWait, linkWindowMax*a.o.RetryWait
	for i := 1; i < attempt && w < most; i++ {
		w *= 2
	}
	return a.o.RetryWait + rand.N(min(w, most)+1)
}

// revokedWaitMax is the longest wait between attempts of a node whose
// credential the broker refuses.
const revokedWaitMax = time.Hour

// revokedDelay is the wait before the next attempt to link when the broker
// has refused this node's credential (revoked): RevokedWait, doubled at
// each wait chosen since up to revokedWaitMax, a quarter of it either way
// at random. It starts at the ordinary pace because a refusal is not
// always a revocation: a broker learns of a node just added or enrolled a
// moment after the node may first try, and those first tries cost little.
// A revoked credential comes back only with a new enrolment,
// which reaches the agent through the executor (the look, every few
// seconds, sees it begun) and not through the broker: trying every few
// seconds for ever was load on the broker and noise in its log (an
// authentication error each), and gained nothing. The jitter keeps a
// fleet revoked at once (a control side's key rotated, say) from coming
// back in step.
func (a *Agent) revokedDelay() (time.Duration, bool) {
	a.linkMu.Lock()
	revoked, n := !a.link.revoked.IsZero(), a.link.revokedWaits
	if revoked {
		a.link.revokedWaits++
	}
	a.linkMu.Unlock()
	if !revoked {
		return 0, false
	}
	d := a.o.RevokedWait
	for i := 0; i < n && d < revokedWaitMax; i++ {
		d *= 2
	}
	d = min(d, revokedWaitMax)
	return d - d/4 + rand.N(d/2+1), true
}

// reconnectDelay is the NATS client's wait before each attempt to link
// again (nats.CustomReconnectDelay, which counts the attempts since the
// link was lost from 1): linkWait, or revokedDelay once the broker
// refuses the credential. The client's
// handlers run after the attempt's failure on a goroutine of their own,
// so the connection's last error is read here too: the first wait after a
// refusal is already the longer one.
func (a *Agent) reconnectDelay(attempt int) time.Duration {
	if nc := a.ncp.Load(); nc != nil {
		if err := nc.LastError(); err != nil && explain(a.id.BrokerURL, err, nil).Reason == LinkAuthorization {
			a.refused(explain(a.id.BrokerURL, err, nil))
		}
	}
	if d, revoked := a.revokedDelay(); revoked {
		return d
	}
	return a.linkWait(attempt)
}

// sleep waits d, or until ctx ends.
func (a *Agent) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (a *Agent) linkFailed(e *LinkError) {
	if e.Reason == LinkAuthorization {
		a.refused(e)
	}
	now := clock.Deadline(0) // the runtime's clock: a pace, not a stamp
	a.linkMu.Lock()
	a.link.lastErr = e.Msg
	say, repeats := true, 0
	switch {
	case !strings.EqualFold(a.lastLog, e.Msg):
		// nats.go says one refusal twice, through the connect's error and
		// its error handler, once in upper case: one error, said once.
		a.lastLog, a.repeats = e.Msg, 0
	case now.Sub(a.lastLogAt) < a.linkLogEvery():
		a.repeats++
		say = false
	default:
		repeats, a.repeats = a.repeats, 0
	}
	if say {
		a.lastLogAt = now
	}
	a.linkMu.Unlock()
	switch {
	case !say:
	case repeats > 0:
		a.log.Error("link: "+e.Msg, "reason", e.Reason, "state", link.StateDisconnected, "again", repeats)
	default:
		a.log.Error("link: "+e.Msg, "reason", e.Reason, "state", link.StateDisconnected)
	}
}

// linkLogEvery is how often an agent that cannot link says the same error
// again: once a longest wait between its attempts (linkWindowMax
// RetryWaits), with how many times it came since, where every attempt
// said it (a node off its broker for a year wrote a line a minute) or
// only the first did (the log then looked as if the agent had stopped
// trying).
func (a *Agent) linkLogEvery() time.Duration {
	return (linkWindowMax + 1) * a.o.RetryWait
}

// refused notes a refusal of this node's credential by the broker, and
// says the first since the link was up: the node is revoked, and what the
// agent does now.
func (a *Agent) refused(e *LinkError) {
	a.linkMu.Lock()
	first := a.link.revoked.IsZero()
	if first {
		a.link.revoked = clock.Now()
	}
	a.linkMu.Unlock()
	if first {
		a.log.Error("the broker refuses this node's credential: revoked by the control side (node revoke, or another machine enrolled as this node), unless the broker has yet to learn of a node just added; trying again less and less often, up to once an hour, until a new enrolment (mesh-control token issue --node NAME, then mesh-executor enrol)",
			"reason", e.Msg, "state", link.StateDisconnected)
	}
}

func (a *Agent) linked() {
	if a.o.beforeLinked != nil {
		a.o.beforeLinked()
	}
	now := clock.Now()
	prev := a.state.get().LastLinked
	// Before the link is up to the work loop (linkedNow): it tells the
	// executor first, and what was done while cut off rides on that
	// report, not on an activity report ahead of it.
	a.reconc.Store(true)
	if nc := a.ncp.Load(); nc != nil {
		a.linkedAt.Store(nc.Stats().Reconnects)
	}
	a.linkMu.Lock()
	a.link.up, a.link.since, a.link.lastLinked = true, now, prev
	a.link.revoked, a.link.revokedWaits = time.Time{}, 0
	a.link.unlinked = 0
	// Not at once: a fleet links again all together after the control
	// side's restart, and a read back by every node in that moment was
	// load where the broker had least to spare.
	a.link.clockFrom = now.Add(rand.N(min(clockEvery, clockSpread*a.o.Heartbeat) + 1))
	if !prev.IsZero() {
		a.link.unlinked = now.Sub(prev)
	}
	a.lastLog = ""
	a.linkMu.Unlock()
	if err := a.state.update(func(s *State) { s.LastLinked = now }); err != nil {
		a.log.Warn("state: " + err.Error())
	}
	a.log.Info("linked", "broker", a.id.BrokerURL, "state", link.StateEnrolled)
	for _, ch := range []chan struct{}{a.linkUp, a.hbNow} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// linkSaid is the link as the executor is told it with each status:
// up since when, or down since the last moment the agent knew it linked
// (kept across its restarts). A hosted agent has no link to speak of.
func (a *Agent) linkSaid() *wire.AgentLink {
	if a.id == nil {
		return nil
	}
	a.linkMu.Lock()
	l := a.link
	a.linkMu.Unlock()
	said := &wire.AgentLink{Revoked: l.revoked.UTC(), Error: wire.LinkErrorText(l.lastErr), ClockSkew: l.skew, ClockAt: l.skewAt.UTC()}
	switch {
	case l.up:
		said.Up, said.Since, said.Revoked, said.Error = true, l.since.UTC(), time.Time{}, ""
	case !l.downSince.IsZero():
		said.Since = l.downSince.UTC()
	default:
		said.Since = a.state.get().LastLinked.UTC()
	}
	return said
}

// clockEvery is how often the agent measures its clock against the
// broker's while linked: a request a node each time, and a clock drifts
// slowly. A link's first measure comes with a heartbeat drawn at random
// within clockSpread heartbeat periods of its start (at most clockEvery).
const (
	clockEvery  = 10 * time.Minute
	clockSpread = 10
)

// clockDue says whether the clock is to be measured after this heartbeat,
// and notes the try.
func (a *Agent) clockDue(now time.Time) bool {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	if now.Before(a.link.clockFrom) {
		return false
	}
	if !a.link.clockTried.IsZero() && a.link.clockTried.After(a.link.since) && now.Sub(a.link.clockTried) < clockEvery {
		return false
	}
	a.link.clockTried = now
	return true
}

// measureClock reads back the node's newest heartbeat (subject, its
// HeartbeatGet) and says how far the time the node stamped on it was
// ahead of the broker's time of receipt — the skew mesh-control nodes
// shows, measured alike — and that time as the node said it. sent is the
// time of the heartbeat just published: the read can pass it on its way
// to the stream, and is made again, a few times, while it finds an older
// one (which, found last, is measured all the same: each heartbeat
// against its own receipt).
func measureClock(nc *nats.Conn, subject string, sent time.Time) (skew time.Duration, at time.Time, err error) {
	for try := 0; ; try++ {
		skew, at, err = readClock(nc, subject)
		if err != nil || !at.Before(sent) || try == 4 {
			return skew, at, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readClock is one read of measureClock's.
func readClock(nc *nats.Conn, subject string) (skew time.Duration, at time.Time, err error) {
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("reading back the heartbeat: %w", err)
	}
	if st := m.Header.Get("Status"); st != "" {
		return 0, time.Time{}, fmt.Errorf("reading back the heartbeat: status %s %s", st, m.Header.Get("Description"))
	}
	received, err := time.Parse(time.RFC3339Nano, m.Header.Get(link.HeaderTimeStamp))
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("reading back the heartbeat: the broker's time of it: %w", err)
	}
	var hb struct {
		At time.Time `json:"at"`
	}
	if err := json.Unmarshal(m.Data, &hb); err != nil || hb.At.IsZero() {
		return 0, time.Time{}, fmt.Errorf("reading back the heartbeat: no time in it (%v)", err)
	}
	return hb.At.Sub(received).Round(time.Millisecond), hb.At, nil
}

// linkedNow says whether the client is connected and linked has run for
// this connection. Not whether the client is connected alone: it says so
// before its handlers (linkDown, then linked) run, on a goroutine of their
// own, and a look between reported what the executor did while cut off
// as activity, ahead of the reconnect's report that was to carry it.
func (a *Agent) linkedNow() bool {
	return a.nc.IsConnected() && a.nc.Stats().Reconnects == a.linkedAt.Load()
}

// linkIsUp says whether the link is up as the agent's handlers last said
// (linked, linkDown). Not the client's IsConnected: nats.go holds the
// connection's lock through a reconnection's whole handshake, up to the
// connect timeout (link.ConnectTimeout, 20 s) when a broker holds the
// connect, and the heartbeat loop asking it stopped telling the executor
// the link was down for that long.
func (a *Agent) linkIsUp() bool {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	return a.link.up
}

// linkDown notes the link down: lost (a warning), or closed by the agent
// itself as it stops (said at info: a clean stop is no fault to alert on).
func (a *Agent) linkDown(err error, closed bool) {
	a.readMu.Lock()
	if a.readStop != nil {
		a.readStop(errReadLinkLost)
	}
	a.readMu.Unlock()
	now := clock.Now()
	a.linkMu.Lock()
	was := a.link.up
	a.link.up = false
	if was {
		a.link.downSince = now
	}
	a.linkMu.Unlock()
	if !was {
		return
	}
	if err := a.state.update(func(s *State) { s.LastLinked = now }); err != nil {
		a.log.Warn("state: " + err.Error())
	}
	if closed {
		why := "the agent stops"
		if a.runCtx != nil {
			switch cause := context.Cause(a.runCtx); {
			case errors.Is(cause, errReenrol):
				why = "an enrolment is carried out, then the agent links again"
			case errors.Is(cause, errEarlierLayout), errors.Is(cause, errTryByNode):
				why = "the agent links again with other subjects"
			case errors.Is(cause, ErrRetired):
				why = "the executor holds no identity any more; the agent is hosted again"
			}
		}
		a.log.Info("link closed: "+why, "state", link.StateDisconnected)
		return
	}
	msg := "link lost"
	if err != nil {
		msg += ": " + err.Error()
	}
	a.log.Warn(msg, "state", link.StateDisconnected)
}

// work is the worker: it tells the executor when the link came back, and
// reads the newest declaration on the node's subject — at every
// (re)connect, at every notice and on a jittered timer — and drains it when
// it is not the one last settled, until ctx ends or the connection is
// closed for good. "Not the one last settled", not "newer": a stream made
// anew starts its sequences again, and the signed sequence inside is what
// the agent and the executor judge by.
func (a *Agent) work(ctx context.Context) {
	wait := a.o.RetryWait
	// read says the subject is to be read; byNotice, that only notices
	// asked since the last read (not a connect, not the timer).
	read, byNotice := true, false
	a.rosterDue.Store(true)
	poll := time.NewTimer(a.pollWait())
	defer poll.Stop()
	for ctx.Err() == nil && !a.nc.IsClosed() {
		if !a.linkedNow() {
			select {
			case <-ctx.Done():
			case <-a.linkUp:
			case <-time.After(time.Second):
			}
			read, byNotice = true, false
			a.rosterDue.Store(true)
			continue
		}
		if a.reconc.Load() || a.reconnectReport != nil {
			if err := a.reconnected(ctx); err != nil {
				if errors.Is(err, ErrUpgraded) {
					a.upgraded(err)
					return
				}
				a.log.Error("reconnect: " + err.Error())
				wait = a.backoff(ctx, wait)
				continue
			}
			read, byNotice = true, false
		}
		if read {
			noticed := a.noticed.Swap(0)
			carried := a.carried.Swap(nil)
			// The roster first: a declaration whose overlay takes its
			// peers from it finds the newest there.
			var err error
			if a.rosterDue.Load() {
				err = a.syncRoster(ctx)
			}
			var m *declMsg
			switch {
			case err != nil:
			case byNotice && carried != nil && carried.sseq >= noticed && carried.sseq > a.state.get().LastStreamSeq:
				// Woken by notices only, and the newest of them carried
				// its declaration: nothing to read. (At a connect or on
				// the timer the subject is read: what a notice carried
				// before the link went down may not be the newest.)
				m = carried
			default:
				m, err = a.readNewest(ctx, noticed)
				// A read may find the subject staler than a notice that
				// came meanwhile (the broker's answer and the notice race):
				// the newer of the two goes on, so that the notice's wake,
				// taken by this read, does not leave its declaration
				// behind.
				if err == nil && carried != nil && carried.sseq > a.state.get().LastStreamSeq && (m == nil || carried.sseq > m.sseq) {
					m = carried
				}
			}
			byNotice = true
			if err == nil && m != nil && m.sseq != a.state.get().LastStreamSeq {
				err = a.drain(ctx, m)
				a.giveBack()
			}
			if err != nil {
				if errors.Is(err, ErrUpgraded) {
					a.upgraded(err)
					return
				}
				if ctx.Err() == nil && a.nc.IsConnected() {
					if errors.Is(err, errReadBehind) {
						a.log.Info("declarations: " + err.Error())
					} else {
						a.log.Error("declarations: " + err.Error())
					}
					// Still to be read, and what a notice carried still
					// to be offered.
					if carried != nil {
						a.carry(carried)
					}
					a.notify(noticed)
					wait = a.backoff(ctx, wait)
				}
				continue
			}
			read, wait, a.behind = false, a.o.RetryWait, 0
			// Done: an executor's return said meanwhile wakes no later
			// back-off of another cause.
			select {
			case <-a.execBack:
			default:
			}
		}
		if err := a.reportActivity(ctx); err != nil {
			if errors.Is(err, ErrUpgraded) {
				a.upgraded(err)
				return
			}
			// Asked again at the next look that says the count.
			a.log.Warn("what the executor did on its own: " + err.Error())
		}
		select {
		case <-ctx.Done():
		case <-a.linkUp:
			read, byNotice = true, false
			a.rosterDue.Store(true)
		case <-a.activityNow:
		case <-a.wake:
			read = true
		case <-poll.C:
			read, byNotice = true, false
			a.rosterDue.Store(true)
			poll.Reset(a.pollWait())
		}
	}
}

// pollWait is the next wait of the timer read: Poll, and up to a quarter
// more.
func (a *Agent) pollWait() time.Duration {
	return a.o.Poll + rand.N(a.o.Poll/4+1)
}

// notice is the handler of the node's notices (link.Subjects.Notice): the
// new message's stream sequence in a header and the declaration's envelope
// as the body, or, from an older control side, the sequence as the body.
// Both unsigned hints: a hostile broker may send any sequence, which costs
// the agent a few reads at most, and any body, which is checked as a read
// declaration is (signature, purpose, address, sequence) before anything
// reaches the executor. Beside the notices come the control side's answers
// it sends here (RekeyHeader, UserJWTHeader) and its statements alone
// (StatementsHeader), each judged as those beside a declaration are.
//
// What is not a notice is dropped without a word: a message whose headers
// name another subject than the node's own declarations (the answer to
// another node's request, which that node named as its reply: the broker
// delivers it here), or one that carries no sequence at all (a publish
// acknowledgement sent here the same way). Reporting them would let
// another node make this one say it refused things.
func (a *Agent) notice(m *nats.Msg) {
	if subj := m.Header.Get(link.HeaderSubject); subj != "" && subj != a.id.Subjects.Decl {
		a.log.Debug("dropped a notice that names another subject", "subject", subj)
		return
	}
	if m.Header.Get(link.UserJWTHeader) != "" {
		a.takeUserJWT(m.Data)
		return
	}
	if m.Header.Get(link.RekeyHeader) != "" {
		// The answer to a rekey request: the executor judges it.
		if len(m.Data) > 0 && len(m.Data) <= wire.MaxRekeyAnswer {
			a.rekeyAnswer.Store(&rekeyMsg{env: bytes.Clone(m.Data), rotations: m.Header.Get(link.RotationHeader)})
			select {
			case a.rekeyNow <- struct{}{}:
			default:
			}
		}
		return
	}
	if m.Header.Get(link.StatementsHeader) != "" {
		// Statements with nothing else to carry them: judged as those
		// beside a declaration are.
		a.statements.Store(&statementsMsg{rotations: m.Header.Get(link.RotationHeader), pins: m.Header.Get(link.PinsHeader)})
		select {
		case a.statementsNow <- struct{}{}:
		default:
		}
		return
	}
	seq, err := strconv.ParseUint(m.Header.Get(link.HeaderSequence), 10, 64)
	if err != nil || seq == 0 {
		if seq, err = strconv.ParseUint(string(m.Data), 10, 64); err != nil || seq == 0 {
			a.log.Debug("dropped a notice that names no sequence")
			return
		}
	} else if len(m.Data) > 0 && len(m.Data) <= wire.MaxEnvelope {
		a.carry(&declMsg{data: m.Data, sseq: seq, capability: m.Header.Get(link.CapabilityHeader), rotations: m.Header.Get(link.RotationHeader), pins: m.Header.Get(link.PinsHeader)})
	}
	a.notify(seq)
}

// carry keeps c as the declaration a notice carried, unless one of a newer
// stream sequence is kept already.
func (a *Agent) carry(c *declMsg) {
	for {
		cur := a.carried.Load()
		if (cur != nil && cur.sseq >= c.sseq) || a.carried.CompareAndSwap(cur, c) {
			return
		}
	}
}

// notify wakes the worker to read; seq, when not 0, is the stream
// sequence it should find at least.
func (a *Agent) notify(seq uint64) {
	for {
		cur := a.noticed.Load()
		if seq <= cur || a.noticed.CompareAndSwap(cur, seq) {
			break
		}
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// reconnected tells the executor the link came back (it reconciles), and
// reports what it did.
func (a *Agent) reconnected(ctx context.Context) error {
	if a.reconnectReport != nil {
		// Its report not confirmed before: published again as it is.
		if err := a.publishReports(ctx, []*link.Report{a.reconnectReport}); err != nil {
			return err
		}
		a.reportedThrough(a.reconnectVerdict)
		a.reconnectReport, a.reconnectVerdict = nil, nil
		return nil
	}
	// Cleared before the executor is asked: the link lost and back again
	// while it reconciles sets it again, for another reconnect.
	a.reconc.Store(false)
	// The disconnection as the agent knew it: the executor says what it
	// did in it.
	rc := wire.Reconnected{After: a.reconnectedAfter()}
	a.linkMu.Lock()
	if l := a.link; !l.lastLinked.IsZero() && l.lastLinked.Before(l.since) {
		rc.From, rc.To = l.lastLinked.UTC(), l.since.UTC()
	}
	a.linkMu.Unlock()
	v, lines, err := a.exec.request(ctx, wire.KindReconnected, &rc)
	if err != nil {
		a.reconc.Store(true)
		return err
	}
	if a.learnFromStatus() {
		a.remembers = true
	}
	r := a.report(v.Seq)
	r.Trigger, r.Outcome, r.Owned = link.TriggerReconnect, v.Outcome, v.Owned
	if lines != nil {
		r.Lines = lines
	}
	r.DisconnectedFrom, r.DisconnectedTo = rc.From, rc.To
	r.Meanwhile, r.MeanwhileMore = v.Meanwhile, v.MeanwhileMore
	if v.Code != wire.CodeNone {
		r.Refused, r.Code, r.RefusedBy = v.Reason, v.Code.String(), "executor"
	}
	a.log.Info("the executor reconciled after the link came back", "seq", v.Seq, "outcome", v.Outcome)
	if err := a.publishReports(ctx, []*link.Report{r}); err != nil {
		a.reconnectReport, a.reconnectVerdict = r, v
		return err
	}
	a.reportedThrough(v)
	return nil
}

// learnFromStatus raises the agent's memory of the last applied sequence
// to the executor's own (after a lost state directory, say), and takes
// the control key in force when the executor's status names another than
// the agent checks with: an agent started after a rotation its executor took
// checks under its enrolment's key until it judges a message the new key
// signed, and would pass over meanwhile what it checks on its own (a
// renewed broker credential, heard in the notice handler, which asks the
// executor nothing). heard: the executor answered.
func (a *Agent) learnFromStatus() (heard bool) {
	s, err := a.exec.status(a.linkSaid())
	if err != nil {
		return false
	}
	if s.ControlKeyID != "" && s.ControlKeyID != wire.KeyID(a.controlKey()) {
		a.learnControlKey("")
	}
	// Only by an agent that does not remember its link (its state lost,
	// or of another enrolment): one that does has settled every
	// declaration up to its own, and one the executor applied past it
	// is a declaration it never reported, which a raised memory would
	// hide (reportUnreported).
	if !a.remembers {
		a.state.update(func(st *State) {
			if s.Seq > st.LastApplied {
				st.LastApplied = s.Seq
				if s.Outcome != "" {
					st.LastAppliedOutcome = s.Outcome
				}
			}
			st.FloorLearnt = true
		})
	}
	return true
}

func (a *Agent) report(seq uint64) *link.Report {
	return &link.Report{Node: a.id.Node, Enrolment: a.id.Enrolment, Seq: seq, Trigger: link.TriggerDeclaration, Lines: []shapes.Line{}, At: clock.Now().UTC()}
}

// heartbeats publishes a heartbeat every period while linked, and one as
// soon as a link comes up.
func (a *Agent) heartbeats(ctx context.Context) {
	t := time.NewTicker(a.o.Heartbeat)
	defer t.Stop()
	// Between heartbeats the agent looks at the executor at least this
	// often: an upgraded executor (another build at the next hello) ends
	// the agent within seconds rather than at its next request, and an
	// unlinked agent (revoked, perhaps) sees a re-enrolment root began.
	look := time.NewTicker(a.o.Look)
	defer look.Stop()
	gone := false // the executor did not answer the last look
	for {
		select {
		case <-ctx.Done():
			return
		case <-look.C:
			s, err := a.hbExec.status(a.linkSaid())
			if err == nil && gone {
				select {
				case a.execBack <- struct{}{}:
				default:
				}
			}
			gone = err != nil
			switch {
			case errors.Is(err, ErrUpgraded):
				a.upgraded(err)
				return
			case err != nil:
			case s.Enrolling:
				// Linked or not: an enrolment root began (enrol
				// --replace, a rekey's) is carried out within a look,
				// not at the next heartbeat.
				if a.mayReenrol() {
					a.log.Info("the executor has an enrolment pending: carrying it out")
					a.cancel(errReenrol)
				}
			default:
				a.heardActivity(s)
			}
			continue
		case <-a.rekeyNow:
			if ans := a.rekeyAnswer.Swap(nil); ans != nil {
				a.handRekey(ans)
			}
			continue
		case <-a.statementsNow:
			if st := a.statements.Swap(nil); st != nil {
				a.takeStatements(st)
			}
			continue
		case <-t.C:
		case <-a.hbNow:
		}
		if nc := a.ncp.Load(); nc != nil && a.linkIsUp() {
			a.heartbeat(nc)
		}
	}
}

// statementsMsg is the statements a message on the notice subject carried
// alone (link.StatementsHeader): header values, as sent.
type statementsMsg struct{ rotations, pins string }

// takeStatements takes what a message carried alone: the control key's
// rotations first, handed to the executor, which says which key is in
// force; then the broker certificates' statement, checked under that key
// (takePins). What the executor could not be asked, or refused, is said;
// the control side sends them again while the heartbeats say they are not
// taken.
func (a *Agent) takeStatements(st *statementsMsg) {
	if st.rotations != "" {
		refused, err := a.learnControlKey(st.rotations)
		switch {
		case err != nil:
			a.log.Warn("the control key's rotations: the executor could not be asked; they come again with the next heartbeat", "err", err.Error())
		case refused != "":
			a.log.Warn("the control key's rotations were refused", "reason", refused)
		}
	}
	a.takePins(st.pins)
}

// rekeyMsg is an answer to a rekey request, as it came: its envelope and
// the control key's rotations sent beside it.
type rekeyMsg struct {
	env       []byte
	rotations string
}

// handRekey hands the control side's answer to a rekey request to the
// executor, once the agent's own check passes it: signed by the control
// key in force, after the rotations beside it (a node that missed a
// rotation takes it here, the answer being signed by the new key). One
// the executor begins an enrolment with shows in its status as an
// enrolment pending, which the heartbeat turns to (errReenrol).
func (a *Agent) handRekey(m *rekeyMsg) {
	if _, err := a.open(wire.PurposeRekey, m.env, m.rotations); err != nil {
		a.log.Warn("rekey: passed over an answer that does not verify", "reason", err.Error())
		return
	}
	b, err := a.hbExec.ask(wire.KindRekey, &wire.Rekey{Envelope: m.env}, "rekey")
	if err != nil {
		if errors.Is(err, ErrUpgraded) {
			a.upgraded(err)
			return
		}
		a.log.Warn("rekey: the answer could not be handed to the executor", "err", err.Error())
		return
	}
	switch r := b.(*wire.RekeyReply); {
	case r.Begun:
		a.log.Info("rekey: the control side answered; the executor begins an enrolment with new keys", "token", r.Token)
	default:
		// A copy sent again after the first began the enrolment is
		// refused too ("no rekey is pending"): said, not alarmed.
		a.log.Info("rekey: the executor did not take an answer", "reason", r.Refused)
	}
}

func (a *Agent) heartbeat(nc *nats.Conn) {
	st := a.state.get()
	a.linkMu.Lock()
	l := a.link
	a.linkMu.Unlock()
	hb := &link.Heartbeat{
		Node: a.id.Node, Enrolment: a.id.Enrolment, At: clock.Now().UTC(),
		Interval: a.o.Heartbeat.Seconds(), State: link.StateEnrolled, Presence: a.presence(),
		AgentVersion: a.o.Version, AgentBuild: a.o.Build, Capability: link.Capability, BrokerPinsSeq: st.PinsSeq, JWTIssuer: a.id.credentialIssuer(),
		LastApplied: st.LastApplied, LastAppliedOutcome: st.LastAppliedOutcome,
		LastSeq: st.LastSeq, LastOutcome: st.LastOutcome,
		LinkedSince: l.since.UTC(), LastLinked: l.lastLinked.UTC(), Unlinked: l.unlinked.Round(time.Second).Seconds(), // whole seconds: JSON integers
		LastLinkError: l.lastErr,
	}
	newDigest := ""
	if s, err := a.hbExec.status(a.linkSaid()); err != nil {
		if errors.Is(err, ErrUpgraded) {
			a.upgraded(err)
			return
		}
		hb.ExecutorError = err.Error()
		// The executor is down: the launcher may have said why, beside
		// the socket, where the agent may read.
		if n := readNotice(filepath.Join(filepath.Dir(a.o.Socket), noticeName)); n != "" {
			hb.ExecutorHalted = n
		}
		if !a.execDown {
			// Said where a person at the machine reads first, once an
			// outage: the heartbeat tells the control side each time.
			a.log.Warn("the executor cannot be reached: this node applies nothing until it is back (the heartbeat says so to the control side)", "err", err, "halted", hb.ExecutorHalted)
			a.execDown = true
		}
	} else {
		if a.execDown {
			a.log.Info("the executor is reachable again")
			a.execDown = false
		}
		if s.Enrolling && a.mayReenrol() {
			a.log.Info("the executor has an enrolment pending: carrying it out")
			a.cancel(errReenrol)
			return
		}
		a.heardActivity(s)
		if hb.Rekey = s.Rekey; hb.Rekey != nil {
			hb.RekeyBroker = a.id.BrokerURL
		}
		hb.Executor = &link.ExecutorStatus{Version: s.Version, Build: s.Build, State: s.State, Node: s.Node, Seq: s.Seq, Outcome: s.Outcome, WireGuardKey: s.WireGuardKey,
			RolledBackFrom: s.RolledBackFrom, RollbackReason: s.RollbackReason, ControlKeyID: s.ControlKeyID}
		// Said again after ProfileAgain, or when the clock went back past
		// its saying (a clock set right after running ahead).
		since := clock.Now().Sub(st.ProfileToldAt)
		if s.ProfileDigest != "" && (s.ProfileDigest != st.ProfileDigest || st.ToldCapability != link.Capability ||
			since >= a.o.ProfileAgain || since < 0) {
			if b, err := a.hbExec.ask(wire.KindProfile, &wire.Profile{}, "profile"); err == nil {
				pr := b.(*wire.ProfileReply)
				hb.Profile, hb.Inventory = pr.Profile, pr.Inventory
				newDigest = pr.Digest
			}
		}
	}
	data, err := jsonMarshal(hb)
	var sig string
	if err == nil {
		sig, err = a.id.Sign(data)
	}
	if err == nil {
		err = nc.PublishMsg(&nats.Msg{Subject: a.id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}})
	}
	if err != nil {
		a.log.Warn("heartbeat: " + err.Error())
		return
	}
	// Linked as of the heartbeat's sending, not of the clock's measure
	// after it: that read can take seconds, and a link lost meanwhile
	// would move "last linked" past what the executor did unlinked (the
	// reconnect report's meanwhile).
	a.state.update(func(s *State) {
		s.LastLinked = clock.Now()
		if newDigest != "" {
			s.ProfileDigest, s.ToldCapability, s.ProfileToldAt = newDigest, link.Capability, clock.Now()
		}
	})
	if a.clockDue(clock.Now()) {
		// A control side of an earlier release grants no read back: the
		// clock goes unmeasured, said at debug, tried again later.
		if skew, at, err := measureClock(nc, a.id.Subjects.HeartbeatGet, hb.At); err != nil {
			a.log.Debug("clock: " + err.Error())
		} else {
			a.linkMu.Lock()
			a.link.skew, a.link.skewAt = skew, at
			a.linkMu.Unlock()
		}
	}
}

// noticeName is the launcher's notice beside the executor's socket
// (launcher.NoticeFile; the agent links nothing of the launcher).
const noticeName = wire.LauncherNotice

// readNotice returns the launcher's reason for starting nothing, or "".
func readNotice(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 64<<10 {
		return ""
	}
	var n struct {
		Halted bool   `json:"halted"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(b, &n) != nil || !n.Halted {
		return ""
	}
	return n.Reason
}

func (a *Agent) presence() string {
	if a.o.Episodic {
		return link.PresenceEpisodic
	}
	return link.PresenceResident
}
