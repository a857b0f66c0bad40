package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// NodeStatus is one line of `mesh-control nodes`.
type NodeStatus struct {
	Name      string `json:"name"`
	Enrolment string `json:"enrolment"`
	NKey      string `json:"nkey"`
	// State: "revoked" (StateRevoked), "never heard from", "silent" (no
	// heartbeat for three periods), or the agent's own state from its
	// last heartbeat.
	State string `json:"state"`
	// Revoked is when the node's identity was revoked (zero: it is not).
	Revoked         time.Time `json:"revoked,omitzero"`
	LastHeard       time.Time `json:"last_heard,omitzero"`
	ExecutorVersion string    `json:"executor_version,omitempty"`
	ExecutorBuild   string    `json:"executor_build,omitempty"`
	ExecutorError   string    `json:"executor_error,omitempty"`
	// ExecutorHalted is the launcher's reason, as the agent relays it,
	// for starting no executor on the node.
	ExecutorHalted string         `json:"executor_halted,omitempty"`
	Declared       uint64         `json:"declared"` // the newest sequence declared
	Applied        uint64         `json:"applied"`  // the last the node applied
	LastSeq        uint64         `json:"last_seq,omitempty"`
	LastOutcome    shapes.Outcome `json:"last_outcome,omitempty"`
	LastRefused    string         `json:"last_refused,omitempty"`
	LastLinkError  string         `json:"last_link_error,omitempty"`
	LastReport     *link.Report   `json:"last_report,omitempty"`
	// Briefing is what adoption found, as the node last reported it.
	Briefing  *shapes.Briefing `json:"briefing,omitempty"`
	Heartbeat *link.Heartbeat
	// Address is the node's overlay address; Assignments its assigned
	// modules, or why it is assigned nothing (AssignmentState).
	Address     string `json:"overlay_address,omitempty"`
	Assignments string `json:"assignments,omitempty"`
}

// The registry's states beyond the agent's own.
const (
	StateNeverHeard = "never heard from"
	StateSilent     = "silent"
	// StateEpisodic: an episodic node (an app) between its runs.
	StateEpisodic = "episodic"
)

func (c *Client) getJSON(ctx context.Context, key string, v any) bool {
	e, err := c.KV.Get(ctx, key)
	if err != nil {
		return false
	}
	return json.Unmarshal(e.Value(), v) == nil
}

// Nodes is the registry with what each node last said.
func (c *Client) Nodes(ctx context.Context) ([]*NodeStatus, error) {
	recs, err := c.records(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []*NodeStatus
	for _, r := range recs {
		s := &NodeStatus{Name: r.Name, Enrolment: r.Enrolment, NKey: r.NKey, Declared: r.NextSeq - 1, State: StateNeverHeard}
		var rep link.Report
		if c.getJSON(ctx, "report."+r.Name, &rep) {
			s.LastReport = &rep
			s.LastSeq, s.LastOutcome, s.LastRefused, s.LastHeard = rep.Seq, rep.Outcome, rep.Refused, rep.At
			if rep.Outcome != shapes.Refused && rep.Outcome != shapes.Superseded && rep.Seq > s.Applied {
				s.Applied = rep.Seq
			}
		}
		s.Briefing = c.Briefing(ctx, r.Name)
		s.Address, s.Assignments = c.AssignmentState(ctx, r)
		var hb link.Heartbeat
		if c.getJSON(ctx, "heartbeat."+r.Name, &hb) {
			s.Heartbeat = &hb
			if hb.At.After(s.LastHeard) {
				s.LastHeard = hb.At
			}
			if hb.LastApplied > s.Applied {
				s.Applied = hb.LastApplied
			}
			if hb.Executor != nil {
				s.ExecutorVersion, s.ExecutorBuild = hb.Executor.Version, hb.Executor.Build
				if hb.Executor.Seq > s.Applied {
					s.Applied = hb.Executor.Seq
				}
			}
			s.ExecutorError, s.LastLinkError = hb.ExecutorError, hb.LastLinkError
			s.ExecutorHalted = hb.ExecutorHalted
			s.State = hb.State
			if now.Sub(hb.At) > 3*time.Duration(hb.Interval*float64(time.Second))+5*time.Second {
				s.State = StateSilent
				if hb.Presence == link.PresenceEpisodic {
					// An app linked only while it runs: its silence is
					// the ordinary case, said as a fact, not an alarm.
					s.State = StateEpisodic
				}
			}
		} else if s.LastReport != nil {
			s.State = StateSilent
		}
		if r.IsRevoked() {
			// Whatever it last said, it says nothing more as this
			// enrolment: the broker refuses it.
			s.State, s.Revoked = StateRevoked, r.Revoked
		}
		out = append(out, s)
	}
	return out, nil
}

// SignedReport is a report as read back, with whether it carried the
// node's signature.
type SignedReport struct {
	link.Report
	StreamSeq uint64 `json:"report_stream_seq"`
}

// Reports returns up to last of node's newest reports, oldest first. Only
// reports signed by the node's registered NKey are returned; skipped is how
// many others were on its subject.
func (c *Client) Reports(ctx context.Context, node string, last int) (reports []*SignedReport, skipped int, err error) {
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return nil, 0, err
	}
	subj := link.SubjectsOf(node).Report
	stream, err := c.JS.Stream(ctx, link.ReportStream)
	if err != nil {
		return nil, 0, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return nil, 0, err
	}
	if info.State.Subjects[subj] == 0 {
		return nil, 0, nil
	}
	cons, err := c.JS.OrderedConsumer(ctx, link.ReportStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return nil, 0, err
	}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return nil, 0, fmt.Errorf("reading %s: %w", subj, err)
		}
		md, _ := m.Metadata()
		var r link.Report
		if link.VerifySignature(rec.NKey, m.Data(), m.Headers().Get(link.SignatureHeader)) != nil ||
			json.Unmarshal(m.Data(), &r) != nil || r.Node != node || r.Enrolment != rec.Enrolment {
			skipped++
		} else {
			reports = append(reports, &SignedReport{Report: r, StreamSeq: md.Sequence.Stream})
			if last > 0 && len(reports) > last {
				reports = reports[1:]
			}
		}
		if md == nil || md.NumPending == 0 {
			return reports, skipped, nil
		}
	}
}

// Record folds what nodes say into the registry until ctx ends: the last
// report that is not a superseded one (report.<node>) and the last heartbeat
// (heartbeat.<node>), each only if signed by the node's registered NKey and
// for its current enrolment. It reads through durable consumers, so what
// arrived while no recorder ran is folded in when one starts.
func (c *Client) Record(ctx context.Context) error {
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for _, x := range []struct{ stream, filter, kind string }{
		{link.ReportStream, "mesh.report.*", "report"},
		{link.HeartbeatStream, "mesh.heartbeat.*", "heartbeat"},
	} {
		cons, err := c.JS.CreateOrUpdateConsumer(ctx, x.stream, jetstream.ConsumerConfig{
			Durable:       "control-recorder",
			Description:   "mesh-control serve: the registry's last report and heartbeat",
			FilterSubject: x.filter,
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			MaxAckPending: 1, // in order: the last one stored is the last one sent
		})
		if err != nil {
			return fmt.Errorf("recorder on %s: %w", x.stream, err)
		}
		kind := x.kind
		cc, err := cons.Consume(func(m jetstream.Msg) {
			c.record(ctx, kind, m)
			m.Ack()
		})
		if err != nil {
			return err
		}
		ccs = append(ccs, cc)
	}
	<-ctx.Done()
	return nil
}

func (c *Client) record(ctx context.Context, kind string, m jetstream.Msg) {
	subj := m.Subject()
	node := subj[strings.LastIndexByte(subj, '.')+1:]
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		c.log.Warn("a "+kind+" for a node not in the registry; ignored", "subject", subj)
		return
	}
	if err := link.VerifySignature(rec.NKey, m.Data(), m.Headers().Get(link.SignatureHeader)); err != nil {
		c.log.Warn("a "+kind+" not signed by the node; ignored", "subject", subj, "reason", err.Error())
		return
	}
	var head struct {
		Node      string         `json:"node"`
		Enrolment string         `json:"enrolment"`
		Outcome   shapes.Outcome `json:"outcome"`
	}
	if err := json.Unmarshal(m.Data(), &head); err != nil || head.Node != node || head.Enrolment != rec.Enrolment {
		c.log.Warn("a "+kind+" for another node or enrolment; ignored", "subject", subj)
		return
	}
	if kind == "report" && head.Outcome == shapes.Superseded {
		return
	}
	// A heartbeat that carries the profile and inventory (they changed):
	// kept apart, as at enrolment.
	var prof struct {
		Profile   json.RawMessage `json:"profile"`
		Inventory json.RawMessage `json:"inventory"`
	}
	if kind == "heartbeat" && json.Unmarshal(m.Data(), &prof) == nil && (len(prof.Profile) > 0 || len(prof.Inventory) > 0) {
		c.keepProfile(ctx, node, prof.Profile, prof.Inventory)
	}
	if _, err := c.KV.Put(ctx, kind+"."+node, m.Data()); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error("registry: "+err.Error(), "node", node)
	}
	// What the node owns is kept apart too, from every report that
	// carries it (an apply's; not a refusal's): the copy handed back,
	// signed, if the node is enrolled again after losing its store.
	var own struct {
		Seq   uint64            `json:"seq"`
		Owned []wire.OwnedEntry `json:"owned"`
		At    time.Time         `json:"at"`
	}
	if kind == "report" && json.Unmarshal(m.Data(), &own) == nil && own.Owned != nil {
		data, _ := json.Marshal(&ownedCopy{Enrolment: head.Enrolment, Seq: own.Seq, Reported: own.At, Entries: own.Owned})
		if _, err := c.KV.Put(ctx, "owned."+node, data); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("registry: "+err.Error(), "node", node)
		}
	}
	// A briefing is kept apart: later reports without one do not erase
	// what adoption found, and a failed line holds the node's assignments.
	var b struct {
		Briefing *shapes.Briefing `json:"briefing"`
	}
	if kind == "report" && json.Unmarshal(m.Data(), &b) == nil && b.Briefing != nil {
		if data, err := json.Marshal(b.Briefing); err == nil {
			if _, err := c.KV.Put(ctx, "briefing."+node, data); err != nil && !errors.Is(err, context.Canceled) {
				c.log.Error("registry: "+err.Error(), "node", node)
			}
		}
	}
}

// ownedCopy is the control side's copy of what a node last reported it
// owns (KV owned.<node>): a backup, never a source.
type ownedCopy struct {
	Enrolment string            `json:"enrolment"`
	Seq       uint64            `json:"seq"`
	Reported  time.Time         `json:"reported"`
	Entries   []wire.OwnedEntry `json:"entries"`
}

// Briefing returns the last briefing a node reported, or nil.
func (c *Client) Briefing(ctx context.Context, node string) *shapes.Briefing {
	var b shapes.Briefing
	if !c.getJSON(ctx, "briefing."+node, &b) {
		return nil
	}
	return &b
}
