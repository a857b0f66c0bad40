// Package agent is mesh-agent, the unprivileged half of the split: it holds
// the outbound link to the broker and nothing root-only.
//
// It drops every privilege in code before it touches the network (groups,
// uid and gid, no-new-privileges, an empty capability set), so it is
// confined under every init. Without an identity it stays up idle and never
// dials. With one, it connects out to NATS over TLS with the broker's
// certificate checked against a pinned SHA-256 fingerprint inside the
// handshake, authenticates with its own NKey, and pulls its declarations
// from a durable JetStream consumer.
//
// The drain: everything waiting is fetched, each envelope verified against
// the pinned control-plane key (wire.Open), parsed as a link declaration
// (shapes.Parse: no action), and checked for this node, this enrolment and a
// sequence not older than the last applied. What fails is reported upward as
// refused and never reaches the executor. Of the rest only the newest is
// forwarded, as the exact bytes published; after the executor's verdict each
// older one is reported superseded, naming the one applied (or refused).
// The executor verifies everything again: the agent is trusted for nothing,
// and its checks exist to refuse early and legibly and to keep garbage off
// the socket.
//
// Names on the broker (one node's subjects; see Subjects):
//
//	mesh.decl.<node>       declarations, stream MESH_DECL, durable pull consumer node-<node>
//	mesh.api.CONSUMER.{INFO,MSG.NEXT}.MESH_DECL.node-<node>
//	                       the JetStream API as the node reaches it (APIPrefix)
//	$JS.ACK.MESH_DECL.node-<node>.>  its acks
//	mesh.report.<node>     reports upward, stream MESH_REPORT
//	mesh.heartbeat.<node>  heartbeats upward, stream MESH_HEARTBEAT
//	_INBOX.<node>.>        the node's own reply inboxes
//
// Reports and heartbeats carry the node's NKey signature (SignatureHeader).
//
// The identity comes, for now, from a config file the control side writes
// (mesh-control node add). Enrolment (a later issue) replaces that file with
// a grant signed by the control plane.
package agent
