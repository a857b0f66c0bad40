package serve

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A plan request is taken only as the control plane signed it for this
// node, for its own purpose and in its time; a plan changes nothing — not
// the machine, not the store, not the sequence floor — and shows a diff
// only of what the mesh wrote.
func TestPlanChangesNothingAndIsTakenOnlyAsSigned(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "v1\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	os.WriteFile(filepath.Join(e.root, "found"), []byte("the machine's\n"), 0o644)
	os.WriteFile(filepath.Join(e.root, "conf"), []byte("# the machine's own\nPort 22\n"), 0o644)
	req := func(node, enrolment string, notAfter time.Time, purpose wire.Purpose, resources ...string) []byte {
		body, _ := json.Marshal(wire.PlanRequest{Node: node, Enrolment: enrolment, ID: "p1", NotAfter: notAfter, Declaration: e.decl(node, enrolment, 0, resources...)})
		b, err := wire.Seal(e.priv, purpose, body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ask := func(env []byte) *wire.PlanReply {
		t.Helper()
		if err := c.Write(wire.KindPlan, &wire.Plan{Envelope: env}); err != nil {
			t.Fatal(err)
		}
		k, body, err := c.Read()
		if err != nil || k != wire.KindPlanReply {
			t.Fatalf("%v %v", k, err)
		}
		return body.(*wire.PlanReply)
	}
	before := e.snapshot()
	soon := time.Now().Add(time.Minute)
	p := ask(req("n1", "e-1", soon, wire.PurposePlan, file("motd", "v2\n"), file("found", "mine\n"), file("new", "n\n")))
	if p.Outcome != shapes.Applied || len(p.Lines) != 3 || !strings.Contains(p.Diffs["m.motd"], "+v2") || !strings.Contains(p.Diffs["m.found"], "not shown") || strings.Contains(p.Diffs["m.found"], "machine's\n") {
		t.Fatalf("plan: %+v", p)
	}
	// A file not on the machine: its diff is of nothing, all it shows is
	// what the control plane declares.
	if d := p.Diffs["m.new"]; !strings.HasPrefix(d, "--- /dev/null\n") || !strings.Contains(d, "+n") {
		t.Fatalf("the plan of a file not on the machine: %q", d)
	}
	// An edit of the machine's file: said as not shown, none of its lines.
	keys := `{"module":"m","id":"conf","type":"keys","path":"` + filepath.Join(e.root, "conf") + `","format":"space","set":{"Port":"2222"}}`
	if p := ask(req("n1", "e-1", soon, wire.PurposePlan, keys)); !strings.HasPrefix(p.Diffs["m.conf"], "(not shown: an edit of a file the machine holds") || strings.Contains(p.Diffs["m.conf"], "machine's own") {
		t.Fatalf("the plan of an edit: %+v", p)
	}
	for _, c := range []struct {
		name string
		env  []byte
		code wire.Code
	}{
		{"another node", req("n2", "e-1", soon, wire.PurposePlan, file("motd", "v2\n")), wire.CodeAddress},
		{"another enrolment", req("n1", "e-0", soon, wire.PurposePlan, file("motd", "v2\n")), wire.CodeAddress},
		{"past its time", req("n1", "e-1", time.Now().Add(-time.Second), wire.PurposePlan, file("motd", "v2\n")), wire.CodeReplay},
		{"a declaration passed off as a plan", e.seal(e.decl("n1", "e-1", 2, file("motd", "v2\n"))), wire.CodePurpose},
		{"a plan signed for a declaration", req("n1", "e-1", soon, wire.PurposeDeclaration, file("motd", "v2\n")), wire.CodePurpose},
		{"garbage", []byte("not an envelope"), wire.CodeMalformed},
	} {
		if p := ask(c.env); p.Outcome != shapes.Refused || p.Code != c.code {
			t.Errorf("%s: %+v", c.name, p)
		}
	}
	if got := e.snapshot(); got != before {
		t.Fatalf("a plan changed the machine or the store:\n%s\nwas\n%s", got, before)
	}
	// The floor did not move: the next declaration is sequence 2.
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 2, file("motd", "v2\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("after the plans: %+v", v)
	}
}
