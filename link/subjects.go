package link

import (
	"fmt"
	"strings"
)

// The streams the control side creates and the agent uses.
const (
	// DeclStream holds declarations, subjects mesh.decl.*, retention
	// limits, a few messages per subject (DeclsPerNode), direct get
	// allowed: a node reads the newest on its own subject (DeclGet) and
	// nothing keeps per-node state on the broker.
	DeclStream = "MESH_DECL"
	// ReportStream holds reports upward, subjects mesh.report.*, from
	// a broker without the partitions' mapping; a broker with it puts
	// them in ReportStream_<i> (link.ReportPlaces).
	ReportStream = "MESH_REPORT"
	// HeartbeatStream holds heartbeats, subjects mesh.heartbeat.*.
	HeartbeatStream = "MESH_HEARTBEAT"
	// ArchiveBucket is the object store of archives, each named by its
	// sha256 (hex); ArchiveStream is the stream behind it.
	ArchiveBucket = "MESH_ARCHIVES"
	ArchiveStream = "OBJ_" + ArchiveBucket
	// RosterStream holds the mesh's roster (shapes.Roster, signed,
	// wire.PurposeRoster) on one subject, RosterSubject: the overlay's
	// peers, published once per change for every node instead of copied
	// into each node's declaration. Direct get allowed; every node reads
	// the newest (RosterGet).
	RosterStream  = "MESH_ROSTER"
	RosterSubject = "mesh.roster"
)

// RosterGet is the last-by-subject direct get of the roster, as a node
// makes it (under APIPrefix), with no body.
const RosterGet = APIPrefix + ".DIRECT.GET." + RosterStream + "." + RosterSubject

// RosterNotice is where the control side says, on core NATS, that a new
// roster is published (the body its stream sequence: a hint, as a node's
// notice). One subject for the mesh, heard by every node. It is not under
// NoticePrefix, whose one token is a node's name.
const RosterNotice = "mesh.roster-notice"

// RostersKept is how many rosters RosterStream keeps: a node reads only
// the newest; the one before is there for a person looking back.
const RostersKept = 2

// DeclsPerNode is how many declarations DeclStream keeps on each node's
// subject. A node reads only the newest; the few before it are there for
// a person looking back (and for the ordering check of Declare), not for
// the node. The count is per subject, so the stream grows with N, never
// with how often one node is declared to.
const DeclsPerNode = 8

// SeqHeader carries a declaration's sequence beside its envelope, for the
// control side's own ordering of what it publishes (a newer declaration on
// the subject already means an older one is not put after it). The agent
// never reads it: the signed sequence inside the envelope is the only one
// it trusts.
const SeqHeader = "Mesh-Seq"

// The headers a direct get answers with, beside the message's own.
const (
	HeaderSequence  = "Nats-Sequence"   // the message's stream sequence
	HeaderSubject   = "Nats-Subject"    // the subject it was stored on
	HeaderTimeStamp = "Nats-Time-Stamp" // when the broker stored it, by its clock (RFC 3339)
)

// ArchiveGet is the one request a node may make of the archive store: a
// direct get of one of its messages (an object's metadata, the next chunk
// of an object), read-only. The object store's own client API needs
// consumers, which a node may not create.
const ArchiveGet = APIPrefix + ".DIRECT.GET." + ArchiveStream

// NoticePrefix is the subjects of the notices, one per node.
const NoticePrefix = "mesh.notice"

// PlanPrefix is the subjects of plan requests, one per node (core NATS,
// like the notices): the node answers on its report subject.
const PlanPrefix = "mesh.plan"

// APIPrefix is the JetStream API as a node sees it. Nodes live in their
// own broker account without JetStream, and reach the control account's
// JetStream through service imports mapped under this prefix (the plain
// $JS.API subjects of an account without JetStream answer "not enabled").
const APIPrefix = "mesh.api"

// Subjects are one node's names on the broker. Everything a node may touch
// is derived here, so the control side's permissions and the agent's use of
// them cannot drift apart.
type Subjects struct {
	Node      string
	Decl      string // mesh.decl.<node>: where its declarations are published
	Report    string // mesh.report.<node>
	Heartbeat string // mesh.heartbeat.<node>
	Inbox     string // _INBOX.<node>: the prefix of its reply subjects
	// DeclGet is the one JetStream request a node makes of its
	// declarations, as it makes it (under APIPrefix): a direct get of the
	// last message on Decl, with no body. The answer carries the envelope,
	// its stream sequence (HeaderSequence), or status 404 when there is
	// none.
	DeclGet string
	// Notice is where the control side says, on core NATS, that Decl has
	// a new message, and hands it over (NoticeMsg): its envelope as the
	// body, its stream sequence in HeaderSequence. A linked node so needs
	// no read (a fan-out to 10,000 nodes was 20,000 more messages through
	// the broker's service imports). Unsigned, a hint, never a fact: the
	// envelope is checked as a read one is, and lost notices cost a wait,
	// not a declaration — the agent also reads at every (re)connect and
	// on a timer.
	Notice string
	// ArchiveGet reads the archive store (shared by all nodes, read-only).
	ArchiveGet string
	// RosterGet reads the mesh's roster, RosterNotice says there is a new
	// one (both the same for every node).
	RosterGet, RosterNotice string
	// Plan is where the control side asks the node for a plan (a signed
	// wire.PlanRequest); the answer is a report, trigger plan.
	Plan string
	// HeartbeatGet reads back the node's own newest heartbeat (a direct
	// get of the last message on Heartbeat, with no body): its time as
	// the node said it, beside the broker's time of receipt
	// (HeaderTimeStamp) — how far the node's clock is off the control
	// side's, measured as mesh-control nodes measures it. Nothing else of
	// the heartbeats, and no other node's.
	HeartbeatGet string
}

// SubjectsOf returns the names of node, which must be a valid node name:
// in CONTROL, and as a node of LayoutByKind uses them (NodeSubjects).
func SubjectsOf(node string) Subjects {
	return Subjects{
		Node:         node,
		Decl:         "mesh.decl." + node,
		Report:       "mesh.report." + node,
		Heartbeat:    "mesh.heartbeat." + node,
		Inbox:        "_INBOX." + node,
		DeclGet:      APIPrefix + ".DIRECT.GET." + DeclStream + ".mesh.decl." + node,
		Notice:       NoticePrefix + "." + node,
		ArchiveGet:   ArchiveGet,
		RosterGet:    RosterGet,
		RosterNotice: RosterNotice,
		Plan:         PlanPrefix + "." + node,
		HeartbeatGet: APIPrefix + ".DIRECT.GET." + HeartbeatStream + ".mesh.heartbeat." + node,
	}
}

// Layout is how a node's own subjects are named in the nodes' account.
// The names in CONTROL (the streams' subjects, the notices) are the same
// in both; only the names a node uses, and so its permissions, differ.
//
// LayoutByKind is the first: each of a node's subjects sits under its
// kind's prefix (mesh.report.<node>, mesh.plan.<node>, _INBOX.<node>, the
// JetStream API's direct get of mesh.decl.<node>), nine permission
// subjects up to eight tokens deep. LayoutByNode puts all a node
// publishes under mesh.up.<node> (its reads of the archives and the
// roster too, each under its own name though every node reads the same)
// and what it hears under its notice subject, mesh.notice.<node> (the
// notice itself, .inbox for its replies, .plan for plan requests): four.
// The broker builds a tree of every connection's permissions, a map per
// token, about 1.1 KiB a subject; at 10,000 nodes the trees were 11.5 KiB
// a node by kind, 6.6 by node with the shared reads under names of their
// own (mesh.get.archive, mesh.get.roster: never in a release;
// setPermissions' allocations in heap profiles of make bench-scale), 4.5
// as now: the largest part of the broker's memory per node after its
// client state.
//
// An agent asks for LayoutByNode by ending its connection's name with
// LayoutTag; any other connection is given LayoutByKind, so an agent of an
// earlier version keeps working against a newer control side; and an
// agent of this version against an earlier control side, which refuses
// its publishes by node, links again by kind (agent.earlierLayout). Which
// layout a node asks for is no privilege: each holds it to its own
// subjects alike.
type Layout int

const (
	LayoutByKind Layout = iota
	LayoutByNode
)

// LayoutTag ends the connection name of an agent that uses LayoutByNode.
const LayoutTag = "link/by-node"

// LayoutOf is the layout a connection named name asks for.
func LayoutOf(name string) Layout {
	if strings.HasSuffix(name, " "+LayoutTag) {
		return LayoutByNode
	}
	return LayoutByKind
}

// UpPrefix is where a node of LayoutByNode publishes, under its name:
// its reads (.decl, and the two every node shares, .archive and .roster),
// its reports and heartbeats. One permission subject, UpPrefix.<node>.>,
// covers them all.
const UpPrefix = "mesh.up"

// NodeSubjects are node's names as its agent uses them in layout l (the
// names in CONTROL, Decl among them, are SubjectsOf's in both).
func NodeSubjects(node string, l Layout) Subjects {
	s := SubjectsOf(node)
	if l == LayoutByNode {
		up := UpPrefix + "." + node
		s.DeclGet, s.Report, s.Heartbeat = up+".decl", up+".report", up+".heartbeat"
		s.ArchiveGet, s.RosterGet = up+".archive", up+".roster"
		s.HeartbeatGet = up + ".heartbeat-get"
		s.Inbox, s.Plan = s.Notice+".inbox", s.Notice+".plan"
	}
	return s
}

// PlanSubjects are where the control side asks node for a plan: under
// each layout's name, so that an agent of either hears it.
func PlanSubjects(node string) []string {
	return []string{NodeSubjects(node, LayoutByKind).Plan, NodeSubjects(node, LayoutByNode).Plan}
}

// ValidNodeName checks that name can be one subject token, a consumer name
// and a file name: 1 to 63 of a-z, 0-9, '-' and '_', starting with a letter
// or digit. No dots, no wildcards, no upper case (two names differing only
// by case would be two nodes to NATS and one to a person).
func ValidNodeName(name string) error {
	if len(name) == 0 || len(name) > 63 {
		return fmt.Errorf("node name %q: 1 to 63 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return fmt.Errorf("node name %q: only a-z, 0-9, '-' and '_', starting with a letter or digit", name)
		}
	}
	return nil
}

// EnrolInbox is the reply-subject prefix of the one-time credential of
// token id: the only subjects it may subscribe to.
func EnrolInbox(tokenID string) string { return "_INBOX.enrol-" + tokenID }
