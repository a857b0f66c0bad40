package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The mesh's roster (the overlay's peers) is read like a declaration — by
// direct get of its one subject, at every (re)connect, at every roster
// notice and on the timer — and handed to the executor when it is not the
// one last settled. The agent checks it first (the pinned key, its
// purpose, a roster that parses) so a broker's garbage stops here; the
// executor checks it again and alone decides (only a newer one is taken).

// rosterJitter spreads the reads a roster notice sets off: every node of
// the mesh hears the same notice at once, and the roster is the same
// bytes for all of them.
const rosterJitter = time.Second

// rosterNotice is the handler of the roster's notices: a node whose
// declaration takes no peers from the roster ignores them, and so does one
// that holds that roster already or whose notice names no roster newer
// than it — the one subject every node hears, a message another node sent
// here as the reply of its own request (a read of the roster, a publish's
// acknowledgement) would otherwise set off a read on every node.
func (a *Agent) rosterNotice(m *nats.Msg) {
	st := a.state.get()
	if !st.UsesRoster {
		return
	}
	if subj := m.Header.Get(link.HeaderSubject); subj != "" && subj != link.RosterSubject {
		return
	}
	seq, err := strconv.ParseUint(string(m.Data), 10, 64)
	if err != nil || seq == 0 {
		if seq, err = strconv.ParseUint(m.Header.Get(link.HeaderSequence), 10, 64); err != nil || seq == 0 {
			return
		}
	}
	if seq <= st.LastRosterStreamSeq {
		return
	}
	time.AfterFunc(rand.N(rosterJitter), func() {
		a.rosterDue.Store(true)
		a.notify(0)
	})
}

// errReadLinkLost ends a read in flight when the link drops.
var errReadLinkLost = errors.New("the link was lost while the broker had not answered")

// getLast reads the newest message on subject by the last-by-subject
// direct get req. nil, nil: there is none.
func (a *Agent) getLast(ctx context.Context, req, subject, what string) (*declMsg, error) {
	wait := readWithin
	if w := time.Duration(a.readWait.Load()); w > wait && a.linkIsUp() {
		wait = w
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	rctx, stop := context.WithCancelCause(rctx)
	a.readMu.Lock()
	a.readStop = stop
	a.readMu.Unlock()
	defer func() {
		a.readMu.Lock()
		a.readStop = nil
		a.readMu.Unlock()
		stop(nil)
	}()
	m, err := a.nc.RequestWithContext(rctx, req, nil)
	switch {
	case err == nil:
		a.readWait.Store(0)
	case errors.Is(context.Cause(rctx), errReadLinkLost):
		err = errReadLinkLost // no lateness of the broker's
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && a.linkIsUp():
		a.readWait.Store(int64(min(2*wait, readWithinMost)))
	}
	if err != nil {
		return nil, fmt.Errorf("reading the newest %s (%s, %s): %w", what, req, wait, err)
	}
	switch st := m.Header.Get("Status"); st {
	case "":
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("reading the newest %s: the broker answered %s %s", what, st, m.Header.Get("Description"))
	}
	sseq, err := strconv.ParseUint(m.Header.Get(link.HeaderSequence), 10, 64)
	if err != nil || sseq == 0 {
		return nil, fmt.Errorf("reading the newest %s: the broker's answer names no stream sequence (%q)", what, m.Header.Get(link.HeaderSequence))
	}
	if subj := m.Header.Get(link.HeaderSubject); subj != subject {
		return nil, fmt.Errorf("reading the newest %s: the broker answered with a message of %q, not %q", what, subj, subject)
	}
	return &declMsg{data: m.Data, sseq: sseq, capability: m.Header.Get(link.CapabilityHeader), rotations: m.Header.Get(link.RotationHeader), pins: m.Header.Get(link.PinsHeader)}, nil
}

// openRoster verifies a roster envelope under the pinned key and reads
// the roster in it.
func (a *Agent) openRoster(env []byte) (*shapes.Roster, error) {
	payload, err := a.open(wire.PurposeRoster, env, "")
	if err != nil {
		return nil, err
	}
	return shapes.ParseRoster(payload)
}

// syncRoster settles the newest roster if it is not the one last settled.
// A roster the agent refuses, or the executor refuses or applies again a
// declaration for, is reported upward (trigger "roster"); one the
// executor takes with nothing to apply again, or holds already, is not.
func (a *Agent) syncRoster(ctx context.Context) error {
	a.rosterDue.Store(false)
	if !a.state.get().UsesRoster {
		return nil
	}
	m, err := a.getLast(ctx, a.id.Subjects.RosterGet, link.RosterSubject, "roster")
	if err != nil || m == nil {
		if err != nil {
			a.rosterDue.Store(true)
		}
		return err
	}
	if st := a.state.get(); m.sseq == st.LastRosterStreamSeq {
		if st.LastRosterSeq == 0 {
			// Settled by a release that kept no roster sequence: kept
			// now, so a floor is not read again for every declaration.
			if ro, err := a.openRoster(m.data); err == nil {
				return a.state.update(func(s *State) { s.LastRosterSeq = ro.Seq })
			}
		}
		return nil
	}
	var r *link.Report
	var rosterSeq uint64
	ro, err := a.openRoster(m.data)
	if err == nil {
		rosterSeq = ro.Seq
	}
	if errors.Is(err, wire.ErrWrongKey) {
		// Signed by a key this node does not hold yet: the control key
		// rotated, and the rotation comes with this node's next
		// declaration, which reads the roster again once it is taken
		// (learnControlKey). Not settled, not reported.
		a.log.Info("the mesh's roster is signed by a control key this node does not hold yet; read again once the rotation is taken", "stream_seq", m.sseq)
		return nil
	}
	if err != nil {
		a.log.Warn("refused the mesh's roster; it does not reach the executor", "stream_seq", m.sseq, "reason", err.Error())
		r = a.report(0)
		r.Trigger, r.StreamSeq, r.Outcome, r.Refused, r.Code, r.RefusedBy = link.TriggerRoster, m.sseq, shapes.Refused, "roster: "+err.Error(), wire.CodeOf(err).String(), "agent"
	} else {
		v, lines, err := a.exec.request(ctx, wire.KindRoster, &wire.Roster{Envelope: m.data})
		if err != nil {
			a.rosterDue.Store(true)
			return err
		}
		a.log.Info("the executor's verdict on the mesh's roster", "stream_seq", m.sseq, "outcome", v.Outcome, "reason", v.Reason, "duplicate", v.Duplicate, "lines", len(lines))
		if v.Code.Passing() {
			// Of the executor's own side (the roster not kept: a full
			// disk): handed over again, not settled, as a declaration.
			a.rosterDue.Store(true)
			return fmt.Errorf("the executor cannot take the mesh's roster now (%s): it is handed over again", strings.TrimPrefix(v.Reason, "executor: "))
		}
		if v.Code != wire.CodeNone || v.Outcome == shapes.Refused || len(lines) > 0 {
			r = a.report(v.Seq)
			r.Trigger, r.StreamSeq, r.Outcome, r.Lines, r.Owned = link.TriggerRoster, m.sseq, v.Outcome, lines, v.Owned
			if r.Lines == nil {
				r.Lines = []shapes.Line{}
			}
			if v.Code != wire.CodeNone || v.Outcome == shapes.Refused {
				r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, v.Reason, v.Code.String(), "executor"
			}
		}
	}
	if r != nil {
		if err := a.publishReports(ctx, []*link.Report{r}); err != nil {
			a.rosterDue.Store(true)
			return err
		}
	}
	return a.state.update(func(s *State) {
		s.LastRosterStreamSeq = m.sseq
		if rosterSeq != 0 {
			s.LastRosterSeq = rosterSeq
		}
	})
}
