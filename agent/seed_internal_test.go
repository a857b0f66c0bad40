package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The agent's NKey is kept whole or not at all. A disk full when it is
// made leaves no file (once, an empty one that no start could read: the
// agent off for good), and the agent waits for room rather than exit; an
// empty file an earlier release left so is made anew; a seed that is not
// one is refused, never replaced.
func TestTheAgentsKeyIsKeptWholeOrNotAtAll(t *testing.T) {
	dir, fill := SmallDisk(t, "64k")
	fill()
	filler := filepath.Join(dir, "filler")
	seed := filepath.Join(dir, seedFile)
	if _, err := hostedKey(dir); err == nil {
		t.Fatal("a key made on a full disk said kept")
	}
	if _, err := os.Lstat(seed); !os.IsNotExist(err) {
		t.Fatalf("a key not kept left a file: %v", err)
	}
	// Waited for: room comes, the key is kept.
	o := Options{StateDir: dir, Log: slog.New(slog.DiscardHandler)}
	go func() { time.Sleep(time.Second); os.Remove(filler) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kp, err := keptKey(ctx, o, true)
	if err != nil || kp == nil {
		t.Fatalf("waiting for room: %v %v", kp, err)
	}
	again, err := hostedKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := kp.PublicKey(); func() string { b, _ := again.PublicKey(); return b }() != a {
		t.Fatal("the key kept is not the key read back")
	}
	// An empty file: made anew. One that is no seed: refused.
	os.WriteFile(seed, nil, 0o600)
	if _, err := hostedKey(dir); err != nil {
		t.Fatalf("an empty seed file: %v", err)
	}
	if b, _ := os.ReadFile(seed); !strings.HasPrefix(string(b), "SU") {
		t.Fatalf("an empty seed file was not made anew: %q", b)
	}
	os.WriteFile(seed, []byte("not a seed\n"), 0o600)
	if _, err := hostedKey(dir); err == nil {
		t.Fatal("a seed file that is no seed was taken")
	}
}
