package control_test

import (
	"context"
	"errors"
	"os"
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
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := smallDisk(t)
	filler := filepath.Join(full, "filler")
	fillDisk(t, filler)

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

// An init the disk cut short leaves no key half written: run again once
// there is room, it makes the control side's keys, not "exists".
func TestAnInitCutShortByAFullDiskCanBeRunAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := smallDisk(t)
	filler := filepath.Join(full, "filler")
	fillDisk(t, filler)
	os.Truncate(filler, func() int64 { fi, _ := os.Stat(filler); return fi.Size() - 6<<10 }()) // the first files fit, a later one does not
	dir := filepath.Join(full, "ctl")
	if _, errs, code := run(t, ctx, "init", "--dir", dir); code == 0 {
		t.Fatalf("init on a full disk: exit 0: %s", errs)
	}
	os.Remove(filler)
	if _, errs, code := run(t, ctx, "init", "--dir", dir); code != 0 {
		t.Fatalf("init once there is room: exit %d: %s", code, errs)
	}
}

// A node add refused — a name no node may have, a node registered
// already — leaves nothing on the disk: not the directory its files
// would have gone to.
func TestANodeAddRefusedMakesNothing(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	where := t.TempDir()
	if _, errs, code := run(t, ctx, "node", "add", "web1", "--dir", dir, "--nats", s.url, "--out", filepath.Join(where, "first", "agent.json")); code != 0 {
		t.Fatalf("node add: exit %d: %s", code, errs)
	}
	for _, c := range []struct{ name, say string }{
		{"Bad_Name!", "only a-z"},
		{"web1", "already"},
	} {
		out := filepath.Join(where, "again", c.name, "agent.json")
		_, errs, code := run(t, ctx, "node", "add", c.name, "--dir", dir, "--nats", s.url, "--out", out)
		if code == 0 || !strings.Contains(errs, c.say) {
			t.Fatalf("node add %s: exit %d: %s", c.name, code, errs)
		}
		if _, err := os.Stat(filepath.Join(where, "again")); !os.IsNotExist(err) {
			t.Fatalf("node add %s, refused, made its directory: %v", c.name, err)
		}
	}
	// Files that cannot go where --out says are said before the node is
	// registered.
	file := filepath.Join(where, "a-file")
	os.WriteFile(file, nil, 0o644)
	_, errs, code := run(t, ctx, "node", "add", "web2", "--dir", dir, "--nats", s.url, "--out", filepath.Join(file, "w", "agent.json"))
	if code == 0 || !strings.Contains(errs, "--out") || !strings.Contains(errs, "is not a directory") {
		t.Fatalf("node add --out under a file: exit %d: %s", code, errs)
	}
	if _, _, err := s.client.Node(ctx, "web2"); err == nil {
		t.Fatal("web2 registered though its files could not be written")
	}
}
