package wire

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"
)

// A renewed credential's statement opens only under the key that signed
// it and for its own purpose, and is read strictly.
func TestParseUserJWT(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	payload, _ := json.Marshal(&UserJWT{Node: "n1", Enrolment: "e-1", JWT: "eyJ.x.y", Issued: time.Now().UTC()})
	env, err := Seal(key, PurposeUserJWT, payload)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(otherPub, PurposeUserJWT, env); err == nil {
		t.Fatal("opened under another key")
	}
	if _, err := Open(pub, PurposeBrokerPins, env); err == nil {
		t.Fatal("opened for another purpose")
	}
	p, err := Open(pub, PurposeUserJWT, env)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := ParseUserJWT(p); err != nil || u.Node != "n1" || u.JWT != "eyJ.x.y" {
		t.Fatalf("%+v %v", u, err)
	}
	for _, bad := range []string{`{"node":"n1","enrolment":"e-1","jwt":"x","issued":"2026-12-03T00:00:00Z","more":1}`, `{"node":"n1","enrolment":"e-1"}`, `[]`} {
		if _, err := ParseUserJWT([]byte(bad)); err == nil {
			t.Errorf("read %s", bad)
		}
	}
}

// FuzzParseUserJWT: a hostile statement never panics, and one read names
// a node, an enrolment and a JWT.
func FuzzParseUserJWT(f *testing.F) {
	f.Add([]byte(`{"node":"n1","enrolment":"e-1","jwt":"eyJ.x.y","issued":"2026-12-03T00:00:00Z"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUserJWT(b)
		if err != nil {
			return
		}
		if u.Node == "" || u.Enrolment == "" || u.JWT == "" {
			t.Fatalf("read %+v", u)
		}
	})
}
