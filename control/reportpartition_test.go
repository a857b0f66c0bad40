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
	"github.com/nox-mesh/nox-mesh-host/shapes"
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

// A broker configured before the partitions keeps a node's reports in
// MESH_REPORT; given the mapping, it puts the next in the node's
// partition, numbered from 2^40, so the registry takes it for the newer
// one; and Reports lists the node's reports of both streams, in order.
// A report back in MESH_REPORT after that (the mapping lost) is older by
// sequence and not recorded over the partition's. The mapping is taken
// away and given back on the running broker, as a reload of its
// configuration would.
func TestAReportCarriesOverToItsPartition(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, id := enrolNode(t, s, "n1")
	ctl, err := s.srv.NATS().LookupAccount(link.AccountControl)
	if err != nil {
		t.Fatal(err)
	}
	recorded := func(seq uint64) {
		t.Helper()
		eventually(t, fmt.Sprintf("report seq %d recorded", seq), func() bool {
			e, err := s.client.KV.Get(ctx, "report.n1")
			var r link.Report
			return err == nil && json.Unmarshal(e.Value(), &r) == nil && r.Seq == seq
		})
	}
	if !ctl.RemoveMapping(link.ReportMapping.From) {
		t.Fatal("CONTROL has no mapping of the reports")
	}
	reportAs(t, id, 1, shapes.Applied, nil, nil)
	recorded(1)
	if err := ctl.AddMapping(link.ReportMapping.From, link.ReportMapping.To); err != nil {
		t.Fatal(err)
	}
	reportAs(t, id, 2, shapes.Applied, nil, nil)
	recorded(2)
	rs, _, err := s.client.Reports(ctx, "n1", 10)
	if err != nil || len(rs) != 2 || rs[0].Seq != 1 || rs[1].Seq != 2 || rs[0].StreamSeq >= link.ReportPartitionFirstSeq || rs[1].StreamSeq < link.ReportPartitionFirstSeq {
		t.Fatalf("the node's reports, both streams: %v (%+v)", err, rs)
	}
	// The mapping lost again: the report lands in MESH_REPORT, and the
	// registry keeps the partition's.
	ctl.RemoveMapping(link.ReportMapping.From)
	reportAs(t, id, 3, shapes.Applied, nil, nil)
	legacy, err := s.client.JS.Stream(ctx, link.ReportStream)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the third report in "+link.ReportStream+", taken by the recorder", func() bool {
		info, err := legacy.Info(ctx)
		if err != nil || info.State.Msgs != 2 {
			return false
		}
		cons, err := legacy.Consumer(ctx, "control-recorder") // serve's recorder (recorderConsumer)
		if err != nil {
			return false
		}
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream == info.State.LastSeq
	})
	recorded(2)
}
