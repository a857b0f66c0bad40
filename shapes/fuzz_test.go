package shapes

import (
	"encoding/json"
	"os"
	"testing"
)

// FuzzParse feeds the decoder arbitrary bytes, seeded from the table tests.
// Whatever it accepts must survive a round trip: encoded again and parsed
// again, it is accepted and encodes to the same bytes.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("testdata/example.json"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{"version":1,"resources":[],"owns_nothing":true}`))
	f.Add([]byte(res(action)))
	f.Add([]byte(res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"x","mode":"0644","owner":"a:b"}`)))
	f.Add([]byte(res(`{"module":"m","id":"d","type":"directory","path":"/etc/systemd/system/mesh-agent.service.d"}`)))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseTrusted(data)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("refusal is a %T, not a *shapes.Error: %v", err, err)
			}
			return
		}
		enc, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("marshal accepted declaration: %v", err)
		}
		d2, err := ParseTrusted(enc)
		if err != nil {
			t.Fatalf("accepted declaration does not re-parse: %v\n%s", err, enc)
		}
		enc2, _ := json.Marshal(d2)
		if string(enc) != string(enc2) {
			t.Fatalf("round trip differs:\n%s\n%s", enc, enc2)
		}
	})
}
