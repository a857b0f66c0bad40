package control

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A report is counted in the metrics when it is acknowledged, recorded,
// not when its registry write is held for the group's batch: a group
// whose writes all fail is given back uncounted, and counted once when it
// comes again and is written.
func TestAReportIsCountedOnceRecorded(t *testing.T) {
	_, k, s := embeddedBroker(t)
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := embeddedClient(ctx, t, k, s)
	if !c.batched {
		t.Fatal("the embedded broker takes no atomic batch")
	}
	cfg, _, err := c.AddNode(ctx, "n1", s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	id, err := cfg.Identity()
	if err != nil {
		t.Fatal(err)
	}
	// Published here, signed by the node's key: the recorder judges the
	// signature, not the connection.
	nc := c.NC
	const n = batchLeast + 8 // a group written as one batch
	for i := range n {
		data, _ := json.Marshal(&link.Report{Node: "n1", Enrolment: id.Enrolment, Seq: uint64(i + 1), Trigger: link.TriggerDeclaration,
			Outcome: shapes.Applied, At: time.Now(), Lines: []shapes.Line{}, Owned: []wire.OwnedEntry{}})
		sig, err := id.Sign(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: link.SubjectsOf("n1").Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	cons, err := c.JS.CreateOrUpdateConsumer(ctx, link.NodeReportPartition("n1").Stream, jetstream.ConsumerConfig{Durable: "count-test", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for len(msgs) < n && ctx.Err() == nil {
		b, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			msgs = append(msgs, m)
		}
	}
	keys, err := c.watchKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.metrics = newMetrics()
	counted := func() float64 {
		var m dto.Metric
		if err := c.metrics.reports.WithLabelValues(string(shapes.Applied), link.TriggerDeclaration).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	w := &recorder{c: c, keys: keys, kind: "report", last: map[string]uint64{}, kept: map[string]kept{}}

	// The registry refusing every write as the group's batch is made (no
	// message fits), and the recorder stopped while it tries them one by
	// one: nothing written.
	kv, err := c.JS.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		t.Fatal(err)
	}
	was := kv.CachedInfo().Config
	failing, stop := context.WithCancel(ctx)
	batchHook = func([]*nats.Msg) {
		small := was
		small.MaxMsgSize = 16
		if _, err := c.JS.UpdateStream(ctx, small); err != nil {
			t.Error(err)
		}
		stop()
	}
	w.recordGroup(failing, msgs)
	batchHook = nil
	if _, err := c.JS.UpdateStream(ctx, was); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV.Get(ctx, "report.n1"); err == nil {
		t.Fatal("a report was written")
	}
	if got := counted(); got != 0 {
		t.Fatalf("%v reports counted, none written", got)
	}
	// They come again, and are written.
	w.recordGroup(ctx, msgs)
	if got := counted(); got != n {
		t.Fatalf("%v reports counted, want %d", got, n)
	}
	e, err := c.KV.Get(ctx, "report.n1")
	if err != nil {
		t.Fatal(err)
	}
	var r link.Report
	if json.Unmarshal(e.Value(), &r); r.Seq != n {
		t.Fatalf("the report recorded is %d, want %d", r.Seq, n)
	}
}
