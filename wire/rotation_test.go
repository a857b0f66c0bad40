package wire

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// A rotation is taken only signed twice — by the authority it names (the
// key it retires, or the recovery key) and by the key it brings in — each
// for its own purpose; signed by either alone, by another key, or saying
// another authority than the one that signed, it is refused.
func TestOpenRotation(t *testing.T) {
	old, next, recovery, other := newKey(t), newKey(t), newKey(t), newKey(t)
	stmt := KeyRotation{Node: "n1", Enrolment: "e-1", Seq: 1, By: ByKey, From: KeyID(pubOf(old)), Issued: time.Now().UTC()}

	env, err := SealRotation(old, next, stmt)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenRotation(pubOf(old), nil, env)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := r.NewKey(); !k.Equal(pubOf(next)) || r.By != ByKey || r.Node != "n1" {
		t.Fatalf("%+v", r)
	}
	// The recovery key, for a node that holds it.
	byRecovery := stmt
	byRecovery.By, byRecovery.From = ByRecovery, "anything"
	renv, err := SealRotation(recovery, next, byRecovery)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := OpenRotation(pubOf(old), pubOf(recovery), renv); err != nil || r.By != ByRecovery {
		t.Fatalf("a recovery: %v %+v", err, r)
	}

	inner, _ := Seal(next, PurposeKeyRotationNew, []byte(`{}`))
	for name, c := range map[string]struct {
		env  func() []byte
		pin  ed25519.PublicKey
		rec  ed25519.PublicKey
		says string
	}{
		"signed by the new key alone": {func() []byte {
			e, _ := Seal(next, PurposeKeyRotation, inner)
			return e
		}, pubOf(old), nil, "signed by neither"},
		"the new key's statement passed off alone": {func() []byte { return inner }, pubOf(old), nil, "signed by neither"},
		"signed by the old key alone (the inner by another)": {func() []byte {
			// The old key's outer signature, over an inner statement
			// the new key did not sign.
			payload := []byte(`{"node":"n1","enrolment":"e-1","seq":1,"by":"key","from":"` + KeyID(pubOf(old)) + `","to":"` + b64(pubOf(next)) + `","issued":"2026-12-03T00:00:00Z"}`)
			forged, _ := Seal(other, PurposeKeyRotationNew, payload)
			e, _ := Seal(old, PurposeKeyRotation, forged)
			return e
		}, pubOf(old), nil, "not signed by the key it brings in"},
		"a recovery to a node without the recovery key": {func() []byte { return renv }, pubOf(old), nil, "signed by neither"},
		"a recovery signed by another key": {func() []byte {
			e, _ := SealRotation(other, next, byRecovery)
			return e
		}, pubOf(old), pubOf(recovery), "signed by neither"},
		"by the key, saying the recovery key": {func() []byte {
			e, _ := SealRotation(old, next, byRecovery)
			return e
		}, pubOf(old), pubOf(recovery), "says it is signed by the recovery key"},
		"retiring another key": {func() []byte {
			s := stmt
			s.From = KeyID(pubOf(other))
			e, _ := SealRotation(old, next, s)
			return e
		}, pubOf(old), nil, "it retires key"},
		"bringing in the key it retires": {func() []byte {
			e, _ := SealRotation(old, old, stmt)
			return e
		}, pubOf(old), nil, "brings in the key it retires"},
		"a declaration's envelope": {func() []byte {
			e, _ := Seal(old, PurposeDeclaration, []byte(`{}`))
			return e
		}, pubOf(old), nil, "signed for another purpose"},
	} {
		if _, err := OpenRotation(c.pin, c.rec, c.env()); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want a refusal saying %q", name, err, c.says)
		}
	}
}

func TestRotationChain(t *testing.T) {
	envs := [][]byte{{1, 2, 3}, {4}, {5, 6}}
	got, err := DecodeRotationChain(EncodeRotationChain(envs))
	if err != nil || len(got) != 3 || string(got[2]) != string(envs[2]) {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := DecodeRotationChain(""); got != nil || err != nil {
		t.Fatalf("no chain: %v %v", got, err)
	}
	long := make([][]byte, MaxRotationChain+1)
	for i := range long {
		long[i] = []byte{1}
	}
	if _, err := DecodeRotationChain(EncodeRotationChain(long)); err == nil {
		t.Fatal("a chain over the limit read")
	}
	if _, err := DecodeRotationChain("AA,!!"); err == nil {
		t.Fatal("a chain of garbage read")
	}
}

// FuzzOpenRotation: hostile bytes as a rotation never verify, and never
// panic, whatever keys the node holds.
func FuzzOpenRotation(f *testing.F) {
	old, next, recovery := newKey(f), newKey(f), newKey(f)
	env, _ := SealRotation(old, next, KeyRotation{Node: "n", Enrolment: "e", Seq: 1, By: ByKey, From: KeyID(pubOf(old))})
	f.Add(env)
	f.Add([]byte{0xd2, 0x84})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := OpenRotation(pubOf(old), pubOf(recovery), b); err == nil && string(b) != string(env) {
			t.Fatalf("a rotation verified that was never sealed: %x", b)
		}
	})
}

// FuzzDecodeRotationChain: a hostile header never panics, nor yields more
// statements than the limit.
func FuzzDecodeRotationChain(f *testing.F) {
	f.Add("AQID,BA==")
	f.Add(strings.Repeat("A,", 20))
	f.Fuzz(func(t *testing.T, s string) {
		if envs, err := DecodeRotationChain(s); err == nil && len(envs) > MaxRotationChain {
			t.Fatalf("%d statements", len(envs))
		}
	})
}

func b64(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }
