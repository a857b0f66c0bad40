package wire

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hpke"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func sealingKey(t testing.TB) hpke.PrivateKey {
	t.Helper()
	k, err := SealedKEM().GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The sizes the format states are what crypto/hpke makes: a plaintext of n
// bytes seals to exactly n + SealedOverhead.
func TestSealedOverhead(t *testing.T) {
	k := sealingKey(t)
	for _, n := range []int{0, 1, 1000} {
		s, err := SealContent(k.PublicKey().Bytes(), "n1", 1, "m", "f", make([]byte, n))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.StdEncoding.DecodeString(s)
		if len(raw) != n+SealedOverhead {
			t.Fatalf("%d bytes sealed to %d, want %d", n, len(raw), n+SealedOverhead)
		}
	}
}

func TestSealedContent(t *testing.T) {
	k, other := sealingKey(t), sealingKey(t)
	plain := []byte("db-password: hunter2\n")
	sealed, err := SealContent(k.PublicKey().Bytes(), "web1", 42, "app", "secret", plain)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, base64.StdEncoding.EncodeToString(plain)[:12]) {
		t.Fatal("the sealed form carries the plaintext's base64")
	}
	got, err := OpenSealed(k, "web1", 42, "app", "secret", sealed)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	// Sealing is randomised: the same content sealed twice differs, so the
	// broker cannot tell that two declarations carry the same secret.
	again, _ := SealContent(k.PublicKey().Bytes(), "web1", 42, "app", "secret", plain)
	if again == sealed {
		t.Fatal("sealing the same content twice gave the same bytes")
	}
	raw, _ := base64.StdEncoding.DecodeString(sealed)
	flipped := bytes.Clone(raw)
	flipped[len(flipped)-1] ^= 1
	flippedEnc := bytes.Clone(raw)
	flippedEnc[10] ^= 1
	x25519, _ := hpke.DHKEM(ecdh.X25519()).GenerateKey()

	cases := []struct {
		name       string
		key        hpke.PrivateKey
		node       string
		seq        uint64
		module, id string
		sealed     string
		want       error // nil: any error
		says       string
	}{
		{"another node", k, "web2", 42, "app", "secret", sealed, ErrSealedOpen, "does not open"},
		{"another sequence", k, "web1", 43, "app", "secret", sealed, ErrSealedOpen, "does not open"},
		{"an older sequence", k, "web1", 41, "app", "secret", sealed, ErrSealedOpen, "does not open"},
		{"another module", k, "web1", 42, "app2", "secret", sealed, ErrSealedOpen, "does not open"},
		{"another id", k, "web1", 42, "app", "secret2", sealed, ErrSealedOpen, "does not open"},
		// The boundary between module and id is bound too: "app.s"+"ecret"
		// is another resource than "app"+".secret".
		{"module and id shifted", k, "web1", 42, "ap", "psecret", sealed, ErrSealedOpen, "does not open"},
		{"another key", other, "web1", 42, "app", "secret", sealed, ErrSealedOpen, "does not open"},
		{"a key of another KEM", x25519, "web1", 42, "app", "secret", sealed, nil, "not ML-KEM-768+X25519"},
		{"no key", nil, "web1", 42, "app", "secret", sealed, nil, "no sealing key"},
		{"a flipped ciphertext bit", k, "web1", 42, "app", "secret", base64.StdEncoding.EncodeToString(flipped), ErrSealedOpen, "does not open"},
		{"a flipped encapsulated key bit", k, "web1", 42, "app", "secret", base64.StdEncoding.EncodeToString(flippedEnc), ErrSealedOpen, "does not open"},
		{"truncated", k, "web1", 42, "app", "secret", base64.StdEncoding.EncodeToString(raw[:len(raw)-len(plain)-1]), ErrSealedMalformed, "truncated"},
		{"truncated by one byte", k, "web1", 42, "app", "secret", base64.StdEncoding.EncodeToString(raw[:len(raw)-1]), ErrSealedOpen, "does not open"},
		{"empty", k, "web1", 42, "app", "secret", "", ErrSealedMalformed, "truncated"},
		{"not base64", k, "web1", 42, "app", "secret", "not base64!", ErrSealedMalformed, "not standard base64"},
		{"garbage of the right length", k, "web1", 42, "app", "secret", base64.StdEncoding.EncodeToString(make([]byte, SealedOverhead+8)), ErrSealedOpen, "does not open"},
		{"an oversized binding", k, strings.Repeat("n", maxSealedBinding+1), 42, "app", "secret", sealed, nil, "over 1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := OpenSealed(c.key, c.node, c.seq, c.module, c.id, c.sealed)
			if err == nil {
				t.Fatalf("opened: %q", got)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Fatalf("error %q does not say %q", err, c.says)
			}
			if strings.Contains(err.Error(), string(plain)) || len(c.sealed) > 20 && strings.Contains(err.Error(), c.sealed[:20]) {
				t.Fatalf("the error carries the content: %v", err)
			}
		})
	}
}

func TestSealContentRefusesABadRecipient(t *testing.T) {
	for _, pub := range [][]byte{nil, []byte("short"), make([]byte, 32)} {
		if _, err := SealContent(pub, "n", 1, "m", "i", []byte("x")); err == nil || !strings.Contains(err.Error(), "not an ML-KEM-768+X25519 public key") {
			t.Fatalf("SealContent to %d bytes: %v", len(pub), err)
		}
	}
}

// FuzzOpenSealed: whatever a declaration's sealed field holds, and whatever
// it claims to be bound to, opening it returns an error or the content that
// was sealed for exactly that binding — never a panic.
func FuzzOpenSealed(f *testing.F) {
	k := sealingKey(f)
	plain := []byte("the secret")
	good, err := SealContent(k.PublicKey().Bytes(), "n1", 7, "m", "f", plain)
	if err != nil {
		f.Fatal(err)
	}
	raw, _ := base64.StdEncoding.DecodeString(good)
	f.Add("n1", uint64(7), "m", "f", good)
	f.Add("n1", uint64(8), "m", "f", good)
	f.Add("n1", uint64(7), "m", "f", base64.StdEncoding.EncodeToString(raw[:SealedEncSize]))
	f.Add("n1", uint64(7), "m", "f", base64.StdEncoding.EncodeToString(raw[:SealedOverhead]))
	f.Add("", uint64(0), "", "", "")
	f.Add("n1", uint64(7), "m", "f", "====")
	f.Add("n1", uint64(7), "m", "f", strings.Repeat("A", 2000))
	f.Fuzz(func(t *testing.T, node string, seq uint64, module, id, sealed string) {
		got, err := OpenSealed(k, node, seq, module, id, sealed)
		if err != nil {
			if got != nil {
				t.Fatal("an error with content")
			}
			return
		}
		if node != "n1" || seq != 7 || module != "m" || id != "f" || !bytes.Equal(got, plain) {
			t.Fatalf("opened %q for %q %d %q.%q", got, node, seq, module, id)
		}
	})
}
