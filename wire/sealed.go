package wire

import (
	"crypto/hpke"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Sealed file content: a file's bytes encrypted by the control side to one
// executor's sealing key, so the agent and the broker carry them and cannot
// read them. It is single-shot HPKE (RFC 9180, base mode): KEM
// ML-KEM-768+X25519, so content kept in the broker today is not opened by a
// quantum computer tomorrow; KDF HKDF-SHA256; AEAD ChaCha20-Poly1305.
//
// The node, the declaration's sequence and the resource's module and id are
// bound in as HPKE's info, so content sealed for one file cannot be moved
// to another file, another declaration or another node: it does not open
// there. Info is a fixed label and each binding length-prefixed, so no two
// different bindings read as the same bytes ("a"+"bc" is not "ab"+"c").
//
// On the declaration's wire, `sealed` is standard base64 of the HPKE
// encapsulated key followed by the ciphertext.

// sealedLabel opens the info of every sealed content; a new format gets a
// new label, so an old reader refuses it rather than misreading it.
const sealedLabel = "nox-mesh sealed file v1"

// SealedEncSize is the size of the KEM's encapsulated key that starts every
// sealed content (ML-KEM-768's ciphertext and an X25519 share), and
// SealedOverhead what sealing adds to the plaintext: that and the AEAD's
// tag. A test holds them to what crypto/hpke produces.
const (
	SealedEncSize  = 1088 + 32
	SealedOverhead = SealedEncSize + 16
)

// maxSealedBinding bounds each of node, module and id: far above what
// shapes and the registry accept, and small enough that info stays small.
const maxSealedBinding = 1024

// Errors OpenSealed returns, each wrapped with detail. None carries a byte
// of the content, sealed or open.
var (
	// ErrSealedMalformed: not sealed content this side reads (not base64,
	// or too short to hold the encapsulated key and the tag).
	ErrSealedMalformed = errors.New("wire: not well-formed sealed content")
	// ErrSealedOpen: it does not open with this key for this node,
	// sequence, module and id: sealed to another key, or for another file,
	// declaration or node, or altered on the way.
	ErrSealedOpen = errors.New("wire: sealed content does not open with this node's sealing key for this node, sequence and resource")
)

// SealedKEM is the KEM sealed content is encrypted with (the executor's
// sealing key is of this KEM).
func SealedKEM() hpke.KEM { return hpke.MLKEM768X25519() }

func sealedSuite() (hpke.KDF, hpke.AEAD) { return hpke.HKDFSHA256(), hpke.ChaCha20Poly1305() }

// sealedInfo is the info that binds sealed content to node, seq and
// module.id: the label, then each string as a 4-byte big-endian length and
// its bytes, seq as 8 bytes big-endian.
func sealedInfo(node string, seq uint64, module, id string) ([]byte, error) {
	for _, f := range []struct{ name, v string }{{"node", node}, {"module", module}, {"id", id}} {
		if len(f.v) > maxSealedBinding {
			return nil, fmt.Errorf("wire: sealed content: %s is %d bytes, over %d", f.name, len(f.v), maxSealedBinding)
		}
	}
	b := make([]byte, 0, 4*4+8+len(sealedLabel)+len(node)+len(module)+len(id))
	str := func(s string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	str(sealedLabel)
	str(node)
	b = binary.BigEndian.AppendUint64(b, seq)
	str(module)
	str(id)
	return b, nil
}

// SealContent encrypts plaintext to recipient (the bytes of an executor's
// sealing public key, as enrolment reported them) for file module.id of
// node's declaration seq, and returns it in the form a declaration's
// `sealed` field carries (standard base64).
func SealContent(recipient []byte, node string, seq uint64, module, id string, plaintext []byte) (string, error) {
	pk, err := SealedKEM().NewPublicKey(recipient)
	if err != nil {
		return "", fmt.Errorf("wire: seal content for %s.%s: the recipient is not an ML-KEM-768+X25519 public key: %w", module, id, err)
	}
	info, err := sealedInfo(node, seq, module, id)
	if err != nil {
		return "", err
	}
	kdf, aead := sealedSuite()
	ct, err := hpke.Seal(pk, kdf, aead, info, plaintext)
	if err != nil {
		return "", fmt.Errorf("wire: seal content for %s.%s: %w", module, id, err)
	}
	return base64.StdEncoding.EncodeToString(ct), nil
}

// OpenSealed decrypts sealed (a declaration's `sealed` field) with the
// executor's sealing key k, for file module.id of node's declaration seq,
// which are the declaration's own word for them: content sealed for
// anything else does not open. Errors wrap ErrSealedMalformed or
// ErrSealedOpen and never carry the content.
func OpenSealed(k hpke.PrivateKey, node string, seq uint64, module, id string, sealed string) ([]byte, error) {
	if k == nil {
		return nil, errors.New("wire: open sealed content: no sealing key")
	}
	if got, want := k.KEM().ID(), SealedKEM().ID(); got != want {
		return nil, fmt.Errorf("wire: open sealed content: the key is of KEM %#04x, not ML-KEM-768+X25519 (%#04x)", got, want)
	}
	ct, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil {
		return nil, fmt.Errorf("%w: not standard base64 (%v)", ErrSealedMalformed, err)
	}
	if len(ct) < SealedOverhead {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the %d of the encapsulated key and tag alone (truncated?)", ErrSealedMalformed, len(ct), SealedOverhead)
	}
	info, err := sealedInfo(node, seq, module, id)
	if err != nil {
		return nil, err
	}
	kdf, aead := sealedSuite()
	pt, err := hpke.Open(k, kdf, aead, info, ct)
	if err != nil {
		// crypto/hpke says only "message authentication failed": which of
		// key, binding or bytes is wrong cannot be told apart, by design.
		return nil, fmt.Errorf("%w (%v)", ErrSealedOpen, err)
	}
	return pt, nil
}
