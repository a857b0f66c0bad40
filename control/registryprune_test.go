package control_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/control"
)

// A key deleted from the registry leaves a marker, the key's last message,
// for as long as the registry lives; PruneRegistry removes those older than
// it is told, and leaves the keys that hold values alone.
func TestTheRegistrysDeleteMarkersGo(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := s.client.KV
	for _, k := range []string{"token.gone", "token.kept"} {
		if _, err := kv.Put(ctx, k, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Purge(ctx, "token.gone"); err != nil {
		t.Fatal(err)
	}
	messagesOf := func(key string) uint64 {
		t.Helper()
		str, err := s.client.JS.Stream(ctx, "KV_"+control.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		subj := "$KV." + control.Bucket + "." + key
		info, err := str.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subj]
	}
	if n := messagesOf("token.gone"); n != 1 {
		t.Fatalf("the purged key has %d messages, want its marker", n)
	}
	if err := s.client.PruneRegistry(ctx, time.Hour); err != nil || messagesOf("token.gone") != 1 {
		t.Fatalf("a marker younger than asked went (or %v)", err)
	}
	if err := s.client.PruneRegistry(ctx, -1); err != nil || messagesOf("token.gone") != 0 {
		t.Fatalf("the marker is still there (or %v)", err)
	}
	if e, err := kv.Get(ctx, "token.kept"); err != nil || string(e.Value()) != `{}` || messagesOf("token.kept") != 1 {
		t.Fatalf("a live key was touched: %v", err)
	}
}

// A watch of the registry leaves the keys it was given as they were, so
// that the same keys watched again (a listing made again while the
// registry did not answer) are the registry's keys, not refused as
// invalid: nats.go writes the bucket's prefix into the slice it is given.
func TestARegistryWatchLeavesItsKeysAlone(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{"node.*", "token.*"}
	for i := range 2 {
		w, err := s.client.KV.WatchFiltered(ctx, keys)
		if err != nil {
			t.Fatalf("watch %d of %v: %v", i+1, keys, err)
		}
		w.Stop()
		if keys[0] != "node.*" || keys[1] != "token.*" {
			t.Fatalf("watch %d left its keys as %v", i+1, keys)
		}
	}
}

// A key written again after its delete marker was read keeps its value
// when the marker goes: the prune removes the marker and what came before
// it, never what came after (a node enrolled again under a deleted node's
// name, an overlay address claimed again, between the prune's reading and
// its removing).
func TestAKeyWrittenAgainOutlivesItsOldMarker(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := s.client.KV
	for _, k := range []string{"token.again", "token.gone"} {
		if _, err := kv.Put(ctx, k, []byte(`{"old":true}`)); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	err := s.client.PruneRegistryWith(ctx, -1, func() {
		if _, err := kv.Create(ctx, "token.again", []byte(`{"new":true}`)); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "token.again"); err != nil || string(e.Value()) != `{"new":true}` {
		t.Fatalf("the key written again after its marker was read: %v", err)
	}
	if _, err := kv.Get(ctx, "token.gone"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the key deleted and not written again: %v", err)
	}
}
