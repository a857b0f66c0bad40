package control

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// The system account's subjects through which the resolver takes, lists
// and deletes accounts (nats-server's account resolver API).
const (
	claimsUpdate = "$SYS.REQ.CLAIMS.UPDATE"
	claimsList   = "$SYS.REQ.CLAIMS.LIST"
	claimsDelete = "$SYS.REQ.CLAIMS.DELETE"
)

// resolverWindow is how many accounts are pushed at once: a serve
// starting on a fleet pushes every node's, and each is a request the
// servers answer after writing a file.
const resolverWindow = 32

// resolverSink is keepUsers' sink for a broker in operator mode: it makes
// the resolver's accounts equal to the registry — each node's account as
// its record says, each usable token's — through serve's own connection
// to the system account, pushing only what changed, and deleting the
// accounts of tokens revoked or past and of nodes deleted. What the broker
// refuses, or does not answer, is said in the log and tried again: at the
// next change, or after a wait that grows while it keeps failing.
type resolverSink struct {
	k   *Keys
	nc  *nats.Conn
	log *slog.Logger
	mu  sync.Mutex
	// pushed is, for each account pushed, the digest of the claims it was
	// pushed with (their time aside).
	// +checklocks:mu
	pushed map[string][32]byte
	// known is each node's NKey whose account the broker has taken.
	// +checklocks:mu
	known map[string]string
	// listed: the resolver's own list was read once, and what in it the
	// registry does not name deleted.
	listed bool
	// setMu makes one set at a time: the registry's watch, and again.
	setMu sync.Mutex
	// lastNodes and lastTokens are what set was given last (setMu).
	lastNodes  []*NodeRecord
	lastTokens []*TokenRecord
	// retry is the set again after one that left something undone, and
	// retryWait the wait before it (setMu): the registry may not change
	// again for a long while, and a node whose account a moment's failure
	// left out could not sign in until it did.
	retry     *time.Timer
	retryWait time.Duration
	closed    bool
}

// Bounds of the wait before a set that left something undone is tried
// again: doubled from the first to the last while it keeps failing.
const (
	resolverRetryFirst = 2 * time.Second
	resolverRetryLast  = 2 * time.Minute
)

// again pushes the accounts once more from the registry as set last had
// it: the keys they list, or the key that signs them, changed (the
// rotations). It says how many pushes or deletions were left undone (the
// sink tries them again).
func (r *resolverSink) again() (undone int) {
	r.setMu.Lock()
	nodes, tokens, closed := r.lastNodes, r.lastTokens, r.closed
	r.setMu.Unlock()
	if closed {
		return 0
	}
	return r.follow(nodes, tokens)
}

// taken says whether the broker took ac as it is now, signed by the
// operator's key in force.
func (r *resolverSink) taken(ac *jwt.AccountClaims) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.pushed[ac.Subject]
	return ok && d == digestOf(ac, r.k.Operator.OperatorPublic())
}

// digestOf is what the sink records of an account it pushed: its claims
// (before Encode: no time, no id) and the operator key that signed them,
// so that after that key's switch every account is pushed again.
func digestOf(ac *jwt.AccountClaims, signer string) [32]byte {
	b, _ := json.Marshal(ac)
	return sha256.Sum256(append(b, signer...))
}

// newResolverSink signs in to the system account at url.
func newResolverSink(k *Keys, url string, log *slog.Logger) (*resolverSink, error) {
	nc, _, err := dialAs(k, url, "mesh-control/resolver", k.Operator.signIn(k.Operator.SystemPublic, "mesh-control-system"))
	if err != nil {
		return nil, fmt.Errorf("signing in to the broker's system account (operator mode): %w", err)
	}
	return &resolverSink{k: k, nc: nc, log: log, pushed: map[string][32]byte{}, known: map[string]string{}}, nil
}

func (r *resolverSink) close() {
	r.setMu.Lock()
	r.closed = true
	if r.retry != nil {
		r.retry.Stop()
	}
	r.setMu.Unlock()
	r.nc.Close()
}

// knows says whether the broker has taken node's account for nkey: a
// grant waits for it, or the agent's first sign-in would be refused.
func (r *resolverSink) knows(node, nkey string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[node] == nkey
}

// claimsUpdateAnswer is what a server answers an account pushed or
// deleted.
type claimsUpdateAnswer struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// ask sends a request to the resolver and reads its answer.
func (r *resolverSink) ask(subject string, body []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return err
	}
	var a claimsUpdateAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return fmt.Errorf("the broker's answer does not decode: %w", err)
	}
	if a.Error != nil {
		return fmt.Errorf("the broker refused it: %s (code %d)", a.Error.Description, a.Error.Code)
	}
	return nil
}

// wanted is one account the registry asks for: its claims, and the node
// whose NKey it lets in (none for a token's or a revoked node's).
type wanted struct {
	claims     *jwt.AccountClaims
	node, nkey string
}

// set makes the resolver's accounts equal to nodes and tokens (keepUsers'
// sink).
func (r *resolverSink) set(nodes []*NodeRecord, tokens []*TokenRecord) { r.follow(nodes, tokens) }

// follow is set, saying how many pushes or deletions were left undone.
func (r *resolverSink) follow(nodes []*NodeRecord, tokens []*TokenRecord) (undoneCount int) {
	r.setMu.Lock()
	defer r.setMu.Unlock()
	r.lastNodes, r.lastTokens = nodes, tokens
	if err := r.k.nodes.refresh(); err != nil {
		r.log.Error("the nodes' account keys not read again; the accounts list them as before", "err", err)
	}
	if err := r.k.Operator.signing.refresh(); err != nil {
		r.log.Error("the control side's signing keys not read again; the accounts list them as before", "err", err)
	}
	if r.retry != nil {
		r.retry.Stop()
		r.retry = nil
	}
	undone := false
	defer func() {
		if !undone || r.closed {
			r.retryWait = 0
			return
		}
		r.retryWait = min(max(2*r.retryWait, resolverRetryFirst), resolverRetryLast)
		r.retry = time.AfterFunc(r.retryWait, func() { r.again() })
	}()
	want := map[string]wanted{}
	// The system account and CONTROL, for the signing keys they list:
	// pushed after the others (last below), for when they drop a key the
	// broker cuts the connections it issued — this one's, perhaps.
	o := r.k.Operator
	for _, ac := range []*jwt.AccountClaims{o.systemAccountClaims(), o.controlAccountClaims()} {
		want[ac.Subject] = wanted{claims: ac}
	}
	for _, n := range nodes {
		ac := r.k.nodeAccountClaims(n)
		want[ac.Subject] = wanted{claims: ac, node: n.Name, nkey: n.NKey}
	}
	now := time.Now()
	for _, t := range tokens {
		if !t.usable(now) {
			continue
		}
		ac, err := r.k.tokenAccountClaims(t)
		if err != nil {
			r.log.Error("a token's account not made; it cannot enrol", "token", t.ID, "err", err)
			continue
		}
		want[ac.Subject] = wanted{claims: ac}
	}
	var todo []string
	digests := map[string][32]byte{}
	r.mu.Lock()
	signerPub := r.k.Operator.OperatorPublic()
	for id, w := range want {
		d := digestOf(w.claims, signerPub)
		digests[id] = d
		if r.pushed[id] != d {
			todo = append(todo, id)
		}
	}
	var gone []string
	for id := range r.pushed {
		if _, ok := want[id]; !ok {
			gone = append(gone, id)
		}
	}
	r.mu.Unlock()

	last := func(id string) bool { return id == o.SystemPublic || id == o.ControlPublic }
	slices.SortStableFunc(todo, func(a, b string) int {
		switch {
		case last(a) == last(b):
			return 0
		case last(a):
			return 1
		}
		return -1
	})
	sem := make(chan struct{}, resolverWindow)
	var wg sync.WaitGroup
	failed := 0
	var fmu sync.Mutex
	for _, id := range todo {
		w := want[id]
		if last(id) {
			wg.Wait() // every other account taken first
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := r.push(w.claims)
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				fmu.Lock()
				failed++
				fmu.Unlock()
				delete(r.pushed, id)
				r.log.Error("the broker did not take an account; tried again", "account", w.claims.Name, "err", err)
				return
			}
			r.pushed[id] = digests[id]
			if w.node != "" {
				if w.nkey != "" {
					r.known[w.node] = w.nkey
				} else {
					delete(r.known, w.node)
				}
			}
		}()
	}
	wg.Wait()
	undone = failed > 0
	undoneCount = failed
	if !r.listed {
		// What the resolver holds from before this serve: accounts of
		// nodes deleted and tokens revoked or past while it was away.
		if ids, err := r.list(); err != nil {
			undone = true
			undoneCount++
			r.log.Error("the broker's accounts not listed; tried again", "err", err)
		} else {
			r.listed = true
			for _, id := range ids {
				if _, ok := want[id]; !ok {
					gone = append(gone, id)
				}
			}
		}
	}
	if len(gone) > 0 {
		if err := r.delete(gone); err != nil {
			undone = true
			undoneCount += len(gone)
			r.log.Error("the broker did not delete accounts the registry no longer names; tried again", "accounts", len(gone), "err", err)
		} else {
			r.mu.Lock()
			for _, id := range gone {
				delete(r.pushed, id)
			}
			r.mu.Unlock()
		}
	}
	r.log.Info("the broker's accounts follow the registry", "pushed", len(todo)-failed, "failed", failed, "deleted", len(gone))
	return undoneCount
}

// push has the resolver take ac, signed by the operator.
func (r *resolverSink) push(ac *jwt.AccountClaims) error {
	token, err := ac.Encode(r.k.Operator.signer())
	if err != nil {
		return err
	}
	return r.ask(claimsUpdate, []byte(token))
}

// list is every account the resolver holds.
func (r *resolverSink) list() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.nc.RequestWithContext(ctx, claimsList, nil)
	if err != nil {
		return nil, err
	}
	var a struct {
		Data []string `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return nil, fmt.Errorf("the broker's list does not decode: %w", err)
	}
	return a.Data, nil
}

// delete has the resolver delete the accounts ids, in a request the
// operator signs.
func (r *resolverSink) delete(ids []string) error {
	signer := r.k.Operator.signer()
	pub, _ := signer.PublicKey()
	gc := jwt.NewGenericClaims(pub)
	list := make([]any, len(ids))
	for i, id := range ids {
		list[i] = id
	}
	gc.Data["accounts"] = list
	token, err := gc.Encode(signer)
	if err != nil {
		return err
	}
	if err := r.ask(claimsDelete, []byte(token)); err != nil {
		return errors.Join(fmt.Errorf("deleting %d account(s)", len(ids)), err)
	}
	return nil
}
