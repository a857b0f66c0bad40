package benchtree

import (
	"bytes"
	"strings"
	"testing"
)

// The driver relies on these properties: contents are exactly FileSize bytes,
// distinct, newline-terminated and plain enough to be a literal in JSON and in
// CFEngine alike; the drift picks distinct files that exist.
func TestTree(t *testing.T) {
	files := Files(1000)
	seen := map[string]bool{}
	for _, f := range append(files, One()) {
		if len(f.Content) != FileSize || f.Content[len(f.Content)-1] != '\n' {
			t.Fatalf("%s: %d bytes, want %d ending in a newline", f.Rel, len(f.Content), FileSize)
		}
		if bytes.ContainsAny(f.Content, "\"\\$@\r\t") || bytes.Count(f.Content, []byte("\n")) != 1 {
			t.Fatalf("%s: content is not plain: %q", f.Rel, f.Content)
		}
		if seen[string(f.Content)] {
			t.Fatalf("%s: content repeats another file's", f.Rel)
		}
		seen[string(f.Content)] = true
	}
	if !strings.HasPrefix(files[13].Rel, DirName(3)+"/") {
		t.Fatalf("file 13 is %s, want it in %s", files[13].Rel, DirName(3))
	}
	for _, n := range []int{MinFiles, 1000, 1001} {
		changed, deleted := Drift(n)
		picked := map[int]bool{}
		for _, i := range append(changed, deleted...) {
			if i < 0 || i >= n || picked[i] {
				t.Fatalf("Drift(%d): index %d out of range or picked twice", n, i)
			}
			picked[i] = true
		}
		if len(changed) != 10 || len(deleted) != 5 {
			t.Fatalf("Drift(%d): %d changed, %d deleted; want 10 and 5", n, len(changed), len(deleted))
		}
	}
}
