package link

import (
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
)

// SignatureHeader carries the node's NKey signature over a report or
// heartbeat (base64url, no padding). The broker's permissions limit what a
// node publishes, but not where the broker itself sends replies, so a node
// can make the broker put bytes on another node's subject as a reply; the
// signature is what makes a report the node's own.
const SignatureHeader = "Mesh-Signature"

// Sign signs data with a node's NKey, for SignatureHeader.
func Sign(kp nkeys.KeyPair, data []byte) (string, error) {
	sig, err := kp.Sign(data)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sig), nil
}

// VerifySignature checks sig (a SignatureHeader value) over data against
// the node's public NKey.
func VerifySignature(nkeyPublic string, data []byte, sig string) error {
	if sig == "" {
		return errors.New("not signed by the node")
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("signature: %w", err)
	}
	kp, err := nkeys.FromPublicKey(nkeyPublic)
	if err != nil {
		return fmt.Errorf("node key: %w", err)
	}
	if err := kp.Verify(data, raw); err != nil {
		return errors.New("the signature is not the node's")
	}
	return nil
}
