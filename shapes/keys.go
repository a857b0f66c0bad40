package shapes

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// encoding/json matches field names case-insensitively and lets a repeated
// key win over an earlier one. Both mean one text can be read two ways: a
// reviewer, the control side or another parser may see `"path": "/srv/a"`
// where the executor sees a later `"PATH": "/etc/shadow"`. So before
// decoding, every object's keys are checked: spelled exactly as a field, and
// each once.

// fieldNames is every JSON field name of the vocabulary (built on first
// use: only the slow path asks).
var fieldNames = sync.OnceValue(func() map[string]bool {
	m := map[string]bool{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous {
				add(f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				m[name] = true
			}
			add(f.Type)
		}
	}
	add(reflect.TypeOf(unionDeclaration{}))
	for _, mk := range shapeTable {
		add(reflect.TypeOf(mk()))
	}
	return m
})

// mapFields are the fields whose value is a map with keys of the
// declaration's own choosing.
var mapFields = map[string]bool{"env": true, "set": true}

type keyScanner struct {
	data      []byte
	i         int
	names     []string // resource names by index, for errors
	surrogate string   // the first \u escape of a surrogate seen
}

// checkKeys refuses, anywhere in data (which encoding/json has already
// found valid), a duplicated key or a key not spelt exactly as a field, and
// in a resource any field that is not its own shape's. names are the
// resources' names by index.
func checkKeys(data []byte, names []string) error {
	s := &keyScanner{data: data, names: names}
	if err := s.value("", "", false); err != nil {
		return err
	}
	if s.surrogate != "" {
		return &Error{Reason: fmt.Sprintf("%s escapes half of a UTF-16 surrogate pair; write the character itself (one text must not read two ways)", s.surrogate)}
	}
	return nil
}

func (s *keyScanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value scans one value. key is the field it is the value of; where says
// which resource it is in, for the error; resource is true for a resource
// object itself.
func (s *keyScanner) value(key, where string, resource bool) error {
	s.ws()
	if s.i >= len(s.data) {
		return nil
	}
	switch s.data[s.i] {
	case '{':
		s.i++
		var seen []string // objects are small: a slice beats a map
		typ := ""
		for {
			s.ws()
			if s.data[s.i] == '}' {
				s.i++
				if fields, ok := typeFields()[typ]; ok && resource {
					for _, k := range seen {
						if !fields[k] {
							return &Error{Resource: where, Type: typ, Field: k, Reason: "unknown field (refused, never skipped)"}
						}
					}
				}
				return nil
			}
			if s.data[s.i] == ',' {
				s.i++
				s.ws()
			}
			k, err := s.str()
			if err != nil {
				return err
			}
			if !mapFields[key] && !fieldNames()[k] {
				return &Error{Resource: where, Field: k, Reason: "unknown field (field names are exact and snake_case; refused, never skipped)"}
			}
			for _, prev := range seen {
				// A map's keys (env) are case-sensitive; field names are
				// matched by encoding/json without case, so they are
				// compared that way here.
				if prev == k || !mapFields[key] && strings.EqualFold(prev, k) {
					return &Error{Resource: where, Field: k, Reason: fmt.Sprintf("given twice in one object (as %q and %q); one text must not read two ways", prev, k)}
				}
			}
			seen = append(seen, k)
			s.ws()
			s.i++ // ':'
			if resource && k == "type" {
				s.ws()
				if s.data[s.i] == '"' {
					if typ, err = s.str(); err != nil {
						return err
					}
					continue
				}
			}
			if err := s.value(k, where, false); err != nil {
				return err
			}
		}
	case '[':
		s.i++
		for n := 0; ; n++ {
			s.ws()
			if s.data[s.i] == ']' {
				s.i++
				return nil
			}
			if s.data[s.i] == ',' {
				s.i++
			}
			w, isResource := where, key == "resources" && where == ""
			if isResource {
				w = fmt.Sprintf("#%d", n)
				if n < len(s.names) {
					w = s.names[n]
				}
			}
			if err := s.value("", w, isResource); err != nil {
				return err
			}
		}
	case '"':
		s.skipStr()
		return nil
	default:
		for s.i < len(s.data) && !strings.ContainsRune(",]} \t\n\r", rune(s.data[s.i])) {
			s.i++
		}
		return nil
	}
}

// str scans a string and returns it unescaped.
func (s *keyScanner) str() (string, error) {
	start := s.i
	s.i++ // opening quote
	escaped := false
	for s.i < len(s.data) {
		c := s.data[s.i]
		s.i++
		switch c {
		case '\\':
			escaped = true
			s.i++
		case '"':
			raw := s.data[start:s.i]
			if !escaped {
				return string(raw[1 : len(raw)-1]), nil
			}
			var out string
			if err := json.Unmarshal(raw, &out); err != nil {
				return "", &Error{Reason: "bad string: " + err.Error()}
			}
			return out, nil
		}
	}
	return "", &Error{Reason: "unterminated string"}
}

// skipStr passes over a string value without unescaping it, noting a
// \u escape of a UTF-16 surrogate: encoding/json turns a lone one into
// U+FFFD, so the text would read one way here and another elsewhere.
func (s *keyScanner) skipStr() {
	s.i++
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			if s.i+5 < len(s.data) && s.data[s.i+1] == 'u' && (s.data[s.i+2] == 'd' || s.data[s.i+2] == 'D') &&
				strings.IndexByte("89abcdefABCDEF", s.data[s.i+3]) >= 0 && s.surrogate == "" {
				s.surrogate = string(s.data[s.i : s.i+6])
			}
			s.i += 2
			continue
		case '"':
			s.i++
			return
		}
		s.i++
	}
}

// typeOf finds the value of the top-level "type" key of a JSON object
// already known to be valid, without decoding the rest. It returns "" when
// the object has none (or it is not a plain string).
func typeOf(obj []byte) string {
	s := &keyScanner{data: obj}
	s.ws()
	if s.i >= len(obj) || obj[s.i] != '{' {
		return ""
	}
	s.i++
	for {
		s.ws()
		if s.i >= len(obj) || obj[s.i] == '}' {
			return ""
		}
		if obj[s.i] == ',' {
			s.i++
			s.ws()
		}
		k, err := s.str()
		if err != nil {
			return ""
		}
		s.ws()
		s.i++ // ':'
		s.ws()
		if k == "type" && s.i < len(obj) && obj[s.i] == '"' {
			v, err := s.str()
			if err != nil {
				return ""
			}
			return v
		}
		if err := s.value(k, "", false); err != nil {
			return ""
		}
	}
}
