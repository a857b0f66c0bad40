package agent_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const motd = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/tmp/mesh-test/motd","content":"%d\n","mode":"0644"}]}`

// seal signs a declaration by hand, as the control side would or as a
// forger would, and publishes it on node's subject.
func publishSealed(t *testing.T, c *controlSide, node string, key ed25519.PrivateKey, purpose wire.Purpose, decl map[string]any) {
	t.Helper()
	payload, _ := json.Marshal(decl)
	env, err := wire.Seal(key, purpose, payload)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.client.JS.Publish(ctx, link.SubjectsOf(node).Decl, env); err != nil {
		t.Fatal(err)
	}
}

func file(content string) []any {
	return []any{map[string]any{"module": "base", "id": "motd", "type": "file", "path": "/tmp/mesh-test/motd", "content": content, "mode": "0644"}}
}

// The drain, against a fake executor: with the executor busy, 50
// declarations and five bad envelopes are published; released, the agent
// forwards exactly one more declaration, the newest; the 49 older are
// reported superseded naming it; the forged one, the one signed for another
// purpose, the one for another node, the one with an action and the one
// with an old sequence are refused upward with their reasons and never
// reach the executor. The registry then shows what the node applied.
func TestDrainForwardsOnlyTheNewest(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, cfg := c.addNode("drain")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	runAgent(t, id, ex.path)

	// Linked: the executor hears so.
	waitFor(t, "the first Reconnected", func() bool { _, r, _ := ex.snapshot(); return r == 1 })
	s1 := c.declare("drain", fmt.Sprintf(motd, 1))
	c.reports("drain", "seq 1 applied", hasReport(s1, shapes.Applied))

	// Busy with seq 2.
	ex.hold()
	s2 := c.declare("drain", fmt.Sprintf(motd, 2))
	select {
	case got := <-ex.holding:
		if got != s2 {
			t.Fatalf("held %d, want %d", got, s2)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the executor never got seq 2")
	}
	var newest uint64
	for i := range 50 {
		newest = c.declare("drain", fmt.Sprintf(motd, 3+i))
	}
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	base := func(node string, seq uint64, res []any) map[string]any {
		return map[string]any{"version": 1, "node": node, "enrolment": cfg.Enrolment, "seq": seq, "resources": res}
	}
	publishSealed(t, c, "drain", other, wire.PurposeDeclaration, base("drain", 1000, file("forged")))
	publishSealed(t, c, "drain", c.keys.Control, wire.PurposeGrant, base("drain", 1001, file("grant")))
	publishSealed(t, c, "drain", c.keys.Control, wire.PurposeDeclaration, base("other", 1002, file("other node")))
	publishSealed(t, c, "drain", c.keys.Control, wire.PurposeDeclaration, base("drain", 1003,
		[]any{map[string]any{"module": "m", "id": "a", "type": "action", "run": []string{"/bin/true"}, "verify": []string{"/bin/true"}}}))
	publishSealed(t, c, "drain", c.keys.Control, wire.PurposeDeclaration, base("drain", s1, file("old")))
	ex.unhold()

	rs := c.reports("drain", "the newest applied", hasReport(newest, shapes.Applied))
	// Let anything that would still come, come.
	time.Sleep(300 * time.Millisecond)
	decls, _, garbage := ex.snapshot()
	if want := []uint64{s1, s2, newest}; !slices.Equal(decls, want) {
		t.Fatalf("declarations that reached the executor: %v, want %v", decls, want)
	}
	if len(garbage) != 0 {
		t.Fatalf("garbage reached the executor: %q", garbage)
	}
	rs = c.reports("drain", "all settled", func(rs []*control.SignedReport) bool { return len(rs) >= 3+49+5 })
	superseded := map[uint64]bool{}
	refused := map[string]*control.SignedReport{}
	for _, r := range rs {
		switch r.Outcome {
		case shapes.Superseded:
			if r.SupersededBy != newest || r.SupersededOutcome != shapes.Applied {
				t.Errorf("seq %d superseded by %d (%s), want by %d (applied)", r.Seq, r.SupersededBy, r.SupersededOutcome, newest)
			}
			superseded[r.Seq] = true
		case shapes.Refused:
			if r.RefusedBy != "agent" || r.Refused == "" {
				t.Errorf("refusal %+v: want refused by the agent, with a reason", r.Report)
			}
			refused[r.Code] = r
		}
	}
	if len(superseded) != 49 {
		t.Errorf("%d declarations reported superseded, want 49: %s", len(superseded), describe(rs))
	}
	for s := s2 + 1; s < newest; s++ {
		if !superseded[s] {
			t.Errorf("seq %d not reported superseded", s)
		}
	}
	for code, seq := range map[string]uint64{"wrong-key": 0, "wrong-purpose": 0, "address": 1002, "action": 1003, "replay": s1} {
		r := refused[code]
		if r == nil {
			t.Errorf("no refusal with code %s: %s", code, describe(rs))
			continue
		}
		if r.Seq != seq {
			t.Errorf("refusal %s names seq %d, want %d (nothing unsigned is repeated as the control plane's word)", code, r.Seq, seq)
		}
		t.Logf("refused [%s] seq %d: %s", code, r.Seq, r.Refused)
	}
	if len(refused) != 5 {
		t.Errorf("%d distinct refusals, want 5: %s", len(refused), describe(rs))
	}

	// The control side's registry: declared against applied, the
	// executor's version from the heartbeat, the last outcome.
	waitFor(t, "the registry to show the node", func() bool {
		ns, err := c.client.Nodes(context.Background())
		if err != nil || len(ns) != 1 {
			return false
		}
		n := ns[0]
		return n.Declared == newest && n.Applied == newest && n.LastOutcome == shapes.Applied &&
			n.LastSeq == newest && n.ExecutorVersion == "fake" && n.State == link.StateEnrolled
	})
}
