// Package link is the contract of the link between the agent and the
// control side, over NATS, as wire is the contract of the local socket:
// the streams and subjects, what each side may do on the broker (the
// isolation rules), the messages upward (reports, heartbeats) and the
// signature that makes them the node's own, and the broker's pinned TLS.
// The agent and the control side both import it, and nothing else of each
// other's, so the two cannot drift apart.
//
// It decides nothing and connects nowhere: no NATS client, no file.
package link
