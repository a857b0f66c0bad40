package control

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nox-mesh/nox-mesh-host/link"
)

// The heartbeat stream alone is kept without an fsync before each
// acknowledgement (async persist mode, at one copy); a stream made before
// in the synced mode is made anew in it only once the recorder has read
// every heartbeat in it, and one already as wanted is left alone.
func TestHeartbeatsAreKeptWithoutAnFsyncOfTheirOwn(t *testing.T) {
	_, k, s := embeddedBroker(t)
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func() *Client { return embeddedClient(ctx, t, k, s) }
	info := func(c *Client, name string) *jetstream.StreamInfo {
		t.Helper()
		st, err := c.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo()
	}
	c := connect()
	names := []string{link.DeclStream, link.RosterStream, "KV_" + Bucket}
	for _, p := range link.ReportPlaces() {
		names = append(names, p.Stream)
	}
	for _, name := range names {
		if pm := info(c, name).Config.PersistMode; pm != jetstream.DefaultPersistMode {
			t.Errorf("%s is kept %s: every write but a heartbeat is synced before it is acknowledged", name, pm)
		}
	}
	hb := info(c, link.HeartbeatStream)
	if hb.Config.PersistMode != jetstream.AsyncPersistMode {
		t.Fatalf("the heartbeat stream is kept %s, want async", hb.Config.PersistMode)
	}

	// A stream of an earlier release: synced, and holding a heartbeat the
	// recorder has not read.
	if err := c.JS.DeleteStream(ctx, link.HeartbeatStream); err != nil {
		t.Fatal(err)
	}
	old := hb.Config
	old.PersistMode, old.Metadata = jetstream.DefaultPersistMode, nil
	st, err := c.JS.CreateStream(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: recorderConsumer, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.JS.Publish(ctx, "mesh.heartbeat.n1", []byte(`{"node":"n1","profile":{}}`)); err != nil {
		t.Fatal(err)
	}
	c = connect()
	if pm := info(c, link.HeartbeatStream).Config.PersistMode; pm != jetstream.DefaultPersistMode {
		t.Fatalf("the heartbeat stream was made anew (%s) with a heartbeat the recorder had not read", pm)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c = connect()
	now := info(c, link.HeartbeatStream)
	if now.Config.PersistMode != jetstream.AsyncPersistMode {
		t.Fatalf("the heartbeat stream, read whole by the recorder, is still kept %s", now.Config.PersistMode)
	}
	c = connect()
	if again := info(c, link.HeartbeatStream); !again.Created.Equal(now.Created) {
		t.Errorf("a heartbeat stream as wanted was made anew (created %v, then %v)", now.Created, again.Created)
	}
}

// A power cut that spoils the recorder's consumer state on disk (the
// heartbeats' stream, and so its consumers' state, are written without an
// fsync; the cut left the state a file of zeros, which the server then
// will neither load nor make again: "corrupt state file") does not keep
// the recorder from the heartbeats once serve starts again: the consumer
// is made in memory. Kept on disk otherwise.
func TestTheHeartbeatRecorderSurvivesItsStateLostInAPowerCut(t *testing.T) {
	_, k, s := embeddedBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := embeddedClient(ctx, t, k, s)
	cons, err := c.recorderConsumer(ctx, link.HeartbeatStream, "mesh.heartbeat.*")
	if err != nil {
		t.Fatal(err)
	}
	if cons.CachedInfo().Config.MemoryStorage {
		t.Error("the recorder's consumer is kept in memory on a sound store")
	}
	if _, err := c.JS.Publish(ctx, "mesh.heartbeat.n1", []byte(`{"node":"n1"}`)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Shutdown()
	state := filepath.Join(k.Dir, "jetstream", "jetstream", link.AccountControl, "streams", link.HeartbeatStream, "obs", recorderConsumer, "o.dat")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatalf("the consumer's state on disk: %v", err)
	}
	if err := os.WriteFile(state, make([]byte, len(b)), 0o600); err != nil {
		t.Fatal(err)
	}

	if s, err = StartServer(k, "127.0.0.1:0", slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	c = embeddedClient(ctx, t, k, s)
	cons, err = c.recorderConsumer(ctx, link.HeartbeatStream, "mesh.heartbeat.*")
	if err != nil {
		t.Fatalf("the recorder's consumer after its state was lost: %v", err)
	}
	if !cons.CachedInfo().Config.MemoryStorage {
		t.Error("the recorder's consumer whose state on disk is spoilt is not kept in memory")
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range msgs.Messages() {
		got++
		if m.Subject() != "mesh.heartbeat.n1" {
			t.Errorf("read %s", m.Subject())
		}
	}
	if got != 1 {
		t.Fatalf("the recorder read %d heartbeats after the power cut, want n1's newest", got)
	}
}
