package control

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// DefaultTokenTTL is how long a token lives unless told.
const DefaultTokenTTL = time.Hour

// tokenGrace is how long after its expiry a token's credential still
// reaches the responder, so the node hears "expired" or "used" rather than
// a bare authorization error. The credential can do nothing but ask, and
// the responder grants once; a revoked token's is refused by the broker.
const tokenGrace = 24 * time.Hour

// TokenRecord is a token on the control side (KV key token.<id>). The
// secret is kept to check the proof; the record is single-use.
type TokenRecord struct {
	ID string `json:"id"`
	// Node is the node record it re-enrols (--node), or the name a --new
	// token gives ("" lets the node's hostname name it).
	Node string `json:"node,omitempty"`
	New  bool   `json:"new"`
	// Secret is the one-time secret (the proof's key).
	Secret []byte `json:"secret"`
	// Credential is the one-time broker user's public NKey.
	Credential string    `json:"credential"`
	Issued     time.Time `json:"issued"`
	Expires    time.Time `json:"expires"`
	Used       time.Time `json:"used,omitzero"`
	UsedBy     string    `json:"used_by,omitempty"`
	Revoked    time.Time `json:"revoked,omitzero"`
	// UsedProof is the proof of the request that spent it: the same
	// request again, whose agent never had the answer, is granted again
	// (grantAgain).
	UsedProof string `json:"used_proof,omitempty"`
	// Rekey: issued to the node itself, on its request signed by its
	// identity key (mesh-executor rekey), sealed to its sealing key.
	Rekey bool `json:"rekey,omitempty"`
	// Superseded is, as IssueToken returns it, the earlier unused tokens
	// for its node it revoked, for the issuing command to say; never in
	// the registry.
	Superseded []string `json:"-"`
}

func tokenKey(id string) string { return "token." + id }

// IssueToken makes a one-time token: for the node record name (isNew
// false: that node's identity is revoked now, because two live identities
// for one node is the stolen-laptop case), or for a machine the mesh has
// not seen (isNew true; name, if given, is the node it becomes). It returns
// the token as a person carries it; the control side cannot print it again.
func (c *Client) IssueToken(ctx context.Context, name string, isNew bool, ttl time.Duration, brokerURL string) (string, *TokenRecord, error) {
	return c.issueToken(ctx, name, isNew, ttl, brokerURL, false)
}

// issueToken is IssueToken; rekey makes the token a rekey's (answerRekey):
// for an existing node, which it does not revoke at issue — the
// enrolment it makes replaces the node's identity in the same step as it
// grants the new one, and the node asked for it with its identity key.
func (c *Client) issueToken(ctx context.Context, name string, isNew bool, ttl time.Duration, brokerURL string, rekey bool) (string, *TokenRecord, error) {
	if ttl < 0 {
		return "", nil, fmt.Errorf("a token's lifetime %v is negative", ttl)
	}
	if ttl == 0 {
		ttl = DefaultTokenTTL
	}
	if name != "" {
		if err := link.ValidNodeName(name); err != nil {
			return "", nil, err
		}
	}
	if !isNew {
		if name == "" {
			return "", nil, errors.New("a token is issued --new, or --node NAME for an existing node")
		}
		if _, _, err := c.Node(ctx, name); err != nil {
			return "", nil, fmt.Errorf("%w (for a machine the mesh has not seen, issue --new)", err)
		}
	} else if name != "" {
		if _, _, err := c.Node(ctx, name); err == nil {
			return "", nil, fmt.Errorf("node %q exists: a token for it is --node %s (which revokes its identity)", name, name)
		}
	}
	if brokerURL == "" {
		brokerURL = c.Keys.BrokerURL
	} else {
		var err error
		if brokerURL, err = brokerURLsOf(brokerURL); err != nil {
			return "", nil, fmt.Errorf("--broker-url: %w", err)
		}
	}
	fp, err := hex.DecodeString(c.Keys.BrokerFingerprint())
	if err != nil || len(fp) != 32 {
		return "", nil, fmt.Errorf("the broker fingerprint %q is not a SHA-256", c.Keys.BrokerFingerprint())
	}
	tok := &wire.Token{BrokerURL: brokerURL, ControlKey: c.Keys.ControlPublic(), Expires: time.Now().Add(ttl).Truncate(time.Second)}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	rand.Read(tok.Credential[:])
	copy(tok.Fingerprint[:], fp)
	cred, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, tok.Credential[:])
	if err != nil {
		return "", nil, err
	}
	credPub, _ := cred.PublicKey()
	text, err := tok.Encode()
	if err != nil {
		return "", nil, err
	}
	rec := &TokenRecord{ID: tok.IDString(), Node: name, New: isNew, Secret: tok.Secret[:], Credential: credPub,
		Issued: time.Now().UTC(), Expires: tok.Expires.UTC(), Rekey: rekey}
	data, _ := json.Marshal(rec)
	rev, err := c.KV.Create(ctx, tokenKey(rec.ID), data)
	if err != nil {
		return "", nil, fmt.Errorf("registry: %w", err)
	}
	if !isNew && !rekey {
		if err := c.RevokeNode(ctx, name, "a re-enrolment token was issued for it (token "+rec.ID+")"); err != nil {
			c.KV.Purge(context.Background(), tokenKey(rec.ID))
			return "", nil, err
		}
	}
	if name != "" && !rekey {
		if rec.Superseded, err = c.supersedeTokens(ctx, rec, rev); err != nil {
			// Whole or not at all, as when the node's revocation fails:
			// a token whose text is never shown is one nobody holds. What
			// was done before stays done, and is said.
			done := ""
			if !isNew {
				done = fmt.Sprintf(" (node %s's identity is revoked, as a token --node revokes it, and stays so)", name)
			}
			if len(rec.Superseded) > 0 {
				done += fmt.Sprintf(" (the earlier token(s) %s, revoked before it failed, stay revoked)", strings.Join(rec.Superseded, ", "))
			}
			if perr := c.KV.Purge(context.Background(), tokenKey(rec.ID)); perr != nil {
				done += fmt.Sprintf("; and token %s, made, could not be taken out again (%v): mesh-control token revoke %s", rec.ID, perr, rec.ID)
			}
			return "", nil, fmt.Errorf("no token issued%s: %w; run it again", done, err)
		}
	}
	return text, rec, nil
}

// supersedeTokens revokes the tokens issued for the node of rec before it
// and not used: one token a node at a time, so an earlier one handed out
// and forgotten (issued twice, the first one mailed) cannot enrol the
// node later, revoking the machine the newest enrolled. Only those the
// registry holds before it (rev, its record's revision: an unused token's
// record is never written again): of several issued at once, the last
// written sees every other when it looks, and no other revokes it.
// A rekey's token is its own enrolment's matter (keepRekey, revoke).
func (c *Client) supersedeTokens(ctx context.Context, rec *TokenRecord, rev uint64) ([]string, error) {
	ts, err := c.Tokens(ctx)
	if err != nil {
		return nil, fmt.Errorf("the earlier tokens for node %s could not be listed to revoke them: %w", rec.Node, err)
	}
	now := time.Now()
	var revoked []string
	for _, t := range ts {
		if t.ID == rec.ID || t.Node != rec.Node || t.Rekey || !t.Used.IsZero() || !t.usable(now) {
			continue
		}
		e, err := c.KV.Get(ctx, tokenKey(t.ID))
		if errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && e.Revision() > rev) {
			continue // gone, or written after this one: not earlier
		}
		if err != nil {
			return revoked, fmt.Errorf("the earlier token %s for node %s could not be read: %w", t.ID, rec.Node, err)
		}
		if _, _, err := c.RevokeToken(ctx, t.ID); err != nil {
			var used *TokenUsedError
			if errors.As(err, &used) {
				continue // spent meanwhile: it enrols no one again
			}
			return revoked, fmt.Errorf("the earlier token %s for node %s could not be revoked: %w", t.ID, rec.Node, err)
		}
		c.log.Info("an earlier token for the node revoked: a newer one was issued", "node", rec.Node, "token", t.ID, "newer", rec.ID)
		revoked = append(revoked, t.ID)
	}
	return revoked, nil
}

// RevokeNode revokes node's identity: its NKey is dropped from the record,
// so the broker refuses it (and disconnects it now, if connected), its
// user JWT stops being honoured, and its reports are no longer taken. The
// record, its sequences and what it last reported stay: a token --node can
// enrol a machine as it again.
func (c *Client) RevokeNode(ctx context.Context, name, why string) error {
	// Revoked already only when both halves say so: a record without an
	// NKey but never revoked gets its revocation's time.
	_, _, err := c.revoke(ctx, name, why, func(r *NodeRecord) bool { return r.NKey == "" && !r.Revoked.IsZero() })
	return err
}

// tokens lists the token records.
func (c *Client) tokens(ctx context.Context) ([]*TokenRecord, error) {
	l, err := c.KV.ListKeysFiltered(ctx, "token.*")
	if err != nil {
		return nil, err
	}
	var out []*TokenRecord
	for k := range l.Keys() {
		var t TokenRecord
		if c.getJSON(ctx, k, &t) {
			out = append(out, &t)
		}
	}
	return out, nil
}

// usable reports whether a token's credential may still reach the
// responder at now.
func (t *TokenRecord) usable(now time.Time) bool {
	return t.Revoked.IsZero() && now.Before(t.Expires.Add(tokenGrace))
}

// EnrolQueue is the queue group of the enrolment responders: several
// mesh-control processes may serve, and each request is answered once.
const EnrolQueue = "mesh-control-enrol"

// Enrolments answers enrolment requests until ctx ends.
func (c *Client) Enrolments(ctx context.Context) error {
	sub, err := c.NC.QueueSubscribe(wire.EnrolSubjectPrefix+".*", EnrolQueue, func(m *nats.Msg) {
		reply := c.enrol(ctx, m.Subject, m.Header.Get(link.CapabilityHeader), m.Data)
		data, _ := json.Marshal(reply)
		if err := m.Respond(data); err != nil {
			c.log.Warn("enrolment: the answer could not be sent", "err", err)
		}
	})
	if err != nil {
		return fmt.Errorf("enrolment responder: %w", err)
	}
	defer sub.Unsubscribe()
	if err := c.NC.Flush(); err != nil {
		return err
	}
	// Tokens past their grace are of no use to anyone: their records go.
	// So do the registry's delete markers, hourly (PruneRegistry).
	prune := time.NewTicker(10 * time.Minute)
	defer prune.Stop()
	var marked time.Time
	for {
		c.pruneTokens(ctx, time.Now())
		if time.Since(marked) >= time.Hour {
			if err := c.PruneRegistry(ctx, registryMarkerAge); err != nil && ctx.Err() == nil {
				c.log.Warn("registry: its delete markers could not be removed", "err", err)
			}
			marked = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-prune.C:
		}
	}
}

// registryMarkerAge is how long a key's delete marker stays in the
// registry: nats.go's own default, time enough for every watch to have
// seen the delete.
const registryMarkerAge = 30 * time.Minute

// PruneRegistry removes from the registry the markers its deletes left
// (a token pruned, a node deleted, an assignment taken off) once older
// than olderThan (negative: all). A delete in a key-value bucket leaves a
// message saying so, kept as the key's last for as long as the bucket
// lives: one for every token ever issued, without this.
func (c *Client) PruneRegistry(ctx context.Context, olderThan time.Duration) error {
	return c.pruneRegistry(ctx, olderThan, nil)
}

// pruneRegistry is PruneRegistry; between, when set, runs after the
// markers were read and before they go (a test's write meanwhile).
//
// Not nats.go's KeyValue.PurgeDeletes (v1.56.0): it purges a key's whole
// subject for each marker older than its threshold, so a value written to
// the key between its reading of the markers and its purge — a node
// enrolled under a deleted node's name, an overlay address claimed again,
// an assignment made again — was removed with the marker. Here each purge
// stops at its marker's sequence.
func (c *Client) pruneRegistry(ctx context.Context, olderThan time.Duration, between func()) error {
	w, err := c.KV.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("registry: read the delete markers: %w", err)
	}
	limit := time.Now().Add(-olderThan)
	type marker struct {
		key string
		seq uint64
	}
	var markers []marker
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if op := e.Operation(); (op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge) && (olderThan < 0 || e.Created().Before(limit)) {
			markers = append(markers, marker{e.Key(), e.Revision()})
		}
	}
	w.Stop()
	if between != nil {
		between()
	}
	if len(markers) == 0 {
		return nil
	}
	str, err := c.JS.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return fmt.Errorf("registry: remove the delete markers: %w", err)
	}
	for _, m := range markers {
		// The marker and what came before it on its key; nothing after.
		if err := str.Purge(ctx, jetstream.WithPurgeSubject("$KV."+Bucket+"."+m.key), jetstream.WithPurgeSequence(m.seq+1)); err != nil {
			return fmt.Errorf("registry: remove the delete marker of %s: %w", m.key, err)
		}
	}
	return nil
}

// pruneTokens deletes the records of tokens expired for longer than the
// grace: their credentials are refused by then anyway.
func (c *Client) pruneTokens(ctx context.Context, now time.Time) {
	ts, err := c.tokens(ctx)
	if err != nil {
		return
	}
	for _, t := range ts {
		if !now.Before(t.Expires.Add(tokenGrace)) {
			c.KV.Purge(ctx, tokenKey(t.ID))
		}
	}
}

func refusedReply(format string, args ...any) *wire.EnrolReply {
	return &wire.EnrolReply{Refused: "control: " + fmt.Sprintf(format, args...)}
}

// signedRefusal is a refusal the control key signs as well, so that the
// executor may end its enrolment on it: of the token (proof "": no request
// made with it can succeed) or of one request whose proof verified (proof
// as it came). A request whose proof does not verify is never answered
// with one (see wire.EnrolRefusal).
func (c *Client) signedRefusal(token, proof string, format string, args ...any) *wire.EnrolReply {
	r := refusedReply(format, args...)
	payload, err := json.Marshal(&wire.EnrolRefusal{Token: token, Proof: proof, Reason: strings.TrimPrefix(r.Refused, "control: "), Issued: time.Now().UTC()})
	if err == nil {
		r.Refusal, err = wire.Seal(c.Keys.Signer(), wire.PurposeEnrolRefusal, payload)
	}
	if err != nil {
		c.log.Error("enrolment: the refusal could not be signed; it goes unsigned", "token", token, "err", err)
	}
	return r
}

// enrol answers one request: the token must exist, be unused, unexpired and
// unrevoked, the proof must verify under its secret over exactly the keys
// presented; then the token is spent (compare-and-set, so two requests
// cannot both use it), the node record made or renewed, and a grant signed.
//
// capability is what the agent said beside its request
// (link.CapabilityHeader): a node outside the version skew policy is
// refused before anything is spent, the refusal signed, so that its
// executor ends the enrolment saying why; the token stays unused.
func (c *Client) enrol(ctx context.Context, subject, capability string, data []byte) *wire.EnrolReply {
	id := strings.TrimPrefix(subject, wire.EnrolSubjectPrefix+".")
	var req wire.EnrolRequest
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return refusedReply("the request does not decode: %v", err)
	}
	if req.Token != id {
		return refusedReply("the request names token %q on the subject of token %q", req.Token, id)
	}
	e, err := c.KV.Get(ctx, tokenKey(id))
	if err != nil {
		return refusedReply("no token %s was issued here (or it was withdrawn)", id)
	}
	var t TokenRecord
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		return refusedReply("token %s: unreadable record", id)
	}
	now := time.Now()
	switch {
	case !t.Revoked.IsZero():
		return c.signedRefusal(id, "", "token %s was revoked at %s", id, t.Revoked.Format(time.RFC3339))
	case !t.Used.IsZero():
		if again := c.grantAgain(ctx, &t, &req, capability); again != nil {
			return again
		}
		return c.signedRefusal(id, "", "token %s was used already, at %s (by node %s); a token enrols once", id, t.Used.Format(time.RFC3339), t.UsedBy)
	case !now.Before(t.Expires):
		return c.signedRefusal(id, "", "token %s expired at %s, used or not; issue a new one", id, t.Expires.Format(time.RFC3339))
	}
	if err := req.Keys.Check(); err != nil {
		return refusedReply("%v", err)
	}
	proof, err := base64.StdEncoding.DecodeString(req.Proof)
	var secret [32]byte
	var tid [8]byte
	copy(secret[:], t.Secret)
	hex.Decode(tid[:], []byte(t.ID))
	if err != nil || !wire.CheckProof(secret, tid, &req.Keys, proof) {
		c.log.Warn("enrolment: proof refused", "token", id, "agent_nkey", req.Keys.AgentNKey)
		return refusedReply("the enrolment proof does not verify over the keys presented: a key was substituted on the way, or the proof was not made with this token's secret")
	}
	// From here the request is exactly the executor's: its refusals are
	// signed for it.
	refuse := func(format string, args ...any) *wire.EnrolReply {
		return c.signedRefusal(id, req.Proof, format, args...)
	}
	// Name the node.
	name := t.Node
	if t.New && name == "" {
		if name, err = c.freeName(ctx, req.Hostname); err != nil {
			return refuse("%v", err)
		}
	}
	agentCap, err := link.HeaderCapability(capability)
	if err != nil {
		return refuse("%v", err)
	}
	if err := link.CheckNode(name, agentCap); err != nil {
		return refuse("%v (the token is unused)", err)
	}
	// The identity the machine holds now: never left behind enrolled and
	// silent. Decided before the token is spent, so a refusal leaves the
	// token for the enrolment root means (with --replace, or another
	// token).
	replaced, why := c.heldIdentity(ctx, name, &t, &req.Keys, tid)
	if why != "" {
		c.log.Warn("enrolment: refused over the identity the machine holds", "token", id, "node", name, "held", req.Keys.Held.Name(), "why", why)
		return refuse("%s", why)
	}
	if t.Rekey {
		rec, _, err := c.Node(ctx, name)
		if err != nil {
			return refuse("rekey token %s: node %s: %v", id, name, err)
		}
		if why := rekeyStands(rec, &t); why != "" {
			c.log.Warn("enrolment: a rekey token refused", "token", id, "node", name, "why", why)
			return refuse("%s", why)
		}
	}
	// Spend the token first: whatever happens next, it never enrols twice.
	t.Used, t.UsedBy, t.UsedProof = now.UTC(), name, req.Proof
	t.Secret = nil // spent: nothing is left to prove with
	spent, _ := json.Marshal(&t)
	if _, err := c.KV.Update(ctx, tokenKey(id), spent, e.Revision()); err != nil {
		if changedMeanwhile(err) {
			return refusedReply("token %s was used already (a concurrent request took it)", id)
		}
		// The store refused the write (a full disk): the token is not
		// spent, and nothing else was done, so the agent's next request
		// with it can enrol. Serve says what keeps the store from writing.
		c.log.Error("enrolment: the token could not be spent; nothing done", "token", id, "node", name, "err", err)
		return refusedReply("token %s could not be spent, so nothing was done (%s); the token is unused, and the agent asks again", id, c.storeWhy(ctx, err))
	}
	// Then revoke what this enrolment replaces, before the new identity
	// exists: at no moment do both hold a live credential, and no grant is
	// signed unless the old one is gone.
	if replaced != nil {
		if err := c.revokeReplaced(ctx, replaced, name, &t); err != nil {
			c.log.Error("enrolment: the identity it replaces was not revoked; no grant", "token", id, "node", name, "replaced", replaced.Name(), "err", err)
			return c.signedRefusal(id, "", "%s was not revoked: %v (the token is spent; issue another)", replaced.Name(), err)
		}
	}
	var rb [10]byte
	rand.Read(rb[:])
	enrolment := "e-" + hex.EncodeToString(rb[:])
	if !t.New {
		// Before the record names the new enrolment, or the composer
		// (KeepComposed, watching the record) would compose for it the
		// overlay alone.
		c.carryJoin(ctx, name, enrolment)
	}
	rec, err := c.enrolRecord(ctx, name, enrolment, t.New, &t, &req, agentCap)
	if err != nil {
		c.log.Error("enrolment failed after the token was spent", "token", id, "node", name, "err", err)
		return c.signedRefusal(id, "", "the node record could not be written: %s (the token is spent; issue another)", c.storeWhy(ctx, err))
	}
	var carried *carriedDecl
	if !t.New {
		// What it was last declared, before the queue that holds it is
		// emptied (afterEnrol).
		carried = c.carryDeclaration(ctx, name)
	}
	if err := c.freshQueue(ctx, name); err != nil {
		return refusedReply("the node's queue: %v", err)
	}
	if err := c.keepProfile(ctx, name, req.Profile, req.Inventory); err != nil {
		// The node reports them again on change; the enrolment stands.
		c.log.Error(err.Error(), "node", name)
	}
	if c.brokerKnows != nil {
		for deadline := time.Now().Add(5 * time.Second); !c.brokerKnows(name, rec.NKey) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	g, err := c.signGrant(rec, &t, &req.Keys, replaced, agentCap)
	if err != nil {
		return refusedReply("signing the grant: %v", err)
	}
	reply := &wire.EnrolReply{Grant: g}
	if !t.New {
		// A re-enrolment: the node may have lost its store. Hand back,
		// signed for this enrolment, what it last reported it owns; the
		// executor takes it in only into an empty store.
		if sc, err := c.storeCopy(ctx, rec); err != nil {
			c.log.Warn("enrolment: no store copy handed back", "node", name, "err", err)
		} else {
			reply.StoreCopy = sc
		}
	}
	if replaced != nil {
		c.log.Info("enrolled, replacing", "node", name, "replaced", replaced.Name())
	}
	c.log.Info("enrolled", "node", name, "enrolment", rec.Enrolment, "token", id, "new", t.New, "store_copy", len(reply.StoreCopy) > 0)
	c.afterEnrol(ctx, name, carried)
	return reply
}

// storeWhy is err, after what serve says keeps the broker's store from
// writing when something does (a full disk), which the store's own error
// (a timeout, "insufficient resources") does not say.
func (c *Client) storeWhy(ctx context.Context, err error) string {
	if answered, p := askStore(ctx, c.NC); answered && p != "" {
		return p + ": " + err.Error()
	}
	return err.Error()
}

// freeName derives a node name from a hostname that no node has yet.
func (c *Client) freeName(ctx context.Context, hostname string) (string, error) {
	host, _, _ := strings.Cut(hostname, ".") // the host, not the domain
	base := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, host)
	base = strings.Trim(base, "-_")
	if len(base) > 56 {
		base = base[:56]
	}
	if link.ValidNodeName(base) != nil {
		base = "node"
	}
	for i := 1; i < 1000; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		if _, _, err := c.Node(ctx, name); err != nil {
			return name, nil
		}
	}
	return "", fmt.Errorf("no free node name for hostname %q", hostname)
}

// carryJoin carries a re-enrolled node's join (it reported its overlay
// applied in its enrolment, so its assignments go out) over to its new
// enrolment. A node's assignments are held until it reports its overlay
// applied in its enrolment, and a held node is composed what it was last
// declared in that enrolment: for a node re-enrolled, nothing yet, so
// without the join its first composition would be the overlay alone —
// every resource its modules made removed (files, services, packages),
// then made again once it reported the overlay. A node that never joined
// in its last enrolment has nothing to carry. A failed write leaves the
// hold as it was, which is said in the log.
func (c *Client) carryJoin(ctx context.Context, name, enrolment string) {
	rec, _, err := c.Node(ctx, name)
	if err != nil {
		return
	}
	var j joinedRecord
	e, err := c.KV.Get(ctx, joinedKey(name))
	if err != nil || json.Unmarshal(e.Value(), &j) != nil || j.Enrolment != rec.Enrolment {
		return
	}
	j.Enrolment = enrolment
	data, _ := json.Marshal(&j)
	if _, err := c.KV.Update(ctx, joinedKey(name), data, e.Revision()); err != nil {
		c.log.Warn("re-enrolment: the node's join was not carried over; its assignments are held until it reports its overlay applied", "node", name, "err", err)
	}
}

// enrolRecord makes the node's record (new) or renews it (a re-enrolment:
// the new enrolment id and NKey, its sequences kept going).
func (c *Client) enrolRecord(ctx context.Context, name, enrolment string, isNew bool, t *TokenRecord, req *wire.EnrolRequest, capability int) (*NodeRecord, error) {
	keys := req.Keys
	keys.Held = nil // the record keeps the node's keys, not what it replaced
	now := time.Now().UTC()
	for attempt := 0; attempt < 100; attempt++ {
		rec, rev, err := c.Node(ctx, name)
		if isNew {
			if err == nil {
				return nil, fmt.Errorf("node %q exists already", name)
			}
			rec = &NodeRecord{Name: name, NextSeq: 1, Created: now}
		} else if err != nil {
			return nil, err
		}
		if t.Rekey && (rec.Rekey == nil || rec.Rekey.Token != t.ID) {
			// Checked before the token was spent (rekeyStands); a
			// revocation since, which ends the rekey, must not be undone
			// by the write. (The one this enrolment made of the identity
			// it replaces leaves the rekey in place: revokeReplaced.)
			return nil, fmt.Errorf("node %s was revoked or enrolled again after rekey token %s was issued for it: a rekey renews a live node's keys only", name, t.ID)
		}
		rec.keepPast(now)
		rec.NKey, rec.Enrolment, rec.Revoked = keys.AgentNKey, enrolment, time.Time{}
		rec.Enrolled, rec.Token, rec.Keys, rec.Capability = now, t.ID, &keys, capability
		rec.EnrolledSeq = rec.NextSeq - 1
		rec.Rotations = nil // its token pinned the key in force
		rec.Rekey = nil     // the enrolment that asked is replaced
		data, _ := json.Marshal(rec)
		if isNew {
			_, err = c.KV.Create(ctx, nodeKey(name), data)
		} else {
			_, err = c.KV.Update(ctx, nodeKey(name), data, rev)
		}
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, err
		}
		if isNew {
			return nil, fmt.Errorf("node %q exists already", name)
		}
	}
	return nil, fmt.Errorf("node %s kept changing", name)
}

// UserJWT is the node's broker credential: a NATS user JWT for its NKey,
// issued by the nodes' account, with exactly link.NodePermissionsEither (the
// agent it is for may be of either layout), without expiry (revocation only).
// For a broker in operator mode the nodes' account key signs it on behalf of
// the node's own account (NodeAccountID), which lists that key; the agent
// signs in with the JWT itself then (the issuer account says so).
func (c *Client) UserJWT(node, nkey string) (string, error) {
	uc := jwt.NewUserClaims(nkey)
	uc.Name = node
	if c.Keys.Operator != nil {
		uc.IssuerAccount = NodeAccountID(node)
		// Issued by the key another serve of this key directory may
		// have announced or switched to meanwhile (account-key rotate).
		if err := c.Keys.nodes.refresh(); err != nil {
			return "", err
		}
	}
	pub, sub := link.NodePermissionsEither(node)
	uc.Pub.Allow.Add(pub...)
	uc.Sub.Allow.Add(sub...)
	return uc.Encode(c.Keys.nodes.issuer())
}

// grantAgain answers the request that spent token t, made again: the same
// proof, so the same keys (checked when it was spent). Its agent's wait
// ended before the grant came — a control side busy with many enrolments,
// a connection lost — and the executor still holds its enrolment pending;
// told the token was used, it ended the enrolment, while the registry held
// the node enrolled on keys no machine used. The grant is signed again for
// the enrolment the request made, while the node's record is still that
// enrolment's and live; nil otherwise (the refusal stands).
func (c *Client) grantAgain(ctx context.Context, t *TokenRecord, req *wire.EnrolRequest, capability string) *wire.EnrolReply {
	if t.UsedProof == "" || subtle.ConstantTimeCompare([]byte(t.UsedProof), []byte(req.Proof)) != 1 {
		return nil
	}
	rec, _, err := c.Node(ctx, t.UsedBy)
	if err != nil || rec.IsRevoked() || rec.Token != t.ID || rec.NKey != req.Keys.AgentNKey {
		return nil
	}
	agentCap, err := link.HeaderCapability(capability)
	if err != nil {
		return nil
	}
	var tid [8]byte
	hex.Decode(tid[:], []byte(t.ID))
	replaced, why := c.heldIdentity(ctx, rec.Name, t, &req.Keys, tid)
	if why != "" {
		return nil
	}
	g, err := c.signGrant(rec, t, &req.Keys, replaced, agentCap)
	if err != nil {
		return refusedReply("signing the grant: %v", err)
	}
	reply := &wire.EnrolReply{Grant: g}
	if !t.New {
		if sc, err := c.storeCopy(ctx, rec); err == nil {
			reply.StoreCopy = sc
		}
	}
	c.log.Info("enrolment: the request that used the token made again; its grant signed again", "token", t.ID, "node", rec.Name, "enrolment", rec.Enrolment)
	return reply
}

// signGrant signs the grant for rec's new enrolment; replaced, when not
// nil, is the identity it replaced (revoked, or found not live).
//
// capability is the agent's (link.Capability): a grant names the recovery
// key only to a node whose executor reads the field (capability 1 on; the
// agent and the executor of a node are one release).
func (c *Client) signGrant(rec *NodeRecord, t *TokenRecord, keys *wire.EnrolKeys, replaced *wire.HeldIdentity, capability int) ([]byte, error) {
	token, err := c.UserJWT(rec.Name, keys.AgentNKey)
	if err != nil {
		return nil, err
	}
	g := wire.Grant{
		Node: rec.Name, Enrolment: rec.Enrolment, Token: t.ID, SeqFloor: rec.EnrolledSeq,
		IdentityKey: wire.KeyIDOf(keys.Identity), SealingKey: wire.KeyIDOf(keys.Sealing), WireGuardKey: wire.KeyIDOf(keys.WireGuard),
		AgentNKey: keys.AgentNKey, UserJWT: token, Issued: time.Now().UTC(),
	}
	if replaced != nil {
		g.ReplacedNode, g.ReplacedEnrolment = replaced.Node, replaced.Enrolment
	}
	if c.Keys.Recovery != nil && capability >= 1 {
		g.RecoveryKey = base64.StdEncoding.EncodeToString(c.Keys.Recovery)
	}
	payload, err := json.Marshal(&g)
	if err != nil {
		return nil, err
	}
	return wire.Seal(c.Keys.Signer(), wire.PurposeGrant, payload)
}

// keptProfile is what a node last said it can do and is.
type keptProfile struct {
	At        time.Time       `json:"at"`
	Profile   json.RawMessage `json:"profile,omitempty"`
	Inventory json.RawMessage `json:"inventory,omitempty"`
}

func (c *Client) keepProfile(ctx context.Context, node string, profile, inventory json.RawMessage) error {
	if len(profile) == 0 && len(inventory) == 0 {
		return nil
	}
	data, _ := json.Marshal(&keptProfile{At: time.Now().UTC(), Profile: profile, Inventory: inventory})
	if _, err := c.putRetrying(ctx, "profile."+node, data); err != nil {
		return fmt.Errorf("registry: the profile of %s: %w", node, err)
	}
	return nil
}

// storeCopy signs, for rec's new enrolment, the last copy of what the node
// reported it owns; nil when it never reported any.
func (c *Client) storeCopy(ctx context.Context, rec *NodeRecord) ([]byte, error) {
	oc := c.lastOwned(ctx, rec.Name)
	if oc == nil {
		return nil, nil
	}
	payload, err := json.Marshal(&wire.StoreCopy{Node: rec.Name, Enrolment: rec.Enrolment, FromEnrolment: oc.Enrolment,
		FromSeq: oc.Seq, Reported: oc.Reported, Entries: oc.Entries})
	if err != nil {
		return nil, err
	}
	return wire.Seal(c.Keys.Signer(), wire.PurposeStoreCopy, payload)
}

// heldIdentity decides over the identity the machine holds (the request's
// Keys.Held), for an enrolment as node name with token t. It returns the
// identity this enrolment replaces (to be revoked, or already not live,
// and said so in the grant), or why the request is refused; neither when
// the machine holds nothing, or is enrolled again as the node it is.
//
//   - a token --node for the node it holds: that node's identity was
//     revoked when the token was issued; nothing is left behind.
//   - a held identity that is not live (no such node, another enrolment
//     since, or revoked): nothing is left behind either.
//   - a live one without Replace: refused — the machine would become a
//     second node and leave this one enrolled and silent.
//   - a live one with Replace: its signature must verify under the
//     identity key the node's record holds, over this very request (so a
//     compromised agent can neither forge one nor replay one to revoke
//     another node); then it is replaced.
func (c *Client) heldIdentity(ctx context.Context, name string, t *TokenRecord, keys *wire.EnrolKeys, tid [8]byte) (*wire.HeldIdentity, string) {
	h := keys.Held
	if h == nil {
		return nil, ""
	}
	replaced := func() *wire.HeldIdentity {
		if !h.Replace {
			return nil
		}
		r := *h
		r.Signature = nil
		return &r
	}
	if !t.New && h.Node == name {
		return replaced(), ""
	}
	rec, _, err := c.Node(ctx, h.Node)
	if err != nil || rec.Enrolment != h.Enrolment || (rec.NKey == "" && !rec.Revoked.IsZero()) {
		return replaced(), ""
	}
	target := "a new node (" + name + ")"
	if !t.New {
		target = "node " + name
	}
	if !h.Replace {
		return nil, fmt.Sprintf("this machine is enrolled as %s, which is live: a token for %s would leave %s enrolled and silent. To replace it, run mesh-executor enrol --replace (the control side revokes %s in the same step); to enrol it as %s again, issue a token --node %s",
			h.Name(), target, h.Node, h.Node, h.Node, h.Node)
	}
	switch {
	case rec.Keys == nil || rec.Keys.Identity == "":
		return nil, fmt.Sprintf("node %s's record holds no identity key to check the replacement against (it was not enrolled through a token): revoke it (mesh-control node revoke %s), then enrol again", h.Node, h.Node)
	case !wire.VerifyHeld(rec.Keys.Identity, tid, keys):
		return nil, fmt.Sprintf("the replacement of %s is not signed by that node's identity key over this request: only the machine holding %s may replace it", h.Name(), h.Node)
	}
	return replaced(), ""
}

// revokeReplaced revokes the identity an enrolment replaces: the node's
// record loses its NKey (the broker refuses it, and cuts it off if
// connected), updated with a revision check like every registry change.
// Only that enrolment is revoked: if the record has moved on to another
// enrolment since (re-enrolled elsewhere), or is revoked already, there
// is nothing left to revoke.
//
// The rekey pending on the record goes with the revocation, unless t is
// its token: the rekey's own enrolment replaces the identity that asked.
func (c *Client) revokeReplaced(ctx context.Context, h *wire.HeldIdentity, by string, t *TokenRecord) error {
	for attempt := 0; attempt < 100; attempt++ {
		rec, rev, err := c.Node(ctx, h.Node)
		if err != nil || rec.Enrolment != h.Enrolment || (rec.NKey == "" && !rec.Revoked.IsZero()) {
			return nil
		}
		pending := rec.Rekey
		rekey := revokeRecord(rec)
		if t.Rekey && pending != nil && pending.Token == t.ID {
			rec.Rekey, rekey = pending, ""
		}
		data, _ := json.Marshal(rec)
		if _, err = c.KV.Update(ctx, nodeKey(h.Node), data, rev); err == nil {
			c.log.Info("node revoked", "node", h.Node, "why", "replaced by node "+by+" (enrol --replace)")
			c.withdrawRekey(ctx, h.Node, rekey)
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("registry: %w", err)
		}
	}
	return fmt.Errorf("registry: node %s kept changing", h.Node)
}
