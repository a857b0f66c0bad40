package control_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A node re-enrolled after it joined (it reported its overlay applied) is
// composed what it runs from its new enrolment's first declaration on: its
// assignments were held until it reported the overlay again, so its first
// composition was the overlay alone, and every resource its modules made
// was removed, then made again (a chaos run saw 14 lines removed, then
// applied, on one re-enrolment).
func TestAReEnrolledNodeKeepsWhatItRuns(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	_, id := enrolNode(t, s, "n1")
	if _, err := s.client.Assign(ctx, "n1", []byte(webModule), "web.json"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1's first declaration", func() bool { return lastDecl(t, s, "n1") != nil })
	reportAs(t, id, lastDecl(t, s, "n1").Seq, shapes.Applied, []shapes.Line{overlayLine(shapes.Applied)}, nil)
	want := "mesh.overlay web.root web.index"
	eventually(t, "web after the overlay", func() bool { return strings.Join(keys(lastDecl(t, s, "n1")), " ") == want })

	text, _, err := s.client.IssueToken(ctx, "n1", false, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	g := grantOf(t, s, must(request(t, s, text, newMachine(t).keys, nil)))
	eventually(t, "a declaration of the new enrolment", func() bool {
		d := lastDecl(t, s, "n1")
		return d != nil && d.Enrolment == g.Enrolment
	})
	time.Sleep(500 * time.Millisecond) // what the composer would do, it has done by now
	for _, d := range declsOf(t, s, "n1") {
		if d.Enrolment == g.Enrolment && strings.Join(keys(d), " ") != want {
			t.Fatalf("seq %d of the new enrolment carries %v: what n1 runs was taken away", d.Seq, keys(d))
		}
	}
	if st := status(t, s, "n1"); st.Assignments != "web" {
		t.Fatalf("nodes says %q after the re-enrolment", st.Assignments)
	}
}
