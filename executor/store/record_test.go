package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// randomize sets every field reachable from v to its zero value or to a
// random one (strings with the characters JSON escapes), so both sides of
// every omitempty are tried. A kind it does not know fails the test: teach
// it, and the hand-written encoder.
func randomize(t *testing.T, rng *rand.Rand, v reflect.Value) {
	t.Helper()
	if rng.IntN(4) == 0 {
		v.SetZero()
		return
	}
	words := []string{"", "path:/etc/motd", "a\"b\\c", "<&>", "\u2028", "é\n\t", "\xff"}
	switch v.Kind() {
	case reflect.String:
		v.SetString(words[rng.IntN(len(words))])
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		v.SetUint(rng.Uint64() >> rng.IntN(64) & (1<<uint(v.Type().Bits()) - 1))
	case reflect.Int:
		v.SetInt(int64(rng.IntN(5)))
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		randomize(t, rng, v.Elem())
	case reflect.Slice:
		n := rng.IntN(3)
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			randomize(t, rng, v.Index(i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			randomize(t, rng, v.Field(i))
		}
	default:
		t.Fatalf("randomize: a field of kind %s: teach the journal's encoder and this test about it", v.Kind())
	}
}

// The journal's hand-written records are encoding/json's, byte for byte,
// over thousands of random records, and read back the same.
func TestRecordJSONIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 5000; i++ {
		var r record
		randomize(t, rng, reflect.ValueOf(&r).Elem())
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got := appendRecordJSON(nil, &r)
		if !bytes.Equal(got, want) {
			t.Fatalf("record %+v:\nhand-written  %s\nencoding/json %s", r, got, want)
		}
	}
}

// The report summary written by hand is encoding/json's too.
func TestSummaryJSONIsEncodingJSONs(t *testing.T) {
	if n := reflect.TypeOf(ReportSummary{}).NumField(); n != 4 {
		t.Fatalf("ReportSummary has %d fields; jsonSummary writes 4: teach it the new one", n)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	outcomes := []shapes.Outcome{shapes.Applied, shapes.Unchanged, shapes.Failed, "<odd & \"one\">", ""}
	for i := 0; i < 500; i++ {
		sum := ReportSummary{Source: "local", Seq: rng.Uint64() >> rng.IntN(64), Outcome: outcomes[rng.IntN(len(outcomes))]}
		if rng.IntN(5) > 0 {
			sum.Lines = map[shapes.Outcome]int{}
			for j := rng.IntN(4); j > 0; j-- {
				sum.Lines[outcomes[rng.IntN(len(outcomes))]] = rng.IntN(2000) - 5
			}
		}
		want, err := json.Marshal(&sum)
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonSummary(nil, &sum); !bytes.Equal(got, want) {
			t.Fatalf("summary %+v:\nhand-written  %s\nencoding/json %s", sum, got, want)
		}
	}
}
