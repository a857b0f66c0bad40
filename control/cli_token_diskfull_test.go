package control_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fillDisk takes every byte the filesystem holding path has left, in
// one file at path. It allocates a megabyte at a time, then writes the
// last bytes: one fallocate of all that is free fails whole on tmpfs
// (the kernel gives back what it took) when the broker writes between
// the statfs and the fallocate, and the disk is then not full at all.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const chunk = 1 << 20
	var off int64
	for {
		err := unix.Fallocate(int(f.Fd()), 0, off, chunk)
		if errors.Is(err, unix.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatalf("filling %s: %v", path, err)
		}
		off += chunk
	}
	if _, err := f.Seek(off, 0); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	for {
		if _, err := f.Write(page); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			break
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	if left := st.Bavail * uint64(st.Bsize); left >= 1<<20 {
		t.Fatalf("filling %s: %d bytes still free", path, left)
	}
}

// The token and node commands on a full control disk, as the others:
// token list answers; token revoke and node delete are either taken (into
// room the broker's files had allocated ahead) or refused saying which
// disk is full; once there is room again they work, without a restart.
// The key directory is on a small tmpfs (root: mount).
func TestTokenAndNodeCommandsOnAFullDisk(t *testing.T) {
	dir := smallDisk(t)
	s := serve(t, dir, "127.0.0.1:0")
	// No deadline of the test's own, as a person runs a command: a write
	// the broker does not answer ends at the client's own time for it.
	cmd := func(args ...string) (string, string, int) {
		t.Helper()
		return run(t, context.Background(), append(args, "--dir", dir, "--nats", s.url)...)
	}
	enrolNode(t, s, "n1")
	var ids []string
	for _, name := range []string{"a", "b"} {
		out, errs, code := cmd("token", "issue", "--new", "--name", name)
		if code != 0 {
			t.Fatalf("token issue: %s", errs)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	if _, errs, code := cmd("node", "revoke", "n1"); code != 0 {
		t.Fatalf("node revoke: %s", errs)
	}

	filler := filepath.Join(dir, "filler")
	fillDisk(t, filler)
	full := "the disk holding " + filepath.Join(dir, "jetstream") + " is full"
	// Reads answer.
	if out, errs, code := cmd("token", "list"); code != 0 || !strings.Contains(out, "usable") {
		t.Fatalf("token list on a full disk: exit %d\n%s%s", code, out, errs)
	}
	// Writes are taken into the room the broker's files had allocated
	// ahead, until one is not: from then on the registry's stream takes
	// none (nats-server keeps its write error), and each write is refused
	// saying which disk is full.
	for n := 0; ; n++ {
		out, errs, code := cmd("token", "issue", "--new")
		if code == 0 {
			if n == 200 {
				t.Fatal("200 tokens issued on a full disk")
			}
			continue
		}
		if !strings.Contains(errs, full) {
			t.Fatalf("token issue on a full disk: exit %d, and it does not say %q:\n%s%s", code, full, out, errs)
		}
		break
	}
	if out, errs, code := cmd("token", "revoke", ids[0]); code != 1 || !strings.Contains(errs, full) {
		t.Errorf("token revoke on a full disk: exit %d, and it does not say %q:\n%s%s", code, full, out, errs)
	}
	if out, errs, code := cmd("node", "delete", "n1"); code != 1 || !strings.Contains(errs, full) {
		t.Errorf("node delete on a full disk: exit %d, and it does not say %q:\n%s%s", code, full, out, errs)
	} else {
		t.Logf("node delete on a full disk: %s", errs)
	}
	// Reads still answer.
	if out, errs, code := cmd("token", "list"); code != 0 || !strings.Contains(out, "usable") {
		t.Fatalf("token list on a full disk, writes refused: exit %d\n%s%s", code, out, errs)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, "token revoke once there is room again", func() bool {
		_, _, code := cmd("token", "revoke", ids[1])
		return code == 0
	})
	if out, errs, code := cmd("token", "revoke", ids[0]); code != 0 || !strings.Contains(out, "revoked") {
		t.Errorf("token revoke once there is room: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := cmd("node", "delete", "n1"); code != 0 || !strings.Contains(out, "node n1 deleted") {
		t.Errorf("node delete once there is room: exit %d\n%s%s", code, out, errs)
	}
	for _, id := range ids {
		if out, _, code := cmd("token", "revoke", id); code != 0 || !strings.Contains(out, "already revoked") {
			t.Errorf("token revoke %s again: exit %d\n%s", id, code, out)
		}
	}
}

// smallDisk is a key directory on a 48 MiB tmpfs of its own, to be filled
// (root: mount; the test fails saying so otherwise, as CI runs as root). It
// is unmounted after serve stops: cleanups run last first.
func smallDisk(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to mount a small tmpfs for the control side's disk")
	}
	dir := filepath.Join(t.TempDir(), "ctl")
	os.Mkdir(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}
