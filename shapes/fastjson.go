package shapes

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// A declaration is read on every apply, and a thousand resources through
// encoding/json's reflection cost more than observing the thousand files
// they describe. fastDecode reads the plain JSON a control plane writes
// (objects, arrays, strings with the usual escapes, integers, booleans)
// straight into unionDeclaration, with the strictness checkKeys adds on the
// slow path built in: keys exact, none twice, each resource carrying only
// its own shape's fields.
//
// Anything else — null, a number with a fraction or exponent, a \u escape,
// invalid UTF-8, a key it does not know, a duplicate — makes it give up
// with errSlowPath, and the declaration is read by encoding/json, whose
// errors say precisely what is wrong. It never decides that a declaration
// is bad; only encoding/json and checkKeys do. FuzzFastDecode holds the two
// paths to the same result on every input the fast one accepts.

var errSlowPath = errors.New("shapes: not plain; read by encoding/json")

type fastReader struct {
	data []byte
	i    int
}

func fastDecode(data []byte) (*unionDeclaration, error) {
	r := &fastReader{data: data}
	var d unionDeclaration
	seen := uint16(0)
	err := r.object(func(key string) error {
		bit, ok := topBits[key]
		if !ok || seen&bit != 0 {
			return errSlowPath
		}
		seen |= bit
		var err error
		switch key {
		case "version":
			var v int
			v, err = r.int()
			d.Version = &v
		case "node":
			d.Node, err = r.str()
		case "enrolment":
			d.Enrolment, err = r.str()
		case "seq":
			var v int
			if v, err = r.int(); v < 0 {
				return errSlowPath
			}
			d.Seq = uint64(v)
		case "adopted":
			d.Adopted, err = r.bool()
		case "taken":
			d.Taken, err = r.strings()
		case "owns_nothing":
			d.OwnsNothing, err = r.bool()
		case "retire":
			d.Retire, err = r.bool()
		case "resources":
			d.Resources = []*anyResource{}
			err = r.array(func() error {
				u, err := r.resource()
				d.Resources = append(d.Resources, u)
				return err
			})
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r.ws()
	if r.i != len(data) {
		return nil, errSlowPath
	}
	return &d, nil
}

var topBits = map[string]uint16{"version": 1, "node": 2, "enrolment": 4, "seq": 8, "adopted": 16,
	"taken": 32, "owns_nothing": 64, "retire": 128, "resources": 256}

func (r *fastReader) resource() (*anyResource, error) {
	u := &anyResource{}
	var keys []string
	err := r.object(func(key string) error {
		for _, k := range keys {
			if k == key {
				return errSlowPath
			}
		}
		keys = append(keys, key)
		var err error
		switch key {
		case "module":
			u.Module, err = r.str()
		case "id":
			u.ID, err = r.str()
		case "type":
			u.Type, err = r.str()
		case "path":
			u.Path, err = r.str()
		case "content":
			u.Content, err = r.strp()
		case "bytes":
			u.Bytes, err = r.strp()
		case "sealed":
			u.Sealed, err = r.strp()
		case "mode":
			u.Mode, err = r.str()
		case "owner":
			u.Owner, err = r.str()
		case "run":
			u.Run, err = r.strings()
		case "verify":
			u.Verify, err = r.strings()
		case "timeout":
			u.Timeout, err = r.int()
		case "unit":
			u.Unit, err = r.str()
		case "state":
			u.State, err = r.str()
		case "enabled":
			var b bool
			b, err = r.bool()
			u.Enabled = &b
		case "restart_on":
			u.RestartOn, err = r.strings()
		case "name":
			u.Name, err = r.str()
		case "version":
			u.Version, err = r.str()
		case "shell":
			u.Shell, err = r.str()
		case "home":
			u.Home, err = r.str()
		case "groups":
			u.Groups, err = r.strings()
		case "url":
			u.URL, err = r.str()
		case "sha256":
			u.SHA256, err = r.str()
		case "destination":
			u.Destination, err = r.str()
		case "image":
			u.Image, err = r.str()
		case "command":
			u.Command, err = r.strings()
		case "network":
			u.Network, err = r.str()
		case "ports":
			u.Ports, err = r.strings()
		case "mounts":
			u.Mounts, err = r.strings()
		case "interface":
			u.Interface, err = r.str()
		case "address":
			u.Address, err = r.str()
		case "listen_port":
			u.ListenPort, err = r.int()
		case "port":
			u.Port, err = r.int()
		case "protocol":
			u.Protocol, err = r.str()
		case "from":
			u.From, err = r.str()
		default:
			// env and peers, and anything unknown, go the slow way.
			return errSlowPath
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	fields, ok := typeFields[u.Type]
	if !ok {
		return nil, errSlowPath
	}
	for _, k := range keys {
		if !fields[k] {
			return nil, errSlowPath
		}
	}
	return u, nil
}

func (r *fastReader) ws() {
	for r.i < len(r.data) {
		switch r.data[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

func (r *fastReader) expect(c byte) bool {
	r.ws()
	if r.i < len(r.data) && r.data[r.i] == c {
		r.i++
		return true
	}
	return false
}

// object reads {"key": value, ...}, calling field for each key with the
// reader positioned at its value.
func (r *fastReader) object(field func(key string) error) error {
	if !r.expect('{') {
		return errSlowPath
	}
	if r.expect('}') {
		return nil
	}
	for {
		key, err := r.str()
		if err != nil {
			return err
		}
		if !r.expect(':') {
			return errSlowPath
		}
		if err := field(key); err != nil {
			return err
		}
		if r.expect(',') {
			continue
		}
		if r.expect('}') {
			return nil
		}
		return errSlowPath
	}
}

func (r *fastReader) array(elem func() error) error {
	if !r.expect('[') {
		return errSlowPath
	}
	if r.expect(']') {
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if r.expect(',') {
			continue
		}
		if r.expect(']') {
			return nil
		}
		return errSlowPath
	}
}

func (r *fastReader) strings() ([]string, error) {
	out := []string{}
	err := r.array(func() error {
		s, err := r.str()
		out = append(out, s)
		return err
	})
	return out, err
}

func (r *fastReader) strp() (*string, error) {
	s, err := r.str()
	return &s, err
}

// str reads a string. Escapes other than \u are unescaped here; a \u, a
// control character or invalid UTF-8 sends the whole declaration the slow
// way.
func (r *fastReader) str() (string, error) {
	if !r.expect('"') {
		return "", errSlowPath
	}
	start := r.i
	var buf []byte
	for r.i < len(r.data) {
		c := r.data[r.i]
		switch {
		case c == '"':
			var s []byte
			if buf == nil {
				s = r.data[start:r.i]
			} else {
				s = append(buf, r.data[start:r.i]...)
			}
			r.i++
			if !utf8.Valid(s) {
				return "", errSlowPath
			}
			return string(s), nil
		case c < 0x20:
			return "", errSlowPath
		case c == '\\':
			if r.i+1 >= len(r.data) {
				return "", errSlowPath
			}
			buf = append(buf, r.data[start:r.i]...)
			switch r.data[r.i+1] {
			case '"', '\\', '/':
				buf = append(buf, r.data[r.i+1])
			case 'n':
				buf = append(buf, '\n')
			case 't':
				buf = append(buf, '\t')
			case 'r':
				buf = append(buf, '\r')
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			default:
				return "", errSlowPath
			}
			r.i += 2
			start = r.i
		default:
			r.i++
		}
	}
	return "", errSlowPath
}

// int reads a plain integer: digits with an optional minus, nothing else.
func (r *fastReader) int() (int, error) {
	r.ws()
	start := r.i
	if r.i < len(r.data) && r.data[r.i] == '-' {
		r.i++
	}
	digits := r.i
	for r.i < len(r.data) && r.data[r.i] >= '0' && r.data[r.i] <= '9' {
		r.i++
	}
	n := r.i - digits
	if n == 0 || n > 15 || (n > 1 && r.data[digits] == '0') {
		return 0, errSlowPath
	}
	if r.i < len(r.data) {
		switch r.data[r.i] {
		case '.', 'e', 'E':
			return 0, errSlowPath
		}
	}
	v, err := strconv.Atoi(string(r.data[start:r.i]))
	if err != nil || (v < 0 && r.data[start] != '-') {
		return 0, errSlowPath
	}
	return v, nil
}

func (r *fastReader) bool() (bool, error) {
	r.ws()
	switch {
	case len(r.data)-r.i >= 4 && string(r.data[r.i:r.i+4]) == "true":
		r.i += 4
		return true, nil
	case len(r.data)-r.i >= 5 && string(r.data[r.i:r.i+5]) == "false":
		r.i += 5
		return false, nil
	}
	return false, errSlowPath
}
