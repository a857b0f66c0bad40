package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// registryKeysOf are the registry's keys of one node besides its record
// (node.<n>), in the order DeleteNode removes them: its assignments first,
// so the publisher, told of their removal, still finds the node (revoked:
// composed nothing) rather than logging that it is gone. The claim on its
// overlay address (ip.<address>) is found by its value.
func registryKeysOf(node string) []string {
	return []string{assignKey(node), composedKey(node), joinedKey(node), addressKey(node), endpointKey(node),
		"briefing." + node, "report." + node, "owned." + node, "profile." + node, twoAgentsKey(node)}
}

// LiveNodeError refuses to delete a node that is not revoked: its
// machine holds a credential the broker lets in, and deleting the record
// would leave that machine enrolled as a node the control side no longer
// knows.
type LiveNodeError struct{ Node string }

func (e *LiveNodeError) Error() string {
	return fmt.Sprintf("node %s is live (not revoked): revoke it first (mesh-control node revoke %s), then delete it", e.Node, e.Node)
}

// NodeDeleted says what DeleteNode removed.
type NodeDeleted struct {
	Node string `json:"node"`
	// Removed are the registry keys removed, the record last.
	Removed []string `json:"removed"`
	// Emptied are the node's subjects on the streams, emptied.
	Emptied []string `json:"emptied"`
	// TokensRevoked are the re-enrolment tokens issued for the node and
	// not used, revoked first: used after the record is gone, each would
	// be spent for an enrolment that cannot be granted.
	TokensRevoked []string `json:"tokens_revoked"`
}

// DeleteNode removes a revoked node from the control side so that its
// name can be used again: its re-enrolment tokens not yet used are
// revoked, its per-node registry keys and its address claim removed, its
// declarations, reports and heartbeats subjects emptied (what an earlier
// node of the name left there is never read as the new one's), and its
// record last — so a delete cut short (a full disk) leaves a revoked node
// that the same command deletes whole. A live node is refused
// (*LiveNodeError), as is a name the registry does not hold.
func (c *Client) DeleteNode(ctx context.Context, name string) (*NodeDeleted, error) {
	if err := link.ValidNodeName(name); err != nil {
		return nil, err
	}
	rec, _, err := c.Node(ctx, name)
	if err != nil {
		return nil, err
	}
	if !rec.IsRevoked() {
		return nil, &LiveNodeError{Node: name}
	}
	out := &NodeDeleted{Node: name, Removed: []string{}, Emptied: []string{}, TokensRevoked: []string{}}
	ts, err := c.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, t := range ts {
		if t.Node != name || t.New || t.State(now) != TokenUsable {
			continue
		}
		if _, _, err := c.RevokeToken(ctx, t.ID); err != nil {
			return out, fmt.Errorf("revoking token %s, issued to enrol a machine as %s again: %w", t.ID, name, err)
		}
		out.TokensRevoked = append(out.TokensRevoked, t.ID)
	}
	// Read again: a token spent before it was revoked enrolled the node
	// anew, and a live node is not deleted.
	rec, rev, err := c.Node(ctx, name)
	if err != nil {
		return out, err
	}
	if !rec.IsRevoked() {
		return out, fmt.Errorf("node %s was enrolled again meanwhile (enrolment %s): not deleted; %w", name, rec.Enrolment, &LiveNodeError{Node: name})
	}
	keys := registryKeysOf(name)
	claims, err := c.values(ctx, "ip.>")
	if err != nil {
		return out, err
	}
	for k, v := range claims {
		if string(v) == name {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		removed, err := c.purgeKey(ctx, k)
		if err != nil {
			return out, err
		}
		if removed {
			out.Removed = append(out.Removed, k)
		}
	}
	s := link.SubjectsOf(name)
	places := []link.StreamSubject{{Stream: link.DeclStream, Subject: s.Decl}}
	places = append(places, link.NodeReports(name)...)
	places = append(places, link.StreamSubject{Stream: link.HeartbeatStream, Subject: s.Heartbeat})
	for _, p := range places {
		st, err := c.JS.Stream(ctx, p.Stream)
		if err != nil {
			return out, fmt.Errorf("stream %s: %w", p.Stream, err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(p.Subject)); err != nil {
			return out, fmt.Errorf("emptying %s: %w", p.Subject, err)
		}
		out.Emptied = append(out.Emptied, p.Subject)
	}
	// The record last, and only as it was read: a node enrolled again in
	// the meantime is not deleted under it.
	if err := c.KV.Purge(ctx, nodeKey(name), jetstream.LastRevision(rev)); err != nil {
		if changedMeanwhile(err) {
			return out, fmt.Errorf("registry: %s changed while it was being deleted (enrolled again?): not removed; mesh-control node show %s says how it is", nodeKey(name), name)
		}
		return out, fmt.Errorf("registry: removing %s: %w", nodeKey(name), err)
	}
	out.Removed = append(out.Removed, nodeKey(name))
	c.log.Debug("node deleted", "node", name, "removed", len(out.Removed), "tokens_revoked", len(out.TokensRevoked))
	return out, nil
}

// purgeKey removes key from the registry if it is there, as it was read
// (a key changed meanwhile is an error, not removed unseen), and says
// whether it was there.
func (c *Client) purgeKey(ctx context.Context, key string) (bool, error) {
	e, err := c.KV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("registry: %s: %w", key, err)
	}
	if err := c.KV.Purge(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		if changedMeanwhile(err) {
			return false, fmt.Errorf("registry: %s changed while it was being removed: run node delete again", key)
		}
		return false, fmt.Errorf("registry: removing %s: %w", key, err)
	}
	return true, nil
}

// changedMeanwhile says whether a write made on a revision read was
// refused because the key has another now.
func changedMeanwhile(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
