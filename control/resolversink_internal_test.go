package control

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// An account the broker did not take, because it was away, is pushed
// again once it is back, with no change of the registry to set it off:
// else a node enrolled in that moment could not sign in until the next
// change. The broker is a real nats-server in operator mode, in process,
// stopped and started again on the same port and resolver.
func TestAnAccountThePushMissedIsPushedAgain(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	if _, err := Init(filepath.Join(dir, "keys"), nil, url); err != nil {
		t.Fatal(err)
	}
	if _, err := MakeOperator(filepath.Join(dir, "keys")); err != nil {
		t.Fatal(err)
	}
	k, err := LoadKeys(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "store")
	rc, err := k.ResolverConfig(store)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "broker.conf")
	if err := os.WriteFile(conf, []byte(serverConfig(k, "t", "127.0.0.1", port, store)+rc), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *server.Server {
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		opts.NoSigs, opts.NoLog = true, true
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("the broker did not start")
		}
		return ns
	}
	ns := start()
	rs, err := newResolverSink(k, url, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rs.close()
	ns.Shutdown()
	ns.WaitForShutdown()

	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	rs.set([]*NodeRecord{{Name: "n1", NKey: pub, Enrolment: "e-1", Enrolled: time.Now()}}, nil)
	account := filepath.Join(store, accountsDir, NodeAccountID("n1")+".jwt")
	if _, err := os.Stat(account); err == nil {
		t.Fatal("an account pushed to a broker that was away")
	}
	if rs.knows("n1", pub) {
		t.Fatal("the broker is said to know a node whose account it never took")
	}
	ns = start()
	defer ns.Shutdown()
	deadline := time.Now().Add(time.Minute)
	for !rs.knows("n1", pub) {
		if time.Now().After(deadline) {
			t.Fatal("the account the broker missed was never pushed again")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(account); err != nil {
		t.Fatalf("the broker says it took the account, which is not in its resolver: %v", err)
	}
}
