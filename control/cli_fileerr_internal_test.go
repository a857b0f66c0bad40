package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// declarationErr is what declare says of a declaration file as Declare
// checks it: the file's JSON, then the declaration as the node would
// receive it, its node and sequence set (probe).
func declarationErr(file string, data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return inFile(file, data, fmt.Errorf("declaration: %w", err))
	}
	rec := &NodeRecord{Name: "web1", Enrolment: "e-0123456789abcdef0123"}
	return inFile(file, data, probe(7, func(seq uint64) ([]byte, error) { return fillDecl(m, rec, seq) }))
}

// moduleErr is what assign says of a module file before it connects.
var moduleErr = checkModuleFile

// A refusal of a file a person wrote is placed in that file, at the line
// and column an editor shows — never at a place in the re-encoded text
// the control side checks — for JSON that does not parse, a value of the
// wrong kind, and what shapes refuses of a resource or a field.
func TestFileErrorsArePlacedInTheFile(t *testing.T) {
	for _, c := range []struct {
		name  string
		check func(file string, data []byte) error
		text  string
		// at is the text the place must begin, found once in text; say
		// part of what the message must say.
		at, say string
	}{
		{"a comma before a closing brace", declarationErr, `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "file",
   "path": "/etc/motd", "content": "hi",}
 ]}
`, `}
 ]}`, "invalid character '}' looking for beginning of object key string"},
		{"the file ends early", declarationErr, `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "file", "path": "/etc/motd"}
`, "", "unexpected end of JSON input"},
		{"an empty file", declarationErr, ``, "", "unexpected end of JSON input"},
		{"only white space", declarationErr, "\n\n  \n", "", "unexpected end of JSON input"},
		{"text after the declaration", declarationErr, `{"version": 1, "resources": []}
{"version": 1}`, `{"version": 1}`, "after top-level value"},
		{"a list, not an object", declarationErr, `[{"version": 1}]`, `[{"version": 1}]`, "a JSON array: the file must be an object"},
		{"the version a string", declarationErr, `{
  "version": "1",
  "resources": []
}`, `"version": "1"`, "declaration field version: expected int, got JSON string"},
		{"a content that is a number", declarationErr, `{"version": 1,
 "resources": [
  {"module": "base", "id": "issue", "type": "file", "path": "/etc/issue", "content": "x"},
  {"module": "base", "id": "motd", "type": "file",
   "path": "/etc/motd",
      "content": 7}
 ]}`, `"content": 7`, "resource base.motd (file) field content: expected string, got JSON number"},
		{"a misspelt field", declarationErr, `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "file", "path": "/etc/motd",
   "contnt": "hi"}
 ]}`, `"contnt"`, "field contnt: unknown field"},
		{"an unknown type", declarationErr, `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "flie", "path": "/etc/motd"}
 ]}`, `"type": "flie"`, `unknown type "flie"`},
		{"a resource that is a number", declarationErr, `{"version": 1,
 "resources": [
     42
 ]}`, "42", "not a resource object"},
		{"resources a string", declarationErr, `{"version": 1, "owns_nothing": true,
 "resources": "all of them"}`, `"resources": "all`, "field resources"},
		{"a module file's content a list", moduleErr, `{
  "resources": [
    {"module": "web", "id": "index", "type": "file", "path": "/srv/www/index.html",
     "content": ["<h1>hi</h1>"]}
  ]
}`, `"content": [`, "resource web.index (file) field content: expected string, got JSON array"},
		{"a module file that does not parse", moduleErr, `{"resources": [
  {"module": "web", "id": "index", "type": "file", "path": "/srv/www/index.html"}
  {"module": "web", "id": "about", "type": "file", "path": "/srv/www/about.html"}
]}`, `{"module": "web", "id": "about"`, "invalid character '{' after array element"},
		{"a module file's resources a number", moduleErr, `{"resources": 3}`, "3}", `a JSON number: "resources" must be a list of resource objects`},
		{"a module file's resources a string, with escaped quotes", moduleErr, `{"resources":
    "all \"of\" them"}`, `"all \"of\" them"`, `a JSON string: "resources" must be a list`},
		{"a module file's resource a list", moduleErr, `{"resources": [
   {"module": "web", "id": "index", "type": "file", "path": "/srv/www/index.html"},
   ["web", "about"]]}`, `["web", "about"]`, "a JSON array: each resource must be an object"},
		{"a module file with a node's field", moduleErr, `{"resources": [
  {"module": "web", "id": "index", "type": "file", "path": "/srv/www/index.html"}],
 "adopted": true}`, `"adopted"`, `module file: field "adopted": a module is its resources`},
		{"a module file of two modules", moduleErr, `{"resources": [
  {"module": "web", "id": "index", "type": "file", "path": "/srv/www/index.html"},
  {"id": "motd", "type": "file", "path": "/etc/motd",
   "module": "base"}]}`, `"module": "base"`, `resource 1 is of module "base", the first of "web"; a file is one module`},
		{"a module file of the overlay's module", moduleErr, `{"resources": [
  {"type": "directory", "path": "/x", "module": "mesh", "id": "a"}]}`, `"module": "mesh"`, `module "mesh" is the overlay's`},
		{"a module file with sealed content", moduleErr, `{"resources": [
  {"module": "db", "id": "creds", "type": "file", "path": "/etc/db",
   "sealed": "AAAA"}]}`, `"sealed"`, "db.creds has sealed content"},
		{"a module file of no resources", moduleErr, `{"version": 1,
  "resources": []}`, `"resources"`, "module file: no resources"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := []byte(c.text)
			err := c.check("site.json", data)
			var fe *shapes.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("not placed in the file: %v", err)
			}
			off := strings.Index(c.text, c.at)
			if c.at == "" {
				// Just past the last character: where what is missing goes.
				off = len(strings.TrimRight(c.text, " \n"))
			} else if strings.Count(c.text, c.at) != 1 {
				t.Fatalf("the table's place %q is not found once in the file", c.at)
			}
			before := c.text[:off]
			line := strings.Count(before, "\n") + 1
			col := len(before) - strings.LastIndex(before, "\n")
			want := fmt.Sprintf("site.json:%d:%d: ", line, col)
			if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), c.say) {
				t.Errorf("said %q, want it to begin %q and say %q", err, want, c.say)
			}
			if strings.Contains(err.Error(), " at line ") {
				t.Errorf("said a second place, of the re-encoded text: %q", err)
			}
		})
	}
}

// What the file does not hold is not placed in it: a refusal of a
// resource of another module of the node's composition, a field the file
// has not, an error that is no refusal of the text.
func TestNotInTheFileIsNotPlaced(t *testing.T) {
	data := []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd"}]}`)
	for _, err := range []error{
		&shapes.Error{Resource: "overlay.mesh0", Type: "overlay", Field: "port", Reason: "out of range"},
		&shapes.Error{Field: "retire", Reason: "not with resources"},
		&shapes.Error{Resource: "#3", Reason: "not a resource object: null"},
		errors.New("node web1 is revoked"),
		fmt.Errorf("registry: %w", json.Unmarshal([]byte(`{"x":`), new(any))), // another text's
	} {
		if got := inFile("site.json", data, err); got != err {
			t.Errorf("%v: placed as %v", err, got)
		}
	}
}
