package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StateRevoked is a node's state in `nodes` once its identity is revoked
// (node revoke, or a token issued --node and not used yet), whatever its
// last heartbeat said: the broker refuses it, so that heartbeat is the
// last it sends as this enrolment.
const StateRevoked = "revoked"

// IsRevoked reports whether r's identity is revoked: no NKey the broker
// lets in, until a machine enrols as the node again.
func (r *NodeRecord) IsRevoked() bool { return r.NKey == "" || !r.Revoked.IsZero() }

// RevokedError is returned by Declare and Assign for a revoked node, and
// by what names one node to publish to. Nothing signed for it can reach a
// machine (the broker refuses its identity), and what is signed for its
// revoked enrolment is refused by the node once enrolled again: taking a
// sequence for it would only hide that the node is not there.
type RevokedError struct {
	Node  string
	Since time.Time
	// Token is a re-enrolment token issued for the node and not used yet
	// ("" when there is none), usable until TokenExpires.
	Token        string
	TokenExpires time.Time
}

func (e *RevokedError) Error() string {
	s := fmt.Sprintf("node %s is revoked (since %s): the broker refuses its identity and nothing is signed for it", e.Node, e.Since.Local().Format(time.RFC3339))
	if e.Token != "" {
		return s + fmt.Sprintf("; token %s, issued for it, enrols a machine as %s again until %s (mesh-executor enrol on that machine): declare once it has", e.Token, e.Node, e.TokenExpires.Local().Format(time.RFC3339))
	}
	return s + fmt.Sprintf("; to enrol a machine as it again: mesh-control token issue --node %s, then mesh-executor enrol on that machine", e.Node)
}

// revokedError says that rec is revoked, with the re-enrolment token
// pending for it, if any.
func (c *Client) revokedError(ctx context.Context, rec *NodeRecord) *RevokedError {
	e := &RevokedError{Node: rec.Name, Since: rec.Revoked}
	ts, _ := c.tokens(ctx)
	now := time.Now()
	for _, t := range ts {
		if t.Node == rec.Name && !t.New && t.Used.IsZero() && t.Revoked.IsZero() && now.Before(t.Expires) &&
			(e.Token == "" || t.Expires.After(e.TokenExpires)) {
			e.Token, e.TokenExpires = t.ID, t.Expires
		}
	}
	return e
}

// refuseRevoked returns a *RevokedError when node is revoked, the
// registry's error when it is not there, and nil otherwise.
func (c *Client) refuseRevoked(ctx context.Context, node string) error {
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return err
	}
	if rec.IsRevoked() {
		return c.revokedError(ctx, rec)
	}
	return nil
}

// Revoke revokes node's identity as RevokeNode does, and says whether it
// was revoked already: then nothing is changed, and rec says since when.
// It is what `node revoke` runs, so a person is never told that a second
// revocation did something.
func (c *Client) Revoke(ctx context.Context, name, why string) (rec *NodeRecord, already bool, err error) {
	for attempt := 0; attempt < 100; attempt++ {
		rec, rev, err := c.Node(ctx, name)
		if err != nil {
			return nil, false, err
		}
		if rec.IsRevoked() {
			return rec, true, nil
		}
		rec.NKey, rec.Revoked = "", time.Now().UTC()
		data, _ := json.Marshal(rec)
		if _, err = c.KV.Update(ctx, nodeKey(name), data, rev); err == nil {
			c.log.Info("node revoked", "node", name, "why", why)
			return rec, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, false, fmt.Errorf("registry: %w", err)
		}
	}
	return nil, false, fmt.Errorf("registry: node %s kept changing; not revoked", name)
}
