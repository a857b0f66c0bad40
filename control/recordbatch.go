package control

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// recordBatch is how many messages a recorder lane takes at once, when
// that many are waiting: when they are batchLeast or more, their registry
// writes (each report's copy as the node's last) are one atomic batch, one
// synced write where each report was one. In a fan-out to 10,000 nodes
// those writes, one after another under the registry stream's lock, were
// what the recording waited on (docs/benchmarks.md); a lane's messages
// wait while it writes, so the busier the recorder, the larger its groups.
// Up to 200: the registry stream stages each batch in a store of its own
// at a cost of its own (batchLeast), and at 64 a fan-out to 10,000 nodes
// was recorded 1.2–1.6 s after the last report was stored, at 200
// 0.7–1.3 s (docs/benchmarks.md, "Where a report's time goes").
const recordBatch = 200

// heldPut is a registry write putNewest holds for the group's batch: data
// for key, the report of stream sequence recorded, on the revision expect
// (0: the key is guessed absent, as putNewest guesses it); msgs are the
// group's messages whose recording it is.
type heldPut struct {
	key      string
	data     []byte
	recorded uint64
	expect   uint64
	msgs     []int
}

// recordGroup records msgs, a lane's messages in the order delivered, and
// acknowledges each once what it wrote is written — or gives it back, to
// come again. Where the registry takes atomic batches and the group is
// batchLeast or more, the group's writes are held and made as one (group);
// else each message is recorded and acknowledged as it comes.
func (w *recorder) recordGroup(ctx context.Context, msgs []jetstream.Msg) {
	if len(msgs) < batchLeast || !w.c.batched || w.kind != "report" {
		for _, m := range msgs {
			count, err := w.record(ctx, m)
			w.settle(ctx, m, err, count)
		}
		return
	}
	// Each message's node's last recorded sequence before it: a message
	// whose write fails after record took it is recorded again when it
	// comes back, not passed over as done.
	prev := make([]uint64, len(msgs))
	nodes := make([]string, len(msgs))
	counts := make([]*countNote, len(msgs))
	errs := w.group(ctx, len(msgs), func(i int) error {
		subj := msgs[i].Subject()
		nodes[i] = subj[strings.LastIndexByte(subj, '.')+1:]
		prev[i] = w.last[nodes[i]]
		var err error
		counts[i], err = w.record(ctx, msgs[i])
		return err
	})
	restored := map[string]bool{}
	for i, m := range msgs {
		if errs[i] != nil && !restored[nodes[i]] {
			w.last[nodes[i]] = prev[i] // the earliest of the node's that failed
			restored[nodes[i]] = true
		}
		w.settle(ctx, m, errs[i], counts[i])
	}
}

// group runs each of n recordings in order with their registry writes
// held, makes the writes (flush), and returns each recording's error: its
// own, or that of a write it held that failed.
func (w *recorder) group(ctx context.Context, n int, each func(i int) error) []error {
	w.groupErrs = make([]error, n)
	w.holding = true
	for i := range n {
		w.cur = i
		if err := each(i); err != nil && w.groupErrs[i] == nil {
			w.groupErrs[i] = err
		}
	}
	w.flush(ctx)
	w.holding = false
	errs := w.groupErrs
	w.groupErrs = nil
	return errs
}

// settle acknowledges m, recorded, and counts it in the metrics (count,
// nil for none) — or gives it back after err, uncounted, to be counted
// when it comes again.
func (w *recorder) settle(ctx context.Context, m jetstream.Msg, err error, count *countNote) {
	if err != nil {
		if ctx.Err() == nil {
			w.c.log.Error(err.Error() + "; it comes again")
		}
		m.NakWithDelay(time.Second)
		return
	}
	if count != nil {
		w.c.metrics.recorded(count.outcome, count.trigger, count.applyMS)
	}
	m.Ack()
}

// hold is putNewest while a group is recorded: the write waits for the
// group's batch. A newer report of the same key in the group replaces the
// held one (the registry would take it over that one the next moment).
func (w *recorder) hold(key string, data []byte, recorded uint64) error {
	for _, h := range w.held {
		if h.key == key {
			if recorded > h.recorded {
				h.data, h.recorded = data, recorded
			}
			h.msgs = append(h.msgs, w.cur)
			return nil
		}
	}
	last, known := w.kept[key]
	if known && last.rev != 0 && recorded <= last.recorded {
		return nil // a newer one is there
	}
	w.held = append(w.held, &heldPut{key: key, data: data, recorded: recorded, expect: last.rev, msgs: []int{w.cur}})
	return nil
}

// flush makes the held writes: one atomic batch, each write on the
// revision this lane knows (as putNewest's Update or Create). A batch the
// registry refuses (another wrote a key since) or does not answer is made
// again write by write by putNewest, which reads what it must; a write
// that still fails is its messages' error.
func (w *recorder) flush(ctx context.Context) {
	held := w.held
	w.held = nil
	if len(held) == 0 {
		return
	}
	msgs := make([]*nats.Msg, len(held))
	for i, h := range held {
		msgs[i] = &nats.Msg{Subject: registrySubject(h.key), Data: h.data,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(h.expect, 10)}}}
	}
	ack, err := w.c.publishBatch(ctx, msgs)
	if err == nil {
		first := ack.Sequence - uint64(len(held)) + 1
		for i, h := range held {
			w.kept[h.key] = kept{rev: first + uint64(i), recorded: h.recorded}
		}
		return
	}
	w.c.log.Debug("a recorder's batch was not taken: its writes are made one by one", "writes", len(held), "err", err)
	holding := w.holding
	w.holding = false
	for _, h := range held {
		if err := w.putNewest(ctx, h.key, h.data, h.recorded); err != nil {
			for _, i := range h.msgs {
				w.groupErrs[i] = err
			}
		}
	}
	w.holding = holding
}
