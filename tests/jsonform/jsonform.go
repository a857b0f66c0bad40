// Package jsonform checks the form every JSON output of the three
// binaries keeps, so scripts read them alike: keys in snake_case, no null
// (an empty list is [], an absent value is left out), numbers as integers
// (times are RFC 3339 strings, durations whole milliseconds, modes "0750"
// strings). One rule, checked by the tests of every command that prints
// JSON.
package jsonform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Check returns what in b breaks the form, or nil. b may hold one JSON
// value or several, one after another (a stream of lines).
func Check(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	n := 0
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		if err := check(v, "$"); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no JSON value")
	}
	return nil
}

func check(v any, at string) error {
	switch x := v.(type) {
	case nil:
		return fmt.Errorf("%s is null", at)
	case json.Number:
		if strings.ContainsAny(string(x), ".eE") {
			return fmt.Errorf("%s is %s, not an integer", at, x)
		}
	case map[string]any:
		for k, e := range x {
			if !snake(k) {
				return fmt.Errorf("key %s.%s is not snake_case", at, k)
			}
			if err := check(e, at+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := check(e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// snake reports whether k is lower case letters, digits and underscores.
// A map keyed by data (a module.id, a path) is not a key of the form; the
// callers' outputs keep such maps as lists, so none is exempt here.
func snake(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}
