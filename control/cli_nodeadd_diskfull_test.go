package control_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// node add whose files cannot be written (a full disk where they go)
// leaves no node registered: the agent's config holds the node's seed,
// made there and kept nowhere else, and the command run again once there
// is room must not be told the node exists.
func TestANodeAddThatCannotWriteItsFilesRegistersNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to mount a small tmpfs to fill")
	}
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := filepath.Join(t.TempDir(), "full")
	os.Mkdir(full, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", full).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", full).Run() })
	filler := filepath.Join(full, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	f.Close()

	out := filepath.Join(full, "web1", "agent.json")
	_, errs, code := run(t, ctx, "node", "add", "web1", "--dir", dir, "--nats", s.url, "--out", out)
	if code == 0 || !strings.Contains(errs, "node web1 is not registered") {
		t.Fatalf("node add on a full disk: exit %d: %s", code, errs)
	}
	if _, _, err := s.client.Node(ctx, "web1"); !errors.Is(err, jetstream.ErrKeyNotFound) && (err == nil || !strings.Contains(err.Error(), "no node")) {
		t.Fatalf("web1 after a node add that wrote nothing: %v", err)
	}
	os.Remove(filler)
	if _, errs, code := run(t, ctx, "node", "add", "web1", "--dir", dir, "--nats", s.url, "--out", out); code != 0 {
		t.Fatalf("node add once there is room: exit %d: %s", code, errs)
	}
	if rec, _, err := s.client.Node(ctx, "web1"); err != nil || rec.NKey == "" {
		t.Fatalf("web1 once added: %+v %v", rec, err)
	}
}
