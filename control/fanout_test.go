package control_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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
// batched get names, so the batches are exercised.
func TestDeclareAll(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 1100
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
		rec, _, err := s.client.Node(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := str.GetLastMsgForSubject(ctx, link.SubjectsOf(name).Decl)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
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
}
