package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"
)

func sampleToken(t testing.TB) *Token {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	tok := &Token{BrokerURL: "tls://mesh.example.net:4222", ControlKey: pub, Expires: time.Unix(1900000000, 0).UTC()}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	rand.Read(tok.Credential[:])
	rand.Read(tok.Fingerprint[:])
	return tok
}

func TestTokenRoundTrip(t *testing.T) {
	tok := sampleToken(t)
	s, err := tok.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(s) > 250 {
		t.Errorf("token is %d characters: too long to paste comfortably", len(s))
	}
	// Wrapped by a terminal, indented by a mail client: still the token.
	wrapped := s[:40] + "\n  " + s[40:100] + "\r\n\t" + s[100:] + "\n"
	for _, in := range []string{s, wrapped} {
		got, err := ParseToken(in)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != tok.ID || got.Secret != tok.Secret || got.Credential != tok.Credential || got.Fingerprint != tok.Fingerprint ||
			!bytes.Equal(got.ControlKey, tok.ControlKey) || got.BrokerURL != tok.BrokerURL || !got.Expires.Equal(tok.Expires) {
			t.Fatalf("round trip: %+v != %+v", got, tok)
		}
	}
}

func TestTokenRefusals(t *testing.T) {
	s, _ := sampleToken(t).Encode()
	flip := func(i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	// Any one character mistyped is refused as mistyped.
	for i := len(TokenPrefix); i < len(s); i++ {
		if _, err := ParseToken(flip(i)); !errors.Is(err, ErrMistyped) {
			t.Fatalf("character %d changed: %v, want ErrMistyped", i, err)
		}
	}
	for name, in := range map[string]string{
		"truncated":  s[:len(s)-5],
		"doubled":    s + s[len(TokenPrefix):],
		"not base64": s[:20] + "!!" + s[22:],
	} {
		if _, err := ParseToken(in); !errors.Is(err, ErrMistyped) {
			t.Errorf("%s: %v, want ErrMistyped", name, err)
		}
	}
	for _, empty := range []string{"", "\n", "  \t\r\n"} {
		if _, err := ParseToken(empty); err == nil || !strings.Contains(err.Error(), "no token given") {
			t.Errorf("%q: %v, want it to say no token was given", empty, err)
		}
	}
	if _, err := ParseToken("hello"); err == nil || !strings.Contains(err.Error(), "not an enrolment token") {
		t.Errorf("not a token: %v", err)
	}
	if _, err := ParseToken("nmt2-" + s[len(TokenPrefix):]); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("another version: %v", err)
	}
	bad := sampleToken(t)
	bad.BrokerURL = "nats://plain:4222"
	if enc, _ := bad.Encode(); enc != "" {
		if _, err := ParseToken(enc); err == nil || !strings.Contains(err.Error(), "tls://") {
			t.Errorf("a broker without TLS: %v", err)
		}
	}
}

func TestProofBindsEveryKey(t *testing.T) {
	tok := sampleToken(t)
	k := EnrolKeys{Identity: "aWQ=", Sealing: "c2VhbA==", WireGuard: "d2c=", AgentNKey: "U" + strings.Repeat("A", 55)}
	p := Proof(tok.Secret, tok.ID, &k)
	if !CheckProof(tok.Secret, tok.ID, &k, p) {
		t.Fatal("the proof does not check")
	}
	for name, change := range map[string]func(*EnrolKeys){
		"identity": func(k *EnrolKeys) { k.Identity = "eA==" },
		"sealing":  func(k *EnrolKeys) { k.Sealing = "eA==" },
		"wg":       func(k *EnrolKeys) { k.WireGuard = "eA==" },
		"nkey":     func(k *EnrolKeys) { k.AgentNKey = "U" + strings.Repeat("B", 55) },
		// Moving bytes between fields is another set of keys.
		"shifted": func(k *EnrolKeys) { k.Identity, k.Sealing = k.Identity+"c2Vh", "bA==" },
	} {
		k2 := k
		change(&k2)
		if CheckProof(tok.Secret, tok.ID, &k2, p) {
			t.Errorf("%s changed: the proof still checks", name)
		}
	}
	other := tok.ID
	other[0] ^= 1
	if CheckProof(tok.Secret, other, &k, p) {
		t.Error("another token id: the proof still checks")
	}
}

func FuzzParseToken(f *testing.F) {
	s, _ := sampleToken(f).Encode()
	f.Add(s)
	f.Add(TokenPrefix)
	f.Add(s[:len(s)-1])
	f.Fuzz(func(t *testing.T, in string) {
		tok, err := ParseToken(in)
		if err != nil {
			return
		}
		again, err := tok.Encode()
		if err != nil {
			t.Fatalf("a parsed token does not encode: %v", err)
		}
		back, err := ParseToken(again)
		if err != nil || back.ID != tok.ID || back.BrokerURL != tok.BrokerURL {
			t.Fatalf("re-encoded token does not read back: %v", err)
		}
	})
}

func FuzzParseGrant(f *testing.F) {
	f.Add([]byte(`{"node":"n","enrolment":"e","token":"t","seq_floor":3,"identity_key_id":"a","sealing_key_id":"b","wireguard_key_id":"c","agent_nkey":"U","user_jwt":"j","issued":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"node":"n","node":"m"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ParseGrant(b)
		if err == nil && (g.Node == "" || g.Enrolment == "" || g.Token == "") {
			t.Fatal("a grant without node, enrolment or token was accepted")
		}
	})
}

func FuzzParseEnrolRefusal(f *testing.F) {
	f.Add([]byte(`{"token":"t","proof":"cA==","reason":"no","issued":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"token":"t","token":"u","reason":"r"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseEnrolRefusal(b)
		if err == nil && (r.Token == "" || r.Reason == "") {
			t.Fatal("a refusal without token or reason was accepted")
		}
	})
}

func FuzzParseStoreCopy(f *testing.F) {
	f.Add([]byte(`{"node":"n","enrolment":"e","from_enrolment":"d","from_seq":3,"reported":"2026-01-01T00:00:00Z","entries":[{"target":"path:/x","type":"file","module":"m","id":"f","digest":"ab","mode":420}]}`))
	f.Add([]byte(`{"node":"n","enrolment":"e","entries":[{"target":"path:/x","colour":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseStoreCopy(b)
		if err == nil && (c.Node == "" || c.Enrolment == "") {
			t.Fatal("a store copy without node or enrolment was accepted")
		}
	})
}
