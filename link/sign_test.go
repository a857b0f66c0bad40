package link

import (
	"encoding/base64"
	"testing"

	"github.com/nats-io/nkeys"
)

// A Signer's signature is the NKey's own, byte for byte, and verifies as
// a node's; one over other bytes, or checked against another node's key,
// does not.
func TestSignerSignsAsTheNKey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	otherPub, _ := other.PublicKey()
	s, err := NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range [][]byte{nil, []byte(`{"node":"n1","seq":7}`)} {
		want, err := kp.Sign(data)
		if err != nil {
			t.Fatal(err)
		}
		got := s.Sign(data)
		if got != base64.RawURLEncoding.EncodeToString(want) {
			t.Errorf("Signer: %s, the NKey: %x", got, want)
		}
		if err := VerifySignature(pub, data, got); err != nil {
			t.Errorf("the node's own signature refused: %v", err)
		}
		if err := VerifySignature(otherPub, data, got); err == nil {
			t.Error("a signature verified under another node's key")
		}
		if err := VerifySignature(pub, append(data, 'x'), got); err == nil {
			t.Error("a signature verified over other bytes")
		}
	}
	// Only a seed makes a signer: a public key alone does not.
	pk, _ := nkeys.FromPublicKey(pub)
	if _, err := NewSigner(pk); err == nil {
		t.Error("a signer made from a public key")
	}
}
