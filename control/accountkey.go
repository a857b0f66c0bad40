package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The nodes' account key (nodes-account.nk) in NATS operator mode signs
// the user JWT with which every node signs in, and each node's account
// lists it: its thief could sign in as any node (SECURITY.md). It is
// rotated as NATS' signing keys are, in two steps:
//
//   - announce: a new key beside the old (FileNodesAccountNext); every
//     node's account lists both, JWTs are issued by the new one from then
//     on, and each node whose heartbeat says it signs in with a JWT the
//     new key did not issue is sent one (renewUserJWT), signed by the
//     control key, which the agent keeps and signs in with from its next
//     connection;
//   - switch, once every node's heartbeat names the new key: the new key
//     takes the old one's place, every account lists it alone, and the
//     broker disconnects whoever signed in with a JWT of the old one.

// AccountKeySubject is where serve rotates the nodes' account key
// (mesh-control account-key rotate), in the control side's account.
const AccountKeySubject = "mesh.control.account-key"

// AccountKeyRequest asks serve to announce a new nodes' account key
// (Switch false), or to switch to the one announced.
type AccountKeyRequest struct {
	Switch bool `json:"switch,omitempty"`
	// Force switches although some nodes have not taken a JWT of the new
	// key: they cannot link afterwards until enrolled again.
	Force bool `json:"force,omitempty"`
}

// AccountKeyResult is what a step of the rotation did.
type AccountKeyResult struct {
	Phase   string `json:"phase"` // "announced" or "switched"
	Current string `json:"current"`
	Next    string `json:"next,omitempty"`
	Nodes   int    `json:"nodes"`
	// NotYet are the nodes whose last heartbeat did not name the new key
	// (a switch refuses while there are any, unless forced).
	NotYet []string `json:"not_yet,omitempty"`
	// ControlCurrent and ControlNext are the control side's signing key
	// in force and announced.
	ControlCurrent string `json:"control_current,omitempty"`
	ControlNext    string `json:"control_next,omitempty"`
	// ControlSwitched: the switch put the control side's signing key
	// announced in force.
	ControlSwitched bool   `json:"control_switched,omitempty"`
	Error           string `json:"error,omitempty"`
	// after is what serve does once the answer is sent.
	after func()
}

func (r *AccountKeyResult) setError(e string) { r.Error = e }

func (r *AccountKeyResult) afterAnswer() {
	if r.after != nil {
		r.after()
	}
}

// answerAccountKey carries out the rotations asked on AccountKeySubject;
// rs is the resolver's sink, which pushes the accounts again.
func answerAccountKey(c *Client, rs *resolverSink, log *slog.Logger) error {
	return answerServe(c, AccountKeySubject, func() *AccountKeyResult { return &AccountKeyResult{} }, func(ctx context.Context, req AccountKeyRequest) (*AccountKeyResult, error) {
		res, err := c.RotateAccountKey(ctx, req, rs)
		if res == nil {
			res = &AccountKeyResult{}
		}
		if err != nil {
			log.Error("the nodes' account key was not rotated", "err", err)
		} else {
			log.Warn("the nodes' account key rotation", "phase", res.Phase, "current", res.Current, "next", res.Next)
		}
		return res, err
	})
}

// RotateAccountKey is one step of the rotation of the account signing
// keys, in serve (see above): the nodes' account key, and the control
// side's signing key, which issues the users serve and the commands sign
// in to CONTROL and the system account with. Both are announced together
// and switched together; the switch's pushes, which make the broker cut
// every connection of a key switched from (serve's own, and the command's
// that asked, among them), are made once the answer is sent (res.after).
func (c *Client) RotateAccountKey(ctx context.Context, req AccountKeyRequest, rs *resolverSink) (*AccountKeyResult, error) {
	rotateMu.Lock()
	defer rotateMu.Unlock()
	k := c.Keys
	if k.Operator == nil || rs == nil {
		return nil, errors.New("the account signing keys are rotated only for a broker in operator mode (broker-config --resolver): any other broker lets a node in by its NKey, and the nodes' account key can only narrow that (SECURITY.md); the control NKey is rotated by making it anew with serve stopped (docs/operations.md)")
	}
	if err := k.nodes.refresh(); err != nil {
		return nil, err
	}
	if err := k.Operator.signing.refresh(); err != nil {
		return nil, err
	}
	res := &AccountKeyResult{Current: k.nodes.accepted()[0], ControlCurrent: k.Operator.signing.accepted()[0]}
	if !req.Switch {
		if err := k.nodes.announce(); err != nil {
			return nil, err
		}
		if err := k.Operator.signing.announce(); err != nil {
			return nil, err
		}
		rs.again()
		res.Phase, res.Next, res.ControlNext = "announced", k.nodes.issuerPublic(), k.Operator.signing.issuerPublic()
		var err error
		res.Nodes, res.NotYet, err = c.notYetIssuedBy(ctx, res.Next)
		return res, err
	}
	next, signingNext := k.nodes.announced(), k.Operator.signing.announced()
	if next == nil && signingNext == nil {
		return nil, errors.New("no account signing key was announced: account-key rotate first, then --switch")
	}
	res.Phase = "switched"
	if next != nil {
		res.Next, _ = next.PublicKey()
		var err error
		if res.Nodes, res.NotYet, err = c.notYetIssuedBy(ctx, res.Next); err != nil {
			return nil, err
		}
		if len(res.NotYet) > 0 && !req.Force {
			return res, fmt.Errorf("not switched: %d node(s) do not sign in with a JWT of the new key yet, and could not link after the switch: %s — wait for their next heartbeat (mesh-control nodes), or switch with --force and enrol them again", len(res.NotYet), strings.Join(res.NotYet, ", "))
		}
	}
	// The control side's connections sign in with the new key from the
	// switch on: the broker must have taken the accounts listing it.
	o := k.Operator
	if signingNext != nil && (!rs.taken(o.systemAccountClaims()) || !rs.taken(o.controlAccountClaims())) {
		if rs.again(); !rs.taken(o.systemAccountClaims()) || !rs.taken(o.controlAccountClaims()) {
			return res, errors.New("not switched: the broker has not taken the system account and CONTROL listing the control side's new signing key, with which serve and the commands would sign in after the switch (serve's log says why); run again")
		}
	}
	// Whatever is switched from here on is pushed once the answer is out,
	// even when a later step fails.
	res.after = func() { rs.again() }
	if next != nil {
		if err := k.nodes.switchOver(); err != nil {
			return res, err
		}
		res.Current, res.Next = res.Next, ""
	}
	// Switched one after the other: a crash between the two leaves the
	// signing key announced, and --switch run again switches it alone.
	if signingNext != nil {
		if err := o.signing.switchOver(); err != nil {
			return res, err
		}
		res.ControlCurrent, res.ControlSwitched = o.signing.accepted()[0], true
	}
	return res, nil
}

// notYetIssuedBy is how many nodes are live, and which of them last said
// they sign in with a JWT another key than issuer issued.
func (c *Client) notYetIssuedBy(ctx context.Context, issuer string) (int, []string, error) {
	ns, err := c.Nodes(ctx)
	if err != nil {
		return 0, nil, err
	}
	live, notYet := 0, []string(nil)
	for _, n := range ns {
		if n.State == StateRevoked {
			continue
		}
		live++
		if n.Heartbeat == nil || n.Heartbeat.JWTIssuer != issuer {
			notYet = append(notYet, n.Name)
		}
	}
	return live, notYet, nil
}

// jwtResend is how often a node is sent its renewed JWT while its
// heartbeats still name another issuer.
const jwtResend = 10 * time.Second

// renewUserJWT sends node a user JWT of the nodes' account key that
// issues them now, when its heartbeat says it signs in with one another
// key issued (issuer): signed by the control key, on its notice subject
// (link.UserJWTHeader). The JWT is for the NKey the registry holds for the
// node's live enrolment, never one the heartbeat names. What fails is said
// in the log; the next heartbeat asks again.
func (c *Client) renewUserJWT(ctx context.Context, node, enrolment, issuer string) {
	if c.Keys.Operator == nil || issuer == c.Keys.nodes.issuerPublic() {
		return
	}
	// Another serve of this key directory may have announced or switched
	// a key since this one read them.
	if err := c.Keys.nodes.refresh(); err != nil || issuer == c.Keys.nodes.issuerPublic() {
		return
	}
	if last, ok := c.jwtSent.Load(node); ok && time.Since(last.(time.Time)) < jwtResend {
		return
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil || rec.NKey == "" || rec.Enrolment != enrolment {
		return
	}
	token, err := c.UserJWT(node, rec.NKey)
	if err != nil {
		c.log.Error("a node's renewed broker credential not issued", "node", node, "err", err)
		return
	}
	payload, _ := json.Marshal(&wire.UserJWT{Node: node, Enrolment: enrolment, JWT: token, Issued: time.Now().UTC()})
	env, err := wire.Seal(c.Keys.Signer(), wire.PurposeUserJWT, payload)
	if err != nil {
		c.log.Error("a node's renewed broker credential not signed", "node", node, "err", err)
		return
	}
	h := c.linkHeader(rec)
	h.Set(link.UserJWTHeader, "1")
	c.jwtSent.Store(node, time.Now())
	if err := c.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf(node).Notice, Data: env, Header: h}); err != nil {
		c.log.Error("a node's renewed broker credential not sent", "node", node, "err", err)
		return
	}
	c.log.Info("a node signs in with a JWT of another key than the nodes' account key in force: sent it one", "node", node, "its_issuer", issuer)
}
