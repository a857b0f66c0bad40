package agent_test

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// fakeExecutor is a test double of the executor's end of the socket: it
// speaks the wire protocol (wire.NewConn, AgentToExecutor), records what
// reaches it, and can be made busy. It verifies each envelope itself as the
// real executor would, so garbage reaching it is a test failure, not a
// silent pass.
type fakeExecutor struct {
	t     *testing.T
	path  string
	ln    net.Listener
	key   ed25519.PublicKey
	build string

	mu         sync.Mutex
	decls      []uint64 // the sequence of each Declaration received, in order
	garbage    []string // what reached it and did not verify
	reconnects int
	applied    uint64
	holdNext   bool
	failNext   bool          // the next Declaration gets an Error and a closed connection
	passNext   bool          // the next Declaration is refused as the executor refuses one it cannot take now (a rescue holds the store)
	holding    chan uint64   // a held declaration's sequence
	release    chan struct{} // closes to let a held declaration go
	changed    chan struct{}
	// did is what this executor "did" (as its history keeps it), and
	// links what the agent said of its link with each status.
	did   []shapes.Activity
	links []wire.AgentLink
	// refuseArchives, while set, is how each archive stream is refused
	// (refuseOnce: the first only), as serve refuses one its cache bound
	// (too-large) or its disk's room (internal) cannot take; streams
	// counts the archive streams begun.
	refuseArchives wire.Code
	refuseOnce     bool
	streams        int
	// hosted: it holds no identity (a retire declaration ran to its end,
	// or its state was lost): it says so and refuses declarations.
	hosted bool
	// statusAfterDecl counts the status requests that came right after a
	// declaration on one connection: the agent's look after a drain.
	statusAfterDecl int
	// plans counts the plan requests answered, activityAsks the
	// activity requests.
	plans        int
	activityAsks int
	// lastAsks counts the LastApplied requests answered; prior is the
	// sequence applied before the last (the floor's Prior).
	lastAsks int
	prior    uint64
	// events is each roster and declaration taken, in order: "roster N"
	// (the roster's own sequence), "decl N".
	events []string
	// owned is what the store owns after a reconcile; when set, a
	// Reconnected's verdict says it, and a roster taken is answered as one
	// that applied the overlay again (a line), saying it too.
	owned []wire.OwnedEntry
	// profileDigest, when set, is the profile its status names (the
	// profile asked answers with it); profiles counts the profiles asked.
	profileDigest string
	profiles      int
	// conns are the connections open to it (down closes them).
	conns map[net.Conn]bool
}

// eventsSeen is what rosters and declarations reached it, in order.
func (f *fakeExecutor) eventsSeen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

// doing records an apply the executor made, for a later Reconnected.
func (f *fakeExecutor) doing(a shapes.Activity) {
	f.mu.Lock()
	f.did = append(f.did, a)
	f.mu.Unlock()
}

// linksSaid is what the agent said of its link, status by status.
func (f *fakeExecutor) linksSaid() []wire.AgentLink {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]wire.AgentLink(nil), f.links...)
}

func newFakeExecutor(t *testing.T, key ed25519.PublicKey, build string) *fakeExecutor {
	t.Helper()
	dir := t.TempDir()
	f := &fakeExecutor{t: t, path: filepath.Join(dir, "executor.sock"), key: key, build: build,
		holding: make(chan uint64, 1), release: make(chan struct{}), changed: make(chan struct{}, 1)}
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	go f.accept(ln)
	t.Cleanup(func() { f.mu.Lock(); f.ln.Close(); f.mu.Unlock() })
	return f
}

// down stops the executor, as one killed: its socket closed and every
// connection to it, none accepted until up.
func (f *fakeExecutor) down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
}

// up starts the executor again on its socket, after down.
func (f *fakeExecutor) up() {
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln = ln
	f.mu.Unlock()
	go f.accept(ln)
}

// pinned is the control key the fake holds in force.
func (f *fakeExecutor) pinned() ed25519.PublicKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.key
}

func (f *fakeExecutor) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// hold makes the next Declaration wait until unhold: the executor is busy.
func (f *fakeExecutor) hold() {
	f.mu.Lock()
	f.holdNext = true
	f.release = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeExecutor) unhold() { close(f.release) }

func (f *fakeExecutor) snapshot() (decls []uint64, reconnects int, garbage []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.decls...), f.reconnects, append([]string(nil), f.garbage...)
}

func (f *fakeExecutor) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.conns == nil {
			f.conns = map[net.Conn]bool{}
		}
		f.conns[c] = true
		f.mu.Unlock()
		go func() {
			f.serve(wire.NewConn(c, wire.AgentToExecutor))
			f.mu.Lock()
			delete(f.conns, c)
			f.mu.Unlock()
		}()
	}
}

// sayAgain answers as the executor says its last apply again (serve's
// sayAgain): its line, applied already, and the floor before it.
func sayAgain(c *wire.Conn, seq, prior uint64) {
	c.Write(wire.KindReportLine, &shapes.Line{Module: "base", ID: "motd", Type: "file", Outcome: shapes.Applied})
	c.Write(wire.KindVerdict, &wire.Verdict{Seq: seq, Outcome: shapes.Applied, Duplicate: true, Prior: &prior})
}

func (f *fakeExecutor) serve(c *wire.Conn) {
	defer c.Close()
	state := wire.StateNew
	afterDecl := false // the last request on this connection was a Declaration
	for {
		k, body, err := c.Read()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.Write(wire.KindError, &wire.Error{Code: wire.CodeOf(err), Message: err.Error()})
			}
			return
		}
		if !wire.Allowed(k, state) {
			c.Write(wire.KindError, &wire.Error{Code: wire.CodeProtocol, Message: k.String() + " not allowed now"})
			return
		}
		wasDecl := afterDecl
		_, afterDecl = body.(*wire.Declaration)
		switch b := body.(type) {
		case *wire.Hello:
			state = wire.StateReady
			c.Write(wire.KindHelloReply, &wire.HelloReply{Protocol: wire.ProtocolVersion, Version: "fake", Build: f.build, Node: "", State: "enrolled"})
		case *wire.Status:
			f.mu.Lock()
			if wasDecl {
				f.statusAfterDecl++
			}
			if b.Link != nil {
				f.links = append(f.links, *b.Link)
			}
			s := &wire.StatusReply{Version: "fake", Build: f.build, State: link.StateEnrolled, Seq: f.applied, Outcome: shapes.Applied,
				ControlKeyID: wire.KeyID(f.key)}
			if f.hosted {
				s.State, s.ControlKeyID = link.StateHosted, ""
			}
			s.ProfileDigest = f.profileDigest
			s.Activity = uint64(len(f.did)) // an activity's count is its place in did, from 1
			f.mu.Unlock()
			c.Write(wire.KindStatusReply, s)
		case *wire.Activity:
			// As the executor answers (store.Since): the oldest after the
			// count named, within the bound.
			f.mu.Lock()
			r := &wire.ActivityReply{Last: min(b.After, uint64(len(f.did)))}
			for _, a := range f.did[r.Last:] {
				if len(r.Acts) == wire.MaxActivities {
					break
				}
				r.Acts = append(r.Acts, a)
				r.Last++
			}
			f.activityAsks++
			f.mu.Unlock()
			c.Write(wire.KindActivityReply, r)
		case *wire.LastApplied:
			// As the executor says again its last apply from the link
			// (serve's sayAgain): past the sequence asked, its lines and
			// outcome; else the floor named, nothing said.
			f.mu.Lock()
			applied, prior := f.applied, f.prior
			f.lastAsks++
			f.mu.Unlock()
			if applied <= b.After {
				c.Write(wire.KindVerdict, &wire.Verdict{Seq: applied})
				continue
			}
			sayAgain(c, applied, prior)
		case *wire.Profile:
			f.mu.Lock()
			f.profiles++
			d := f.profileDigest
			f.mu.Unlock()
			c.Write(wire.KindProfileReply, &wire.ProfileReply{Profile: []byte(`{"os":"fake"}`), Digest: d})
		case *wire.Archive:
			f.mu.Lock()
			hosted, refuse := f.hosted, f.refuseArchives
			if b.Offset == 0 {
				f.streams++
			}
			if refuse != wire.CodeNone && f.refuseOnce {
				f.refuseArchives = wire.CodeNone
			}
			f.mu.Unlock()
			if refuse != wire.CodeNone {
				c.Write(wire.KindError, &wire.Error{Code: refuse, Message: "archive " + b.SHA256 + ": refused as serve refuses it (" + refuse.String() + ")"})
				return
			}
			if hosted {
				// As the executor refuses a stream (serve.go): an Error, and
				// the connection closed.
				c.Write(wire.KindError, &wire.Error{Code: wire.CodeNotEnrolled, Message: "this host has no identity (hosted): it takes no archive from the link"})
				return
			}
			if b.Last {
				c.Write(wire.KindArchiveAck, &wire.ArchiveAck{SHA256: b.SHA256, Stored: true})
			}
		case *wire.Enrol:
			// As a hosted executor with no enrolment begun answers.
			c.Write(wire.KindEnrolOffer, &wire.EnrolOffer{})
		case *wire.Reconnected:
			f.mu.Lock()
			f.reconnects++
			v := &wire.Verdict{Seq: f.applied, Outcome: shapes.Unchanged, Owned: f.owned}
			// As the executor answers: what it did since the count the
			// agent names (store.Newer), or else within the interval it
			// names (store.History).
			for i, a := range f.did {
				if b.After != nil && uint64(i) >= *b.After ||
					b.After == nil && !b.From.IsZero() && !a.At.Before(b.From) && !a.At.After(b.To) {
					v.Meanwhile = append(v.Meanwhile, a)
				}
			}
			v.Activity = uint64(len(f.did))
			f.mu.Unlock()
			f.notify()
			c.Write(wire.KindVerdict, v)
		case *wire.Plan:
			// As the executor answers a plan it verifies: the lines an
			// apply would report, nothing changed.
			if _, err := wire.Open(f.pinned(), wire.PurposePlan, b.Envelope); err != nil {
				f.mu.Lock()
				f.garbage = append(f.garbage, err.Error())
				f.mu.Unlock()
				c.Write(wire.KindPlanReply, &wire.PlanReply{Outcome: shapes.Refused, Code: wire.CodeOf(err), Refused: err.Error(), Lines: []shapes.Line{}})
				continue
			}
			f.mu.Lock()
			f.plans++
			f.mu.Unlock()
			c.Write(wire.KindPlanReply, &wire.PlanReply{Outcome: shapes.Applied, Lines: []shapes.Line{{Module: "base", ID: "planned", Type: "file", Outcome: shapes.Applied}}})
		case *wire.KeyRotations:
			// As the executor takes rotations: each the key in force and
			// the new one signed, in order; answered with the key after.
			f.mu.Lock()
			taken := 0
			for _, env := range b.Envelopes {
				if r, err := wire.OpenRotation(f.key, nil, env); err == nil {
					f.key, _ = r.NewKey()
					taken++
					f.events = append(f.events, fmt.Sprintf("rotation %d", r.Seq))
				}
			}
			key := f.key
			f.mu.Unlock()
			c.Write(wire.KindKeyRotationReply, &wire.KeyRotationReply{ControlKey: key, Taken: taken})
		case *wire.Roster:
			// As the executor takes a roster: verified, then answered;
			// nothing applied again here.
			payload, err := wire.Open(f.pinned(), wire.PurposeRoster, b.Envelope)
			var r *shapes.Roster
			if err == nil {
				r, err = shapes.ParseRoster(payload)
			}
			f.mu.Lock()
			if err != nil {
				f.garbage = append(f.garbage, err.Error())
			} else {
				f.events = append(f.events, fmt.Sprintf("roster %d", r.Seq))
			}
			v := &wire.Verdict{Seq: f.applied, Outcome: shapes.Unchanged}
			if f.owned != nil && err == nil {
				v.Outcome, v.Owned = shapes.Applied, f.owned
				c.Write(wire.KindReportLine, &shapes.Line{Module: "net", ID: "wg", Type: "overlay", Outcome: shapes.Applied})
			}
			f.mu.Unlock()
			f.notify()
			c.Write(wire.KindVerdict, v)
		case *wire.Declaration:
			payload, err := wire.Open(f.pinned(), wire.PurposeDeclaration, b.Envelope)
			var d struct {
				Seq    uint64 `json:"seq"`
				Retire bool   `json:"retire"`
			}
			if err == nil {
				if _, perr := shapes.Parse(payload); perr != nil {
					err = perr
				}
				json.Unmarshal(payload, &d)
			}
			f.mu.Lock()
			if err == nil && f.hosted {
				f.mu.Unlock()
				// As the executor refuses one (serve.go).
				c.Write(wire.KindVerdict, &wire.Verdict{Outcome: shapes.Refused, Code: wire.CodeNotEnrolled,
					Reason: "this host has no identity (hosted): it takes no declaration from the link"})
				continue
			}
			if err != nil {
				f.garbage = append(f.garbage, err.Error())
				f.mu.Unlock()
				f.notify()
				c.Write(wire.KindVerdict, &wire.Verdict{Outcome: shapes.Refused, Code: wire.CodeOf(err), Reason: err.Error()})
				continue
			}
			if f.failNext {
				f.failNext = false
				f.mu.Unlock()
				c.Write(wire.KindError, &wire.Error{Code: wire.CodeBusy, Message: "busy (a rescue apply holds the lock)"})
				return
			}
			if f.passNext {
				f.passNext = false
				f.mu.Unlock()
				// As serve.go answers when the store's lock is held past
				// its wait: a verdict, no floor moved.
				c.Write(wire.KindVerdict, &wire.Verdict{Seq: d.Seq, Outcome: shapes.Refused, Code: wire.CodeInternal,
					Reason: "executor: store: busy: pid 42 holds the store's lock"})
				continue
			}
			f.decls = append(f.decls, d.Seq)
			f.events = append(f.events, fmt.Sprintf("decl %d", d.Seq))
			hold, release := f.holdNext, f.release
			f.holdNext = false
			f.mu.Unlock()
			f.notify()
			if hold {
				f.holding <- d.Seq
				<-release
			}
			f.mu.Lock()
			if d.Seq == f.applied {
				prior := f.prior
				f.mu.Unlock()
				sayAgain(c, d.Seq, prior)
				continue
			}
			prior := f.applied
			f.mu.Unlock()
			c.Write(wire.KindReportLine, &shapes.Line{Module: "base", ID: "motd", Type: "file", Outcome: shapes.Applied})
			f.mu.Lock()
			if d.Seq > f.applied {
				f.applied, f.prior = d.Seq, f.applied
			}
			f.hosted = f.hosted || d.Retire
			f.mu.Unlock()
			c.Write(wire.KindVerdict, &wire.Verdict{Seq: d.Seq, Outcome: shapes.Applied, Prior: &prior})
		}
	}
}
