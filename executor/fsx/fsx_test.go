package fsx

import (
	"os"
	"path/filepath"
	"testing"
)

// The caching resolver agrees with Resolve through links in the middle, at
// the end, relative, absolute, and into paths that do not exist yet.
func TestResolverAgreesWithResolve(t *testing.T) {
	d := t.TempDir()
	os.MkdirAll(filepath.Join(d, "real/sub"), 0o755)
	os.Symlink("real", filepath.Join(d, "rel"))
	os.Symlink(filepath.Join(d, "real/sub"), filepath.Join(d, "abs"))
	os.Symlink("../real/sub/file", filepath.Join(d, "real/sub/../link-to-file"))
	os.WriteFile(filepath.Join(d, "real/sub/file"), nil, 0o644)
	r := Resolver()
	for _, p := range []string{
		d, d + "/real/sub/file", d + "/rel/sub/file", d + "/abs/file", d + "/abs/missing/deeper",
		d + "/real/link-to-file", d + "/rel", d + "/nothing/here",
	} {
		want, err1 := Resolve(p)
		got, err2 := r(p)
		if err1 != nil || err2 != nil || got != want {
			t.Errorf("%s: Resolver %q %v, Resolve %q %v", p, got, err2, want, err1)
		}
		// Asked twice: the same answer from the cache.
		if again, _ := r(p); again != got {
			t.Errorf("%s: second answer %q, first %q", p, again, got)
		}
	}
	if got, _ := Resolve(d + "/rel/sub/file"); got != d+"/real/sub/file" {
		t.Errorf("Resolve through a relative link = %q", got)
	}
}
