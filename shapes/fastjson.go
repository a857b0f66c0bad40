package shapes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A declaration is read on every apply, and a thousand resources through
// encoding/json's reflection cost more than observing the thousand files
// they describe. fastDecode reads the plain JSON a control plane writes
// (objects, arrays, strings with the usual escapes, integers, booleans)
// straight into each resource's own shape, with the strictness checkKeys
// adds on the slow path built in: keys exact, none twice, each resource
// carrying only its own shape's fields.
//
// Anything else — null, a number with a fraction or exponent, a \u escape,
// invalid UTF-8, a key it does not know, a duplicate — makes it give up
// with errSlowPath, and the declaration is read by encoding/json, whose
// errors say precisely what is wrong. It never decides that a declaration
// is bad; only encoding/json and checkKeys do. FuzzFastDecode holds the two
// paths to the same result on every input the fast one accepts.

var errSlowPath = errors.New("shapes: not plain; read by encoding/json")

// fastReader reads one declaration. The text is converted to a string once,
// and every string without an escape is a slice of it: a thousand
// resources cost no allocation per key or value. Each resource is read into
// a scratch value and only its own shape is allocated; the pointers of
// optional strings come from a small pool.
type fastReader struct {
	data string
	raw  []byte // the same text, for the byte searches of str
	i    int
	strs []string // pool: the targets of content, bytes and sealed
}

func fastDecode(data []byte) (*unionDeclaration, error) {
	// One check of the whole text instead of one per string: a string
	// holding invalid UTF-8 would go the slow way anyway, and outside
	// strings only ASCII is valid JSON.
	if !utf8.Valid(data) {
		return nil, errSlowPath
	}
	r := &fastReader{data: string(data), raw: data}
	var d unionDeclaration
	seen := uint16(0)
	err := r.object(func(key string) error {
		bit := topBit(key)
		if bit == 0 || seen&bit != 0 {
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
			// An unsigned field: encoding/json refuses any minus sign,
			// "-0" too.
			if r.ws(); r.i < len(r.data) && r.data[r.i] == '-' {
				return errSlowPath
			}
			var v int
			v, err = r.int()
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
			// Roughly one resource per 200 bytes is what a control plane
			// writes for small files; a guess, only to size the slice.
			d.shaped = make([]Resource, 0, min(len(data)/200+1, 4096))
			err = r.array(func() error {
				res, err := r.resource()
				d.shaped = append(d.shaped, res)
				return err
			})
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r.ws()
	if r.i != len(r.data) {
		return nil, errSlowPath
	}
	return &d, nil
}

// topBit is the bit of a top-level key in fastDecode's set of keys seen,
// or 0 for a key it does not read.
func topBit(key string) uint16 {
	switch key {
	case "version":
		return 1
	case "node":
		return 2
	case "enrolment":
		return 4
	case "seq":
		return 8
	case "adopted":
		return 16
	case "taken":
		return 32
	case "owns_nothing":
		return 64
	case "retire":
		return 128
	case "resources":
		return 256
	}
	return 0
}

// resourceKeys are the keys resource reads, by bit: keyBit and
// typeKeyMask speak of a key by its index here.
var resourceKeys = [...]string{"module", "id", "type", "path", "content", "bytes", "sealed", "mode",
	"owner", "run", "verify", "timeout", "unit", "state", "enabled", "restart_on", "name", "version",
	"shell", "home", "groups", "url", "sha256", "destination", "image", "command", "network", "ports",
	"mounts", "interface", "address", "listen_port", "port", "protocol", "from"}

// typeKeyMask is, per shape, the set of resourceKeys its fields allow: the
// three of Base and the shape's own. A shape with a field the fast reader
// does not read (env, peers) simply has no bit for it; such a key sends the
// declaration the slow way. Written out rather than derived from the
// shapes by reflection at every start; TestTypeKeyMaskMatchesTheShapes
// holds it to typeFields.
var typeKeyMask = map[string]uint64{
	TypeFile:      keyMask("path", "content", "bytes", "sealed", "mode", "owner"),
	TypeDirectory: keyMask("path", "mode", "owner"),
	TypeAction:    keyMask("run", "verify", "timeout"),
	TypeService:   keyMask("unit", "state", "enabled", "restart_on"),
	TypePackage:   keyMask("name", "version"),
	TypeUser:      keyMask("name", "shell", "home", "groups"),
	TypeArchive:   keyMask("url", "sha256", "destination"),
	TypeContainer: keyMask("name", "image", "command", "ports", "mounts", "network"),
	TypeNetwork:   keyMask("name"),
	TypeOverlay:   keyMask("interface", "address", "listen_port"),
	TypeOpening:   keyMask("port", "protocol", "from", "path"),
	TypeRegion:    keyMask("path", "content"),
	TypeKeys:      keyMask("path"),
	TypeProcess:   keyMask("name", "state"),
}

// keyMask is the bits of module, id, type and the keys named.
func keyMask(keys ...string) uint64 {
	mask := uint64(0b111) // module, id, type
	for _, k := range keys {
		i := slices.Index(resourceKeys[:], k)
		if i < 0 {
			panic("shapes: the fast reader reads no key " + k)
		}
		mask |= 1 << i
	}
	return mask
}

// resource reads one resource into a scratch anyResource on the stack and
// returns it as its own shape: only the shape is allocated.
func (r *fastReader) resource() (Resource, error) {
	var scratch anyResource
	u := &scratch
	var keys uint64
	err := r.object(func(key string) error {
		var err error
		bit := -1
		switch key {
		case "module":
			bit = 0
			u.Module, err = r.str()
		case "id":
			bit = 1
			u.ID, err = r.str()
		case "type":
			bit = 2
			u.Type, err = r.str()
		case "path":
			bit = 3
			u.Path, err = r.str()
		case "content":
			bit = 4
			u.Content, err = r.strp()
		case "bytes":
			bit = 5
			u.Bytes, err = r.strp()
		case "sealed":
			bit = 6
			u.Sealed, err = r.strp()
		case "mode":
			bit = 7
			u.Mode, err = r.str()
		case "owner":
			bit = 8
			u.Owner, err = r.str()
		case "run":
			bit = 9
			u.Run, err = r.strings()
		case "verify":
			bit = 10
			u.Verify, err = r.strings()
		case "timeout":
			bit = 11
			u.Timeout, err = r.int()
		case "unit":
			bit = 12
			u.Unit, err = r.str()
		case "state":
			bit = 13
			u.State, err = r.str()
		case "enabled":
			bit = 14
			var b bool
			b, err = r.bool()
			u.Enabled = &b
		case "restart_on":
			bit = 15
			u.RestartOn, err = r.strings()
		case "name":
			bit = 16
			u.Name, err = r.str()
		case "version":
			bit = 17
			u.Version, err = r.str()
		case "shell":
			bit = 18
			u.Shell, err = r.str()
		case "home":
			bit = 19
			u.Home, err = r.str()
		case "groups":
			bit = 20
			u.Groups, err = r.strings()
		case "url":
			bit = 21
			u.URL, err = r.str()
		case "sha256":
			bit = 22
			u.SHA256, err = r.str()
		case "destination":
			bit = 23
			u.Destination, err = r.str()
		case "image":
			bit = 24
			u.Image, err = r.str()
		case "command":
			bit = 25
			u.Command, err = r.strings()
		case "network":
			bit = 26
			u.Network, err = r.str()
		case "ports":
			bit = 27
			u.Ports, err = r.strings()
		case "mounts":
			bit = 28
			u.Mounts, err = r.strings()
		case "interface":
			bit = 29
			u.Interface, err = r.str()
		case "address":
			bit = 30
			u.Address, err = r.str()
		case "listen_port":
			bit = 31
			u.ListenPort, err = r.int()
		case "port":
			bit = 32
			u.Port, err = r.int()
		case "protocol":
			bit = 33
			u.Protocol, err = r.str()
		case "from":
			bit = 34
			u.From, err = r.str()
		default:
			// env and peers, and anything unknown, go the slow way.
			return errSlowPath
		}
		if keys&(1<<bit) != 0 {
			return errSlowPath // the key twice
		}
		keys |= 1 << bit
		return err
	})
	if err != nil {
		return nil, err
	}
	allowed, ok := typeKeyMask[u.Type]
	if !ok || keys&^allowed != 0 {
		return nil, errSlowPath
	}
	res, ok := u.shape()
	if !ok {
		return nil, errSlowPath
	}
	return res, nil
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
	if len(r.strs) == cap(r.strs) {
		// Doubled up to 256 at a time: a one-file declaration takes one
		// string, not a 4 KiB slab (10,000 nodes parse one each, twice,
		// in a fan-out: 80 MB of slabs was a twentieth of the simulated
		// fleet's CPU in make bench-scale).
		r.strs = make([]string, 0, min(max(2*cap(r.strs), 4), 256))
	}
	r.strs = append(r.strs, s)
	return &r.strs[len(r.strs)-1], err
}

// str reads a string. Without an escape it is a slice of the text; escapes
// other than \u are unescaped into a new string; a \u or a control
// character sends the whole declaration the slow way. (UTF-8 was checked
// once, for the whole text.) Quotes and backslashes are found with
// bytes.IndexByte, and what lies between is checked a word at a time.
func (r *fastReader) str() (string, error) {
	if !r.expect('"') {
		return "", errSlowPath
	}
	var buf strings.Builder // grown once, and String() copies nothing
	for {
		rest := r.raw[r.i:]
		q := bytes.IndexByte(rest, '"')
		if q < 0 {
			return "", errSlowPath
		}
		b := bytes.IndexByte(rest[:q], '\\')
		if b < 0 {
			if hasControl(rest[:q]) {
				return "", errSlowPath
			}
			var s string
			if buf.Cap() == 0 {
				s = r.data[r.i : r.i+q]
			} else {
				buf.Write(rest[:q])
				s = buf.String()
			}
			r.i += q + 1
			return s, nil
		}
		if hasControl(rest[:b]) || b+1 >= len(rest) {
			return "", errSlowPath
		}
		if buf.Cap() == 0 {
			buf.Grow(q)
		}
		buf.Write(rest[:b])
		switch rest[b+1] {
		case '"', '\\', '/':
			buf.WriteByte(rest[b+1])
		case 'n':
			buf.WriteByte('\n')
		case 't':
			buf.WriteByte('\t')
		case 'r':
			buf.WriteByte('\r')
		case 'b':
			buf.WriteByte('\b')
		case 'f':
			buf.WriteByte('\f')
		default:
			return "", errSlowPath
		}
		r.i += b + 2
	}
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a
// time: x - 0x20 in each byte borrows (sets the top bit) exactly where the
// byte is below 0x20, given its own top bit is clear.
func hasControl(b []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-ones*0x20)&^x&highs != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
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
	v, err := strconv.Atoi(r.data[start:r.i])
	if err != nil || (v < 0 && r.data[start] != '-') {
		return 0, errSlowPath
	}
	return v, nil
}

func (r *fastReader) bool() (bool, error) {
	r.ws()
	switch {
	case len(r.data)-r.i >= 4 && r.data[r.i:r.i+4] == "true":
		r.i += 4
		return true, nil
	case len(r.data)-r.i >= 5 && r.data[r.i:r.i+5] == "false":
		r.i += 5
		return false, nil
	}
	return false, errSlowPath
}
