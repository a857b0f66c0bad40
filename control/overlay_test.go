package control_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

// declsOf is every declaration on node's subject, oldest first, opened
// under the control key and parsed as a node parses them.
func declsOf(t *testing.T, s *served, node string) []*shapes.Declaration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj := link.SubjectsOf(node).Decl
	stream, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	n := info.State.Subjects[subj]
	if n == 0 {
		return nil
	}
	cons, err := s.client.JS.OrderedConsumer(ctx, link.DeclStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*shapes.Declaration
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeDeclaration, m.Data())
		if err != nil {
			t.Fatal(err)
		}
		d, err := shapes.Parse(payload)
		if err != nil {
			t.Fatalf("a composed declaration a node would refuse: %v", err)
		}
		out = append(out, d)
	}
	return out
}

// lastDecl is the newest declaration on node's subject, or nil.
func lastDecl(t *testing.T, s *served, node string) *shapes.Declaration {
	t.Helper()
	ds := declsOf(t, s, node)
	if len(ds) == 0 {
		return nil
	}
	return ds[len(ds)-1]
}

// overlayIn is the declaration's overlay resource, which must come first,
// with the peers it takes from the roster last published (as the node's
// executor fills them in): the declaration itself carries none, so its
// size does not grow with the mesh.
func overlayIn(t *testing.T, s *served, d *shapes.Declaration) *shapes.Overlay {
	t.Helper()
	if d == nil || len(d.Resources) == 0 {
		t.Fatalf("no declaration, or no resources: %+v", d)
	}
	o, ok := d.Resources[0].(*shapes.Overlay)
	if !ok || o.Module != control.OverlayModule || o.ID != control.OverlayID {
		t.Fatalf("the first resource is %+v, not the overlay", d.Resources[0].Head())
	}
	if !o.Roster || len(o.Peers) != 0 {
		t.Fatalf("the overlay of %s declares its peers (%d) instead of taking the roster's", d.Node, len(o.Peers))
	}
	r, err := s.client.LastRoster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	withPeers := *o
	if r != nil {
		withPeers.Peers = r.PeersFor(d.Node)
	}
	return &withPeers
}

// keys lists the resources' module.id in order.
func keys(d *shapes.Declaration) []string {
	var ks []string
	for _, r := range d.Resources {
		ks = append(ks, r.Head().Key())
	}
	return ks
}

func wgKey(t *testing.T, s *served, node string) string {
	t.Helper()
	rec, _, err := s.client.Node(context.Background(), node)
	if err != nil || rec.Keys == nil {
		t.Fatalf("node %s: %v %+v", node, err, rec)
	}
	return rec.Keys.WireGuard
}

func peerKeys(o *shapes.Overlay) []string {
	var ks []string
	for _, p := range o.Peers {
		ks = append(ks, p.PublicKey)
	}
	return ks
}

// Addresses: one per node, allocated once and kept, never two nodes on one
// address however many allocate at once (nodes through their own
// connections, each node several times concurrently); kept across
// re-enrolment; given back when the network changes; a full network says so.
func TestOverlayAddressesStableAndUnique(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := s.client.OverlayAddress(ctx, "x"); !errors.Is(err, control.ErrNoOverlay) {
		t.Fatalf("an address without an overlay: %v", err)
	}
	network := "10.98.0.0/26"
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &network}); err != nil {
		t.Fatal(err)
	}
	const n, per = 24, 3
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
		if _, _, err := s.client.AddNode(ctx, names[i], s.url); err != nil {
			t.Fatal(err)
		}
	}
	got := make([][per]netip.Prefix, n)
	errs := make(chan error, n*per)
	var wg sync.WaitGroup
	for i := range n {
		for k := range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := connect(ctx, s)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				got[i][k], err = c.OverlayAddress(ctx, names[i])
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(network)
	seen := map[netip.Addr]string{}
	for i, as := range got {
		for _, a := range as {
			if a != as[0] {
				t.Fatalf("%s was given %v at once", names[i], as)
			}
		}
		a := as[0]
		if a.Bits() != 26 || !p.Contains(a.Addr()) || a.Addr() == p.Addr() || a.Addr() == netip.MustParseAddr("10.98.0.63") {
			t.Fatalf("%s: address %s is not a host of %s with its prefix length", names[i], a, p)
		}
		if other, dup := seen[a.Addr()]; dup {
			t.Fatalf("%s and %s share %s", other, names[i], a)
		}
		seen[a.Addr()] = names[i]
	}
	// Stable: asked again, the same.
	for i, name := range names {
		if a, err := s.client.OverlayAddress(ctx, name); err != nil || a != got[i][0] {
			t.Fatalf("%s: %s then %s (%v)", name, got[i][0], a, err)
		}
	}
	// Exactly one claim per node: the losers of each race gave theirs back.
	l, err := s.client.KV.ListKeysFiltered(ctx, "ip.>")
	if err != nil {
		t.Fatal(err)
	}
	claims := 0
	for range l.Keys() {
		claims++
	}
	if claims != n {
		t.Fatalf("%d address claims for %d nodes", claims, n)
	}

	// Kept across re-enrolment.
	enrolNode(t, s, "alpha")
	before, err := s.client.OverlayAddress(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := s.client.IssueToken(ctx, "alpha", false, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	grantOf(t, s, must(request(t, s, text, newMachine(t).keys, nil)))
	if after, err := s.client.OverlayAddress(ctx, "alpha"); err != nil || after != before {
		t.Fatalf("alpha re-enrolled: address %s, was %s (%v)", after, before, err)
	}

	// Another network: addresses taken from it, the old claims given back.
	other := "10.97.0.0/24"
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &other}); err != nil {
		t.Fatal(err)
	}
	a, err := s.client.OverlayAddress(ctx, names[0])
	if err != nil || !netip.MustParsePrefix(other).Contains(a.Addr()) || a.Bits() != 24 {
		t.Fatalf("after the network changed: %s %v", a, err)
	}
	old := got[0][0].Addr().String()
	if _, err := s.client.KV.Get(ctx, "ip."+old); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the claim on %s outlived its node's move: %v", old, err)
	}

	// Full.
	tiny := "10.96.0.0/30"
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &tiny}); err != nil {
		t.Fatal(err)
	}
	// alpha, enrolled, is in the roster: serve's roster takes it an
	// address of the new network too, now or in a moment, racing this
	// ask for it; the race's loser gives its claim back. Taken here
	// first, and the /30's claims left to settle to alpha's one, so which
	// two hold the /30 does not depend on when.
	if _, err := s.client.OverlayAddress(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "one claim in the /30, alpha's", func() bool {
		l, err := s.client.KV.ListKeysFiltered(ctx, "ip.10.96.0.>")
		if err != nil {
			return false
		}
		claims := 0
		for range l.Keys() {
			claims++
		}
		return claims == 1
	})
	if _, err := s.client.OverlayAddress(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.OverlayAddress(ctx, names[1]); err == nil || !strings.Contains(err.Error(), "is full") {
		t.Fatalf("a third node in a /30: %v", err)
	}
	// An allocation for the network before (a roster composed a moment
	// before the change) takes nothing and gives nothing back: alpha stays
	// in the /30 and names[1] still finds it full.
	held, _ := s.client.OverlayAddress(ctx, "alpha")
	if _, err := s.client.Allocate(ctx, "alpha", netip.MustParsePrefix(other)); err == nil || !strings.Contains(err.Error(), "the overlay network became 10.96.0.0/30") {
		t.Fatalf("an allocation in the network before: %v", err)
	}
	if now, err := s.client.OverlayAddress(ctx, "alpha"); err != nil || now != held {
		t.Fatalf("alpha moved from %s to %s (%v)", held, now, err)
	}
	if _, err := s.client.OverlayAddress(ctx, names[1]); err == nil || !strings.Contains(err.Error(), "is full") {
		t.Fatalf("a third node in a /30, after a stale allocation: %v", err)
	}

	// Settings a node would refuse are refused here.
	for _, bad := range []control.OverlayChange{
		{Network: ptr("10.99.0.1/16")}, {Network: ptr("10.99.0.0/31")}, {Network: ptr("mesh")},
		{Interface: ptr("an-interface-name-too-long")}, {Interface: ptr("a/b")},
		{ListenPort: ptr(0)}, {ListenPort: ptr(70000)}, {Keepalive: ptr(-1)},
	} {
		if _, err := s.client.SetOverlay(ctx, bad); err == nil {
			t.Errorf("overlay set %+v was taken", bad)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Peers: every other live node, with the WireGuard key its executor bound
// at enrolment, its /32 and the keepalive; an endpoint where a person said
// one; a node registered by hand is out (it has no key on record), and a
// revoked node is dropped from everyone's peers.
func TestOverlayPeersFromEnrolmentKeys(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, n := range []string{"a", "b", "c"} {
		enrolNode(t, s, n)
	}
	addNode(t, s, "d")
	if d := lastDecl(t, s, "a"); d != nil {
		t.Fatalf("a declaration was composed before the mesh had an overlay: %v", keys(d))
	}
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	addr := func(n string) netip.Prefix {
		a, err := s.client.OverlayAddress(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	var o *shapes.Overlay
	eventually(t, "a's overlay names b and c", func() bool {
		d := lastDecl(t, s, "a")
		if d == nil {
			return false
		}
		o = overlayIn(t, s, d)
		return len(d.Resources) == 1 && strings.Join(peerKeys(o), ",") == wgKey(t, s, "b")+","+wgKey(t, s, "c")
	})
	if o.Interface != control.DefaultOverlayInterface || o.ListenPort != control.DefaultOverlayPort || o.Address != addr("a").String() ||
		!strings.HasSuffix(o.Address, "/16") {
		t.Fatalf("a's overlay: %+v", o)
	}
	for i, n := range []string{"b", "c"} {
		p := o.Peers[i]
		if len(p.AllowedIPs) != 1 || p.AllowedIPs[0] != addr(n).Addr().String()+"/32" || p.Keepalive != control.DefaultOverlayKeepalive || p.Endpoint != "" {
			t.Fatalf("a's peer %s: %+v", n, p)
		}
	}
	// d, registered by hand, is in no one's peers and composed nothing.
	var oe *control.OutOfOverlayError
	if _, err := s.client.Publish(ctx, "d", true); !errors.As(err, &oe) || !strings.Contains(oe.Why, "registered by hand") {
		t.Fatalf("publish to a node registered by hand: %v", err)
	}
	if d := lastDecl(t, s, "d"); d != nil {
		t.Fatalf("d was composed %v", keys(d))
	}

	// An endpoint: in the others' peers; a name is refused.
	if err := s.client.SetEndpoint(ctx, "b", "b.example.org:51820"); err == nil {
		t.Fatal("an endpoint by name was taken")
	}
	if err := s.client.SetEndpoint(ctx, "b", "192.0.2.7:51820"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b's endpoint in a's and c's overlay", func() bool {
		for _, n := range []string{"a", "c"} {
			found := false
			for _, p := range overlayIn(t, s, lastDecl(t, s, n)).Peers {
				found = found || p.PublicKey == wgKey(t, s, "b") && p.Endpoint == "192.0.2.7:51820"
			}
			if !found {
				return false
			}
		}
		return true
	})
	for _, p := range overlayIn(t, s, lastDecl(t, s, "b")).Peers {
		if p.Endpoint != "" {
			t.Fatalf("b's own overlay has an endpoint for a peer no one gave one: %+v", p)
		}
	}

	// c revoked: dropped from everyone's peers, and composed nothing more.
	cKey := wgKey(t, s, "c")
	cDecls := len(declsOf(t, s, "c"))
	if err := s.client.RevokeNode(ctx, "c", "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c gone from a's and b's peers", func() bool {
		return strings.Join(peerKeys(overlayIn(t, s, lastDecl(t, s, "a"))), ",") == wgKey(t, s, "b") &&
			strings.Join(peerKeys(overlayIn(t, s, lastDecl(t, s, "b"))), ",") == wgKey(t, s, "a")
	})
	if _, err := s.client.Publish(ctx, "c", true); !errors.As(err, &oe) || oe.Why != "revoked" {
		t.Fatalf("publish to a revoked node: %v", err)
	}
	if n := len(declsOf(t, s, "c")); n != cDecls {
		t.Fatalf("the revoked node was sent %d more declaration(s)", n-cDecls)
	}
	for _, n := range []string{"a", "b"} {
		for _, p := range overlayIn(t, s, lastDecl(t, s, n)).Peers {
			if p.PublicKey == cKey {
				t.Fatalf("%s still has the revoked node as a peer", n)
			}
		}
	}
	ns, err := s.client.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		want := map[string]string{"a": "none", "b": "none", "c": "out of the overlay: revoked", "d": "out of the overlay: registered by hand"}[n.Name]
		if want == "none" && !strings.HasPrefix(n.Assignments, "held until the node reports its overlay applied") || want != "none" && !strings.HasPrefix(n.Assignments, want) {
			t.Errorf("nodes: %s says %q", n.Name, n.Assignments)
		}
	}
	// The publishes are idempotent: asked again with nothing changed, no
	// node is sent anything.
	before := len(declsOf(t, s, "a"))
	if ps, _, err := s.client.PublishAll(ctx, false); err != nil || len(ps) != 2 || ps[0].Sent || ps[1].Sent {
		t.Fatalf("publish all, unchanged: %v %+v", err, ps)
	}
	if n := len(declsOf(t, s, "a")); n != before {
		t.Fatalf("an unchanged composition was sent again (%d → %d)", before, n)
	}
}

// A tiny network is not said full while one of its addresses is claimed
// only in passing — the loser of two allocations for one node, giving its
// claim back a moment later: the allocation looks again, and takes it.
func TestAClaimInPassingDoesNotFillTheNetwork(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tiny := "10.95.0.0/30"
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &tiny}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if _, _, err := s.client.AddNode(ctx, n, s.url); err != nil {
			t.Fatal(err)
		}
	}
	a, err := s.client.OverlayAddress(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// a's second claim, as the loser of a race holds it for a moment.
	other := "10.95.0.1"
	if a.Addr().String() == other {
		other = "10.95.0.2"
	}
	key := "ip." + other
	if _, err := s.client.KV.Create(ctx, key, []byte("a")); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		s.client.KV.Delete(context.Background(), key)
	}()
	b, err := s.client.OverlayAddress(ctx, "b")
	if err != nil || b.Addr().String() != other {
		t.Fatalf("b, while a's second claim was being given back: %s %v", b, err)
	}
}

// An address given back since the snapshot a roster's allocations read
// is free: a network that looks full by the snapshot's claims alone is
// looked at again with the claims as they are, never said full on the
// snapshot's word.
func TestASnapshotsStaleClaimsDoNotFillTheNetwork(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	network := "10.98.0.0/29"
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &network}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.client.AddNode(ctx, "a", s.url); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(network)
	stale := map[netip.Addr]bool{}
	for a := p.Addr().Next(); p.Contains(a.Next()); a = a.Next() {
		stale[a] = true // claimed when the snapshot was read, given back since
	}
	got, err := s.client.AllocateAmong(ctx, "a", p, stale)
	if err != nil {
		t.Fatalf("a network full only by a stale snapshot: %v", err)
	}
	if got != netip.MustParseAddr("10.98.0.1") {
		t.Fatalf("allocated %s, not the lowest free address", got)
	}
	if !stale[got] {
		t.Fatal("the address taken is not noted among the claims")
	}
}

// The last address of a network, taken by several allocations for one
// node at once (serve's roster and the command's, composing for the same
// node new to the overlay): every one of them ends on it. One that found
// the network full while the winner's claim was not yet its address, and
// looked again once it was, said "full".
func TestTheLastAddressRacedForByOneNodesAllocations(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	network := "10.97.0.0/29" // six hosts
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{Network: &network}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		name := fmt.Sprintf("a%d", i)
		if _, _, err := s.client.AddNode(ctx, name, s.url); err != nil {
			t.Fatal(err)
		}
		if _, err := s.client.OverlayAddress(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	const rounds, per = 12, 4
	for r := range rounds {
		name := fmt.Sprintf("last%d", r)
		if _, _, err := s.client.AddNode(ctx, name, s.url); err != nil {
			t.Fatal(err)
		}
		got := make([]netip.Prefix, per)
		errs := make([]error, per)
		var wg sync.WaitGroup
		for k := range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := connect(ctx, s)
				if err != nil {
					errs[k] = err
					return
				}
				defer c.Close()
				got[k], errs[k] = c.OverlayAddress(ctx, name)
			}()
		}
		wg.Wait()
		for k := range per {
			if errs[k] != nil || got[k] != got[0] {
				t.Fatalf("round %d: %s's allocations at once: %v %v", r, name, got, errs)
			}
		}
		// Its address given back for the next round's node.
		if err := s.client.RevokeNode(ctx, name, "the next round"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.client.DeleteNode(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
}
