// Package edit is how the host writes into a shared file without writing
// over it (ADR 0102): a region, a block of lines the mesh owns between two
// marker lines, and keys, the values of named keys in a configuration
// file. It is pure: bytes in, bytes out, the rest of the file kept byte for
// byte. The engine reads the file, asks here, and writes the result back
// atomically (executor/engine region.go, keys.go).
package edit

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Region is one resource's block in a file: between
//
//	<comment> BEGIN mesh <name>
//	<comment> END mesh <name>
//
// where name is the resource's "module.id". A marker is a whole line; a
// line of another resource's markers never matches, and the comment
// leader of a marker found is not compared (a declaration that changes it
// still finds its block).
type Region struct {
	Comment string // the leader written: "#", "//", ";"
	Name    string // module.id
}

// Begin and End are the marker lines written (without the newline).
func (g Region) Begin() string { return g.Comment + " BEGIN mesh " + g.Name }
func (g Region) End() string   { return g.Comment + " END mesh " + g.Name }

// Block is where a region is found: byte offsets into the file.
type Block struct {
	Start int // the BEGIN line's first byte
	Body  int // the first byte after the BEGIN line
	Tail  int // the END line's first byte
	End   int // the byte after the END line (its newline, or the file's end)
}

// line is one line of a file: [start, end) without its newline, next is
// where the following line starts.
type line struct{ start, end, next int }

func lines(data []byte) []line {
	var out []line
	for i := 0; i < len(data); {
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			out = append(out, line{i, len(data), len(data)})
			break
		}
		out = append(out, line{i, i + j, i + j + 1})
		i += j + 1
	}
	return out
}

// marker is shapes' marker grammar (one rule, validated there).
func marker(text []byte) (begin bool, name string, ok bool) { return shapes.ParseRegionMarker(text) }

// Find finds g's block in data. A file with no marker of g has none
// (found false). One BEGIN followed by one END is the block; anything
// else — a BEGIN without its END, two of either, an END first — is an
// error naming the lines, and the file is left to a person.
func (g Region) Find(data []byte) (Block, bool, error) {
	var begins, ends []int // line numbers, from 1
	var b Block
	for i, l := range lines(data) {
		begin, name, ok := marker(data[l.start:l.end])
		if !ok || name != g.Name {
			continue
		}
		if begin {
			begins = append(begins, i+1)
			b.Start, b.Body = l.start, l.next
		} else {
			ends = append(ends, i+1)
			b.Tail, b.End = l.start, l.next
		}
	}
	switch {
	case len(begins) == 0 && len(ends) == 0:
		return Block{}, false, nil
	case len(begins) == 1 && len(ends) == 1 && begins[0] < ends[0]:
		return b, true, nil
	}
	return Block{}, false, fmt.Errorf("the markers of %s are broken (BEGIN at %s, END at %s): not touched; a person has to look", g.Name, linesSaid(begins), linesSaid(ends))
}

// Normalise is a region's content as written: lines ending in a newline
// (a last line without one gets it).
func Normalise(content string) string {
	if content != "" && !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	return content
}

// Current returns the content of g's block in data, if found.
func (g Region) Current(data []byte) (content string, found bool, err error) {
	b, found, err := g.Find(data)
	if err != nil || !found {
		return "", found, err
	}
	return string(data[b.Body:b.Tail]), true, nil
}

// Set writes content (normalised) as g's block: in place of the block
// found, or appended at the file's end. When the file did not end in a
// newline, one is added before the appended block and addedNewline says
// so: giving the block back (Remove) takes it away again.
func (g Region) Set(data []byte, content string) (out []byte, addedNewline bool, err error) {
	content = Normalise(content)
	b, found, err := g.Find(data)
	if err != nil {
		return nil, false, err
	}
	block := g.Begin() + "\n" + content + g.End() + "\n"
	if found {
		out = make([]byte, 0, len(data)-(b.End-b.Start)+len(block))
		out = append(out, data[:b.Start]...)
		out = append(out, block...)
		return append(out, data[b.End:]...), false, nil
	}
	out = make([]byte, 0, len(data)+len(block)+1)
	out = append(out, data...)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		out, addedNewline = append(out, '\n'), true
	}
	return append(out, block...), addedNewline, nil
}

// Remove takes g's block and its markers out of data, and nothing else —
// but the newline Set added before it, when addedNewline says it did and
// the block is still the file's last thing. removed is false when there
// was no block.
func (g Region) Remove(data []byte, addedNewline bool) (out []byte, removed bool, err error) {
	b, found, err := g.Find(data)
	if err != nil || !found {
		return data, false, err
	}
	start := b.Start
	if addedNewline && b.End == len(data) && start > 0 && data[start-1] == '\n' {
		start--
	}
	out = make([]byte, 0, len(data)-(b.End-start))
	out = append(out, data[:start]...)
	return append(out, data[b.End:]...), true, nil
}

// Whole returns g's block in data as it stands, its marker lines
// included: what the host keeps of a block it found, to give it back byte
// for byte.
func (g Region) Whole(data []byte) (whole []byte, found bool, err error) {
	b, found, err := g.Find(data)
	if err != nil || !found {
		return nil, found, err
	}
	return bytes.Clone(data[b.Start:b.End]), true, nil
}

// Replace puts whole (a block Whole returned) in place of g's block in
// data, or at the end when data has none; the rest of the file is kept.
func (g Region) Replace(data, whole []byte) ([]byte, error) {
	b, found, err := g.Find(data)
	if err != nil {
		return nil, err
	}
	if !found {
		out := bytes.Clone(data)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		return append(out, whole...), nil
	}
	out := make([]byte, 0, len(data)-(b.End-b.Start)+len(whole))
	out = append(out, data[:b.Start]...)
	out = append(out, whole...)
	return append(out, data[b.End:]...), nil
}
