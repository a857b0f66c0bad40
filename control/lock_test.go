package control_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// A key directory is held by one serve: a second serve on it (another
// port, so the port cannot be what stops it) is refused before it opens
// the store, naming the serve that holds it and its pid, and so are init
// and StartServer; once the first stops, the directory is free again.
// (tests/e2e TestSecondServeLeavesTheStoreWhole shows, with real
// processes, that the store is untouched.)
func TestServeRefusesAHeldKeyDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := fmt.Sprintf("refused: another mesh-control serve (pid %d) holds %s; stop it first", os.Getpid(), dir)
	for _, args := range [][]string{
		{"serve", "--dir", dir, "--listen", "127.0.0.1:0"},
		{"init", "--dir", dir},
	} {
		out, errs, code := run(t, ctx, args...)
		if code != 1 || !strings.Contains(errs, "mesh-control "+args[0]+": "+want) {
			t.Fatalf("%v while a serve holds the directory: exit %d, want 1 saying %q\n%s%s", args, code, want, out, errs)
		}
	}
	var held *statedir.HeldError
	if _, err := control.StartServer(s.keys, "127.0.0.1:0", quiet()); !errors.As(err, &held) || held.PID != os.Getpid() || held.Dir != dir {
		t.Fatalf("StartServer on a held directory: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, control.FileLock)); err != nil || string(b) != fmt.Sprintf("%d mesh-control serve\n", os.Getpid()) {
		t.Fatalf("%s: %q %v", control.FileLock, b, err)
	}
	// Client commands take no lock: they talk to the broker.
	if out, errs, code := run(t, ctx, "nodes", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("nodes beside a serve: %d %s%s", code, out, errs)
	}
	s.stop()
	srv, err := control.StartServer(s.keys, "127.0.0.1:0", quiet())
	if err != nil {
		t.Fatalf("the directory after the serve stopped: %v", err)
	}
	srv.Shutdown()
	// A directory that is not there is one to init, not a lock to take.
	missing := filepath.Join(t.TempDir(), "none")
	if _, errs, code := run(t, ctx, "serve", "--dir", missing); code != 1 || !strings.Contains(errs, "run mesh-control init --dir "+missing) {
		t.Fatalf("serve on a missing directory: %d %s", code, errs)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve on a missing directory made it: %v", err)
	}
}
