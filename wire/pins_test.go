package wire

import (
	"strings"
	"testing"
)

func TestParseBrokerPins(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	if p, err := ParseBrokerPins([]byte(`{"seq":2,"pins":["` + fp + `"],"issued":"2026-12-03T00:00:00Z"}`)); err != nil || p.Seq != 2 || p.Pins[0] != fp {
		t.Fatalf("%+v %v", p, err)
	}
	for name, in := range map[string]string{
		"no sequence":          `{"pins":["` + fp + `"]}`,
		"no pins":              `{"seq":1,"pins":[]}`,
		"too many":             `{"seq":1,"pins":["` + strings.Repeat(`"`+fp+`",`, MaxBrokerPins) + `"` + fp + `"]}`,
		"upper case":           `{"seq":1,"pins":["` + strings.ToUpper(fp) + `"]}`,
		"short":                `{"seq":1,"pins":["abcd"]}`,
		"an unknown field":     `{"seq":1,"pins":["` + fp + `"],"also":1}`,
		"not a statement":      `[]`,
		"a pin not hex at all": `{"seq":1,"pins":["` + strings.Repeat("zz", 32) + `"]}`,
	} {
		if _, err := ParseBrokerPins([]byte(in)); err == nil {
			t.Errorf("%s: read", name)
		}
	}
}

// FuzzParseBrokerPins: a hostile statement never panics, and one read
// names 1 to MaxBrokerPins fingerprints, each a SHA-256 in lower-case hex.
func FuzzParseBrokerPins(f *testing.F) {
	f.Add([]byte(`{"seq":2,"pins":["` + strings.Repeat("ab", 32) + `"],"issued":"2026-12-03T00:00:00Z"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseBrokerPins(b)
		if err != nil {
			return
		}
		if p.Seq == 0 || len(p.Pins) == 0 || len(p.Pins) > MaxBrokerPins {
			t.Fatalf("read %+v", p)
		}
		for _, f := range p.Pins {
			if len(f) != 64 || strings.ToLower(f) != f {
				t.Fatalf("a pin %q", f)
			}
		}
	})
}
