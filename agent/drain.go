package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const (
	// readWithin bounds one direct get of the newest declaration or
	// roster, while the broker answers within it. One it did not answer
	// in time makes the next wait twice as long, up to readWithinMost,
	// until one is answered in time: the broker answers a read it was
	// late with anyway (its work done for nothing), and a fleet that
	// asked again at each timeout asked more of a broker slow already.
	// `overlay set` on 1,000 nodes of 10,000 on one machine (make
	// bench-scale) timed out some 1,300 reads, each asked again, each of
	// the mesh's roster 104 KB sent again and parsed on both sides.
	readWithin     = 5 * time.Second
	readWithinMost = time.Minute
	// pollEvery is how often the agent reads its subject with no notice
	// (core NATS notices are at most once), jittered by up to a quarter
	// so a fleet that came up together does not read together.
	pollEvery = 2 * time.Minute
	// staleRetries is how many times the agent reads again, staleWait
	// apart, when a notice names a message newer than the one it read (a
	// replica not caught up yet, in a cluster).
	staleRetries = 5
	staleWait    = 200 * time.Millisecond
	// behindReads is how many reads in a row answered by an older message
	// than the one settled (a replica behind) are read again before it is
	// refused as a replay: with the work loop's back-off between them,
	// some half a minute.
	behindReads = 5
)

// errReadBehind: the broker answered a read with a message older than the
// one the agent settled last (drain).
var errReadBehind = errors.New("the broker answered with a declaration older than the one settled (a replica not caught up): read again")

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// declMsg is the newest message on the node's declaration subject, as the
// broker handed it over: the envelope, its stream sequence, and the
// capability the control side said beside it (link.CapabilityHeader, as
// sent: "" from a release before it). Nothing else the broker says about
// it is used.
type declMsg struct {
	data       []byte
	sseq       uint64
	capability string
	// rotations is the control key's rotations sent beside it
	// (link.RotationHeader, as sent); pins, the broker certificates the
	// control side announces (link.PinsHeader).
	rotations, pins string
}

// newest reads the newest message on the node's own subject by direct get
// (link.Subjects.DeclGet). nil, nil: there is none.
func (a *Agent) newest(ctx context.Context) (*declMsg, error) {
	return a.getLast(ctx, a.id.Subjects.DeclGet, a.id.Subjects.Decl, "declaration")
}

// readNewest is newest, read again a few times while a notice says there
// is a newer message than the one read (noticed, a stream sequence; 0 for
// none).
func (a *Agent) readNewest(ctx context.Context, noticed uint64) (*declMsg, error) {
	for i := 0; ; i++ {
		m, err := a.newest(ctx)
		if err != nil || i >= staleRetries || noticed == 0 || (m != nil && m.sseq >= noticed) {
			return m, err
		}
		select {
		case <-ctx.Done():
			return m, nil
		case <-time.After(staleWait):
		}
	}
}

// check is the agent's own verification of one envelope: the pinned key
// and the purpose, a link declaration (no action), this node, this
// enrolment, not older than the last applied. It returns the declaration's
// sequence and the declaration, or why it is refused and the wire code of
// the refusal — or, when it could not be judged now (signed by another
// key while the executor, which says which key is in force, does not
// answer: keyUnasked), that error, and no verdict.
func (a *Agent) check(m *declMsg, floor uint64) (seq uint64, d *shapes.Declaration, code wire.Code, reason string, unjudged error) {
	payload, err := a.open(wire.PurposeDeclaration, m.data, m.rotations)
	var ku *keyUnasked
	if errors.As(err, &ku) {
		return 0, nil, wire.CodeNone, "", err
	}
	if err != nil {
		return 0, nil, wire.CodeOf(err), err.Error(), nil
	}
	d, err = shapes.Parse(payload)
	if err != nil {
		// Signed, so its sequence is the control plane's word.
		var s struct {
			Seq uint64 `json:"seq"`
		}
		json.Unmarshal(payload, &s)
		if errors.Is(err, shapes.ErrAction) {
			return s.Seq, nil, wire.CodeAction, err.Error(), nil
		}
		return s.Seq, nil, wire.CodeInvalid, err.Error(), nil
	}
	if d.Node != a.id.Node {
		return d.Seq, nil, wire.CodeAddress, fmt.Sprintf("addressed to node %q; this is node %q", d.Node, a.id.Node), nil
	}
	if d.Enrolment != a.id.Enrolment {
		return d.Seq, nil, wire.CodeAddress, fmt.Sprintf("addressed to enrolment %q; this node's is %q", d.Enrolment, a.id.Enrolment), nil
	}
	if d.Seq < floor {
		return d.Seq, nil, wire.CodeReplay, fmt.Sprintf("sequence %d is older than the last applied, %d", d.Seq, floor), nil
	}
	// The same sequence as the last applied goes on: the executor knows
	// whether it is the same bytes (a no-op) or others (refused).
	return d.Seq, d, wire.CodeNone, "", nil
}

// drain settles m, the newest message on the node's subject. Refused by
// the agent's own checks, it is reported refused and never reaches the
// executor. Otherwise it goes to the executor, its verdict is reported,
// and the declarations between the last the agent settled and this one —
// which it never needs to read — are reported superseded by it, in one
// report. Only once the reports are on the broker is m settled (the
// agent's state names its stream sequence): a failure before that means it
// is read and forwarded again, and the executor answers a duplicate.
func (a *Agent) drain(ctx context.Context, m *declMsg) error {
	if p := a.pendingDrain; p != nil {
		// The reports of a declaration the executor has answered, which
		// the broker did not take: out first, as they were. Read past
		// them, a newer declaration would take the answered one for
		// superseded — never applied — and its changes would be said
		// nowhere.
		if err := a.publishReports(ctx, p.reports); err != nil {
			return err
		}
		a.pendingDrain = nil
		p.settle()
		if p.follow {
			a.followIfHosted()
		}
		if m.sseq == a.state.get().LastStreamSeq {
			return nil
		}
	}
	st := a.state.get()
	seq, d, code, reason, unjudged := a.check(m, st.LastApplied)
	if unjudged != nil {
		// Not settled: read and judged again (the drain's retry, the
		// executor's return).
		return unjudged
	}
	if code == wire.CodeReplay && m.sseq < st.LastStreamSeq && a.behind < behindReads {
		// Older than the message last settled, at an older place in the
		// stream: a replica not caught up answered the read (a cluster
		// whose server was stopped answers so for seconds). Read again,
		// not refused: a refusal would say a replay to the control side
		// and settle the node's memory back to the older message. One
		// that stays so, read after read, is what the stream holds (made
		// anew from an older copy), and is refused as a replay is.
		a.behind++
		return fmt.Errorf("%w: sequence %d at stream sequence %d, the one settled is at %d", errReadBehind, seq, m.sseq, st.LastStreamSeq)
	}
	a.behind = 0
	codeName := code.String()
	if code == wire.CodeNone {
		// The control side's own declaration, to this node: from a
		// control side outside the version skew policy it is refused
		// all the same, and said so, before the executor reads a field
		// it may not know.
		c, err := link.HeaderCapability(m.capability)
		if err == nil {
			err = link.CheckControl(c)
		}
		if err != nil {
			codeName, reason = CodeSkew, err.Error()
		}
	}
	if reason == "" {
		// The control side's own declaration: what it says of the
		// broker's certificates beside it is taken too.
		a.takePins(m.pins)
	}
	if reason != "" {
		a.log.Warn("refused a declaration; it does not reach the executor", "seq", seq, "stream_seq", m.sseq, "code", codeName, "reason", reason)
		r := a.report(seq)
		r.StreamSeq, r.Outcome, r.Refused, r.Code, r.RefusedBy = m.sseq, shapes.Refused, reason, codeName, "agent"
		if err := a.publishReports(ctx, []*link.Report{r}); err != nil {
			return err
		}
		return a.state.update(func(s *State) { s.LastStreamSeq = m.sseq })
	}
	// A node needs the mesh's roster only while its declaration's overlay
	// takes its peers from it: one that starts to is handed the roster
	// first, so its apply finds it; one that does not is never sent one.
	// So is one whose floor (roster_min) is newer than the roster last
	// handed over; otherwise the roster comes with its notice, and a
	// declaration costs no read of it (at 10,000 nodes, a fan-out would be
	// 10,000 reads of the whole roster).
	usesRoster := d.UsesRoster()
	if usesRoster != st.UsesRoster {
		if err := a.state.update(func(s *State) { s.UsesRoster = usesRoster }); err != nil {
			a.log.Warn("state: " + err.Error())
		}
	}
	// And so is one whose roster is due: a rotation just taken (by the
	// check above) makes the roster the new key signed readable, which
	// the executor must hold before this declaration's overlay is
	// applied.
	if usesRoster && (!st.UsesRoster || d.RosterFloor() > st.LastRosterSeq || a.rosterDue.Load()) {
		if err := a.syncRoster(ctx); err != nil {
			return err
		}
	}
	// A declaration the executor applied that the agent never reported —
	// it stopped between the verdict and the broker's confirmation (a
	// kill, the machine's power), and a newer one came meanwhile — is
	// reported as it was before any is called superseded.
	if from := max(st.LastSeq, st.LastApplied) + 1; from < seq {
		if err := a.reportUnreported(ctx, from, seq); err != nil {
			return err
		}
		st = a.state.get()
	}
	var r *link.Report
	// ran is the newest sequence the executor says it applied before this
	// one (wire.Verdict.Prior), when it says it: the declarations past it
	// never ran, so only those are reported superseded — an agent whose
	// memory is behind (its state not written: a full disk, a kill between
	// the broker's confirmation and the write) would say some that ran.
	var ran uint64
	// The archives it names go to the executor's cache first, so the apply
	// finds them there.
	if err := a.streamArchives(ctx, d); err != nil {
		var ar *archiveRefusal
		if !errors.As(err, &ar) {
			if wire.CodeOf(err) == wire.CodeNotEnrolled {
				a.followIfHosted() // it takes no archive: it holds no identity
			}
			return err
		}
		r = ar.refuse(a.report(seq))
		r.StreamSeq = m.sseq
		a.log.Warn("refused a declaration for its archive; it does not reach the executor", "seq", seq, "stream_seq", m.sseq, "reason", ar.msg, "by", r.RefusedBy)
	} else {
		from := max(st.LastSeq, st.LastApplied) + 1
		a.log.Info("forwarding the newest declaration", "seq", seq, "superseding", seq-min(from, seq))
		handed := clock.Now()
		v, lines, err := a.exec.request(ctx, wire.KindDeclaration, &wire.Declaration{Envelope: m.data})
		if err != nil {
			return err
		}
		if v.Code.Passing() {
			// Not the declaration's: the executor moved no floor for it
			// (its store held by a rescue, its disk full) and takes it
			// when handed over again. Nothing is reported or settled; the
			// work loop reads it again after its back-off.
			return fmt.Errorf("the executor cannot take declaration %d now (%s): it is handed over again", seq, strings.TrimPrefix(v.Reason, "executor: "))
		}
		r = a.report(seq)
		r.ApplyMS = max(1, clock.Since(handed).Milliseconds()) // 0 reads "not measured"
		r.StreamSeq, r.Outcome, r.Lines, r.Duplicate, r.Briefing = m.sseq, v.Outcome, lines, v.Duplicate, v.Briefing
		r.Owned = v.Owned
		if v.Prior != nil {
			ran = *v.Prior
		}
		if v.Code != wire.CodeNone || v.Outcome == shapes.Refused {
			r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, v.Reason, v.Code.String(), "executor"
		}
		// As the executor decides it (it drops its identity unless the
		// apply failed, and on being handed the retirement again finishes
		// one a kill cut short), whatever the lines kept. An executor
		// hosted already when the retirement is handed over ran it before
		// the agent could report it (a kill between the verdict and the
		// report) — or lost its state, and then retiring is what the
		// control side asked all the same: said retired too, held there
		// to the declaration signed.
		r.Retired = d.Retire && (r.Outcome != shapes.Refused && r.Outcome != shapes.Failed || v.Code == wire.CodeNotEnrolled)
		a.log.Info("the executor's verdict", "seq", seq, "outcome", r.Outcome, "reason", r.Refused, "duplicate", v.Duplicate)
	}
	// The superseded first, so the newest is the last word.
	out := append(a.superseded(max(st.LastSeq, st.LastApplied, ran)+1, seq, r.Outcome), r)
	settle := func() {
		if err := a.state.update(func(s *State) {
			s.LastStreamSeq = m.sseq
			s.LastSeq, s.LastOutcome = seq, r.Outcome
			if r.Outcome != shapes.Refused && seq >= s.LastApplied {
				s.LastApplied, s.LastAppliedOutcome = seq, r.Outcome
			}
		}); err != nil {
			a.log.Warn("state: " + err.Error())
		}
	}
	// A retire declaration that ran to its end leaves the executor
	// hosted: the agent follows once its report is out. So does an
	// executor that lost its state: it refuses what it is handed as not
	// enrolled. Asked only then: after every declaration, it was a round
	// trip to the executor per declaration for nothing.
	follow := d.Retire || r.Code == wire.CodeNotEnrolled.String()
	if err := a.publishReports(ctx, out); err != nil {
		if r.RefusedBy != "agent" {
			// The executor has answered: kept, and published first at
			// the next drain.
			a.pendingDrain = &pendingDrain{reports: out, settle: settle, follow: follow}
		}
		return err
	}
	settle()
	if follow {
		a.followIfHosted()
	}
	return nil
}

// reportUnreported asks the executor for the last declaration it applied
// from the link, and when that is one between from and seq (the newest,
// about to be forwarded) reports it with the lines its apply kept, those
// before it that never ran superseded by it, and settles it: what the
// executor did is reported however the agent lost it. It is said as the
// executor says it, "applied already" (Duplicate: its lines are of when it
// ran, and are not counted again): the agent cannot know whether its first
// report reached the broker before the stop. The agent's own pending
// reports cover a failure within one run (pendingDrain); this covers what
// a stopped agent forgot. (An executor of another build is never asked:
// the agent ends at its hello.)
func (a *Agent) reportUnreported(ctx context.Context, from, seq uint64) error {
	v, lines, err := a.exec.request(ctx, wire.KindLastApplied, &wire.LastApplied{After: from - 1})
	if err != nil {
		return err
	}
	if v.Code != wire.CodeNone || v.Outcome == "" || v.Outcome == shapes.Refused || v.Seq < from || v.Seq >= seq {
		return nil
	}
	a.log.Warn("the executor applied a declaration the agent had not reported (it stopped before the report was out): reported now", "seq", v.Seq, "outcome", v.Outcome)
	// Those before it that never ran were superseded by it: past the
	// floor its apply moved (Prior), never one the executor applied,
	// which an agent whose memory is behind (its state not written: a
	// full disk) would otherwise say superseded. Not known, none is said.
	var out []*link.Report
	if v.Prior != nil {
		out = a.superseded(max(from, *v.Prior+1), v.Seq, v.Outcome)
	}
	r := a.report(v.Seq)
	// The stream sequence it came by is not known.
	r.Outcome, r.Lines, r.Owned, r.Duplicate = v.Outcome, lines, v.Owned, v.Duplicate
	if r.Lines == nil {
		r.Lines = []shapes.Line{}
	}
	out = append(out, r)
	if err := a.publishReports(ctx, out); err != nil {
		return err
	}
	return a.state.update(func(s *State) {
		s.LastSeq, s.LastOutcome = v.Seq, v.Outcome
		if v.Seq >= s.LastApplied {
			s.LastApplied, s.LastAppliedOutcome = v.Seq, v.Outcome
		}
	})
}

// superseded is the report that the sequences from to by-1 were
// superseded by by (whose outcome was outcome), none when there are none:
// one report for them all, the agent never having read them.
func (a *Agent) superseded(from, by uint64, outcome shapes.Outcome) []*link.Report {
	if from >= by {
		return nil
	}
	s := a.report(by - 1)
	s.Outcome, s.SupersededFrom, s.SupersededBy, s.SupersededOutcome = shapes.Superseded, from, by, outcome
	return []*link.Report{s}
}

// pendingDrain is a drain's reports the broker did not take, after the
// executor answered: published again as they were, then settled.
type pendingDrain struct {
	reports []*link.Report
	settle  func()
	follow  bool
}

// followIfHosted ends the linked agent (ErrRetired) when its executor says
// it holds no identity: the agent is hosted too, ready for an enrolment.
func (a *Agent) followIfHosted() {
	if st, err := a.exec.status(a.linkSaid()); err == nil && st.State == link.StateHosted {
		a.cancel(ErrRetired)
	}
}

// publishReports puts reports on the broker and waits for the report
// stream to have stored each: a report is the node's acknowledgement, so
// it is not settled until the broker says so.
func (a *Agent) publishReports(ctx context.Context, reports []*link.Report) error {
	if len(reports) == 0 {
		return nil
	}
	futures := make([]jetstream.PubAckFuture, 0, len(reports))
	for _, r := range reports {
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		sig, err := a.id.Sign(data)
		if err != nil {
			return err
		}
		// Named by its bytes (JetStream's deduplication, its stream's
		// window of two minutes): a report published again because the
		// broker's confirmation was lost — kept and sent as it was — is
		// stored once. A report made anew says its own time, so no two
		// different reports share a name.
		id := sha256.Sum256(data)
		f, err := a.js.PublishMsgAsync(&nats.Msg{Subject: a.id.Subjects.Report, Data: data, Header: nats.Header{
			link.SignatureHeader: []string{sig}, nats.MsgIdHdr: []string{hex.EncodeToString(id[:])}}})
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("report: %w", err)
		case <-timeout.C:
			return errors.New("report: the broker did not confirm within 10s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
