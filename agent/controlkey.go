package agent

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// controlKey is the control key the agent's own checks use: the one its
// enrolment pinned (its config), until its executor says another is in
// force — after a rotation the executor took (learnControlKey).
func (a *Agent) controlKey() ed25519.PublicKey {
	if k := a.ctlKey.Load(); k != nil {
		return *k
	}
	return a.id.ControlKey
}

// open is wire.Open under the control key, for the agent's early checks.
// An envelope signed by another key is taken to the executor first, with
// the rotations the control side sent beside it (link.RotationHeader, as
// sent): the executor judges them against what it pinned and says which
// key is in force — the control key rotated, or this agent started with
// its enrolment's key after a rotation its executor took. The agent
// believes no rotation of its own reading; it checks again under the key
// the executor holds.
func (a *Agent) open(purpose wire.Purpose, env []byte, rotations string) ([]byte, error) {
	payload, err := wire.Open(a.controlKey(), purpose, env)
	if !errors.Is(err, wire.ErrWrongKey) {
		return payload, err
	}
	refused, lerr := a.learnControlKey(rotations)
	if lerr != nil {
		return nil, &keyUnasked{wrong: err, ask: lerr}
	}
	if payload, err = wire.Open(a.controlKey(), purpose, env); !errors.Is(err, wire.ErrWrongKey) {
		return payload, err
	}
	if refused != "" {
		return nil, fmt.Errorf("%w; a rotation of the control key came with it, and was refused: %s", err, refused)
	}
	return nil, fmt.Errorf("%w; no rotation from the control key this node holds (%s) came with it: signed before a rotation this node has taken (declare again), or, if the control key was rotated longer ago than the control side keeps its rotations, enrol this node again (mesh-executor enrol)", err, wire.KeyID(a.controlKey()))
}

// keyUnasked is open's answer to an envelope signed by a key other than
// the agent holds when the executor, which says which key is in force,
// could not be asked (stopped, restarting, busy past its deadline): no
// verdict on the envelope, which is read and judged again once the
// executor answers — a declaration signed by a rotated key and read while
// the executor was down is forwarded when it is back, not refused for
// good. It is ErrWrongKey (so what passes a wrong key over until a
// rotation is taken does so here too) and the ask's error.
type keyUnasked struct{ wrong, ask error }

func (e *keyUnasked) Error() string {
	return fmt.Sprintf("%v (the executor could not be asked which control key is in force: %v)", e.wrong, e.ask)
}

func (e *keyUnasked) Unwrap() []error { return []error{e.wrong, e.ask} }

// learnControlKey hands the executor the rotations (a RotationHeader's
// value; "" asks only) and takes the key it says is in force. It returns
// the executor's refusal of a rotation, if any.
func (a *Agent) learnControlKey(rotations string) (refused string, err error) {
	chain, err := wire.DecodeRotationChain(rotations)
	if err != nil {
		return err.Error(), nil
	}
	b, err := a.exec.ask(wire.KindKeyRotation, &wire.KeyRotations{Envelopes: chain}, "key rotation")
	if err != nil {
		return "", err
	}
	r := b.(*wire.KeyRotationReply)
	if len(r.ControlKey) == ed25519.PublicKeySize {
		k := ed25519.PublicKey(r.ControlKey)
		changed := !k.Equal(a.controlKey())
		if changed {
			a.log.Warn("the control key in force is another", "from", wire.KeyID(a.controlKey()), "to", wire.KeyID(k), "rotations_taken", r.Taken)
		}
		a.ctlKey.Store(&k)
		if changed {
			// A roster the new key signed, passed over before, is read
			// again now (syncRoster).
			a.rosterDue.Store(true)
		}
	}
	return r.Refused, nil
}

// takePins takes the broker certificates the control side announces
// beside a declaration (a link.PinsHeader value; "" is none): a statement
// the control key signed, newer than the one taken last, is kept in the
// agent's state and accepted from the next handshake on. What does not
// verify is passed over: the header is the broker's to carry, not to say.
func (a *Agent) takePins(header string) {
	if header == "" {
		return
	}
	env, err := base64.StdEncoding.DecodeString(header)
	if err != nil {
		return
	}
	// Under the key the executor holds in force: one sent alone may come
	// before anything else the new key signed since this agent started.
	payload, err := a.open(wire.PurposeBrokerPins, env, "")
	if err != nil {
		a.log.Warn("passed over a statement of the broker's certificates that does not verify", "reason", err.Error())
		return
	}
	p, err := wire.ParseBrokerPins(payload)
	if err != nil {
		a.log.Warn("passed over a statement of the broker's certificates", "reason", err.Error())
		return
	}
	if p.Seq <= a.state.get().PinsSeq {
		return
	}
	// Judged again under the state's lock, and the pins kept there: a
	// statement beside a declaration (the worker) and one sent alone (the
	// heartbeat loop) may be taken at once, and the older must not win.
	taken := false
	if err := a.state.keep(func(s *State) {
		if taken = p.Seq > s.PinsSeq; taken {
			s.BrokerPins, s.PinsSeq, s.PinsEnrolment = p.Pins, p.Seq, a.id.Enrolment
		}
	}); err != nil {
		a.log.Warn("the broker's certificates, as the control side announces them, not taken: they could not be kept (taken when sent again)", "seq", p.Seq, "err", err.Error())
		return
	}
	if taken {
		// The newest kept, whichever of two statements taken at once
		// gets here last.
		a.id.setPins(a.state.get().BrokerPins)
		a.log.Warn("the broker's certificates, as the control side announces them", "seq", p.Seq, "pins", p.Pins)
	}
}

// takeUserJWT takes the broker credential the control side renewed (a
// link.UserJWTHeader notice): a wire.UserJWT statement the control key in
// force signed, for this node's enrolment, whose JWT is for this node's
// NKey and of the form a broker in operator mode takes. It is kept in the
// agent's state and signed in with from the next connection; the
// heartbeat names its issuer from then on. What does not verify is passed
// over: a JWT the broker made up would lock the node out of its link.
func (a *Agent) takeUserJWT(env []byte) {
	if len(env) == 0 || len(env) > wire.MaxUserJWT {
		return
	}
	payload, err := wire.Open(a.controlKey(), wire.PurposeUserJWT, env)
	if err != nil {
		a.log.Warn("passed over a renewed broker credential that does not verify", "reason", err.Error())
		return
	}
	u, err := wire.ParseUserJWT(payload)
	if err == nil && (u.Node != a.id.Node || u.Enrolment != a.id.Enrolment) {
		err = fmt.Errorf("it is for %s/%s, not this node's enrolment", u.Node, u.Enrolment)
	}
	if err == nil {
		err = a.jwtFor(u.JWT)
	}
	if err != nil {
		a.log.Warn("passed over a renewed broker credential", "reason", err.Error())
		return
	}
	if u.JWT == a.id.credential() {
		return
	}
	uc, _ := jwt.DecodeUserClaims(u.JWT)
	if err := a.state.keep(func(s *State) { s.UserJWT, s.JWTIssuer = u.JWT, uc.Issuer }); err != nil {
		a.log.Warn("a renewed broker credential not taken: it could not be kept (taken when sent again)", "err", err.Error())
		return
	}
	a.id.setJWT(u.JWT, uc.Issuer)
	a.log.Warn("the broker credential, renewed by the control side: signed in with from the next connection", "issuer", uc.Issuer)
	select {
	case a.hbNow <- struct{}{}:
	default:
	}
}

// jwtFor says why token is not a user JWT this node can sign in with to a
// broker in operator mode, nil when it is: for its NKey, on behalf of an
// account (the node's own), its signature sound.
func (a *Agent) jwtFor(token string) error {
	uc, err := jwt.DecodeUserClaims(token)
	switch {
	case err != nil:
		return fmt.Errorf("the JWT does not decode: %w", err)
	case uc.Subject != a.id.nkeyPublic:
		return errors.New("the JWT is for another NKey than this node's")
	case uc.IssuerAccount == "":
		return errors.New("the JWT names no account (not one a broker in operator mode takes)")
	}
	return nil
}
