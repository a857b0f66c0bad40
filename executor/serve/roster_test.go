package serve

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

func rosterJSON(seq int, nodes int) []byte {
	keys := []string{"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"version":1,"seq":%d,"keepalive":25,"nodes":[`, seq)
	for i := range nodes {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"node":"n%d","public_key":%q,"address":"10.99.0.%d/32"}`, i+1, keys[i], i+1)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// The roster is taken from the agent only as the control plane signed it,
// for its purpose, and only newer than the one held: whatever the agent
// hands over otherwise is refused, saying why, and the held roster stays.
// A roster taken applies again only what takes its peers from it: a link
// target without such an overlay is not touched.
func TestTheRosterIsTakenOnlyAsSigned(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "one")))); v.Outcome != shapes.Applied {
		t.Fatal(v)
	}
	take := func(env []byte) ([]shapes.Line, *wire.Verdict) {
		return send(t, c, wire.KindRoster, &wire.Roster{Envelope: env})
	}
	held := func() []byte { b, _ := identity.ReadRoster(e.state); return b }
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	forged, _ := wire.Seal(otherKey, wire.PurposeRoster, rosterJSON(5, 2))
	asDecl := e.sealAs(wire.PurposeDeclaration, rosterJSON(5, 2))
	garbage := e.sealAs(wire.PurposeRoster, []byte(`{"version":1,"seq":5,"nodes":[{"node":"n1","public_key":"eA==","address":"10.99.0.1/32"}]}`))
	for name, c := range map[string]struct {
		env  []byte
		code wire.Code
	}{
		"another key": {forged, wire.CodeWrongKey}, "a declaration's purpose": {asDecl, wire.CodePurpose},
		"a bad roster": {garbage, wire.CodeInvalid}, "not an envelope": {[]byte("x"), wire.CodeMalformed},
	} {
		if _, v := take(c.env); v.Outcome != shapes.Refused || v.Code != c.code {
			t.Errorf("%s: %+v, want refused %s", name, v, c.code)
		}
		if held() != nil {
			t.Fatalf("%s: a roster is held after a refusal", name)
		}
	}
	r5 := e.sealAs(wire.PurposeRoster, rosterJSON(5, 2))
	lines, v := take(r5)
	if v.Outcome == shapes.Refused || v.Duplicate || len(lines) != 0 || !bytes.Equal(held(), r5) {
		t.Fatalf("roster 5: %+v %v (held %d bytes)", v, lines, len(held()))
	}
	if HeldRoster(e.state) == nil || HeldRoster(e.state).Seq != 5 {
		t.Fatal("the held roster does not verify as roster 5")
	}
	if _, v := take(r5); !v.Duplicate {
		t.Fatalf("roster 5 again: %+v, want a duplicate", v)
	}
	for name, c := range map[string]struct {
		env  []byte
		code wire.Code
	}{
		"older":                    {e.sealAs(wire.PurposeRoster, rosterJSON(4, 2)), wire.CodeReplay},
		"same sequence, other one": {e.sealAs(wire.PurposeRoster, rosterJSON(5, 1)), wire.CodeConflict},
	} {
		if _, v := take(c.env); v.Outcome != shapes.Refused || v.Code != c.code {
			t.Errorf("%s: %+v, want refused %s", name, v, c.code)
		}
		if !bytes.Equal(held(), r5) {
			t.Fatalf("%s: the held roster changed", name)
		}
	}
	// A held roster that no longer verifies (another pinned key: a new
	// enrolment elsewhere) is none: HeldRoster says so.
	os.WriteFile(filepath.Join(e.state, identity.RosterFile), forged, 0o600)
	if HeldRoster(e.state) != nil {
		t.Fatal("a held roster under another key was believed")
	}
}

// A hosted executor (no identity) takes no roster.
func TestAHostedExecutorTakesNoRoster(t *testing.T) {
	e := newEnv(t, nobody, false)
	c := e.dial()
	_, v := send(t, c, wire.KindRoster, &wire.Roster{Envelope: e.sealAs(wire.PurposeRoster, rosterJSON(1, 1))})
	if v.Outcome != shapes.Refused || v.Code != wire.CodeNotEnrolled {
		t.Fatalf("%+v", v)
	}
}
