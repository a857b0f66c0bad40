package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// The enrolment token: what a person carries from `mesh-control token
// issue` to `mesh-executor enrol`. Its authenticity comes from the channel
// it travelled (read off a screen, pasted into a terminal), which is what
// lets a node trust a mesh it has never spoken to.
//
// It is binary, then base64url, behind a version prefix, with a checksum
// so a mistyped token is refused as mistyped rather than as a wrong key:
//
//	"nmt1-" base64url( version=1 | id[8] | expires[8, unix s, big endian] |
//	                   fingerprint[32] | control key[32] | secret[32] |
//	                   credential[32] | len(url)[1] | url |
//	                   checksum[4] = SHA-256(all before)[:4] )
//
// Whitespace and line breaks anywhere are ignored, so a token wrapped
// across lines by a terminal pastes whole.

// TokenPrefix starts every token.
const TokenPrefix = "nmt1-"

const tokenVersion = 1

// Token is an enrolment token, decoded.
type Token struct {
	// ID names the token (and its record on the control side).
	ID [8]byte
	// Expires: the token is refused after this, used or not.
	Expires time.Time
	// BrokerURL is where the node dials (tls://host:port).
	BrokerURL string
	// Fingerprint is the SHA-256 of the broker's certificate (DER).
	Fingerprint [32]byte
	// ControlKey is the control plane's public key, which the executor pins.
	ControlKey ed25519.PublicKey
	// Secret is the one-time secret: it stays with the executor, which
	// proves with it that the public keys it presents are its own.
	Secret [32]byte
	// Credential is the raw seed of a one-time broker user (an NKey) that
	// can do nothing but make this enrolment request.
	Credential [32]byte
}

// ErrMistyped is a token whose checksum does not match: a typing or
// copying mistake, not an attack on a key.
var ErrMistyped = errors.New("the token is mistyped (its checksum does not match); copy it again")

// MaxBrokerURL is the most a token carries of its broker addresses: its
// length is one byte.
const MaxBrokerURL = 255

// IDString is the token id in hex.
func (t *Token) IDString() string { return hex.EncodeToString(t.ID[:]) }

// FingerprintHex is the broker fingerprint as the agent pins it.
func (t *Token) FingerprintHex() string { return hex.EncodeToString(t.Fingerprint[:]) }

// Encode returns the token as a person carries it.
func (t *Token) Encode() (string, error) {
	if len(t.BrokerURL) > MaxBrokerURL {
		return "", fmt.Errorf("token: broker URL over %d bytes", MaxBrokerURL)
	}
	if len(t.ControlKey) != ed25519.PublicKeySize {
		return "", fmt.Errorf("token: control key is not an Ed25519 public key")
	}
	var b bytes.Buffer
	b.WriteByte(tokenVersion)
	b.Write(t.ID[:])
	binary.Write(&b, binary.BigEndian, uint64(t.Expires.Unix()))
	b.Write(t.Fingerprint[:])
	b.Write(t.ControlKey)
	b.Write(t.Secret[:])
	b.Write(t.Credential[:])
	b.WriteByte(byte(len(t.BrokerURL)))
	b.WriteString(t.BrokerURL)
	sum := sha256.Sum256(b.Bytes())
	b.Write(sum[:4])
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b.Bytes()), nil
}

// ParseToken decodes a token as pasted. A wrong checksum is ErrMistyped.
func ParseToken(s string) (*Token, error) {
	s = strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\n', '\r':
			return -1
		}
		return r
	}, s)
	if s == "" {
		return nil, errors.New("token: no token given (an empty line or file)")
	}
	if !strings.HasPrefix(s, TokenPrefix) {
		if strings.HasPrefix(s, "nmt") {
			return nil, fmt.Errorf("token: version %q is not one this host reads (it reads %s)", strings.SplitN(s, "-", 2)[0], TokenPrefix)
		}
		return nil, fmt.Errorf("token: not an enrolment token (it starts %q)", TokenPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(s[len(TokenPrefix):])
	if err != nil {
		return nil, ErrMistyped
	}
	const fixed = 1 + 8 + 8 + 32*4 + 1
	if len(raw) < fixed+4 {
		return nil, ErrMistyped
	}
	body, sum := raw[:len(raw)-4], raw[len(raw)-4:]
	want := sha256.Sum256(body)
	if !bytes.Equal(sum, want[:4]) {
		return nil, ErrMistyped
	}
	if body[0] != tokenVersion {
		return nil, fmt.Errorf("token: version %d is not one this host reads", body[0])
	}
	t := &Token{}
	r := body[1:]
	copy(t.ID[:], r[:8])
	t.Expires = time.Unix(int64(binary.BigEndian.Uint64(r[8:16])), 0).UTC()
	r = r[16:]
	copy(t.Fingerprint[:], r[:32])
	t.ControlKey = ed25519.PublicKey(bytes.Clone(r[32:64]))
	copy(t.Secret[:], r[64:96])
	copy(t.Credential[:], r[96:128])
	n := int(r[128])
	r = r[129:]
	if len(r) != n {
		return nil, fmt.Errorf("token: malformed (the broker address is %d bytes, %d remain)", n, len(r))
	}
	t.BrokerURL = string(r)
	u, err := url.Parse(t.BrokerURL)
	if err != nil || u.Host == "" || u.Scheme != "tls" {
		return nil, fmt.Errorf("token: broker address %q is not tls://host:port", t.BrokerURL)
	}
	return t, nil
}

// Expired reports whether the token has expired at now.
func (t *Token) Expired(now time.Time) bool { return !now.Before(t.Expires) }
