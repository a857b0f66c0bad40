package shapes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// FileError is a refusal of a file a person wrote (a declaration, a
// module, a rescue file), placed in it as an editor and a compiler place
// things — "site.json:12:5: …" — so the person goes to the place rather
// than searching the file for a field named in the message. Line and
// Column count from 1; a column counts bytes, as gc's does. The control
// side's commands and the executor's apply and plan place their refusals
// alike.
type FileError struct {
	File         string
	Line, Column int
	// Msg is what is wrong, without a place of its own: the control side
	// checks a file as the node will receive it, re-encoded with its node
	// and sequence set, and a place in that text is no place in the file.
	Msg string
	Err error
}

func (e *FileError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Unwrap returns the refusal placed (an *Error, a *json.SyntaxError, a
// refusal PlaceIn was given).
func (e *FileError) Unwrap() error { return e.Err }

// InFile places err, a failure on the file it read as data, in that file
// when it is a refusal of the file's text: JSON that does not parse, or a
// value of the wrong kind (found in data itself, never trusted from an
// error that may be of other bytes), or a refusal of this package naming
// a resource and field the file holds. Any other error, and one
// that names what the file does not hold, is returned as it is.
func InFile(file string, data []byte, err error) error {
	if err == nil {
		return nil
	}
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		se  *Error
	)
	if errors.As(err, &se) {
		if placed := PlaceIn(file, data, se.Resource, se.Field, err); placed != err {
			return placed
		}
	}
	// A refusal of the text this package did not place (its own reader
	// says "unexpected EOF" of a file cut short), or encoding/json's: the
	// file's JSON, read again, says where.
	if se != nil || errors.As(err, &syn) || errors.As(err, &typ) {
		if fe := CheckJSON(file, data); fe != nil {
			return fe
		}
	}
	return err
}

// PlaceIn places err, a refusal of resource ("module.id", or "#N" for
// the Nth, from 0) and field (a dotted path) of the file data, at that
// resource and field; err as it is when the file does not hold them.
func PlaceIn(file string, data []byte, resource, field string, err error) error {
	at, ok := locate(data, resource, field)
	if !ok {
		return err
	}
	line, col := lineCol(data, at)
	return &FileError{File: file, Line: line, Column: col, Msg: withoutPlace(err.Error()), Err: err}
}

// withoutPlace is msg without the places this package says in the text
// it parsed (where: " at line L, column C"), which a FileError says anew,
// in the file. Written out rather than a regular expression: the
// executor links this package, and nothing else of it needs one.
func withoutPlace(msg string) string {
	const line, column = " at line ", ", column "
	digitsFrom := func(i int) int {
		for i < len(msg) && msg[i] >= '0' && msg[i] <= '9' {
			i++
		}
		return i
	}
	for i := 0; ; {
		j := strings.Index(msg[i:], line)
		if j < 0 {
			return msg
		}
		j += i
		l := digitsFrom(j + len(line))
		if l > j+len(line) && strings.HasPrefix(msg[l:], column) {
			if c := digitsFrom(l + len(column)); c > l+len(column) {
				msg = msg[:j] + msg[c:]
				i = j
				continue
			}
		}
		i = j + 1
	}
}

// CheckJSON refuses data, a declaration or module file, whose JSON does
// not parse, is not an object, or whose resources are not a list of
// objects — placed in the file: encoding/json says how far it read, and
// the place is what it read last.
func CheckJSON(file string, data []byte) *FileError {
	var top struct {
		Resources []map[string]json.RawMessage `json:"resources"`
	}
	err := json.Unmarshal(data, &top)
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		at  int
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &syn):
		at = syntaxAt(data, syn)
	case errors.As(err, &typ):
		at = valueStart(data, int(typ.Offset))
	default:
		return nil
	}
	line, col := lineCol(data, at)
	return &FileError{File: file, Line: line, Column: col, Msg: jsonSaid(err), Err: err}
}

// jsonSaid is encoding/json's complaint in a person's words: a type error
// names the JSON found and what was wanted of it, not a Go type.
func jsonSaid(err error) string {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		// What checkJSON decodes: the file an object, its resources a
		// list, each of them an object.
		want := "the file must be an object"
		switch typ.Type.Kind() {
		case reflect.Slice:
			want = `"resources" must be a list of resource objects`
		case reflect.Map:
			want = "each resource must be an object"
		}
		return fmt.Sprintf("a JSON %s: %s", typ.Value, want)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// syntaxAt is the byte a syntax error is at: the last one read (Offset
// counts those read), or, when the input ended early, just past its last
// character — where what is missing goes.
func syntaxAt(data []byte, syn *json.SyntaxError) int {
	if syn.Error() == "unexpected end of JSON input" {
		return len(bytes.TrimRight(data, " \t\r\n"))
	}
	return max(int(syn.Offset)-1, 0)
}

// valueStart is where the value ends that encoding/json stopped after, at
// off, begins: the opening bracket of an object or list it read the first
// byte of, else the first byte of the string or literal it read whole.
func valueStart(data []byte, off int) int {
	if off <= 0 || off > len(data) {
		return 0
	}
	i := off - 1
	switch data[i] {
	case '{', '[':
		return i
	case '"':
		for j := i - 1; j >= 0; j-- {
			if data[j] == '"' && !escaped(data, j) {
				return j
			}
		}
		return i
	}
	for i > 0 && bytes.IndexByte([]byte("0123456789+-.eEabcdfilnrstu"), data[i-1]) >= 0 {
		i--
	}
	return i
}

// escaped says whether the quote at i is escaped: an odd number of
// backslashes before it.
func escaped(data []byte, i int) bool {
	n := 0
	for i--; i >= 0 && data[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// lineCol is the line and column, from 1, of byte at in data.
func lineCol(data []byte, at int) (line, col int) {
	at = min(max(at, 0), len(data))
	line = 1 + bytes.Count(data[:at], []byte("\n"))
	col = at - bytes.LastIndexByte(data[:at], '\n')
	return line, col
}

// locate is where in data, a declaration or module file, shapes' refusal
// of resource ("module.id", or "#N" for the Nth, from 0) and field (a
// dotted path, as encoding/json names a nested one) points: the field's
// name, else as deep in its path as the file goes, else the resource. A
// resource the file does not hold is not located (it came from elsewhere:
// another module of the node's composition).
func locate(data []byte, resource, field string) (int, bool) {
	var path []string
	if resource != "" {
		i, ok := resourceIndex(data, resource)
		if !ok {
			return 0, false
		}
		path = append(path, "resources", strconv.Itoa(i))
	}
	if field != "" {
		path = append(path, strings.Split(field, ".")...)
	}
	if len(path) == 0 {
		return 0, false
	}
	at, value, depth := 0, skipSep(data, 0), 0
	for _, step := range path {
		a, v, ok := child(data, value, step)
		if !ok {
			break
		}
		at, value, depth = a, v, depth+1
	}
	// Found: the resource, and, when a field is named, at least its first
	// step (a field the resource lacks points at the resource).
	need := 1
	if resource != "" {
		need = 2
	}
	return at, depth >= need
}

// resourceIndex is the place in the file's resources of the resource
// shapes names "module.id" (or "#N").
func resourceIndex(data []byte, name string) (int, bool) {
	if n, ok := strings.CutPrefix(name, "#"); ok {
		i, err := strconv.Atoi(n)
		return i, err == nil
	}
	var top struct {
		Resources []json.RawMessage `json:"resources"`
	}
	if json.Unmarshal(data, &top) != nil {
		return 0, false
	}
	for i, r := range top.Resources {
		var b Base
		if json.Unmarshal(r, &b) == nil && b.Key() == name {
			return i, true
		}
	}
	return 0, false
}

// child finds step — a member's name, or an element's index — in the
// object or list that begins at data[off]: at is where it begins (the
// member's name, the element), value where its value does.
func child(data []byte, off int, step string) (at, value int, ok bool) {
	if off >= len(data) {
		return 0, 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(data[off:]))
	open, err := dec.Token()
	if err != nil {
		return 0, 0, false
	}
	var skip json.RawMessage
	switch open {
	case json.Delim('{'):
		for dec.More() {
			at := skipSep(data, off+int(dec.InputOffset()))
			k, err := dec.Token()
			if err != nil {
				return 0, 0, false
			}
			value := skipSep(data, off+int(dec.InputOffset()))
			if k == step {
				return at, value, true
			}
			if dec.Decode(&skip) != nil {
				return 0, 0, false
			}
		}
	case json.Delim('['):
		n, err := strconv.Atoi(step)
		if err != nil {
			return 0, 0, false
		}
		for i := 0; dec.More(); i++ {
			at := skipSep(data, off+int(dec.InputOffset()))
			if i == n {
				return at, at, true
			}
			if dec.Decode(&skip) != nil {
				return 0, 0, false
			}
		}
	}
	return 0, 0, false
}

// skipSep is the first byte at or after i that is not white space or the
// one separator (',' between members, ':' after a name) before a token.
func skipSep(data []byte, i int) int {
	sep := false
	for ; i < len(data); i++ {
		switch c := data[i]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		case (c == ',' || c == ':') && !sep:
			sep = true
		default:
			return i
		}
	}
	return i
}
