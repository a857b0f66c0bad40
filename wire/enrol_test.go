package wire

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func testEnrolKeys(t *testing.T) EnrolKeys {
	t.Helper()
	pub, _ := keys(t)
	return EnrolKeys{
		Identity:  base64.StdEncoding.EncodeToString(pub),
		Sealing:   base64.StdEncoding.EncodeToString([]byte("sealing public key")),
		WireGuard: base64.StdEncoding.EncodeToString(make([]byte, 32)),
		AgentNKey: "U" + strings.Repeat("A", 55),
	}
}

// Without a held identity the proof is exactly v1's (tokens and executors
// of the last release keep working); with one, every part of it is under
// the proof, so an agent can neither drop it nor change it.
func TestProofCoversTheHeldIdentity(t *testing.T) {
	var secret [32]byte
	var id [8]byte
	rand.Read(secret[:])
	rand.Read(id[:])
	k := testEnrolKeys(t)

	v1 := hmac.New(sha256.New, secret[:])
	v1.Write([]byte("nox-mesh enrolment proof v1\x00"))
	v1.Write(id[:])
	for _, f := range []string{k.Identity, k.Sealing, k.WireGuard, k.AgentNKey} {
		v1.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		v1.Write([]byte(f))
	}
	if !hmac.Equal(Proof(secret, id, &k), v1.Sum(nil)) {
		t.Fatal("the proof without a held identity is not v1's")
	}

	_, oldKey := keys(t)
	k.Held = &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}
	SignHeld(oldKey, id, &k)
	proof := Proof(secret, id, &k)
	if !CheckProof(secret, id, &k, proof) {
		t.Fatal("the proof does not check")
	}
	for name, change := range map[string]func(k *EnrolKeys){
		"dropped":             func(k *EnrolKeys) { k.Held = nil },
		"another node":        func(k *EnrolKeys) { k.Held.Node = "b" },
		"another enrolment":   func(k *EnrolKeys) { k.Held.Enrolment = "e-b" },
		"replace turned off":  func(k *EnrolKeys) { k.Held.Replace = false },
		"signature dropped":   func(k *EnrolKeys) { k.Held.Signature = nil },
		"signature flipped":   func(k *EnrolKeys) { k.Held.Signature[0] ^= 1 },
		"a field moved along": func(k *EnrolKeys) { k.Held.Node, k.Held.Enrolment = "ae", "-a" },
	} {
		c := k
		h := *k.Held
		h.Signature = append([]byte(nil), h.Signature...)
		c.Held = &h
		change(&c)
		if CheckProof(secret, id, &c, proof) {
			t.Errorf("%s: the proof still checks", name)
		}
	}
}

// The held identity's signature answers one request: this token, these
// new keys, this identity, root's choice; under the old identity's key.
func TestHeldSignatureIsBound(t *testing.T) {
	oldPub, oldKey := keys(t)
	var id [8]byte
	rand.Read(id[:])
	k := testEnrolKeys(t)
	k.Held = &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}
	SignHeld(oldKey, id, &k)
	pub := base64.StdEncoding.EncodeToString(oldPub)
	if !VerifyHeld(pub, id, &k) {
		t.Fatal("does not verify")
	}
	other := testEnrolKeys(t)
	for name, change := range map[string]func(k *EnrolKeys, id *[8]byte) string{
		"another key":          func(k *EnrolKeys, _ *[8]byte) string { return other.Identity },
		"another token":        func(_ *EnrolKeys, id *[8]byte) string { id[7] ^= 1; return pub },
		"another new identity": func(k *EnrolKeys, _ *[8]byte) string { k.Identity = other.Identity; return pub },
		"another NKey":         func(k *EnrolKeys, _ *[8]byte) string { k.AgentNKey = "U" + strings.Repeat("B", 55); return pub },
		"another node":         func(k *EnrolKeys, _ *[8]byte) string { k.Held.Node = "b"; return pub },
		"not replacing":        func(k *EnrolKeys, _ *[8]byte) string { k.Held.Replace = false; return pub },
		"no signature":         func(k *EnrolKeys, _ *[8]byte) string { k.Held.Signature = nil; return pub },
		"not a key":            func(k *EnrolKeys, _ *[8]byte) string { return "not base64" },
	} {
		c, cid := k, id
		h := *k.Held
		c.Held = &h
		if VerifyHeld(change(&c, &cid), cid, &c) {
			t.Errorf("%s: verifies", name)
		}
	}
}

func TestHeldIdentityChecked(t *testing.T) {
	for name, tc := range map[string]struct {
		h    *HeldIdentity
		want string
	}{
		"none":              {nil, ""},
		"whole":             {&HeldIdentity{Node: "a", Enrolment: "e-a", Signature: make([]byte, ed25519.SignatureSize)}, ""},
		"unsigned":          {&HeldIdentity{Node: "a", Enrolment: "e-a"}, ""},
		"no node":           {&HeldIdentity{Enrolment: "e-a"}, "node (1 to 63 bytes) and enrolment"},
		"no enrolment":      {&HeldIdentity{Node: "a"}, "node (1 to 63 bytes) and enrolment"},
		"a long node name":  {&HeldIdentity{Node: strings.Repeat("a", 64), Enrolment: "e"}, "node (1 to 63 bytes)"},
		"a short signature": {&HeldIdentity{Node: "a", Enrolment: "e", Signature: []byte{1}}, "not an Ed25519 signature"},
	} {
		k := testEnrolKeys(t)
		k.Held = tc.h
		err := k.Check()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// A grant answers a replacement only if it says it replaced exactly the
// identity held; a grant for an enrolment that replaces nothing must not
// claim one.
func TestGrantMismatchOverAReplacement(t *testing.T) {
	k := testEnrolKeys(t)
	grant := func(node, enrolment string) *Grant {
		return &Grant{Token: "t", IdentityKey: KeyIDOf(k.Identity), SealingKey: KeyIDOf(k.Sealing), WireGuardKey: KeyIDOf(k.WireGuard),
			AgentNKey: k.AgentNKey, ReplacedNode: node, ReplacedEnrolment: enrolment}
	}
	for _, tc := range []struct {
		name  string
		held  *HeldIdentity
		grant *Grant
		want  string
	}{
		{"hosted, nothing replaced", nil, grant("", ""), ""},
		{"held, not replacing, nothing replaced", &HeldIdentity{Node: "a", Enrolment: "e-a"}, grant("", ""), ""},
		{"replacing, replaced", &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}, grant("a", "e-a"), ""},
		{"replacing, not replaced", &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}, grant("", ""), "does not say it replaced node a (enrolment e-a)"},
		{"replacing, another replaced", &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}, grant("a", "e-b"), "does not say it replaced node a"},
		{"not replacing, one replaced", &HeldIdentity{Node: "a", Enrolment: "e-a"}, grant("a", "e-a"), "this enrolment replaces nothing"},
	} {
		k.Held = tc.held
		got := tc.grant.Mismatch("t", &k)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A signed refusal of the token answers every request made with it; one
// of a request answers that request alone.
func TestRefusalAnswers(t *testing.T) {
	proof := []byte("0123456789abcdef0123456789abcdef")
	mine := base64.StdEncoding.EncodeToString(proof)
	for _, tc := range []struct {
		name string
		r    EnrolRefusal
		want bool
	}{
		{"of the token", EnrolRefusal{Token: "t1"}, true},
		{"of this request", EnrolRefusal{Token: "t1", Proof: mine}, true},
		{"of another request", EnrolRefusal{Token: "t1", Proof: base64.StdEncoding.EncodeToString([]byte("another"))}, false},
		{"of another token", EnrolRefusal{Token: "t2"}, false},
		{"of this proof under another token", EnrolRefusal{Token: "t2", Proof: mine}, false},
	} {
		if got := tc.r.Answers("t1", proof); got != tc.want {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
	if (&EnrolRefusal{Token: "t1", Proof: mine}).Answers("t1", nil) {
		t.Error("a request refusal answers an executor that made no request")
	}
}

func TestParseEnrolRefusal(t *testing.T) {
	if r, err := ParseEnrolRefusal([]byte(`{"token":"t","proof":"cA==","reason":"no","issued":"2026-01-01T00:00:00Z"}`)); err != nil || r.Reason != "no" {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{`{"token":"t","reason":"no","extra":1}`, `{"reason":"no"}`, `{"token":"t"}`, `[]`} {
		if _, err := ParseEnrolRefusal([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", bad)
		}
	}
}

// The held identity crosses both boundaries whole: the socket (CBOR, in
// the offer) and the broker (JSON, in the request).
func TestHeldIdentityRoundTrips(t *testing.T) {
	k := testEnrolKeys(t)
	_, oldKey := keys(t)
	k.Held = &HeldIdentity{Node: "a", Enrolment: "e-a", Replace: true}
	SignHeld(oldKey, [8]byte{1}, &k)

	ag, ex := pipe()
	defer ag.Close()
	defer ex.Close()
	offer := &EnrolOffer{Pending: true, Token: "t", Keys: k, Proof: []byte{1}}
	go ex.Write(KindEnrolOffer, offer)
	kind, body, err := ag.Read()
	if err != nil || kind != KindEnrolOffer || !reflect.DeepEqual(body.(*EnrolOffer).Keys, k) {
		t.Fatalf("over the socket: %v %v %+v", kind, err, body)
	}

	data, _ := json.Marshal(&EnrolRequest{Token: "t", Keys: k})
	var req EnrolRequest
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || !reflect.DeepEqual(req.Keys, k) {
		t.Fatalf("over the broker: %v %+v", err, req.Keys)
	}
	// A hosted node's request is what it always was: no "held".
	k.Held = nil
	data, _ = json.Marshal(&EnrolRequest{Token: "t", Keys: k})
	if strings.Contains(string(data), "held") {
		t.Fatalf("a hosted node's request: %s", data)
	}
}
