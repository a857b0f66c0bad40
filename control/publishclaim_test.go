package control_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// A publish that finds another process publishing exactly its composition
// (serve's publisher, told of the same assignment) waits for that one to
// land and says its sequence: assign --wait waits on it. It said "being
// published" with no sequence, and assign --wait then waited for nothing
// until its time ran out.
func TestAPublishOvertakenSaysTheOthersSequence(t *testing.T) {
	s, ctx := serveOverlay(t, 60*time.Second)
	enrolNode(t, s, "n1")
	// serve publishes the enrolment's first composition on its own: after
	// it, nothing else publishes for n1 here.
	eventually(t, "n1's first composition", func() bool {
		e, err := s.client.KV.Get(ctx, "composed.n1")
		var rec struct {
			Seq uint64 `json:"seq"`
		}
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Seq > 0
	})
	comp, err := s.client.Compose(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	record := func(seq uint64) []byte {
		b, _ := json.Marshal(map[string]any{"enrolment": comp.Enrolment, "digest": comp.Digest, "seq": seq, "claimed": time.Now().UTC()})
		return b
	}
	// Another's claim, then its sequence a moment later.
	if _, err := s.client.KV.Put(ctx, "composed.n1", record(0)); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		s.client.KV.Put(context.Background(), "composed.n1", record(4242))
	}()
	p, err := s.client.Publish(ctx, "n1", false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Sent || p.Seq != 4242 {
		t.Fatalf("published %+v: want the other's sequence, 4242, and not sent", p)
	}
}
