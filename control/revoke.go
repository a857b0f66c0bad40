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

// noteRetired revokes node when the declaration seq of its enrolment, which
// its report says ran to its end, is the retirement the control side
// signed ("retire": its executor dropped the node's identity and is hosted
// again): the node's credential is let in no more, `nodes` says it is
// revoked rather than enrolled, and `node delete` frees its name. Asked by
// the recorder of a report its agent says retired the node
// (link.Report.Retired): the agent's word is held to what was signed.
func (c *Client) noteRetired(ctx context.Context, node, enrolment string, seq uint64) {
	last, err := c.lastOnSubject(ctx, node)
	if err != nil || last == nil {
		c.log.Warn("a node's report says it retired, and its last declaration could not be read to hold it to: not revoked (node revoke it)", "node", node, "seq", seq, "err", err)
		return
	}
	var d struct {
		Seq       uint64
		Enrolment string
		Retire    bool
	}
	json.Unmarshal(last["seq"], &d.Seq)
	json.Unmarshal(last["enrolment"], &d.Enrolment)
	json.Unmarshal(last["retire"], &d.Retire)
	if !d.Retire || d.Seq != seq || d.Enrolment != enrolment {
		return
	}
	why := fmt.Sprintf("retired by its declaration seq %d: its machine is hosted again", seq)
	if _, _, err := c.revoke(ctx, node, why, func(r *NodeRecord) bool { return r.IsRevoked() || r.Enrolment != enrolment }); err != nil {
		c.log.Warn("a node retired by its declaration could not be revoked: node revoke it", "node", node, "seq", seq, "err", err)
	}
}

// Revoke revokes node's identity as RevokeNode does, and says whether it
// was revoked already: then nothing is changed, and rec says since when.
// It is what `node revoke` runs, so a person is never told that a second
// revocation did something.
func (c *Client) Revoke(ctx context.Context, name, why string) (rec *NodeRecord, already bool, err error) {
	return c.revoke(ctx, name, why, (*NodeRecord).IsRevoked)
}

// revoke revokes node name's record (revokeRecord, compare-and-set) unless
// done says it is revoked already, which it then returns with already
// true; a pending rekey's token is withdrawn with it.
func (c *Client) revoke(ctx context.Context, name, why string, done func(*NodeRecord) bool) (*NodeRecord, bool, error) {
	for attempt := 0; attempt < 100; attempt++ {
		rec, rev, err := c.Node(ctx, name)
		if err != nil {
			return nil, false, err
		}
		if done(rec) {
			return rec, true, nil
		}
		rekey := revokeRecord(rec)
		data, _ := json.Marshal(rec)
		if _, err = c.KV.Update(ctx, nodeKey(name), data, rev); err == nil {
			c.log.Info("node revoked", "node", name, "why", why)
			c.withdrawRekey(ctx, name, rekey)
			return rec, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, false, fmt.Errorf("registry: %w", err)
		}
	}
	return nil, false, fmt.Errorf("registry: node %s kept changing; not revoked", name)
}

// revokeRecord makes rec a revoked node's record: no NKey, revoked now,
// and no rekey pending. A revocation ends a rekey the node asked for: its
// token was sealed to keys the revoked machine holds (a stolen one among
// them), and it would enrol that machine as the node again. It returns the
// pending rekey's token, for the caller to withdraw once the record is
// written (withdrawRekey); the enrolment refuses it anyway (rekeyStands).
func revokeRecord(rec *NodeRecord) (rekeyToken string) {
	if rec.Rekey != nil {
		rekeyToken = rec.Rekey.Token
	}
	now := time.Now().UTC()
	rec.keepPast(now)
	rec.NKey, rec.Revoked, rec.Rekey = "", now, nil
	return rekeyToken
}

// withdrawRekey revokes the token of a rekey that node's revocation ended
// (none: ""), so that the broker refuses its credential too.
func (c *Client) withdrawRekey(ctx context.Context, node, token string) {
	if token == "" {
		return
	}
	var used *TokenUsedError
	if _, _, err := c.RevokeToken(ctx, token); err != nil && !errors.As(err, &used) {
		c.log.Warn("the rekey token of a revoked node was not withdrawn (an enrolment refuses it all the same)", "node", node, "token", token, "err", err)
	}
}

// rekeyStands says why the rekey token t may not enrol rec's node, "" when
// it may: a rekey token renews the keys of the live enrolment that asked
// for it, and nothing else — not a node revoked since, nor one enrolled
// again (a token --node, after a theft) or that asked again since.
func rekeyStands(rec *NodeRecord, t *TokenRecord) string {
	switch {
	case rec.IsRevoked():
		return fmt.Sprintf("node %s was revoked after rekey token %s was issued for it: a rekey renews a live node's keys only (a token --node enrols it again)", rec.Name, t.ID)
	case rec.Rekey == nil || rec.Rekey.Token != t.ID:
		return fmt.Sprintf("rekey token %s is no longer node %s's: the node was enrolled again, or asked for new keys again, since it was issued", t.ID, rec.Name)
	}
	return ""
}
