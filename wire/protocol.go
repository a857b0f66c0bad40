package wire

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Kind numbers a message. Numbers are stable and never reused; requests
// (agent to executor) are even and replies (executor to agent) odd, as in
// OpenSSH's monitor, so a reply can never be mistaken for a request.
type Kind uint16

// The messages of the agent↔executor protocol.
const (
	KindHello        Kind = 2  // agent: who I am; must come first, once
	KindHelloReply   Kind = 3  // executor: my version and build, node, state
	KindDeclaration  Kind = 4  // agent: an envelope exactly as published
	KindReportLine   Kind = 5  // executor: one line of the apply, streamed
	KindReconnected  Kind = 6  // agent: the link came back; reconcile
	KindVerdict      Kind = 7  // executor: how a declaration or reconcile ended
	KindStatus       Kind = 8  // agent: what is your state (for the heartbeat)
	KindStatusReply  Kind = 9  // executor: version, state, last sequence and outcome
	KindError        Kind = 11 // executor: the connection is refused and closes
	KindArchive      Kind = 10 // agent: a chunk of an archive's bytes, for the executor's cache
	KindArchiveAck   Kind = 13 // executor: the streamed archive is stored, or why not
	KindEnrol        Kind = 12 // agent: here is my NKey; is an enrolment pending?
	KindEnrolOffer   Kind = 15 // executor: none, or the network half, the public keys and the proof
	KindGrant        Kind = 14 // agent: the grant the control side signed, or why there is none
	KindGrantReply   Kind = 17 // executor: the grant is recorded (enrolled), or why not
	KindProfile      Kind = 16 // agent: what can this machine do, and what is it
	KindProfileReply Kind = 19 // executor: the profile and inventory, as last found
	KindRoster       Kind = 18 // agent: the mesh's roster, an envelope exactly as published
	KindPlan         Kind = 20 // agent: a plan request, an envelope exactly as published
	KindPlanReply    Kind = 21 // executor: what the declaration would do, nothing changed
	// KindKeyRotation: agent: the control key's rotations, as published
	// beside a declaration; none asks only which key is in force.
	KindKeyRotation      Kind = 22
	KindKeyRotationReply Kind = 23 // executor: the control key in force, after those it took
	KindRekey            Kind = 24 // agent: the control side's answer to the node's rekey request
	KindRekeyReply       Kind = 25 // executor: the enrolment it began with the answer's token, or why none
	KindActivity         Kind = 26 // agent: what did you do on your own after this count
	KindActivityReply    Kind = 27 // executor: those activities, oldest first, and the count reached
	KindLastApplied      Kind = 28 // agent: the last declaration applied from the link, if past this sequence
)

// Direction is who may send a message.
type Direction uint8

// The two directions.
const (
	AgentToExecutor Direction = iota + 1
	ExecutorToAgent
)

// State is where a connection is, as the executor sees it.
type State uint8

// The states of a connection:
//
//	new ──Hello──► ready ──Declaration/Roster/Reconnected/Status──► (reply) ──► ready
//	 │               │ ▲
//	 │       Archive │ │ Archive (Last) ──► ArchiveAck
//	 │               ▼ │
//	 │             archiving ◄─┐ Archive (not Last; the same digest, the next offset)
//	 │                 └───────┘
//	 │                                  any violation ──► closed
//	 └── anything else ──► closed
//
// While an archive streams, nothing but its next chunk is allowed: one
// stream at a time on a connection, and no request overtakes it.
const (
	StateNew State = iota + 1
	StateReady
	StateArchiving
)

// Spec is one row of the protocol's table: the policy lives here, not in
// the handlers.
type Spec struct {
	Kind   Kind
	Name   string
	Dir    Direction
	States []State // when an agent may send it (requests only)
	// Max is the largest body accepted, checked before a byte is allocated.
	Max  uint32
	Body func() any // a new, empty body to decode into
	// Answer, for a request, is the one reply that ends it, and Streamed
	// the reply it may send any number of before that (0: none). Error
	// may end any request. A request unanswered (an archive's chunk but
	// the last) has none. The agent reads every reply against its
	// request's row (Answers): a reply of another kind is never taken for
	// the answer, and a connection that carries one is closed.
	Answer, Streamed Kind
}

// Table is the whole protocol. A kind not in it closes the connection.
var Table = []Spec{
	{KindHello, "hello", AgentToExecutor, []State{StateNew}, 4 << 10, func() any { return new(Hello) }, KindHelloReply, 0},
	{KindHelloReply, "hello-reply", ExecutorToAgent, nil, 4 << 10, func() any { return new(HelloReply) }, 0, 0},
	{KindDeclaration, "declaration", AgentToExecutor, []State{StateReady}, MaxEnvelope + 64, func() any { return new(Declaration) }, KindVerdict, KindReportLine},
	{KindReportLine, "report-line", ExecutorToAgent, nil, 64 << 10, func() any { return new(shapes.Line) }, 0, 0},
	{KindReconnected, "reconnected", AgentToExecutor, []State{StateReady}, 128, func() any { return new(Reconnected) }, KindVerdict, KindReportLine},
	{KindVerdict, "verdict", ExecutorToAgent, nil, 8 << 20, func() any { return new(Verdict) }, 0, 0},
	{KindStatus, "status", AgentToExecutor, []State{StateReady}, 128 + MaxLinkError, func() any { return new(Status) }, KindStatusReply, 0},
	{KindStatusReply, "status-reply", ExecutorToAgent, nil, 4 << 10, func() any { return new(StatusReply) }, 0, 0},
	{KindError, "error", ExecutorToAgent, nil, 4 << 10, func() any { return new(Error) }, 0, 0},
	{KindArchive, "archive", AgentToExecutor, []State{StateReady, StateArchiving}, MaxArchiveChunk + 256, func() any { return new(Archive) }, KindArchiveAck, 0},
	{KindArchiveAck, "archive-ack", ExecutorToAgent, nil, 4 << 10, func() any { return new(ArchiveAck) }, 0, 0},
	{KindEnrol, "enrol", AgentToExecutor, []State{StateReady}, 256, func() any { return new(Enrol) }, KindEnrolOffer, 0},
	{KindEnrolOffer, "enrol-offer", ExecutorToAgent, nil, 1 << 20, func() any { return new(EnrolOffer) }, 0, 0},
	{KindGrant, "grant", AgentToExecutor, []State{StateReady}, 64 << 10, func() any { return new(GrantHandover) }, KindGrantReply, 0},
	{KindGrantReply, "grant-reply", ExecutorToAgent, nil, 4 << 10, func() any { return new(GrantReply) }, 0, 0},
	{KindProfile, "profile", AgentToExecutor, []State{StateReady}, 64, func() any { return new(Profile) }, KindProfileReply, 0},
	{KindProfileReply, "profile-reply", ExecutorToAgent, nil, 1 << 20, func() any { return new(ProfileReply) }, 0, 0},
	{KindRoster, "roster", AgentToExecutor, []State{StateReady}, MaxEnvelope + 64, func() any { return new(Roster) }, KindVerdict, KindReportLine},
	{KindPlan, "plan", AgentToExecutor, []State{StateReady}, MaxEnvelope + 64, func() any { return new(Plan) }, KindPlanReply, 0},
	{KindPlanReply, "plan-reply", ExecutorToAgent, nil, 8 << 20, func() any { return new(PlanReply) }, 0, 0},
	{KindKeyRotation, "key-rotation", AgentToExecutor, []State{StateReady}, MaxRotationChain * 4 << 10, func() any { return new(KeyRotations) }, KindKeyRotationReply, 0},
	{KindKeyRotationReply, "key-rotation-reply", ExecutorToAgent, nil, 4 << 10, func() any { return new(KeyRotationReply) }, 0, 0},
	{KindRekey, "rekey", AgentToExecutor, []State{StateReady}, MaxRekeyAnswer, func() any { return new(Rekey) }, KindRekeyReply, 0},
	{KindRekeyReply, "rekey-reply", ExecutorToAgent, nil, 4 << 10, func() any { return new(RekeyReply) }, 0, 0},
	{KindActivity, "activity", AgentToExecutor, []State{StateReady}, 64, func() any { return new(Activity) }, KindActivityReply, 0},
	{KindActivityReply, "activity-reply", ExecutorToAgent, nil, 1 << 20, func() any { return new(ActivityReply) }, 0, 0},
	{KindLastApplied, "last-applied", AgentToExecutor, []State{StateReady}, 64, func() any { return new(LastApplied) }, KindVerdict, KindReportLine},
}

var byKind = func() map[Kind]*Spec {
	m := map[Kind]*Spec{}
	for i := range Table {
		s := &Table[i]
		if _, dup := m[s.Kind]; dup {
			panic(fmt.Sprintf("wire: kind %d in the table twice", s.Kind))
		}
		if (s.Dir == AgentToExecutor) != (s.Kind%2 == 0) {
			panic(fmt.Sprintf("wire: kind %d (%s): requests are even, replies odd", s.Kind, s.Name))
		}
		m[s.Kind] = s
	}
	for _, s := range m {
		a, st := m[s.Answer], m[s.Streamed]
		switch {
		case s.Dir == ExecutorToAgent && (s.Answer != 0 || s.Streamed != 0):
			panic(fmt.Sprintf("wire: kind %d (%s): a reply answers nothing", s.Kind, s.Name))
		case s.Dir == AgentToExecutor && (a == nil || a.Dir != ExecutorToAgent || a.Kind == KindError):
			panic(fmt.Sprintf("wire: kind %d (%s): a request needs its own reply kind as its answer", s.Kind, s.Name))
		case s.Streamed != 0 && (st == nil || st.Dir != ExecutorToAgent || s.Streamed == s.Answer):
			panic(fmt.Sprintf("wire: kind %d (%s): what it streams is a reply other than its answer", s.Kind, s.Name))
		}
	}
	return m
}()

// Answers says whether reply belongs to request req, and if so whether it
// ends it (its Answer, or an Error) or comes before the end (Streamed).
// A connection carries one request at a time, and a request given up
// (its deadline, its context) closes the connection: so the replies read
// after a request are its own, and one that Answers refuses is a broken
// peer, never a late answer to be taken for this one.
func Answers(req, reply Kind) (belongs, ends bool) {
	s, ok := byKind[req]
	if !ok || s.Dir != AgentToExecutor {
		return false, false
	}
	switch reply {
	case s.Answer, KindError:
		return true, true
	case s.Streamed:
		return reply != 0, false
	}
	return false, false
}

// Next is the state a connection is in once the executor has served k,
// sent in st with body: the transitions of the picture above, in one place.
func Next(k Kind, st State, body any) State {
	switch k {
	case KindHello:
		return StateReady
	case KindArchive:
		if a, ok := body.(*Archive); ok && !a.Last {
			return StateArchiving
		}
		return StateReady
	}
	return st
}

// The connection rules: what the executor waits for, how long, and under
// which lock it may write. They hold for every request kind alike; the
// executor's server applies them in one loop, never handler by handler.
//
//   - A frame begun must be whole within FrameWithin. A peer that sends
//     part of a header or of a body and stalls is closed then, and before
//     then its connection is the first given up when another needs a slot:
//     stalled connections cannot keep the agent out.
//   - How long the executor waits for a frame to begin depends on the state
//     (Wait): a new connection's hello within HelloWithin, an archive's next
//     chunk within ChunkWithin; a ready connection may be idle as long as it
//     likes, but an idle one gives its slot up to a newcomer when all are
//     taken.
//   - Every frame the executor sends is written by the connection's writer
//     (never by a handler, and so never under the apply lock), and must be
//     taken by the peer within ReplyWithin, or the connection is closed. A
//     handler only queues its answer; report lines are queued without
//     waiting, and dropped once the queue is full (the verdict says how the
//     apply ended). A peer that never reads therefore costs the executor one
//     connection and nothing else: applies, the drift timer and reconciles
//     go on.
//   - The bodies of frames larger than SmallFrame are read only within the
//     executor's frame budget (FrameBudget bytes across all connections):
//     concurrent large frames wait their turn instead of each taking its
//     memory at once. A smaller frame needs no budget (slots × SmallFrame).
const (
	FrameWithin = 10 * time.Second
	HelloWithin = 5 * time.Second
	ChunkWithin = 2 * time.Minute
	ReplyWithin = 5 * time.Second
	SmallFrame  = 64 << 10
	// FrameBudget admits one envelope of the largest size at a time, with
	// room beside it for archive chunks and the other larger replies.
	FrameBudget = MaxEnvelope + 64 + 4*(MaxArchiveChunk+256)
)

// Wait is how long the executor waits for a frame to begin in state st; 0
// is as long as it takes.
func Wait(st State) time.Duration {
	switch st {
	case StateNew:
		return HelloWithin
	case StateArchiving:
		return ChunkWithin
	}
	return 0
}

// Lookup returns the table's row for k.
func Lookup(k Kind) (*Spec, bool) {
	s, ok := byKind[k]
	return s, ok
}

func (k Kind) String() string {
	if s, ok := byKind[k]; ok {
		return s.Name
	}
	return fmt.Sprintf("kind(%d)", uint16(k))
}

// Allowed reports whether an agent may send k in state st.
func Allowed(k Kind, st State) bool {
	s, ok := byKind[k]
	if !ok || s.Dir != AgentToExecutor {
		return false
	}
	for _, x := range s.States {
		if x == st {
			return true
		}
	}
	return false
}

// ProtocolVersion is the version both sides speak; Hello carries it.
const ProtocolVersion = 1

// Hello opens a connection.
type Hello struct {
	Protocol int    `cbor:"1,keyasint"`
	Version  string `cbor:"2,keyasint"` // the agent's version
	Build    string `cbor:"3,keyasint"` // the agent's build id
	// Secret is the connection secret, over vsock only (which carries no
	// peer credentials); never sent over the unix socket.
	Secret []byte `cbor:"4,keyasint,omitempty"`
}

// HelloReply answers Hello. The agent compares Build with its own: a
// different build means the host was upgraded, and the agent exits to be
// restarted onto its own new binary.
type HelloReply struct {
	Protocol int    `cbor:"1,keyasint"`
	Version  string `cbor:"2,keyasint"`
	Build    string `cbor:"3,keyasint"`
	Node     string `cbor:"4,keyasint"`
	State    string `cbor:"5,keyasint"` // hosted, enrolled
}

// Declaration carries the envelope bytes exactly as published. Nothing
// else: no "verified" flag, no parsed declaration, no sequence. The
// executor verifies the bytes itself.
type Declaration struct {
	Envelope []byte `cbor:"1,keyasint"`
}

// Roster is the mesh's roster as the control plane published it: a COSE
// envelope (PurposeRoster) over a shapes.Roster. The executor verifies it
// under the pinned key, keeps it if it is newer than the one it holds, and
// applies the link's declaration again when its overlay takes its peers
// from the roster; the verdict says how that went.
type Roster struct {
	Envelope []byte `cbor:"1,keyasint"`
}

// Reconnected says the link came back: declarations may have been missed,
// and the machine may have drifted.
type Reconnected struct {
	// From and To: the agent was without its link from From (the last
	// moment it knew it linked) to To (when it linked again), when it
	// knows: the verdict then says what the executor did meanwhile.
	From time.Time `cbor:"1,keyasint,omitzero"`
	To   time.Time `cbor:"2,keyasint,omitzero"`
	// After, when set, is the count of the last activity the agent has
	// reported upward (StatusReply.Activity): the verdict's Meanwhile is
	// then every activity since, whenever it was — the disconnection's
	// and what the link's last moments left unreported — rather than
	// those between From and To by the executor's clock.
	After *uint64 `cbor:"3,keyasint,omitempty"`
}

// LastApplied asks the executor to say again the last declaration it
// applied from the link, when its sequence is past After: its lines as
// kept (KindReportLine), then a Verdict naming it (Seq, Outcome, Prior). A
// Verdict with no outcome says there is none past After. The agent asks
// before it reports declarations superseded: one the executor applied
// while the agent, stopped between the verdict and its report, never
// said it, is reported applied — with its lines — not superseded.
type LastApplied struct {
	After uint64 `cbor:"1,keyasint"`
}

// Activity asks what the executor did on its own — a start, a drift
// repaired, a rescue file, a carried bundle: the applies no report of a
// declaration, a roster or a reconnect carried — after the count After,
// for the agent to report it upward while linked.
type Activity struct {
	After uint64 `cbor:"1,keyasint"`
}

// ActivityReply is the oldest MaxActivities of those activities, and Last
// the count they reach (the next Activity asks after it).
type ActivityReply struct {
	Acts []shapes.Activity `cbor:"1,keyasint,omitempty"`
	Last uint64            `cbor:"2,keyasint"`
	// Lost counts the activities after the count asked for that the
	// executor's bounded history no longer holds.
	Lost uint64 `cbor:"3,keyasint,omitempty"`
}

// MaxActivities bounds ActivityReply.Acts: one report upward carries them.
const MaxActivities = 16

// Status asks the executor's state, and says the agent's link: the
// executor keeps it to answer `mesh-executor status` (enrolled, and
// disconnected since when). nil from an agent that says nothing.
type Status struct {
	Link *AgentLink `cbor:"1,keyasint,omitempty"`
}

// AgentLink is the agent's link as it says it: up since Since, or down
// since Since (the last moment it knew it linked; zero: never linked).
type AgentLink struct {
	Up    bool      `cbor:"1,keyasint"`
	Since time.Time `cbor:"2,keyasint,omitzero"`
	// Revoked, while down: the broker has refused this node's credential
	// since then (an authorization violation for its NKey: the control
	// side revoked it, or enrolled another machine as the node). The agent
	// then tries seldom; nothing but a new enrolment brings the link back.
	Revoked time.Time `cbor:"3,keyasint,omitzero"`
	// Error, while down: why the agent last failed to reach the broker,
	// as its log says it (an address unreachable, a certificate not the
	// pinned one, a credential refused). The agent's word, for a person:
	// the executor keeps at most MaxLinkError bytes of it, printable.
	Error string `cbor:"4,keyasint,omitempty"`
	// ClockSkew is how far the machine's clock was ahead of the broker's
	// (negative: behind) by the agent's last measure, at ClockAt by the
	// machine's clock: its own newest heartbeat read back (link.Subjects
	// HeartbeatGet), its time against the broker's receipt of it, as the
	// control side measures a node's skew. ClockAt zero: never measured.
	ClockSkew time.Duration `cbor:"5,keyasint,omitempty"`
	ClockAt   time.Time     `cbor:"6,keyasint,omitzero"`
}

// MaxLinkError is the most of AgentLink.Error that is said (LinkErrorText):
// a line, not a log, and room for it in a status's frame.
const MaxLinkError = 512

// LinkErrorText is s as AgentLink.Error carries it: at most MaxLinkError
// bytes, cut at a character, every control character (an escape
// sequence's start among them) and every byte that is no UTF-8 as
// U+FFFD. The agent says it so, to fit its frame; the executor makes it
// so again, trusting the agent for nothing, before root's terminal may
// be shown it.
func LinkErrorText(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > MaxLinkError {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// StatusReply is the executor's state, for the heartbeat.
type StatusReply struct {
	Version string         `cbor:"1,keyasint"`
	Build   string         `cbor:"2,keyasint"`
	State   string         `cbor:"3,keyasint"`
	Node    string         `cbor:"4,keyasint"`
	Seq     uint64         `cbor:"5,keyasint"`
	Outcome shapes.Outcome `cbor:"6,keyasint"`
	// WireGuardKey is the public half of the executor's overlay key, once
	// it has one: the control side derives the overlay from the keys the
	// nodes report.
	WireGuardKey string `cbor:"7,keyasint,omitempty"`
	// Enrolling: root has begun an enrolment (mesh-executor enrol) that
	// the agent has yet to carry out; an agent holding an identity turns
	// to it (a re-enrolment).
	Enrolling bool `cbor:"8,keyasint,omitempty"`
	// ProfileDigest names the profile and inventory as last found: when
	// it changes, the agent asks for them (Profile) and reports them.
	ProfileDigest string `cbor:"9,keyasint,omitempty"`
	// RolledBackFrom is the host release the launcher last rolled back
	// from (its package version), and RollbackReason why: the executor
	// crash-looped, or the agent did. Reported upward with the heartbeat,
	// so the rollback is known once the link is back.
	RolledBackFrom string `cbor:"10,keyasint,omitempty"`
	RollbackReason string `cbor:"11,keyasint,omitempty"`
	// ControlKeyID is the control key in force (KeyID), once enrolled:
	// the one enrolment pinned, or the last a rotation brought in.
	ControlKeyID string `cbor:"12,keyasint,omitempty"`
	// Rekey is the rekey root asked for (mesh-executor rekey), signed by
	// the identity key, while it waits for the control side's answer:
	// the agent carries it in its heartbeats.
	Rekey *RekeyRequest `cbor:"13,keyasint,omitempty"`
	// Activity is the count of the newest activity in the executor's
	// history (0: none): past the one it last reported, the agent asks
	// for them (Activity) and reports them.
	Activity uint64 `cbor:"14,keyasint,omitempty"`
}

// Verdict ends a declaration or a reconcile.
type Verdict struct {
	Seq     uint64         `cbor:"1,keyasint"`
	Outcome shapes.Outcome `cbor:"2,keyasint"` // derived from the lines, or refused
	Code    Code           `cbor:"3,keyasint"` // why refused (0 otherwise)
	Reason  string         `cbor:"4,keyasint"`
	// Duplicate: these exact bytes were applied before; nothing was done.
	Duplicate bool `cbor:"5,keyasint"`
	// Briefing: what an apply on an adopted node found, for the control
	// side to keep (it assigns a node with a failed line nothing new).
	Briefing *shapes.Briefing `cbor:"6,keyasint,omitempty"`
	// Owned is what the host made for the link after this apply: the
	// control side keeps the last copy and hands it back, signed, when the
	// node is enrolled again after losing its store.
	Owned []OwnedEntry `cbor:"7,keyasint"`
	// Meanwhile, on the verdict of a Reconnected that named the
	// disconnection: the applies that did something in it (drift
	// repaired, rescue files), oldest first, at most MaxMeanwhile of the
	// newest; MeanwhileMore counts those left out.
	Meanwhile     []shapes.Activity `cbor:"8,keyasint,omitempty"`
	MeanwhileMore int               `cbor:"9,keyasint,omitempty"`
	// Activity, on the verdict of a Reconnected: the count of the newest
	// activity its Meanwhile and this reconcile's own lines cover — what
	// the agent has reported once the report is out.
	Activity uint64 `cbor:"10,keyasint,omitempty"`
	// Prior, on a declaration applied or said again (a duplicate,
	// LastApplied): the sequence the link applied before it, when the
	// executor knows it (nil: not known). The declarations between the two
	// never ran: those the agent reports superseded by this one stay
	// past Prior, so that an agent whose memory is behind (its state not
	// written, a full disk) says none that ran was superseded.
	Prior *uint64 `cbor:"11,keyasint,omitempty"`
}

// MaxMeanwhile bounds Verdict.Meanwhile.
const MaxMeanwhile = 100

// Error refuses the connection; the executor closes it after sending.
type Error struct {
	Code    Code   `cbor:"1,keyasint"`
	Message string `cbor:"2,keyasint"`
}

// Error says the executor refused, once: the executor's messages name it
// already.
func (e *Error) Error() string {
	return fmt.Sprintf("executor: %s (%s)", strings.TrimPrefix(e.Message, "executor: "), e.Code)
}

// Unwrap maps the code to its sentinel, so callers use errors.Is.
func (e *Error) Unwrap() error { return e.Code.sentinel() }

// MaxArchiveChunk is the most bytes one Archive message carries.
const MaxArchiveChunk = 1 << 20

// MaxArchiveBytes is the largest archive: the most one stream may carry
// into the executor's cache, and the most its files may hold. The agent
// refuses a larger object before fetching a byte of it.
const MaxArchiveBytes = shapes.MaxArchiveBytes

// Archive is one chunk of an archive streamed into the executor's private
// cache. The first chunk of a stream has Offset 0; each next one starts
// where the last ended; the one with Last ends the stream and is answered
// by an ArchiveAck (the others are not answered). SHA256 only names the
// cache file: the executor hashes what it writes, and keeps the bytes only
// if they have that digest. Which archive is applied, and whether at all,
// comes from a signed declaration, never from this message.
type Archive struct {
	SHA256 string `cbor:"1,keyasint"` // 64 lower-case hex digits
	Offset uint64 `cbor:"2,keyasint"`
	Chunk  []byte `cbor:"3,keyasint"` // at most MaxArchiveChunk bytes
	Last   bool   `cbor:"4,keyasint"`
}

// ArchiveAck answers the last chunk of an archive stream: Stored, or why
// not (nothing of it is kept then).
type ArchiveAck struct {
	SHA256 string `cbor:"1,keyasint"`
	Stored bool   `cbor:"2,keyasint"`
	Reason string `cbor:"3,keyasint"`
}

// Enrol asks whether an enrolment is pending, and gives the agent's NKey
// (its public half) for the proof.
type Enrol struct {
	AgentNKey string `cbor:"1,keyasint"`
}

// EnrolOffer is the executor's answer to Enrol. With Pending, it carries
// what the agent needs to make the request — the network half of the
// token (never its secret), the public keys, the proof over them — and the
// machine's profile and inventory for the control side.
type EnrolOffer struct {
	Pending     bool      `cbor:"1,keyasint"`
	Token       string    `cbor:"2,keyasint,omitempty"` // the token id, hex
	Expires     int64     `cbor:"3,keyasint,omitempty"` // unix seconds
	BrokerURL   string    `cbor:"4,keyasint,omitempty"`
	Fingerprint string    `cbor:"5,keyasint,omitempty"` // hex
	ControlKey  []byte    `cbor:"6,keyasint,omitempty"` // for the agent's own checks of declarations
	Credential  []byte    `cbor:"7,keyasint,omitempty"` // the one-time broker user's raw seed
	Keys        EnrolKeys `cbor:"8,keyasint"`
	Proof       []byte    `cbor:"9,keyasint,omitempty"`
	Hostname    string    `cbor:"10,keyasint,omitempty"`
	Profile     []byte    `cbor:"11,keyasint,omitempty"` // JSON
	Inventory   []byte    `cbor:"12,keyasint,omitempty"` // JSON
	// Granted, with no enrolment pending, is the grant the executor
	// accepted for the NKey the agent asked with (with BrokerURL,
	// Fingerprint and ControlKey of its token): an agent stopped between
	// the executor's recording and its own finishes from it.
	Granted []byte `cbor:"13,keyasint,omitempty"`
}

// GrantHandover brings the executor the grant envelope exactly as the
// control side sent it, or, with no envelope, why there is none: Final
// when the control side or the broker refused (the token is spent), not
// when they could not be reached (the agent tries again).
type GrantHandover struct {
	Envelope  []byte `cbor:"1,keyasint,omitempty"`
	RefusedBy string `cbor:"2,keyasint,omitempty"` // control, broker, agent
	Reason    string `cbor:"3,keyasint,omitempty"`
	Final     bool   `cbor:"4,keyasint,omitempty"`
	// StoreCopy, beside a grant, is the control side's signed copy of
	// what the node last reported it owns (purpose store-copy).
	StoreCopy []byte `cbor:"5,keyasint,omitempty"`
}

// GrantReply answers a GrantHandover.
type GrantReply struct {
	Enrolled  bool   `cbor:"1,keyasint"`
	Node      string `cbor:"2,keyasint,omitempty"`
	Enrolment string `cbor:"3,keyasint,omitempty"`
	Reason    string `cbor:"4,keyasint,omitempty"`
	// Recovered: how many entries of a store copy were taken in (the
	// store was lost); the copy is ignored when the store is intact.
	Recovered int `cbor:"5,keyasint,omitempty"`
}

// Profile asks the executor for the machine's profile and inventory.
type Profile struct{}

// ProfileReply is the profile and inventory as the executor last found
// them (JSON each), and their digest (StatusReply.ProfileDigest).
type ProfileReply struct {
	Profile   []byte `cbor:"1,keyasint"`
	Inventory []byte `cbor:"2,keyasint"`
	Digest    string `cbor:"3,keyasint"`
}

// Plan carries a plan request's envelope exactly as published (signed by
// the control plane for PurposePlan; PlanRequest its payload).
type Plan struct {
	Envelope []byte `cbor:"1,keyasint"`
}

// PlanRequest is what the control side signs to ask a node for a plan:
// addressed to the node and its enrolment, named (ID, which the node's
// answer carries), good until NotAfter, and the declaration to plan.
type PlanRequest struct {
	Node        string          `json:"node"`
	Enrolment   string          `json:"enrolment"`
	ID          string          `json:"id"`
	NotAfter    time.Time       `json:"not_after"`
	Declaration json.RawMessage `json:"declaration"`
}

// PlanWithin is how long a plan request is good for.
const PlanWithin = 5 * time.Minute

// The words of a plan request refused for its time, by the executor or by
// the agent, in one place: the control side finds them (IsPlanTimeRefusal)
// to add how far the node's clock is off, since such a refusal is as often
// a clock that is off as a request that is late.
const (
	planPastWords  = "the plan request was good until "
	planFarWords   = "the plan request is good until "
	planClockWords = "this node's clock reads "
)

// PlanPast is the refusal of a plan request past its time at now, by this
// node's clock; why, when not "", says why it came late.
func PlanPast(notAfter, now time.Time, why string) string {
	if why != "" {
		why += "; "
	}
	return planPastWords + notAfter.UTC().Format(time.RFC3339) + "; it is past (" + why + planClockWords + now.UTC().Format(time.RFC3339) + ")"
}

// PlanTooFar is the refusal of a plan request good for longer than
// PlanWithin from now, by this node's clock.
func PlanTooFar(notAfter, now time.Time) string {
	return planFarWords + notAfter.UTC().Format(time.RFC3339) + ", further off than " + PlanWithin.String() + " (" + planClockWords + now.UTC().Format(time.RFC3339) + ")"
}

// IsPlanTimeRefusal says whether a refusal's text is PlanPast's or
// PlanTooFar's.
func IsPlanTimeRefusal(refused string) bool {
	return strings.Contains(refused, planPastWords) || strings.Contains(refused, planFarWords)
}

// PlanReply is what the declaration would do: the lines an apply would
// report, nothing changed. Diffs, by "module.id", are shown only for
// files the mesh holds and that are as it wrote them (so a plan never
// shows content the control plane did not declare); Refused says why the
// executor would not plan it.
type PlanReply struct {
	Outcome shapes.Outcome    `cbor:"1,keyasint"`
	Lines   []shapes.Line     `cbor:"2,keyasint"`
	Diffs   map[string]string `cbor:"3,keyasint,omitempty"`
	Code    Code              `cbor:"4,keyasint"`
	Refused string            `cbor:"5,keyasint,omitempty"`
}

// KeyRotations carries the statements of the control key's rotations
// (KeyRotation envelopes, oldest first) exactly as published; none asks
// only which key is in force.
type KeyRotations struct {
	Envelopes [][]byte `cbor:"1,keyasint,omitempty"`
}

// KeyRotationReply is the control key in force once the executor has
// judged the statements (identity.TakeRotations), how many it took, and
// why it refused one.
type KeyRotationReply struct {
	ControlKey []byte `cbor:"1,keyasint"`
	Taken      int    `cbor:"2,keyasint,omitempty"`
	Refused    string `cbor:"3,keyasint,omitempty"`
}
