// Package agent is mesh-agent, the unprivileged half of the split: it holds
// the outbound link to the broker and nothing root-only.
//
// It drops every privilege in code before it touches the network (groups,
// uid and gid, no-new-privileges, an empty capability set), so it is
// confined under every init. Without an identity it stays up idle and never
// dials. With one, it connects out to NATS over TLS with the broker's
// certificate checked against a pinned SHA-256 fingerprint inside the
// handshake, authenticates with its own NKey, and reads the newest
// declaration on its own subject by a JetStream direct get — at every
// (re)connect and on a jittered timer for notices lost. While linked, the
// control side's notice of a new declaration carries it (the envelope and
// its stream sequence), and the agent takes it from there without a read;
// a notice that carries none, from an older control side, is a word to
// read. Nothing on the broker is kept per node but the subject's few
// messages: no consumer, no ack.
//
// The drain: the newest message, if it is not the one last settled, is
// verified against the pinned control-plane key (wire.Open), parsed as a
// link declaration (shapes.Parse: no action), and checked for this node,
// this enrolment and a sequence not older than the last applied. What fails
// is reported upward as refused and never reaches the executor. What passes
// is forwarded, as the exact bytes published; after the executor's verdict
// the sequences between the last settled and it — which the agent never
// needs to read — are reported superseded by it in one report (a range),
// naming its outcome. The signed report is the acknowledgement: until it is
// on the broker the message is not settled, and is read again.
// The executor verifies everything again: the agent is trusted for nothing,
// and its checks exist to refuse early and legibly and to keep garbage off
// the socket.
//
// Names on the broker (one node's subjects; see link.Subjects):
//
//	mesh.decl.<node>       declarations, stream MESH_DECL, the last few kept
//	mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.<node>
//	                       the direct get of the newest, as the node reaches it (APIPrefix)
//	mesh.notice.<node>     the control side's word that there is a newer one, carrying it (core NATS)
//	mesh.report.<node>     reports upward, stream MESH_REPORT_<i> (the broker maps the
//	                       subject to its partition, link.ReportMapping)
//	mesh.heartbeat.<node>  heartbeats upward, stream MESH_HEARTBEAT
//	_INBOX.<node>.>        the node's own reply inboxes
//
// Reports and heartbeats carry the node's NKey signature (SignatureHeader).
//
// The identity comes, for now, from a config file the control side writes
// (mesh-control node add). Enrolment (a later issue) replaces that file with
// a grant signed by the control plane.
package agent
