package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A read a replica behind answered — the node's declaration before the
// one it settled, at an older place in the stream — is read again, not
// refused as a replay: a refusal said a replay to the control side (the
// fleet bench's cluster, a server stopped: hundreds of nodes) and moved
// the agent's memory back to the older message. Nothing is settled or
// reported meanwhile; one that stays so is refused after behindReads.
func TestAReadAReplicaBehindAnsweredIsReadAgain(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openState(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.update(func(s *State) { s.LastApplied, s.LastSeq, s.LastStreamSeq = 5, 5, 50 }); err != nil {
		t.Fatal(err)
	}
	a := &Agent{id: &Identity{ControlKey: pub, Node: "n1", Enrolment: "e1"}, state: st, log: slog.New(slog.DiscardHandler)}
	env, err := wire.Seal(priv, wire.PurposeDeclaration, []byte(`{"version":1,"node":"n1","enrolment":"e1","seq":4,"resources":[{"module":"m","id":"f","type":"file","path":"/etc/motd","content":"a"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range behindReads {
		err := a.drain(context.Background(), &declMsg{data: env, sseq: 40})
		if !errors.Is(err, errReadBehind) {
			t.Fatalf("read %d of an older message at an older stream sequence: %v", i+1, err)
		}
		if s := st.get(); s.LastStreamSeq != 50 || s.LastApplied != 5 {
			t.Fatalf("read %d settled the agent's memory back: %+v", i+1, s)
		}
	}

	// The sixth is what the stream holds: refused as a replay, said so to
	// the control side, the agent's memory at the message it refused.
	reports := reportStream(t, a)
	if err := a.drain(context.Background(), &declMsg{data: env, sseq: 40}); err != nil {
		t.Fatalf("read %d of an older message: %v", behindReads+1, err)
	}
	m, err := reports.GetLastMsgForSubject(context.Background(), a.id.Subjects.Report)
	if err != nil {
		t.Fatalf("no report of the refusal: %v", err)
	}
	var r link.Report
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Seq != 4 || r.Code != wire.CodeReplay.String() || r.RefusedBy != "agent" || r.StreamSeq != 40 {
		t.Fatalf("the refusal reported as %s (%v)", m.Data, err)
	}
	if s := st.get(); s.LastStreamSeq != 40 || s.LastApplied != 5 || a.behind != 0 {
		t.Fatalf("after the refusal: %+v, behind %d", s, a.behind)
	}
}

// reportStream links a to a broker of its own whose stream keeps a's
// reports, and returns the stream.
func reportStream(t *testing.T, a *Agent) jetstream.Stream {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the broker did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	kp, _ := nkeys.CreateUser()
	signer, err := link.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	a.id.signer, a.id.Subjects.Report = signer, "mesh.up.n1.report"
	if a.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	a.nc = nc
	st, err := a.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "REPORTS", Subjects: []string{a.id.Subjects.Report}})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
