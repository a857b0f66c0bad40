package shapes

import "testing"

// The places this package says in the text it parsed are taken out of a
// message a FileError places anew; nothing else is.
func TestWithoutPlace(t *testing.T) {
	for in, want := range map[string]string{
		"shapes: bad value at line 3, column 14":                      "shapes: bad value",
		"a at line 1, column 2; b at line 10, column 20: c":           "a; b: c",
		"at line 1, column 2":                                         "at line 1, column 2",
		"x at line , column 2":                                        "x at line , column 2",
		"x at line 1, column ":                                        "x at line 1, column ",
		"x at line 1; column 2":                                       "x at line 1; column 2",
		"nothing said":                                                "nothing said",
		"x at line 12, column 9 at line 3, column 4 and at line 1, c": "x and at line 1, c",
	} {
		if got := withoutPlace(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
