package wire

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func TestRekeyRequest(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	pub := base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))
	nonce := strings.Repeat("ab", RekeyNonceSize)
	good := SignRekey(key, "n1", "e-1", nonce)
	if err := good.Check(pub); err != nil {
		t.Fatalf("a genuine request: %v", err)
	}
	for name, tc := range map[string]struct {
		r    RekeyRequest
		key  string
		want string
	}{
		"another node":      {r: RekeyRequest{Node: "n2", Enrolment: "e-1", Nonce: nonce, Signature: good.Signature}, key: pub, want: "not signed by the identity key"},
		"another enrolment": {r: RekeyRequest{Node: "n1", Enrolment: "e-2", Nonce: nonce, Signature: good.Signature}, key: pub, want: "not signed by the identity key"},
		"another nonce":     {r: RekeyRequest{Node: "n1", Enrolment: "e-1", Nonce: strings.Repeat("cd", RekeyNonceSize), Signature: good.Signature}, key: pub, want: "not signed by the identity key"},
		"another key":       {r: *SignRekey(other, "n1", "e-1", nonce), key: pub, want: "not signed by the identity key"},
		"short nonce":       {r: *SignRekey(key, "n1", "e-1", "abcd"), key: pub, want: "nonce is not 16 bytes"},
		"no key recorded":   {r: *good, key: "", want: "holds no identity key"},
		"no signature":      {r: RekeyRequest{Node: "n1", Enrolment: "e-1", Nonce: nonce}, key: pub, want: "not signed by the identity key"},
	} {
		if err := tc.r.Check(tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

func TestRekeyToken(t *testing.T) {
	k, err := SealedKEM().GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	nonce := strings.Repeat("ab", RekeyNonceSize)
	sealed, err := SealRekeyToken(k.PublicKey().Bytes(), "n1", nonce, "nmt-secret")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "nmt-secret") {
		t.Fatal("the token is in the clear")
	}
	if got, err := OpenRekeyToken(k, "n1", nonce, sealed); err != nil || got != "nmt-secret" {
		t.Fatalf("opened %q, %v", got, err)
	}
	other, _ := SealedKEM().GenerateKey()
	for name, open := range map[string]func() (string, error){
		"another node":  func() (string, error) { return OpenRekeyToken(k, "n2", nonce, sealed) },
		"another nonce": func() (string, error) { return OpenRekeyToken(k, "n1", strings.Repeat("cd", RekeyNonceSize), sealed) },
		"another key":   func() (string, error) { return OpenRekeyToken(other, "n1", nonce, sealed) },
		"as a file": func() (string, error) {
			b, err := OpenSealed(k, "n1", 0, "rekey", nonce, sealed)
			return string(b), err
		},
	} {
		if got, err := open(); !errors.Is(err, ErrSealedOpen) || got != "" {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
}

func TestParseRekeyAnswer(t *testing.T) {
	for in, want := range map[string]string{
		`{"node":"n1","enrolment":"e","nonce":"x","token":"t","expires":"2026-01-01T00:00:00Z"}`:            "",
		`{"node":"n1","enrolment":"e","nonce":"x","token":"t","expires":"2026-01-01T00:00:00Z","more":1}`:   "unknown field",
		`{"node":"n1","enrolment":"e","nonce":"x","expires":"2026-01-01T00:00:00Z"}`:                        "are required",
		`{"node":"n1","enrolment":"e","nonce":"x","token":"t","expires":"2026-01-01T00:00:00Z"} {"node":1}`: "trailing data",
	} {
		_, err := ParseRekeyAnswer([]byte(in))
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func FuzzParseRekeyAnswer(f *testing.F) {
	f.Add([]byte(`{"node":"n1","enrolment":"e","nonce":"x","token":"t","expires":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseRekeyAnswer(b)
		if err == nil && (a.Node == "" || a.Token == "") {
			t.Fatalf("accepted %q without its required fields", b)
		}
	})
}
