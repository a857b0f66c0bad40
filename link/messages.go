package link

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Report is what the agent publishes to mesh.report.<node> (JSON), one per
// declaration it settled and one per reconcile the executor ran when the
// link came back.
type Report struct {
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"`
	// Seq is the declaration's sequence. It is 0 when the envelope did not
	// verify: nothing unsigned is repeated upward as if it were the control
	// plane's word; StreamSeq then identifies the message.
	Seq       uint64 `json:"seq"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
	// Trigger is "declaration", "reconnect" (the executor's reconcile when
	// the link came back), "roster", "plan" or "activity" (the Trigger
	// constants).
	Trigger string         `json:"trigger"`
	Outcome shapes.Outcome `json:"outcome"`
	Lines   []shapes.Line  `json:"lines"`
	// Refused is the reason a declaration was refused, Code its wire code
	// name ("bad-signature", "address", "replay", "action", …), and
	// RefusedBy which side refused it: "agent" (it never reached the
	// executor) or "executor".
	Refused   string `json:"refused,omitempty"`
	Code      string `json:"code,omitempty"`
	RefusedBy string `json:"refused_by,omitempty"`
	// SupersededBy names the newer declaration that was forwarded instead,
	// whatever the executor's verdict on it (SupersededOutcome). One
	// superseded report covers the sequences SupersededFrom to Seq: the
	// agent reads only the newest declaration, so those between the last
	// it settled and the newest are settled by it together, whether or not
	// the agent ever saw them (a sequence the control side spent without
	// publishing is among them, and was superseded all the same).
	SupersededFrom    uint64         `json:"superseded_from,omitempty"`
	SupersededBy      uint64         `json:"superseded_by,omitempty"`
	SupersededOutcome shapes.Outcome `json:"superseded_outcome,omitempty"`
	// Duplicate: the executor had applied these exact bytes before.
	Duplicate bool `json:"duplicate,omitempty"`
	// Retired: the declaration retired the node, and its executor ran it
	// to its end (it drops the node's identity whatever its lines kept).
	// The agent's word, which the control side holds to the declaration it
	// signed before it revokes the node.
	Retired bool `json:"retired,omitempty"`
	// Briefing: what the apply found on an adopted node.
	Briefing *shapes.Briefing `json:"briefing,omitempty"`
	// Owned: what the host made for the link after this apply, for the
	// control side's copy (handed back after a lost store).
	//
	// Absent (nil) when the executor said nothing of it (a refusal), an
	// empty list when the host holds nothing: omitzero keeps the two apart.
	Owned []wire.OwnedEntry `json:"owned,omitzero"`
	// DisconnectedFrom and DisconnectedTo, on a reconnect report: the
	// node was without its link from the last moment the agent knew it
	// linked (kept across its restarts) to the moment it linked again.
	// Disconnection is the node's to say: heard nothing meanwhile, the
	// control side cannot tell it from a machine switched off.
	// PlanID and Diffs, on a plan's report: the request answered, and the
	// content diffs the executor shows (files the mesh holds, as it wrote
	// them), in the order of the resources' "module.id" (a list, not a
	// map keyed by data: every JSON output keeps snake_case keys).
	PlanID string `json:"plan_id,omitempty"`
	// RecordedSeq is the control side's, not the node's: the report's
	// sequence in the report stream, added to the registry's copy of a
	// node's last report by the recorder, which keeps the newest by it.
	RecordedSeq uint64 `json:"recorded_seq,omitempty"`
	Diffs       []Diff `json:"diffs,omitempty"`
	// ApplyMS is how long the executor took, in whole milliseconds, from
	// the declaration handed over to its verdict (a declaration's report).
	ApplyMS          int64     `json:"apply_ms,omitempty"`
	DisconnectedFrom time.Time `json:"disconnected_from,omitzero"`
	DisconnectedTo   time.Time `json:"disconnected_to,omitzero"`
	// Meanwhile is what the executor did in that interval, by its own
	// history: each apply that changed something or failed (drift
	// repaired, a rescue file applied), oldest first; MeanwhileMore
	// counts the older ones left out.
	Meanwhile     []shapes.Activity `json:"meanwhile,omitempty"`
	MeanwhileMore int               `json:"meanwhile_more,omitempty"`
	At            time.Time         `json:"at"`
}

// The triggers of a report.
const (
	TriggerDeclaration = "declaration"
	TriggerReconnect   = "reconnect"
	// TriggerRoster: the executor applied the link's declaration again
	// for a new roster (its overlay's peers); Seq is that declaration's.
	TriggerRoster = "roster"
	// TriggerPlan: what a declaration would do (PlanID names the request);
	// nothing was changed, and the registry keeps no such report.
	TriggerPlan = "plan"
	// TriggerActivity: what the executor did on its own while linked —
	// a drift repaired, a start's reconcile, a rescue file — in
	// Meanwhile, oldest first (MeanwhileMore: those its history no longer
	// held); Seq is 0. The registry keeps no such report as the node's
	// last: that stays its last apply's.
	TriggerActivity = "activity"
)

// PlanUnasked begins the reason of a plan report the agent refused,
// code internal, because it could not ask its executor: the control side
// says where to look (mesh-executor doctor), which another internal
// refusal (the archive store unread) does not need.
const PlanUnasked = "the executor could not be asked: "

// The presences a heartbeat says.
const (
	PresenceResident = "resident"
	PresenceEpisodic = "episodic"
)

// The agent's states, as its heartbeat says.
const (
	StateHosted       = "hosted"       // no identity: idle, never dials
	StateEnrolled     = "enrolled"     // an identity, and linked
	StateDisconnected = "disconnected" // an identity, and no link
)

// Heartbeat is what the agent publishes to mesh.heartbeat.<node> (JSON)
// every interval while linked.
type Heartbeat struct {
	Node      string    `json:"node"`
	Enrolment string    `json:"enrolment"`
	At        time.Time `json:"at"`
	// Interval is the heartbeat period, so the control side can tell a
	// silent node from a slow one.
	Interval float64 `json:"interval_seconds"`
	State    string  `json:"state"`
	// Presence is PresenceResident (linked whenever the machine is up) or
	// PresenceEpisodic (an app: linked only while it runs), so the control
	// side reads a node's silence for what it is.
	Presence     string `json:"presence"`
	AgentVersion string `json:"agent_version"`
	AgentBuild   string `json:"agent_build"`
	// Capability is the agent's link capability (link.Capability; 0, or
	// absent, from a release before it). The control side keeps it from a
	// heartbeat that carries the profile, which the agent sends again
	// whenever its capability is not the one it last said.
	Capability int `json:"capability,omitempty"`
	// BrokerPinsSeq is the sequence of the broker certificates'
	// statement the agent took last (wire.BrokerPins; 0: none): the
	// control side switches the broker's certificate once every node has.
	BrokerPinsSeq uint64 `json:"broker_pins_seq,omitempty"`
	// JWTIssuer is the key that issued the user JWT the agent signs in
	// with ("": none): under a broker in operator mode the control side
	// sends one of the nodes' account key in force when it differs
	// (UserJWTHeader), and switches keys once every node has it.
	JWTIssuer string `json:"jwt_issuer,omitempty"`
	// Rekey is the executor's request that the node's keys be renewed
	// (mesh-executor rekey), signed by its identity key, sent with each
	// heartbeat until the control side's answer comes (RekeyHeader). A
	// control side of a release before it reads past the field.
	Rekey *wire.RekeyRequest `json:"rekey,omitempty"`
	// RekeyBroker, beside Rekey, is where this agent reaches the broker,
	// for the token the answer carries: the control side knows only its
	// own address for it. The agent's word, unsigned: a wrong one can
	// only fail this node's own enrolment, whose token pins the broker's
	// certificate.
	RekeyBroker string `json:"rekey_broker,omitempty"`
	// Executor is the executor's own account of itself, asked over the
	// socket for this heartbeat; ExecutorError says why it could not be.
	Executor      *ExecutorStatus `json:"executor,omitempty"`
	ExecutorError string          `json:"executor_error,omitempty"`
	// ExecutorHalted is the launcher's word, when the executor is not
	// running because the launcher halted (a release and its rollback both
	// failed) or cannot use its state: what a person has to look at.
	ExecutorHalted string `json:"executor_halted,omitempty"`
	// The last declaration the agent saw applied, and how it ended.
	LastApplied        uint64         `json:"last_applied"`
	LastAppliedOutcome shapes.Outcome `json:"last_applied_outcome,omitempty"`
	// The last verdict of any kind (refused included).
	LastSeq     uint64         `json:"last_seq,omitempty"`
	LastOutcome shapes.Outcome `json:"last_outcome,omitempty"`
	// The link: since when it is up, when the agent was last linked before
	// that (kept across restarts in the state directory), how long it was
	// without, and the last failure to link, if any.
	LinkedSince   time.Time `json:"linked_since"`
	LastLinked    time.Time `json:"last_linked,omitzero"`
	Unlinked      float64   `json:"unlinked_seconds,omitempty"`
	LastLinkError string    `json:"last_link_error,omitempty"`
	// Profile and Inventory, when they changed since the agent last
	// reported them, and every six hours though unchanged
	// (agent.Options.ProfileAgain) (JSON, as the executor found them).
	Profile   json.RawMessage `json:"profile,omitempty"`
	Inventory json.RawMessage `json:"inventory,omitempty"`
}

// ExecutorStatus is the executor's StatusReply, as the heartbeat carries it.
type ExecutorStatus struct {
	Version string         `json:"version"`
	Build   string         `json:"build"`
	State   string         `json:"state"`
	Node    string         `json:"node,omitempty"`
	Seq     uint64         `json:"seq"`
	Outcome shapes.Outcome `json:"outcome,omitempty"`
	// WireGuardKey is the public half of the node's overlay key.
	WireGuardKey string `json:"wireguard_key,omitempty"`
	// RolledBackFrom is the host release the node's launcher rolled back
	// from, and RollbackReason why (the executor or the agent
	// crash-looped after the upgrade).
	RolledBackFrom string `json:"rolled_back_from,omitempty"`
	RollbackReason string `json:"rollback_reason,omitempty"`
	// ControlKeyID is the control key the executor holds in force: the
	// control side tells from it which nodes have taken a rotation.
	ControlKeyID string `json:"control_key_id,omitempty"`
}

// Diff is one file's content diff in a plan's report.
type Diff struct {
	Resource string `json:"resource"` // module.id
	Diff     string `json:"diff"`
}

// DiffList orders the executor's diffs by resource for the report.
func DiffList(m map[string]string) []Diff {
	var out []Diff
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, Diff{Resource: k, Diff: m[k]})
	}
	return out
}
