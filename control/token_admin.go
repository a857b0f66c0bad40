package control

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// What a token can still do, as `token list` says it. A token is used
// once; revoked by a person (token revoke); expired at its time, used or
// not; usable otherwise.
const (
	TokenUsable  = "usable"
	TokenUsed    = "used"
	TokenRevoked = "revoked"
	TokenExpired = "expired"
)

// State is what t can still do at now (TokenUsable and the others). A
// used token that was revoked after is said used: who it enrolled is
// what a person looks for.
func (t *TokenRecord) State(now time.Time) string {
	switch {
	case !t.Used.IsZero():
		return TokenUsed
	case !t.Revoked.IsZero():
		return TokenRevoked
	case !now.Before(t.Expires):
		return TokenExpired
	}
	return TokenUsable
}

// TokenView is a token as `token list --json` shows it: whom it is for
// and what it can still do, never its secret or its credential.
type TokenView struct {
	ID string `json:"id"`
	// Node is the node it re-enrols, or the name a --new token gives
	// (left out: the machine's hostname names it).
	Node    string    `json:"node,omitempty"`
	New     bool      `json:"new"`
	Issued  time.Time `json:"issued"`
	Expires time.Time `json:"expires"`
	State   string    `json:"state"`
	Used    time.Time `json:"used,omitzero"`
	UsedBy  string    `json:"used_by,omitempty"`
	Revoked time.Time `json:"revoked,omitzero"`
}

// View is t as `token list` shows it at now.
func (t *TokenRecord) View(now time.Time) TokenView {
	return TokenView{ID: t.ID, Node: t.Node, New: t.New, Issued: t.Issued, Expires: t.Expires, State: t.State(now),
		Used: t.Used, UsedBy: t.UsedBy, Revoked: t.Revoked}
}

// Tokens lists the registry's tokens, oldest first. The listing is whole
// or an error (values): a token missing from it would be one a person
// believes was never issued, or was pruned.
func (c *Client) Tokens(ctx context.Context) ([]*TokenRecord, error) {
	vals, err := c.values(ctx, "token.*")
	if err != nil {
		return nil, err
	}
	out := make([]*TokenRecord, 0, len(vals))
	for k, v := range vals {
		var t TokenRecord
		if err := json.Unmarshal(v, &t); err != nil {
			return nil, fmt.Errorf("registry: %s: %w", k, err)
		}
		out = append(out, &t)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Issued.Equal(out[j].Issued) {
			return out[i].Issued.Before(out[j].Issued)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// TokenID is the id a person names a token by: as `token list` and `token
// issue --json` print it (16 hex digits), or the whole token, whose id is
// read from it (a token revoked is of no use to whoever reads it on a
// command line).
func TokenID(s string) (string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, wire.TokenPrefix) {
		t, err := wire.ParseToken(s)
		if err != nil {
			return "", err
		}
		return t.IDString(), nil
	}
	s = strings.ToLower(s)
	if b, err := hex.DecodeString(s); err != nil || len(b) != 8 {
		return "", fmt.Errorf("%q is not a token id: 16 hex digits, as mesh-control token list shows them (or the whole token, %s…)", s, wire.TokenPrefix)
	}
	return s, nil
}

// TokenUsedError refuses to revoke a token that was used: it enrols no
// one again whatever is done to it, and the machine it enrolled is the
// node it names — which is what to revoke, if anything.
type TokenUsedError struct {
	ID, Node string
	Used     time.Time
}

func (e *TokenUsedError) Error() string {
	return fmt.Sprintf("token %s was used at %s, enrolling node %s: revoking it changes nothing (a token enrols once); to cut that machine off: mesh-control node revoke %s",
		e.ID, e.Used.Local().Format(time.RFC3339), e.Node, e.Node)
}

// RevokeToken makes token id unusable now: its record says revoked, so
// the enrolment responder refuses it (enrol) and the broker stops
// letting its one-time credential in once serve's watch of the registry
// sees the change (SetTokens, or the configuration of a broker of the
// operator's own). Its secret goes with it. A token revoked already is
// returned with already true, nothing changed; a used one is refused
// (*TokenUsedError), as is an id the registry does not hold.
func (c *Client) RevokeToken(ctx context.Context, id string) (t *TokenRecord, already bool, err error) {
	id, err = TokenID(id)
	if err != nil {
		return nil, false, err
	}
	for attempt := 0; attempt < 100; attempt++ {
		e, err := c.KV.Get(ctx, tokenKey(id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, false, fmt.Errorf("no token %s in the registry (a token's record goes a day after it expires; mesh-control token list shows those there are)", id)
		}
		if err != nil {
			return nil, false, fmt.Errorf("registry: token %s: %w", id, err)
		}
		var rec TokenRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return nil, false, fmt.Errorf("registry: token %s: %w", id, err)
		}
		switch {
		case !rec.Used.IsZero():
			return &rec, false, &TokenUsedError{ID: id, Node: rec.UsedBy, Used: rec.Used}
		case !rec.Revoked.IsZero():
			return &rec, true, nil
		}
		rec.Revoked, rec.Secret = time.Now().UTC(), nil
		data, _ := json.Marshal(&rec)
		// Compare-and-set: an enrolment spending the token at this moment
		// wins or loses whole, never both.
		if _, err = c.KV.Update(ctx, tokenKey(id), data, e.Revision()); err == nil {
			c.log.Debug("token revoked", "token", id, "node", rec.Node)
			return &rec, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, false, fmt.Errorf("registry: revoking token %s: %w", id, err)
		}
	}
	return nil, false, fmt.Errorf("registry: token %s kept changing; not revoked", id)
}
