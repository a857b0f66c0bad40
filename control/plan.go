package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Plan asks node what decl would do there, changing nothing: a plan
// request signed for its own purpose (wire.PurposePlan: no node takes it
// for a declaration), addressed to the node and its enrolment, good for
// wire.PlanWithin, sent on the node's plan subject (core NATS: a node not
// linked now does not plan it). It takes no sequence. The node answers with
// a report, trigger plan, carrying the returned ID (WaitPlan).
func (c *Client) Plan(ctx context.Context, node string, decl []byte) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(decl, &m); err != nil {
		return "", fmt.Errorf("declaration: %w", err)
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return "", err
	}
	if rec.IsRevoked() {
		return "", c.revokedError(ctx, rec)
	}
	if err := link.CheckNode(rec.Name, rec.Capability); err != nil {
		return "", fmt.Errorf("refused by the control side: %w", err)
	}
	// Sealed content is checked as a declaration's is, and sealed for
	// sequence 0, the plan's own (a plan takes no sequence, and no
	// declaration has 0): the executor opens it for this plan, and it
	// opens in no declaration.
	seals, err := planSeals(rec, m, c.Seals)
	if err != nil {
		return "", err
	}
	if seals != nil {
		if err := seals.seal(m, rec, 0); err != nil {
			return "", err
		}
	}
	data, err := fillDecl(m, rec, 0)
	if err != nil {
		return "", err
	}
	if _, err := linkParse(data); err != nil {
		return "", fmt.Errorf("refused before signing: %w", err)
	}
	var nonce [12]byte
	rand.Read(nonce[:])
	id := hex.EncodeToString(nonce[:])
	payload, err := json.Marshal(wire.PlanRequest{Node: rec.Name, Enrolment: rec.Enrolment, ID: id, NotAfter: time.Now().Add(wire.PlanWithin).UTC(), Declaration: data})
	if err != nil {
		return "", err
	}
	env, err := wire.Seal(c.Keys.Signer(), wire.PurposePlan, payload)
	if err != nil {
		return "", err
	}
	// Published with a reply subject the agent never answers on: where no
	// agent hears a subject, the broker says so there at once (its "no
	// responders" status), and a node that hears none of them is not
	// linked now — said, rather than waited for until the plan's time.
	heard, err := c.NC.SubscribeSync(c.NC.NewInbox())
	if err != nil {
		return "", err
	}
	defer heard.Unsubscribe()
	subjects := link.PlanSubjects(rec.Name) // its agent hears one, of either layout
	for _, subj := range subjects {
		if err := c.NC.PublishMsg(&nats.Msg{Subject: subj, Reply: heard.Subject, Data: env, Header: c.linkHeader(rec)}); err != nil {
			return "", err
		}
	}
	if err := c.NC.FlushTimeout(10 * time.Second); err != nil {
		return "", err
	}
	unheard := 0
	for unheard < len(subjects) {
		// The broker says it before it answers the flush: what is not
		// here by then will not come. nats.go reads the status as an
		// error of the read.
		_, err := heard.NextMsg(100 * time.Millisecond)
		if !errors.Is(err, nats.ErrNoResponders) {
			break // heard, or a broker that says nothing of it: the wait says
		}
		unheard++
	}
	if unheard == len(subjects) {
		return "", &exitError{ExitTimedOut, fmt.Sprintf("%s is not linked now: no agent hears its plan (a plan is asked of a node linked at that moment, not kept for it; mesh-control nodes says when it was last heard)", rec.Name)}
	}
	return id, nil
}

// WaitPlan waits up to within for node's answer to plan request id.
// waiting, when not nil, is called before each wait between two looks: a
// command tells a person on a terminal that it waits (cli.waiting).
func (c *Client) WaitPlan(ctx context.Context, node, id string, within time.Duration, waiting func()) (*SignedReport, error) {
	deadline := time.Now().Add(within)
	for {
		rs, _, err := c.Reports(ctx, node, 20)
		if err == nil {
			for _, r := range rs {
				if r.Trigger == link.TriggerPlan && r.PlanID == id {
					return r, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return nil, &exitError{ExitTimedOut, fmt.Sprintf("no plan from %s within %v (is it linked? a plan request is not kept for a node away)", node, within)}
		}
		if waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
