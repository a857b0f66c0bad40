package wire

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// EnrolKeys are the public keys a node presents at enrolment, each in the
// text form it travels in, and the identity the executor holds already, if
// any: everything the enrolment proof covers. The executor makes the first
// three and never lets their private halves out; the agent makes its NKey.
//
// Held rides here, and not beside the keys, because the proof must cover
// it: an agent that dropped it would turn a replacement (the old node
// revoked) into a second identity for one machine.
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
	// Held is the identity the executor holds now, when root enrols an
	// enrolled host again; nil on a hosted one.
	Held *HeldIdentity `json:"held,omitempty" cbor:"5,keyasint,omitempty"`
}

// HeldIdentity is the identity an enrolled executor holds when root
// enrols it again, signed with that identity's own key over the new
// request (HeldMessage). It lets the control side tell a machine that
// already is a node from a new one, and so refuse a token that would make
// it a second node while the first is live and silent — unless root asked
// to replace it (mesh-executor enrol --replace), and then revoke the old
// identity in the same step as it grants the new one.
//
// The signature is what makes a replacement safe to honour: only the
// executor holding node X's identity key can make one naming X, and it is
// bound to this token and these new keys, so a compromised agent can
// neither forge one nor replay one to revoke another node.
type HeldIdentity struct {
	Node      string `json:"node" cbor:"1,keyasint"`
	Enrolment string `json:"enrolment" cbor:"2,keyasint"`
	// Replace: root asked (enrol --replace) that this identity be revoked
	// as the new one is granted.
	Replace bool `json:"replace,omitempty" cbor:"3,keyasint,omitempty"`
	// Signature is Ed25519, by the held identity's key, over HeldMessage.
	// It is absent when the executor has no usable key for the identity
	// it holds; such a claim can refuse its own enrolment, never revoke.
	Signature []byte `json:"signature,omitempty" cbor:"4,keyasint,omitempty"`
}

// Name is how the held identity is said: "node X (enrolment Y)".
func (h *HeldIdentity) Name() string {
	return fmt.Sprintf("node %s (enrolment %s)", h.Node, h.Enrolment)
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
	if h := k.Held; h != nil {
		switch {
		case h.Node == "" || len(h.Node) > 63 || h.Enrolment == "" || len(h.Enrolment) > 128:
			return fmt.Errorf("held: node (1 to 63 bytes) and enrolment (1 to 128) are required, got %q and %q", h.Node, h.Enrolment)
		case len(h.Signature) != 0 && len(h.Signature) != ed25519.SignatureSize:
			return fmt.Errorf("held: the signature is %d bytes, not an Ed25519 signature", len(h.Signature))
		}
	}
	return nil
}

// HeldMessage is what the held identity's key signs: the token id, every
// new public key and the held identity with root's choice, so the
// signature answers this one request and no other.
func HeldMessage(tokenID [8]byte, k *EnrolKeys) []byte {
	var b []byte
	b = append(b, "nox-mesh held identity v1\x00"...)
	b = append(b, tokenID[:]...)
	for _, f := range []string{k.Identity, k.Sealing, k.WireGuard, k.AgentNKey, k.Held.Node, k.Held.Enrolment} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	if k.Held.Replace {
		return append(b, 1)
	}
	return append(b, 0)
}

// SignHeld signs k.Held with the held identity's private key.
func SignHeld(key ed25519.PrivateKey, tokenID [8]byte, k *EnrolKeys) {
	k.Held.Signature = ed25519.Sign(key, HeldMessage(tokenID, k))
}

// VerifyHeld reports whether k.Held is signed by pub (base64, the held
// identity's public key as the control side recorded it) for this request.
func VerifyHeld(pub string, tokenID [8]byte, k *EnrolKeys) bool {
	raw, err := base64.StdEncoding.DecodeString(pub)
	if err != nil || len(raw) != ed25519.PublicKeySize || k.Held == nil || len(k.Held.Signature) != ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(ed25519.PublicKey(raw), HeldMessage(tokenID, k), k.Held.Signature)
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
// one-time secret over the token id, every public key the node presents
// and the identity it holds. Only the executor holds the secret, so an
// agent (or anyone on the way) that substitutes a key, or drops or changes
// the held identity, cannot make a proof for it; the control side, which
// issued the secret, checks it. Without a held identity the proof is what
// it always was.
func Proof(secret [32]byte, tokenID [8]byte, k *EnrolKeys) []byte {
	m := hmac.New(sha256.New, secret[:])
	m.Write([]byte("nox-mesh enrolment proof v1\x00"))
	m.Write(tokenID[:])
	field := func(f []byte) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	for _, f := range []string{k.Identity, k.Sealing, k.WireGuard, k.AgentNKey} {
		field([]byte(f))
	}
	if h := k.Held; h != nil {
		m.Write([]byte("held\x00"))
		field([]byte(h.Node))
		field([]byte(h.Enrolment))
		if h.Replace {
			m.Write([]byte{1})
		} else {
			m.Write([]byte{0})
		}
		field(h.Signature)
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
	// Refusal is Refused, signed (purpose enrol-refusal, an EnrolRefusal),
	// when the control side can say whose request it refuses: only a
	// signed refusal that answers the executor's own request ends its
	// enrolment; the agent's word does not.
	Refusal []byte `json:"refusal,omitempty"`
	// StoreCopy, on a re-enrolment, is the node's last report of what it
	// owns, signed (purpose store-copy) for the new enrolment.
	StoreCopy []byte `json:"store_copy,omitempty"`
}

// PurposeEnrolRefusal is the purpose of a signed EnrolRefusal.
const PurposeEnrolRefusal Purpose = "application/nox-mesh.enrol-refusal+cose"

// EnrolRefusal is what the control side signs (purpose enrol-refusal)
// when it refuses an enrolment, so that the executor can end its pending
// enrolment on the control side's word rather than the agent's.
//
// A refusal is of the token (Proof empty): it is unknown, revoked, used or
// expired, or was spent by a request that then failed; no request made
// with it can succeed. Or it is of one request (Proof set): the proof
// verified, so the request is exactly the one the executor made, and
// something in it is refused (a held identity that is live, a replacement
// that does not verify). A request whose proof does not verify is never
// answered with a signed refusal: anyone holding the token's one-time
// credential (the agent) could make one, and it must not end what root
// began.
type EnrolRefusal struct {
	Token string `json:"token"`
	// Proof is the refused request's proof (base64), when the refusal is
	// of that request.
	Proof  string    `json:"proof,omitempty"`
	Reason string    `json:"reason"`
	Issued time.Time `json:"issued"`
}

// ParseEnrolRefusal decodes a signed refusal's payload strictly.
func ParseEnrolRefusal(payload []byte) (*EnrolRefusal, error) {
	var r EnrolRefusal
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("enrolment refusal: %w", err)
	}
	if r.Token == "" || r.Reason == "" {
		return nil, fmt.Errorf("enrolment refusal: token and reason are required")
	}
	return &r, nil
}

// Answers reports whether the refusal answers the request the executor
// made with token tokenID and proof: a refusal of the token answers every
// request made with it; a refusal of a request answers only that one.
func (r *EnrolRefusal) Answers(tokenID string, proof []byte) bool {
	if r.Token != tokenID {
		return false
	}
	return r.Proof == "" || hmac.Equal([]byte(r.Proof), []byte(base64.StdEncoding.EncodeToString(proof)))
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
	Mode   Mode   `json:"mode,omitempty" cbor:"6,keyasint,omitempty"`
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
	// ReplacedNode and ReplacedEnrolment name the identity this grant
	// replaced (the request's held identity, with Replace): revoked on the
	// control side before this grant was signed, or found not live. The
	// executor that asked for a replacement accepts no grant without it.
	ReplacedNode      string `json:"replaced_node,omitempty"`
	ReplacedEnrolment string `json:"replaced_enrolment,omitempty"`
	// RecoveryKey, base64, is the control plane's offline recovery key,
	// which the executor pins beside the control key (wire.ByRecovery).
	// Only an agent of link capability 1 or later is granted one: the
	// executors before it refuse a grant with a field they do not know.
	RecoveryKey string `json:"recovery_key,omitempty"`
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
	var wantNode, wantEnrolment string
	if k.Held != nil && k.Held.Replace {
		wantNode, wantEnrolment = k.Held.Node, k.Held.Enrolment
	}
	switch {
	case g.ReplacedNode == wantNode && g.ReplacedEnrolment == wantEnrolment:
	case wantNode == "":
		bad = append(bad, fmt.Sprintf("it replaces node %s (enrolment %s), and this enrolment replaces nothing", g.ReplacedNode, g.ReplacedEnrolment))
	default:
		bad = append(bad, fmt.Sprintf("it does not say it replaced node %s (enrolment %s), which this enrolment replaces", wantNode, wantEnrolment))
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

// Mode is a file's permission bits: a number on the wire (CBOR), and in
// JSON — what a person reads in a report — the octal string a declaration
// writes ("0644"); a number is read too, as releases before wrote it.
type Mode uint32

// MarshalJSON writes the mode as "0644".
func (m Mode) MarshalJSON() ([]byte, error) { return []byte(fmt.Sprintf("\"%04o\"", uint32(m))), nil }

// UnmarshalJSON reads "0644", or a number.
func (m *Mode) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		n, err := strconv.ParseUint(s[1:len(s)-1], 8, 32)
		if err != nil || n > 0o7777 {
			return fmt.Errorf("wire: mode %s is not an octal mode", s)
		}
		*m = Mode(n)
		return nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("wire: mode %s is not a mode", s)
	}
	*m = Mode(n)
	return nil
}
