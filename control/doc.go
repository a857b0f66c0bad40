// Package control is mesh-control, the reference control side: the
// control-plane signing key, the broker's TLS certificate, the node
// registry, signing and publishing declarations, and reading back what
// nodes report. It is never needed on a node.
//
// It keeps nothing on disk but its keys (Init writes them in one directory,
// 0700). Every other piece of state lives in JetStream on the broker — the
// node registry in the key-value bucket mesh_nodes, declarations, reports
// and heartbeats in streams — so several mesh-control processes can run
// against one NATS. By default `serve` embeds that NATS (TLS with the
// certificate made by Init, JetStream, NKey users only); with --nats URL it
// uses an existing one.
//
// On the broker:
//
//	stream MESH_DECL       mesh.decl.*       declarations (COSE envelopes); limits retention,
//	                                         link.DeclsPerNode kept per node, direct get
//	                                         allowed: a node reads the newest of its own
//	                                         subject, nothing is kept per node (no consumer);
//	                                         each is published on top of the last read, in
//	                                         sequence order, and noticed on mesh.notice.<n>
//	                                         (the notice carries the envelope)
//	stream MESH_REPORT_<i> mesh.report.<i>.* reports, 2048 kept per node, spread over four
//	                                         streams by the node's name: CONTROL maps
//	                                         mesh.report.<n> to mesh.report.<i>.<n>
//	                                         (link.ReportMapping), so that their writes are
//	                                         synced side by side; sequences from 2^40
//	stream MESH_REPORT     mesh.report.*     reports through a broker without the mapping
//	stream MESH_HEARTBEAT  mesh.heartbeat.*  heartbeats, 16 kept per node
//	KV mesh_nodes          node.<n>          the node record: nkey, enrolment, next sequence
//	                       report.<n>        the last report that is not a superseded one
//	                       profile.<n>       what the node last said it can do and is
//	                       (the last heartbeat is not here: MESH_HEARTBEAT keeps it, read by Nodes)
//	                       overlay.settings  the overlay: network, interface, port, keepalive
//	                       address.<n>       the node's overlay address; ip.<a> its claim on it
//	                       endpoint.<n>      where its peers reach it (given by a person)
//	                       assign.<n>        its assigned modules, in order
//	                       joined.<n>        the enrolment it reported its overlay applied in
//	                       composed.<n>      the digest and sequence of what it was last sent
//
// The embedded broker has an account for the control side, CONTROL
// (JetStream), one for each node (named as the node, no JetStream), and
// NODES for the enrolment tokens (an existing broker's nodes share NODES:
// AccountsConfig says why), joined by service imports (and the stream exports of
// the notices, core NATS); each node's account imports only its own
// subjects (link.NodeImports; the embedded broker those of the layouts its
// agents link in, link.NodeImportsOf), and its one user, the node's NKey, has
// permissions for exactly those (link.NodePermissions). The split exists
// because a NATS permission limits what a client publishes, not the reply
// subject it names: a service answers onto that reply in the account the
// request came from, so in an account shared with the control side a node
// could have JetStream answer onto mesh.decl.<other>, and in one shared
// with other nodes onto their notice subjects (tried, and tested against in
// TestNodeIsolation and TestNoNodeReachesAnotherThroughReplies).
// Reports and heartbeats also carry the node's NKey signature in the
// Mesh-Signature header, and the control side records only those that
// verify against the node's registered key.
//
// The node identity written by `node add` (a config file holding the
// node's NKey seed) is temporary: enrolment, a later issue, replaces it.
package control
