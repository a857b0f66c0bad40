package engine

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
)

// The target a declaration is applied from is on the disk before the
// caller moves the sequence floor (Options.Accepted): a power cut just
// after the floor moved must find the declaration it names, which the
// start's reconcile then applies. Else the floor names a declaration the
// disk never got: it is never applied, and said applied when the agent
// hands it over again.
//
// The state is on an ext4 image mounted through a loop device with
// delayed allocation left to the writeback (noauto_da_alloc); the image
// file is copied at the instant Accepted is called — what reaches the
// image is what ext4 handed to its disk, so the copy is what a power cut
// there leaves — and the copy, mounted, must hold the new target.
func TestTheTargetIsOnTheDiskBeforeTheFloorMoves(t *testing.T) {
	h := newHarness(t)
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (e2fsprogs, mount; tests/install-deps.sh installs them): a power cut is played on a filesystem image: %v", tool, err)
		}
	}
	dir := t.TempDir()
	img, cut := filepath.Join(dir, "state.img"), filepath.Join(dir, "cut.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mount := func(img, at string, opts string) {
		t.Helper()
		if err := os.MkdirAll(at, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "ext4", "-o", opts, img, at).CombinedOutput(); err != nil {
			t.Fatalf("mount %s on %s (a loop device, as root): %v\n%s", img, at, err, out)
		}
		t.Cleanup(func() { exec.Command("umount", at).Run() })
	}
	mount(img, h.state, "loop,noauto_da_alloc")
	if err := os.Chmod(h.state, 0o700); err != nil {
		t.Fatal(err)
	}

	// A first declaration, made durable, as a node's earlier applies were.
	h.expect(h.run(store.Link, h.doc(dirEtc), false), "applied", "base.etc=applied")
	if out, err := exec.Command("sync", "-f", h.state).CombinedOutput(); err != nil {
		t.Fatalf("sync: %v\n%s", err, out)
	}

	doc := h.doc(dirEtc, fileMot)
	d, st := h.open(doc, false)
	copied := false
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Link, Accepted: func() error {
		copyImage(t, img, cut)
		copied = true
		return nil
	}})
	st.Unlock()
	h.expect(rep, "applied", "base.etc=unchanged base.motd=applied")
	if !copied {
		t.Fatal("Accepted was never called")
	}
	after := filepath.Join(dir, "after")
	mount(cut, after, "loop")
	got, err := os.ReadFile(filepath.Join(after, "target-link.json"))
	if err != nil {
		t.Fatalf("after a power cut as the floor moves: %v", err)
	}
	if string(got) != doc {
		t.Fatalf("after a power cut as the floor moves, the target on the disk is\n%s\nnot the declaration the floor names\n%s", got, doc)
	}
}

// copyImage copies the image src to dst as it is now.
func copyImage(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
