package control_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// DeclareAll declares to many nodes by Declare's rules, reading what it
// needs for all of them at once: every node gets its next sequence, a
// revoked node and one with a failed briefing are refused as Declare
// refuses them, a node not registered is named, and declares to the same
// nodes racing it (one at a time, through Declare) still leave each
// node's newest declaration its newest sequence — more nodes than one
// batched get names, so the batches are exercised. Both ways: in atomic
// batches, and node by node as to a broker that takes none.
func TestDeclareAll(t *testing.T) {
	t.Run("batched", func(t *testing.T) { testDeclareAll(t, true) })
	t.Run("node by node", func(t *testing.T) { testDeclareAll(t, false) })
}

func testDeclareAll(t *testing.T, batched bool) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	if !batched {
		s.client.Unbatched()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := addNodes(ctx, t, s, 1100)
	// Some nodes declared to before (a newest on the subject to publish on
	// top of); one revoked; one with a failed briefing.
	for _, name := range nodes[:5] {
		if _, err := s.client.Declare(ctx, name, []byte(decl)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.client.Revoke(ctx, nodes[7], "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.KV.Put(ctx, "briefing."+nodes[8], []byte(`{"outcome":"failed","findings":[{"module":"m","id":"x","type":"file","mark":"failed","detail":"boom"}]}`)); err != nil {
		t.Fatal(err)
	}
	targets := append(append([]string{}, nodes...), "ghost")
	// Declares racing it on the first nodes.
	race := make(chan struct{})
	go func() {
		defer close(race)
		for _, name := range nodes[:20] {
			s.client.Declare(ctx, name, []byte(decl))
		}
	}()
	seqs, errs := s.client.DeclareAll(ctx, targets, []byte(decl))
	<-race
	for i, name := range targets {
		switch {
		case name == nodes[7]:
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "revoked") {
				t.Errorf("%s (revoked): %v", name, errs[i])
			}
		case name == nodes[8]:
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "failed briefing") {
				t.Errorf("%s (failed briefing): %v", name, errs[i])
			}
		case name == "ghost":
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "no node") {
				t.Errorf("ghost: %v", errs[i])
			}
		case errs[i] != nil || seqs[i] == 0:
			t.Errorf("%s: seq %d, %v", name, seqs[i], errs[i])
		}
	}
	// Each node's newest declaration is its newest sequence, for it.
	str, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range nodes {
		if i == 7 || i == 8 {
			continue
		}
		rec, m := newestDeclaration(ctx, t, s, str, name)
		payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeDeclaration, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		d, err := shapes.Parse(payload)
		if err != nil {
			t.Fatal(err)
		}
		if d.Node != name || d.Enrolment != rec.Enrolment || d.Seq != rec.NextSeq-1 {
			t.Fatalf("%s: newest on its subject is %s/%s seq %d; its last taken is %d", name, d.Node, d.Enrolment, d.Seq, rec.NextSeq-1)
		}
	}
	// A declaration every node would refuse (an action) is refused for
	// all of them, parsed once, before a sequence is taken.
	before := make([]uint64, 3)
	for i, name := range nodes[:3] {
		rec, _, err := s.client.Node(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		before[i] = rec.NextSeq
	}
	action := `{"version":1,"resources":[{"module":"m","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/true"]}]}`
	if _, errs := s.client.DeclareAll(ctx, nodes[:3], []byte(action)); errs[0] == nil || !strings.Contains(errs[0].Error(), "refused before signing") {
		t.Fatalf("an action to many: %v", errs[0])
	}
	for i, name := range nodes[:3] {
		if rec, _, _ := s.client.Node(ctx, name); rec.NextSeq != before[i] {
			t.Fatalf("%s: a refused declaration took sequence %d", name, before[i])
		}
	}
	// Sealed content is one node's: refused for many.
	sealer := *s.client
	sealer.Seals = map[string][]byte{"m.x": []byte("secret")}
	if _, errs := sealer.DeclareAll(ctx, nodes[:2], []byte(decl)); errs[0] == nil || !strings.Contains(errs[0].Error(), "one node at a time") {
		t.Fatalf("sealed content to many: %v", errs[0])
	}
}

// newestDeclaration is name's record and the newest message on its
// declaration subject.
func newestDeclaration(ctx context.Context, t *testing.T, s *served, str jetstream.Stream, name string) (*control.NodeRecord, *jetstream.RawStreamMsg) {
	t.Helper()
	rec, _, err := s.client.Node(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := str.GetLastMsgForSubject(ctx, link.SubjectsOf(name).Decl)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rec, m
}

// addNodes registers n nodes, f0000 on, 8 at a time, and returns their
// names.
func addNodes(ctx context.Context, t *testing.T, s *served, n int) []string {
	t.Helper()
	var nodes []string
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				if _, _, err := s.client.AddNode(ctx, name, ""); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := range n {
		name := fmt.Sprintf("f%04d", i)
		nodes = append(nodes, name)
		work <- name
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return nodes
}

// A fan-out writes its nodes' sequences, then their declarations, a batch
// at a time (the embedded broker takes atomic batches). A batch the broker
// refuses — a node's record moved since the fan-out read it, another
// declaration put on a node's subject — is done again node by node, and
// every node still has one declaration of the fan-out (or a newer one),
// its newest sequence, and a notice naming where it is stored.
func TestAFanOutWritesABatchAtATime(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := addNodes(ctx, t, s, 450) // three batches of 150
	notices, err := s.client.NC.SubscribeSync(link.NoticePrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seqBatches, declBatches int
	moved := ""
	control.OnBatch(func(subjects []string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(subjects[0], "$KV."):
			if seqBatches++; seqBatches == 2 {
				// The second batch of sequences: one of its records
				// moves (written again as it is, a new revision).
				key := strings.TrimPrefix(subjects[len(subjects)-1], "$KV."+control.Bucket+".")
				e, err := s.client.KV.Get(ctx, key)
				if err == nil {
					_, err = s.client.KV.Update(ctx, key, e.Value(), e.Revision())
				}
				if err != nil {
					t.Error(err)
				}
				moved = key
			}
		case subjects[0] == link.SubjectsOf(nodes[0]).Decl:
			// The first batch of declarations: a declare of its own
			// puts a newer one on a node's subject.
			if _, err := s.client.Declare(ctx, nodes[1], []byte(decl)); err != nil {
				t.Error(err)
			}
			declBatches++
		default:
			declBatches++
		}
	})
	defer control.OnBatch(nil)
	seqs, errs := s.client.DeclareAll(ctx, nodes, []byte(decl))
	for i, name := range nodes {
		if errs[i] != nil || seqs[i] == 0 {
			t.Errorf("%s: seq %d, %v", name, seqs[i], errs[i])
		}
	}
	if seqBatches < 3 || declBatches < 3 || moved == "" {
		t.Fatalf("%d batches of sequences and %d of declarations, want 3 each at least; a record moved: %q", seqBatches, declBatches, moved)
	}
	str, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	// One declaration a node — for the second node the declare's beside
	// the fan-out, which found it newer and published nothing: nothing is
	// stored twice by a batch done again node by node.
	if got := str.CachedInfo().State.Msgs; got != uint64(len(nodes)) {
		t.Errorf("%d declarations stored, want %d", got, len(nodes))
	}
	for i, name := range nodes {
		rec, m := newestDeclaration(ctx, t, s, str, name)
		if got := m.Header.Get(link.SeqHeader); got != fmt.Sprint(rec.NextSeq-1) {
			t.Errorf("%s: newest on its subject is sequence %s; its last taken is %d", name, got, rec.NextSeq-1)
		}
		if i != 1 && seqs[i] != rec.NextSeq-1 {
			t.Errorf("%s: declared sequence %d; its last taken is %d", name, seqs[i], rec.NextSeq-1)
		}
	}
	// Each notice names the stream sequence its declaration is stored at.
	for range len(nodes) {
		nm, err := notices.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("notices: %v", err)
		}
		at, err := strconv.ParseUint(nm.Header.Get(link.HeaderSequence), 10, 64)
		if err != nil {
			t.Fatalf("a notice on %s without its sequence: %v", nm.Subject, err)
		}
		m, err := str.GetMsg(ctx, at)
		if err != nil {
			t.Fatalf("notice on %s: sequence %d: %v", nm.Subject, at, err)
		}
		node := strings.TrimPrefix(m.Subject, "mesh.decl.")
		if nm.Subject != link.SubjectsOf(node).Notice || !bytes.Equal(m.Data, nm.Data) {
			t.Fatalf("the notice on %s names sequence %d, %s's declaration", nm.Subject, at, node)
		}
	}
}

// `mesh-control declare n1,n2,... FILE` declares to each, a line each;
// one it could not declare to is named and the command fails.
func TestDeclareManyCommand(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []string{"m1", "m2"} {
		if _, _, err := s.client.AddNode(ctx, n, ""); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "d.json")
	os.WriteFile(file, []byte(decl), 0o600)
	out, errs, code := run(t, ctx, "declare", "m1,m2", file, "--dir", dir, "--nats", s.url)
	if code != 0 || out != "declared seq 1 to m1\ndeclared seq 1 to m2\n" {
		t.Fatalf("declare m1,m2: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = run(t, ctx, "declare", "m2,nobody", file, "--dir", dir, "--nats", s.url)
	if code != 1 || !strings.Contains(out, "declared seq 2 to m2\n") || !strings.Contains(out, "not declared to nobody: no node \"nobody\"") || !strings.Contains(errs, "1 of 2 node(s) not declared to") {
		t.Fatalf("declare m2,nobody: exit %d\n%s%s", code, out, errs)
	}
	// A name twice, or an empty one: a typo, refused before anything is
	// declared (twice would be two sequences of one declaration).
	for list, say := range map[string]string{"m1,m1": "names m1 twice", "m1,": "has an empty name", "m1,,m2": "has an empty name"} {
		out, errs, code = run(t, ctx, "declare", list, file, "--dir", dir, "--nats", s.url)
		if code != 2 || out != "" || !strings.Contains(errs, say) {
			t.Errorf("declare %s: exit %d\n%s%s", list, code, out, errs)
		}
	}
	// A file naming a node (a rescue file reused) goes only to that node:
	// declared or planned to another, refused, no sequence taken.
	named := filepath.Join(dir, "m2.json")
	os.WriteFile(named, []byte(strings.Replace(decl, "{", `{"node":"m2",`, 1)), 0o600)
	for _, args := range [][]string{{"declare", "m1"}, {"declare", "m1,m2"}, {"plan", "m1"}} {
		out, errs, code = run(t, ctx, append(args, named, "--dir", dir, "--nats", s.url)...)
		if code != 1 || out != "" || !strings.Contains(errs, `names node "m2", and is sent to `+args[1]) {
			t.Errorf("%s %s of a file naming m2: exit %d\n%s%s", args[0], args[1], code, out, errs)
		}
	}
	if n, _, err := s.client.Node(ctx, "m1"); err != nil || n.NextSeq != 2 {
		t.Fatalf("m1 after the refused lists: %+v %v", n, err)
	}
	if out, errs, code = run(t, ctx, "declare", "m2", named, "--dir", dir, "--nats", s.url); code != 0 || out != "declared seq 3 to m2\n" {
		t.Fatalf("declare m2 of a file naming m2: exit %d\n%s%s", code, out, errs)
	}
	// An archive URL no archive comes by: refused before a sequence is
	// taken, as every node's archive step would refuse it.
	// A plan of it is refused before it is signed too.
	arch := filepath.Join(dir, "arch.json")
	for url, say := range map[string]string{
		"obj://themes/t1":   "is not obj:// and the archive's sha256",
		"file:///srv/a.tgz": "a file:// archive may come from a local file or the bundle, not over the link",
	} {
		os.WriteFile(arch, []byte(`{"version":1,"resources":[{"module":"web","id":"site","type":"archive","url":"`+url+`","sha256":"`+strings.Repeat("a", 64)+`","destination":"/srv/www"}]}`), 0o600)
		if out, errs, code = run(t, ctx, "declare", "m1", arch, "--dir", dir, "--nats", s.url, "--without-overlay"); code != 1 || !strings.Contains(errs, "refused before signing") || !strings.Contains(errs, say) {
			t.Errorf("declare of an archive at %s: exit %d\n%s%s", url, code, out, errs)
		}
		if out, errs, code = run(t, ctx, "plan", "m1", arch, "--dir", dir, "--nats", s.url); code != 1 || !strings.Contains(errs, "refused before signing") || !strings.Contains(errs, say) {
			t.Errorf("plan of an archive at %s: exit %d\n%s%s", url, code, out, errs)
		}
	}
	if n, _, err := s.client.Node(ctx, "m1"); err != nil || n.NextSeq != 2 {
		t.Fatalf("m1 after the refused archive: %+v %v", n, err)
	}
	// A list where one node is named: said as a name no node has.
	for _, args := range [][]string{{"plan", "m1,m2", file}, {"reports", "m1,m2"}, {"node", "show", "m1,m2"}, {"node", "revoke", "m1,m2"}} {
		out, errs, code = run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
		if code == 0 || !strings.Contains(errs, `node name "m1,m2": only a-z`) || !strings.Contains(errs, "taken by declare alone") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
}

// A declaration carried over a node's enrolment anew is published only
// on a subject still empty: a declare that lands between its look and its
// publish — taking its sequence before it or after — is the newer word,
// and the carried one is not published over it.
func TestACarriedDeclarationNeverGoesOverANewerOne(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := s.client.AddNode(ctx, "n1", ""); err != nil {
		t.Fatal(err)
	}
	const older = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"older\n"}]}`
	const newer = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"newer\n"}]}`
	s.client.DeclareCarried(ctx, "n1", []byte(older), func() {
		if _, err := s.client.Declare(ctx, "n1", []byte(newer)); err != nil {
			t.Error(err)
		}
	})
	last := s.client.LastDeclared(ctx, "n1")
	if last == nil || !strings.Contains(string(last["resources"]), "newer") {
		t.Fatalf("the last declaration on n1's subject: %s", last["resources"])
	}

	// A declare that took its sequence before the carried one and
	// publishes after it: the carried one takes none (it would be
	// published first on the empty subject, and the declare, older by
	// its sequence, taken for superseded and dropped, said done).
	if _, _, err := s.client.AddNode(ctx, "n2", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.DeclareWith(ctx, "n2", []byte(newer), func() {
		s.client.DeclareCarried(ctx, "n2", []byte(older), func() {})
	}); err != nil {
		t.Fatal(err)
	}
	last = s.client.LastDeclared(ctx, "n2")
	if last == nil || !strings.Contains(string(last["resources"]), "newer") {
		t.Fatalf("the last declaration on n2's subject: %s", last["resources"])
	}
}
