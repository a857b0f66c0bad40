package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const (
	// maxDrain bounds one drain; more waiting is the next drain's.
	maxDrain = 2048
	// fetchBatch is one pull of the drain.
	fetchBatch = 256
	// waitFirst is how long one pull request waits for a first declaration.
	waitFirst = 20 * time.Second
	// inProgressEvery keeps the declarations of a long apply from being
	// redelivered (the consumer's AckWait is longer).
	inProgressEvery = 10 * time.Second
	// retryLater is how soon a declaration comes back when the executor
	// could not take it.
	retryLater = 2 * time.Second
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// consumer binds the node's durable pull consumer, created by the control
// side when the node was added (the node may not create consumers).
func (a *Agent) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if a.cons != nil {
		return a.cons, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := a.js.Consumer(cctx, link.DeclStream, a.id.Subjects.Consumer)
	if err != nil {
		return nil, fmt.Errorf("the broker has no declaration consumer %s on %s for this node, or refuses it: %w", a.id.Subjects.Consumer, link.DeclStream, err)
	}
	a.cons = c
	return c, nil
}

// collect waits for a first declaration, then takes everything else
// waiting without waiting further.
func (a *Agent) collect(ctx context.Context) ([]jetstream.Msg, error) {
	c, err := a.consumer(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, waitFirst)
	first, err := c.Next(jetstream.FetchContext(wctx))
	cancel()
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.Canceled) {
			return nil, nil
		}
		a.cons = nil // bind again: the consumer may have been made anew
		return nil, err
	}
	msgs := []jetstream.Msg{first}
	for len(msgs) < maxDrain {
		b, err := c.FetchNoWait(min(fetchBatch, maxDrain-len(msgs)))
		if err != nil {
			break
		}
		n := 0
		for m := range b.Messages() {
			msgs = append(msgs, m)
			n++
		}
		if n == 0 {
			break
		}
	}
	return msgs, nil
}

type candidate struct {
	msg  jetstream.Msg
	seq  uint64
	sseq uint64
}

type settled struct {
	report *link.Report // nil: acked without a report
	msg    jetstream.Msg
}

func streamSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// check is the agent's own verification of one envelope: the pinned key
// and the purpose, a link declaration (no action), this node, this
// enrolment, not older than the last applied. It returns the declaration's
// sequence, or why it is refused and the wire code of the refusal.
func (a *Agent) check(env []byte, floor uint64) (seq uint64, code wire.Code, reason string) {
	payload, err := wire.Open(a.id.ControlKey, wire.PurposeDeclaration, env)
	if err != nil {
		return 0, wire.CodeOf(err), err.Error()
	}
	d, err := shapes.Parse(payload)
	if err != nil {
		// Signed, so its sequence is the control plane's word.
		var s struct {
			Seq uint64 `json:"seq"`
		}
		json.Unmarshal(payload, &s)
		if errors.Is(err, shapes.ErrAction) {
			return s.Seq, wire.CodeAction, err.Error()
		}
		return s.Seq, wire.CodeInvalid, err.Error()
	}
	if d.Node != a.id.Node {
		return d.Seq, wire.CodeAddress, fmt.Sprintf("addressed to node %q; this is node %q", d.Node, a.id.Node)
	}
	if d.Enrolment != a.id.Enrolment {
		return d.Seq, wire.CodeAddress, fmt.Sprintf("addressed to enrolment %q; this node's is %q", d.Enrolment, a.id.Enrolment)
	}
	if d.Seq < floor {
		return d.Seq, wire.CodeReplay, fmt.Sprintf("sequence %d is older than the last applied, %d", d.Seq, floor)
	}
	// The same sequence as the last applied goes on: the executor knows
	// whether it is the same bytes (a no-op) or others (refused).
	return d.Seq, wire.CodeNone, ""
}

// drain settles msgs: refusals reported and acked at once; of the valid
// ones only the newest forwarded to the executor; after its verdict, the
// newest reported as the executor says and each older one as superseded by
// it; all acked once their reports are on the broker. If the executor cannot
// take the newest, the valid ones come back later (nak with delay).
func (a *Agent) drain(ctx context.Context, msgs []jetstream.Msg) error {
	floor := a.state.get().LastApplied
	var (
		best     *candidate
		older    []*candidate
		refusals []settled
		dupes    []jetstream.Msg
	)
	for _, m := range msgs {
		sseq := streamSeq(m)
		seq, code, reason := a.check(m.Data(), floor)
		if code == wire.CodeNone && best != nil && seq == best.seq {
			if bytes.Equal(m.Data(), best.msg.Data()) {
				dupes = append(dupes, m) // the same envelope delivered twice
				continue
			}
			code, reason = wire.CodeConflict, fmt.Sprintf("sequence %d was published twice with other bytes", seq)
		}
		if code != wire.CodeNone {
			a.log.Warn("refused a declaration; it does not reach the executor", "seq", seq, "stream_seq", sseq, "code", code.String(), "reason", reason)
			r := a.report(seq)
			r.StreamSeq, r.Outcome, r.Refused, r.Code, r.RefusedBy = sseq, shapes.Refused, reason, code.String(), "agent"
			refusals = append(refusals, settled{r, m})
			continue
		}
		c := &candidate{msg: m, seq: seq, sseq: sseq}
		switch {
		case best == nil:
			best = c
		case seq > best.seq:
			older = append(older, best)
			best = c
		default:
			older = append(older, c)
		}
	}
	var pending []jetstream.Msg
	if best != nil {
		pending = append([]jetstream.Msg{best.msg}, dupes...)
		for _, c := range older {
			pending = append(pending, c.msg)
		}
	}
	if err := a.settle(ctx, refusals); err != nil {
		for _, m := range pending {
			m.NakWithDelay(retryLater)
		}
		return err
	}
	if best == nil {
		return nil
	}
	stop := keepInProgress(pending)
	defer stop()
	var r *link.Report
	// The archives it names go to the executor's cache first, so the apply
	// finds them there.
	if err := a.streamArchives(ctx, best.msg.Data()); err != nil {
		var ar *archiveRefusal
		if !errors.As(err, &ar) {
			stop()
			for _, m := range pending {
				m.NakWithDelay(retryLater)
			}
			return err
		}
		a.log.Warn("refused a declaration for its archive; it does not reach the executor", "seq", best.seq, "stream_seq", best.sseq, "reason", ar.msg)
		r = a.report(best.seq)
		r.StreamSeq, r.Outcome, r.Refused, r.Code, r.RefusedBy = best.sseq, shapes.Refused, ar.msg, CodeArchive, "agent"
	} else {
		a.log.Info("forwarding the newest declaration", "seq", best.seq, "superseding", len(older))
		v, lines, err := a.exec.request(ctx, wire.KindDeclaration, &wire.Declaration{Envelope: best.msg.Data()})
		stop()
		if err != nil {
			for _, m := range pending {
				m.NakWithDelay(retryLater)
			}
			return err
		}
		r = a.report(best.seq)
		r.StreamSeq, r.Outcome, r.Lines, r.Duplicate, r.Briefing = best.sseq, v.Outcome, lines, v.Duplicate, v.Briefing
		r.Owned = v.Owned
		if v.Code != wire.CodeNone || v.Outcome == shapes.Refused {
			r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, v.Reason, v.Code.String(), "executor"
		}
		a.log.Info("the executor's verdict", "seq", best.seq, "outcome", r.Outcome, "reason", r.Refused, "duplicate", v.Duplicate)
	}
	stop()
	// The superseded first, so the newest is the last word.
	var out []settled
	for _, c := range older {
		s := a.report(c.seq)
		s.StreamSeq, s.Outcome, s.SupersededBy, s.SupersededOutcome = c.sseq, shapes.Superseded, best.seq, r.Outcome
		out = append(out, settled{s, c.msg})
	}
	for _, m := range dupes {
		out = append(out, settled{nil, m})
	}
	out = append(out, settled{r, best.msg})
	a.state.update(func(s *State) {
		s.LastSeq, s.LastOutcome = best.seq, r.Outcome
		if r.Outcome != shapes.Refused && best.seq >= s.LastApplied {
			s.LastApplied, s.LastAppliedOutcome = best.seq, r.Outcome
		}
	})
	if err := a.settle(ctx, out); err != nil {
		return err
	}
	// A retire declaration that ran to its end leaves the executor
	// hosted: the agent follows once its report is out.
	if st, err := a.exec.status(); err == nil && st.State == link.StateHosted {
		a.cancel(ErrRetired)
	}
	return nil
}

// keepInProgress tells the broker every inProgressEvery that msgs are
// being worked on, until stop is called.
func keepInProgress(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(inProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					m.InProgress()
				}
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// settle publishes the reports and then acks the messages. If a report
// cannot be published, nothing is acked: the messages come back and are
// settled again (at least once, never lost).
func (a *Agent) settle(ctx context.Context, items []settled) error {
	if len(items) == 0 {
		return nil
	}
	var reports []*link.Report
	for _, it := range items {
		if it.report != nil {
			if it.report.Lines == nil {
				it.report.Lines = []shapes.Line{}
			}
			reports = append(reports, it.report)
		}
	}
	if err := a.publishReports(ctx, reports); err != nil {
		for _, it := range items {
			it.msg.NakWithDelay(retryLater)
		}
		return err
	}
	for _, it := range items {
		if err := it.msg.Ack(); err != nil {
			a.log.Warn("ack: "+err.Error(), "stream_seq", streamSeq(it.msg))
		}
	}
	return nil
}

// publishReports puts reports on the broker and waits for the report
// stream to have stored each.
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
		f, err := a.js.PublishMsgAsync(&nats.Msg{Subject: a.id.Subjects.Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}})
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
