package engine

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A user who owns the destination plants links and FIFOs where the archive
// will write: nothing is written through them, nothing outside changes,
// and nothing hangs.
func TestArchiveHostileDestination(t *testing.T) {
	victim := t.TempDir()
	os.WriteFile(filepath.Join(victim, "index.theme"), []byte("victim's\n"), 0o600)
	cases := []struct {
		name  string
		plant func(dest string)
		want  string
	}{
		{"a directory entry is a symlink to another directory", func(dest string) {
			os.Symlink(victim, filepath.Join(dest, "theme"))
		}, "is a symbolic link"},
		{"a file entry is a symlink to another file", func(dest string) {
			os.Mkdir(filepath.Join(dest, "theme"), 0o755)
			os.Symlink(filepath.Join(victim, "index.theme"), filepath.Join(dest, "theme/index.theme"))
		}, "is a symbolic link"},
		{"a file entry is a FIFO", func(dest string) {
			os.Mkdir(filepath.Join(dest, "theme"), 0o755)
			syscall.Mkfifo(filepath.Join(dest, "theme/index.theme"), 0o600)
		}, "is a special file"},
		{"the destination itself is a symlink", nil, "not a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			dest := h.p("home-theme")
			if c.plant == nil {
				os.Symlink(victim, dest)
			} else {
				os.Mkdir(dest, 0o755)
				os.Chown(dest, 65534, 65534)
				c.plant(dest)
			}
			p, sum := makeArchive(t, h.root, "t.tgz", theme...)
			rep := h.apply(h.doc(archiveRes(p, sum, dest)))
			if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, c.want) {
				t.Fatalf("%+v, want failure %q", rep.Lines, c.want)
			}
			ents, _ := os.ReadDir(victim)
			b, _ := os.ReadFile(filepath.Join(victim, "index.theme"))
			if len(ents) != 1 || string(b) != "victim's\n" {
				t.Fatalf("the victim changed: %v %q", ents, b)
			}
		})
	}
}
