package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Heartbeats are not a registry write each: a node's fifty heartbeats
// leave the registry's stream as it was, and `nodes` shows the last of them
// (read from the heartbeat stream); one forged heartbeat after them is not
// shown; one that carries a profile is kept as the node's profile. Many
// nodes' reports are recorded with several in flight, each node's last one
// last.
func TestRecorderHeartbeatsAndReports(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, a := addNode(t, s, "alpha")
	_, b := addNode(t, s, "beta")
	nc, err := agent.Dial(a)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	send := func(id *agent.Identity, nc *nats.Conn, subj string, v any) {
		t.Helper()
		data, _ := json.Marshal(v)
		sig, err := id.Sign(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: subj, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
	}
	kvStream := func() uint64 {
		str, err := s.client.JS.Stream(ctx, "KV_mesh_nodes")
		if err != nil {
			t.Fatal(err)
		}
		return str.CachedInfo().State.LastSeq
	}
	before := kvStream()
	start := time.Now().UTC().Truncate(time.Second)
	var last time.Time
	for i := range 50 {
		last = start.Add(time.Duration(i) * time.Millisecond)
		send(a, nc, a.Subjects.Heartbeat, &link.Heartbeat{Node: "alpha", Enrolment: a.Enrolment, At: last, Interval: 30, State: link.StateEnrolled, AgentVersion: fmt.Sprint(i)})
	}
	nc.Flush()
	waitHeartbeat := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ns, err := s.client.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if n.Name == "alpha" && n.Heartbeat != nil && n.Heartbeat.AgentVersion == want {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("nodes does not show alpha's heartbeat %q: %+v", want, ns)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitHeartbeat("49")
	time.Sleep(500 * time.Millisecond) // the recorder has had them
	if after := kvStream(); after != before {
		t.Fatalf("the registry was written %d times for 50 heartbeats without a profile", after-before)
	}
	// A forged one (beta's key signing alpha's heartbeat): not shown.
	send(b, nc, a.Subjects.Heartbeat, &link.Heartbeat{Node: "alpha", Enrolment: a.Enrolment, At: last.Add(time.Second), Interval: 30, State: link.StateEnrolled, AgentVersion: "forged"})
	nc.Flush()
	time.Sleep(300 * time.Millisecond)
	if ns, _ := s.client.Nodes(ctx); ns[0].Heartbeat != nil && ns[0].Heartbeat.AgentVersion == "forged" {
		t.Fatal("nodes shows a heartbeat not signed by the node")
	}
	// With a profile: kept.
	send(a, nc, a.Subjects.Heartbeat, &link.Heartbeat{Node: "alpha", Enrolment: a.Enrolment, At: last.Add(2 * time.Second), Interval: 30, State: link.StateEnrolled,
		AgentVersion: "p", Profile: json.RawMessage(`{"os":"testos"}`)})
	nc.Flush()
	waitHeartbeat("p")
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := s.client.KV.Get(ctx, "profile.alpha")
		if err == nil && json.Valid(e.Value()) && string(e.Value()) != "" {
			var kept struct {
				Profile json.RawMessage `json:"profile"`
			}
			json.Unmarshal(e.Value(), &kept)
			if string(kept.Profile) == `{"os":"testos"}` {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the profile a heartbeat carried is not kept: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Reports: 200 from each of two nodes, interleaved; each node's last
	// is the one recorded.
	ncb, err := agent.Dial(b)
	if err != nil {
		t.Fatal(err)
	}
	defer ncb.Close()
	for i := 1; i <= 200; i++ {
		send(a, nc, a.Subjects.Report, &link.Report{Node: "alpha", Enrolment: a.Enrolment, Seq: uint64(i), Trigger: link.TriggerDeclaration, Outcome: "applied", At: time.Now()})
		send(b, ncb, b.Subjects.Report, &link.Report{Node: "beta", Enrolment: b.Enrolment, Seq: uint64(i), Trigger: link.TriggerDeclaration, Outcome: "applied", At: time.Now()})
	}
	nc.Flush()
	ncb.Flush()
	for _, n := range []string{"alpha", "beta"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var r link.Report
			e, err := s.client.KV.Get(ctx, "report."+n)
			if err == nil && json.Unmarshal(e.Value(), &r) == nil && r.Seq == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's last report recorded is %d, want 200 (%v)", n, r.Seq, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond)
	for _, n := range []string{"alpha", "beta"} {
		var r link.Report
		e, _ := s.client.KV.Get(ctx, "report."+n)
		if json.Unmarshal(e.Value(), &r); r.Seq != 200 {
			t.Fatalf("%s's report went back to %d after 200", n, r.Seq)
		}
	}
}

// Two serve processes record one node's reports, whichever takes each: the
// slower writing an older report after a newer one leaves the newer as the
// node's last, in either order. Older is the report's place in the
// stream, not its sequence: a refusal carries whatever sequence it was
// sent (a forged 1003), and the next apply's report still comes after it.
func TestLastReportNeverGoesBack(t *testing.T) {
	s, ctx, one, two := twoLanes(t)
	last := func() (uint64, shapes.Outcome) {
		e, err := s.client.KV.Get(ctx, "report.n")
		if err != nil {
			t.Fatal(err)
		}
		var r link.Report
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			t.Fatalf("%v: %s", err, e.Value())
		}
		return r.Seq, r.Outcome
	}
	for i, step := range []struct {
		lane     *control.Lane
		recorded uint64
		seq      uint64
		outcome  shapes.Outcome
		want     uint64
		wantOut  shapes.Outcome
	}{
		{one, 10, 4, shapes.Applied, 4, shapes.Applied},
		{two, 12, 6, shapes.Applied, 6, shapes.Applied},       // the other process, newer
		{one, 11, 5, shapes.Failed, 6, shapes.Applied},        // the slower one, older: dropped
		{two, 11, 5, shapes.Failed, 6, shapes.Applied},        // and by the lane that wrote 6
		{two, 13, 6, shapes.Unchanged, 6, shapes.Unchanged},   // the same sequence, said later
		{one, 14, 1003, shapes.Refused, 1003, shapes.Refused}, // a refusal, of whatever it was sent
		{two, 15, 7, shapes.Applied, 7, shapes.Applied},       // the next apply comes after it
		{one, 14, 1003, shapes.Refused, 7, shapes.Applied},    // redelivered: older
	} {
		b, _ := json.Marshal(&link.Report{Node: "n", Seq: step.seq, Outcome: step.outcome, Lines: []shapes.Line{}})
		if err := step.lane.PutReport(ctx, "n", b, step.recorded); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if seq, out := last(); seq != step.want || out != step.wantOut {
			t.Fatalf("step %d: the last report is seq %d %s, want seq %d %s", i, seq, out, step.want, step.wantOut)
		}
	}
}

// What a node owns is kept from its last report that says it (an
// apply's) — that report alone, one write — and outlasts a report that
// says nothing of it (a refusal's), whichever of two serve processes
// records which, in the order the node sent them.
func TestWhatANodeOwnsOutlastsARefusal(t *testing.T) {
	s, ctx, one, two := twoLanes(t)
	apply := func(seq uint64, targets ...string) []byte {
		owned := []wire.OwnedEntry{}
		for _, tg := range targets {
			owned = append(owned, wire.OwnedEntry{Target: tg, Type: "file", Module: "m", ID: tg})
		}
		b, _ := json.Marshal(&link.Report{Node: "n", Seq: seq, Outcome: shapes.Applied, Lines: []shapes.Line{}, Owned: owned})
		return b
	}
	refusal := func(seq uint64) []byte {
		b, _ := json.Marshal(&link.Report{Node: "n", Seq: seq, Outcome: shapes.Refused, Lines: []shapes.Line{}})
		return b
	}
	for i, step := range []struct {
		lane     *control.Lane
		report   []byte
		recorded uint64
		want     string // the targets kept, "-" for none
		from     uint64 // the report they were kept from
		apart    bool   // owned.n written
	}{
		{one, refusal(1), 9, "-", 0, false},
		{one, apply(2, "path:/a"), 10, "path:/a", 10, false},
		{two, refusal(3), 11, "path:/a", 10, true},
		{one, apply(4, "path:/a", "path:/b"), 12, "path:/a path:/b", 12, true},
		{two, refusal(3), 11, "path:/a path:/b", 12, true}, // redelivered: older
		{two, refusal(5), 13, "path:/a path:/b", 12, true},
		{one, refusal(6), 14, "path:/a path:/b", 12, true},
		{two, apply(7), 15, "", 15, true}, // owns nothing now
		{one, refusal(8), 16, "", 15, true},
	} {
		if err := step.lane.Report(ctx, "n", step.report, step.recorded); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		targets, from, ok := s.client.LastOwned(ctx, "n")
		got := strings.Join(targets, " ")
		if !ok {
			got = "-"
		}
		if got != step.want || from != step.from {
			t.Fatalf("step %d: kept %q from the report at %d, want %q from %d", i, got, from, step.want, step.from)
		}
		if _, err := s.client.KV.Get(ctx, "owned.n"); (err == nil) != step.apart {
			t.Fatalf("step %d: owned.n written: %v, want %v", i, err == nil, step.apart)
		}
	}
}

// twoLanes is a serve and two recorder lanes, one of its client's and
// one of a second client's, as two serve processes record.
func twoLanes(t *testing.T) (*served, context.Context, *control.Lane, *control.Lane) {
	t.Helper()
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c2, err := connect(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	return s, ctx, s.client.Lane(), c2.Lane()
}

// A lane records a group of reports with their registry writes made as one
// batch, and what it keeps is what it keeps report by report: the newest of
// a node's reports in the group, what a node owns kept apart before a
// refusal in the same group replaces its report, and — when another lane
// wrote a key since (the batch refused) — each write made again alone,
// the newer report of the two lanes kept.
func TestALaneRecordsAGroupAsOneBatch(t *testing.T) {
	s, ctx, one, two := twoLanes(t)
	report := func(node string, seq uint64, outcome shapes.Outcome, targets ...string) []byte {
		var owned []wire.OwnedEntry
		if outcome == shapes.Applied {
			owned = []wire.OwnedEntry{}
			for _, tg := range targets {
				owned = append(owned, wire.OwnedEntry{Target: tg, Type: "file", Module: "m", ID: tg})
			}
		}
		b, _ := json.Marshal(&link.Report{Node: node, Seq: seq, Outcome: outcome, Lines: []shapes.Line{}, Owned: owned})
		return b
	}
	var batches [][]string
	control.OnBatch(func(subjects []string) { batches = append(batches, subjects) })
	defer control.OnBatch(nil)
	recorded := func(node string) uint64 {
		t.Helper()
		e, err := s.client.KV.Get(ctx, "report."+node)
		if err != nil {
			t.Fatalf("report.%s: %v", node, err)
		}
		var r struct {
			Recorded uint64 `json:"recorded_seq"`
		}
		json.Unmarshal(e.Value(), &r)
		return r.Recorded
	}
	group := func(lane *control.Lane, reports ...control.LaneReport) {
		t.Helper()
		for i, err := range lane.Group(ctx, reports) {
			if err != nil {
				t.Fatalf("report %d: %v", i, err)
			}
		}
	}

	// Three nodes, one twice: one batch of three writes, the newest of a's.
	group(one,
		control.LaneReport{Node: "a", Data: report("a", 1, shapes.Applied, "path:/a1"), Recorded: 10},
		control.LaneReport{Node: "b", Data: report("b", 1, shapes.Applied, "path:/b"), Recorded: 11},
		control.LaneReport{Node: "a", Data: report("a", 2, shapes.Applied, "path:/a2"), Recorded: 12},
		control.LaneReport{Node: "c", Data: report("c", 1, shapes.Applied, "path:/c"), Recorded: 13},
	)
	if len(batches) != 1 || len(batches[0]) != 3 {
		t.Fatalf("batches %v, want one of three writes", batches)
	}
	if got := recorded("a"); got != 12 {
		t.Fatalf("a's report recorded at %d, want 12", got)
	}

	// An apply then a refusal of b's in one group: what b owns is kept
	// apart from the apply, the refusal its last report — owned.b written
	// before the report that drops it, not held for a later batch.
	batches = nil
	group(one,
		control.LaneReport{Node: "b", Data: report("b", 2, shapes.Applied, "path:/b2"), Recorded: 20},
		control.LaneReport{Node: "b", Data: report("b", 3, shapes.Refused), Recorded: 21},
	)
	if got := recorded("b"); got != 21 {
		t.Fatalf("b's report recorded at %d, want 21", got)
	}
	if targets, from, ok := s.client.LastOwned(ctx, "b"); !ok || strings.Join(targets, " ") != "path:/b2" || from != 20 {
		t.Fatalf("b owns %v from %d (%v), want path:/b2 from 20", targets, from, ok)
	}
	for _, b := range batches {
		if slices.Contains(b, "$KV."+control.Bucket+".owned.b") {
			t.Fatalf("owned.b held for a batch after the refusal's report: %v", batches)
		}
	}

	// The other lane writes a newer report of c, then this lane a group
	// with an older one of c and a new one of d: the batch is refused
	// (c's revision moved), each write is made alone, c keeps the newer.
	group(two, control.LaneReport{Node: "c", Data: report("c", 5, shapes.Applied, "path:/c5"), Recorded: 30})
	batches = nil
	group(one,
		control.LaneReport{Node: "c", Data: report("c", 4, shapes.Applied, "path:/c4"), Recorded: 29},
		control.LaneReport{Node: "d", Data: report("d", 1, shapes.Applied, "path:/d"), Recorded: 31},
	)
	if len(batches) != 1 {
		t.Fatalf("batches %v, want one (refused)", batches)
	}
	if got := recorded("c"); got != 30 {
		t.Fatalf("c's report recorded at %d, want the other lane's newer 30", got)
	}
	if got := recorded("d"); got != 31 {
		t.Fatalf("d's report recorded at %d, want 31", got)
	}
}
