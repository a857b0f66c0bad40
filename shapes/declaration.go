package shapes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Version is the only declaration version this host knows.
const Version = 1

// MaxDeclarationSize bounds what Parse will look at. A declaration is text
// about a machine; 64 MiB is far beyond any real one and small enough that a
// hostile one cannot exhaust a small node's memory.
const MaxDeclarationSize = 64 << 20

// Declaration is what a node is told to be: an ordered list of typed
// resources, addressed to one node and enrolment, with a sequence.
type Declaration struct {
	Version     int        `json:"version"`
	Node        string     `json:"node"`
	Enrolment   string     `json:"enrolment"`
	Seq         uint64     `json:"seq"`
	Adopted     bool       `json:"adopted"`
	Taken       []string   `json:"taken"`
	OwnsNothing bool       `json:"owns_nothing"`
	Retire      bool       `json:"retire"`
	Resources   []Resource `json:"resources"`
}

// Resource is one declared resource. Its concrete type is one of *File,
// *Directory, *Action, *Service, *Package, *User, *Archive, *Container,
// *Network, *Overlay or *Opening.
type Resource interface {
	// Head returns the identity every resource carries.
	Head() *Base
	// validate checks the shape's own fields; it never touches the machine.
	validate(v *validator)
}

// Base is the identity every resource carries: module + id, and its type.
type Base struct {
	Module string `json:"module"`
	ID     string `json:"id"`
	Type   string `json:"type"`
}

// Head returns b itself, so every shape satisfies Resource through embedding.
func (b *Base) Head() *Base { return b }

// Key is the resource's identity, "module.id".
func (b *Base) Key() string { return b.Module + "." + b.ID }

// Error is a refusal of a declaration by shapes. It names the resource
// ("module.id", empty for the declaration itself) and the field.
type Error struct {
	Resource string // "module.id", or "" for a declaration-level field
	Type     string // the resource's type, when known
	Field    string // the JSON field name, or "" when the whole resource is at fault
	Reason   string
	// Err is a sentinel the refusal is an instance of (ErrAction,
	// ErrProtected), for errors.Is; nil for the others.
	Err error
}

// Unwrap returns the sentinel, if any.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("shapes: ")
	if e.Resource != "" {
		b.WriteString("resource ")
		b.WriteString(e.Resource)
		if e.Type != "" {
			b.WriteString(" (" + e.Type + ")")
		}
		if e.Field != "" {
			b.WriteString(" field " + e.Field)
		}
		b.WriteString(": ")
	} else if e.Field != "" {
		b.WriteString("declaration field " + e.Field + ": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// ErrAction is wrapped by the refusal of an `action` arriving through Parse.
var ErrAction = errors.New("an action may only come from a local file named by root, never over the link")

// ErrProtected is wrapped by every refusal that touches the protected set.
var ErrProtected = errors.New("touches the host's own installation (the protected set)")

// Parse decodes and validates a declaration that arrived over the link. It
// refuses an `action`. The protected set is checked lexically; the executor
// checks again through the machine's symlinks with CheckProtected.
func Parse(data []byte) (*Declaration, error) {
	return parse(data, false)
}

// ParseTrusted decodes and validates a declaration from a local file named by
// root, or from the carried bundle. It permits an `action`.
func ParseTrusted(data []byte) (*Declaration, error) {
	return parse(data, true)
}

// rawDeclaration mirrors Declaration with resources left undecoded, so each
// can be decoded strictly into its own shape.
type rawDeclaration struct {
	Version     *int              `json:"version"`
	Node        string            `json:"node"`
	Enrolment   string            `json:"enrolment"`
	Seq         uint64            `json:"seq"`
	Adopted     bool              `json:"adopted"`
	Taken       []string          `json:"taken"`
	OwnsNothing bool              `json:"owns_nothing"`
	Retire      bool              `json:"retire"`
	Resources   []json.RawMessage `json:"resources"`
}

// unionDeclaration is the whole declaration decoded in one pass.
type unionDeclaration struct {
	Version     *int           `json:"version"`
	Node        string         `json:"node"`
	Enrolment   string         `json:"enrolment"`
	Seq         uint64         `json:"seq"`
	Adopted     bool           `json:"adopted"`
	Taken       []string       `json:"taken"`
	OwnsNothing bool           `json:"owns_nothing"`
	Retire      bool           `json:"retire"`
	Resources   []*anyResource `json:"resources"`
	// shaped is what the fast reader makes of resources: each already in
	// its own shape (Resources stays nil).
	shaped []Resource
}

func parse(data []byte, allowAction bool) (*Declaration, error) {
	if len(data) > MaxDeclarationSize {
		return nil, &Error{Reason: fmt.Sprintf("declaration is %d bytes, over the limit of %d", len(data), MaxDeclarationSize)}
	}
	if !utf8.Valid(data) {
		return nil, &Error{Reason: "not valid UTF-8 (encoding/json would replace what is not, and one text must not read two ways)"}
	}
	raw, err := fastDecode(data)
	slow := err != nil
	if slow {
		raw = new(unionDeclaration)
		if err := strictDecode(data, raw); err != nil {
			// Decode again, resource by resource, only to say precisely
			// which resource and field are wrong.
			return nil, explain(data, err)
		}
	}
	if raw.Version == nil {
		return nil, &Error{Field: "version", Reason: "missing; this host knows version 1"}
	}
	if *raw.Version != Version {
		return nil, versionError(*raw.Version)
	}
	if raw.Resources == nil && raw.shaped == nil {
		return nil, &Error{Field: "resources", Reason: "missing; a declaration that holds nothing says so with \"resources\": [] and \"owns_nothing\": true"}
	}
	d := &Declaration{
		Version: *raw.Version, Node: raw.Node, Enrolment: raw.Enrolment, Seq: raw.Seq,
		Adopted: raw.Adopted, Taken: raw.Taken, OwnsNothing: raw.OwnsNothing, Retire: raw.Retire,
		// The fast reader has made each resource its shape, and checked
		// the keys as it read.
		Resources: raw.shaped,
	}
	if slow {
		if d.Resources, err = shapeAll(raw.Resources, data); err != nil {
			return nil, err
		}
	}
	if err := d.validate(allowAction); err != nil {
		return nil, err
	}
	return d, nil
}

// shapeAll makes each resource read by encoding/json its own shape, and
// then checks the keys: each resource carries only its own shape's fields,
// each once and spelt exactly, none misspelt in a way encoding/json would
// forgive.
func shapeAll(raw []*anyResource, data []byte) ([]Resource, error) {
	out := make([]Resource, 0, len(raw))
	names := make([]string, len(raw))
	for i, u := range raw {
		if u == nil {
			return nil, &Error{Resource: fmt.Sprintf("#%d", i), Reason: "not a resource object: null"}
		}
		names[i] = u.Key()
		if u.Module == "" || u.ID == "" {
			names[i] = fmt.Sprintf("#%d", i)
		}
		r, ok := u.shape()
		if !ok {
			reason := fmt.Sprintf("unknown type %q; known types: %s", u.Type, strings.Join(TypeNames(), ", "))
			if u.Type == "" {
				reason = "missing type; known types: " + strings.Join(TypeNames(), ", ")
			}
			return nil, &Error{Resource: names[i], Field: "type", Reason: reason}
		}
		out = append(out, r)
	}
	if err := checkKeys(data, names); err != nil {
		return nil, err
	}
	return out, nil
}

// explain turns a failed one-pass decode into an error that names the
// resource and field, by decoding the declaration again the slow way.
func explain(data []byte, fast error) error {
	var raw rawDeclaration
	if err := strictDecode(data, &raw); err != nil {
		// An unknown version is the more useful thing to say, if that is it.
		var v struct {
			Version *int `json:"version"`
		}
		if json.Unmarshal(data, &v) == nil && v.Version != nil && *v.Version != Version {
			return versionError(*v.Version)
		}
		return &Error{Field: fieldOf(err), Reason: cleanJSONError(err) + where(data, err)}
	}
	if raw.Version != nil && *raw.Version != Version {
		return versionError(*raw.Version)
	}
	for i, rr := range raw.Resources {
		if _, err := decodeResource(i, rr); err != nil {
			return err
		}
	}
	return &Error{Field: fieldOf(fast), Reason: cleanJSONError(fast)}
}

func versionError(v int) error {
	return &Error{Field: "version", Reason: fmt.Sprintf("unknown version %d; this host knows version %d", v, Version)}
}

// strictDecode decodes exactly one JSON value into v, refusing unknown fields
// and anything after the value.
func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the declaration")
	}
	return nil
}

// fieldOf extracts the field name from encoding/json's errors.
func fieldOf(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return ute.Field
	}
	if s := err.Error(); strings.HasPrefix(s, `json: unknown field "`) {
		return strings.TrimSuffix(strings.TrimPrefix(s, `json: unknown field "`), `"`)
	}
	return ""
}

// where says where in data a decoding error is, as a person finds it in
// an editor: " at line L, column C" (columns count bytes, from 1).
func where(data []byte, err error) string {
	var off int64 = -1
	var se *json.SyntaxError
	var ute *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &ute):
		off = ute.Offset
	}
	if off < 0 || off > int64(len(data)) {
		return ""
	}
	// The offset is just past what was read when the decoder stopped.
	if off > 0 {
		off--
	}
	line, col := lineCol(data, int(off))
	return fmt.Sprintf(" at line %d, column %d", line, col)
}

func cleanJSONError(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fmt.Sprintf("expected %s, got JSON %s", ute.Type, ute.Value)
	}
	s := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(s, "unknown field") {
		return "unknown field (refused, never skipped)"
	}
	return s
}

// decodeResource reads a resource's identity first, so that every later
// error can name it, then decodes it strictly into its shape.
func decodeResource(index int, data json.RawMessage) (Resource, error) {
	newShape, ok := shapeTable[typeOf(data)]
	if !ok {
		// The slow path, only to say precisely what is wrong.
		var head Base
		if err := json.Unmarshal(data, &head); err != nil {
			return nil, &Error{Resource: fmt.Sprintf("#%d", index), Reason: "not a resource object: " + cleanJSONError(err)}
		}
		name := head.Key()
		if head.Module == "" || head.ID == "" {
			name = fmt.Sprintf("#%d", index)
		}
		reason := fmt.Sprintf("unknown type %q; known types: %s", head.Type, strings.Join(TypeNames(), ", "))
		if head.Type == "" {
			reason = "missing type; known types: " + strings.Join(TypeNames(), ", ")
		}
		return nil, &Error{Resource: name, Field: "type", Reason: reason}
	}
	r := newShape()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		name := fmt.Sprintf("#%d", index)
		var head Base
		if json.Unmarshal(data, &head) == nil && head.Module != "" && head.ID != "" {
			name = head.Key()
		}
		return nil, &Error{Resource: name, Type: typeOf(data), Field: fieldOf(err), Reason: cleanJSONError(err)}
	}
	return r, nil
}

// Accepts names the fields this build reads beyond those every release
// of declaration version 1 reads. Every reader of a declaration is strict
// (an unknown field refuses it whole), so a field added later is written
// by the control side only to a host that says it reads it: the executor
// says Accepts with its status, the agent relays it with the heartbeat.
// A name is "shape.field" and is never reused for another meaning.
var Accepts = []string{AcceptsRosterMin}

// AcceptsRosterMin: the overlay's roster_min (Overlay.RosterMin).
const AcceptsRosterMin = "overlay.roster_min"
