package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// EnrolKeys are the public keys a node presents at enrolment, each in the
// text form it travels in. The executor makes the first three and never
// lets their private halves out; the agent makes its NKey.
type EnrolKeys struct {
	// Identity is the executor's Ed25519 identity key (base64).
	Identity string `json:"identity_key" cbor:"1,keyasint"`
	// Sealing is the executor's HPKE sealing key (base64): sealed content
	// is encrypted to it.
	Sealing string `json:"sealing_key" cbor:"2,keyasint"`
	// WireGuard is the executor's overlay public key (base64, WireGuard's
	// own form).
	WireGuard string `json:"wireguard_key" cbor:"3,keyasint"`
	// AgentNKey is the public half of the agent's NKey (a "U…" user key):
	// the broker user the grant's credential is for.
	AgentNKey string `json:"agent_nkey" cbor:"4,keyasint"`
}

// Check refuses keys that are not in their forms.
func (k *EnrolKeys) Check() error {
	for _, f := range []struct{ name, v string }{{"identity_key", k.Identity}, {"sealing_key", k.Sealing}, {"wireguard_key", k.WireGuard}} {
		b, err := base64.StdEncoding.DecodeString(f.v)
		if err != nil || len(b) == 0 || len(b) > 4096 {
			return fmt.Errorf("%s is not a base64 public key", f.name)
		}
	}
	if !ValidUserNKey(k.AgentNKey) {
		return fmt.Errorf("agent_nkey %q is not a NATS user public key", k.AgentNKey)
	}
	return nil
}

// ValidUserNKey checks the form of a NATS user public key ("U" and 55
// more base32 characters) without linking the NATS libraries: the
// executor treats it as a name, and the broker checks the key itself.
func ValidUserNKey(s string) bool {
	if len(s) != 56 || s[0] != 'U' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// Proof is the enrolment proof: an HMAC-SHA256 keyed with the token's
// one-time secret over the token id and every public key the node
// presents. Only the executor holds the secret, so an agent (or anyone on
// the way) that substitutes a key cannot make a proof for it; the control
// side, which issued the secret, checks it.
func Proof(secret [32]byte, tokenID [8]byte, k *EnrolKeys) []byte {
	m := hmac.New(sha256.New, secret[:])
	m.Write([]byte("nox-mesh enrolment proof v1\x00"))
	m.Write(tokenID[:])
	for _, f := range []string{k.Identity, k.Sealing, k.WireGuard, k.AgentNKey} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

// CheckProof reports whether proof is the proof of k under secret.
func CheckProof(secret [32]byte, tokenID [8]byte, k *EnrolKeys, proof []byte) bool {
	return hmac.Equal(Proof(secret, tokenID, k), proof)
}

// EnrolSubjectPrefix is where enrolment requests go: <prefix>.<token id>.
// The token's one-time credential may publish there and nowhere else.
const EnrolSubjectPrefix = "mesh.enrol"

// EnrolRequest is what the agent sends the control side, on
// mesh.enrol.<token id>, with the token's one-time credential.
type EnrolRequest struct {
	Token string    `json:"token"` // the token id, hex
	Keys  EnrolKeys `json:"keys"`
	Proof string    `json:"proof"` // base64
	// Hostname names a node made by a --new token, if the token did not.
	Hostname string `json:"hostname,omitempty"`
	// Profile and Inventory are what the machine can do and what it is,
	// as the executor found them (JSON): the input to deciding what it runs.
	Profile   json.RawMessage `json:"profile,omitempty"`
	Inventory json.RawMessage `json:"inventory,omitempty"`
}

// EnrolReply is the control side's answer: a grant, or why not.
type EnrolReply struct {
	Grant   []byte `json:"grant,omitempty"` // a COSE_Sign1 envelope, purpose grant
	Refused string `json:"refused,omitempty"`
	// StoreCopy, on a re-enrolment, is the node's last report of what it
	// owns, signed (purpose store-copy) for the new enrolment.
	StoreCopy []byte `json:"store_copy,omitempty"`
}

// OwnedEntry is one thing the host made for the link, as a report
// carries it and a store copy hands it back: enough to remove it again
// only if it is still exactly what the host wrote.
type OwnedEntry struct {
	Target string `json:"target" cbor:"1,keyasint"` // "path:/etc/motd"
	Type   string `json:"type" cbor:"2,keyasint"`
	Module string `json:"module" cbor:"3,keyasint"`
	ID     string `json:"id" cbor:"4,keyasint"`
	// Digest is what the host last wrote and read back (a file's sha256,
	// or a keyed digest for sealed content).
	Digest string `json:"digest,omitempty" cbor:"5,keyasint,omitempty"`
	Mode   uint32 `json:"mode,omitempty" cbor:"6,keyasint,omitempty"`
	UID    uint32 `json:"uid,omitempty" cbor:"7,keyasint,omitempty"`
	GID    uint32 `json:"gid,omitempty" cbor:"8,keyasint,omitempty"`
}

// StoreCopy is what the control side signs (purpose store-copy) to hand a
// node back the record of what it owned, when it is enrolled again after
// losing its store. It is a backup, never a source: the executor takes it
// in only into an empty store, and removes a recovered thing only if it is
// still exactly what the host wrote.
type StoreCopy struct {
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"` // the new enrolment it is handed to
	// From: the enrolment and sequence whose report it copies.
	FromEnrolment string       `json:"from_enrolment"`
	FromSeq       uint64       `json:"from_seq"`
	Reported      time.Time    `json:"reported"`
	Entries       []OwnedEntry `json:"entries"`
}

// ParseStoreCopy decodes a store copy's payload strictly.
func ParseStoreCopy(payload []byte) (*StoreCopy, error) {
	var c StoreCopy
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("store copy: %w", err)
	}
	if c.Node == "" || c.Enrolment == "" {
		return nil, fmt.Errorf("store copy: node and enrolment are required")
	}
	return &c, nil
}

// Grant is what the control plane signs (purpose grant) when it enrols a
// node. The executor verifies it against the key its token pinned and
// against its own enrolment (the token, its keys, the agent's NKey it
// proved) before recording anything.
type Grant struct {
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"`
	Token     string `json:"token"` // the token id it answers
	// SeqFloor: declarations at or below it are refused.
	SeqFloor uint64 `json:"seq_floor"`
	// The executor's key ids (KeyIDOf) and the agent's NKey, as proven.
	IdentityKey  string `json:"identity_key_id"`
	SealingKey   string `json:"sealing_key_id"`
	WireGuardKey string `json:"wireguard_key_id"`
	AgentNKey    string `json:"agent_nkey"`
	// UserJWT is the agent's broker credential: a NATS user JWT for its
	// NKey, scoped to its own subjects, without expiry.
	UserJWT string    `json:"user_jwt"`
	Issued  time.Time `json:"issued"`
}

// KeyIDOf names a public key in its text form: the first 8 bytes of the
// SHA-256 of the text, in hex.
func KeyIDOf(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:8])
}

// GrantMismatch says what in a grant differs from the enrolment that asked
// for it ("" when nothing does).
func (g *Grant) Mismatch(tokenID string, k *EnrolKeys) string {
	var bad []string
	if g.Token != tokenID {
		bad = append(bad, fmt.Sprintf("it answers token %s, this enrolment is token %s", g.Token, tokenID))
	}
	for _, f := range []struct{ name, got, want string }{
		{"identity key", g.IdentityKey, KeyIDOf(k.Identity)},
		{"sealing key", g.SealingKey, KeyIDOf(k.Sealing)},
		{"WireGuard key", g.WireGuardKey, KeyIDOf(k.WireGuard)},
		{"agent NKey", g.AgentNKey, k.AgentNKey},
	} {
		if f.got != f.want {
			bad = append(bad, fmt.Sprintf("its %s is %s, this executor's is %s", f.name, f.got, f.want))
		}
	}
	return strings.Join(bad, "; ")
}

// ParseGrant decodes a grant's payload strictly.
func ParseGrant(payload []byte) (*Grant, error) {
	var g Grant
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return nil, fmt.Errorf("grant: %w", err)
	}
	if g.Node == "" || g.Enrolment == "" || g.Token == "" {
		return nil, fmt.Errorf("grant: node, enrolment and token are required")
	}
	return &g, nil
}
