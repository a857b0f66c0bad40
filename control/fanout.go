package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"golang.org/x/sync/errgroup"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// One declaration to many nodes (DeclareAll) is many declares, each by
// Declare's rules (declare), with what each reads of the broker read for
// all of them at once: the node records and briefings from one snapshot
// of the registry, and the newest message on every node's subject by
// batched direct gets — so each node costs its sequence's compare-and-set
// and its publish, with many in flight. Declare one node at a time costs
// five round trips each; at 10,000 nodes on 2 cores that was 33 s.

// lastOnSubject is the newest message on a node's subject: its stream
// sequence (0: none) and the declaration sequence it carries.
type lastOnSubject struct {
	stream, seq uint64
	// id is its Nats-Msg-Id, when read on its own (publishDecl): which
	// declare published it.
	id string
	// emptyOnly: publish only on a subject that holds nothing (a
	// declaration carried over an enrolment, declareCarried): one that
	// finds anything there, published since it looked, publishes nothing.
	emptyOnly bool
}

// DeclareAll's window of nodes declared to at once (flight): each is two
// round trips (the sequence's compare-and-set, the publish). A constant 64
// left a quiet machine's two cores 6 % idle waiting on them in a fan-out
// to 10,000 nodes, and 256 kept the broker busy (docs/benchmarks.md, the
// fan-out); a busy broker answers 256 late. It starts at 64 and opens or
// closes with the broker's answers.
const (
	declareFirst = 64
	declareLeast = 8
	declareMost  = 512
)

// multiLastBatch is how many subjects one batched direct get names: the
// broker answers at most 1,024 messages to one.
const multiLastBatch = 1000

// lastOnSubjects reads the newest message on each node's declaration
// subject with batched direct gets (multi_last), multiLastBatch subjects a
// request. A node absent from the answer has none.
func (c *Client) lastOnSubjects(ctx context.Context, nodes []string) (map[string]*lastOnSubject, error) {
	out := make(map[string]*lastOnSubject, len(nodes))
	for i := 0; i < len(nodes); i += multiLastBatch {
		chunk := nodes[i:min(i+multiLastBatch, len(nodes))]
		subjects := make([]string, len(chunk))
		for j, n := range chunk {
			subjects[j] = link.SubjectsOf(n).Decl
			out[n] = &lastOnSubject{}
		}
		req, _ := json.Marshal(map[string]any{"multi_last": subjects, "batch": len(subjects)})
		inbox := c.NC.NewRespInbox()
		sub, err := c.NC.SubscribeSync(inbox)
		if err != nil {
			return nil, err
		}
		if err := c.NC.PublishRequest("$JS.API.DIRECT.GET."+link.DeclStream, inbox, req); err != nil {
			sub.Unsubscribe()
			return nil, err
		}
		err = func() error {
			defer sub.Unsubscribe()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for {
				m, err := sub.NextMsgWithContext(cctx)
				if err != nil {
					return fmt.Errorf("reading the newest declarations of %d nodes: %w", len(chunk), err)
				}
				switch st := m.Header.Get("Status"); st {
				case "204": // the end of the batch
					return nil
				case "404": // none of them has a declaration
					return nil
				case "":
				default:
					return fmt.Errorf("reading the newest declarations of %d nodes: the broker answered %s %s", len(chunk), st, m.Header.Get("Description"))
				}
				node := strings.TrimPrefix(m.Header.Get(link.HeaderSubject), "mesh.decl.")
				if l, ok := out[node]; ok {
					l.stream, _ = strconv.ParseUint(m.Header.Get(link.HeaderSequence), 10, 64)
					l.seq, _ = strconv.ParseUint(m.Header.Get(link.SeqHeader), 10, 64)
				}
			}
		}()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeclareAll signs decl for each of nodes and publishes it, as Declare
// does for one, many at a time (flight); it returns each node's sequence
// or why it was not declared to, in nodes' order. Sealed content is bound
// to one node and is declared one node at a time (Declare).
func (c *Client) DeclareAll(ctx context.Context, nodes []string, decl []byte) ([]uint64, []error) {
	seqs, errs := make([]uint64, len(nodes)), make([]error, len(nodes))
	fail := func(err error) ([]uint64, []error) {
		for i := range errs {
			errs[i] = err
		}
		return seqs, errs
	}
	if len(c.Seals) > 0 {
		return fail(errors.New("sealed content is bound to one node: declare it to one node at a time"))
	}
	if err := json.Unmarshal(decl, new(map[string]json.RawMessage)); err != nil {
		return fail(fmt.Errorf("declaration: %w", err))
	}
	// The registry's snapshot and the subjects' newest declarations are
	// read side by side: both come before the first publish.
	var (
		snap map[string]jetstream.KeyValueEntry
		last map[string]*lastOnSubject
	)
	g, gctx := errgroup.WithContext(ctx) // either failing ends the other
	g.Go(func() (err error) { snap, err = c.entries(gctx, "node.*", "briefing.*"); return err })
	g.Go(func() (err error) { last, err = c.lastOnSubjects(gctx, nodes); return err })
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	// Parsed once, as the first node of the snapshot would receive it:
	// the nodes' copies differ only in node, enrolment and seq.
	for _, n := range nodes {
		if e, ok := snap[nodeKey(n)]; ok {
			var rec NodeRecord
			var m map[string]json.RawMessage
			if json.Unmarshal(e.Value(), &rec) == nil && json.Unmarshal(decl, &m) == nil {
				if err := probe(rec.NextSeq, func(seq uint64) ([]byte, error) { return fillDecl(m, &rec, seq) }); err != nil {
					return fail(err)
				}
				break
			}
		}
	}
	if c.batched && len(nodes) >= batchLeast {
		return seqs, c.declareInBatches(ctx, nodes, snap, last, decl, seqs)
	}
	errs = newFlight(declareFirst, declareLeast, declareMost).fly(ctx, len(nodes), func(i int) (err error) {
		seqs[i], err = c.declareFrom(ctx, snap, last[nodes[i]], nodes[i], decl)
		return err
	}, c.Progress)
	return seqs, errs
}

// A fan-out to a broker that takes atomic batches (nats-server 2.12, and
// the streams allowing them: ensure) writes its nodes' sequences and then
// their declarations a batch at a time: each batch is one write to disk
// (an fsync before it is acknowledged, as every write) where each node was
// two. Each node of a batch is checked and written as declare does it —
// the compare-and-set on the revision read, the publish on top of the
// subject's newest with its Msg-Id — and a batch the broker refuses or
// does not answer is done again node by node by declare's own path, which
// tells a sequence or a declaration the batch did store after all (the
// revision moved on; the Msg-Id is the subject's newest).
const (
	// declareBatch is how many nodes one batch takes (nats-server takes
	// 1,000 messages in one at most), and declareBatchBytes how many
	// bytes of declarations, at most: the broker holds a batch whole until
	// it is committed.
	declareBatch      = 200
	declareBatchBytes = 4 << 20
	// batchLeast is the fewest writes made a batch: nats-server stages
	// each atomic batch of a stream of one copy in a store of its own,
	// made on disk for it, about 3 ms of work whatever its size. Measured
	// here (10,000 registry-sized writes, sync always, 16 writers): one by
	// one 1.0 s of CPU, in batches of 4 5.1 s, of 16 1.9 s, of 64 0.7 s,
	// of 200 0.35 s. Fewer writes than this are made one by one.
	batchLeast = 32
	// The window of batches in flight at once (flight): nats-server
	// holds 50 batches in flight on a stream at most; from 2 to 8 the
	// declares to 10,000 nodes took 3.4–3.6 s, from 4 to 16 2.9–3.3 s.
	batchesFirst = 4
	batchesLeast = 1
	batchesMost  = 16
	// At more than one copy a batch's time is its replicas' round
	// trips, not the server's work: more of them in flight (a cluster
	// of three on this machine: the declares to 10,000 nodes 6.47 s
	// with 4 to 16, 5.31 s with 8 to 40; one run each).
	batchesClusterFirst = 8
	batchesClusterMost  = 40
)

// declareInBatches is DeclareAll's declares, a batch of nodes at a time
// (declareBatch); it fills seqs and returns each node's error.
func (c *Client) declareInBatches(ctx context.Context, nodes []string, snap map[string]jetstream.KeyValueEntry, last map[string]*lastOnSubject, decl []byte, seqs []uint64) []error {
	errs := make([]error, len(nodes))
	// As many batches as declareBatch nodes (and declareBatchBytes) ask,
	// the nodes shared evenly among them: no small batch at the end.
	most := max(1, min(declareBatch, declareBatchBytes/(len(decl)+1024)))
	batches := (len(nodes) + most - 1) / most
	per := (len(nodes) + batches - 1) / batches
	started := make([]bool, batches)
	var mu sync.Mutex
	done := 0
	first, most := batchesFirst, batchesMost
	if c.decls.CachedInfo().Config.Replicas > 1 {
		// A cluster: each batch waits on its replicas' round trips.
		first, most = batchesClusterFirst, batchesClusterMost
	}
	berrs := newFlight(first, batchesLeast, most).fly(ctx, batches, func(k int) error {
		started[k] = true
		lo, hi := k*per, min(len(nodes), (k+1)*per)
		err := c.declareBatch(ctx, nodes[lo:hi], snap, last, decl, seqs[lo:hi], errs[lo:hi])
		if c.Progress != nil {
			mu.Lock()
			done += hi - lo
			c.Progress(done, len(nodes))
			mu.Unlock()
		}
		return err
	}, nil)
	for k, err := range berrs {
		if !started[k] && err != nil { // ctx ended before it began
			for i := k * per; i < min(len(nodes), (k+1)*per); i++ {
				errs[i] = err
			}
		}
	}
	return errs
}

// declareBatch declares to nodes, one batch of DeclareAll, into seqs and
// errs (nodes' own). It returns the error of a batch the broker refused or
// did not answer (its nodes then declared to one by one): the flight's
// window closes on one the broker did not answer.
func (c *Client) declareBatch(ctx context.Context, nodes []string, snap map[string]jetstream.KeyValueEntry, last map[string]*lastOnSubject, decl []byte, seqs []uint64, errs []error) error {
	type one struct {
		i    int
		rec  *NodeRecord
		rev  uint64
		b    *shapes.Briefing
		m    map[string]json.RawMessage
		last *lastOnSubject
		seq  uint64
		env  []byte
	}
	var ps []*one
	for i, node := range nodes {
		rec, rev, b, ok, err := fromSnapshot(snap, node)
		switch {
		case !ok:
			seqs[i], errs[i] = c.Declare(ctx, node, decl) // as declareFrom
			continue
		case err != nil:
			errs[i] = err
			continue
		}
		if errs[i] = c.declarable(ctx, rec, b); errs[i] != nil {
			continue
		}
		p := &one{i: i, rec: rec, rev: rev, b: b, last: last[node]}
		json.Unmarshal(decl, &p.m) // each its own map: declare fills it in
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil
	}
	// The sequences: each node's record with its next sequence taken, on
	// the revision read (the compare-and-set KeyValue.Update makes).
	msgs := make([]*nats.Msg, 0, len(ps))
	for _, p := range ps {
		next := *p.rec
		next.NextSeq++
		data, _ := json.Marshal(&next)
		msgs = append(msgs, &nats.Msg{Subject: registrySubject(nodeKey(p.rec.Name)), Data: data,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(p.rev, 10)}}})
	}
	var batchErr error
	if _, err := c.publishBatch(ctx, msgs); err != nil {
		batchErr = err
		c.log.Debug("a fan-out's batch of sequences was not taken: its nodes' are taken one by one", "nodes", len(ps), "err", err)
		taken := ps[:0]
		for _, p := range ps {
			var reread bool
			if p.rec, p.seq, reread, errs[p.i] = c.takeSequence(ctx, p.rec, p.rev, false); errs[p.i] != nil {
				continue
			}
			if reread {
				p.last = nil // the subject's newest is read again too
			}
			taken = append(taken, p)
		}
		ps = taken
	} else {
		for _, p := range ps {
			p.seq = p.rec.NextSeq
		}
	}
	// The declarations, each on top of its subject's newest.
	var batch []*one
	msgs = msgs[:0]
	for _, p := range ps {
		seq := p.seq
		payload, err := fillDecl(p.m, p.rec, seq)
		if err == nil {
			p.env, err = wire.Seal(c.Keys.Signer(), wire.PurposeDeclaration, payload)
		}
		if err != nil {
			errs[p.i] = err
			continue
		}
		if p.last == nil || p.last.stream != 0 && p.last.seq >= seq {
			// Not read, or a newer one there already: publishDecl's to
			// read or to leave.
			if errs[p.i] = c.publishDecl(ctx, p.rec, seq, p.env, p.last); errs[p.i] == nil {
				seqs[p.i] = seq
			}
			continue
		}
		m := c.declMsg(p.rec, seq, p.env)
		m.Header.Set(jetstream.MsgIDHeader, declMsgID(p.rec, seq))
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(p.last.stream, 10))
		msgs = append(msgs, m)
		batch = append(batch, p)
	}
	if len(batch) == 0 {
		return batchErr
	}
	ack, err := c.publishBatch(ctx, msgs)
	if err != nil {
		c.log.Debug("a fan-out's batch of declarations was not stored: its nodes' are published one by one", "nodes", len(batch), "err", err)
		for _, p := range batch {
			if errs[p.i] = c.publishDecl(ctx, p.rec, p.seq, p.env, p.last); errs[p.i] == nil {
				seqs[p.i] = p.seq
			}
		}
		return err
	}
	// An atomic batch is stored whole, in its order, the last at the
	// sequence acknowledged.
	first := ack.Sequence - uint64(len(batch)) + 1
	for k, p := range batch {
		c.notice(p.rec, link.SubjectsOf(p.rec.Name), p.env, first+uint64(k))
		seqs[p.i] = p.seq
	}
	return batchErr
}

// batchHook, when set (by a test only), is told of each batch before it
// is published, with its messages.
var batchHook func(msgs []*nats.Msg)

// publishBatch stores msgs as one atomic batch (all or none), waiting for
// its acknowledgement at most unansweredEach.
func (c *Client) publishBatch(ctx context.Context, msgs []*nats.Msg) (*jetstreamext.BatchAck, error) {
	if batchHook != nil {
		batchHook(msgs)
	}
	ctx, cancel := context.WithTimeout(ctx, unansweredEach)
	defer cancel()
	ack, err := jetstreamext.PublishMsgBatch(ctx, c.JS, msgs)
	if err == nil && ack.BatchSize != uint64(len(msgs)) {
		err = fmt.Errorf("the broker stored %d of a batch of %d", ack.BatchSize, len(msgs))
	}
	return ack, err
}

// declareFrom is one node's declare of DeclareAll, from the snapshot.
func (c *Client) declareFrom(ctx context.Context, snap map[string]jetstream.KeyValueEntry, last *lastOnSubject, node string, decl []byte) (uint64, error) {
	rec, rev, b, ok, err := fromSnapshot(snap, node)
	switch {
	case !ok:
		// Not in the snapshot (added since, or the watch's first pass
		// short): read on its own, as Declare does, which says so if it
		// truly is not there.
		return c.Declare(ctx, node, decl)
	case err != nil:
		return 0, err
	}
	var m map[string]json.RawMessage
	json.Unmarshal(decl, &m) // each its own map: declare fills it in
	return c.declare(ctx, rec, rev, b, m, last, true)
}

// fromSnapshot is node's record, the revision it was read at and its
// briefing (nil: none, or not readable) as the registry's snapshot holds
// them; ok false when it holds no record of the node.
func fromSnapshot(snap map[string]jetstream.KeyValueEntry, node string) (rec *NodeRecord, rev uint64, b *shapes.Briefing, ok bool, err error) {
	e, ok := snap[nodeKey(node)]
	if !ok {
		return nil, 0, nil, false, nil
	}
	rec = new(NodeRecord)
	if err := json.Unmarshal(e.Value(), rec); err != nil {
		return nil, 0, nil, true, fmt.Errorf("node %q: %w", node, err)
	}
	if be, ok := snap["briefing."+node]; ok {
		b = new(shapes.Briefing)
		if json.Unmarshal(be.Value(), b) != nil {
			b = nil
		}
	}
	return rec, e.Revision(), b, true, nil
}
