package wire

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/veraison/go-cose"
)

// The purposes of a key rotation: the statement signed by the authority
// that retires a control key — the key itself, or the recovery key — over
// the same statement signed by the key that replaces it. Both signatures
// are needed, each for its own purpose, so neither can be passed off as
// the other, nor as anything else the control plane signs.
const (
	PurposeKeyRotation    Purpose = "application/nox-mesh.key-rotation+cose"
	PurposeKeyRotationNew Purpose = "application/nox-mesh.key-rotation-new+cose"
)

// The authorities of a rotation (KeyRotation.By).
const (
	// ByKey: signed by the control key it retires, the routine rotation.
	ByKey = "key"
	// ByRecovery: signed by the offline recovery key the node pinned at
	// enrolment, for when the control key is stolen — the thief can sign
	// a rotation of its own with it, so only the recovery key can undo
	// one.
	ByRecovery = "recovery"
)

// MaxRotationChain bounds the statements one message carries to a node:
// the rotations a node offline through several may need, in order.
const MaxRotationChain = 16

// KeyRotation is one statement that the control plane's signing key
// changes, addressed to one node's enrolment and sequenced.
type KeyRotation struct {
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"`
	// Seq orders rotations: a node takes a statement by the key only
	// above the last it took; one by the recovery key only above the last
	// recovery it took, and it starts the count again from its own.
	Seq uint64 `json:"seq"`
	By  string `json:"by"`
	// From is the key id (KeyID) of the key it retires; To the new key,
	// base64.
	From string `json:"from"`
	To   string `json:"to"`
	// Recovery, base64, is the recovery key the node holds from now on.
	// A node that holds one already takes another only from a statement
	// the recovery key signed.
	Recovery string    `json:"recovery,omitempty"`
	Issued   time.Time `json:"issued"`
}

// NewKey is To, decoded.
func (r *KeyRotation) NewKey() (ed25519.PublicKey, error) { return decodeKey("to", r.To) }

// RecoveryKey is Recovery, decoded (nil when absent).
func (r *KeyRotation) RecoveryKey() (ed25519.PublicKey, error) {
	if r.Recovery == "" {
		return nil, nil
	}
	return decodeKey("recovery", r.Recovery)
}

func decodeKey(field, s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("key rotation: %s is not a base64 Ed25519 public key", field)
	}
	return ed25519.PublicKey(b), nil
}

// SealRotation signs r with next (the key it brings in: r.To is set to
// next's public half), then that with authority (the key it retires, or
// the recovery key, as r.By says).
func SealRotation(authority, next ed25519.PrivateKey, r KeyRotation) ([]byte, error) {
	r.To = base64.StdEncoding.EncodeToString(next.Public().(ed25519.PublicKey))
	payload, err := json.Marshal(&r)
	if err != nil {
		return nil, err
	}
	inner, err := Seal(next, PurposeKeyRotationNew, payload)
	if err != nil {
		return nil, err
	}
	return Seal(authority, PurposeKeyRotation, inner)
}

// OpenRotation verifies a rotation against what the node holds: its
// current control key and its recovery key (nil: none). The outer
// signature must be one of them, the one the statement names (By), the
// inner the new key's over the very same statement. What it is addressed
// to and its sequence are the caller's to judge.
func OpenRotation(current, recovery ed25519.PublicKey, env []byte) (*KeyRotation, error) {
	by := ByKey
	inner, err := Open(current, PurposeKeyRotation, env)
	if errors.Is(err, ErrWrongKey) && recovery != nil {
		by = ByRecovery
		inner, err = Open(recovery, PurposeKeyRotation, env)
	}
	if err != nil {
		if errors.Is(err, ErrWrongKey) {
			return nil, fmt.Errorf("key rotation: signed by neither the control key this node holds (%s) nor its recovery key: %w", KeyID(current), err)
		}
		return nil, fmt.Errorf("key rotation: %w", err)
	}
	// The new key is named inside; its signature is checked over the
	// statement before anything in it is taken.
	var msg cose.Sign1Message
	if err := msg.UnmarshalCBOR(inner); err != nil || msg.Payload == nil {
		return nil, fmt.Errorf("key rotation: %w: the inner statement", ErrMalformed)
	}
	r, err := ParseRotation(msg.Payload)
	if err != nil {
		return nil, err
	}
	next, err := r.NewKey()
	if err != nil {
		return nil, err
	}
	payload, err := Open(next, PurposeKeyRotationNew, inner)
	if err != nil {
		return nil, fmt.Errorf("key rotation: not signed by the key it brings in: %w", err)
	}
	if !bytes.Equal(payload, msg.Payload) {
		return nil, fmt.Errorf("key rotation: %w: the statement changed under its signature", ErrMalformed)
	}
	switch {
	case r.By != by:
		return nil, fmt.Errorf("key rotation: it says it is signed by the %s key, and is signed by the %s key", r.By, by)
	case by == ByKey && r.From != KeyID(current):
		return nil, fmt.Errorf("key rotation: it retires key %s, signed by key %s", r.From, KeyID(current))
	case next.Equal(current):
		return nil, errors.New("key rotation: it brings in the key it retires")
	}
	if _, err := r.RecoveryKey(); err != nil {
		return nil, err
	}
	return r, nil
}

// PeekRotation reads what a rotation envelope says without verifying
// it: for the control side's bookkeeping of the statements it signed
// itself, never for taking one.
func PeekRotation(env []byte) (*KeyRotation, error) {
	var outer, inner cose.Sign1Message
	if err := outer.UnmarshalCBOR(env); err != nil || outer.Payload == nil {
		return nil, fmt.Errorf("key rotation: %w", ErrMalformed)
	}
	if err := inner.UnmarshalCBOR(outer.Payload); err != nil || inner.Payload == nil {
		return nil, fmt.Errorf("key rotation: %w: the inner statement", ErrMalformed)
	}
	return ParseRotation(inner.Payload)
}

// ParseRotation decodes a statement strictly.
func ParseRotation(payload []byte) (*KeyRotation, error) {
	var r KeyRotation
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("key rotation: %w", err)
	}
	if r.Node == "" || r.Enrolment == "" || r.Seq == 0 || (r.By != ByKey && r.By != ByRecovery) {
		return nil, errors.New("key rotation: node, enrolment, a sequence and who signed it (key or recovery) are required")
	}
	return &r, nil
}

// EncodeRotationChain and DecodeRotationChain carry a node's rotations in
// the link's RotationHeader: the envelopes, oldest first, each base64,
// separated by commas.
func EncodeRotationChain(envs [][]byte) string {
	parts := make([]string, len(envs))
	for i, e := range envs {
		parts[i] = base64.StdEncoding.EncodeToString(e)
	}
	return strings.Join(parts, ",")
}

// DecodeRotationChain is EncodeRotationChain's reverse; "" is no chain.
func DecodeRotationChain(s string) ([][]byte, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxRotationChain {
		return nil, fmt.Errorf("key rotation: a chain of %d statements, over the limit of %d", len(parts), MaxRotationChain)
	}
	out := make([][]byte, len(parts))
	for i, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p)
		if err != nil {
			return nil, fmt.Errorf("key rotation: statement %d of the chain is not base64", i+1)
		}
		out[i] = b
	}
	return out, nil
}
