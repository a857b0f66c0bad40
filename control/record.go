package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The recorder's concurrency: how many messages of each stream may be
// delivered and not yet acknowledged, and how many workers handle them.
// One node's messages always go to one worker, in the order delivered, so
// what is recorded last for a node is what it sent last; different nodes'
// run side by side. With one in flight, a fan-out to 10,000 nodes is
// recorded one registry round trip after another; with 16, a worker's
// messages waiting at once were too few to be written as a batch
// (recordBatch), and four record a fan-out to 10,000 nodes sooner
// (docs/benchmarks.md) while keeping two cores busy verifying.
const (
	recordInFlight = 1024
	recordWorkers  = 4
)

// Record folds what nodes say into the registry until ctx ends: from each
// report that is not a superseded one, report.<node> (and
// briefing.<node> when it carries one; owned.<node> when it replaces one
// that carried what the node owns, keepReport); from a heartbeat, only a changed
// profile (profile.<node>). The last heartbeat itself is not written
// anywhere: the heartbeat stream keeps it, and Nodes reads it there — a
// registry write per heartbeat was most of an idle fleet's cost. Only what
// is signed by the node's registered NKey, for its current enrolment, is
// taken. It reads through durable consumers, so what arrived while no
// recorder ran is folded in when one starts.
func (c *Client) Record(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keys, err := c.watchKeys(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Reports come from each of their streams (link.ReportPlaces) into
	// one set of lanes: a node's reports always to one lane, whichever
	// stream holds them.
	type read struct{ stream, filter string }
	var reports []read
	for _, p := range link.ReportPlaces() {
		reports = append(reports, read{p.Stream, p.Subjects})
	}
	for _, x := range []struct {
		kind  string
		reads []read
	}{
		{"report", reports},
		{"heartbeat", []read{{link.HeartbeatStream, "mesh.heartbeat.*"}}},
	} {
		lanes := make([]chan jetstream.Msg, recordWorkers)
		for i := range lanes {
			lanes[i] = make(chan jetstream.Msg, recordInFlight/recordWorkers)
			wg.Add(1)
			go func(lane chan jetstream.Msg, kind string) {
				defer wg.Done()
				w := &recorder{c: c, keys: keys, kind: kind, last: map[string]uint64{}, kept: map[string]kept{}}
				var group []jetstream.Msg
				for {
					select {
					case <-ctx.Done():
						return
					case m := <-lane:
						// With what else is waiting in the lane: a group
						// whose registry writes are one batch.
						group = append(group[:0], m)
					more:
						for len(group) < recordBatch {
							select {
							case m := <-lane:
								group = append(group, m)
							default:
								break more
							}
						}
						w.recordGroup(ctx, group)
					}
				}
			}(lanes[i], x.kind)
		}
		for _, r := range x.reads {
			cons, err := c.recorderConsumer(ctx, r.stream, r.filter)
			if err != nil {
				return err
			}
			cc, err := cons.Consume(func(m jetstream.Msg) {
				select {
				case lanes[laneOf(m.Subject())] <- m:
				case <-ctx.Done():
				}
			}, jetstream.PullMaxMessages(recordInFlight/2))
			if err != nil {
				return err
			}
			defer cc.Stop()
		}
	}
	<-ctx.Done()
	return nil
}

// recorderConsumer is the recorder's durable consumer of stream, made or
// brought to the configuration below.
//
// A consumer the server cannot make on disk is made in memory. On the
// heartbeats' stream, kept without an fsync per write, nats-server writes
// its consumers' state without one too, and a power cut left the
// recorder's a file of zeros: the server then refused to load the
// consumer or make it again ("corrupt state file"), for as long as its
// directory is there, and the recorder never read a heartbeat again — no
// rekey answered, no statement sent to a node behind, no profile recorded
// (make chaos, a power cut; the note upstream is in docs/benchmarks.md).
// In memory it has no state to lose; made anew at each start, it hands
// the recorder each node's newest message again, which is recorded as any
// is. Kept on disk otherwise: each start would read every node's newest
// heartbeat and report again.
func (c *Client) recorderConsumer(ctx context.Context, stream, filter string) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       recorderConsumer,
		Description:   "mesh-control serve: the registry's last report, and profiles from heartbeats",
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: recordInFlight,
	}
	// On a cluster the consumer's replicas are placed with the stream's,
	// which may still be catching up (a stream just made or given more
	// replicas answers "insufficient resources" for a while): tried
	// again, not the end of serve.
	var cons jetstream.Consumer
	var err error
	for wait, deadline := 250*time.Millisecond, time.Now().Add(2*time.Minute); ; wait = min(2*wait, 5*time.Second) {
		if cons, err = c.JS.CreateOrUpdateConsumer(ctx, stream, cfg); err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		if !cfg.MemoryStorage && storeUnmade(err) {
			c.log.Warn("the recorder's consumer cannot be kept on disk: kept in memory, and made anew at each start; a power cut may have spoilt its state (the broker's log says so): remove its directory (dir, in the embedded broker's store) while serve is stopped to keep it on disk again",
				"stream", stream, "dir", filepath.Join(c.Keys.Dir, "jetstream", "jetstream", link.AccountControl, "streams", stream, "obs", recorderConsumer), "err", err)
			cfg.MemoryStorage = true
			continue
		}
		c.log.Warn("the recorder's consumer not made yet; trying again", "stream", stream, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("recorder on %s: %w", stream, err)
	}
	return cons, nil
}

// storeUnmade says whether err is the server's refusal to make a
// consumer's store (its state on disk unreadable), which no retry mends.
func storeUnmade(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeConsumerCreate && strings.Contains(api.Description, "store for consumer")
}

// laneOf is the worker of a subject's node: by the node's name, not the
// subject, so that its reports in either of their streams
// (link.NodeReports) go to the one lane that orders them.
func laneOf(subject string) int {
	h := fnv.New32a()
	h.Write([]byte(link.ReportNode(subject)))
	return int(h.Sum32() % recordWorkers)
}

// recorder is one worker: the nodes hashed to it are its alone, so last
// (the stream sequence it last recorded per node) needs no lock.
type recorder struct {
	c    *Client
	keys *keyCache
	kind string
	last map[string]uint64
	kept map[string]kept // by registry key: what this lane wrote there last
	// links is, of a heartbeats' lane, each node's last links (watchLinks).
	links map[string]*links
	// The group being recorded (recordGroup): while holding, putNewest
	// holds its writes for one batch; cur is the message being recorded,
	// groupErrs each message's error.
	holding   bool
	held      []*heldPut
	cur       int
	groupErrs []error
}

// controlKeyField and pinsSeqField are how a heartbeat, as the agent
// encodes it, names the control key its executor holds
// (link.ExecutorStatus.ControlKeyID) and the broker certificates'
// statement it took last (link.Heartbeat.BrokerPinsSeq, absent when none).
var (
	controlKeyField = []byte(`"control_key_id":"`)
	pinsSeqField    = []byte(`"broker_pins_seq":`)
	jwtIssuerField  = []byte(`"jwt_issuer":"`)
)

// heartbeatActs says whether a heartbeat says something the control side
// acts on, and is read: a profile or inventory to keep, a rekey to
// answer, a statement the node has not taken (statementsBehind), a JWT of
// another key than the nodes' account key that issues them now
// (jwtIssuerBehind). Every other heartbeat is the stream's to keep alone:
// looked for in the bytes, a fleet's heartbeats cost no decoding.
func (w *recorder) heartbeatActs(data []byte) bool {
	return bytes.Contains(data, []byte(`"profile"`)) || bytes.Contains(data, []byte(`"inventory"`)) || bytes.Contains(data, []byte(`"rekey"`)) ||
		w.statementsBehind(data) || w.jwtIssuerBehind(data)
}

// jwtIssuerBehind says whether heartbeat data names, as the issuer of the
// JWT the node signs in with, another key than the one that issues the
// nodes' JWTs now (a broker in operator mode, its nodes' account key
// announced): the node is to be sent one of it (renewUserJWT). Not read,
// such a heartbeat was never answered, and the rotation's switch waited
// for ever on a node that links every second.
func (w *recorder) jwtIssuerBehind(data []byte) bool {
	k := w.c.Keys
	if k.Operator == nil {
		return false
	}
	found, is := stringFieldIs(data, jwtIssuerField, k.nodes.issuerPublicFresh)
	return found && !is
}

// stringFieldIs says whether data holds field (`"name":"`), and whether
// the string after it is want (asked for only when found): a heartbeat's
// fields read in the bytes, without decoding it, or a copy.
func stringFieldIs(data, field []byte, want func() string) (found, is bool) {
	i := bytes.Index(data, field)
	if i < 0 {
		return false, false
	}
	rest, w := data[i+len(field):], want()
	return true, len(rest) > len(w) && string(rest[:len(w)]) == w && rest[len(w)] == '"'
}

// statementsBehind says whether heartbeat data names a control key other
// than the one this side signs with, or a broker certificates' statement
// older than its newest: looked for in the bytes, as a heartbeat's other
// fields are, so that the fleet's heartbeats holding both cost no decoding
// (a field in another spelling is decoded, and judged then).
func (w *recorder) statementsBehind(data []byte) bool {
	if found, is := stringFieldIs(data, controlKeyField, w.c.Keys.KeyID); found && !is {
		return true
	}
	seq := w.c.Keys.BrokerPinsSeq()
	if seq == 0 {
		return false
	}
	i := bytes.Index(data, pinsSeqField)
	if i < 0 {
		return true
	}
	rest := data[i+len(pinsSeqField):]
	n := strconv.AppendUint(nil, seq, 10)
	return !bytes.HasPrefix(rest, n) || (len(rest) > len(n) && rest[len(n)] >= '0' && rest[len(n)] <= '9')
}

// countNote is one report for the metrics (fleetMetrics.recorded).
type countNote struct {
	outcome shapes.Outcome
	trigger string
	applyMS int64
}

// record folds m into the registry. An error is a registry write that
// did not happen (a cluster electing a leader, a server lost): the message
// is not acknowledged, so it comes again and nothing a node said is lost.
// What is ignored (unsigned, another node's, superseded) is no error.
// count is the report for the metrics, counted once m is acknowledged
// (settle): a write held for the group's batch may yet fail, and the
// report come again.
func (w *recorder) record(ctx context.Context, m jetstream.Msg) (count *countNote, err error) {
	c := w.c
	kind := w.kind
	subj := m.Subject()
	node := link.ReportNode(subj)
	// A heartbeat without a profile says nothing the registry keeps: it
	// is the stream's to keep. Looked for before any decoding; one that
	// says the node has not taken a statement is read (offerStatements).
	if kind == "heartbeat" {
		w.watchLinks(ctx, m, node)
		if !w.heartbeatActs(m.Data()) {
			return nil, nil
		}
	}
	// Redelivered after a newer one of the same node was recorded (the
	// ack was lost): not recorded over it.
	var recorded uint64 // the report's place in its stream: the order of a node's reports
	if md, err := m.Metadata(); err == nil {
		recorded = md.Sequence.Stream
		if md.Sequence.Stream <= w.last[node] {
			if last := w.last[node]; kind == "report" && recorded < link.ReportPartitionFirstSeq && last >= link.ReportPartitionFirstSeq {
				c.log.Warn("a report through a broker without the partitions' mapping, after the node's were spread over them: taken for older than its last and not recorded; the broker's configuration must keep the mapping (mesh-control broker-config writes it)", "subject", subj, "stream", md.Stream)
			}
			return nil, nil
		}
		defer func() {
			if err == nil {
				w.last[node] = md.Sequence.Stream
			}
		}()
	}
	k, why := w.signedBy(ctx, m, node)
	if why != "" {
		c.log.Warn("a "+kind+" "+why+"; ignored", "subject", subj)
		return nil, nil
	}
	var msg struct {
		Node      string            `json:"node"`
		Enrolment string            `json:"enrolment"`
		Outcome   shapes.Outcome    `json:"outcome"`
		Seq       uint64            `json:"seq"`
		Owned     []wire.OwnedEntry `json:"owned"`
		At        time.Time         `json:"at"`
		Briefing  *shapes.Briefing  `json:"briefing"`
		Trigger   string            `json:"trigger"`
		ApplyMS   int64             `json:"apply_ms"`
		Profile   json.RawMessage   `json:"profile"`
		Inventory json.RawMessage   `json:"inventory"`
		// Capability, on a heartbeat (link.Heartbeat): the agent sends
		// the profile again whenever it is not the one it last said.
		Capability int `json:"capability"`
		// Rekey, on a heartbeat: the executor asks for new keys.
		Rekey       *wire.RekeyRequest `json:"rekey"`
		RekeyBroker string             `json:"rekey_broker"`
		// JWTIssuer, on a heartbeat: who issued the JWT the agent signs
		// in with (renewUserJWT).
		JWTIssuer string `json:"jwt_issuer"`
		// Executor and BrokerPinsSeq, on a heartbeat: the control key its
		// executor holds, the broker certificates' statement it took last
		// (offerStatements).
		Executor *struct {
			ControlKeyID string `json:"control_key_id"`
		} `json:"executor"`
		BrokerPinsSeq uint64 `json:"broker_pins_seq"`
		// Meanwhile, on an activity report: what the executor did.
		Meanwhile []json.RawMessage `json:"meanwhile"`
		// Duplicate: a declaration handed over again, applied before.
		Duplicate bool `json:"duplicate"`
		// Retired: its agent says the declaration retired the node.
		Retired bool `json:"retired"`
	}
	if err := json.Unmarshal(m.Data(), &msg); err != nil || msg.Node != node || msg.Enrolment != k.enrolment {
		c.log.Warn("a "+kind+" for another node or enrolment; ignored", "subject", subj)
		return nil, nil
	}
	if kind == "heartbeat" {
		// It carries the profile and inventory (they changed): kept
		// apart, as at enrolment.
		if msg.Rekey != nil {
			if err := c.answerRekey(ctx, node, msg.Enrolment, msg.Rekey, msg.RekeyBroker); err != nil {
				return nil, err
			}
		}
		if msg.JWTIssuer != "" {
			c.renewUserJWT(ctx, node, msg.Enrolment, msg.JWTIssuer)
		}
		h := &holds{pins: msg.BrokerPinsSeq}
		if msg.Executor != nil {
			h.key = msg.Executor.ControlKeyID
		}
		c.offerStatements(ctx, node, msg.Enrolment, h, stRotations|stPins)
		if msg.Profile == nil && msg.Inventory == nil {
			return nil, nil
		}
		if err := c.keepProfile(ctx, node, msg.Profile, msg.Inventory); err != nil {
			return nil, err
		}
		return nil, c.noteCapability(ctx, node, msg.Enrolment, msg.Capability)
	}
	if msg.Outcome == shapes.Superseded {
		return &countNote{msg.Outcome, msg.Trigger, 0}, nil
	}
	if msg.Trigger == link.TriggerPlan {
		// What a declaration would do: the stream keeps it for the one
		// who asked (WaitPlan); the node's last report stays its last
		// apply's.
		return nil, nil
	}
	if msg.Trigger == link.TriggerActivity {
		// What the node's executor did on its own (a drift repaired: a
		// hand edit of what the mesh declared, put back): the stream
		// keeps it for `reports`, the node's last report stays its last
		// apply's, and the log says it where an operator's alerts look.
		c.log.Warn("a node's executor changed the machine with no declaration asking (a drift repaired, a reboot's reconcile, a rescue file)",
			"node", node, "outcome", msg.Outcome, "applies", len(msg.Meanwhile), "see", "mesh-control reports "+node)
		return &countNote{msg.Outcome, msg.Trigger, 0}, nil
	}
	if err := w.keepReport(ctx, node, withRecorded(m.Data(), recorded), msg.Owned != nil, recorded); err != nil {
		return nil, err
	}
	// A retirement, as its agent says it (Retired: said again of a
	// retirement whose first report was lost, as applied already or as
	// refused by an executor hosted by it), or, from an agent of a release
	// before the word, as a retirement that kept nothing leaves it (an
	// empty owned list): held either way to the declaration the control
	// side signed (noteRetired). Reports of nodes holding something, the
	// fleet's, cost no read.
	applied := msg.Trigger == link.TriggerDeclaration && !msg.Duplicate && msg.Outcome != shapes.Failed && msg.Outcome != shapes.Refused
	if msg.Trigger == link.TriggerDeclaration && msg.Retired || applied && msg.Owned != nil && len(msg.Owned) == 0 {
		c.noteRetired(ctx, node, msg.Enrolment, msg.Seq)
	}
	count = &countNote{msg.Outcome, msg.Trigger, msg.ApplyMS}
	// A briefing is kept apart: later reports without one do not erase
	// what adoption found, and a failed line holds the node's assignments.
	if msg.Briefing != nil {
		if data, err := json.Marshal(msg.Briefing); err == nil {
			if err := w.putNewest(ctx, "briefing."+node, withRecorded(data, recorded), recorded); err != nil {
				return nil, fmt.Errorf("registry: the briefing of %s: %w", node, err)
			}
		}
	}
	return count, nil
}

// keepReport keeps data, node's report of stream sequence recorded, as
// report.<node> unless a newer one is there. What the node owns is kept
// in the last report that carries it (an apply's: carriesOwned): that is
// the copy handed back, signed, if the node is enrolled again after
// losing its store (lastOwned), and an apply's report costs one synced
// write, not two (a fan-out writes five a node without it,
// docs/benchmarks.md). A report that carries none (a refusal's) must not
// take the copy away: before it replaces one that carries it, that one's
// entries are kept apart (owned.<node>), and the replacement is made on
// the revision read — a newer apply written meanwhile is read again, not
// written over.
func (w *recorder) keepReport(ctx context.Context, node string, data []byte, carriesOwned bool, recorded uint64) error {
	key := "report." + node
	if carriesOwned {
		if err := w.putNewest(ctx, key, data, recorded); err != nil {
			return fmt.Errorf("registry: the report of %s: %w", node, err)
		}
		return nil
	}
	// What it reads below is what the writes held so far leave, and its
	// own writes are made in their order — what the node owns kept apart
	// before the report that drops it — not held for the group's batch.
	w.flush(ctx)
	if w.holding {
		w.holding = false
		defer func() { w.holding = true }()
	}
	err := retryRegistry(ctx, putRetryFor, func() error {
		e, err := w.c.KV.Get(ctx, key)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			rev = e.Revision()
			if last := recordedOf(e.Value()); recorded <= last {
				w.kept[key] = kept{rev: rev, recorded: last}
				return nil // a newer one is there (this an older, or a redelivery)
			}
			if oc := ownedOfReport(e.Value()); oc != nil {
				b, _ := json.Marshal(oc)
				if err := w.putNewest(ctx, "owned."+node, b, oc.Recorded); err != nil {
					return fmt.Errorf("what %s owns: %w", node, err)
				}
			}
		}
		if rev == 0 {
			rev, err = w.c.KV.Create(ctx, key, data)
		} else {
			rev, err = w.c.KV.Update(ctx, key, data, rev)
		}
		if err != nil {
			return err
		}
		w.kept[key] = kept{rev: rev, recorded: recorded}
		return nil
	}, func(err error) bool { return errors.Is(err, jetstream.ErrKeyExists) }, nil)
	if err != nil {
		return fmt.Errorf("registry: the report of %s: %w", node, err)
	}
	return nil
}

// ownedOfReport is what a kept report (report.<node>) says its node owns,
// as the copy handed back; nil when it says nothing of it (a refusal's).
func ownedOfReport(b []byte) *ownedCopy {
	var r struct {
		Enrolment string            `json:"enrolment"`
		Seq       uint64            `json:"seq"`
		At        time.Time         `json:"at"`
		Owned     []wire.OwnedEntry `json:"owned"`
		Recorded  uint64            `json:"recorded_seq"`
	}
	if json.Unmarshal(b, &r) != nil || r.Owned == nil {
		return nil
	}
	return &ownedCopy{Enrolment: r.Enrolment, Seq: r.Seq, Reported: r.At, Entries: r.Owned, Recorded: r.Recorded}
}

// lastOwned is what node last reported it owns, as the control side keeps
// it: from its last report when that carries it, else the copy kept apart
// when a report without it came (keepReport) — whichever is newer. nil
// when it never reported any, or the registry did not answer.
func (c *Client) lastOwned(ctx context.Context, node string) *ownedCopy {
	var kept ownedCopy
	haveKept := c.getJSON(ctx, "owned."+node, &kept)
	var fromReport *ownedCopy
	if e, err := c.KV.Get(ctx, "report."+node); err == nil {
		fromReport = ownedOfReport(e.Value())
	}
	switch {
	case fromReport != nil && (!haveKept || fromReport.Recorded >= kept.Recorded):
		return fromReport
	case haveKept:
		return &kept
	}
	return nil
}

// kept is a value in the registry as this recorder knows it: its
// revision (0: no value) and the recorded sequence it carries.
type kept struct{ rev, recorded uint64 }

// withRecorded adds "recorded_seq": the report's sequence in its stream
// (the broker's: a node's reports are in the order the node sent them, and
// no clock of the node's or sequence of the control side's orders them
// as surely — a refusal names whatever sequence it was sent) to a JSON
// object the recorder keeps. Spliced in, not decoded and encoded: the
// node's report is kept as it sent it.
func withRecorded(obj []byte, recorded uint64) []byte {
	t := bytes.TrimRight(obj, " \t\r\n")
	if len(t) < 2 || t[len(t)-1] != '}' || recorded == 0 {
		return obj
	}
	sep := ","
	if len(bytes.TrimSpace(t[:len(t)-1])) == 1 { // "{": an empty object
		sep = ""
	}
	out := append(bytes.Clone(t[:len(t)-1]), sep+`"recorded_seq":`...)
	out = strconv.AppendUint(out, recorded, 10)
	return append(out, '}')
}

// recordedOf reads "recorded_seq" from a value the recorder kept (0 in
// one kept before it wrote it: older than any it writes now).
func recordedOf(b []byte) uint64 {
	var v struct {
		Recorded uint64 `json:"recorded_seq"`
	}
	json.Unmarshal(b, &v)
	return v.Recorded
}

// putNewest writes data, the report of stream sequence recorded (or what
// the recorder keeps of it), to key unless the registry holds a newer one.
// Two serve processes record one node's reports, whichever takes each; a
// plain Put would let the slower write an older report over a newer one,
// and the registry would claim less than happened. The write is an Update
// on the revision this lane wrote last — no read in the steady state,
// where one lane records a node's reports in a row (the fan-out's cost,
// docs/benchmarks.md); a key this lane has not written is first created;
// only when that fails, or the revision is not the key's (the other
// process wrote since), is the value read and compared first. A transient registry error is tried
// again for up to putRetryFor.
func (w *recorder) putNewest(ctx context.Context, key string, data []byte, recorded uint64) error {
	if w.holding {
		return w.hold(key, data, recorded)
	}
	last, known := w.kept[key]
	if !known {
		// Not written by this lane yet: first guessed absent (a Create, one
		// round trip, where a read and a write would be two: the first
		// report of each node of a new fleet), read if it is not.
		last, known = kept{}, true
	}
	return retryRegistry(ctx, putRetryFor, func() error {
		if !known {
			e, err := w.c.KV.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				last = kept{}
			case err != nil:
				return err
			default:
				last = kept{rev: e.Revision(), recorded: recordedOf(e.Value())}
			}
			known = true
		}
		if last.rev != 0 && recorded <= last.recorded {
			return nil // a newer one is there (this an older, or a redelivery)
		}
		var rev uint64
		var err error
		if last.rev == 0 {
			rev, err = w.c.KV.Create(ctx, key, data)
		} else {
			rev, err = w.c.KV.Update(ctx, key, data, last.rev)
		}
		if err != nil {
			known = false // written by another since, or not answered: read it again
			return err
		}
		w.kept[key] = kept{rev: rev, recorded: recorded}
		return nil
	}, func(err error) bool { return errors.Is(err, jetstream.ErrKeyExists) }, nil)
}

// putRetryFor is how long the recorder tries a registry write again
// before it gives the message back: on a cluster that lost a server, the
// registry answers again once its stream has a new leader (seconds), and
// a write tried again then is surer than a redelivery, which needs the
// consumer's own failover to have kept what was delivered.
const putRetryFor = 20 * time.Second

// putRetrying is KV.Put, tried again for up to putRetryFor.
func (c *Client) putRetrying(ctx context.Context, key string, data []byte) (rev uint64, err error) {
	err = retryRegistry(ctx, putRetryFor, func() error {
		rev, err = c.KV.Put(ctx, key, data)
		return err
	}, nil, nil)
	return rev, err
}

// retryRegistry calls try until it succeeds, ctx ends or within passes:
// an error atOnce says is tried again at once (a compare-and-set lost to
// another writer), one final says is returned as it is, any other is tried
// again after a wait that grows (the registry did not answer). nil for
// either is no error.
func retryRegistry(ctx context.Context, within time.Duration, try func() error, atOnce, final func(error) bool) error {
	deadline := time.Now().Add(within)
	for wait := 200 * time.Millisecond; ; {
		err := try()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || (final != nil && final(err)) {
			return err
		}
		if atOnce != nil && atOnce(err) {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// nodeKeys is what the recorder checks a message against: the node's
// registered NKey and current enrolment.
type nodeKeys struct{ nkey, enrolment string }

// signedBy is the registry's keys of node, when m carries the signature
// of its NKey; otherwise why not ("for a node not in the registry", "not
// signed by the node: …"). What m says of its node and enrolment is the
// caller's to check against them. One rule for every message a node
// publishes that the recorder reads.
func (w *recorder) signedBy(ctx context.Context, m jetstream.Msg, node string) (nodeKeys, string) {
	k, ok := w.keys.get(ctx, node)
	if !ok {
		return k, "for a node not in the registry"
	}
	if err := link.VerifySignature(k.nkey, m.Data(), m.Headers().Get(link.SignatureHeader)); err != nil {
		return k, "not signed by the node: " + err.Error()
	}
	return k, ""
}

// keyCache is the registry's node records as the recorder needs them,
// kept by a watch of node.* rather than read per message. A node not in it
// yet (added a moment ago, the watch behind) is read from the registry.
type keyCache struct {
	c  *Client
	mu sync.RWMutex
	m  map[string]nodeKeys
}

// watchKeys starts the cache and returns once it holds the registry as it
// is now.
func (c *Client) watchKeys(ctx context.Context) (*keyCache, error) {
	kc := &keyCache{c: c, m: map[string]nodeKeys{}}
	w, err := c.KV.Watch(ctx, "node.*")
	if err != nil {
		return nil, fmt.Errorf("recorder: watching the registry: %w", err)
	}
	ready := make(chan struct{})
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if initial {
						initial = false
						close(ready)
					}
					continue
				}
				name := strings.TrimPrefix(e.Key(), "node.")
				var r NodeRecord
				kc.mu.Lock()
				if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &r) != nil {
					delete(kc.m, name)
				} else {
					kc.m[name] = nodeKeys{r.NKey, r.Enrolment}
				}
				kc.mu.Unlock()
			}
		}
	}()
	select {
	case <-ready:
		return kc, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (kc *keyCache) get(ctx context.Context, node string) (nodeKeys, bool) {
	kc.mu.RLock()
	k, ok := kc.m[node]
	kc.mu.RUnlock()
	if ok {
		return k, true
	}
	r, _, err := kc.c.Node(ctx, node)
	if err != nil {
		return nodeKeys{}, false
	}
	return nodeKeys{r.NKey, r.Enrolment}, true
}

// heardBeat is a heartbeat with when the broker received it: the control
// side's clock, not the node's (heardAt).
type heardBeat struct {
	*link.Heartbeat
	Received time.Time
}

// lastHeartbeats reads the last heartbeat of every node in recs from the
// heartbeat stream (one pass, the last message per subject), each only if
// signed by the node's registered NKey.
func (c *Client) lastHeartbeats(ctx context.Context, recs []*NodeRecord) (map[string]*heardBeat, error) {
	out := map[string]*heardBeat{}
	str, err := c.JS.Stream(ctx, link.HeartbeatStream)
	if err != nil {
		return nil, err
	}
	if info := str.CachedInfo(); info == nil || info.State.Msgs == 0 {
		return out, nil
	}
	byName := make(map[string]*NodeRecord, len(recs))
	for _, r := range recs {
		byName[r.Name] = r
	}
	err = c.readStream(ctx, link.HeartbeatStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"mesh.heartbeat.*"}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	}, func(m jetstream.Msg) bool {
		subj := m.Subject()
		name := subj[strings.LastIndexByte(subj, '.')+1:]
		var hb link.Heartbeat
		md, err := m.Metadata()
		if r := byName[name]; r != nil && link.VerifySignature(heartbeatKey(r), m.Data(), m.Headers().Get(link.SignatureHeader)) == nil &&
			json.Unmarshal(m.Data(), &hb) == nil && hb.Node == name {
			h := &heardBeat{Heartbeat: &hb}
			if err == nil {
				h.Received = md.Timestamp
			}
			out[name] = h
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("the heartbeats: %w", err)
	}
	return out, nil
}

// heartbeatKey is the NKey r's last heartbeat is read under: the live
// enrolment's, or, revoked, the one it had (Past), so that when it was
// last heard stays what it was rather than fall back to its last report.
func heartbeatKey(r *NodeRecord) string {
	if r.NKey != "" {
		return r.NKey
	}
	return reportKeys(r)[r.Enrolment]
}

// noteCapability keeps in node's record the link capability its agent said
// (link.Heartbeat), when it is not the one kept and the record is still of
// that enrolment: the version skew policy is checked against it at each
// declaration (link.CheckNode).
func (c *Client) noteCapability(ctx context.Context, node, enrolment string, capability int) error {
	for attempt := 0; attempt < 100; attempt++ {
		e, err := c.KV.Get(ctx, nodeKey(node))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // gone: nothing to note
		} else if err != nil {
			return fmt.Errorf("registry: the capability of %s: %w", node, err) // the heartbeat comes again
		}
		var rec NodeRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Enrolment != enrolment || rec.Capability == capability {
			return nil // enrolled again since, or nothing new
		}
		rev := e.Revision()
		rec.Capability = capability
		data, _ := json.Marshal(&rec)
		if _, err = c.KV.Update(ctx, nodeKey(node), data, rev); err == nil {
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("registry: the capability of %s: %w", node, err)
		}
	}
	return fmt.Errorf("registry: the capability of %s: the record kept changing", node)
}
