package control

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
