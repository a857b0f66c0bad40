package control_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A token whose spending the store refuses (a full disk; here the
// registry's stream held to the bytes it has) is refused saying that it
// could not be spent, and is left unused: once the store takes writes the
// same request enrols. It was refused as "used already (a concurrent
// request took it)", which sent the operator after a thief.
func TestATokenTheStoreCannotSpendIsLeftUnused(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx := context.Background()
	text, _, err := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	release := holdStream(t, s, "KV_mesh_nodes")
	r, err := request(t, s, text, m.keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Grant) != 0 || strings.Contains(r.Refused, "used already") || !strings.Contains(r.Refused, "could not be spent") || !strings.Contains(r.Refused, "unused") {
		t.Fatalf("an enrolment the store could not record: %+v", r)
	}
	release()
	grantOf(t, s, must(request(t, s, text, m.keys, nil)))
}

// holdStream holds the stream name to the bytes it has (DiscardNew): the
// next write to it is refused, as on a full disk, until release. A
// command's client makes its streams as they should be when it connects,
// so the hold is for what a client already connected does.
func holdStream(t *testing.T, s *served, name string) (release func()) {
	t.Helper()
	ctx := context.Background()
	stream, err := s.client.JS.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := info.Config
	held.MaxBytes, held.Discard = max(int64(info.State.Bytes), 1), jetstream.DiscardNew
	if _, err := s.client.JS.UpdateStream(ctx, held); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := s.client.JS.UpdateStream(ctx, info.Config); err != nil {
			t.Fatal(err)
		}
	}
}
