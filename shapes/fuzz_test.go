package shapes

import (
	"encoding/json"
	"os"
	"reflect"
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

// FuzzFastDecode holds the fast reader to encoding/json: whatever it
// accepts, encoding/json and checkKeys accept too, with the same result.
func FuzzFastDecode(f *testing.F) {
	if data, err := os.ReadFile("testdata/example.json"); err == nil {
		f.Add(data)
	}
	for _, s := range []string{
		`{"version":1,"resources":[],"owns_nothing":true}`,
		res(action),
		res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"a\"b\\c\/d\n\t\r\b\f","mode":"0644","owner":"a:b"}`),
		res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"é ☃ \u00e9"}`),
		`{"version":1,"seq":-1,"resources":[],"owns_nothing":true}`,
		`{"version":1,"seq":-0,"resources":[],"owns_nothing":true}`,
		`{"version":1,"seq": -0,"resources":[],"owns_nothing":true}`,
		`{"version":1,"seq":1e3,"resources":[],"owns_nothing":true}`,
		`{"version":1,"node":"a","node":"b","resources":[],"owns_nothing":true}`,
		res(`{"module":"m","id":"f","type":"file","path":"/srv/x","PATH":"/y","content":""}`),
		res(`{"module":"m","id":"s","type":"service","unit":"nginx","enabled":false,"restart_on":[]}`),
		` {"version" : 1 , "resources" : [ ] , "owns_nothing" : true } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, err := fastDecode(data)
		if err != nil {
			if err != errSlowPath {
				t.Fatalf("the fast reader decided something: %v", err)
			}
			return
		}
		var slow unionDeclaration
		if err := strictDecode(data, &slow); err != nil {
			t.Fatalf("fast accepted what encoding/json refuses (%v):\n%q", err, data)
		}
		names := make([]string, len(slow.Resources))
		if err := checkKeys(data, names); err != nil {
			t.Fatalf("fast accepted what checkKeys refuses (%v):\n%q", err, data)
		}
		// The fast reader hands back each resource in its own shape.
		if slow.Resources != nil {
			slow.shaped = make([]Resource, 0, len(slow.Resources))
			for _, u := range slow.Resources {
				if u == nil {
					t.Fatalf("fast accepted a resource encoding/json reads as null:\n%q", data)
				}
				r, ok := u.shape()
				if !ok {
					t.Fatalf("fast accepted a resource of unknown type %q:\n%q", u.Type, data)
				}
				slow.shaped = append(slow.shaped, r)
			}
			slow.Resources = nil
		}
		if !reflect.DeepEqual(fast, &slow) {
			t.Fatalf("fast and encoding/json differ on\n%q\nfast %+v\nslow %+v", data, fast, &slow)
		}
	})
}
