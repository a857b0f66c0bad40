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
	// State: "revoked" (StateRevoked), "never heard from", or the
	// agent's own state from its last heartbeat. The control side keeps
	// no "silent" threshold of its own: how long ago the node was last
	// heard (LastHeard) is the fact, and a node that was disconnected says
	// so itself when its link returns.
	State string `json:"state"`
	// Presence is the node's own word on how it links: "resident"
	// (whenever its machine is up) or "episodic" (an app, linked only
	// while it runs, whose silence is the ordinary case).
	Presence string `json:"presence,omitempty"`
	// Revoked is when the node's identity was revoked (zero: it is not).
	Revoked time.Time `json:"revoked,omitzero"`
	// LastHeard is when the broker received the node's last heartbeat or
	// report: the control side's clock, never the node's own, so a node
	// whose clock is a year fast does not look alive once it is stopped,
	// nor one a year slow dead while it heartbeats.
	LastHeard time.Time `json:"last_heard,omitzero"`
	// ClockSkewMS is how far the node's clock was ahead of the broker's
	// (negative: behind) at its last heartbeat, in milliseconds; set only
	// past ClockSkewShown. The node's own times (a report's, the
	// executor's) are read with it in mind.
	ClockSkewMS int64 `json:"clock_skew_ms,omitempty"`
	// Capability is the link capability the node's agent last said (0: a
	// release before it); OutsideSkew, when set, is why this control side
	// declares nothing to it (link.CheckNode), and what to upgrade.
	Capability  int    `json:"capability"`
	OutsideSkew string `json:"outside_skew,omitempty"`
	// ControlKeyID is the control key the node's executor holds in force,
	// as its last heartbeat said; RotationPending, that it is not the key
	// this control side signs with (a rotation not taken yet).
	ControlKeyID    string `json:"control_key_id,omitempty"`
	RotationPending bool   `json:"rotation_pending,omitempty"`
	// RotationOutOfReach: no rotation kept for the node retires the key it
	// holds (away through more than the registry keeps): it cannot take
	// one, and is to be enrolled again.
	RotationOutOfReach bool `json:"rotation_out_of_reach,omitempty"`
	// NothingDeclaredSince, when set, is the newest sequence declared to
	// the node, which went to its enrolment before the current one; none
	// has been declared since, so its executor holds nothing the link
	// declared (a re-enrolment whose last declaration was not carried
	// over: sealed to the replaced keys).
	NothingDeclaredSince uint64 `json:"nothing_declared_since,omitempty"`
	ExecutorVersion      string `json:"executor_version,omitempty"`
	ExecutorBuild        string `json:"executor_build,omitempty"`
	ExecutorError        string `json:"executor_error,omitempty"`
	// ExecutorHalted is the launcher's reason, as the agent relays it,
	// for starting no executor on the node.
	ExecutorHalted string `json:"executor_halted,omitempty"`
	// RolledBackFrom is the host release the node's launcher rolled back
	// from, and RollbackReason why, as the node last said.
	RolledBackFrom string         `json:"rolled_back_from,omitempty"`
	RollbackReason string         `json:"rollback_reason,omitempty"`
	Declared       uint64         `json:"declared"` // the newest sequence declared
	Applied        uint64         `json:"applied"`  // the last the node applied
	LastSeq        uint64         `json:"last_seq,omitempty"`
	LastOutcome    shapes.Outcome `json:"last_outcome,omitempty"`
	LastRefused    string         `json:"last_refused,omitempty"`
	LastLinkError  string         `json:"last_link_error,omitempty"`
	LastReport     *link.Report   `json:"last_report,omitempty"`
	// Briefing is what adoption found, as the node last reported it.
	Briefing  *shapes.Briefing `json:"briefing,omitempty"`
	Heartbeat *link.Heartbeat  `json:"heartbeat,omitempty"`
	// Address is the node's overlay address; Assignments its assigned
	// modules, or why it is assigned nothing (AssignmentState).
	Address     string `json:"overlay_address,omitempty"`
	Assignments string `json:"assignments,omitempty"`
	// TwoAgents is set while two agents are linked as the node (serve
	// found their heartbeats alternating within TwoAgentsShownFor).
	TwoAgents *TwoAgents `json:"two_agents,omitempty"`
}

// ClockSkewShown is the difference between a node's clock and the
// broker's from which it is shown beside the node: past what a heartbeat's
// time in flight and an ordinary NTP drift add up to.
const ClockSkewShown = time.Minute

// clockSkew is how far a node's own time (said) was ahead of the broker's
// receipt of it, when that is past ClockSkewShown; 0 otherwise.
func clockSkew(said, received time.Time) time.Duration {
	if said.IsZero() || received.IsZero() {
		return 0
	}
	d := said.Sub(received)
	if d.Abs() < ClockSkewShown {
		return 0
	}
	return d.Round(time.Second)
}

// SkewText says a node's clock skew for a person ("" when none is shown).
func SkewText(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case ms > 0:
		return fmt.Sprintf("its clock is %s ahead of the control side's", d.Round(time.Second))
	case ms < 0:
		return fmt.Sprintf("its clock is %s behind the control side's", (-d).Round(time.Second))
	}
	return ""
}

// executorsAway says, of nodes, those whose agent said at its last
// heartbeat that it cannot reach its executor (or the launcher halted
// it): a wait for their reports ends without one, and this is why. ""
// when none did, or the heartbeats cannot be read.
func (c *Client) executorsAway(ctx context.Context, nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var recs []*NodeRecord
	for _, n := range nodes {
		if r, _, err := c.Node(ctx, n); err == nil {
			recs = append(recs, r)
		}
	}
	hbs, err := c.lastHeartbeats(ctx, recs)
	if err != nil {
		return ""
	}
	var said []string
	for _, r := range recs {
		h := hbs[r.Name]
		switch {
		case h == nil || h.Enrolment != r.Enrolment:
		case h.ExecutorHalted != "":
			said = append(said, fmt.Sprintf("%s's executor is halted (%s)", r.Name, h.ExecutorHalted))
		case h.ExecutorError != "":
			said = append(said, fmt.Sprintf("%s's agent cannot reach its executor (%s)", r.Name, h.ExecutorError))
		}
	}
	if len(said) == 0 {
		return ""
	}
	return strings.Join(said, "; ") + ", at its last heartbeat: mesh-executor doctor there says why"
}

// StateNeverHeard is the registry's state of a node that has said
// nothing yet (beyond the agent's own states and StateRevoked).
const StateNeverHeard = "never heard from"

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
	hbs, err := c.lastHeartbeats(ctx, recs)
	if err != nil {
		return nil, err
	}
	twos := c.twoAgents(ctx)
	var out []*NodeStatus
	for _, r := range recs {
		s := &NodeStatus{Name: r.Name, Enrolment: r.Enrolment, NKey: r.NKey, Declared: r.NextSeq - 1, State: StateNeverHeard}
		s.Capability = r.Capability
		if r.EnrolledSeq > 0 && r.NextSeq-1 == r.EnrolledSeq && !r.IsRevoked() {
			s.NothingDeclaredSince = r.EnrolledSeq
		}
		if err := link.CheckNode(r.Name, r.Capability); err != nil && !r.IsRevoked() {
			s.OutsideSkew = err.Error()
		}
		var rep link.Report
		if c.getJSON(ctx, "report."+r.Name, &rep) {
			s.LastReport = &rep
			s.LastSeq, s.LastOutcome, s.LastRefused = rep.Seq, rep.Outcome, rep.Refused
			if e, err := c.KV.Get(ctx, "report."+r.Name); err == nil {
				s.LastHeard = e.Created() // recorded on the control side's clock
			}
			if rep.Outcome != shapes.Refused && rep.Outcome != shapes.Superseded && rep.Seq > s.Applied {
				s.Applied = rep.Seq
			}
		}
		s.Briefing = c.Briefing(ctx, r.Name)
		s.Address, s.Assignments = c.AssignmentState(ctx, r)
		if t := twos[r.Name]; t != nil && t.Enrolment == r.Enrolment && !r.IsRevoked() {
			s.TwoAgents = t
		}
		if h := hbs[r.Name]; h != nil && h.Enrolment == r.Enrolment {
			hb := h.Heartbeat
			s.Heartbeat = hb
			if h.Received.After(s.LastHeard) {
				s.LastHeard = h.Received
			}
			if skew := clockSkew(hb.At, h.Received); skew != 0 {
				s.ClockSkewMS = skew.Milliseconds()
			}
			if hb.LastApplied > s.Applied {
				s.Applied = hb.LastApplied
			}
			if hb.Executor != nil {
				s.ExecutorVersion, s.ExecutorBuild = hb.Executor.Version, hb.Executor.Build
				s.RolledBackFrom, s.RollbackReason = hb.Executor.RolledBackFrom, hb.Executor.RollbackReason
				if s.ControlKeyID = hb.Executor.ControlKeyID; s.ControlKeyID != "" && s.ControlKeyID != c.Keys.KeyID() {
					s.RotationPending = true
					s.RotationOutOfReach = !rotationFrom(r.Rotations, s.ControlKeyID)
				}
				if hb.Executor.Seq > s.Applied {
					s.Applied = hb.Executor.Seq
				}
			}
			s.ExecutorError, s.LastLinkError = hb.ExecutorError, hb.LastLinkError
			s.ExecutorHalted = hb.ExecutorHalted
			s.State, s.Presence = hb.State, hb.Presence
		} else if s.LastReport != nil {
			// Reported, and no heartbeat kept: it was linked and
			// enrolled when it last spoke.
			s.State = link.StateEnrolled
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
// reports signed by the NKey the registry holds for the enrolment each
// names are returned — the live one's, or a past one's (NodeRecord.Past:
// a node revoked, rekeyed or enrolled anew keeps what it reported before);
// skipped is how many others were on its subjects. A node's reports are in two streams
// at most (link.NodeReports), those of the first older than the second's.
func (c *Client) Reports(ctx context.Context, node string, last int) (reports []*SignedReport, skipped int, err error) {
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return nil, 0, err
	}
	keys := reportKeys(rec)
	for _, p := range link.NodeReports(node) {
		stream, err := c.JS.Stream(ctx, p.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(p.Subject))
		if err != nil {
			return nil, 0, err
		}
		if info.State.Subjects[p.Subject] == 0 {
			continue
		}
		err = c.readStream(ctx, p.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{p.Subject}}, func(m jetstream.Msg) bool {
			r := reportOfAny(m, node, keys)
			if r == nil {
				skipped++
				return true
			}
			reports = append(reports, r)
			if last > 0 && len(reports) > last {
				reports = reports[1:]
			}
			return true
		})
		if err != nil {
			return nil, 0, err
		}
	}
	return reports, skipped, nil
}

// reportOfAny is signedReport for any enrolment of keys (reportKeys): the
// report names its enrolment, and is verified under that one's NKey.
func reportOfAny(m jetstream.Msg, node string, keys map[string]string) *SignedReport {
	var r struct {
		Enrolment string `json:"enrolment"`
	}
	if json.Unmarshal(m.Data(), &r) != nil || keys[r.Enrolment] == "" {
		return nil
	}
	return signedReport(m, node, keys[r.Enrolment], r.Enrolment)
}

// signedReport is m as node's report, or nil when it is not one: signed
// by the node's registered NKey nkey, naming the node and its enrolment
// (a report of an earlier enrolment, or another node's, is not its).
func signedReport(m jetstream.Msg, node, nkey, enrolment string) *SignedReport {
	md, _ := m.Metadata()
	var r link.Report
	if md == nil || link.VerifySignature(nkey, m.Data(), m.Headers().Get(link.SignatureHeader)) != nil ||
		json.Unmarshal(m.Data(), &r) != nil || r.Node != node || r.Enrolment != enrolment {
		return nil
	}
	return &SignedReport{Report: r, StreamSeq: md.Sequence.Stream}
}

// ownedCopy is the control side's copy of what a node last reported it
// owns (its last report's, or KV owned.<node> kept apart when a report
// without it came, lastOwned): a backup, never a source.
type ownedCopy struct {
	Enrolment string            `json:"enrolment"`
	Seq       uint64            `json:"seq"`
	Reported  time.Time         `json:"reported"`
	Entries   []wire.OwnedEntry `json:"entries"`
	Recorded  uint64            `json:"recorded_seq,omitempty"` // the report's stream sequence (withRecorded)
}

// Briefing returns the last briefing a node reported, or nil.
func (c *Client) Briefing(ctx context.Context, node string) *shapes.Briefing {
	b, _ := c.briefing(ctx, node)
	return b
}

// briefing is Briefing that tells a registry that did not answer from a
// node without a briefing (nil, nil), which a declare must not take it for.
func (c *Client) briefing(ctx context.Context, node string) (*shapes.Briefing, error) {
	e, err := c.KV.Get(ctx, "briefing."+node)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry: the briefing of %s: %w", node, err)
	}
	var b shapes.Briefing
	if json.Unmarshal(e.Value(), &b) != nil {
		return nil, nil
	}
	return &b, nil
}

// rotationFrom says whether chain holds a rotation a node holding key id
// can take: one the key retires, or one the recovery key signed.
func rotationFrom(chain [][]byte, id string) bool {
	for _, env := range chain {
		if r, err := wire.PeekRotation(env); err == nil && (r.From == id || r.By == wire.ByRecovery) {
			return true
		}
	}
	return false
}
