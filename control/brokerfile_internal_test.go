package control

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// The existing broker's configuration follows more than the registry's
// changes: a token's one-time credential leaves it when the token stops
// being usable, with nothing else changing.
func TestBrokerFileDropsAnExpiredTokensCredential(t *testing.T) {
	dir := t.TempDir()
	k, err := Init(filepath.Join(dir, "keys"), nil, "tls://127.0.0.1:14222")
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "broker.conf")
	write, err := brokerFile(k, ServeOptions{BrokerConfig: conf}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const cred = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
	// Usable for one more second: issued long ago, inside its grace.
	tok := &TokenRecord{ID: "t1", Credential: cred, Expires: time.Now().Add(-tokenGrace + time.Second)}
	write(nil, []*TokenRecord{tok})
	if b, _ := os.ReadFile(conf); !strings.Contains(string(b), cred) {
		t.Fatalf("a usable token's credential is not in the configuration:\n%s", b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(conf)
		if !strings.Contains(string(b), cred) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an expired token's credential stayed in the broker's configuration")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A pid file someone else could have written is not believed: it could
// name any process to signal.
func TestBrokerPIDFileMustBeOurs(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "broker.pid")
	os.WriteFile(p, []byte("1234567\n"), 0o644)
	os.Chmod(p, 0o666)
	if err := signalReload(p); err == nil || !strings.Contains(err.Error(), "not believed") {
		t.Fatalf("a world-writable pid file: %v", err)
	}
	if os.Geteuid() == 0 {
		os.Chmod(p, 0o644)
		os.Chown(p, 12345, 12345)
		if err := signalReload(p); err == nil || !strings.Contains(err.Error(), "not believed") {
			t.Fatalf("another user's pid file: %v", err)
		}
	}
}

// Every broker the control side makes or configures fsyncs a JetStream
// write before acknowledging it (sync_interval: always): the embedded one
// as it runs, and each configuration broker-config writes — one server's
// and each server's of a cluster — read by nats-server's own parser.
func TestEveryBrokerSyncsBeforeItAcknowledges(t *testing.T) {
	dir, k, s := embeddedBroker(t)
	js := s.ns.JetStreamConfig()
	s.Shutdown()
	if js == nil || !js.SyncAlways {
		t.Errorf("the embedded broker acknowledges before it syncs: %+v", js)
	}

	confs := map[string]string{"broker-config": BrokerConfig(k, "127.0.0.1", 14222, nil, nil, true)}
	servers, err := ParseCluster("127.0.0.1:14222,127.0.0.1:14223,127.0.0.1:14224", "127.0.0.1:16222,127.0.0.1:16223,127.0.0.1:16224")
	if err != nil {
		t.Fatal(err)
	}
	cdir := filepath.Join(dir, "cluster")
	os.MkdirAll(cdir, 0o700)
	if err := os.WriteFile(filepath.Join(cdir, AccountsFile), []byte(AccountsConfig(k, nil, nil, true)), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, rk, err := RouteCertificate(servers)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, RouteCertFile), rc, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, RouteCAFile), rc, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, RouteKeyFile), rk, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, sv := range servers {
		conf, err := ClusterConfig(k, servers, i, cdir, filepath.Join(dir, "store"), "sekrit")
		if err != nil {
			t.Fatal(err)
		}
		confs["broker-config --cluster, "+sv.Name] = conf
	}
	// Operator mode (--resolver), one server's and a cluster's.
	if _, err := MakeOperator(k.Dir); err != nil {
		t.Fatal(err)
	}
	ko, err := LoadKeys(k.Dir)
	if err != nil || ko.Operator == nil {
		t.Fatalf("the operator keys made are not loaded: %v", err)
	}
	rconf, err := ko.ResolverConfig(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	confs["broker-config --resolver"] = serverConfig(ko, "mesh-control", "127.0.0.1", 14222, filepath.Join(dir, "store")) + rconf
	for i, sv := range servers {
		conf, err := ClusterConfig(ko, servers, i, cdir, filepath.Join(dir, "store"), "sekrit")
		if err != nil {
			t.Fatal(err)
		}
		confs["broker-config --cluster --resolver, "+sv.Name] = conf
	}
	for name, conf := range confs {
		path := filepath.Join(cdir, strings.NewReplacer(" ", "", ",", "-").Replace(name)+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		switch {
		case err != nil:
			t.Errorf("%s: nats-server refuses the configuration: %v\n%s", name, err, conf)
		case !opts.SyncAlways:
			t.Errorf("%s: JetStream acknowledges before it syncs (no sync_interval: always):\n%s", name, conf)
		}
	}
}

// A command that fails in the seconds after the broker's store was opened
// anew is told so (serve's answer on StoreSubject, which the CLI puts
// before the error), where the broker's own answer was a bare timeout;
// once the store has settled, nothing is said.
func TestAFailureRightAfterTheStoreReopensIsExplained(t *testing.T) {
	_, _, s := embeddedBroker(t)
	defer s.Shutdown()
	if p := s.Problem(); p != nil {
		t.Fatalf("a fresh store has a problem: %v", p)
	}
	if err := s.reopen(); err != nil {
		t.Fatal(err)
	}
	var re *ReopenedError
	if p := s.Problem(); !errors.As(p, &re) || !strings.Contains(p.Error(), "opened anew") || !strings.Contains(p.Error(), "run it again") {
		t.Fatalf("right after a reopen: %v", p)
	}
	s.mu.Lock()
	s.reopenedAt = time.Now().Add(-reopenSettle - time.Second)
	s.mu.Unlock()
	if p := s.Problem(); p != nil {
		t.Fatalf("a settled store has a problem: %v", p)
	}
}

// embeddedBroker is a key directory made in a temporary directory and its
// embedded broker started, for a test of the broker's own settings.
// embeddedClient is a client of the embedded broker s, closed when the
// test ends.
func embeddedClient(ctx context.Context, t *testing.T, k *Keys, s *Server) *Client {
	t.Helper()
	c, err := Connect(ctx, k, s.ClientURL(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func embeddedBroker(t *testing.T) (dir string, k *Keys, s *Server) {
	t.Helper()
	dir = t.TempDir()
	k, err := Init(filepath.Join(dir, "keys"), nil, "tls://127.0.0.1:14222")
	if err != nil {
		t.Fatal(err)
	}
	if s, err = StartServer(k, "127.0.0.1:0", slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return dir, k, s
}
