package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// plan shows what a file's content change is: a unified diff of the
// machine's against the declared, for a file replaced or created; sealed
// content never; binary and large content by their sizes; and the report
// itself carries none of it.
func TestPlanShowsContentDiffs(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("conf"), []byte("a\nb\nc\n"), 0o644)
	os.WriteFile(h.p("bin"), []byte{0, 1, 2}, 0o644)
	doc := h.doc(`{"module":"m","id":"conf","type":"file","path":"{root}/conf","content":"a\nB\nc\n"}`,
		`{"module":"m","id":"new","type":"file","path":"{root}/new","content":"hello\n"}`,
		`{"module":"m","id":"bin","type":"file","path":"{root}/bin","bytes":"AAEC/w=="}`)
	diffs := map[string]string{}
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	rep := Apply(t.Context(), st, d, []byte(doc), Options{Source: store.Local, Plan: true, OnDiff: func(m, id, diff string) { diffs[m+"."+id] = diff }})
	want := "--- " + h.p("conf") + " (on the machine)\n+++ " + h.p("conf") + " (declared)\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
	if diffs["m.conf"] != want {
		t.Fatalf("diff\n%q\nwant\n%q", diffs["m.conf"], want)
	}
	if !strings.HasPrefix(diffs["m.new"], "--- /dev/null\n+++ "+h.p("new")+" (declared)\n") || !strings.Contains(diffs["m.new"], "+hello\n") {
		t.Fatalf("%q", diffs["m.new"])
	}
	if diffs["m.bin"] != "(binary content: 3 bytes on the machine, 4 declared)" {
		t.Fatalf("%q", diffs["m.bin"])
	}
	for _, l := range rep.Lines {
		if strings.Contains(l.Detail, "-b") || strings.Contains(l.Detail, "+B") {
			t.Fatalf("a report line carries the diff: %+v", l)
		}
	}
	// A large file: said, not shown; capped lines beyond.
	big := strings.Repeat("x\n", 400)
	if got := contentDiff("/f", []byte(big), true, []byte(strings.Repeat("y\n", 400))); !strings.Contains(got, "more lines of diff") || strings.Count(got, "\n") > maxDiffLines+1 {
		t.Fatalf("not capped: %d lines", strings.Count(got, "\n"))
	}
}
