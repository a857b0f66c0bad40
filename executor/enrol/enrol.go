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
package enrol

import (
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The files of enrolment in the executor's state directory (root, 0600).
const (
	PendingFile = "enrolment-pending.json"
	ResultFile  = "enrolment-result.json"
	KeysFile    = "keys.json"
)

// SealingKEM is the KEM of the sealing key: ML-KEM-768 with X25519, so
// sealed content stored in the broker today is not opened by a quantum
// computer tomorrow.
func SealingKEM() hpke.KEM { return hpke.MLKEM768X25519() }

// pending is an enrolment begun and not finished.
type pending struct {
	Token    string    `json:"token"`    // the whole token, secret included
	Identity []byte    `json:"identity"` // Ed25519 seed
	Sealing  []byte    `json:"sealing"`  // the sealing KEM's private key
	Begun    time.Time `json:"begun"`
	// AgentNKey is the NKey the last offer's proof was made for: a grant
	// must name this one.
	AgentNKey string `json:"agent_nkey,omitempty"`
}

// Result is how the last enrolment ended, or where it is: what
// `mesh-executor enrol` waits for and prints.
type Result struct {
	Final     bool      `json:"final"`
	Enrolled  bool      `json:"enrolled"`
	Node      string    `json:"node,omitempty"`
	Enrolment string    `json:"enrolment,omitempty"`
	Token     string    `json:"token"`
	RefusedBy string    `json:"refused_by,omitempty"` // executor, control, broker, agent
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
}

func (r *Result) String() string {
	switch {
	case r.Enrolled:
		return fmt.Sprintf("enrolled as node %s (enrolment %s)", r.Node, r.Enrolment)
	case r.Final:
		return fmt.Sprintf("enrolment refused by the %s: %s", r.RefusedBy, r.Reason)
	case r.Reason != "":
		return fmt.Sprintf("still trying (%s: %s)", r.RefusedBy, r.Reason)
	}
	return "waiting for the agent"
}

// Begin starts an enrolment with tok: it makes the identity and sealing
// keys, and the WireGuard key if the executor has none, and keeps them
// with the token until a grant is accepted. A pending enrolment is
// replaced. The identity the host has now, if any, stays until then.
func Begin(dir string, tok *wire.Token) error {
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
	p := pending{Token: enc, Identity: idKey.Seed(), Sealing: skb, Begun: time.Now().UTC()}
	if err := writeJSON(dir, PendingFile, &p); err != nil {
		return err
	}
	return writeJSON(dir, ResultFile, &Result{Token: tok.IDString(), At: time.Now().UTC()})
}

// Offer answers an agent that asks whether an enrolment is pending, with
// its NKey. nil when none is.
func Offer(dir, agentNKey string, hostname string, profile, inventory []byte) (*wire.EnrolOffer, error) {
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return nil, err
	}
	if !wire.ValidUserNKey(agentNKey) {
		return nil, fmt.Errorf("enrol: the agent's NKey %q is not a NATS user public key", agentNKey)
	}
	keys, err := p.publicKeys(dir, agentNKey)
	if err != nil {
		return nil, err
	}
	if p.AgentNKey != agentNKey {
		p.AgentNKey = agentNKey
		if err := writeJSON(dir, PendingFile, p); err != nil {
			return nil, err
		}
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

// Accept takes what the agent brought back: a grant envelope, verified
// here under the key the token pinned and matched to this enrolment before
// anything is recorded. It returns the new identity.
func Accept(dir string, envelope []byte) (*identity.Identity, error) {
	p, tok, err := loadPending(dir)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("no enrolment is pending on this host (run mesh-executor enrol first); the grant is not recorded")
	}
	payload, err := wire.Open(tok.ControlKey, wire.PurposeGrant, envelope)
	if err != nil {
		return nil, refuse(dir, tok, fmt.Errorf("the grant does not verify under the control key the token pinned (%s): %w", wire.KeyID(tok.ControlKey), err))
	}
	g, err := wire.ParseGrant(payload)
	if err != nil {
		return nil, refuse(dir, tok, err)
	}
	if p.AgentNKey == "" {
		return nil, refuse(dir, tok, errors.New("a grant arrived before any proof was given out"))
	}
	keys, err := p.publicKeys(dir, p.AgentNKey)
	if err != nil {
		return nil, err
	}
	if bad := g.Mismatch(tok.IDString(), keys); bad != "" {
		// Not final: a compromised agent may hand over a stale or
		// substituted grant; the genuine one can still come.
		noteResult(dir, &Result{Token: tok.IDString(), RefusedBy: "executor", Reason: "a grant for another enrolment was refused: " + bad})
		return nil, fmt.Errorf("the grant is not for this enrolment: %s", bad)
	}
	// Keys, then the floor, then the identity: until the identity is
	// written the host is not enrolled, and a crash leaves the pending
	// enrolment to finish again.
	seed := ed25519.NewKeyFromSeed(p.Identity)
	if err := writeJSON(dir, KeysFile, &storedKeys{Identity: seed.Seed(), Sealing: p.Sealing, Enrolment: g.Enrolment}); err != nil {
		return nil, err
	}
	if err := identity.WriteFloor(dir, identity.Floor{Seq: g.SeqFloor}); err != nil {
		return nil, err
	}
	id := &identity.Identity{Node: g.Node, Enrolment: g.Enrolment, ControlKey: tok.ControlKey}
	if err := identity.Save(dir, id); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(dir, PendingFile))
	noteResult(dir, &Result{Final: true, Enrolled: true, Node: g.Node, Enrolment: g.Enrolment, Token: tok.IDString()})
	return id, nil
}

// Refused records that the agent could not get a grant: final when the
// control side or the broker answered no (the pending enrolment is then
// dropped: its token is spent or refused), passing when it could not reach
// them (the agent tries again).
func Refused(dir, by, reason string, final bool) error {
	p, tok, err := loadPending(dir)
	if err != nil || p == nil {
		return err
	}
	if final {
		os.Remove(filepath.Join(dir, PendingFile))
	}
	noteResult(dir, &Result{Final: final, Token: tok.IDString(), RefusedBy: by, Reason: reason})
	return nil
}

func refuse(dir string, tok *wire.Token, err error) error {
	os.Remove(filepath.Join(dir, PendingFile))
	noteResult(dir, &Result{Final: true, Token: tok.IDString(), RefusedBy: "executor", Reason: err.Error()})
	return err
}

func noteResult(dir string, r *Result) {
	r.At = time.Now().UTC()
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

// IsPending reports whether an enrolment is pending.
func IsPending(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, PendingFile))
	return err == nil
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
	wg, ok, err := overlay.LoadKey(dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("enrol: the WireGuard key made at enrol is gone")
	}
	return &wire.EnrolKeys{
		Identity:  encodePub(idPub),
		Sealing:   base64.StdEncoding.EncodeToString(sk.PublicKey().Bytes()),
		WireGuard: wg.PublicKey().String(),
		AgentNKey: agentNKey,
	}, nil
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
	return &p, tok, nil
}

// storedKeys are the executor's private keys once enrolled.
type storedKeys struct {
	Identity  []byte `json:"identity"`
	Sealing   []byte `json:"sealing"`
	Enrolment string `json:"enrolment"`
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
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("enrol: %s: %w", p, err)
	}
	return true, nil
}

func writeJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFile(dir, name, append(b, '\n'))
}

func encodePub(p ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(p) }
