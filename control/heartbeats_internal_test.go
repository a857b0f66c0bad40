package control

import (
	"context"
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
