package control

import (
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
)

// A node's connect that comes before serve has read its registry (serve
// starting, a fleet relinking at once) is held, not refused; held longer
// than nats-server's first ping to a client (2 s by default), it must
// still be let in: the client takes a PING before its PONG for a failed
// connect, and a fleet relinking made thousands of connects again for
// that (docs/benchmarks.md).
func TestAConnectHeldPastTheBrokersFirstPingIsLetIn(t *testing.T) {
	k, err := Init(t.TempDir(), []string{"127.0.0.1"}, "tls://127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	s, err := startServer(k, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	cfg := &agent.Config{BrokerURL: s.ClientURL(), BrokerFingerprint: k.BrokerFingerprint(), ControlKey: k.ControlPublicBase64(),
		Node: "held", Enrolment: "e1", NKeySeed: string(seed)}
	id, err := cfg.Identity()
	if err != nil {
		t.Fatal(err)
	}
	const hold = 4 * time.Second
	read := time.AfterFunc(hold, func() {
		s.SetNodes([]*NodeRecord{{Name: "held", NKey: pub}})
		s.SetTokens(nil)
	})
	defer read.Stop()
	start := time.Now()
	nc, err := agent.Dial(id)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a connect held %v until the registry was read failed after %v: %v", hold, took.Round(time.Millisecond), err)
	}
	defer nc.Close()
	if took < hold {
		t.Fatalf("the connect was let in after %v, before the registry was read (%v): it was not held", took, hold)
	}
}
