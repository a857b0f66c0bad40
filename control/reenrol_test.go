package control_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
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

// In a mesh with no overlay (nothing is composed), a node enrolled again
// — a rekey, a machine enrolled again with its store — is declared what
// it was last declared, addressed to its new enrolment: its executor
// reconciles only a declaration addressed to the enrolment it holds, and
// would otherwise hold the machine to nothing until someone declared to
// it again. One holding sealed content is not: it is sealed to the keys
// the enrolment replaced, and the control side keeps no plaintext.
func TestAReEnrolledNodeIsDeclaredWhatItWasLastDeclared(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	enrolNode(t, s, "n1")
	enrolSealing(t, s, "n2")
	const doc = `{"version":1,"resources":[{"module":"ssh","id":"banner","type":"file","path":"/etc/issue.net","content":"authorised use only\n"}]}`
	seq, err := s.client.Declare(ctx, "n1", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := connect(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer sealer.Close()
	sealer.Seals = map[string][]byte{"app.token": []byte("secret\n")}
	seq2, err := sealer.Declare(ctx, "n2", []byte(sealedDecl))
	if err != nil {
		t.Fatal(err)
	}
	reenrol := func(node string) *wire.Grant {
		t.Helper()
		text, _, err := s.client.IssueToken(ctx, node, false, time.Hour, s.url)
		if err != nil {
			t.Fatal(err)
		}
		return grantOf(t, s, must(request(t, s, text, newMachine(t).keys, nil)))
	}

	g := reenrol("n1")
	var d *shapes.Declaration
	eventually(t, "n1 declared again, to its new enrolment", func() bool {
		d = lastDecl(t, s, "n1")
		return d != nil && d.Enrolment == g.Enrolment
	})
	if d.Seq <= seq || d.Node != "n1" || strings.Join(keys(d), " ") != "ssh.banner" {
		t.Fatalf("n1's declaration after its re-enrolment: seq %d (was %d), node %s, %v", d.Seq, seq, d.Node, keys(d))
	}

	g2 := reenrol("n2")
	time.Sleep(time.Second) // what afterEnrol would do, it has done by now
	if d := lastDecl(t, s, "n2"); d != nil && d.Enrolment == g2.Enrolment {
		t.Fatalf("n2's sealed declaration was declared again to its new keys: seq %d", d.Seq)
	}

	// Not carried, n2 holds nothing the link declared: the node list says
	// so, and says it no more once something is declared to it.
	nothingSince := func() map[string]uint64 {
		t.Helper()
		ns, err := s.client.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, n := range ns {
			got[n.Name] = n.NothingDeclaredSince
		}
		return got
	}
	if got := nothingSince(); got["n1"] != 0 || got["n2"] != seq2 {
		t.Fatalf("nothing declared since: %v, want n2 at seq %d, n1 not", got, seq2)
	}
	out, errs, code := run(t, ctx, "nodes", "--dir", dir, "--nats", s.url)
	if want := fmt.Sprintf("nothing declared to this enrolment (seq %d went to the one before): declare to it again", seq2); code != 0 || !strings.Contains(out, want) || strings.Count(out, "nothing declared") != 1 {
		t.Fatalf("nodes: exit %d, want n2's line to say %q\n%s%s", code, want, out, errs)
	}
	out, errs, code = run(t, ctx, "status", "--dir", dir, "--nats", s.url)
	if flat := strings.Join(strings.Fields(out), " "); code != 0 || !strings.Contains(flat, "nothing declared to its enrolment (declare to it again): 1 n2") {
		t.Fatalf("status: exit %d, want n2 counted as holding nothing declared\n%s%s", code, out, errs)
	}
	if _, err := s.client.Declare(ctx, "n2", []byte(doc)); err != nil {
		t.Fatal(err)
	}
	if got := nothingSince(); got["n2"] != 0 {
		t.Fatalf("declared to again, n2 is still said to hold nothing since seq %d", got["n2"])
	}
}
