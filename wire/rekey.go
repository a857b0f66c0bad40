package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hpke"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A node's own keys (the executor's identity, sealing and WireGuard keys,
// and the agent's NKey) are renewed by enrolling the machine again as the
// same node, with new keys, replacing the identity it holds. What root
// would carry to the machine for that — a token for the node — is asked
// for over the link instead, with a proof by the identity key being
// replaced:
//
//	mesh-executor rekey   (root)  a nonce, kept (the rekey pending)
//	mesh-executor serve           RekeyRequest: node, enrolment, nonce, signed
//	                              by the identity key, in each status reply
//	mesh-agent                    carries it in its heartbeats
//	mesh-control serve            checks it against the identity key the
//	                              node's record holds; issues a token for the
//	                              node, sealed to the node's sealing key, in
//	                              a RekeyAnswer it signs; sends it on the
//	                              node's notice subject
//	mesh-agent                    hands the answer to the executor (KindRekey)
//	mesh-executor serve           checks it under the control key in force,
//	                              for this node, enrolment and nonce; opens
//	                              the token; begins an enrolment with it that
//	                              replaces the identity held, with new keys
//	                              — the WireGuard key too
//
// From there it is an enrolment like any: the control side revokes the
// identity replaced in the same step as it grants the new one. The agent
// sees neither the token's secret (sealed to the executor) nor any key it
// could use to ask for a token itself (the proof is the identity key's).

// PurposeRekey: the control side's answer to a rekey request (RekeyAnswer).
const PurposeRekey Purpose = "application/nox-mesh.rekey+cose"

// MaxRekeyAnswer bounds a rekey answer's envelope: a token of a few
// hundred bytes sealed (SealedOverhead more, in base64), the fields and the
// signature around it.
const MaxRekeyAnswer = 8 << 10

// RekeyNonceSize is the size of a rekey's nonce, in bytes.
const RekeyNonceSize = 16

// RekeyRequest asks for a token to enrol the node again with new keys. It
// is the executor's, signed with the identity key of the enrolment it
// names; the agent only carries it (link.Heartbeat.Rekey).
type RekeyRequest struct {
	Node      string `json:"node" cbor:"1,keyasint"`
	Enrolment string `json:"enrolment" cbor:"2,keyasint"`
	// Nonce names this rekey (hex): root's `mesh-executor rekey` makes it;
	// an answer is taken only for it.
	Nonce string `json:"nonce" cbor:"3,keyasint"`
	// Signature is the identity key's over RekeyMessage (base64).
	Signature string `json:"signature" cbor:"4,keyasint"`
}

// RekeyMessage is what a RekeyRequest's signature covers: a label of its
// own (so no other signature by the identity key is one), then each field
// as a 4-byte big-endian length and its bytes.
func RekeyMessage(node, enrolment, nonce string) []byte {
	b := []byte("nox-mesh rekey request v1\x00")
	for _, f := range []string{node, enrolment, nonce} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// SignRekey makes the request for node's enrolment and nonce with the
// identity key.
func SignRekey(key ed25519.PrivateKey, node, enrolment, nonce string) *RekeyRequest {
	return &RekeyRequest{Node: node, Enrolment: enrolment, Nonce: nonce,
		Signature: base64.StdEncoding.EncodeToString(ed25519.Sign(key, RekeyMessage(node, enrolment, nonce)))}
}

// Check verifies r under identityKey (base64, the node's identity key as
// its record holds it), and its form.
func (r *RekeyRequest) Check(identityKey string) error {
	if n, err := hex.DecodeString(r.Nonce); err != nil || len(n) != RekeyNonceSize {
		return fmt.Errorf("the rekey request's nonce is not %d bytes of hex", RekeyNonceSize)
	}
	pub, err := base64.StdEncoding.DecodeString(identityKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return errors.New("the node's record holds no identity key to check a rekey request against (it was not enrolled through a token)")
	}
	sig, err := base64.StdEncoding.DecodeString(r.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(ed25519.PublicKey(pub), RekeyMessage(r.Node, r.Enrolment, r.Nonce), sig) {
		return fmt.Errorf("the rekey request is not signed by the identity key of %s (enrolment %s)", r.Node, r.Enrolment)
	}
	return nil
}

// RekeyAnswer is the control side's answer to a RekeyRequest, signed
// (PurposeRekey): a token for the node, sealed to the sealing key of the
// enrolment that asked.
type RekeyAnswer struct {
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"`
	Nonce     string `json:"nonce"`
	// Token is the token's text, sealed (SealRekeyToken).
	Token string `json:"token"`
	// Expires is the token's expiry, said in the clear for the logs.
	Expires time.Time `json:"expires"`
}

// ParseRekeyAnswer decodes a RekeyAnswer's payload strictly; every field
// is required.
func ParseRekeyAnswer(payload []byte) (*RekeyAnswer, error) {
	var a RekeyAnswer
	if err := decodeStrict(payload, &a); err != nil {
		return nil, fmt.Errorf("the rekey answer: %w", err)
	}
	if a.Node == "" || a.Enrolment == "" || a.Nonce == "" || a.Token == "" {
		return nil, errors.New("the rekey answer: node, enrolment, nonce and token are required")
	}
	return &a, nil
}

// rekeyModule binds a sealed token: sealed content of sequence 0 (which no
// declaration has) in a module no declaration may name (module names are
// identifiers; this one has a space), so neither can be taken for the
// other.
const rekeyModule = "rekey token"

// SealRekeyToken seals a token's text to recipient (the bytes of the
// node's sealing public key) for node's rekey nonce.
func SealRekeyToken(recipient []byte, node, nonce, token string) (string, error) {
	return SealContent(recipient, node, 0, rekeyModule, nonce, []byte(token))
}

// OpenRekeyToken opens what SealRekeyToken sealed, with the executor's
// sealing key.
func OpenRekeyToken(k hpke.PrivateKey, node, nonce, sealed string) (string, error) {
	b, err := OpenSealed(k, node, 0, rekeyModule, nonce, sealed)
	return string(b), err
}

// Rekey hands the control side's answer (its envelope, as it came) to the
// executor.
type Rekey struct {
	Envelope []byte `cbor:"1,keyasint"`
}

// RekeyReply says whether the answer began the enrolment, or why not.
type RekeyReply struct {
	Begun   bool   `cbor:"1,keyasint,omitempty"`
	Token   string `cbor:"2,keyasint,omitempty"` // the id of the token it began with
	Refused string `cbor:"3,keyasint,omitempty"`
}

// decodeStrict decodes JSON into v, refusing unknown fields and trailing
// data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}
