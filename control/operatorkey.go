package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// The operator's key (broker-operator.nk) in NATS operator mode signs
// every account: its thief can let anyone into the broker. A server
// trusts the operators its configuration names when it starts, and takes
// no change of them at a reload, so the key is rotated in two steps with
// the servers restarted after each:
//
//   - announce (operator-key rotate): a new key beside the old
//     (broker-operator.nk.next); broker-config --resolver writes both
//     operators into the servers' configuration from then on, and each
//     server is restarted onto it. The accounts stay signed by the old key.
//   - switch (operator-key rotate --switch), in serve, once every server
//     trusts the new key (each answers the system account's VARZ with the
//     operators it trusts): the new key is renamed over the old, and every
//     account is pushed again signed by it (the resolver's digest names
//     the signer). broker-config --resolver then writes the new operator
//     alone, and each server restarted onto it trusts the old key no more.

// OperatorKeySubject is where serve switches the operator's key
// (mesh-control operator-key rotate --switch), in the control side's
// account.
const OperatorKeySubject = "mesh.control.operator-key"

// OperatorKeyRequest asks serve to switch to the operator's key
// announced.
type OperatorKeyRequest struct {
	// Force switches although fewer servers answered than the cluster's
	// routes name (a configuration that names the server itself among its
	// routes counts one too many): a server that was away, restarted on
	// the old configuration, refuses every account pushed since.
	Force bool `json:"force,omitempty"`
}

// OperatorKeyResult is what a step of the rotation did.
type OperatorKeyResult struct {
	Phase   string `json:"phase"` // "announced" or "switched"
	Current string `json:"current"`
	Next    string `json:"next,omitempty"`
	// Servers are the servers that answered the switch's question, and
	// NotYet those of them that do not trust the new key yet.
	Servers []string `json:"servers,omitempty"`
	NotYet  []string `json:"not_yet,omitempty"`
	// Undone is how many accounts the switch's pushes (or deletions) left
	// for serve to try again.
	Undone int    `json:"undone,omitempty"`
	Error  string `json:"error,omitempty"`
}

func (r *OperatorKeyResult) setError(e string) { r.Error = e }

// AnnounceOperatorKey makes the operator's key that replaces the one in
// force, beside it in dir, unless one is announced already. Nothing is
// signed with it until the switch: it only enters the servers'
// configuration.
func AnnounceOperatorKey(dir string) (*OperatorKeyResult, error) {
	o, err := loadOperator(dir)
	if err != nil {
		return nil, err
	}
	if o == nil {
		return nil, errors.New("the key directory is not in operator mode (broker-config --resolver): the embedded broker and a broker configured from a file have no operator key")
	}
	if err := o.op.announce(); err != nil {
		return nil, err
	}
	next, _ := o.op.announced().PublicKey()
	return &OperatorKeyResult{Phase: "announced", Current: o.OperatorPublic(), Next: next}, nil
}

// answerOperatorKey carries out the switches asked on OperatorKeySubject.
func answerOperatorKey(c *Client, rs *resolverSink, log *slog.Logger) error {
	return answerServe(c, OperatorKeySubject, func() *OperatorKeyResult { return &OperatorKeyResult{} }, func(ctx context.Context, req OperatorKeyRequest) (*OperatorKeyResult, error) {
		res, err := c.SwitchOperatorKey(ctx, req, rs)
		if res == nil {
			res = &OperatorKeyResult{}
		}
		if err != nil {
			log.Error("the operator's key rotation", "phase", res.Phase, "err", err)
		} else {
			log.Warn("the operator's key switched: every account pushed again under it", "current", res.Current)
		}
		return res, err
	})
}

// SwitchOperatorKey puts the operator's key announced in force, once
// every server trusts it, and pushes every account again signed by it.
func (c *Client) SwitchOperatorKey(ctx context.Context, req OperatorKeyRequest, rs *resolverSink) (*OperatorKeyResult, error) {
	rotateMu.Lock()
	defer rotateMu.Unlock()
	o := c.Keys.Operator
	if o == nil || rs == nil {
		return nil, errors.New("the operator's key is rotated only for a broker in operator mode (broker-config --resolver)")
	}
	o.op.refresh()
	res := &OperatorKeyResult{Current: o.OperatorPublic()}
	next := o.op.announced()
	if next == nil {
		return nil, errors.New("no operator key was announced: operator-key rotate first, write the servers' configuration again (broker-config --resolver) and restart each server onto it, then --switch")
	}
	res.Next, _ = next.PublicKey()
	servers, notYet, expected, err := rs.serversTrusting(ctx, res.Next)
	if err != nil {
		return nil, err
	}
	res.Servers, res.NotYet = servers, notYet
	if len(notYet) > 0 {
		return res, fmt.Errorf("not switched: %d server(s) do not trust the new operator key yet: %s — write their configuration again (broker-config --resolver) and restart each onto it", len(notYet), strings.Join(notYet, ", "))
	}
	if len(servers) < expected && !req.Force {
		return res, fmt.Errorf("not switched: %d server(s) answered (%s), and the cluster's routes name %d: a server away now, restarted later on its old configuration, would refuse every account signed by the new key — run again once every server answers, or switch with --force", len(servers), strings.Join(servers, ", "), expected)
	}
	if err := o.op.switchOver(); err != nil {
		return nil, err
	}
	res.Phase, res.Current, res.Next = "switched", res.Next, ""
	if res.Undone = rs.again(); res.Undone > 0 {
		return res, fmt.Errorf("switched, but %d account push(es) or deletion(s) were not taken yet: serve tries them again (its log says why); restart the servers onto a configuration naming the new key alone only once serve's log says the broker's accounts follow the registry with none failed", res.Undone)
	}
	return res, nil
}

// serverVarz is what a server answers the system account's VARZ, as much
// as the switch reads.
type serverVarz struct {
	Server struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	} `json:"server"`
	Data struct {
		// Cluster.URLs are the routes the server's configuration names
		// (the other servers, as broker-config --cluster writes them);
		// Remotes counts only the routes connected now.
		Cluster struct {
			URLs []string `json:"urls"`
		} `json:"cluster"`
		Remotes   int                   `json:"remotes"`
		Operators []*jwt.OperatorClaims `json:"trusted_operators_claim"`
	} `json:"data"`
}

// varzWait is how long the servers' answers to a VARZ are gathered.
const varzWait = 2 * time.Second

// serversTrusting asks every server of the broker which operators it
// trusts: the servers that answered, those of them that do not trust
// operator, and how many the answers' routes say there are.
func (r *resolverSink) serversTrusting(ctx context.Context, operator string) (servers, notYet []string, expected int, err error) {
	inbox := r.nc.NewRespInbox()
	answers := make(chan *nats.Msg, 64)
	sub, err := r.nc.ChanSubscribe(inbox, answers)
	if err != nil {
		return nil, nil, 0, err
	}
	defer sub.Unsubscribe()
	if err := r.nc.PublishRequest("$SYS.REQ.SERVER.PING.VARZ", inbox, nil); err != nil {
		return nil, nil, 0, err
	}
	timer := time.NewTimer(varzWait)
	defer timer.Stop()
	seen := map[string]bool{}
	for {
		select {
		case m := <-answers:
			var v serverVarz
			if json.Unmarshal(m.Data, &v) != nil || seen[v.Server.ID] {
				continue
			}
			seen[v.Server.ID] = true
			name := v.Server.Name
			if name == "" {
				name = v.Server.ID
			}
			servers = append(servers, name)
			expected = max(expected, len(v.Data.Cluster.URLs)+1, v.Data.Remotes+1)
			if !slices.ContainsFunc(v.Data.Operators, func(oc *jwt.OperatorClaims) bool { return oc != nil && oc.Subject == operator }) {
				notYet = append(notYet, name)
			}
		case <-timer.C:
			if len(servers) == 0 {
				return nil, nil, 0, errors.New("no server of the broker answered the system account's VARZ")
			}
			slices.Sort(servers)
			slices.Sort(notYet)
			return servers, notYet, expected, nil
		case <-ctx.Done():
			return nil, nil, 0, ctx.Err()
		}
	}
}

// operatorKeyAnnounced is the operator's key announced, "" when none.
func (o *Operator) operatorKeyAnnounced() string {
	o.op.refresh()
	if next := o.op.announced(); next != nil {
		pub, _ := next.PublicKey()
		return pub
	}
	return ""
}
