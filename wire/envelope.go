package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/veraison/go-cose"
)

// Purpose says what a signed object is for. It travels in the protected
// header (COSE "typ"), so a grant can never be passed off as a declaration:
// the signature covers the purpose.
type Purpose string

// The purposes the control plane signs.
const (
	PurposeDeclaration Purpose = "application/nox-mesh.declaration+cose"
	PurposeGrant       Purpose = "application/nox-mesh.grant+cose"
	PurposeStoreCopy   Purpose = "application/nox-mesh.store-copy+cose"
	PurposeRoster      Purpose = "application/nox-mesh.roster+cose"
	// PurposePlan: a request that a node plan a declaration and say what
	// it would do, changing nothing (mesh-control plan NODE FILE).
	PurposePlan Purpose = "application/nox-mesh.plan+cose"
)

// MaxEnvelope bounds a signed object: a declaration at its largest, and the
// COSE framing around it.
const MaxEnvelope = 64<<20 + 4096

// Errors Open returns, each wrapped with detail. Every refusal says which
// check refused.
var (
	// ErrMalformed: the bytes are not a COSE_Sign1 object this side reads.
	ErrMalformed = errors.New("wire: not a well-formed signed envelope")
	// ErrWrongKey: the envelope names a signing key other than the pinned one.
	ErrWrongKey = errors.New("wire: signed by a key other than the pinned control-plane key")
	// ErrBadSignature: the signature does not verify under the pinned key.
	ErrBadSignature = errors.New("wire: the signature does not verify under the pinned control-plane key")
	// ErrWrongPurpose: a valid signature over something other than what was expected.
	ErrWrongPurpose = errors.New("wire: signed for another purpose")
)

// KeyID names a public key: the first 8 bytes of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Seal signs payload for purpose with the control plane's key: a
// COSE_Sign1 with EdDSA, the key id and the purpose in the protected header.
// What the payload says (node, enrolment, sequence) is inside it, signed.
func Seal(key ed25519.PrivateKey, purpose Purpose, payload []byte) ([]byte, error) {
	signer, err := cose.NewSigner(cose.AlgorithmEdDSA, key)
	if err != nil {
		return nil, fmt.Errorf("wire: seal: %w", err)
	}
	kid, _ := hex.DecodeString(KeyID(key.Public().(ed25519.PublicKey)))
	msg := cose.NewSign1Message()
	msg.Headers.Protected.SetAlgorithm(cose.AlgorithmEdDSA)
	msg.Headers.Protected[cose.HeaderLabelKeyID] = kid
	if _, err := msg.Headers.Protected.SetType(string(purpose)); err != nil {
		return nil, fmt.Errorf("wire: seal: %w", err)
	}
	msg.Payload = payload
	if err := msg.Sign(rand.Reader, nil, signer); err != nil {
		return nil, fmt.Errorf("wire: seal: %w", err)
	}
	return msg.MarshalCBOR()
}

// Open verifies an envelope against the pinned key and the expected
// purpose, and returns the signed payload. It is the one verification
// function of both sides: the agent uses it to decide what to forward, and
// the executor uses it again on the bytes the agent forwarded, trusting
// nothing the agent says about them.
func Open(pinned ed25519.PublicKey, want Purpose, envelope []byte) ([]byte, error) {
	if len(envelope) > MaxEnvelope {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrMalformed, len(envelope), MaxEnvelope)
	}
	var msg cose.Sign1Message
	if err := msg.UnmarshalCBOR(envelope); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if msg.Payload == nil {
		return nil, fmt.Errorf("%w: detached payload", ErrMalformed)
	}
	alg, err := msg.Headers.Protected.Algorithm()
	if err != nil || alg != cose.AlgorithmEdDSA {
		return nil, fmt.Errorf("%w: algorithm %v, only EdDSA is accepted", ErrMalformed, alg)
	}
	kid, _ := msg.Headers.Protected[cose.HeaderLabelKeyID].([]byte)
	want8, _ := hex.DecodeString(KeyID(pinned))
	if !bytes.Equal(kid, want8) {
		return nil, fmt.Errorf("%w (envelope key %x, pinned key %s)", ErrWrongKey, kid, KeyID(pinned))
	}
	verifier, err := cose.NewVerifier(cose.AlgorithmEdDSA, pinned)
	if err != nil {
		return nil, fmt.Errorf("wire: open: %w", err)
	}
	if err := msg.Verify(nil, verifier); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	// Checked after the signature, so what it says is the signer's word.
	typ, _ := msg.Headers.Protected[cose.HeaderLabelType].(string)
	if Purpose(typ) != want {
		return nil, fmt.Errorf("%w: %q, expected %q", ErrWrongPurpose, typ, want)
	}
	return msg.Payload, nil
}
