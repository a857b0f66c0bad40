package control

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"time"

	"github.com/nats-io/nats.go"
)

// Allocate is allocate, for a test that races the overlay's settings.
func (c *Client) Allocate(ctx context.Context, node string, network netip.Prefix) (netip.Addr, error) {
	return c.allocate(ctx, node, network)
}

// AllocateAmong is allocateAmong, for a test of a snapshot's claims gone
// stale.
func (c *Client) AllocateAmong(ctx context.Context, node string, network netip.Prefix, claimed map[netip.Addr]bool) (netip.Addr, error) {
	return c.allocateAmong(ctx, node, network, claimed)
}

// Lane is one recorder lane, for a test of two serve processes' lanes
// recording one node's reports.
type Lane struct{ w *recorder }

// Lane is a new lane of c's recorder.
func (c *Client) Lane() *Lane {
	return &Lane{&recorder{c: c, kind: "report", last: map[string]uint64{}, kept: map[string]kept{}}}
}

// PutReport keeps data, the report of stream sequence recorded, as node's
// last report, unless a newer one is there.
func (l *Lane) PutReport(ctx context.Context, node string, data []byte, recorded uint64) error {
	return l.w.putNewest(ctx, "report."+node, withRecorded(data, recorded), recorded)
}

// Report keeps data, node's report of stream sequence recorded, as the
// recorder keeps each report it takes (what the node owns with it).
func (l *Lane) Report(ctx context.Context, node string, data []byte, recorded uint64) error {
	return l.w.keepReport(ctx, node, withRecorded(data, recorded), ownedOfReport(data) != nil, recorded)
}

// LastOwned is what node last reported it owns, as the control side
// keeps it: its entries' targets and the report's stream sequence; ok
// false when none is kept.
func (c *Client) LastOwned(ctx context.Context, node string) (targets []string, recorded uint64, ok bool) {
	oc := c.lastOwned(ctx, node)
	if oc == nil {
		return nil, 0, false
	}
	targets = []string{}
	for _, e := range oc.Entries {
		targets = append(targets, e.Target)
	}
	return targets, oc.Recorded, true
}

// OverlaySetOn is `mesh-control overlay set` on a client already made
// ready (Connect makes the streams as they should be), for a test that
// changes a stream between the two.
func OverlaySetOn(cl *Client, stdout io.Writer, ch OverlayChange) error {
	c := &cli{ctx: context.Background(), cmd: "overlay set", stdout: stdout, stderr: io.Discard, log: slog.New(slog.DiscardHandler)}
	return c.overlaySetOn(cl, ch)
}

// Linking is linking, for the test of what serve says while a fleet links
// again.
func (s *Server) Linking() (linked, of int) { return s.linking() }

// SayRelinking is sayRelinking, said every period.
func (s *Server) SayRelinking(ctx context.Context, log *slog.Logger, every time.Duration) {
	s.sayRelinking(ctx, log, every)
}

// RekeyResend is how often one rekey answer is sent again.
const RekeyResend = rekeyResend

// PublishDeclAgain publishes env, node's declaration of sequence seq, as
// a declare's publish made again does: believing the newest on the
// node's subject is at stream sequence last, where the first attempt,
// whose answer was lost, has put env since.
func (c *Client) PublishDeclAgain(ctx context.Context, node string, seq uint64, env []byte, last uint64) error {
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return err
	}
	return c.publishDecl(ctx, rec, seq, env, &lastOnSubject{stream: last})
}

// RecordAssignment assigns the module in data to node awaiting its answer
// from sequence from, and publishes nothing: the state Assign leaves when
// another process published between its reading the node's next sequence
// and its writing the assignment.
func (c *Client) RecordAssignment(ctx context.Context, node string, data []byte, from uint64) error {
	module, resources, err := ReadModule(data)
	if err != nil {
		return err
	}
	return c.recordAssignment(ctx, node, module, resources, "", from)
}

// OnBatch has f told of each atomic batch a fan-out publishes, before it
// is, with its messages' subjects; nil stops it.
func OnBatch(f func(subjects []string)) {
	if f == nil {
		batchHook = nil
		return
	}
	batchHook = func(msgs []*nats.Msg) {
		subjects := make([]string, len(msgs))
		for i, m := range msgs {
			subjects[i] = m.Subject
		}
		f(subjects)
	}
}

// Unbatched has c declare to many nodes one by one, as to a broker that
// takes no atomic batch.
func (c *Client) Unbatched() { c.batched = false }

// LaneReport is one report a lane records in a group (Lane.Group).
type LaneReport struct {
	Node     string
	Data     []byte
	Recorded uint64
}

// Group records reports as one group of the lane's, their registry writes
// made as one batch where the registry takes batches, and returns each
// report's error.
func (l *Lane) Group(ctx context.Context, reports []LaneReport) []error {
	return l.w.group(ctx, len(reports), func(i int) error {
		r := reports[i]
		return l.w.keepReport(ctx, r.Node, withRecorded(r.Data, r.Recorded), ownedOfReport(r.Data) != nil, r.Recorded)
	})
}

// NodeServiceImports is how many service imports node's account has in
// the embedded broker (the system account's among them), or -1 when it
// has none made.
func (s *Server) NodeServiceImports(node string) int {
	s.auth.accMu.Lock()
	defer s.auth.accMu.Unlock()
	m := s.auth.made[node]
	if m == nil {
		return -1
	}
	return m.acc.NumServiceImports()
}

// PublishFirst is publishFirst, the first composition after an
// enrolment made the node's queue afresh.
func (c *Client) PublishFirst(ctx context.Context, node string) (*Published, error) {
	return c.publishFirst(ctx, node)
}

// PruneRegistryWith is PruneRegistry with between run after the markers
// were read and before they are removed.
func (c *Client) PruneRegistryWith(ctx context.Context, olderThan time.Duration, between func()) error {
	return c.pruneRegistry(ctx, olderThan, between)
}

// DeclareCarried declares to node, as to a node enrolled again, decl (a
// declaration's JSON), with between run after its look at the node's
// subject and before its declare.
func (c *Client) DeclareCarried(ctx context.Context, node string, decl []byte, between func()) {
	var m map[string]json.RawMessage
	json.Unmarshal(decl, &m)
	beforeCarry = func(string) { between() }
	defer func() { beforeCarry = nil }()
	c.declareCarried(ctx, node, &carriedDecl{fields: m})
}

// DeclareWith is Declare with between run after its sequence is taken
// and before its publish.
func (c *Client) DeclareWith(ctx context.Context, node string, decl []byte, between func()) (uint64, error) {
	afterSequence = func(string) { between() }
	defer func() { afterSequence = nil }()
	return c.Declare(ctx, node, decl)
}

// LastDeclared is the declaration last on node's subject, nil for none.
func (c *Client) LastDeclared(ctx context.Context, node string) map[string]json.RawMessage {
	last, _ := c.lastOnSubject(ctx, node)
	return last
}
