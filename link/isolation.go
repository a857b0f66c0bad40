package link

import (
	"slices"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The broker's accounts. The control side and its JetStream live in
// CONTROL; nodes live in NODES, which has no JetStream and reaches CONTROL
// only through the service imports below. That split is what keeps a node
// off other nodes' declarations even through the broker's own replies: a
// NATS permission limits the subjects a client publishes to, not the reply
// subject it names, and within one account a node could have JetStream
// answer "into" mesh.decl.<other> (it answers any reply subject, and a
// stream stores what lands on its subjects). Across a service import the
// answer goes to a private _R_ subject and back into NODES, where no stream
// listens.
const (
	AccountControl = "CONTROL"
	AccountNodes   = "NODES"
)

// ServiceImport is one service CONTROL exports and NODES imports: the
// subject in CONTROL, the subject nodes use (To; "" is the same), and the
// response type ("" singleton by default, "stream", "singleton").
type ServiceImport struct{ Subject, To, Response string }

// ServiceImports are what CONTROL exports and NODES imports: each service
// once for each layout whose name for it differs.
var ServiceImports = []ServiceImport{
	// Declarations: the last-by-subject direct get of one node subject.
	// The subject is in the request's subject, not its body, so a
	// permission can hold a node to its own (the form with a body names
	// the subject inside it, and is not imported).
	{"$JS.API.DIRECT.GET." + DeclStream + ".mesh.decl.*", APIPrefix + ".DIRECT.GET." + DeclStream + ".mesh.decl.*", ""},
	{"$JS.API.DIRECT.GET." + DeclStream + ".mesh.decl.*", UpPrefix + ".*.decl", ""},
	{"mesh.report.*", "", ""},
	{"mesh.report.*", UpPrefix + ".*.report", ""},
	{"mesh.heartbeat.*", "", ""},
	{"mesh.heartbeat.*", UpPrefix + ".*.heartbeat", ""},
	// Archives: a direct get of the archive store's stream, and nothing
	// else of it (no put, no delete, no purge, no consumer, no info).
	{"$JS.API.DIRECT.GET." + ArchiveStream, ArchiveGet, ""},
	{"$JS.API.DIRECT.GET." + ArchiveStream, UpPrefix + ".*.archive", ""},
	// The roster: the last-by-subject direct get of its one subject (the
	// same for every node: it is the mesh's, signed, and no secret).
	{"$JS.API.DIRECT.GET." + RosterStream + "." + RosterSubject, RosterGet, ""},
	{"$JS.API.DIRECT.GET." + RosterStream + "." + RosterSubject, UpPrefix + ".*.roster", ""},
	// Enrolment: a request to the responder, one answer back.
	{wire.EnrolSubjectPrefix + ".*", "", "singleton"},
}

// Notices are the core-NATS subjects CONTROL publishes and NODES hears:
// the notices that a node's subject has a new declaration, that there is
// a new roster, and the plan requests (of LayoutByKind, and under the
// notice of LayoutByNode). NODES exports them as services and CONTROL
// imports them, the reverse of the doors above: a service import is one
// subscription in CONTROL for every node, where a stream import would
// mirror each node's own subscription into CONTROL (three a node, 1.5 KiB
// at 10,000 nodes). Nothing answers them and nothing in CONTROL hears
// them. Each export names the one account that may import it. A notice
// so carries the broker's Nats-Request-Info header (CONTROL's account and
// its connection's round trip, nothing of another node's), as reports and
// heartbeats carry it the other way; the agent reads no header of a
// notice but the sequence's. Not mesh.notice.>: a node of LayoutByNode
// has its inbox under its notice subject, and answers to its requests
// come back there from the doors above, not from CONTROL's publishes.
var Notices = []string{NoticePrefix + ".*", NoticePrefix + ".*.plan", RosterNotice, PlanPrefix + ".*"}

// NodePermissions are what node may do on the broker (in account NODES)
// in layout l, and nothing else. LayoutByKind:
//
//	publish    mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.<n>  read its newest declaration
//	           mesh.report.<n>, mesh.heartbeat.<n>          report upward (the report is the ack)
//	           mesh.api.DIRECT.GET.OBJ_MESH_ARCHIVES        read archives (all nodes)
//	           mesh.api.DIRECT.GET.MESH_ROSTER.mesh.roster  read the mesh's roster (all nodes)
//	subscribe  _INBOX.<n>.>                                 its own replies
//	           mesh.notice.<n>                              hear that there is a newer one
//	           mesh.roster-notice                           hear that there is a new roster
//	           mesh.plan.<n>                                hear a plan request (answered on mesh.report.<n>)
//
// LayoutByNode, the same doors under other names:
//
//	publish    mesh.up.<n>.>          .decl (read its newest), .report, .heartbeat,
//	                                  .archive (read archives: all nodes alike),
//	                                  .roster (read the mesh's roster: all nodes alike)
//	subscribe  mesh.notice.<n>        hear that there is a newer one
//	           mesh.notice.<n>.>      .inbox.* (its replies), .plan (plan requests)
//	           mesh.roster-notice     hear that there is a new roster
//
// In NODES nothing but ServiceImports answers under mesh.up, nothing
// listens there, and nothing but the control side's notices and plan
// requests (Notices) and the answers to a node's own requests speak
// under mesh.notice, so the wildcards give a node no more than the list. No consumer (nothing on the broker is kept per node
// but its subjects' messages: a consumer per node is state the broker
// recovers at start and replicates in a cluster, N times), no other
// JetStream or KV API (NODES imports no other), no other node's subjects,
// no wider inbox. The archive store is read-only to nodes and shared:
// every node may read every archive (they are pinned by digest in signed
// declarations, not secrets); none may put, delete or purge one.
func NodePermissions(node string, l Layout) (publish, subscribe []string) {
	s := NodeSubjects(node, l)
	if l == LayoutByNode {
		return []string{UpPrefix + "." + node + ".>"},
			[]string{s.Notice, s.Notice + ".>", s.RosterNotice}
	}
	return []string{s.DeclGet, s.Report, s.Heartbeat, s.ArchiveGet, s.RosterGet},
		[]string{s.Inbox + ".>", s.Notice, s.RosterNotice, s.Plan}
}

// NodePermissionsEither is both layouts' permissions at once, for where
// one node's permissions are written before it connects (a broker's
// configuration file, the user JWT of its grant): its agent may be of
// either layout.
func NodePermissionsEither(node string) (publish, subscribe []string) {
	p1, s1 := NodePermissions(node, LayoutByKind)
	p2, s2 := NodePermissions(node, LayoutByNode)
	union := func(a, b []string) []string {
		for _, x := range b {
			if !slices.Contains(a, x) {
				a = append(a, x)
			}
		}
		return a
	}
	return union(p1, p2), union(s1, s2)
}

// EnrolPermissions are what a token's one-time credential may do: make
// its one enrolment request and hear the answer. Nothing else — not even
// read the declarations stream or the archives.
//
//	publish    mesh.enrol.<token id>
//	subscribe  _INBOX.enrol-<token id>.>
func EnrolPermissions(tokenID string) (publish, subscribe []string) {
	return []string{wire.EnrolSubjectPrefix + "." + tokenID}, []string{EnrolInbox(tokenID) + ".>"}
}
