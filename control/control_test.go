package control_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

const decl = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/tmp/mesh-test/motd","content":"hi\n","mode":"0644"}]}`

// init → serve (embedded) → node add → 20 concurrent declares: the
// sequences are strictly increasing and distinct, and each envelope on the
// stream opens under the control key and says its node, enrolment and seq.
func TestDeclareSequencesUnderConcurrency(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, ex, err := s.client.AddNode(ctx, "web1", "")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Node != "web1" || ex.Enrolment != cfg.Enrolment || ex.ControlKey != s.keys.ControlPublicBase64() {
		t.Fatalf("executor identity %+v does not match the config %+v", ex, cfg)
	}
	if _, _, err := s.client.AddNode(ctx, "web1", ""); err == nil {
		t.Fatal("a second node add of the same name succeeded")
	}
	const n = 20
	var wg sync.WaitGroup
	seqs := make([]uint64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := s.client
			if i%2 == 1 { // half of them through their own connections
				cc, err := connect(ctx, s)
				if err != nil {
					errs[i] = err
					return
				}
				defer cc.Close()
				c = cc
			}
			seqs[i], errs[i] = c.Declare(ctx, "web1", []byte(decl))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i := range seqs {
		if seqs[i] != uint64(i+1) {
			t.Fatalf("sequences %v: not 1..%d, each once", seqs, n)
		}
	}
	// What is on the stream, in stream order: the node reads only the
	// newest, so the declarations must be on it in the order of their
	// sequences, whatever order the declares published in, and the last
	// is the last taken. (Some declares find a newer one there and
	// publish nothing; the stream keeps the last few per node.)
	str, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := str.Info(ctx, jetstream.WithSubjectFilter("mesh.decl.web1"))
	if err != nil {
		t.Fatal(err)
	}
	kept := si.State.Subjects["mesh.decl.web1"]
	if kept == 0 || kept > link.DeclsPerNode {
		t.Fatalf("%d declarations kept for web1, want 1 to %d", kept, link.DeclsPerNode)
	}
	cons, err := s.client.JS.OrderedConsumer(ctx, link.DeclStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"mesh.decl.web1"}})
	if err != nil {
		t.Fatal(err)
	}
	var order []uint64
	for range kept {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeDeclaration, m.Data())
		if err != nil {
			t.Fatalf("the envelope on the stream does not open: %v", err)
		}
		d, err := shapes.Parse(payload)
		if err != nil {
			t.Fatal(err)
		}
		if d.Node != "web1" || d.Enrolment != cfg.Enrolment || d.Seq < 1 || d.Seq > n {
			t.Fatalf("declaration on the stream: node %q enrolment %q seq %d", d.Node, d.Enrolment, d.Seq)
		}
		if len(order) > 0 && d.Seq <= order[len(order)-1] {
			t.Fatalf("declarations on the stream in the order %v, %d: an older one after a newer", order, d.Seq)
		}
		order = append(order, d.Seq)
	}
	if order[len(order)-1] != n {
		t.Fatalf("the newest on the stream is %d, want %d (the last taken): %v", order[len(order)-1], n, order)
	}
	t.Logf("on the stream, in order: %v", order)
	rec, _, err := s.client.Node(ctx, "web1")
	if err != nil || rec.NextSeq != n+1 {
		t.Fatalf("record %+v, %v: next sequence should be %d", rec, err, n+1)
	}
	// A declaration every node would refuse is refused before signing,
	// and takes no sequence.
	if _, err := s.client.Declare(ctx, "web1", []byte(`{"version":1,"resources":[{"module":"m","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/true"]}]}`)); err == nil {
		t.Fatal("declare signed an action")
	}
	if rec, _, _ := s.client.Node(ctx, "web1"); rec.NextSeq != n+1 {
		t.Fatalf("a refused declare took a sequence: next %d", rec.NextSeq)
	}
}

// The per-node durable consumers an earlier version made on MESH_DECL are
// deleted when the control side connects (nothing per node is kept on the
// broker); any other consumer of the stream is left alone.
func TestOldNodeConsumersDeleted(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"node-web1", "node-web2", "audit"} {
		if _, err := s.client.JS.CreateConsumer(ctx, link.DeclStream, jetstream.ConsumerConfig{
			Durable: name, FilterSubject: "mesh.decl.web1", AckPolicy: jetstream.AckExplicitPolicy,
		}); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := connect(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	str, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	names := str.ConsumerNames(ctx)
	for n := range names.Name() {
		left = append(left, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "audit" {
		t.Fatalf("consumers of %s after connecting: %v, want [audit]", link.DeclStream, left)
	}
}
