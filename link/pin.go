package link

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ConnectTimeout is how long a connection to the broker may take, from the
// dial through the TLS handshake to the broker's answer to CONNECT: the
// agent's link waits that long (nats.Timeout), and the broker gives a TLS
// handshake as long (its tls timeout; it adds a second for the
// authentication). Sized for a storm, when a whole fleet links again at
// once after the control side's restart: connections queue behind one
// another on a busy broker, and a connection given up on is work done for
// nothing, done again at the next attempt. At 5 s, a fleet of 10,000
// relinking made 30,000 connections, the broker taking 2–14 s to answer
// many of them (docs/benchmarks.md).
const ConnectTimeout = 20 * time.Second

// Fingerprint is the pin of a certificate: the SHA-256 of its DER bytes, in
// lower-case hex without separators.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts a SHA-256 fingerprint in hex, upper or lower
// case, with or without ':' separators, and returns it normalised.
func ParseFingerprint(s string) (string, error) {
	f := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	if b, err := hex.DecodeString(f); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("broker fingerprint %q is not a SHA-256 in hex", s)
	}
	return f, nil
}

// PinError is a broker whose certificate is not the pinned one.
type PinError struct {
	Got, Pinned string
}

func (e *PinError) Error() string {
	return fmt.Sprintf("broker certificate fingerprint mismatch: got %s, pinned %s", e.Got, e.Pinned)
}

// PinnedTLS returns a TLS client configuration that accepts exactly the
// certificate whose fingerprint is pin. The check runs inside the
// handshake (VerifyConnection), so a client using it sends nothing — no
// CONNECT, no credential — to a broker that fails it. Chains, names and
// expiry are not consulted: the pin is the whole of the trust.
//
// onMismatch, when not nil, is called with each mismatch; TLS errors reach
// the caller through the NATS client unwrapped or wrapped, and the callback
// keeps the legible cause either way.
func PinnedTLS(pin string, onMismatch func(*PinError)) *tls.Config {
	return PinnedTLSSet(func() []string { return []string{pin} }, onMismatch)
}

// PinnedTLSSet is PinnedTLS for a set of certificates, asked at each
// handshake: the broker's certificate, and the one replacing it while a
// rotation announces both (wire.BrokerPins).
func PinnedTLSSet(pins func() []string, onMismatch func(*PinError)) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin below, checked in the handshake
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the broker presented no certificate")
			}
			got := Fingerprint(cs.PeerCertificates[0].Raw)
			set := pins()
			if !slices.Contains(set, got) {
				e := &PinError{Got: got, Pinned: strings.Join(set, " or ")}
				if onMismatch != nil {
					onMismatch(e)
				}
				return e
			}
			return nil
		},
	}
}
