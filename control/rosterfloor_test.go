package control_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A node whose executor says it reads roster_min (its profile's accepts)
// is composed the newest roster's sequence as its overlay's floor, so its
// executor never takes an older roster as its first (one with a node
// revoked since still in it); a node that says nothing is written no such
// field, which its executor would refuse whole. A roster published for a
// node joining sends the others no new declaration: the floor is not part
// of what decides whether a composition changed.
func TestTheRosterFloorGoesOnlyToNodesThatReadIt(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	enrolNode(t, s, "old")
	text, _, err := s.client.IssueToken(ctx, "new", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	profile, _ := json.Marshal(map[string]any{"capabilities": []any{}, "accepts": shapes.Accepts})
	grantOf(t, s, must(request(t, s, text, newMachine(t).keys, func(r *wire.EnrolRequest) { r.Profile = profile })))

	var floor uint64
	eventually(t, "new's first declaration, with a floor", func() bool {
		d := lastDecl(t, s, "new")
		if d == nil {
			return false
		}
		floor = d.Resources[0].(*shapes.Overlay).RosterMin
		return floor != 0
	})
	r, err := s.client.LastRoster(ctx)
	if err != nil || r == nil {
		t.Fatal(r, err)
	}
	inRoster := false
	for _, n := range r.Nodes {
		inRoster = inRoster || n.Node == "new"
	}
	if floor > r.Seq || !inRoster {
		t.Fatalf("new's floor %d; the newest roster %d (new in it: %v)", floor, r.Seq, inRoster)
	}
	// A roster without new (a floor below the one it joined in) is not
	// one its executor could take: the floor names new's own roster or a
	// later one.
	for _, d := range declsOf(t, s, "old") {
		if o := overlayIn(t, s, d); o.RosterMin != 0 {
			t.Fatalf("old, whose executor says nothing of roster_min, was sent seq %d with roster_min %d", d.Seq, o.RosterMin)
		}
	}

	before := len(declsOf(t, s, "new"))
	enrolNode(t, s, "third")
	eventually(t, "a roster with third", func() bool {
		r, err := s.client.LastRoster(ctx)
		return err == nil && r != nil && len(r.Nodes) == 3
	})
	time.Sleep(500 * time.Millisecond) // what the composer would do, it has done by now
	if after := len(declsOf(t, s, "new")); after != before {
		t.Fatalf("a node joining sent new %d more declaration(s): the floor decided a composition changed", after-before)
	}
}

// A node's first composition after its enrolment made its queue afresh
// is published once: not again when the composer's landed in the new
// queue (a second, the same declaration, sent on a busy control side),
// again when the one published went with the old queue.
func TestTheFirstCompositionIsInTheQueueOnce(t *testing.T) {
	s, ctx := serveOverlay(t, 60*time.Second)
	enrolNode(t, s, "one")
	eventually(t, "one's first declaration", func() bool { return lastDecl(t, s, "one") != nil })
	n := len(declsOf(t, s, "one"))
	p, err := s.client.PublishFirst(ctx, "one")
	if err != nil || p.Sent || len(declsOf(t, s, "one")) != n {
		t.Fatalf("published again though the queue holds it: %+v %v (%d declarations, %d before)", p, err, len(declsOf(t, s, "one")), n)
	}
	stream, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(link.SubjectsOf("one").Decl)); err != nil {
		t.Fatal(err)
	}
	if p, err = s.client.PublishFirst(ctx, "one"); err != nil || !p.Sent || lastDecl(t, s, "one") == nil {
		t.Fatalf("not published again into the emptied queue: %+v %v", p, err)
	}
}
