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
	stream, err := s.client.JS.Stream(ctx, "KV_mesh_nodes")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := info.Config
	held.MaxBytes, held.Discard = int64(info.State.Bytes), jetstream.DiscardNew
	if _, err := s.client.JS.UpdateStream(ctx, held); err != nil {
		t.Fatal(err)
	}
	r, err := request(t, s, text, m.keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Grant) != 0 || strings.Contains(r.Refused, "used already") || !strings.Contains(r.Refused, "could not be spent") || !strings.Contains(r.Refused, "unused") {
		t.Fatalf("an enrolment the store could not record: %+v", r)
	}
	if _, err := s.client.JS.UpdateStream(ctx, info.Config); err != nil {
		t.Fatal(err)
	}
	grantOf(t, s, must(request(t, s, text, m.keys, nil)))
}
