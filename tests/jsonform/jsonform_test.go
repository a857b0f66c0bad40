package jsonform

import "testing"

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`{"a_b":[],"c":1,"d":"0750","e":{"f":true}}`, true},
		{`[{"x":1}]` + "\n" + `{"y":2}`, true},
		{`{"Heartbeat":1}`, false},
		{`{"last-heard":1}`, false},
		{`{"lines":null}`, false},
		{`{"a":[{"b":null}]}`, false},
		{`{"mode":488.5}`, false},
		{`{"n":1e3}`, false},
		{``, false},
		{`{`, false},
	} {
		if err := Check([]byte(c.in)); (err == nil) != c.ok {
			t.Errorf("Check(%s) = %v, want ok=%v", c.in, err, c.ok)
		}
	}
}
