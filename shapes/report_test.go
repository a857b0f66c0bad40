package shapes

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// An activity names what changed and failed, within its bounds: the lines
// that did nothing are not kept, past MaxActivityLines they are counted,
// and a long detail is cut.
func TestActivityOfNamesWhatChangedWithinItsBounds(t *testing.T) {
	rep := &Report{Seq: 7, Outcome: Repaired}
	rep.Lines = append(rep.Lines, Line{Module: "m", ID: "same", Outcome: Unchanged}, Line{Module: "m", ID: "long", Outcome: Failed, Detail: strings.Repeat("é", MaxActivityDetail)})
	for i := range MaxActivityLines + 3 {
		rep.Lines = append(rep.Lines, Line{Module: "m", ID: fmt.Sprint("f", i), Outcome: Repaired})
	}
	a := ActivityOf(rep, time.Unix(0, 0), "link", "start")
	if a.Changed != MaxActivityLines+3 || a.Failed != 1 || a.Seq != 7 || a.Trigger != "start" || a.Source != "link" {
		t.Fatalf("counts: %+v", a)
	}
	if len(a.Lines) != MaxActivityLines || a.LinesMore != 4 || a.Lines[0].ID != "long" || a.Lines[1].ID != "f0" {
		t.Fatalf("lines: %d, %d more: %+v", len(a.Lines), a.LinesMore, a.Lines)
	}
	if d := a.Lines[0].Detail; len(d) > MaxActivityDetail+len("…") || !utf8.ValidString(d) || !strings.HasSuffix(d, "…") {
		t.Fatalf("detail cut to %d bytes: %q", len(d), d)
	}
}
