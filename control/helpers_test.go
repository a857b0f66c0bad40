package control_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
)

func quiet() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type served struct {
	keys   *control.Keys
	url    string
	srv    *control.Server
	client *control.Client
	stop   func()
}

// serve runs control.Serve with an embedded broker on a free port.
func serve(t *testing.T, dir, listen string) *served {
	t.Helper()
	return serveWith(t, dir, control.ServeOptions{Listen: listen})
}

// serveWith is serve with options of the test's own (its status page:
// UI); Log and Ready are serve's.
func serveWith(t *testing.T, dir string, o control.ServeOptions) *served {
	t.Helper()
	k, err := control.LoadKeys(dir)
	if err != nil {
		k, err = control.Init(dir, nil, "")
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	type up struct {
		url string
		srv *control.Server
	}
	ready := make(chan up, 1)
	done := make(chan error, 1)
	go func() {
		o.Log, o.Ready = quiet(), func(u string, s *control.Server) { ready <- up{u, s} }
		done <- control.Serve(ctx, k, o)
	}()
	var u up
	select {
	case u = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("serve did not come up")
	}
	c, err := control.Connect(ctx, k, u.url, quiet())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &served{keys: k, url: u.url, srv: u.srv, client: c}
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		c.Close()
		cancel()
		<-done
	}
	t.Cleanup(s.stop)
	return s
}

func connect(ctx context.Context, s *served) (*control.Client, error) {
	return control.Connect(ctx, s.keys, s.url, quiet())
}
