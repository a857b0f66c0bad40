package link

import (
	"slices"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The broker's accounts. The control side and its JetStream live in
// CONTROL; in the embedded broker each node lives in an account of its own
// (NodeAccount), which reaches CONTROL only through the imports below; the
// enrolment tokens, before they are nodes, live in NODES. (An existing
// broker keeps its nodes in NODES too, importing the same services with
// their wildcards: control.AccountsConfig says why.)
//
// A NATS permission limits the subject a client publishes to, never the
// reply subject it names, and a service answers onto that reply in the
// account the request came from. So wherever two nodes share an account,
// one node can have the broker deliver the answer to its own request (a
// read of its declaration or of the roster, a report's acknowledgement)
// onto the other's notice, plan or inbox subject. In an account of its
// own, the answer lands where only the node itself can hear it: the
// account, not the permission, is the fence. This is NATS' own way of
// isolating tenants (its documentation: accounts are isolated subject
// namespaces, joined only by explicit exports and imports); the exports
// hold each node to the imports that name it by account_token_position —
// the token of the subject at that position must be the importing
// account's name — so one export serves every node and no node can import
// another's.
const (
	AccountControl = "CONTROL"
	AccountNodes   = "NODES"
)

// NodeAccount is the name of node's own account: the node's name itself,
// which account_token_position compares with the node's token of each
// subject. Node names are lower case (ValidNodeName), so none is CONTROL
// or NODES, nor the broker's own $SYS or $G.
func NodeAccount(node string) string { return node }

// ServiceImport is one service CONTROL exports and each node's account
// imports: the subject in CONTROL, the subject the node uses (To; "" is
// the same), and Node, the position (from 1) of the node's token in
// Subject ("*" there), or 0 for what every node reads alike (the
// archives, the roster). In To, "*" is the node's name too.
type ServiceImport struct {
	Subject, To string
	Node        uint
}

// ServiceImports are what CONTROL exports and each node imports: each
// service once for each layout whose name for it differs.
var ServiceImports = []ServiceImport{
	// Declarations: the last-by-subject direct get of one node subject.
	// The subject is in the request's subject, not its body, so the export
	// holds a node to its own (the form with a body names the subject
	// inside it, and is not imported).
	{"$JS.API.DIRECT.GET." + DeclStream + ".mesh.decl.*", APIPrefix + ".DIRECT.GET." + DeclStream + ".mesh.decl.*", 8},
	{"$JS.API.DIRECT.GET." + DeclStream + ".mesh.decl.*", UpPrefix + ".*.decl", 8},
	{"mesh.report.*", "", 3},
	{"mesh.report.*", UpPrefix + ".*.report", 3},
	{"mesh.heartbeat.*", "", 3},
	{"mesh.heartbeat.*", UpPrefix + ".*.heartbeat", 3},
	// Its own newest heartbeat read back, for the broker's time of it
	// (Subjects.HeartbeatGet): last-by-subject, the subject in the
	// request's, as the declarations' read.
	{"$JS.API.DIRECT.GET." + HeartbeatStream + ".mesh.heartbeat.*", APIPrefix + ".DIRECT.GET." + HeartbeatStream + ".mesh.heartbeat.*", 8},
	{"$JS.API.DIRECT.GET." + HeartbeatStream + ".mesh.heartbeat.*", UpPrefix + ".*.heartbeat-get", 8},
	// Archives: a direct get of the archive store's stream, and nothing
	// else of it (no put, no delete, no purge, no consumer, no info).
	{"$JS.API.DIRECT.GET." + ArchiveStream, ArchiveGet, 0},
	{"$JS.API.DIRECT.GET." + ArchiveStream, UpPrefix + ".*.archive", 0},
	// The roster: the last-by-subject direct get of its one subject (the
	// same for every node: it is the mesh's, signed, and no secret).
	{"$JS.API.DIRECT.GET." + RosterStream + "." + RosterSubject, RosterGet, 0},
	{"$JS.API.DIRECT.GET." + RosterStream + "." + RosterSubject, UpPrefix + ".*.roster", 0},
}

// EnrolService is the one service NODES imports: an enrolment request
// to the responder, one answer back (a singleton response).
const EnrolService = wire.EnrolSubjectPrefix + ".*"

// Notice is one core-NATS subject CONTROL publishes and exports as a
// stream, and Node the position of the node's token in it ("*"), or 0
// for the one every node hears.
type Notice struct {
	Subject string
	Node    uint
}

// Notices are the notices that a node's subject has a new declaration,
// that there is a new roster, and the plan requests (of LayoutByKind, and
// under the notice of LayoutByNode). Each node's account imports its own
// as streams: a stream import puts a shadow of the node's subscription in
// CONTROL, one for each subject it hears. Nothing answers them. Not
// mesh.notice.>: a node of LayoutByNode has its inbox under its notice
// subject, and the answers to its requests come back there from the
// services above, in its own account, not from CONTROL's publishes.
var Notices = []Notice{{NoticePrefix + ".*", 3}, {NoticePrefix + ".*.plan", 3}, {RosterNotice, 0}, {PlanPrefix + ".*", 3}}

// NodeImports are the imports of node's account, each subject with the
// node's name in its place: services (the subject in CONTROL, and the
// node's name for it) and the notices it hears.
func NodeImports(node string) (services []ServiceImport, notices []string) {
	for _, si := range ServiceImports {
		to := si.To
		if to == "" {
			to = si.Subject
		}
		services = append(services, ServiceImport{Subject: strings.ReplaceAll(si.Subject, "*", node), To: strings.ReplaceAll(to, "*", node), Node: si.Node})
	}
	for _, n := range Notices {
		notices = append(notices, strings.ReplaceAll(n.Subject, "*", node))
	}
	return services, notices
}

// NodeImportsOf are those of NodeImports a node of layout l uses: the
// services its publish permissions reach, the notices its subscribe
// permissions hear (NodePermissions, the one place that says what each
// layout uses). The embedded broker imports into a node's account only
// the layouts its connections have asked for: each import costs the
// account a branch of its subject tree and an entry in CONTROL's
// (docs/benchmarks.md, "What an account per node costs").
func NodeImportsOf(node string, l Layout) (services []ServiceImport, notices []string) {
	pubs, subs := NodePermissions(node, l)
	all, allNotices := NodeImports(node)
	for _, si := range all {
		if permits(pubs, si.To) {
			services = append(services, si)
		}
	}
	for _, n := range allNotices {
		if permits(subs, n) {
			notices = append(notices, n)
		}
	}
	return services, notices
}

// permits says whether a permission of perms (NATS wildcards: "*" one
// token, ">" the rest) matches subject, which has none. Written here, not
// nats-server's matcher called: the agent links this package, and no
// broker.
func permits(perms []string, subject string) bool {
	toks := strings.Split(subject, ".")
	for _, p := range perms {
		pt := strings.Split(p, ".")
		for i, t := range pt {
			if t == ">" {
				if len(toks) > i {
					return true
				}
				break
			}
			if i >= len(toks) || t != "*" && t != toks[i] {
				break
			}
			if i == len(pt)-1 && len(toks) == len(pt) {
				return true
			}
		}
	}
	return false
}

// NodePermissions are what node may do on the broker, in its own account,
// in layout l, and nothing else. The account already confines what the
// node reaches; the permissions hold it, within its account, to the
// subjects its layout uses. LayoutByKind:
//
//	publish    mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.<n>  read its newest declaration
//	           mesh.report.<n>, mesh.heartbeat.<n>          report upward (the report is the ack)
//	           mesh.api.DIRECT.GET.MESH_HEARTBEAT.mesh.heartbeat.<n>
//	                                                        read back its own newest heartbeat (its clock)
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
//	                                  .heartbeat-get (read back its own newest heartbeat),
//	                                  .archive (read archives: all nodes alike),
//	                                  .roster (read the mesh's roster: all nodes alike)
//	subscribe  mesh.notice.<n>        hear that there is a newer one
//	           mesh.notice.<n>.>      .inbox.* (its replies), .plan (plan requests)
//	           mesh.roster-notice     hear that there is a new roster
//
// In the node's account nothing but its ServiceImports answers under
// mesh.up, nothing listens there, and nothing but its notices and plan
// requests (Notices) and the answers to its own requests speak under
// mesh.notice, so the wildcards give a node no more than the list. No consumer (nothing on the broker is kept per node
// but its subjects' messages: a consumer per node is state the broker
// recovers at start and replicates in a cluster, N times), no other
// JetStream or KV API (its account imports no other), no other node's subjects,
// no wider inbox. The archive store is read-only to nodes and shared:
// every node may read every archive (they are pinned by digest in signed
// declarations, not secrets); none may put, delete or purge one.
func NodePermissions(node string, l Layout) (publish, subscribe []string) {
	s := NodeSubjects(node, l)
	if l == LayoutByNode {
		return []string{UpPrefix + "." + node + ".>"},
			[]string{s.Notice, s.Notice + ".>", s.RosterNotice}
	}
	return []string{s.DeclGet, s.Report, s.Heartbeat, s.HeartbeatGet, s.ArchiveGet, s.RosterGet},
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
