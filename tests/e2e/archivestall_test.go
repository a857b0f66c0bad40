package e2e

import (
	"archive/tar"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// archive put outlasts a broker that stalls mid-put, as a busy control
// machine's does: serve (its embedded broker inside) is stopped for 7 s
// while the chunks go in, longer than the 5 s nats.go gives each chunk's
// acknowledgement by default; the put waits, and stores the archive.
func TestArchivePutOutlastsAStall(t *testing.T) {
	m := newBareMesh(t)
	serve := m.procs[0]
	file := filepath.Join(m.base, "big.tar")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	body := make([]byte, 48<<20)
	rand.Read(body)
	tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	f.Close()

	put := exec.Command(m.binary("mesh-control"), "archive", "put", file, "--dir", m.ctl, "--json")
	out := &strings.Builder{}
	put.Stdout, put.Stderr = out, out
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	serve.Process.Signal(syscall.SIGSTOP)
	time.Sleep(7 * time.Second)
	serve.Process.Signal(syscall.SIGCONT)
	if err := put.Wait(); err != nil {
		t.Fatalf("archive put across a 7 s stall: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), `"sha256"`) {
		t.Fatalf("archive put: %s", out)
	}
}
