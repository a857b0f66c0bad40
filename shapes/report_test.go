package shapes

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// An apply is named in activities of what changed and failed, within
// their bounds: the lines that did nothing are not kept, each activity
// names MaxActivityLines, as many as name every line up to
// MaxActivityParts, the last counting the rest, and a long detail is cut.
func TestActivitiesOfNameWhatChangedWithinTheirBounds(t *testing.T) {
	most := MaxActivityParts * MaxActivityLines
	for _, n := range []int{0, 1, MaxActivityLines - 1, MaxActivityLines, MaxActivityLines + 3, 40, most, most + 5} {
		rep := &Report{Seq: 7, Outcome: Repaired}
		rep.Lines = append(rep.Lines, Line{Module: "m", ID: "same", Outcome: Unchanged}, Line{Module: "m", ID: "long", Outcome: Failed, Detail: strings.Repeat("é", MaxActivityDetail)})
		for i := range n {
			rep.Lines = append(rep.Lines, Line{Module: "m", ID: fmt.Sprint("f", i), Outcome: Repaired}, Line{Module: "m", ID: fmt.Sprint("k", i), Outcome: Kept})
		}
		acts := ActivitiesOf(rep, time.Unix(0, 0), "link", "start")
		var changed, failed, more int
		var named []string
		for i, a := range acts {
			changed, failed, more = changed+a.Changed, failed+a.Failed, more+a.LinesMore
			for _, l := range a.Lines {
				named = append(named, l.ID)
			}
			if a.Part != i || a.Seq != 7 || a.Trigger != "start" || a.Source != "link" || a.Outcome != Repaired {
				t.Fatalf("%d lines: activity %d: %+v", n, i, a)
			}
			if len(a.Lines) != a.Changed+a.Failed-a.LinesMore || len(a.Lines) > MaxActivityLines || (i < len(acts)-1 && len(a.Lines) != MaxActivityLines) {
				t.Fatalf("%d lines: activity %d names %d, counts %d+%d, %d more", n, i, len(a.Lines), a.Changed, a.Failed, a.LinesMore)
			}
		}
		wantActs := min((n+1+MaxActivityLines-1)/MaxActivityLines, MaxActivityParts)
		if changed != n || failed != 1 || len(acts) != wantActs || len(named) != min(n+1, most) || more != n+1-len(named) || Applies(acts) != 1 {
			t.Fatalf("%d lines: %d activities (want %d), %d changed, %d failed, %d named, %d more", n, len(acts), wantActs, changed, failed, len(named), more)
		}
		// A list that kept only the newest parts (a page of the history)
		// still names one apply; two applies, two.
		if len(acts) > 1 && (Applies(acts[1:]) != 1 || Applies(append(slices.Clone(acts[1:]), acts...)) != 2) {
			t.Fatalf("%d lines: the applies of its last parts: %d; of two: %d", n, Applies(acts[1:]), Applies(append(slices.Clone(acts[1:]), acts...)))
		}
		if named[0] != "long" || (n > 0 && named[1] != "f0") {
			t.Fatalf("%d lines: named %v", n, named)
		}
		if d := acts[0].Lines[0].Detail; len(d) > MaxActivityDetail+len("…") || !utf8.ValidString(d) || !strings.HasSuffix(d, "…") {
			t.Fatalf("detail cut to %d bytes: %q", len(d), d)
		}
	}
	if acts := ActivitiesOf(&Report{Lines: []Line{{Outcome: Unchanged}, {Outcome: Kept}}}, time.Unix(0, 0), "link", "start"); len(acts) != 0 {
		t.Fatalf("an apply that did nothing is named in %d activities", len(acts))
	}
}
