package edit

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Format is how a configuration file writes a key and its value.
type Format int

// The formats.
const (
	// Equals: "key = value" or "key=value" (sysctl.conf, environment
	// files). Keys compare exactly; lines starting with # or ; are
	// comments. In a file with INI sections the global part ends at the
	// first section's "[name]" line, and a key is looked for, and added,
	// only before it: a key added at the end would be the last section's,
	// and a key found in a section is that section's, not the file's.
	Equals Format = iota + 1
	// Space: "Key value" (sshd_config). Keys compare without case, as
	// sshd's do; lines starting with # are comments; the file's global
	// part ends at its first "Match" line, and a key is looked for, and
	// added, only before it (a key set after a Match would be the Match
	// block's).
	Space
)

// ParseFormat reads a format's name ("equals", "space").
func ParseFormat(s string) (Format, bool) {
	switch s {
	case "equals":
		return Equals, true
	case "space":
		return Space, true
	}
	return 0, false
}

func (f Format) String() string {
	switch f {
	case Equals:
		return "equals"
	case Space:
		return "space"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// keyLine is one key's line: the key as written, and where its value is.
type keyLine struct {
	key              string
	line             line
	valStart, valEnd int // the value's bytes, surrounding blanks left out
	// bare: a key of the space format with nothing after it, not even a
	// blank; a value set there needs its separator.
	bare bool
}

// Keys is a configuration file read for its keys.
type Keys struct {
	data   []byte
	format Format
	keys   map[string]*keyLine // by comparison form
	// global is where a key is added: the end of the file, or (Space)
	// the start of the first Match line.
	global int
	// dups names keys found more than once, with their line numbers.
	dups map[string][]int
	// sep is how the file's first key line sets its key apart from its
	// value ("=", " = ", "\t"), which a key the host adds follows: a
	// shell-sourced file of "a=1" lines is never given "b = 2". "" when
	// the file has no key line yet.
	sep string
}

func (f Format) fold(key string) string {
	if f == Space {
		return strings.ToLower(key)
	}
	return key
}

func blank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// ParseKeys reads data's keys in format f. It never fails: a line that is
// not a key line (a comment, a blank, anything without a key) is kept as
// it is and never looked at again.
func ParseKeys(data []byte, f Format) *Keys {
	k := &Keys{data: data, format: f, keys: map[string]*keyLine{}, global: len(data), dups: map[string][]int{}}
	for i, l := range lines(data) {
		s := l.start
		for s < l.end && blank(data[s]) {
			s++
		}
		if s == l.end || data[s] == '#' || (f == Equals && data[s] == ';') {
			continue
		}
		if f == Equals && data[s] == '[' {
			k.global = l.start // the first INI section: the global part ends
			return k
		}
		var key string
		var vs int
		switch f {
		case Equals:
			eq := bytes.IndexByte(data[s:l.end], '=')
			if eq < 0 {
				continue
			}
			name := bytes.TrimRight(data[s:s+eq], " \t")
			if len(name) == 0 || bytes.ContainsAny(name, " \t") {
				continue // "export X=1", a sentence with an "=": not a key line
			}
			key, vs = string(name), s+eq+1
		case Space:
			e := s
			for e < l.end && !blank(data[e]) {
				e++
			}
			key, vs = string(data[s:e]), e
			if strings.EqualFold(key, "Match") {
				k.global = l.start
				return k
			}
		}
		sepStart := s + len(key)
		for vs < l.end && blank(data[vs]) {
			vs++
		}
		if k.sep == "" && vs < l.end && vs > sepStart {
			k.sep = string(data[sepStart:vs])
		}
		ve := l.end
		for ve > vs && blank(data[ve-1]) {
			ve--
		}
		fk := f.fold(key)
		if prev, dup := k.keys[fk]; dup {
			if len(k.dups[fk]) == 0 {
				k.dups[fk] = []int{lineNumber(data, prev.line.start)}
			}
			k.dups[fk] = append(k.dups[fk], i+1)
			continue
		}
		k.keys[fk] = &keyLine{key: key, line: l, valStart: vs, valEnd: ve, bare: f == Space && vs == s+len(key)}
	}
	return k
}

func lineNumber(data []byte, off int) int { return bytes.Count(data[:off], []byte("\n")) + 1 }

// linesSaid says line numbers as a person reads them: "no line", "line
// 3", "lines 1 and 3", "lines 1, 2 and 5".
func linesSaid(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	switch len(s) {
	case 0:
		return "no line"
	case 1:
		return "line " + s[0]
	}
	return "lines " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// Get returns key's value, whether it is there, or an error when it is
// there more than once (which one holds is the program's to say, not the
// host's).
func (k *Keys) Get(key string) (value string, present bool, err error) {
	fk := k.format.fold(key)
	if d := k.dups[fk]; len(d) > 0 {
		return "", false, fmt.Errorf("%s is set %d times (%s): refused; a person has to say which one holds", key, len(d), linesSaid(d))
	}
	l, ok := k.keys[fk]
	if !ok {
		return "", false, nil
	}
	return string(k.data[l.valStart:l.valEnd]), true, nil
}

// Change is one key to set (Value) or to take out (Remove).
type Change struct {
	Key    string
	Value  string
	Remove bool
}

// Apply makes every change at once and returns the new file: a value is
// replaced where it stands (the key as written, its separator and
// spacing, whatever follows the value kept); a key not there is added —
// at the end (Equals) or before the first Match line (Space), in the
// order given; a key to remove loses its whole line. A key there twice is
// refused, by name, before anything.
func (k *Keys) Apply(changes []Change) ([]byte, error) {
	type edit struct {
		start, end int
		text       string
	}
	var edits []edit
	var added strings.Builder
	for _, c := range changes {
		if _, _, err := k.Get(c.Key); err != nil {
			return nil, err
		}
		l, present := k.keys[k.format.fold(c.Key)]
		switch {
		case c.Remove && present:
			edits = append(edits, edit{l.line.start, l.line.next, ""})
		case c.Remove:
		case present && l.bare:
			edits = append(edits, edit{l.valStart, l.valEnd, " " + c.Value})
		case present:
			edits = append(edits, edit{l.valStart, l.valEnd, c.Value})
		default:
			added.WriteString(k.Line(c.Key, c.Value))
			added.WriteByte('\n')
		}
	}
	if added.Len() > 0 {
		text := added.String()
		if k.global == len(k.data) && len(k.data) > 0 && k.data[len(k.data)-1] != '\n' {
			text = "\n" + text
		}
		edits = append(edits, edit{k.global, k.global, text})
	}
	// In the file's order; an insertion at the global point after a
	// removal that ends there.
	for i := 1; i < len(edits); i++ {
		for j := i; j > 0 && (edits[j].start < edits[j-1].start || edits[j].start == edits[j-1].start && edits[j].end < edits[j-1].end); j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	var out bytes.Buffer
	at := 0
	for _, e := range edits {
		out.Write(k.data[at:e.start])
		out.WriteString(e.text)
		at = e.end
	}
	out.Write(k.data[at:])
	return out.Bytes(), nil
}

// Check says whether data, read in format f, holds every change: each key
// set holds its value once, each key removed is not there. The engine asks
// it of a file's new content before writing it, and of the file after: a
// change that could never be read back is refused before the file is
// touched, instead of being written again at every apply.
func Check(data []byte, f Format, changes []Change) error {
	kf := ParseKeys(data, f)
	for _, c := range changes {
		v, present, err := kf.Get(c.Key)
		switch {
		case err != nil:
			return err
		case c.Remove && present:
			return fmt.Errorf("%s is still there", c.Key)
		case !c.Remove && (!present || v != c.Value):
			return fmt.Errorf("%s holds %q, not %q", c.Key, v, c.Value)
		}
	}
	return nil
}

// Line is how a key the host adds is written: as the file's first key
// line sets its key apart, or, in a file with none yet, "key = value"
// (equals) or "key value" (space).
func (k *Keys) Line(key, value string) string {
	switch {
	case k.sep != "":
		return key + k.sep + value
	case k.format == Space:
		return key + " " + value
	}
	return key + " = " + value
}
