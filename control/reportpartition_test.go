package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// A node's reports land in its partition's stream (link.ReportMapping),
// through either layout's door, at a sequence above any the stream of
// reports without the mapping reaches; that stream gets none. Twelve
// nodes, so every partition is reached: link.ReportPartitionOf, the
// control side's reckoning of where a node's reports are, is the
// broker's own partition function.
func TestAReportLandsInItsNodesPartition(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reached := map[int]bool{}
	for i := range 12 {
		name := fmt.Sprintf("node-%d", i)
		_, id := addNode(t, s, name)
		reached[link.ReportPartitionOf(name)] = true
		want := link.NodeReportPartition(name)
		for _, l := range []link.Layout{link.LayoutByKind, link.LayoutByNode} {
			nid := inLayout(id, l)
			nc, err := agent.Dial(nid)
			if err != nil {
				t.Fatal(err)
			}
			m, err := nc.Request(nid.Subjects.Report, []byte(`{"node":"`+name+`"}`), 5*time.Second)
			nc.Close()
			if err != nil {
				t.Fatalf("%s, layout %v: no acknowledgement of its report: %v", name, l, err)
			}
			var ack jetstream.PubAck
			if err := json.Unmarshal(m.Data, &ack); err != nil || ack.Stream != want.Stream || ack.Sequence < link.ReportPartitionFirstSeq {
				t.Fatalf("%s, layout %v: its report was stored in %q at %d (%s), not in %s from %d", name, l, ack.Stream, ack.Sequence, m.Data, want.Stream, uint64(link.ReportPartitionFirstSeq))
			}
		}
		st, err := s.client.JS.Stream(ctx, want.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := st.GetLastMsgForSubject(ctx, want.Subject); err != nil || string(m.Data) != `{"node":"`+name+`"}` {
			t.Fatalf("%s's report is not on %s: %v", name, want.Subject, err)
		}
	}
	if len(reached) != link.ReportPartitions {
		t.Fatalf("twelve nodes reached %d partitions of %d", len(reached), link.ReportPartitions)
	}
	legacy, err := s.client.JS.Stream(ctx, link.ReportStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := legacy.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("%s, the stream of a broker without the mapping, holds %v reports (%v)", link.ReportStream, info.State.Msgs, err)
	}
}
