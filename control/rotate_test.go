package control_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// walk is what a node holding key takes of chain, as its executor takes
// it (each statement the key in force signs, in order): the key in force
// after.
func walk(t *testing.T, key ed25519.PublicKey, chain [][]byte) ed25519.PublicKey {
	t.Helper()
	for _, env := range chain {
		r, err := wire.OpenRotation(key, nil, env)
		if errors.Is(err, wire.ErrWrongKey) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		key, _ = r.NewKey()
	}
	return key
}

// A rotation cut off between its statements and its switch (serve
// stopped, killed, or the key directory refusing the new key) leaves
// statements naming a key that never signed anything. The next rotation
// from the same key replaces them: a node that was away through both
// takes the chain to the key the control side signs with, not to the
// abandoned one, past the reach of what follows.
func TestARotationCutOffIsReplacedByTheNext(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	text, _, err := s.client.IssueToken(ctx, "n1", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	grantOf(t, s, must(requestWith(t, s, text, newMachine(t).keys, nil, nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}})))
	enrolled := s.client.Keys.ControlPublic()

	// The switch refused: control.key is, for a moment, a directory.
	keyFile := filepath.Join(dir, control.FileControlKey)
	saved, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(keyFile)
	os.MkdirAll(filepath.Join(keyFile, "in-the-way"), 0o700)
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err == nil {
		t.Fatal("a rotation whose switch failed said it was done")
	}
	os.RemoveAll(keyFile)
	os.WriteFile(keyFile, saved, 0o600)
	if !s.client.Keys.ControlPublic().Equal(enrolled) {
		t.Fatal("a rotation whose switch failed signs with its new key")
	}
	rec, _, _ := s.client.Node(ctx, "n1")
	if len(rec.Rotations) != 1 {
		t.Fatalf("the cut-off rotation left %d statements", len(rec.Rotations))
	}

	res, err := s.client.RotateKey(ctx, control.RotateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, _ = s.client.Node(ctx, "n1")
	if got := walk(t, enrolled, rec.Rotations); !got.Equal(s.client.Keys.ControlPublic()) || wire.KeyID(got) != res.To {
		t.Fatalf("a node away through both takes the chain to key %s; the control side signs with %s (%d statements)",
			wire.KeyID(got), wire.KeyID(s.client.Keys.ControlPublic()), len(rec.Rotations))
	}
	// And on, through a routine rotation after it.
	if _, err := s.client.RotateKey(ctx, control.RotateRequest{}); err != nil {
		t.Fatal(err)
	}
	rec, _, _ = s.client.Node(ctx, "n1")
	if got := walk(t, enrolled, rec.Rotations); !got.Equal(s.client.Keys.ControlPublic()) || len(rec.Rotations) != 2 {
		t.Fatalf("after another rotation: the chain (%d) leads to %s, the control side signs with %s", len(rec.Rotations), wire.KeyID(got), wire.KeyID(s.client.Keys.ControlPublic()))
	}
}
