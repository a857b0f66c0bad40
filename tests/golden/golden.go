// Package golden finds the golden files of the formats kept on disk: in a
// package's testdata/formats, a directory for each shape a release wrote,
// named by the commit whose code wrote it. A golden is never changed or
// removed; a release that writes a new shape adds one, and its test says
// what it holds. One rule, checked by the tests of every format.
package golden

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Dir is where a package's goldens are, from its own directory.
const Dir = "testdata/formats"

// Releases checks that Dir holds a directory for each of named, and none
// other: a golden no test reads proves nothing, and one a test names but
// lacks is a release whose files are not read. It returns named, sorted.
func Releases(t testing.TB, named ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(Dir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	for _, d := range dirs {
		if !slices.Contains(named, d) {
			t.Errorf("%s/%s is not read by the test: say what it holds", Dir, d)
		}
	}
	for _, n := range named {
		if !slices.Contains(dirs, n) {
			t.Errorf("%s/%s is named by the test but not there", Dir, n)
		}
	}
	named = slices.Clone(named)
	slices.Sort(named)
	return named
}

// Each runs read on each golden of goldens (what each release's holds,
// by release), once Releases has checked them against Dir.
func Each[T any](t *testing.T, goldens map[string]T, read func(t *testing.T, release string, want T)) {
	t.Helper()
	for _, r := range Releases(t, slices.Collect(maps.Keys(goldens))...) {
		t.Run(r, func(t *testing.T) { read(t, r, goldens[r]) })
	}
}

// Path is the file name in the golden of release.
func Path(release, name string) string { return filepath.Join(Dir, release, name) }
