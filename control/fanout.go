package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"golang.org/x/sync/errgroup"
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
	errs = newFlight(declareFirst, declareLeast, declareMost).fly(ctx, len(nodes), func(i int) (err error) {
		seqs[i], err = c.declareFrom(ctx, snap, last[nodes[i]], nodes[i], decl)
		return err
	}, c.Progress)
	return seqs, errs
}

// declareFrom is one node's declare of DeclareAll, from the snapshot.
func (c *Client) declareFrom(ctx context.Context, snap map[string]jetstream.KeyValueEntry, last *lastOnSubject, node string, decl []byte) (uint64, error) {
	e, ok := snap[nodeKey(node)]
	if !ok {
		// Not in the snapshot (added since, or the watch's first pass
		// short): read on its own, as Declare does, which says so if it
		// truly is not there.
		return c.Declare(ctx, node, decl)
	}
	var rec NodeRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return 0, fmt.Errorf("node %q: %w", node, err)
	}
	var b *shapes.Briefing
	if be, ok := snap["briefing."+node]; ok {
		b = new(shapes.Briefing)
		if json.Unmarshal(be.Value(), b) != nil {
			b = nil
		}
	}
	var m map[string]json.RawMessage
	json.Unmarshal(decl, &m) // each its own map: declare fills it in
	return c.declare(ctx, &rec, e.Revision(), b, m, last, true)
}
