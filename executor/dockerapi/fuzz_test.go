package dockerapi

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"
)

// FuzzReadResponse feeds the parser anything a hostile or broken runtime
// could send. Nothing may panic, a body never exceeds its limit, and the
// answer is the same whether the bytes come at once, split in two at an
// arbitrary point, or a byte at a time (NATS's FuzzParser habit).
func FuzzReadResponse(f *testing.F) {
	for _, a := range answers {
		f.Add([]byte(a.raw), uint16(len(a.raw)/2))
	}
	f.Fuzz(func(t *testing.T, raw []byte, at uint16) {
		const limit = 256
		s1, b1, e1 := parse(bytes.NewReader(raw), limit)
		cut := int(at) % (len(raw) + 1)
		s2, b2, e2 := parse(io.MultiReader(bytes.NewReader(raw[:cut]), bytes.NewReader(raw[cut:])), limit)
		s3, b3, e3 := parse(iotest.OneByteReader(bytes.NewReader(raw)), limit)
		if len(b1) > limit {
			t.Fatalf("a body of %d bytes past the limit %d", len(b1), limit)
		}
		if (e1 == nil) != (e2 == nil) || (e1 == nil) != (e3 == nil) || s1 != s2 || s1 != s3 || !bytes.Equal(b1, b2) || !bytes.Equal(b1, b3) {
			t.Fatalf("split delivery differs: %d %q %v / %d %q %v / %d %q %v", s1, b1, e1, s2, b2, e2, s3, b3, e3)
		}
		if e1 == nil && (s1 < 200 || s1 > 599) {
			t.Fatalf("status %d accepted", s1)
		}
	})
}
