package control_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A read of a node's reports, of every node's heartbeat, leaves no
// consumer on the broker: each read is one consumer, deleted as it ends.
// (Read message by message, each message made a consumer of its own, and
// the last stayed five minutes; declare --wait polls the reports four
// times a second.)
func TestAReadLeavesNoConsumerBehind(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, id := enrolNode(t, s, "n1")
	for seq := uint64(1); seq <= 40; seq++ {
		reportAs(t, id, seq, shapes.Applied, nil, nil)
	}
	heartbeatAs(t, id)
	consumers := func() map[string]int {
		m := map[string]int{}
		for _, name := range []string{link.ReportStream, link.NodeReportPartition("n1").Stream, link.HeartbeatStream} {
			str, err := s.client.JS.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := str.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m[name] = info.State.Consumers
		}
		return m
	}
	before := consumers()
	for range 3 {
		rs, _, err := s.client.Reports(ctx, "n1", 10)
		if err != nil || len(rs) != 10 || rs[9].Seq != 40 {
			t.Fatalf("reports: %d, %v", len(rs), err)
		}
		ns, err := s.client.Nodes(ctx)
		if err != nil || len(ns) != 1 {
			t.Fatalf("nodes: %d, %v", len(ns), err)
		}
	}
	if after := consumers(); !maps.Equal(after, before) {
		t.Fatalf("consumers before the reads %v, after %v: a read left its consumer on the broker", before, after)
	}
}
