package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/time/rate"
)

// This file is the one place that keeps the protocol's connection rules
// (wire/protocol.go says them beside the table): the read loop with its
// waits and frame budget, the state transitions, the writer that alone
// writes to a connection, and the slots. Handlers (serve.go) compute an
// answer and return it; none of them writes, so none writes under the
// apply lock.

// handler serves one request kind on a connection and returns its answer
// (kind 0: none), which the loop queues for the writer once the handler
// has returned, with every lock it took released.
type handler func(s *Server, ctx context.Context, c *conn, body any) (wire.Kind, any, error)

// conn is one agent connection and what the executor keeps for it.
type conn struct {
	*wire.Conn
	// archive is the archive stream in flight on this connection, if any:
	// one at a time.
	archive *engine.CacheWriter
	sum     string
	// vsock: the peer came over vsock (admitted by context id; its hello
	// must present the connection secret).
	vsock bool
	// pid and uid: the peer's, from its credentials at connect (none
	// over vsock).
	pid int32
	uid uint32
	out outbox
	// written is closed when the writer has ended.
	written chan struct{}

	// Guarded by Server.slotMu: whether a handler runs now (such a
	// connection is never given up for a newcomer), since when it has
	// waited for a frame, and whether it was given up.
	busy    bool
	idle    time.Time
	evicted bool
}

// outgoing is one frame for the writer; after, when set, runs once it is
// written (or could not be).
type outgoing struct {
	kind  wire.Kind
	body  any
	line  bool
	last  bool // close the connection after it
	after func()
}

// Bounds of a connection's outbox. Report lines never wait (an apply must
// not wait on the agent): up to maxQueuedLineBytes of them are kept for a
// slow reader, and beyond that they are dropped — the verdict still says
// how the apply ended. Answers wait for room once maxQueuedReplies are
// queued: a peer that sends requests and never reads its answers stops
// being read, and is closed by the writer's deadline.
const (
	maxQueuedLineBytes = 16 << 20
	maxQueuedReplies   = 4
)

// outbox is the ordered queue between the handlers and the writer.
type outbox struct {
	mu        sync.Mutex
	cond      sync.Cond
	q         []outgoing
	replies   int
	lineBytes int
	dropped   int
	// done: the reader will queue nothing more; closed: the writer has
	// stopped (what is queued is dropped).
	done, closed bool
}

// lineSize is what one queued line is counted as.
func lineSize(l *shapes.Line) int {
	return 64 + len(l.Module) + len(l.ID) + len(l.Type) + len(l.Outcome) + len(l.Detail)
}

// push queues m. A line is dropped when the queue holds too many line
// bytes already; an answer waits for room. False: the writer has stopped.
func (o *outbox) push(m outgoing) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m.line {
		n := lineSize(m.body.(*shapes.Line))
		if o.closed || o.lineBytes+n > maxQueuedLineBytes {
			o.dropped++
			return !o.closed
		}
		o.lineBytes += n
	} else {
		for !o.closed && o.replies >= maxQueuedReplies {
			o.cond.Wait()
		}
		if o.closed {
			return false
		}
		o.replies++
	}
	o.q = append(o.q, m)
	o.cond.Broadcast()
	return true
}

// pop takes the next frame, waiting for one; false when there is none and
// the reader is done, or the writer stopped.
func (o *outbox) pop() (outgoing, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.q) == 0 && !o.done && !o.closed {
		o.cond.Wait()
	}
	if o.closed || len(o.q) == 0 {
		return outgoing{}, false
	}
	m := o.q[0]
	o.q[0] = outgoing{}
	o.q = o.q[1:]
	if m.line {
		o.lineBytes -= lineSize(m.body.(*shapes.Line))
	} else {
		o.replies--
	}
	o.cond.Broadcast()
	return m, true
}

// finish says the reader queues nothing more; the writer writes what is
// queued, then ends.
func (o *outbox) finish() {
	o.mu.Lock()
	o.done = true
	o.cond.Broadcast()
	o.mu.Unlock()
}

// stop drops what is queued and wakes everyone waiting; the callbacks of
// the frames dropped are returned for the caller to run.
func (o *outbox) stop() []func() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	var after []func()
	for _, m := range o.q {
		if m.after != nil {
			after = append(after, m.after)
		}
	}
	o.q = nil
	o.cond.Broadcast()
	return after
}

// writer is the only goroutine that writes to c: each frame must be taken
// by the peer within wire.ReplyWithin, or the connection is closed.
func (s *Server) writer(c *conn) {
	defer close(c.written)
	for {
		m, ok := c.out.pop()
		if !ok {
			for _, f := range c.out.stop() {
				f()
			}
			return
		}
		c.NetConn().SetWriteDeadline(clock.Deadline(wire.ReplyWithin))
		err := c.Write(m.kind, m.body)
		if m.after != nil {
			m.after()
		}
		switch {
		case errors.Is(err, wire.ErrTooLarge):
			// Ours, not the peer's: the answer outgrew its kind's limit.
			s.log.Error("connection closed: the executor's "+m.kind.String()+" is over its limit, and was not sent", "err", err)
		case err != nil:
			s.log.Warn("connection closed: the peer did not take the executor's "+m.kind.String(), "within", wire.ReplyWithin, "err", err)
		}
		if err != nil || m.last {
			c.Close()
			for _, f := range c.out.stop() {
				f()
			}
			return
		}
	}
}

// line queues a report line without waiting (see maxQueuedLineBytes).
func (c *conn) line(l shapes.Line) {
	c.out.push(outgoing{kind: wire.KindReportLine, body: &l, line: true})
}

// refuse queues a coded error; the writer closes the connection after it.
func (s *Server) refuse(c *conn, code wire.Code, msg string, args ...any) {
	m := fmt.Sprintf("executor: "+msg, args...)
	s.log.Warn("a request refused; the connection closed", "code", code.String(), "reason", m)
	c.out.push(outgoing{kind: wire.KindError, body: &wire.Error{Code: code, Message: m}, last: true})
}

// admit gives nc a slot. When every slot is taken, the connection that has
// waited longest for a frame, with no handler running — an idle agent
// connection, or one that began a frame and stalled — is given up for it,
// so connections that stall cannot keep the agent out.
func (s *Server) admit(nc net.Conn) (*conn, string) {
	select {
	case s.conns <- struct{}{}:
	default:
		s.evictOne()
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case s.conns <- struct{}{}:
		case <-t.C:
			return nil, fmt.Sprintf("executor: %d connections are busy already; refused", s.cfg.MaxConns)
		}
	}
	c := &conn{Conn: wire.NewConn(nc, wire.AgentToExecutor), written: make(chan struct{})}
	c.out.cond.L = &c.out.mu
	s.slotMu.Lock()
	defer s.slotMu.Unlock()
	if s.draining {
		<-s.conns
		return nil, stoppingRefusal
	}
	c.idle = clock.Now()
	s.open[c] = true
	s.tasks.Add(1) // done as its handler ends (handle)
	return c, ""
}

// stoppingRefusal answers a connection made while the daemon stops.
const stoppingRefusal = "executor: stopping; refused (connect again once it has started)"

// evictOne closes the connection that has waited longest with no handler
// running, if there is one.
func (s *Server) evictOne() {
	s.slotMu.Lock()
	var victim *conn
	for c := range s.open {
		if !c.busy && !c.evicted && (victim == nil || c.idle.Before(victim.idle)) {
			victim = c
		}
	}
	if victim != nil {
		victim.evicted = true
	}
	s.slotMu.Unlock()
	if victim != nil {
		s.log.Warn("every connection slot was taken: the one waiting longest for a message was closed for a newcomer", "waiting_since", victim.idle)
		victim.Close()
	}
}

// begin marks c as running a handler; false if it was given up already.
func (s *Server) begin(c *conn) bool {
	s.slotMu.Lock()
	defer s.slotMu.Unlock()
	if c.evicted || s.draining {
		return false
	}
	c.busy = true
	return true
}

// end marks c as waiting for its next frame.
func (s *Server) end(c *conn) {
	s.slotMu.Lock()
	c.busy, c.idle = false, clock.Now()
	s.slotMu.Unlock()
}

// closeSlot frees c's slot once its reader is done: what is queued is given
// ReplyWithin to be written, then the connection is closed.
func (s *Server) closeSlot(c *conn) {
	c.out.finish()
	select {
	case <-c.written:
	case <-time.After(wire.ReplyWithin):
		c.Close()
		<-c.written
	}
	c.Close()
	c.Release()
	s.slotMu.Lock()
	delete(s.open, c)
	s.slotMu.Unlock()
	<-s.conns
}

// handle serves one connection: who may connect, then requests by the
// table, each in its state, within the connection rules.
func (s *Server) handle(ctx context.Context, c *conn) {
	defer s.tasks.Done()
	go s.writer(c)
	defer s.closeSlot(c)
	defer s.endArchive(c) // a stream cut off leaves nothing
	nc := c.NetConn()
	if cid, ok := wire.VsockCID(nc); ok {
		// No peer credentials over vsock: the context id must be on the
		// allow-list now, and the hello must present the secret.
		if err := wire.CheckVsockPeer(cid, s.cfg.VsockCIDs); err != nil {
			s.refuse(c, wire.CodeProtocol, "%v", err)
			return
		}
		c.vsock = true
	} else {
		peer, err := wire.PeerOf(nc)
		if err != nil {
			s.refuse(c, wire.CodeProtocol, "cannot tell who is connecting: %v", err)
			return
		}
		if peer.UID != 0 && (s.cfg.AgentUID < 0 || peer.UID != uint32(s.cfg.AgentUID)) {
			s.refuse(c, wire.CodeProtocol, "refused a connection from uid %d (pid %d): only root and the agent (uid %d) may connect", peer.UID, peer.PID, s.cfg.AgentUID)
			return
		}
		c.pid, c.uid = peer.PID, peer.UID
	}
	state := wire.StateNew
	limit := s.rateFor(c)
	for {
		k, body, err := c.ReadRequest(wire.Wait(state), s.budget)
		if err != nil {
			var r *wire.Refusal
			switch {
			case errors.As(err, &r):
				s.refuse(c, r.Code, "%s", r.Reason)
			case errors.Is(err, wire.ErrStalled):
				s.refuse(c, wire.CodeProtocol, "%v; closed", err)
			case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			default:
				s.log.Info("connection closed", "err", err)
			}
			return
		}
		if !wire.Allowed(k, state) {
			if state == wire.StateArchiving {
				s.refuse(c, wire.CodeProtocol, "%s is not allowed now: archive %s is streaming, and only its next chunk may come", k, c.sum)
				return
			}
			s.refuse(c, wire.CodeProtocol, "%s is not allowed now (a connection starts with one hello, then requests)", k)
			return
		}
		if !limit.AllowN(clock.Now(), 1) {
			s.refuse(c, wire.CodeBusy, "more than %g requests a second from this peer; refused", s.cfg.Rate)
			return
		}
		h, ok := handlers[k]
		if !ok {
			s.refuse(c, wire.CodeProtocol, "%s has no handler", k)
			return
		}
		if !s.begin(c) {
			return
		}
		rk, reply, err := s.call(h, ctx, c, k, body)
		c.Release() // the request's bytes are no longer needed
		s.end(c)
		if err != nil {
			s.refuse(c, wire.CodeOf(err), "%v", err)
			return
		}
		if rk != 0 {
			m := outgoing{kind: rk, body: reply}
			if k == wire.KindDeclaration || k == wire.KindReconnected || k == wire.KindRoster {
				// An apply that installed another version of the host
				// ends the daemon once its verdict is written.
				m.after = s.restartIfUpgraded
			}
			if !c.out.push(m) {
				return
			}
		}
		state = wire.Next(k, state, body)
	}
}

// rateFor is the request rate c's peer shares over all its connections:
// root's, the agent's (by uid), or a vsock peer's (the agent of a VM): a
// peer that drops a connection refused for its rate and dials again finds
// its bucket as it left it, not full.
func (s *Server) rateFor(c *conn) *rate.Limiter {
	key := fmt.Sprintf("uid %d", c.uid)
	if cid, ok := wire.VsockCID(c.NetConn()); ok {
		key = fmt.Sprintf("vsock %d", cid)
	}
	s.ratesMu.Lock()
	defer s.ratesMu.Unlock()
	l := s.rates[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
		s.rates[key] = l
	}
	return l
}
