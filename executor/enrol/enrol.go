// Package enrol is the executor's half of enrolment: it keeps the token's
// secret to itself, makes the node's keys, gives the agent only the
// network half of the token and a proof over the public keys, and records
// an identity only from a grant signed by the key the token pinned that
// answers exactly this enrolment.
//
// The steps, and who holds what:
//
//	mesh-executor enrol   (root)  token → Begin: pending.json holds the token
//	                              (with its secret) and the new private keys
//	mesh-agent            (agent) Enrol{its NKey} over the socket
//	mesh-executor serve   (root)  Offer: the network half, the public keys,
//	                              Proof(secret, keys + the agent's NKey)
//	mesh-agent                    dials the broker with the one-time
//	                              credential, presents keys + proof, gets a
//	                              grant (or a refusal) and hands it over
//	mesh-executor serve           Accept: verify the grant under the pinned
//	                              key, match it to this enrolment, then
//	                              record keys, floor, identity — in that order
//
// The agent never holds the secret, so it cannot make a proof for a key of
// its own; and whatever it hands back is checked against what the executor
// itself proved.
//
// An enrolled host that is enrolled again presents the identity it holds,
// signed with that identity's key over the new request (wire.HeldIdentity).
// The control side refuses a token that would leave that identity enrolled
// and silent, unless root asked to replace it (enrol --replace); then it
// revokes it in the same step as it grants the new one, and the grant says
// so.
//
// What ends a pending enrolment: a grant accepted; a refusal signed by the
// pinned key that answers this enrolment's own request (or refuses its
// token); root (enrol --cancel, or enrol again); the token's expiry. The
// agent's word — "the broker refused", "the control side refused", a grant
// that does not verify — ends nothing: it is noted as the agent's word
// (Result.Claimed), and the offer is held back for a while.
package enrol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The files of enrolment in the executor's state directory (root, 0600).
const (
	PendingFile = "enrolment-pending.json"
	ResultFile  = "enrolment-result.json"
	KeysFile    = "keys.json"
	// PendingWireGuardFile is the new WireGuard key a rekey's enrolment
	// presents, kept beside the pending enrolment rather than in it: the
	// release before reads the pending file strictly, and a rollback
	// during a rekey then finishes it as an ordinary replacement, with
	// the WireGuard key the executor has (see pendingWireGuard).
	PendingWireGuardFile = "enrolment-pending-wireguard.json"
)

// SealingKEM is the KEM of the sealing key: ML-KEM-768 with X25519, so
// sealed content stored in the broker today is not opened by a quantum
// computer tomorrow.
func SealingKEM() hpke.KEM { return hpke.MLKEM768X25519() }

// How long past its token's expiry (by this machine's clock) a pending
// enrolment is ended by the executor itself, and how long it must have
// been pending by then. Within it the control side still answers, signed,
// that the token expired. The margin keeps a clock a little ahead of the
// control side's from ending an enrolment the control side would still
// grant; the time pending, measured on this clock alone, keeps a clock
// hours ahead from ending at once, unasked, an enrolment with a token
// issued a minute ago: the control side, whose clock the token's expiry
// is written by, judges it then.
const ExpiryMargin = 15 * time.Minute

// ReofferAfter is how long an enrolment the agent says was refused for good
// is held back from the agent. The agent's word ends nothing, but an
// enrolled agent leaves its link to carry an enrolment out: without the
// pause it would leave it again at once, for a request that fails again.
// After it the agent tries once more.
const ReofferAfter = 5 * time.Minute

// mu orders the daemon's changes to the pending enrolment (offers, grants
// and refusals come on several connections at once), so that a refusal
// noted as a grant is accepted cannot bring the enrolment back. Between
// processes (root's enrol beside the daemon) the writes are whole-file
// renames; the last one wins.
var mu sync.Mutex

// LockFile is the enrolment's lock in the state directory: the daemon
// (offers, grants, refusals) and `mesh-executor enrol` (begin, cancel)
// are two processes changing one pending enrolment, and take it in turn.
const LockFile = "enrol.lock"

// lockWait is how long one waits for the other.
var lockWait = 10 * time.Second

// lock takes mu and the enrolment's lock on dir (never through a link);
// what holds it past lockWait is named by its pid. Only a beginning makes
// the lock file (create): before one there is no enrolment to change, and
// a refusal leaves the state directory as it was.
func lock(dir string, create bool) (func(), error) {
	mu.Lock()
	p := filepath.Join(dir, LockFile)
	flags := unix.O_RDWR | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	if create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			mu.Unlock()
			return nil, fmt.Errorf("enrol: %w", err)
		}
		flags |= unix.O_CREAT
	}
	fd, err := unix.Open(p, flags, 0o600)
	if errors.Is(err, unix.ENOENT) && !create {
		return mu.Unlock, nil
	}
	if err != nil {
		mu.Unlock()
		return nil, fmt.Errorf("enrol: the lock %s: %w", p, err)
	}
	for deadline := clock.Deadline(lockWait); ; {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd); mu.Unlock() }, nil
		}
		if err != unix.EWOULDBLOCK || clock.Past(deadline) {
			who := ""
			if pid := statedir.FlockHolder(fd); pid > 0 {
				who = fmt.Sprintf(" (pid %d holds it)", pid)
			}
			unix.Close(fd)
			mu.Unlock()
			return nil, fmt.Errorf("enrol: the enrolment of %s is being changed by another process%s: %w", dir, who, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pending is an enrolment begun and not finished.
type pending struct {
	Token    string    `json:"token"`    // the whole token, secret included
	Identity []byte    `json:"identity"` // Ed25519 seed
	Sealing  []byte    `json:"sealing"`  // the sealing KEM's private key
	Begun    time.Time `json:"begun"`
	// AgentNKey is the NKey the last offer's proof was made for: a grant
	// must name this one.
	AgentNKey string `json:"agent_nkey,omitempty"`
	// Held is the identity the host held when root began, as the last
	// offer presented it (signed for AgentNKey): what the control side
	// refuses to leave behind, or, with Replace, revokes.
	Held *wire.HeldIdentity `json:"held,omitempty"`
	// Claimed is when the agent last said the enrolment was refused for
	// good: its word, which ends nothing, holds the offer back for
	// ReofferAfter.
	Claimed time.Time `json:"claimed,omitzero"`
	// WireGuard is a new WireGuard private key (Options.NewWireGuard),
	// presented instead of the executor's own and put in its place when
	// the grant is accepted. Read from a pending file a development
	// build wrote with it inside; written to PendingWireGuardFile.
	WireGuard []byte `json:"wireguard,omitempty"`
	formatField
}

// pendingWireGuard is PendingWireGuardFile: the new WireGuard key, and
// the pending identity's public key it belongs to — a file left by an
// enrolment a rollback finished, or ended, answers to no later one.
type pendingWireGuard struct {
	Key      []byte `json:"key"`
	Identity string `json:"identity"`
	formatField
}

// writePending writes p, its new WireGuard key (if any) first and in its
// own file, so the pending file holds only what the release before reads.
func writePending(dir string, p *pending) error {
	q := *p
	if q.WireGuard != nil {
		if err := writeJSON(dir, PendingWireGuardFile, &pendingWireGuard{Key: q.WireGuard, Identity: pendingIdentity(&q)}); err != nil {
			return err
		}
		q.WireGuard = nil
	}
	return writeJSON(dir, PendingFile, &q)
}

// removePending ends the pending enrolment's files: the pending file
// first, whose absence says none is pending.
func removePending(dir string) error {
	err := os.Remove(filepath.Join(dir, PendingFile))
	os.Remove(filepath.Join(dir, PendingWireGuardFile))
	return err
}

// pendingIdentity names the pending enrolment by its identity key.
func pendingIdentity(p *pending) string {
	if len(p.Identity) != ed25519.SeedSize {
		return ""
	}
	return encodePub(ed25519.NewKeyFromSeed(p.Identity).Public().(ed25519.PublicKey))
}

// Result is how the last enrolment ended, or where it is: what
// `mesh-executor enrol` waits for and prints.
type Result struct {
	// Final: the enrolment ended (enrolled, refused by a signed answer,
	// cancelled by root, or its token expired).
	Final     bool      `json:"final"`
	Enrolled  bool      `json:"enrolled"`
	Node      string    `json:"node,omitempty"`
	Enrolment string    `json:"enrolment,omitempty"`
	Token     string    `json:"token"`
	RefusedBy string    `json:"refused_by,omitempty"` // executor, control, broker, agent, root
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
	// Claimed: the agent says the enrolment was refused for good (by
	// RefusedBy), or handed over something that cannot enrol it. Nothing
	// the executor can hold anyone to: the enrolment stays begun until a
	// signed answer, root or the token's expiry ends it.
	Claimed bool `json:"claimed,omitempty"`
	// Expires is the token's expiry, for saying how long a claimed
	// refusal leaves the enrolment begun.
	Expires time.Time `json:"expires,omitzero"`
	// Replaced names the identity an enrolment replaced ("node X
	// (enrolment Y)"), revoked on the control side as it granted this one.
	Replaced string `json:"replaced,omitempty"`
	formatField
}

func (r *Result) String() string {
	switch {
	case r.Enrolled && r.Replaced != "":
		return fmt.Sprintf("enrolled as node %s (enrolment %s), replacing %s: the control side revoked it in the same step", r.Node, r.Enrolment, r.Replaced)
	case r.Enrolled:
		return fmt.Sprintf("enrolled as node %s (enrolment %s)", r.Node, r.Enrolment)
	case r.Final && r.RefusedBy == "root":
		return "enrolment ended by root: " + r.Reason
	case r.Final:
		return fmt.Sprintf("enrolment refused by %s: %s", sideName(r.RefusedBy), r.Reason)
	case r.Claimed:
		who := fmt.Sprintf("enrolment refused by %s, as the agent reports it: %s", sideName(r.RefusedBy), r.Reason)
		switch r.RefusedBy {
		case "agent":
			who = "enrolment refused by the agent: " + r.Reason
		case "executor":
			who = "enrolment refused by the executor: " + r.Reason + " (what the agent handed over)"
		}
		until := "the token expires"
		if !r.Expires.IsZero() {
			until += " (" + r.Expires.Local().Format(time.RFC3339) + ")"
		}
		return who + "\nthe agent's word ends nothing: the enrolment stays begun until " + until +
			", a signed answer comes, or root ends it (mesh-executor enrol --cancel, or enrol again)"
	case r.Reason != "" && (r.RefusedBy == "agent" || r.RefusedBy == ""):
		return fmt.Sprintf("still trying (the agent: %s)", r.Reason)
	case r.Reason != "":
		return fmt.Sprintf("still trying (%s, as the agent reports it: %s)", r.RefusedBy, r.Reason)
	}
	return "waiting for the agent"
}

// sideName is who refused, RefusedBy, as a sentence says it.
func sideName(by string) string {
	if by == "control" {
		return "the control side"
	}
	return "the " + by
}

// Refusal is a refusal of root's request made before anything changed:
// `mesh-executor enrol` exits with "refused" on it.
type Refusal string

func (r Refusal) Error() string { return string(r) }

// Options are root's choices when it begins an enrolment.
type Options struct {
	// Replace: the host is enrolled, and root asks that the new identity
	// replace it — the control side revokes the old one in the same step
	// as it grants the new. Without it, the control side refuses a token
	// that would leave the identity the host holds enrolled and silent.
	Replace bool
	// NewWireGuard: the enrolment makes the executor a new WireGuard key
	// too, which takes the place of the one it has once the grant is
	// accepted (a rekey: every key of the node's is new).
	NewWireGuard bool
}

// Begin starts an enrolment with tok, without replacing; see BeginWith.
func Begin(dir string, tok *wire.Token) error { return BeginWith(dir, tok, Options{}) }

// BeginWith starts an enrolment with tok: it makes the identity and
// sealing keys, and the WireGuard key if the executor has none, and keeps
// them with the token until a grant is accepted. A pending enrolment is
// replaced (root's new word ends the old). The identity the host has now,
// if any, stays until then, and goes with the request (signed by its own
// key) so the control side never leaves it behind silently.
//
// With o.Replace it refuses (a Refusal, before anything is written) a host
// that holds no identity, or whose identity key is gone: nothing could be
// replaced, or nothing could prove that this host holds what it names.
func BeginWith(dir string, tok *wire.Token, o Options) error {
	// Refused before anything is made, then checked again under the lock.
	if _, err := heldIdentity(dir, o.Replace); err != nil {
		return err
	}
	unlock, err := lock(dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	return beginLocked(dir, tok, o)
}

// beginLocked is BeginWith under the enrolment's lock.
func beginLocked(dir string, tok *wire.Token, o Options) error {
	held, err := heldIdentity(dir, o.Replace)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("enrol: %w", err)
	}
	enc, err := tok.Encode()
	if err != nil {
		return fmt.Errorf("enrol: %w", err)
	}
	_, idKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	sk, err := SealingKEM().GenerateKey()
	if err != nil {
		return fmt.Errorf("enrol: sealing key: %w", err)
	}
	skb, err := sk.Bytes()
	if err != nil {
		return fmt.Errorf("enrol: sealing key: %w", err)
	}
	if _, _, err := overlay.EnsureKey(dir); err != nil {
		return fmt.Errorf("enrol: %w", err)
	}
	p := pending{Token: enc, Identity: idKey.Seed(), Sealing: skb, Begun: clock.Now().UTC(), Held: held}
	if o.NewWireGuard {
		wg, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return fmt.Errorf("enrol: WireGuard key: %w", err)
		}
		p.WireGuard = wg[:]
	}
	// An earlier enrolment's new WireGuard key goes with it.
	os.Remove(filepath.Join(dir, PendingWireGuardFile))
	if err := writePending(dir, &p); err != nil {
		return err
	}
	// Root's new word ends a rekey it asked for before: this enrolment
	// takes its place (a rekey's own answer begins one too).
	if err := os.Remove(filepath.Join(dir, RekeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("enrol: %w", err)
	}
	return writeJSON(dir, ResultFile, &Result{Token: tok.IDString(), At: clock.Now().UTC(), Expires: tok.Expires.UTC()})
}

// Held reads the identity the host holds, as an enrolment would present
// it (unsigned: the offer signs it); nil when hosted.
func Held(dir string) (*wire.HeldIdentity, error) { return heldIdentity(dir, false) }

func heldIdentity(dir string, replace bool) (*wire.HeldIdentity, error) {
	id, err := identity.Load(dir)
	if err != nil {
		if replace {
			return nil, Refusal(fmt.Sprintf("--replace: the identity this host holds does not read (%v): nothing can show the control side which node it is; revoke that node there (mesh-control node revoke NAME), then enrol without --replace", err))
		}
		// An identity that does not read is held by nobody: enrolling
		// is how such a host gets a working one again.
		return nil, nil
	}
	if id == nil {
		if replace {
			return nil, Refusal("--replace: this host holds no identity (it is hosted): there is nothing to replace; enrol without --replace")
		}
		return nil, nil
	}
	h := &wire.HeldIdentity{Node: id.Node, Enrolment: id.Enrolment, Replace: replace}
	if replace {
		if _, why := identityKey(dir, id); why != "" {
			return nil, Refusal(fmt.Sprintf("--replace: this host is enrolled as %s, but the identity key of that enrolment (%s) cannot be used (%s): nothing can show the control side that this host is %s. Revoke it there (mesh-control node revoke %s), then enrol without --replace",
				h.Name(), filepath.Join(dir, KeysFile), why, id.Node, id.Node))
		}
	}
	return h, nil
}

// identityKey is the keys of the enrolment id names, or why they cannot
// be used (what signs for the identity the host holds: a replacement, a
// rekey's request).
func identityKey(dir string, id *identity.Identity) (*Keys, string) {
	k, err := LoadKeys(dir)
	switch {
	case err != nil:
		return nil, err.Error()
	case k == nil:
		return nil, "it is not there"
	case k.Enrolment != id.Enrolment:
		return nil, "it is enrolment " + k.Enrolment + "'s"
	}
	return k, ""
}

// Offer answers an agent that asks whether an enrolment is pending, with
// its NKey. nil when none is (or its token has expired).
func Offer(dir, agentNKey string, hostname string, profile, inventory []byte) (*wire.EnrolOffer, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return nil, err
	}
	if expireLocked(dir, p, tok, clock.Now()) {
		return nil, nil
	}
	if !wire.ValidUserNKey(agentNKey) {
		return nil, fmt.Errorf("enrol: the agent's NKey %q is not a NATS user public key", agentNKey)
	}
	if p.AgentNKey != agentNKey || (p.Held != nil && p.Held.Signature == nil) {
		p.AgentNKey = agentNKey
		if err := p.signHeld(dir, tok); err != nil {
			return nil, err
		}
		if err := writePending(dir, p); err != nil {
			return nil, err
		}
	}
	keys, err := p.offeredKeys(dir)
	if err != nil {
		return nil, err
	}
	return &wire.EnrolOffer{
		Pending:     true,
		Token:       tok.IDString(),
		Expires:     tok.Expires.Unix(),
		BrokerURL:   tok.BrokerURL,
		Fingerprint: tok.FingerprintHex(),
		ControlKey:  tok.ControlKey,
		Credential:  tok.Credential[:],
		Keys:        *keys,
		Proof:       wire.Proof(tok.Secret, tok.ID, keys),
		Hostname:    hostname,
		Profile:     profile,
		Inventory:   inventory,
	}, nil
}

// signHeld signs the held identity for the keys of an offer to
// p.AgentNKey, with the key of that identity. Without a usable key the
// claim goes unsigned: it can refuse this enrolment, never revoke; root
// asked to replace, it is an error (BeginWith checked it could).
func (p *pending) signHeld(dir string, tok *wire.Token) error {
	if p.Held == nil {
		return nil
	}
	p.Held.Signature = nil
	keys, err := p.offeredKeys(dir)
	if err != nil {
		return err
	}
	old, err := LoadKeys(dir)
	switch {
	case err == nil && old != nil && old.Enrolment == p.Held.Enrolment:
		wire.SignHeld(old.Identity, tok.ID, keys)
		p.Held.Signature = keys.Held.Signature
	case p.Held.Replace:
		return fmt.Errorf("enrol: the identity key of %s is gone from %s, so the replacement cannot be signed; begin again", p.Held.Name(), KeysFile)
	}
	return nil
}

// offeredKeys are the keys the last offer presented, the held identity as
// signed then included: what the proof is over, and what a grant or a
// signed refusal must answer.
func (p *pending) offeredKeys(dir string) (*wire.EnrolKeys, error) {
	keys, err := p.publicKeys(dir, p.AgentNKey)
	if err != nil {
		return nil, err
	}
	if p.Held != nil {
		h := *p.Held
		keys.Held = &h
	}
	return keys, nil
}

// Accept takes what the agent brought back: a grant envelope, verified
// here under the key the token pinned and matched to this enrolment before
// anything is recorded; or the control side's signed refusal, which ends
// the enrolment only if it answers this enrolment's own request. It
// returns the new identity.
//
// What does not verify ends nothing: the agent is trusted for nothing, so
// it cannot end what root began by handing over garbage. It is noted as
// the agent's word (Result.Claimed).
func Accept(dir string, envelope []byte) (*identity.Identity, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, tok, err := loadPending(dir)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("no enrolment is pending on this host (run mesh-executor enrol first); the grant is not recorded")
	}
	payload, err := wire.Open(tok.ControlKey, wire.PurposeGrant, envelope)
	if errors.Is(err, wire.ErrWrongPurpose) {
		if refusal, rerr := wire.Open(tok.ControlKey, wire.PurposeEnrolRefusal, envelope); rerr == nil {
			return nil, refusedLocked(dir, p, tok, refusal)
		}
	}
	if err != nil {
		return nil, claimLocked(dir, p, tok, "executor", fmt.Sprintf("the grant does not verify under the control key the token pinned (%s): %v", wire.KeyID(tok.ControlKey), err))
	}
	g, err := wire.ParseGrant(payload)
	if err != nil {
		return nil, claimLocked(dir, p, tok, "executor", err.Error())
	}
	if p.AgentNKey == "" {
		// No proof was given out yet, so no grant can answer one: a
		// stale grant, or a made-up one. The genuine one can still come.
		noteResult(dir, &Result{Token: tok.IDString(), RefusedBy: "executor", Reason: "a grant arrived before any proof was given out", Expires: tok.Expires.UTC()})
		return nil, errors.New("a grant arrived before any proof was given out")
	}
	keys, err := p.offeredKeys(dir)
	if err != nil {
		return nil, err
	}
	if bad := g.Mismatch(tok.IDString(), keys); bad != "" {
		// Not final: a compromised agent may hand over a stale or
		// substituted grant; the genuine one can still come.
		noteResult(dir, &Result{Token: tok.IDString(), RefusedBy: "executor", Reason: "a grant for another enrolment was refused: " + bad, Expires: tok.Expires.UTC()})
		return nil, fmt.Errorf("the grant is not for this enrolment: %s", bad)
	}
	// The control key in force, and the recovery key the grant names,
	// for this enrolment.
	ck := &identity.ControlKeys{Node: g.Node, Enrolment: g.Enrolment, Key: tok.ControlKey}
	if g.RecoveryKey != "" {
		b, err := base64.StdEncoding.DecodeString(g.RecoveryKey)
		if err != nil || len(b) != ed25519.PublicKeySize {
			return nil, claimLocked(dir, p, tok, "executor", "the grant's recovery_key is not a base64 Ed25519 public key")
		}
		ck.Recovery = ed25519.PublicKey(b)
	}
	// Keys, then the floor, then the identity: until the identity is
	// written the host is not enrolled, and a crash leaves the pending
	// enrolment to finish again (its offer keeps the held identity's
	// signature, made while that identity's key was still there).
	seed := ed25519.NewKeyFromSeed(p.Identity)
	if err := writeJSON(dir, KeysFile, &storedKeys{Identity: seed.Seed(), Sealing: p.Sealing, Enrolment: g.Enrolment}); err != nil {
		return nil, err
	}
	if p.WireGuard != nil {
		// The key the grant names: the overlay takes it at its next
		// apply (the interface's key is read back against this file).
		wg, err := p.wireGuard(dir)
		if err != nil {
			return nil, err
		}
		if err := overlay.SaveKey(dir, wg); err != nil {
			return nil, err
		}
	}
	if err := identity.WriteFloor(dir, identity.Floor{Seq: g.SeqFloor, Enrolment: g.Enrolment}); err != nil {
		return nil, err
	}
	// Before the identity, so an enrolled host never lacks the recovery
	// key it was granted, nor keeps an earlier enrolment's rotations.
	if err := identity.SaveControlKeys(dir, ck); err != nil {
		return nil, err
	}
	// The grant, kept for the agent it names: an agent cut off between
	// this recording and its own (its config written) finishes from it
	// (Granted), rather than holding on to the identity replaced.
	if err := writeJSON(dir, GrantedFile, &granted{Grant: envelope, BrokerURL: tok.BrokerURL, Fingerprint: tok.FingerprintHex(),
		ControlKey: tok.ControlKey, AgentNKey: p.AgentNKey, Node: g.Node, Enrolment: g.Enrolment}); err != nil {
		return nil, err
	}
	id := &identity.Identity{Node: g.Node, Enrolment: g.Enrolment, ControlKey: tok.ControlKey, Keys: ck}
	if err := identity.Save(dir, id); err != nil {
		return nil, err
	}
	removePending(dir)
	r := &Result{Final: true, Enrolled: true, Node: g.Node, Enrolment: g.Enrolment, Token: tok.IDString()}
	if g.ReplacedNode != "" {
		r.Replaced = (&wire.HeldIdentity{Node: g.ReplacedNode, Enrolment: g.ReplacedEnrolment}).Name()
	}
	noteResult(dir, r)
	return id, nil
}

// refusedLocked takes the control side's signed refusal: it ends the
// enrolment when it answers this enrolment's own request (or refuses the
// token itself); one that answers another request made with this token
// (the agent's doing) ends nothing.
func refusedLocked(dir string, p *pending, tok *wire.Token, payload []byte) error {
	r, err := wire.ParseEnrolRefusal(payload)
	if err != nil {
		return claimLocked(dir, p, tok, "executor", err.Error())
	}
	var proof []byte
	if p.AgentNKey != "" {
		keys, err := p.offeredKeys(dir)
		if err != nil {
			return err
		}
		proof = wire.Proof(tok.Secret, tok.ID, keys)
	}
	if !r.Answers(tok.IDString(), proof) {
		noteResult(dir, &Result{Token: tok.IDString(), RefusedBy: "control", Expires: tok.Expires.UTC(),
			Reason: "it refused a request this executor did not make (another proof, or another token): " + r.Reason})
		return fmt.Errorf("the control side's refusal answers another request, not this enrolment's: %s", r.Reason)
	}
	removePending(dir)
	noteResult(dir, &Result{Final: true, Token: tok.IDString(), RefusedBy: "control", Reason: r.Reason, Expires: tok.Expires.UTC()})
	return fmt.Errorf("the control side refused this enrolment (signed): %s", r.Reason)
}

// claimLocked notes what the agent says, or handed over, as its word: the
// enrolment stays begun, held back from the agent for ReofferAfter.
func claimLocked(dir string, p *pending, tok *wire.Token, by, reason string) error {
	p.Claimed = clock.Now().UTC()
	if err := writePending(dir, p); err != nil {
		return err
	}
	noteResult(dir, &Result{Claimed: true, Token: tok.IDString(), RefusedBy: by, Reason: reason, Expires: tok.Expires.UTC()})
	return errors.New(reason)
}

// Refused records that the agent could not get a grant, by its account:
// passing when it could not reach the broker or the control side (it
// tries again), final when it says they refused. Either way it is only
// the agent's word and ends nothing: a final one is noted as claimed and
// holds the offer back for ReofferAfter. Only a signed refusal (Accept),
// root (Cancel, or BeginWith again) or the token's expiry ends the
// enrolment.
func Refused(dir, by, reason string, final bool) error {
	unlock, err := lock(dir, false)
	if err != nil {
		return err
	}
	defer unlock()
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return err
	}
	if reason == "" {
		reason = "it gave no reason"
	}
	if final {
		claimLocked(dir, p, tok, by, reason)
		return nil
	}
	noteResult(dir, &Result{Token: tok.IDString(), RefusedBy: by, Reason: reason, Expires: tok.Expires.UTC()})
	return nil
}

// Cancel ends the pending enrolment on root's word (mesh-executor enrol
// --cancel). It returns the token id of the enrolment ended, "" when none
// was pending. The identity the host holds, if any, stays.
func Cancel(dir string) (string, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return "", err
	}
	defer unlock()
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return "", err
	}
	if err := removePending(dir); err != nil {
		return "", fmt.Errorf("enrol: %w", err)
	}
	noteResult(dir, &Result{Final: true, Token: tok.IDString(), RefusedBy: "root", Reason: "cancelled (mesh-executor enrol --cancel)", Expires: tok.Expires.UTC()})
	return tok.IDString(), nil
}

// expired says whether p has outlived its token by this machine's clock
// (see ExpiryMargin).
func expired(p *pending, tok *wire.Token, now time.Time) bool {
	return now.After(tok.Expires.Add(ExpiryMargin)) && now.Sub(p.Begun) > ExpiryMargin
}

// expireLocked ends p when it has outlived its token (expired).
func expireLocked(dir string, p *pending, tok *wire.Token, now time.Time) bool {
	if !expired(p, tok, now) {
		return false
	}
	removePending(dir)
	noteResult(dir, &Result{Final: true, Token: tok.IDString(), RefusedBy: "executor", Expires: tok.Expires.UTC(),
		Reason: fmt.Sprintf("the token expired at %s (by this machine's clock) before the agent brought back a grant", tok.Expires.Local().Format(time.RFC3339))})
	return true
}

func noteResult(dir string, r *Result) {
	r.At = clock.Now().UTC()
	writeJSON(dir, ResultFile, r)
}

// ReadResult reads how the last enrolment ended (nil: none began).
func ReadResult(dir string) (*Result, error) {
	var r Result
	ok, err := readJSON(dir, ResultFile, &r)
	if !ok {
		return nil, err
	}
	return &r, nil
}

// IsPending reports whether an enrolment is pending that the agent should
// carry out now: the daemon asks it before every offer and status. It ends
// one whose token expired more than ExpiryMargin ago, and holds back one
// the agent said was refused for good until ReofferAfter has passed. A
// pending file that does not read counts as pending, so that the offer
// says what is wrong with it.
func IsPending(dir string) bool {
	if _, err := os.Lstat(filepath.Join(dir, PendingFile)); err != nil {
		dropLeftWireGuard(dir)
		return false
	}
	unlock, err := lock(dir, false)
	if err != nil {
		return true // say so at the offer
	}
	defer unlock()
	p, tok, err := loadPending(dir)
	switch {
	case err != nil:
		return true
	case p == nil:
		return false
	}
	now := clock.Now()
	if expireLocked(dir, p, tok, now) {
		return false
	}
	return p.Claimed.IsZero() || now.After(p.Claimed.Add(ReofferAfter))
}

// dropLeftWireGuard removes a new WireGuard key no pending enrolment
// names any more: left by the release before, rolled back to during a
// rekey, which finished or ended the enrolment without knowing the file.
func dropLeftWireGuard(dir string) {
	if _, err := os.Lstat(filepath.Join(dir, PendingWireGuardFile)); err != nil {
		return
	}
	unlock, err := lock(dir, false)
	if err != nil {
		return
	}
	defer unlock()
	if _, err := os.Lstat(filepath.Join(dir, PendingFile)); errors.Is(err, os.ErrNotExist) {
		os.Remove(filepath.Join(dir, PendingWireGuardFile))
	}
}

// PendingView is a pending enrolment as `mesh-executor status` shows it.
type PendingView struct {
	Token   string    `json:"token"`
	Begun   time.Time `json:"begun"`
	Expires time.Time `json:"expires"`
	// Held is the identity the host holds, which the enrolment replaces
	// (Held.Replace) or must not leave behind.
	Held *wire.HeldIdentity `json:"held,omitempty"`
	// HeldBack: the agent said it was refused for good; it is offered to
	// the agent again after this.
	HeldBack time.Time `json:"held_back_until,omitzero"`
	// Expired: the token expired more than ExpiryMargin ago, and the
	// enrolment has been pending that long; the daemon ends it the next
	// time the agent asks.
	Expired bool `json:"expired,omitempty"`
}

// ReadPending reads the pending enrolment without changing anything (nil:
// none is pending).
func ReadPending(dir string) (*PendingView, error) {
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return nil, err
	}
	v := &PendingView{Token: tok.IDString(), Begun: p.Begun, Expires: tok.Expires.UTC(),
		Expired: expired(p, tok, clock.Now())}
	if p.Held != nil {
		h := *p.Held
		h.Signature = nil
		v.Held = &h
	}
	if !p.Claimed.IsZero() && clock.Now().Before(p.Claimed.Add(ReofferAfter)) {
		v.HeldBack = p.Claimed.Add(ReofferAfter)
	}
	return v, nil
}

func (p *pending) publicKeys(dir, agentNKey string) (*wire.EnrolKeys, error) {
	if len(p.Identity) != ed25519.SeedSize {
		return nil, errors.New("enrol: the pending identity key is damaged")
	}
	idPub := ed25519.NewKeyFromSeed(p.Identity).Public().(ed25519.PublicKey)
	sk, err := SealingKEM().NewPrivateKey(p.Sealing)
	if err != nil {
		return nil, fmt.Errorf("enrol: the pending sealing key: %w", err)
	}
	wg, err := p.wireGuard(dir)
	if err != nil {
		return nil, err
	}
	return &wire.EnrolKeys{
		Identity:  encodePub(idPub),
		Sealing:   base64.StdEncoding.EncodeToString(sk.PublicKey().Bytes()),
		WireGuard: wg.PublicKey().String(),
		AgentNKey: agentNKey,
	}, nil
}

// wireGuard is the WireGuard key the enrolment presents: a new one made
// for it, or the executor's own.
func (p *pending) wireGuard(dir string) (wgtypes.Key, error) {
	if p.WireGuard != nil {
		k, err := wgtypes.NewKey(p.WireGuard)
		if err != nil {
			return k, errors.New("enrol: the pending WireGuard key is damaged")
		}
		return k, nil
	}
	wg, ok, err := overlay.LoadKey(dir)
	if err != nil {
		return wg, err
	}
	if !ok {
		return wg, errors.New("enrol: the WireGuard key made at enrol is gone")
	}
	return wg, nil
}

func loadPending(dir string) (*pending, *wire.Token, error) {
	var p pending
	ok, err := readJSON(dir, PendingFile, &p)
	if !ok {
		return nil, nil, err
	}
	tok, err := wire.ParseToken(p.Token)
	if err != nil {
		return nil, nil, fmt.Errorf("enrol: the pending token: %w", err)
	}
	if p.WireGuard == nil {
		// Another enrolment's (one a rollback began or finished), or one
		// that does not decode (a later release's format): this enrolment
		// presents the executor's own key, as the release before does. A
		// file the system fails to read fails the enrolment's step, which
		// is tried again.
		var wg pendingWireGuard
		ok, err := readJSON(dir, PendingWireGuardFile, &wg)
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, nil, err
		}
		if err == nil && ok && wg.Identity == pendingIdentity(&p) {
			p.WireGuard = wg.Key
		}
	}
	return &p, tok, nil
}

// storedKeys are the executor's private keys once enrolled.
type storedKeys struct {
	Identity  []byte `json:"identity"`
	Sealing   []byte `json:"sealing"`
	Enrolment string `json:"enrolment"`
	formatField
}

// GrantedFile is the grant the executor accepted last, with what the
// agent it names needs to finish its own half (Granted).
const GrantedFile = "enrolment-granted.json"

// granted is GrantedFile.
type granted struct {
	Grant       []byte `json:"grant"`
	BrokerURL   string `json:"broker_url"`
	Fingerprint string `json:"fingerprint"`
	ControlKey  []byte `json:"control_key"`
	AgentNKey   string `json:"agent_nkey"`
	Node        string `json:"node"`
	Enrolment   string `json:"enrolment"`
	formatField
}

// Granted is, for an agent asking with agentNKey, the grant the executor
// accepted for that NKey, when it is the enrolment the host holds: an
// agent stopped after the executor recorded the grant and before it wrote
// its own config (kill -9, a power cut) finishes from it. nil when there
// is none for that NKey. The grant is the control side's, signed: the
// agent checks it as it checks the one it brought.
func Granted(dir, agentNKey string) (*wire.EnrolOffer, error) {
	var g granted
	ok, err := readJSON(dir, GrantedFile, &g)
	if !ok || g.AgentNKey != agentNKey {
		return nil, err
	}
	id, err := identity.Load(dir)
	if err != nil || id == nil || id.Node != g.Node || id.Enrolment != g.Enrolment {
		return nil, err
	}
	return &wire.EnrolOffer{Granted: g.Grant, BrokerURL: g.BrokerURL, Fingerprint: g.Fingerprint, ControlKey: g.ControlKey}, nil
}

// Keys are the executor's private keys.
type Keys struct {
	Identity  ed25519.PrivateKey
	Sealing   hpke.PrivateKey
	Enrolment string
}

// LoadKeys reads the executor's keys; nil when it has none (not enrolled).
func LoadKeys(dir string) (*Keys, error) {
	var s storedKeys
	ok, err := readJSON(dir, KeysFile, &s)
	if !ok {
		return nil, err
	}
	if len(s.Identity) != ed25519.SeedSize {
		return nil, fmt.Errorf("enrol: %s: the identity key is damaged", KeysFile)
	}
	sk, err := SealingKEM().NewPrivateKey(s.Sealing)
	if err != nil {
		return nil, fmt.Errorf("enrol: %s: the sealing key: %w", KeysFile, err)
	}
	return &Keys{Identity: ed25519.NewKeyFromSeed(s.Identity), Sealing: sk, Enrolment: s.Enrolment}, nil
}

// filesFormat is the format of the enrolment's files (PendingFile,
// ResultFile, KeysFile). A later one is refused, by its number, before
// the fields are: they are decoded strictly.
const filesFormat = 1

// formatField is the field that says a file's format. It is read, but not
// yet written: the releases before the field decode the files strictly
// and refuse it, so format 1 leaves it out, and a release may write it
// only once the release a rollback returns to reads it.
type formatField struct {
	Format int `json:"format,omitempty"`
}

// readJSON reads a root-only file of dir into v; ok is false when it does
// not exist. A file anyone but root could have written is refused.
func readJSON(dir, name string, v any) (ok bool, err error) {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("enrol: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		return false, fmt.Errorf("enrol: %s must be a regular file of the executor's, readable by nobody else (it is %v, uid %d)", p, fi.Mode(), st.Uid)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize))
	if err != nil {
		return false, fmt.Errorf("enrol: %w", err)
	}
	var ff formatField
	if json.Unmarshal(b, &ff) == nil && ff.Format > filesFormat {
		return false, fmt.Errorf("enrol: %s is in format v%d, written by a later release; this executor reads formats up to v%d", p, ff.Format, filesFormat)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("enrol: %s: %w", p, err)
	}
	return true, nil
}

// maxFileSize bounds what readJSON reads: the files are a few hundred
// bytes, and one past this does not decode.
const maxFileSize = 1 << 20

func writeJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFile(dir, name, append(b, '\n'))
}

func encodePub(p ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(p) }

// Forget drops what an enrolment left the host beside its identity: the
// identity and sealing private keys (KeysFile), the grant accepted
// (GrantedFile), a rekey asked for (RekeyFile) and the WireGuard key the
// node was known by on the overlay. A retired host keeps no key of the
// node it was — none to open content sealed to it, none to sign as it —
// and an enrolment after makes every key anew. An enrolment root began
// before the retirement came keeps the WireGuard key it presents: it is
// the next node's, not the retired one's. Under the enrolment's lock, as
// every change of it.
func Forget(dir string) error {
	unlock, err := lock(dir, false)
	if err != nil {
		return err
	}
	defer unlock()
	files := []string{KeysFile, GrantedFile, RekeyFile}
	if _, err := os.Lstat(filepath.Join(dir, PendingFile)); errors.Is(err, os.ErrNotExist) {
		files = append(files, PendingWireGuardFile, overlay.KeyFile, overlay.PubFile)
	}
	for _, f := range files {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("enrol: forget %s: %w", f, err)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("enrol: forget: %w", err)
	}
	defer d.Close()
	return d.Sync()
}
