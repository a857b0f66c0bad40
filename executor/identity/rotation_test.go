package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

func key(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// enrolled is a state directory as enrolment leaves it: the identity, and
// the control keys with the recovery key the grant named.
func enrolled(t *testing.T, control, recovery ed25519.PrivateKey) string {
	t.Helper()
	dir := t.TempDir()
	if err := Save(dir, &Identity{Node: "n1", Enrolment: "e-1", ControlKey: pub(control)}); err != nil {
		t.Fatal(err)
	}
	ck := &ControlKeys{Node: "n1", Enrolment: "e-1", Key: pub(control)}
	if recovery != nil {
		ck.Recovery = pub(recovery)
	}
	if err := SaveControlKeys(dir, ck); err != nil {
		t.Fatal(err)
	}
	return dir
}

func rotation(t *testing.T, authority, next ed25519.PrivateKey, seq uint64, by string, from ed25519.PrivateKey) []byte {
	t.Helper()
	env, err := wire.SealRotation(authority, next, wire.KeyRotation{Node: "n1", Enrolment: "e-1", Seq: seq, By: by, From: wire.KeyID(pub(from)), Issued: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func held(t *testing.T, dir string) *Identity {
	t.Helper()
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A chain of rotations, taken in order, each durably before the next: a
// node away through two takes both; one already taken, or retiring a key
// the node no longer holds, is passed over; the key in force is the only
// one Load gives from then on.
func TestTakeRotations(t *testing.T) {
	k0, k1, k2, rec := key(t), key(t), key(t), key(t)
	dir := enrolled(t, k0, rec)
	chain := [][]byte{rotation(t, k0, k1, 1, wire.ByKey, k0), rotation(t, k1, k2, 2, wire.ByKey, k1)}
	taken, err := TakeRotations(dir, held(t, dir), chain, time.Now())
	if err != nil || len(taken) != 2 {
		t.Fatalf("taken %d: %v", len(taken), err)
	}
	id := held(t, dir)
	if !id.ControlKey.Equal(pub(k2)) || id.Keys.Seq != 2 || len(id.Keys.Taken) != 2 || !id.Keys.Recovery.Equal(pub(rec)) {
		t.Fatalf("after the chain: key %s, %+v", wire.KeyID(id.ControlKey), id.Keys)
	}
	// The same chain again takes nothing, and refuses nothing.
	if taken, err := TakeRotations(dir, held(t, dir), chain, time.Now()); err != nil || len(taken) != 0 {
		t.Fatalf("again: %d taken, %v", len(taken), err)
	}
	// The identity enrolment wrote is untouched: the release before
	// rotations, rolled back to, reads the key it pinned.
	raw, _ := os.ReadFile(filepath.Join(dir, FileName))
	if strings.Contains(string(raw), "format") {
		t.Fatalf("identity.json rewritten: %s", raw)
	}
}

// What a node refuses: a rotation addressed elsewhere, a replay of an
// older sequence by the key in force, a rotation by the key naming
// another recovery key; and after a thief's rotation by a stolen key, the
// recovery key's — numbered below the thief's — is taken, and the thief's
// keys sign nothing the node takes again.
func TestRotationRefusals(t *testing.T) {
	k0, k1, rec := key(t), key(t), key(t)
	t.Run("addressed elsewhere", func(t *testing.T) {
		dir := enrolled(t, k0, rec)
		env, _ := wire.SealRotation(k0, k1, wire.KeyRotation{Node: "n2", Enrolment: "e-1", Seq: 1, By: wire.ByKey, From: wire.KeyID(pub(k0))})
		if _, err := TakeRotations(dir, held(t, dir), [][]byte{env}, time.Now()); err == nil || !strings.Contains(err.Error(), "addressed to node") {
			t.Fatal(err)
		}
		if !held(t, dir).ControlKey.Equal(pub(k0)) {
			t.Fatal("the key changed")
		}
	})
	t.Run("not newer", func(t *testing.T) {
		dir := enrolled(t, k0, rec)
		if _, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, k0, k1, 5, wire.ByKey, k0)}, time.Now()); err != nil {
			t.Fatal(err)
		}
		k2 := key(t)
		if _, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, k1, k2, 5, wire.ByKey, k1)}, time.Now()); err == nil || !strings.Contains(err.Error(), "not newer") {
			t.Fatal(err)
		}
	})
	t.Run("another recovery key, by the control key", func(t *testing.T) {
		dir := enrolled(t, k0, rec)
		env, _ := wire.SealRotation(k0, k1, wire.KeyRotation{Node: "n1", Enrolment: "e-1", Seq: 1, By: wire.ByKey, From: wire.KeyID(pub(k0)),
			Recovery: b64(pub(key(t)))})
		if _, err := TakeRotations(dir, held(t, dir), [][]byte{env}, time.Now()); err == nil || !strings.Contains(err.Error(), "only the recovery key names another") {
			t.Fatal(err)
		}
	})
	t.Run("a theft, then the recovery", func(t *testing.T) {
		dir := enrolled(t, k0, rec)
		thief := key(t)
		if taken, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, k0, thief, 1000, wire.ByKey, k0)}, time.Now()); err != nil || len(taken) != 1 {
			t.Fatal(taken, err)
		}
		k1 := key(t)
		if taken, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, rec, k1, 2, wire.ByRecovery, k0)}, time.Now()); err != nil || len(taken) != 1 {
			t.Fatalf("the recovery: %v %v", taken, err)
		}
		id := held(t, dir)
		if !id.ControlKey.Equal(pub(k1)) || id.Keys.Seq != 2 || id.Keys.RecoverySeq != 2 {
			t.Fatalf("after the recovery: %+v", id.Keys)
		}
		// The thief's key rotates nothing now, whatever it numbers.
		if taken, _ := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, thief, key(t), 3000, wire.ByKey, thief)}, time.Now()); len(taken) != 0 {
			t.Fatal("the thief's key rotated the node after the recovery")
		}
		// The control side's next routine rotation goes on from the
		// recovery's count.
		if taken, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, k1, key(t), 3, wire.ByKey, k1)}, time.Now()); err != nil || len(taken) != 1 {
			t.Fatalf("the next rotation: %v %v", taken, err)
		}
		// A recovery replayed is refused.
		if _, err := TakeRotations(dir, held(t, dir), [][]byte{rotation(t, rec, key(t), 2, wire.ByRecovery, k0)}, time.Now()); err == nil || !strings.Contains(err.Error(), "not newer than the last recovery") {
			t.Fatal(err)
		}
	})
}

// KeysFile: root's alone, as identity.json; a later format refused; one
// left by an earlier enrolment not applied to this one.
func TestControlKeysFile(t *testing.T) {
	k0, k1 := key(t), key(t)
	dir := enrolled(t, k0, nil)
	os.Chmod(filepath.Join(dir, KeysFile), 0o666)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "writable by nobody else") {
		t.Fatalf("a control-keys.json anyone may write: %v", err)
	}
	os.Chmod(filepath.Join(dir, KeysFile), 0o600)
	os.WriteFile(filepath.Join(dir, KeysFile), []byte(`{"format":2,"node":"n1","enrolment":"e-1","control_key":"`+b64(pub(k1))+`"}`), 0o600)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "format v2") {
		t.Fatalf("a later format: %v", err)
	}
	os.WriteFile(filepath.Join(dir, KeysFile), []byte(`{"format":1,"node":"n1","enrolment":"e-0","control_key":"`+b64(pub(k1))+`"}`), 0o600)
	if id := held(t, dir); !id.ControlKey.Equal(pub(k0)) || id.Keys != nil {
		t.Fatal("an earlier enrolment's control keys were applied")
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, KeysFile)); !os.IsNotExist(err) {
		t.Fatal("Remove left the control keys")
	}
}

func b64(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }

// A rotation that cannot be kept (its file not written: a full disk, here
// a directory where its temporary file goes) is no refusal: ErrNotKept,
// the key in force unchanged, and the same chain taken once it can be.
func TestARotationNotKeptIsNoRefusal(t *testing.T) {
	k0, k1, rec := key(t), key(t), key(t)
	dir := enrolled(t, k0, rec)
	chain := [][]byte{rotation(t, k0, k1, 1, wire.ByKey, k0)}
	blocker := filepath.Join(dir, KeysFile+".tmp")
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	id := held(t, dir)
	taken, err := TakeRotations(dir, id, chain, time.Now())
	if !errors.Is(err, ErrNotKept) || len(taken) != 0 {
		t.Fatalf("taken %d: %v; want none, ErrNotKept", len(taken), err)
	}
	if !id.ControlKey.Equal(pub(k0)) || !held(t, dir).ControlKey.Equal(pub(k0)) {
		t.Fatal("the key in force moved though the rotation was not kept")
	}
	os.Remove(blocker)
	if taken, err := TakeRotations(dir, held(t, dir), chain, time.Now()); err != nil || len(taken) != 1 || !held(t, dir).ControlKey.Equal(pub(k1)) {
		t.Fatalf("offered again once it can be kept: taken %d, %v", len(taken), err)
	}
}
