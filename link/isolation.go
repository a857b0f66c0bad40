package link

import "github.com/nox-mesh/nox-mesh-host/wire"

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

// ServiceImports are what CONTROL exports and NODES imports.
var ServiceImports = []ServiceImport{
	// Declarations: the last-by-subject direct get of one node subject.
	// The subject is in the request's subject, not its body, so a
	// permission can hold a node to its own (the form with a body names
	// the subject inside it, and is not imported).
	{"$JS.API.DIRECT.GET." + DeclStream + ".mesh.decl.*", APIPrefix + ".DIRECT.GET." + DeclStream + ".mesh.decl.*", ""},
	{"mesh.report.*", "", ""},
	{"mesh.heartbeat.*", "", ""},
	// Archives: a direct get of the archive store's stream, and nothing
	// else of it (no put, no delete, no purge, no consumer, no info).
	{"$JS.API.DIRECT.GET." + ArchiveStream, ArchiveGet, ""},
	// The roster: the last-by-subject direct get of its one subject (the
	// same for every node: it is the mesh's, signed, and no secret).
	{"$JS.API.DIRECT.GET." + RosterStream + "." + RosterSubject, RosterGet, ""},
	// Enrolment: a request to the responder, one answer back.
	{wire.EnrolSubjectPrefix + ".*", "", "singleton"},
}

// StreamExports are the core-NATS subjects CONTROL publishes and NODES
// hears: the notices that a node's subject has a new declaration, and that
// there is a new roster.
var StreamExports = []string{NoticePrefix + ".*", RosterNotice, PlanPrefix + ".*"}

// NodePermissions are what node may do on the broker (in account NODES),
// and nothing else:
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
// No consumer (nothing on the broker is kept per node but its subjects'
// messages: a consumer per node is state the broker recovers at start and
// replicates in a cluster, N times), no other JetStream or KV API (NODES
// imports no other), no other node's subjects, no wider inbox. The archive store is
// read-only to nodes and shared: every node may read every archive (they
// are pinned by digest in signed declarations, not secrets); none may put,
// delete or purge one.
func NodePermissions(node string) (publish, subscribe []string) {
	s := SubjectsOf(node)
	return []string{s.DeclGet, s.Report, s.Heartbeat, s.ArchiveGet, s.RosterGet},
		[]string{s.Inbox + ".>", s.Notice, s.RosterNotice, s.Plan}
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
