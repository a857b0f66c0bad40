package shapes

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// jsonStringSeeds are the strings encoding/json treats specially.
var jsonStringSeeds = []string{"", "plain", `quote " backslash \ slash /`, "\b\f\n\r\t\x00\x01\x1f\x7f",
	"<script>&amp;</script>", "é ☃ 😀", "\u2028\u2029", "bad \xff utf8 \xc3", "\xed\xa0\x80 surrogate", "mesh-agent.service"}

// AppendJSONString writes every string byte for byte as encoding/json does.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStringSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: AppendJSONString %s, encoding/json %s", s, got, want)
		}
	})
}

// The report written by hand is encoding/json's, for reports of every
// kind: empty, refused, with a briefing, with lines of every outcome and
// awkward strings. A field added to Report or Line that the hand-written
// encoder does not know fails here first.
func TestReportJSONIsEncodingJSONs(t *testing.T) {
	for typ, fields := range map[reflect.Type]int{reflect.TypeOf(Report{}): 7, reflect.TypeOf(Line{}): 5} {
		written := 0 // what encoding/json writes: not a field marked "-"
		for i := range typ.NumField() {
			if typ.Field(i).Tag.Get("json") != "-" {
				written++
			}
		}
		if written != fields {
			t.Fatalf("%s has %d fields encoding/json writes; Report.AppendJSON and Line.AppendJSON write %d: teach them the new one", typ, written, fields)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string {
		if rng.IntN(3) == 0 {
			return ""
		}
		return jsonStringSeeds[rng.IntN(len(jsonStringSeeds))]
	}
	reports := []*Report{
		{},
		{Outcome: Refused, Refused: "executor: <no> & \"never\""},
		{Outcome: Unchanged, Lines: []Line{}},
		{Outcome: Applied, Source: "link", Seq: 1 << 62, Upgraded: "1.2.3",
			Briefing: &Briefing{Outcome: MarkOK, Node: "n", Seq: 3, At: time.Unix(1700000000, 5).UTC(), Findings: []Finding{{Mark: MarkKept, Module: "m", ID: "i", Type: "file", Detail: "<d>"}}}},
	}
	for i := 0; i < 200; i++ {
		r := &Report{Outcome: Outcome(pick()), Source: pick(), Seq: uint64(rng.IntN(3)), Refused: pick(), Upgraded: pick()}
		for j := rng.IntN(5); j > 0; j-- {
			r.Lines = append(r.Lines, Line{Module: pick(), ID: pick(), Type: pick(), Outcome: Outcome(pick()), Detail: pick()})
		}
		reports = append(reports, r)
	}
	for _, r := range reports {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("report %+v:\nAppendJSON   %s\nencoding/json %s", r, got, want)
		}
	}
}
