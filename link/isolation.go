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
	{"$JS.API.CONSUMER.INFO." + DeclStream + ".*", APIPrefix + ".CONSUMER.INFO." + DeclStream + ".*", ""},
	{"$JS.API.CONSUMER.MSG.NEXT." + DeclStream + ".*", APIPrefix + ".CONSUMER.MSG.NEXT." + DeclStream + ".*", "stream"},
	{"$JS.ACK." + DeclStream + ".*.>", "", ""},
	{"mesh.report.*", "", ""},
	{"mesh.heartbeat.*", "", ""},
	// Archives: a direct get of the archive store's stream, and nothing
	// else of it (no put, no delete, no purge, no consumer, no info).
	{"$JS.API.DIRECT.GET." + ArchiveStream, ArchiveGet, ""},
	// Enrolment: a request to the responder, one answer back.
	{wire.EnrolSubjectPrefix + ".*", "", "singleton"},
}

// NodePermissions are what node may do on the broker (in account NODES),
// and nothing else:
//
//	publish    mesh.api.CONSUMER.INFO.MESH_DECL.node-<n>      bind its consumer
//	           mesh.api.CONSUMER.MSG.NEXT.MESH_DECL.node-<n>  pull its declarations
//	           $JS.ACK.MESH_DECL.node-<n>.>                   ack (nak, in-progress) them
//	           mesh.report.<n>, mesh.heartbeat.<n>            report upward
//	           mesh.api.DIRECT.GET.OBJ_MESH_ARCHIVES          read archives (all nodes)
//	subscribe  _INBOX.<n>.>                                   its own replies
//
// No consumer creation (its consumer is made by the control side with the
// filter mesh.decl.<n>), no other JetStream or KV API (NODES imports no
// other), no other node's subjects, no wider inbox. The archive store is
// read-only to nodes and shared: every node may read every archive (they
// are pinned by digest in signed declarations, not secrets); none may put,
// delete or purge one.
func NodePermissions(node string) (publish, subscribe []string) {
	s := SubjectsOf(node)
	return []string{s.ConsumerInfo, s.ConsumerNext, s.AckPrefix + ".>", s.Report, s.Heartbeat, s.ArchiveGet},
		[]string{s.Inbox + ".>"}
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
