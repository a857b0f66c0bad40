// Package fleet simulates nodes for the fleet-scale bench (make
// bench-scale) and the cluster tests: many agents in one process, each
// against a stand-in for its executor.
package fleet

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Every node is the agent's own code (agent.Run: its
// NATS link with its NKey and pinned TLS, its drain, its heartbeat and its
// reports, one NATS connection each, as the real agent holds) against an
// in-process stand-in for its executor. The stand-in speaks the wire
// protocol over net.Pipe (agent.Options.DialExecutor): it answers hello,
// status and reconnected, and for a declaration verifies the envelope
// with the pinned control key and parses it as the executor would, checks
// its address and sequence, and answers a line per resource, applied —
// without touching the machine. Two unix sockets per agent (the worker's
// and the heartbeat's, both ends in this process) would take four file
// descriptors per node and cap the fleet far below 10,000 in one process.

// standInVersion is the version the stand-in and the agents say; build is
// the same on both sides (the agent leaves when they differ).
const (
	standInVersion = "bench"
	standInBuild   = "bench-scale"
)

// Event is something that happened to a node, stamped when the bench saw
// it.
type Event struct {
	Seq     uint64
	At      time.Time
	Trigger string // reports: declaration or reconnect
	Overlay bool   // the declaration carried the overlay; the report has its line applied
}

// Node is one simulated node: its identity, its stand-in executor's
// state, and what the bench saw of it.
type Node struct {
	f *Fleet
	// Name is the node's name.
	Name string
	id   *agent.Identity
	// dialer dials the broker from the node's own loopback address
	// (loopbackDialer); nil: the client library's own.
	dialer nats.CustomDialer

	mu      sync.Mutex
	applied uint64
	// prior is the sequence applied before it (wire.Verdict.Prior).
	prior      uint64
	received   []Event       // declarations the stand-in took (applied)
	roster     uint64        // the sequence of the roster it holds
	rosters    []rosterEvent // the rosters it took
	recorded   []Event       // reports the control side recorded (KV report.<node>)
	linked     []time.Time   // the agent said "linked"
	reconciled []time.Time   // the agent told its executor the link came back
	done       chan struct{}
	exit       error
}

// fleet is the simulated nodes and their stand-ins.
type Fleet struct {
	key       ed25519.PublicKey // the control key the stand-ins pin
	heartbeat time.Duration
	// Poll is each agent's read of its subject with no notice (the
	// agent's default when zero).
	Poll time.Duration
	// Nodes are the simulated nodes, in the order added; ByName by name.
	Nodes  []*Node
	ByName map[string]*Node

	// Garbage counts what a stand-in refused (a declaration or roster that
	// did not verify or was not its own): the system did not do its job.
	Garbage atomic.Int64 // declarations a stand-in refused: the system did not do its job
	// Rosters counts the rosters agents handed to their stand-ins (each
	// read of the broker, checked by the agent and by the stand-in).
	Rosters atomic.Int64

	phase atomic.Pointer[string] // what the bench is measuring now, for the log's counts
	logMu sync.Mutex
	logs  map[string]int // warnings and errors the agents logged, by phase and message
}

// setPhase names what the bench measures from now on.
func (f *Fleet) SetPhase(name string) { f.phase.Store(&name) }

func New(key ed25519.PublicKey, heartbeat time.Duration) *Fleet {
	return &Fleet{key: key, heartbeat: heartbeat, ByName: map[string]*Node{}, logs: map[string]int{}}
}

// add makes a node of an agent config (from control.Client.AddNode).
func (f *Fleet) Add(cfg *agent.Config) (*Node, error) {
	id, err := cfg.Identity()
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.Node, err)
	}
	n := &Node{f: f, Name: cfg.Node, id: id, dialer: loopbackDialer(cfg.BrokerURL, len(f.Nodes))}
	f.Nodes = append(f.Nodes, n)
	f.ByName[n.Name] = n
	return n, nil
}

// ownAddress is a node's own loopback address in a message, as a dial
// error names it.
var ownAddress = regexp.MustCompile(`127\.1\.\d+\.\d+:0`)

// loopbackDialer dials from a loopback address of the k-th node's own
// (127.1.0.0 on), when the broker is on this machine's loopback: a real
// node links from an address of its own, and ten thousand connections
// from one address to one port leave the kernel searching its range of
// ports at every connect (agent.Options.Dialer). Nil for any other broker.
func loopbackDialer(brokerURL string, k int) nats.CustomDialer {
	first, _, _ := strings.Cut(brokerURL, ",") // a cluster's servers are on one machine
	u, err := url.Parse(first)
	if err != nil {
		return nil
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return nil
	}
	from := net.IPv4(127, byte(1+k>>16), byte(k>>8), byte(k))
	return &net.Dialer{Timeout: link.ConnectTimeout, LocalAddr: &net.TCPAddr{IP: from}}
}

// NKey is the node's public NKey, its user name on the broker.
func (n *Node) NKey() string { return n.id.NKeyPublic() }

// start runs n's agent until ctx ends.
func (n *Node) Start(ctx context.Context) {
	n.done = make(chan struct{})
	go func() {
		defer close(n.done)
		err := agent.Run(ctx, agent.Options{
			Identity:     n.id,
			DialExecutor: n.dial,
			Dialer:       n.dialer,
			Heartbeat:    n.f.heartbeat,
			Poll:         n.f.Poll,
			Version:      standInVersion,
			Build:        standInBuild,
			// A real agent's collection after a drain is of its own small
			// heap, on its own machine; here every agent shares this
			// process's heap, and 10,000 of them after a fan-out were
			// 10,000 full collections of all of them (the bench's process
			// spent most of the fan-out collecting). Not a node's cost.
			GiveBack: func() {},
			// A real agent asks its executor how it is every 2 s, over
			// its own machine's socket; 10,000 here would be 5,000
			// requests a second in this process beside what is measured.
			// The stand-in never upgrades nor enrols again: at each
			// heartbeat is enough.
			Look: n.f.heartbeat,
			Log:  slog.New(agentLog{n}),
		})
		n.mu.Lock()
		n.exit = err
		n.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			n.f.noteLog("agent exited: " + strings.ReplaceAll(err.Error(), n.Name, "NODE"))
		}
	}()
}

// stopped waits for n's agent to return, at most until deadline.
func (n *Node) Stopped(deadline <-chan time.Time) bool {
	if n.done == nil {
		return true
	}
	select {
	case <-n.done:
		return true
	case <-deadline:
		return false
	}
}

// dial is the agent's way to its executor: one end of a pipe whose other
// end the stand-in serves.
func (n *Node) dial() (net.Conn, error) {
	a, b := net.Pipe()
	go n.serve(wire.NewConn(b, wire.AgentToExecutor))
	return a, nil
}

// serve is the stand-in's end of one connection: the protocol's table
// decides what is allowed when, as in the executor's server.
func (n *Node) serve(c *wire.Conn) {
	defer c.Close()
	st := wire.StateNew
	for {
		k, body, err := c.Read()
		at := time.Now()
		if err != nil {
			return
		}
		if !wire.Allowed(k, st) {
			c.Write(wire.KindError, &wire.Error{Code: wire.CodeProtocol, Message: k.String() + " is not allowed now"})
			return
		}
		st = wire.Next(k, st, body)
		switch b := body.(type) {
		case *wire.Hello:
			err = c.Write(wire.KindHelloReply, &wire.HelloReply{Protocol: wire.ProtocolVersion, Version: standInVersion,
				Build: standInBuild, Node: n.Name, State: link.StateEnrolled})
		case *wire.Status:
			n.mu.Lock()
			s := &wire.StatusReply{Version: standInVersion, Build: standInBuild, State: link.StateEnrolled, Node: n.Name,
				Seq: n.applied, Outcome: shapes.Applied}
			n.mu.Unlock()
			err = c.Write(wire.KindStatusReply, s)
		case *wire.Reconnected:
			n.mu.Lock()
			n.reconciled = append(n.reconciled, at)
			seq := n.applied
			n.mu.Unlock()
			err = c.Write(wire.KindVerdict, &wire.Verdict{Seq: seq, Outcome: shapes.Unchanged, Owned: []wire.OwnedEntry{}})
		case *wire.Declaration:
			lines, v := n.apply(b.Envelope, at)
			for i := range lines {
				if err = c.Write(wire.KindReportLine, &lines[i]); err != nil {
					return
				}
			}
			err = c.Write(wire.KindVerdict, v)
		case *wire.Roster:
			err = c.Write(wire.KindVerdict, n.takeRoster(b.Envelope, at))
		case *wire.LastApplied:
			// As the executor says its last apply again (its lines are
			// not kept here: none).
			n.mu.Lock()
			v := &wire.Verdict{Seq: n.applied}
			if n.applied > b.After {
				prior := n.prior
				v.Outcome, v.Duplicate, v.Owned, v.Prior = shapes.Applied, true, []wire.OwnedEntry{}, &prior
			}
			n.mu.Unlock()
			err = c.Write(wire.KindVerdict, v)
		default:
			c.Write(wire.KindError, &wire.Error{Code: wire.CodeProtocol, Message: "the bench's stand-in does not serve " + k.String()})
			return
		}
		if err != nil {
			return
		}
	}
}

// apply is the stand-in's apply: what the executor checks before it
// touches anything (signature with the pinned key, purpose, the
// declaration's strict parse, its address, its sequence), then a line per
// resource, applied, and the owned entries a real apply would report.
func (n *Node) apply(env []byte, at time.Time) ([]shapes.Line, *wire.Verdict) {
	refuse := func(code wire.Code, reason string) ([]shapes.Line, *wire.Verdict) {
		n.f.Garbage.Add(1)
		n.f.noteLog("stand-in refused a declaration: " + strings.ReplaceAll(reason, n.Name, "NODE"))
		return nil, &wire.Verdict{Outcome: shapes.Refused, Code: code, Reason: reason}
	}
	payload, err := wire.Open(n.f.key, wire.PurposeDeclaration, env)
	if err != nil {
		return refuse(wire.CodeOf(err), err.Error())
	}
	d, err := shapes.Parse(payload)
	if err != nil {
		return refuse(wire.CodeOf(err), err.Error())
	}
	if d.Node != n.Name || d.Enrolment != n.id.Enrolment {
		return refuse(wire.CodeAddress, fmt.Sprintf("addressed to %s/%s; this is %s/%s", d.Node, d.Enrolment, n.Name, n.id.Enrolment))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if d.Seq < n.applied {
		return refuse(wire.CodeReplay, fmt.Sprintf("sequence %d is older than the last applied, %d", d.Seq, n.applied))
	}
	if d.Seq == n.applied {
		prior := n.prior
		return nil, &wire.Verdict{Seq: d.Seq, Outcome: shapes.Unchanged, Duplicate: true, Owned: []wire.OwnedEntry{}, Prior: &prior}
	}
	prior := n.applied
	n.prior, n.applied = n.applied, d.Seq
	lines := make([]shapes.Line, 0, len(d.Resources))
	owned := make([]wire.OwnedEntry, 0, len(d.Resources))
	overlay := false
	for _, r := range d.Resources {
		h := r.Head()
		overlay = overlay || h.Type == shapes.TypeOverlay
		lines = append(lines, shapes.Line{Module: h.Module, ID: h.ID, Type: h.Type, Outcome: shapes.Applied})
		owned = append(owned, wire.OwnedEntry{Target: h.Type + ":" + h.Module + "." + h.ID, Type: h.Type, Module: h.Module, ID: h.ID})
	}
	n.received = append(n.received, Event{Seq: d.Seq, At: at, Overlay: overlay})
	return lines, &wire.Verdict{Seq: d.Seq, Outcome: shapes.Derive(lines), Owned: owned, Prior: &prior}
}

// takeRoster is the stand-in's take of the mesh's roster: what the
// executor checks (the pinned key, its purpose, a strict parse, newer than
// the one held), then nothing to apply again (its declarations' overlays
// are the bench's, not WireGuard's).
func (n *Node) takeRoster(env []byte, at time.Time) *wire.Verdict {
	refuse := func(code wire.Code, reason string) *wire.Verdict {
		n.f.Garbage.Add(1)
		n.f.noteLog("stand-in refused a roster: " + reason)
		return &wire.Verdict{Outcome: shapes.Refused, Code: code, Reason: reason}
	}
	n.f.Rosters.Add(1)
	payload, err := wire.Open(n.f.key, wire.PurposeRoster, env)
	if err != nil {
		return refuse(wire.CodeOf(err), err.Error())
	}
	r, err := shapes.ParseRoster(payload)
	if err != nil {
		return refuse(wire.CodeInvalid, err.Error())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case r.Seq == n.roster:
		return &wire.Verdict{Seq: n.applied, Outcome: shapes.Unchanged, Duplicate: true}
	case r.Seq < n.roster:
		return refuse(wire.CodeReplay, fmt.Sprintf("roster %d is older than the one held, %d", r.Seq, n.roster))
	}
	n.roster = r.Seq
	n.rosters = append(n.rosters, rosterEvent{Seq: r.Seq, Nodes: len(r.Nodes), Bytes: len(env), At: at})
	return &wire.Verdict{Seq: n.applied, Outcome: shapes.Unchanged}
}

// rosterEvent is one roster a stand-in took.
type rosterEvent struct {
	Seq          uint64
	Nodes, Bytes int
	At           time.Time
}

// noteRecorded takes in a report the control side recorded.
func (n *Node) NoteRecorded(e Event) {
	n.mu.Lock()
	n.recorded = append(n.recorded, e)
	n.mu.Unlock()
}

// receivedAt is when the stand-in took sequence seq, if it did.
func (n *Node) ReceivedAt(seq uint64) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.received {
		if e.Seq == seq {
			return e.At, true
		}
	}
	return time.Time{}, false
}

// recordedAt is when the control side recorded the report of a
// declaration's sequence seq, if it did.
func (n *Node) RecordedAt(seq uint64) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.recorded {
		if e.Seq == seq && e.Trigger == link.TriggerDeclaration {
			return e.At, true
		}
	}
	return time.Time{}, false
}

// overlayAt is when the stand-in first took a declaration carrying the
// overlay, and when a report with its overlay line applied was first
// recorded, each after since.
func (n *Node) OverlayAt(since time.Time, peers int) (applied, recorded time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.received {
		if e.Overlay && e.At.After(since) {
			applied = e.At
			break
		}
	}
	// Its peers come with the roster: applied once it holds one naming
	// every node of the overlay too.
	var roster time.Time
	for _, e := range n.rosters {
		if e.Nodes >= peers && e.At.After(since) {
			roster = e.At
			break
		}
	}
	if roster.IsZero() {
		applied = time.Time{}
	} else if roster.After(applied) && !applied.IsZero() {
		applied = roster
	}
	for _, e := range n.recorded {
		if e.Overlay && e.At.After(since) {
			recorded = e.At
			break
		}
	}
	if !recorded.IsZero() && !applied.IsZero() && applied.After(recorded) {
		recorded = applied
	}
	return applied, recorded
}

// rosterBytes is the size of the last roster n took, 0 for none.
func (n *Node) RosterBytes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.rosters) == 0 {
		return 0
	}
	return n.rosters[len(n.rosters)-1].Bytes
}

// linkedAfter is when the agent first said "linked" after since.
func (n *Node) LinkedAfter(since time.Time) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.linked {
		if t.After(since) {
			return t, true
		}
	}
	return time.Time{}, false
}

// reconciledAfter is when the agent first told its executor that the link
// came back, after since.
func (n *Node) ReconciledAfter(since time.Time) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.reconciled {
		if t.After(since) {
			return t, true
		}
	}
	return time.Time{}, false
}

// exited says whether n's agent has returned, and with what.
func (n *Node) Exited() (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return false, nil
	}
	select {
	case <-n.done:
		return true, n.exit
	default:
		return false, nil
	}
}

// maxLogKinds bounds the distinct messages the fleet keeps.
const maxLogKinds = 40

// noteLog counts a warning or error an agent (or its stand-in) said, in
// the phase the bench is in.
// digits are the numbers a message names (sequences, times), said as N so
// one kind of message is counted as one.
var digits = regexp.MustCompile(`[0-9]+`)

func (f *Fleet) noteLog(msg string) {
	// Each node dials from an address of its own (loopbackDialer): one
	// message, whichever node said it.
	msg = ownAddress.ReplaceAllString(msg, "127.1.N.N:0")
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if p := f.phase.Load(); p != nil {
		msg = "[" + *p + "] " + msg
	}
	f.logMu.Lock()
	defer f.logMu.Unlock()
	if _, ok := f.logs[msg]; !ok && len(f.logs) >= maxLogKinds {
		msg = "(other messages)"
	}
	f.logs[msg]++
}

// logSummary is the agents' warnings and errors, most frequent first.
func (f *Fleet) LogSummary() []string {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	type kv struct {
		msg string
		n   int
	}
	var all []kv
	for m, n := range f.logs {
		all = append(all, kv{m, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || (all[i].n == all[j].n && all[i].msg < all[j].msg) })
	out := make([]string, 0, len(all))
	for _, x := range all {
		out = append(out, fmt.Sprintf("%6d × %s", x.n, x.msg))
	}
	return out
}

// agentLog is each agent's logger: it notes when the agent links, and
// counts its warnings and errors by message; the rest is dropped (ten
// thousand agents' info lines would cost more than they say).
type agentLog struct{ n *Node }

func (h agentLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h agentLog) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Message == "linked":
		h.n.mu.Lock()
		h.n.linked = append(h.n.linked, r.Time)
		h.n.mu.Unlock()
	case r.Level >= slog.LevelWarn:
		// One message for every node: its name is said as NODE; a
		// refusal's code and reason beside it (they tell one refusal from
		// another), a node's sequences as N.
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "code" || a.Key == "reason" {
				msg += " " + a.Key + "=" + digits.ReplaceAllString(a.Value.String(), "N")
			}
			return true
		})
		h.n.f.noteLog(r.Level.String() + " " + strings.ReplaceAll(msg, h.n.Name, "NODE"))
	}
	return nil
}

func (h agentLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h agentLog) WithGroup(string) slog.Handler      { return h }

// ReportHead is what the bench reads of a recorded report.
type ReportHead struct {
	Node    string        `json:"node"`
	Seq     uint64        `json:"seq"`
	Trigger string        `json:"trigger"`
	Lines   []shapes.Line `json:"lines"`
}

// OverlayApplied says whether a report's overlay line says applied (or
// unchanged, or repaired: what the control side takes as joined).
func (r *ReportHead) OverlayApplied() bool {
	for _, l := range r.Lines {
		if l.Module == control.OverlayModule && l.ID == control.OverlayID && l.Type == shapes.TypeOverlay {
			return l.Outcome == shapes.Applied || l.Outcome == shapes.Unchanged || l.Outcome == shapes.Repaired
		}
	}
	return false
}

// errStopped: the bench is stopping.
var errStopped = errors.New("stopping")
