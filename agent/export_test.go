package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// MeasureClock is measureClock, for the tests that hold it to a real
// broker.
var MeasureClock = measureClock

// SmallDisk mounts a tmpfs of size on a directory of the test's (root, as
// make test runs), and returns it and fill, which takes its last byte (a
// file "filler" in it: removing it gives the room back).
func SmallDisk(t *testing.T, size string) (dir string, fill func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a full disk is a small tmpfs, mounted as root (make test runs as root)")
	}
	dir = t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir, func() {
		t.Helper()
		f, err := os.Create(filepath.Join(dir, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, size := range []int{4096, 1} {
			for buf := make([]byte, size); ; {
				if _, err := f.Write(buf); err != nil {
					break
				}
			}
		}
	}
}

// OnLinked has f called as the agent's handler of a link made (or made
// again) begins, before anything of it: a test holds it back there as a
// busy machine does.
func OnLinked(o *Options, f func()) { o.beforeLinked = f }
