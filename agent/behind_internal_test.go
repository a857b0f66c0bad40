package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"testing"

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
}
