package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

const (
	webModule = `{"version":1,"resources":[
		{"module":"web","id":"root","type":"directory","path":"/srv/web"},
		{"module":"web","id":"index","type":"file","path":"/srv/web/index.html","content":"hi\n"}]}`
	dbModule = `{"resources":[{"module":"db","id":"conf","type":"file","path":"/etc/db.conf","content":"x\n"}]}`
)

// reportAs publishes a report signed by the node's NKey, as its agent
// does.
func reportAs(t *testing.T, id *agent.Identity, seq uint64, outcome shapes.Outcome, lines []shapes.Line, b *shapes.Briefing) {
	t.Helper()
	if b != nil && b.At.IsZero() { // as the executor's: the apply's sequence and time
		b.Seq, b.At = seq, time.Now().UTC()
	}
	sendReports(t, id, link.Report{Seq: seq, Trigger: link.TriggerDeclaration, Outcome: outcome, Lines: lines, Briefing: b})
}

// sendReports publishes reports in order, each signed by the node's NKey
// as its agent does, over one connection; each is the node's, and now
// unless it says when.
func sendReports(t *testing.T, id *agent.Identity, reps ...link.Report) {
	t.Helper()
	nc, err := agent.Dial(id, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, r := range reps {
		r.Node, r.Enrolment = id.Node, id.Enrolment
		if r.At.IsZero() {
			r.At = time.Now().UTC()
		}
		data, _ := json.Marshal(&r)
		sig, err := id.Sign(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// serveOverlay is serve with an overlay set, and a context for the test
// that ends within.
func serveOverlay(t *testing.T, within time.Duration) (*served, context.Context) {
	t.Helper()
	s, _, ctx := serveOverlayIn(t, within)
	return s, ctx
}

// serveOverlayIn is serveOverlay with its key directory, for commands.
func serveOverlayIn(t *testing.T, within time.Duration) (*served, string, context.Context) {
	t.Helper()
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	return s, dir, ctx
}

// overlayLine is the report line of the overlay resource.
func overlayLine(o shapes.Outcome) shapes.Line {
	return shapes.Line{Module: control.OverlayModule, ID: control.OverlayID, Type: shapes.TypeOverlay, Outcome: o}
}

// recorded waits until the recorder has taken node's report for seq in.
func recorded(t *testing.T, s *served, node string, seq uint64) *control.NodeStatus {
	t.Helper()
	var st *control.NodeStatus
	eventually(t, "the report recorded", func() bool {
		st = status(t, s, node)
		return st.LastSeq == seq
	})
	return st
}

func status(t *testing.T, s *served, node string) *control.NodeStatus {
	t.Helper()
	ns, err := s.client.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Name == node {
			return n
		}
	}
	t.Fatalf("no node %s", node)
	return nil
}

// A new node's first declaration is the overlay and nothing else: what is
// assigned to it meanwhile is held — a report of the overlay failing does
// not release it — and goes out, after the overlay and in the order
// assigned, once the node reports its overlay applied.
func TestFirstDeclarationIsTheOverlayAlone(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	enrolNode(t, s, "peer")
	_, id := enrolNode(t, s, "n1")
	var first *shapes.Declaration
	eventually(t, "n1's first declaration", func() bool {
		first = lastDecl(t, s, "n1")
		return first != nil && len(overlayIn(t, s, first).Peers) == 1
	})
	// The enrolment changed the roster, and so the peer's peers: n1 is
	// among them. The peer's declaration did not change for it: every one
	// it was sent carries the same overlay (no peer list to grow).
	eventually(t, "n1 in the peer's overlay", func() bool {
		d := lastDecl(t, s, "peer")
		return d != nil && strings.Join(peerKeys(overlayIn(t, s, d)), ",") == wgKey(t, s, "n1")
	})
	peerDecls := declsOf(t, s, "peer")
	for _, d := range peerDecls {
		if !reflect.DeepEqual(d.Resources, peerDecls[0].Resources) {
			t.Fatalf("the peer was sent another declaration for n1's enrolment: %+v, then %+v", peerDecls[0].Resources[0], d.Resources[0])
		}
	}
	for _, mod := range []string{webModule, dbModule} {
		p, err := s.client.Assign(ctx, "n1", []byte(mod), "m.json")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.Held, "held until the node reports its overlay applied") || len(p.Modules) != 0 {
			t.Fatalf("assigned to a node that has not applied its overlay: %+v", p)
		}
	}
	overlayOnly := func() {
		t.Helper()
		for _, d := range declsOf(t, s, "n1") {
			if ks := keys(d); len(ks) != 1 || ks[0] != "mesh.overlay" {
				t.Fatalf("seq %d carries %v before the node applied its overlay", d.Seq, ks)
			}
		}
	}
	overlayOnly()
	if st := status(t, s, "n1"); !strings.HasPrefix(st.Assignments, "held until the node reports its overlay applied") || st.Address == "" {
		t.Fatalf("nodes says %q (address %q)", st.Assignments, st.Address)
	}

	// The overlay failed on the node: still held.
	reportAs(t, id, first.Seq, shapes.Failed, []shapes.Line{{Module: "mesh", ID: "overlay", Type: "overlay", Outcome: shapes.Failed, Detail: "no wireguard-go"}}, nil)
	recorded(t, s, "n1", first.Seq)
	time.Sleep(500 * time.Millisecond) // what the watcher would do, it has done by now
	overlayOnly()

	// Applied: the assignments go out, after the overlay, in order.
	last := lastDecl(t, s, "n1")
	reportAs(t, id, last.Seq, shapes.Applied, []shapes.Line{overlayLine(shapes.Applied)}, nil)
	want := "mesh.overlay web.root web.index db.conf"
	eventually(t, "the modules after the overlay", func() bool {
		return strings.Join(keys(lastDecl(t, s, "n1")), " ") == want
	})
	if st := status(t, s, "n1"); st.Assignments != "web, db" {
		t.Fatalf("nodes says %q", st.Assignments)
	}
	// The peer, which never reported, is still held.
	if st := status(t, s, "peer"); !strings.HasPrefix(st.Assignments, "held until") {
		t.Fatalf("nodes says of the peer %q", st.Assignments)
	}

	// Assigned again: in place. Unassigned: gone.
	if _, err := s.client.Assign(ctx, "n1", []byte(strings.Replace(webModule, `hi\n`, `hello\n`, 1)), "web.json"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web in place, changed", func() bool {
		d := lastDecl(t, s, "n1")
		return strings.Join(keys(d), " ") == want && *d.Resources[2].(*shapes.File).Content == "hello\n"
	})
	p, err := s.client.Unassign(ctx, "n1", "db")
	if err != nil || p.Held != "" || strings.Join(p.Modules, ",") != "web" {
		t.Fatalf("unassign: %+v %v", p, err)
	}
	eventually(t, "db gone", func() bool {
		return strings.Join(keys(lastDecl(t, s, "n1")), " ") == "mesh.overlay web.root web.index"
	})
	// Nothing changed, nothing sent.
	before := len(declsOf(t, s, "n1"))
	if p, err := s.client.Publish(ctx, "n1", false); err != nil || p.Sent || p.Seq != lastDecl(t, s, "n1").Seq {
		t.Fatalf("publish unchanged: %+v %v", p, err)
	}
	if len(declsOf(t, s, "n1")) != before {
		t.Fatal("an unchanged composition was sent again")
	}

	// Refused before anything is recorded.
	for name, bad := range map[string]string{
		"an action":               `{"resources":[{"module":"x","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/true"]}]}`,
		"two modules in one file": `{"resources":[{"module":"x","id":"a","type":"directory","path":"/x"},{"module":"y","id":"b","type":"directory","path":"/y"}]}`,
		"the overlay's module":    `{"resources":[{"module":"mesh","id":"a","type":"directory","path":"/x"}]}`,
		"a node's field":          `{"adopted":true,"resources":[{"module":"x","id":"a","type":"directory","path":"/x"}]}`,
		"sealed content":          `{"resources":[{"module":"x","id":"a","type":"file","path":"/x","sealed":"AAAA"}]}`,
		"another module's path":   `{"resources":[{"module":"x","id":"a","type":"file","path":"/srv/web/index.html","content":"x"}]}`,
		"no resources":            `{"version":1,"resources":[]}`,
	} {
		if _, err := s.client.Assign(ctx, "n1", []byte(bad), "bad.json"); err == nil {
			t.Errorf("%s: assigned", name)
		}
	}
	if as, _ := s.client.Assignments(ctx, "n1"); len(as) != 1 || as[0].Module != "web" {
		t.Fatalf("assignments after the refusals: %+v", as)
	}
}

// A node declared before the mesh had an overlay keeps what it was
// declared while its assignments are held: its overlay goes out in front of
// it, never instead of it.
func TestHeldNodeKeepsWhatItWasDeclared(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	enrolNode(t, s, "n1")
	if _, err := s.client.Declare(ctx, "n1", []byte(`{"version":1,"adopted":true,"taken":["base"],"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"hi\n"}]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the overlay in front of what n1 was declared", func() bool {
		d := lastDecl(t, s, "n1")
		return strings.Join(keys(d), " ") == "mesh.overlay base.motd" && d.Adopted && len(d.Taken) == 1
	})
}

// A failed briefing line holds the node's assignments: assign records but
// sends nothing new; the overlay still goes out when it changes, with what
// the node was last sent and not the held module; a briefing that resolves
// the failure releases them; --despite-briefing pushes a fix through.
func TestBriefingHoldsAssignments(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	enrolNode(t, s, "n2")
	_, id := enrolNode(t, s, "n1")
	var d *shapes.Declaration
	eventually(t, "n1's overlay", func() bool {
		d = lastDecl(t, s, "n1")
		return d != nil && len(overlayIn(t, s, d).Peers) == 1
	})
	reportAs(t, id, d.Seq, shapes.Applied, []shapes.Line{overlayLine(shapes.Applied)}, nil)
	recorded(t, s, "n1", d.Seq)
	eventually(t, "n1 joined", func() bool { return status(t, s, "n1").Assignments == "none" })
	p, err := s.client.Assign(ctx, "n1", []byte(webModule), "web.json")
	if err != nil || p.Held != "" {
		t.Fatalf("assign to a joined node: %+v %v", p, err)
	}
	eventually(t, "web out", func() bool {
		d = lastDecl(t, s, "n1")
		return strings.Join(keys(d), " ") == "mesh.overlay web.root web.index"
	})
	// The node's briefing has a failed line.
	reportAs(t, id, d.Seq, shapes.Failed, []shapes.Line{overlayLine(shapes.Unchanged), {Module: "web", ID: "index", Type: "file", Outcome: shapes.Failed, Detail: "boom"}},
		&shapes.Briefing{Outcome: shapes.MarkFailed, Node: "n1", Seq: d.Seq, Findings: []shapes.Finding{{Mark: shapes.MarkFailed, Module: "web", ID: "index", Type: "file", Detail: "the directory is missing"}}})
	recorded(t, s, "n1", d.Seq)
	held := "held: briefing failed (web.index: the directory is missing)"
	eventually(t, "nodes says why", func() bool { return status(t, s, "n1").Assignments == held })
	before := len(declsOf(t, s, "n1"))
	p, err = s.client.Assign(ctx, "n1", []byte(dbModule), "db.json")
	if err != nil || p.Held != held || p.Sent {
		t.Fatalf("assign to a node whose briefing failed: %+v %v", p, err)
	}
	if len(declsOf(t, s, "n1")) != before {
		t.Fatal("something new was sent to a node whose briefing failed")
	}
	// declare is held the same way.
	if _, err := s.client.Declare(ctx, "n1", []byte(decl)); err == nil || !strings.Contains(err.Error(), "failed briefing line") {
		t.Fatalf("declare: %v", err)
	}

	// The overlay changes for n1: it goes out, with web (what n1 was last
	// sent) and without db.
	if err := s.client.SetEndpoint(ctx, "n2", "192.0.2.9:51820"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1's overlay renewed, its modules as they were", func() bool {
		d := lastDecl(t, s, "n1")
		return overlayIn(t, s, d).Peers[0].Endpoint == "192.0.2.9:51820" && strings.Join(keys(d), " ") == "mesh.overlay web.root web.index"
	})

	// --despite-briefing: the person pushes it through.
	c2, err := connect(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.DespiteBriefing = true
	if p, err := c2.Publish(ctx, "n1", false); err != nil || !p.Sent || p.Held != "" {
		t.Fatalf("publish despite the briefing: %+v %v", p, err)
	}
	if got := strings.Join(keys(lastDecl(t, s, "n1")), " "); got != "mesh.overlay web.root web.index db.conf" {
		t.Fatalf("despite the briefing: %s", got)
	}

	// Resolved: a later briefing without a failed line releases them (an
	// automatic publish now sends nothing new, since it is what was sent).
	reportAs(t, id, lastDecl(t, s, "n1").Seq, shapes.Held, []shapes.Line{overlayLine(shapes.Unchanged)},
		&shapes.Briefing{Outcome: shapes.MarkKept, Node: "n1", Findings: []shapes.Finding{{Mark: shapes.MarkKept, Module: "web", ID: "index", Type: "file", Detail: "kept"}}})
	eventually(t, "the hold released", func() bool { return status(t, s, "n1").Assignments == "web, db" })
	if p, err = s.client.Unassign(ctx, "n1", "web"); err != nil || p.Held != "" {
		t.Fatalf("unassign after the release: %+v %v", p, err)
	}
	eventually(t, "web gone after the release", func() bool {
		return strings.Join(keys(lastDecl(t, s, "n1")), " ") == "mesh.overlay db.conf"
	})
}

// The commands as a person types them: overlay set and show, node
// endpoint, assign (held, said so), publish, unassign, nodes.
func TestOverlayCommands(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	enrolNode(t, s, "n1")
	addNode(t, s, "hand")
	mod := filepath.Join(dir, "web.json")
	os.WriteFile(mod, []byte(webModule), 0o600)
	cli := func(args ...string) string {
		t.Helper()
		out, errs, code := run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
		return out
	}
	if _, errs, code := run(t, ctx, "assign", "n1", mod, "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, "no overlay is set") {
		t.Fatalf("assign without an overlay: %d %s", code, errs)
	}
	// (Published in seq 1 by the command or by serve, whichever was first.)
	out := cli("overlay", "set", "--network", "10.55.0.0/24", "--port", "51999")
	for _, want := range []string{"network 10.55.0.0/24, interface mesh0, listen port 51999, keepalive 25 s", ": overlay 10.55.0.1/24, its peers the roster's; assignments held until", "roster\tseq ", "hand\tnot composed: registered by hand"} {
		if !strings.Contains(out, want) {
			t.Fatalf("overlay set does not say %q:\n%s", want, out)
		}
	}
	// On a mesh with an overlay, a raw declaration without it would take
	// the node out of the mesh: refused, unless said.
	raw := filepath.Join(dir, "raw.json")
	os.WriteFile(raw, []byte(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"hi\n"}]}`), 0o600)
	before0 := len(declsOf(t, s, "n1"))
	if _, errs, code := run(t, ctx, "declare", "n1", raw, "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, "this mesh has an overlay (mesh0 on 10.55.0.0/24) and the file declares none") {
		t.Fatalf("a raw declaration without the overlay: exit %d\n%s", code, errs)
	}
	if len(declsOf(t, s, "n1")) != before0 {
		t.Fatal("the refused declaration was sent")
	}
	if out := cli("declare", "n1", raw, "--without-overlay"); strings.TrimSpace(out) == "" || len(declsOf(t, s, "n1")) != before0+1 {
		t.Fatalf("declare --without-overlay sent nothing: %q", out)
	}
	// A declaration that holds nothing (a retirement) takes the overlay
	// down with everything else, as it says: sent.
	nothing := filepath.Join(dir, "nothing.json")
	os.WriteFile(nothing, []byte(`{"version":1,"resources":[],"owns_nothing":true}`), 0o600)
	// Found by its sequence, not by counting: serve may republish a
	// composition of its own meanwhile (a loaded machine made that race).
	out = strings.TrimSpace(cli("declare", "n1", nothing))
	sent := false
	for _, d := range declsOf(t, s, "n1") {
		sent = sent || (fmt.Sprintf("declared seq %d to n1", d.Seq) == out && d.OwnsNothing && len(d.Resources) == 0)
	}
	if !sent {
		t.Fatalf("declare of a declaration holding nothing: %q, not in the stream", out)
	}
	// Only what is given changes.
	cli("overlay", "set", "--interface", "wg7")
	var show struct {
		Settings control.OverlaySettings `json:"settings"`
		Nodes    []control.OverlayNode   `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(cli("overlay", "show", "--json")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Settings.Network != "10.55.0.0/24" || show.Settings.ListenPort != 51999 || show.Settings.Interface != "wg7" || len(show.Nodes) != 2 ||
		show.Nodes[1].Address != "10.55.0.1" || show.Nodes[1].WireGuard != wgKey(t, s, "n1") || !strings.Contains(show.Nodes[0].Out, "registered by hand") {
		t.Fatalf("overlay show: %+v", show)
	}
	if out := cli("node", "endpoint", "n1", "198.51.100.4:51999"); !strings.Contains(out, "node n1 is reached at 198.51.100.4:51999") {
		t.Fatalf("node endpoint:\n%s", out)
	}
	if !strings.Contains(cli("overlay", "show"), "198.51.100.4:51999") {
		t.Fatal("overlay show does not show the endpoint")
	}
	if _, errs, code := run(t, ctx, "node", "endpoint", "n1", "somewhere", "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, "is not address:port") {
		t.Fatalf("a bad endpoint: %d %s", code, errs)
	}
	if out := cli("assign", "n1", mod); !strings.Contains(out, "assignments held until the node reports its overlay applied") {
		t.Fatalf("assign:\n%s", out)
	}
	if out := cli("nodes"); !strings.Contains(out, "ASSIGNMENTS") || !strings.Contains(out, "10.55.0.1") || !strings.Contains(out, "held until the node reports") {
		t.Fatalf("nodes:\n%s", out)
	}
	before := len(declsOf(t, s, "n1"))
	if out := cli("publish", "n1"); !strings.Contains(out, "n1\tpublished in seq") {
		t.Fatalf("publish:\n%s", out)
	}
	if len(declsOf(t, s, "n1")) != before+1 {
		t.Fatal("publish NODE sent nothing")
	}
	if out := cli("publish"); !strings.Contains(out, "n1\tpublished in seq") || !strings.Contains(out, "hand\tnot composed") {
		t.Fatalf("publish:\n%s", out)
	}
	// The same, in the JSON form every output keeps.
	for _, args := range [][]string{{"publish"}, {"publish", "n1"}, {"assign", "n1", mod}, {"nodes"}} {
		if err := jsonform.Check([]byte(cli(append(args, "--json")...))); err != nil {
			t.Errorf("%v --json: %v", args, err)
		}
	}
	// --wait waits for the node's report on the composition it publishes
	// (none comes here: no agent runs).
	if out, errs, code := run(t, ctx, "unassign", "n1", "web", "--wait=1s", "--dir", dir, "--nats", s.url); code != control.ExitTimedOut || !strings.Contains(out, "n1\t") || !strings.Contains(errs, "no report within 1s from n1 (seq ") {
		t.Fatalf("unassign --wait: exit %d\nstdout %q\nstderr %q", code, out, errs)
	}
	if _, errs, code := run(t, ctx, "unassign", "n1", "web", "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, `module "web" is not assigned to n1`) {
		t.Fatalf("unassign twice: %d %s", code, errs)
	}
}

// An assignment awaits an answer to a composition that carried it: the
// node's taking a sequence at or past the assignment's first that did not
// carry it (another process published between the assignment's choosing
// its first sequence and its being written) keeps nothing, so the
// refusal of the one that carries it gives it back; the node's taking one
// that carries it keeps it.
func TestAnAssignmentAwaitsACompositionThatCarriedIt(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	_, id := enrolNode(t, s, "n1")
	var first *shapes.Declaration
	eventually(t, "n1's overlay", func() bool { first = lastDecl(t, s, "n1"); return first != nil })
	reportAs(t, id, first.Seq, shapes.Applied, []shapes.Line{overlayLine(shapes.Applied)}, nil)
	recorded(t, s, "n1", first.Seq)
	eventually(t, "n1's assignments released", func() bool { return status(t, s, "n1").Assignments == "none" })

	pending := func(module string) bool {
		as, err := s.client.Assignments(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.Module == module {
				return a.PendingFrom != 0
			}
		}
		t.Fatalf("%s is not assigned: %+v", module, as)
		return false
	}
	taken := func(module string, outcome shapes.Outcome, why string) uint64 {
		t.Helper()
		var d *shapes.Declaration
		eventually(t, "a composition carrying "+module, func() bool {
			d = lastDecl(t, s, "n1")
			return slices.Contains(keys(d), module+".f")
		})
		sendReports(t, id, link.Report{Seq: d.Seq, Trigger: link.TriggerDeclaration, Outcome: outcome, Refused: why,
			Lines: []shapes.Line{overlayLine(shapes.Unchanged)}})
		recorded(t, s, "n1", d.Seq)
		return d.Seq
	}
	module := func(name string) []byte {
		return []byte(`{"version":1,"resources":[{"module":"` + name + `","id":"f","type":"file","path":"/srv/` + name + `","content":"x\n"}]}`)
	}

	if _, err := s.client.Assign(ctx, "n1", module("good"), "good.json"); err != nil {
		t.Fatal(err)
	}
	taken("good", shapes.Applied, "")
	eventually(t, "good kept", func() bool { return !pending("good") })

	// Another process's composition lands on the sequence the assignment
	// chose, without it; the node takes it.
	p, err := s.client.Publish(ctx, "n1", true)
	if err != nil || !p.Sent {
		t.Fatalf("publish: %+v %v", p, err)
	}
	if err := s.client.RecordAssignment(ctx, "n1", module("bad"), p.Seq); err != nil {
		t.Fatal(err)
	}
	reportAs(t, id, p.Seq, shapes.Applied, []shapes.Line{overlayLine(shapes.Unchanged)}, nil)
	recorded(t, s, "n1", p.Seq)
	time.Sleep(300 * time.Millisecond) // what serve would do, it has done by now
	if !pending("bad") {
		t.Fatal("the node's taking a composition without bad kept bad")
	}
	// The one that carries it, refused: given back.
	seq := taken("bad", shapes.Refused, "executor: shapes: resource bad.f (file) field path: in the protected set")
	eventually(t, "bad given back", func() bool {
		return status(t, s, "n1").Assignments == fmt.Sprintf("good; bad given back (refused at seq %d)", seq)
	})

	// Taken where it is carried: kept.
	if _, err := s.client.Assign(ctx, "n1", module("next"), "next.json"); err != nil {
		t.Fatal(err)
	}
	if !pending("next") {
		t.Fatal("a new assignment does not await the node's answer")
	}
	taken("next", shapes.Applied, "")
	eventually(t, "next kept", func() bool { return !pending("next") })
}

// A module naming an archive no node would take — stored under another
// name, or a file on the machine (file://, a local file's or the
// bundle's) — is refused before it is assigned, as a declaration of it is
// before it is signed: recorded, it would make every later composition of
// the node one the control side refuses to sign, until unassigned. The
// node's assignments stay as they were, and the next module assigns.
func TestAModuleOfAnArchiveNoNodeTakesIsNotAssigned(t *testing.T) {
	s, ctx := serveOverlay(t, 60*time.Second)
	enrolNode(t, s, "n1")
	for url, say := range map[string]string{
		"obj://" + strings.Repeat("b", 64): "is not obj:// and the archive's sha256",
		"file:///srv/a.tgz":                "a file:// archive may come from a local file or the bundle, not over the link",
		"https://example.com/a.tgz":        "is neither obj://<sha256>",
	} {
		mod := `{"version":1,"resources":[{"module":"site","id":"theme","type":"archive","url":"` + url + `","sha256":"` + strings.Repeat("a", 64) + `","destination":"/srv/www"}]}`
		if _, err := s.client.Assign(ctx, "n1", []byte(mod), "site.json"); err == nil || !strings.Contains(err.Error(), say) {
			t.Errorf("assign of an archive at %s: %v", url, err)
		}
		if _, err := s.client.ComposeWith(ctx, "n1", []byte(mod)); err == nil || !strings.Contains(err.Error(), say) {
			t.Errorf("the composition with an archive at %s: %v", url, err)
		}
		if a, err := s.client.Assignments(ctx, "n1"); err != nil || len(a) != 0 {
			t.Errorf("n1's assignments after the refused archive at %s: %+v %v", url, a, err)
		}
	}
	if p, err := s.client.Assign(ctx, "n1", []byte(webModule), "web.json"); err != nil || p.Node != "n1" {
		t.Fatalf("assign after the refusals: %+v %v", p, err)
	}
}

// declare of a file with an overlay of its own is held to each node's: an
// overlay of another address (one node's, sent to two) or another
// interface than the mesh's is refused before a sequence is taken, naming
// the node's own.
func TestADeclaredOverlayIsTheNodesOwn(t *testing.T) {
	s, dir, ctx := serveOverlayIn(t, 60*time.Second)
	enrolNode(t, s, "n1")
	enrolNode(t, s, "n2")
	p1, err := s.client.OverlayAddress(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := s.client.OverlayAddress(ctx, "n2")
	set, _ := s.client.Overlay(ctx)
	eventually(t, "both nodes' first declarations", func() bool {
		return lastDecl(t, s, "n1") != nil && lastDecl(t, s, "n2") != nil
	})
	r1, _, _ := s.client.Node(ctx, "n1")
	r2, _, _ := s.client.Node(ctx, "n2")
	file := func(iface, addr string) string {
		f := filepath.Join(t.TempDir(), "ov.json")
		os.WriteFile(f, []byte(`{"version":1,"resources":[{"module":"mesh","id":"overlay","type":"overlay","interface":"`+iface+`","address":"`+addr+`"}]}`), 0o600)
		return f
	}
	for _, c := range []struct {
		nodes, iface, addr string
		say                string
	}{
		{"n2", set.Interface, p1.String(), "n2's in this mesh's overlay is " + p2.String()},
		{"n1,n2", set.Interface, p1.String(), "n2's in this mesh's overlay is " + p2.String()},
		{"n1", "wg9", p1.String(), "the file's overlay is interface wg9"},
	} {
		if out, errs, code := run(t, ctx, "declare", c.nodes, file(c.iface, c.addr), "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, c.say) {
			t.Errorf("declare %s of %s on %s: exit %d\n%s%s", c.nodes, c.addr, c.iface, code, out, errs)
		}
	}
	n1, _, _ := s.client.Node(ctx, "n1")
	n2, _, _ := s.client.Node(ctx, "n2")
	if n1.NextSeq != r1.NextSeq || n2.NextSeq != r2.NextSeq {
		t.Fatalf("a sequence was taken for a refused declaration: next %d and %d, were %d and %d", n1.NextSeq, n2.NextSeq, r1.NextSeq, r2.NextSeq)
	}
	if out, errs, code := run(t, ctx, "declare", "n1", file(set.Interface, p1.String()), "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("declare of n1's own overlay: exit %d\n%s%s", code, out, errs)
	}
}

// overlay set to a network with fewer addresses than the nodes in the
// overlay is refused before anything is written: the settings, the
// nodes' addresses and the roster stay as they were.
func TestAnOverlayNetworkTooSmallIsRefusedWhole(t *testing.T) {
	s, dir, ctx := serveOverlayIn(t, 60*time.Second)
	for _, n := range []string{"n1", "n2", "n3"} {
		enrolNode(t, s, n)
	}
	before, _ := s.client.Overlay(ctx)
	out, errs, code := run(t, ctx, "overlay", "set", "--network", "10.97.0.0/30", "--dir", dir, "--nats", s.url)
	if code != 1 || !strings.Contains(errs, "overlay network 10.97.0.0/30 has room for 2 node(s), and 3 are in the overlay: nothing changed") {
		t.Fatalf("overlay set of a network too small: exit %d\n%s%s", code, out, errs)
	}
	if after, _ := s.client.Overlay(ctx); after.Network != before.Network {
		t.Fatalf("the network is %s after the refusal, was %s", after.Network, before.Network)
	}
	if _, errs, code := run(t, ctx, "overlay", "set", "--network", "10.97.0.0/29", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("overlay set of a network with room: exit %d\n%s", code, errs)
	}
	// A node revoked and not deleted keeps its address there: no room.
	if _, _, err := s.client.Revoke(ctx, "n3", "gone"); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := run(t, ctx, "overlay", "set", "--network", "10.98.0.0/29", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("overlay set: exit %d\n%s", code, errs)
	}
	for _, n := range []string{"n4", "n5", "n6", "n7"} {
		enrolNode(t, s, n)
	}
	out, errs, code = run(t, ctx, "overlay", "set", "--network", "10.97.0.0/29", "--dir", dir, "--nats", s.url)
	if code != 1 || !strings.Contains(errs, "overlay network 10.97.0.0/29 has room for 6 node(s), 1 of its addresses held by nodes out of the overlay (revoked, not deleted: mesh-control node delete frees them), and 6 are in the overlay: nothing changed") {
		t.Fatalf("overlay set of a network a revoked node holds an address of: exit %d\n%s%s", code, out, errs)
	}
	if _, errs, code := run(t, ctx, "node", "delete", "n3", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("node delete: exit %d\n%s", code, errs)
	}
	// The room it held is the overlay's again. (Six nodes in six
	// addresses is what the refusal above is about; two composers of the
	// roster — serve's and the command's — racing for the last address
	// can find it taken for a moment, so the network is not filled here.)
	if _, _, err := s.client.Revoke(ctx, "n7", "gone"); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := run(t, ctx, "overlay", "set", "--network", "10.97.0.0/29", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("overlay set once the revoked node is deleted: exit %d\n%s", code, errs)
	}
}

// declare to a node with modules assigned says, on standard error, that
// the declaration replaced its composition and the next publish sends the
// modules again; to one with none it says nothing of it.
func TestDeclareOverAssignmentsSaysSo(t *testing.T) {
	s, dir, ctx := serveOverlayIn(t, 60*time.Second)
	enrolNode(t, s, "n1")
	enrolNode(t, s, "n2")
	if _, err := s.client.Assign(ctx, "n1", []byte(webModule), "web.json"); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "d.json")
	os.WriteFile(f, []byte(`{"version":1,"resources":[{"module":"x","id":"f","type":"file","path":"/srv/x","content":"x\n"}]}`), 0o600)
	_, errs, code := run(t, ctx, "declare", "n1,n2", f, "--without-overlay", "--dir", dir, "--nats", s.url)
	if code != 0 || !strings.Contains(errs, "note: n1 has modules assigned (web): this declaration replaced its composition") || strings.Contains(errs, "n2 has") {
		t.Fatalf("declare over n1's assignments: exit %d\n%s", code, errs)
	}
	// One node: said alike.
	if _, errs, code := run(t, ctx, "declare", "n1", f, "--without-overlay", "--dir", dir, "--nats", s.url); code != 0 || !strings.Contains(errs, "note: n1 has modules assigned (web)") {
		t.Fatalf("declare over n1's assignments, n1 alone: exit %d\n%s", code, errs)
	}
}
