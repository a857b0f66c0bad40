package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The agent's half of enrolment. While hosted it asks the executor, every
// EnrolPoll, whether root has begun an enrolment (mesh-executor enrol);
// when one is offered it dials the broker in the token with the token's
// one-time credential (the certificate pinned inside the handshake, as
// always), presents the executor's public keys, its own NKey and the
// executor's proof, and hands whatever comes back — a grant, the control
// side's signed refusal, or why there is neither — to the executor, which
// alone decides. The agent never sees the token's secret, so it cannot
// make a proof for a key of its own; and its own word ("refused") ends
// nothing root began: only a grant, a signed refusal, root or the token's
// expiry does.

// seedFile keeps the agent's NKey seed while it is hosted; once enrolled
// the seed lives in the config beside its grant.
const seedFile = "nkey.seed"

// A token's one-time credential refused is tried tokenLearnTries times,
// tokenLearnWait apart, before the refusal is said: the control side lets
// a token in once its serve has read the token from the registry, which
// may be a moment after `mesh-control token issue` printed it (a token
// piped straight into enrol, an agent already waiting).
const (
	tokenLearnTries = 5
	tokenLearnWait  = time.Second
)

// hostedKey loads or makes the agent's NKey. It is the agent's own: made
// here, never sent anywhere; only its public half is given out. It is
// written whole or not at all (a temporary beside it, synced, renamed):
// a write cut short — a full disk, a crash — once left an empty file that
// no start could read, the agent off for good. An empty file, which an
// earlier release may have left so, is one no key was ever read from, and
// is made anew.
func hostedKey(stateDir string) (nkeys.KeyPair, error) {
	if stateDir == "" {
		return nkeys.CreateUser()
	}
	p := filepath.Join(stateDir, seedFile)
	if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) != "" {
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return kp, nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := statedir.WriteBytes(p, append(seed, '\n'), 0o600); err != nil {
		return nil, err
	}
	return kp, nil
}

// keptKey is hostedKey, tried again while the disk holding the state is
// full: the agent waits for room, saying so, rather than exit and leave
// the node silent; nil when ctx ends first. With wait false (an agent
// that holds an identity, re-enrolling) a full disk returns nil at once:
// the enrolment it would replace is live until the new one is granted,
// so the agent goes on linked with it and tries again later (mayReenrol).
func keptKey(ctx context.Context, o Options, wait bool) (nkeys.KeyPair, error) {
	for said := false; ; said = true {
		if o.StateStill != nil && o.StateDir != "" && !o.StateStill() {
			return nil, fmt.Errorf("%w: %s; its key is read or made there no more, and the agent stops", errStateMoved, o.StateDir)
		}
		kp, err := hostedKey(o.StateDir)
		if err == nil || !diskFull(err) {
			return kp, err
		}
		if !wait {
			return nil, nil
		}
		if !said {
			o.Log.Warn("the agent's NKey cannot be kept: its state directory's disk is full; trying again every 5s", "state", o.StateDir, "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(5 * time.Second):
		}
	}
}

// diskFull says whether err is a write the disk had no room (or quota) for.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// hosted waits for an enrolment and carries it out. It returns the new
// identity, or nil when ctx ends, or ErrUpgraded. With reenrol (the agent
// holds an identity and the executor began another enrolment), it returns
// nil as soon as no enrolment is pending any more.
func hosted(ctx context.Context, o Options, reenrol bool) (*Identity, error) {
	kp, err := keptKey(ctx, o, !reenrol)
	if err != nil {
		return nil, fmt.Errorf("the agent's NKey: %w", err)
	}
	if kp == nil {
		return nil, nil
	}
	pub, _ := kp.PublicKey()
	ex := &execClient{path: o.Socket, uid: o.ExecutorUID, vsock: o.Vsock, version: o.Version, build: o.Build}
	defer ex.close()
	if !reenrol {
		o.Log.Info("hosted: no identity; not dialling. Waiting for root to begin an enrolment (mesh-executor enrol)", "state", link.StateHosted, "agent_nkey", pub)
	}
	lastErr, lastNoGrant := "", ""
	for {
		b, err := ex.ask(wire.KindEnrol, &wire.Enrol{AgentNKey: pub}, "enrol")
		switch {
		case errors.Is(err, ErrUpgraded):
			return nil, err
		case err != nil:
			// Said once for each way it fails, not at each poll: an
			// executor not answering (a wrong --socket, one not started
			// yet) is what an operator waiting for the enrolment needs to
			// see, and would not without -v.
			if err.Error() != lastErr {
				o.Log.Info("hosted: the executor did not answer whether an enrolment is pending; asking again every "+o.EnrolPoll.String(), "socket", o.Socket, "err", err)
				lastErr = err.Error()
			}
		case !b.(*wire.EnrolOffer).Pending && len(b.(*wire.EnrolOffer).Granted) > 0:
			// Stopped after the executor recorded a grant for this NKey:
			// finished from its copy.
			id, err := keepGrant(o, kp, b.(*wire.EnrolOffer).Granted, b.(*wire.EnrolOffer))
			if err == nil {
				o.Log.Info("enrolled: finished from the executor's copy of the grant", "node", id.Node, "enrolment", id.Enrolment)
				return id, nil
			}
			o.Log.Warn("the executor's copy of the grant was not taken", "err", err)
		case !b.(*wire.EnrolOffer).Pending:
			if reenrol {
				o.Log.Info("no enrolment pending any more: going on with the identity held")
				return nil, nil
			}
		default:
			id, err := enrolWith(ctx, o, ex, kp, b.(*wire.EnrolOffer), &lastNoGrant)
			if errors.Is(err, ErrUpgraded) {
				return nil, err
			}
			if err != nil {
				o.Log.Error("enrolment: " + err.Error())
			}
			if id != nil {
				return id, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(o.EnrolPoll):
		}
	}
}

// enrolWith makes the request an offer describes and hands the answer to
// the executor. A nil identity with a nil error means "not this time".
//
// said is the last "no grant" said at warning, kept across the polls: the
// same one again (a broker down for an hour, asked every 2 s) is said at
// debug, not once a poll.
func enrolWith(ctx context.Context, o Options, ex *execClient, kp nkeys.KeyPair, offer *wire.EnrolOffer, said *string) (*Identity, error) {
	log := o.Log.With("token", offer.Token)
	tell := func(by, reason string, final bool) error {
		level := slog.LevelWarn
		if this := fmt.Sprint(offer.Token, by, reason, final); this == *said {
			level = slog.LevelDebug
		} else {
			*said = this
		}
		log.Log(ctx, level, "enrolment: no grant", "refused_by", by, "reason", reason, "final", final)
		_, err := ex.ask(wire.KindGrant, &wire.GrantHandover{RefusedBy: by, Reason: reason, Final: final}, "grant")
		return err
	}
	pin, err := link.ParseFingerprint(offer.Fingerprint)
	if err != nil || len(offer.Credential) != 32 || len(offer.ControlKey) != ed25519.PublicKeySize {
		return nil, tell("agent", "the executor's offer is malformed", true)
	}
	cred, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, offer.Credential)
	if err != nil {
		return nil, tell("agent", "the token's credential is not a user key", true)
	}
	credPub, _ := cred.PublicKey()
	pins := &pinWatch{}
	start := clock.Now()
	dial := func(signIn nats.Option) (*nats.Conn, error) {
		return nats.Connect(offer.BrokerURL,
			nats.Name("mesh-agent/enrol"),
			nats.Secure(link.PinnedTLS(pin, pins.note)),
			signIn,
			nats.CustomInboxPrefix(link.EnrolInbox(offer.Token)),
			nats.Timeout(link.ConnectTimeout), // as the link's: a busy broker's handshake is waited for
			nats.NoReconnect(),
		)
	}
	var nc *nats.Conn
	for try := 1; ; try++ {
		nc, err = dial(nats.Nkey(credPub, cred.Sign))
		if err != nil && explain(offer.BrokerURL, err, pins.since(start)).Reason == LinkAuthorization {
			// A broker in NATS operator mode knows no NKey user: it knows
			// the token as an account of its own, whose key is the same
			// one-time credential (control.TokenAccountID), and takes a
			// user JWT that key signs. The token does not say which broker
			// it is, so the NKey is tried first, and this when it is
			// refused.
			var signIn nats.Option
			if signIn, err = tokenSignIn(offer.Credential, offer.Token); err == nil {
				nc, err = dial(signIn)
			}
		}
		// A token just issued is let in once the control side has read it
		// from its registry, a moment after `token issue` returned: a
		// refusal in that moment is asked again before it is said, rather
		// than held against the token until root enrols again.
		if err == nil || try == tokenLearnTries || explain(offer.BrokerURL, err, pins.since(start)).Reason != LinkAuthorization {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil // not this time: the agent stops
		case <-time.After(tokenLearnWait):
		}
	}
	if err != nil {
		le := explain(offer.BrokerURL, err, pins.since(start))
		switch le.Reason {
		case LinkFingerprint:
			return nil, tell("agent", "the broker's certificate is not the one the token pinned: "+le.Msg, true)
		case LinkAuthorization:
			return nil, tell("broker", fmt.Sprintf("the broker at %s refused the token's one-time credential: the token was used already, revoked, expired more than a day ago, or issued by another mesh", offer.BrokerURL), true)
		}
		return nil, tell("broker", le.Msg, false)
	}
	defer nc.Close()
	req := wire.EnrolRequest{Token: offer.Token, Keys: offer.Keys, Proof: base64.StdEncoding.EncodeToString(offer.Proof),
		Hostname: offer.Hostname, Profile: offer.Profile, Inventory: offer.Inventory}
	data, _ := json.Marshal(&req)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	msg, err := nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: wire.EnrolSubjectPrefix + "." + offer.Token, Data: data,
		Header: nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}}})
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, tell("broker", "no enrolment responder answers on the broker (is mesh-control serve running?)", false)
		}
		return nil, tell("broker", "the enrolment request: "+err.Error(), false)
	}
	var reply wire.EnrolReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, tell("control", "the control side's answer does not decode", false)
	}
	if len(reply.Grant) == 0 {
		reason := strings.TrimPrefix(reply.Refused, "control: ")
		if len(reply.Refusal) == 0 {
			return nil, tell("control", reason, true)
		}
		// Signed: the executor judges whether it answers its own request
		// and so ends the enrolment; the agent only carries it.
		log.Warn("enrolment: refused by the control side (signed)", "reason", reason)
		b, err := ex.ask(wire.KindGrant, &wire.GrantHandover{Envelope: reply.Refusal, RefusedBy: "control", Reason: reason, Final: true}, "grant")
		if err != nil {
			return nil, err
		}
		if gr := b.(*wire.GrantReply); gr.Reason != "" {
			log.Info("enrolment: the executor on the refusal: " + gr.Reason)
		}
		return nil, nil
	}
	b, err := ex.ask(wire.KindGrant, &wire.GrantHandover{Envelope: reply.Grant, StoreCopy: reply.StoreCopy}, "grant")
	if err != nil {
		return nil, err
	}
	gr := b.(*wire.GrantReply)
	if !gr.Enrolled {
		return nil, fmt.Errorf("the executor refused the grant: %s", gr.Reason)
	}
	// The executor has recorded it; the agent reads what it needs from
	// the same grant (its JWT), checked against the pinned key as well.
	id, err := keepGrant(o, kp, reply.Grant, offer)
	if err != nil {
		return nil, err
	}
	log.Info("enrolled", "node", id.Node, "enrolment", id.Enrolment, "recovered", gr.Recovered)
	return id, nil
}

// keepGrant makes the agent's identity from a grant the executor recorded
// (offer says where the broker is, its certificate and the control key the
// token pinned), checked under that key, and writes it to its config; the
// NKey's seed kept apart while hosted is then dropped.
func keepGrant(o Options, kp nkeys.KeyPair, grant []byte, offer *wire.EnrolOffer) (*Identity, error) {
	pin, err := link.ParseFingerprint(offer.Fingerprint)
	if err != nil {
		return nil, fmt.Errorf("the grant's broker fingerprint: %w", err)
	}
	payload, err := wire.Open(ed25519.PublicKey(offer.ControlKey), wire.PurposeGrant, grant)
	if err != nil {
		return nil, fmt.Errorf("the grant: %w", err)
	}
	g, err := wire.ParseGrant(payload)
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	if g.AgentNKey != pub {
		return nil, fmt.Errorf("the grant is for NKey %s, not this agent's (%s)", g.AgentNKey, pub)
	}
	seed, _ := kp.Seed()
	cfg := &Config{
		BrokerURL: offer.BrokerURL, BrokerFingerprint: pin, ControlKey: base64.StdEncoding.EncodeToString(offer.ControlKey),
		Node: g.Node, Enrolment: g.Enrolment, NKeySeed: string(seed), UserJWT: g.UserJWT,
	}
	id, err := cfg.Identity()
	if err != nil {
		return nil, err
	}
	if o.ConfigPath != "" {
		if err := statedir.WriteFile(o.ConfigPath, cfg); err != nil {
			o.Log.Error("enrolled, but the identity could not be kept; the agent finishes from the executor's copy of the grant when it starts again", "config", o.ConfigPath, "err", err)
		} else if o.StateDir != "" && (o.StateStill == nil || o.StateStill()) {
			os.Remove(filepath.Join(o.StateDir, seedFile))
		}
	}
	return id, nil
}

// finishGranted finishes an enrolment the agent was stopped in after the
// executor recorded its grant and before the agent wrote its config (kill
// -9, a power cut): the NKey's seed is still kept apart, and the executor
// holds a grant for it (enrol.Granted). It returns the identity so made,
// or nil when there is none to finish.
func finishGranted(o Options) *Identity {
	if o.StateDir == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(o.StateDir, seedFile)); err != nil {
		return nil
	}
	kp, err := hostedKey(o.StateDir)
	if err != nil {
		return nil
	}
	pub, _ := kp.PublicKey()
	ex := &execClient{path: o.Socket, uid: o.ExecutorUID, vsock: o.Vsock, version: o.Version, build: o.Build}
	defer ex.close()
	b, err := ex.ask(wire.KindEnrol, &wire.Enrol{AgentNKey: pub}, "enrol")
	if err != nil {
		return nil
	}
	offer := b.(*wire.EnrolOffer)
	if offer.Pending || len(offer.Granted) == 0 {
		return nil
	}
	id, err := keepGrant(o, kp, offer.Granted, offer)
	if err != nil {
		o.Log.Warn("the executor's copy of the grant was not taken", "err", err)
		return nil
	}
	o.Log.Info("enrolled: finished from the executor's copy of the grant (the agent had stopped before keeping it)", "node", id.Node, "enrolment", id.Enrolment)
	return id
}

// tokenSignIn is how a token's one-time credential signs in to a broker
// in operator mode: a user JWT for the credential's user key, issued by
// the same key as the token's account. The permissions it writes are the
// token's own subjects; the account, which imports the token's enrolment
// subject alone, is what holds the credential to them.
func tokenSignIn(credential []byte, tokenID string) (nats.Option, error) {
	user, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, credential)
	if err != nil {
		return nil, err
	}
	account, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, credential)
	if err != nil {
		return nil, err
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "enrol-" + tokenID
	ps, ss := link.EnrolPermissions(tokenID)
	uc.Pub.Allow.Add(ps...)
	uc.Sub.Allow.Add(ss...)
	token, err := uc.Encode(account)
	if err != nil {
		return nil, err
	}
	return nats.UserJWT(func() (string, error) { return token, nil }, user.Sign), nil
}
