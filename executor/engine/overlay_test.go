package engine

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// fakeWG is WireGuard as a transcript: interfaces held in memory, changed
// only by what the engine asks. The real backend is driven in the lab
// (tests/machines/overlay_test.go).
type fakeWG struct {
	ifs map[string]*overlay.Observed
	log []string
}

func (f *fakeWG) Observe(_ context.Context, iface string) (overlay.Observed, error) {
	o, ok := f.ifs[iface]
	if !ok {
		return overlay.Observed{}, nil
	}
	c := *o
	c.Addrs = slices.Clone(o.Addrs)
	if o.Device != nil {
		d := *o.Device
		d.Peers = slices.Clone(o.Device.Peers)
		c.Device = &d
	}
	return c, nil
}

func (f *fakeWG) Describe(string, overlay.Observed) string { return "fake" }

func (f *fakeWG) Create(_ context.Context, iface string) (string, error) {
	f.log = append(f.log, "create "+iface)
	f.ifs[iface] = &overlay.Observed{Exists: true, Kind: "tun", Device: &wgtypes.Device{Name: iface, Type: wgtypes.Userspace}}
	return "fake", nil
}

func (f *fakeWG) Configure(_ context.Context, want overlay.Spec, c overlay.Changes) error {
	o := f.ifs[want.Interface]
	d := o.Device
	if c.Key {
		f.log = append(f.log, "key")
		d.PrivateKey, d.PublicKey = *want.PrivateKey, want.PrivateKey.PublicKey()
	}
	if c.ListenPort {
		d.ListenPort = want.ListenPort
	}
	for _, k := range c.RemovePeers {
		f.log = append(f.log, "remove peer")
		d.Peers = slices.DeleteFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == k })
	}
	for _, p := range c.SetPeers {
		f.log = append(f.log, "set peer")
		d.Peers = slices.DeleteFunc(d.Peers, func(x wgtypes.Peer) bool { return x.PublicKey == p.PublicKey })
		wp := wgtypes.Peer{PublicKey: p.PublicKey, PersistentKeepaliveInterval: p.Keepalive}
		for _, a := range p.AllowedIPs {
			wp.AllowedIPs = append(wp.AllowedIPs, net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())})
		}
		if p.Endpoint.IsValid() {
			wp.Endpoint = net.UDPAddrFromAddrPort(p.Endpoint)
		}
		d.Peers = append(d.Peers, wp)
	}
	for _, a := range c.DelAddrs {
		o.Addrs = slices.DeleteFunc(o.Addrs, func(x netip.Prefix) bool { return x == a })
	}
	if c.AddAddress {
		f.log = append(f.log, "address")
		o.Addrs = append(o.Addrs, want.Address)
	}
	if c.Up {
		o.Up = true
	}
	return nil
}

func (f *fakeWG) Remove(_ context.Context, iface string) error {
	f.log = append(f.log, "remove "+iface)
	delete(f.ifs, iface)
	return nil
}

func (f *fakeWG) Gone(iface string) error {
	if _, ok := f.ifs[iface]; ok {
		return errors.New("still there")
	}
	return nil
}

func withFakeWG(t *testing.T) *fakeWG {
	f := &fakeWG{ifs: map[string]*overlay.Observed{}}
	old := newOverlayBackend
	newOverlayBackend = func(*run) overlayBackend { return f }
	t.Cleanup(func() { newOverlayBackend = old })
	return f
}

func overlayDoc(iface string, peers ...string) string {
	return `{"module":"mesh","id":"wg","type":"overlay","interface":"` + iface + `","address":"10.233.0.1/24","listen_port":51820,"peers":[` + strings.Join(peers, ",") + `]}`
}

func peerDoc(pub wgtypes.Key, ip string) string {
	return `{"public_key":"` + pub.String() + `","endpoint":"10.231.0.2:51820","allowed_ips":["` + ip + `"],"keepalive":5}`
}

// The overlay applier's decisions: applied with the executor's own key,
// unchanged when it matches, drift repaired, a changed declaration applied
// in place, undeclared removed; the private key never in a report.
func TestOverlayApplier(t *testing.T) {
	h := newHarness(t)
	f := withFakeWG(t)
	peer, _ := wgtypes.GeneratePrivateKey()
	decl := h.doc(overlayDoc("wg0", peerDoc(peer.PublicKey(), "10.233.0.2/32")))

	// A plan on a host with no key makes none.
	rep := h.run("local", decl, true)
	if rep.Outcome != shapes.Applied || !strings.Contains(rep.Lines[0].Detail, "would make the executor's WireGuard key") {
		t.Fatalf("plan: %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(h.state, overlay.KeyFile)); err == nil || len(f.log) != 0 {
		t.Fatal("a plan made the key or touched WireGuard")
	}

	rep = h.apply(decl)
	if outcomes(rep) != "mesh.wg=applied" || !strings.Contains(rep.Lines[0].Detail, "made the executor's WireGuard key") {
		t.Fatalf("%+v", rep)
	}
	k, ok, err := overlay.LoadKey(h.state)
	if !ok || err != nil {
		t.Fatalf("no key kept: %v", err)
	}
	pub, _ := os.ReadFile(filepath.Join(h.state, overlay.PubFile))
	if strings.TrimSpace(string(pub)) != k.PublicKey().String() || !strings.Contains(rep.Lines[0].Detail, k.PublicKey().String()) {
		t.Fatalf("public key %q, report %q", pub, rep.Lines[0].Detail)
	}
	raw, _ := json.Marshal(rep)
	if strings.Contains(string(raw), k.String()) {
		t.Fatal("the report carries the private key")
	}
	d := f.ifs["wg0"].Device
	if d.PrivateKey != k || d.ListenPort != 51820 || len(d.Peers) != 1 || !f.ifs["wg0"].Up {
		t.Fatalf("device %+v", d)
	}

	f.log = nil
	if rep = h.apply(decl); outcomes(rep) != "mesh.wg=unchanged" || len(f.log) != 0 {
		t.Fatalf("%+v %v", rep, f.log)
	}

	// Drift: a peer removed by hand and the address removed, repaired in
	// place; the interface is not made again, the key not set again.
	f.ifs["wg0"].Device.Peers = nil
	f.ifs["wg0"].Addrs = nil
	rep = h.apply(decl)
	if outcomes(rep) != "mesh.wg=repaired" || strings.Join(f.log, ",") != "set peer,address" {
		t.Fatalf("%+v %v", rep, f.log)
	}

	// A changed declaration: the old peer removed, the new one added.
	other, _ := wgtypes.GeneratePrivateKey()
	f.log = nil
	rep = h.apply(h.doc(overlayDoc("wg0", peerDoc(other.PublicKey(), "10.233.0.3/32"))))
	if outcomes(rep) != "mesh.wg=applied" || strings.Join(f.log, ",") != "remove peer,set peer" {
		t.Fatalf("%+v %v", rep, f.log)
	}

	// The executor's own key as a peer fails the step.
	rep = h.apply(h.doc(overlayDoc("wg0", peerDoc(k.PublicKey(), "10.233.0.3/32"))))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "own public key") {
		t.Fatalf("%+v", rep)
	}

	// A link of the name that is not WireGuard is not touched.
	f.ifs["eth9"] = &overlay.Observed{Exists: true, Kind: "veth"}
	rep = h.apply(h.doc(overlayDoc("eth9")))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "is not WireGuard") || f.ifs["eth9"] == nil {
		t.Fatalf("%+v", rep)
	}

	// Undeclared: removed.
	f.log = nil
	rep = h.apply(h.doc())
	if outcomes(rep) != "mesh.wg=removed" || f.ifs["wg0"] != nil {
		t.Fatalf("%+v %v", rep, f.log)
	}
	// The key stays: it is the node's, not the interface's.
	if k2, ok, _ := overlay.LoadKey(h.state); !ok || k2 != k {
		t.Fatal("the key went with the interface")
	}
}

func TestOverlaySpec(t *testing.T) {
	k, _ := wgtypes.GeneratePrivateKey()
	o := &shapes.Overlay{Interface: "wg0", Address: "10.233.0.1/24", Peers: []shapes.Peer{
		{PublicKey: k.PublicKey().String(), Endpoint: "[::ffff:10.231.0.2]:51820", AllowedIPs: []string{"10.233.0.9/24", "10.233.0.0/24", "10.1.0.0/16"}, Keepalive: 25}}}
	s, err := overlaySpec(o)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Peers[0]
	if s.Address.String() != "10.233.0.1/24" || p.Endpoint.String() != "10.231.0.2:51820" || p.Keepalive.Seconds() != 25 ||
		len(p.AllowedIPs) != 2 || p.AllowedIPs[0].String() != "10.1.0.0/16" || p.AllowedIPs[1].String() != "10.233.0.0/24" {
		t.Fatalf("%+v", s)
	}
	// The digest follows the declaration, not the order of its peers.
	k2, _ := wgtypes.GeneratePrivateKey()
	o.Peers = append(o.Peers, shapes.Peer{PublicKey: k2.PublicKey().String(), AllowedIPs: []string{"10.2.0.0/16"}})
	s1, _ := overlaySpec(o)
	slices.Reverse(o.Peers)
	s2, _ := overlaySpec(o)
	if overlayDigest(s1, "p") != overlayDigest(s2, "p") || overlayDigest(s1, "p") == overlayDigest(s, "p") {
		t.Fatal("digest")
	}
	o.Peers = append(o.Peers, o.Peers[0])
	if _, err := overlaySpec(o); err == nil || !strings.Contains(err.Error(), "declared twice") {
		t.Fatalf("a peer declared twice: %v", err)
	}
}

// An overlay declared with "roster": true takes as peers every node of the
// roster the host holds but itself: none held fails the step saying so; a
// newer roster changes the peers in place; the same roster again changes
// nothing.
func TestOverlayPeersFromTheRoster(t *testing.T) {
	h := newHarness(t)
	f := withFakeWG(t)
	h.node = "self"
	decl := strings.Replace(h.doc(`{"module":"mesh","id":"wg","type":"overlay","interface":"wg0","address":"10.233.0.1/24","listen_port":51820,"roster":true}`),
		`{"version":1,`, `{"version":1,"node":"self",`, 1)
	rep := h.apply(decl)
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "holds none") || len(f.ifs) != 0 {
		t.Fatalf("with no roster: %+v", rep)
	}
	keys := map[string]wgtypes.Key{}
	for _, n := range []string{"self", "a", "b", "c"} {
		k, _ := wgtypes.GeneratePrivateKey()
		keys[n] = k.PublicKey()
	}
	roster := func(seq uint64, names ...string) *shapes.Roster {
		r := &shapes.Roster{Version: 1, Seq: seq, Keepalive: 25}
		for _, n := range names {
			host := map[string]byte{"self": 1, "a": 2, "b": 3, "c": 4}[n]
			r.Nodes = append(r.Nodes, shapes.RosterNode{Node: n, PublicKey: keys[n].String(), Address: netip.AddrFrom4([4]byte{10, 233, 0, host}).String() + "/32"})
		}
		return r
	}
	h.roster = roster(1, "self", "a", "b")
	rep = h.apply(decl)
	d := f.ifs["wg0"].Device
	if outcomes(rep) != "mesh.wg=applied" || len(d.Peers) != 2 || !strings.Contains(rep.Lines[0].Detail, "2 peers") && !strings.Contains(rep.Lines[0].Detail, "peer") {
		t.Fatalf("with a roster of three: %+v, %d peers", rep, len(d.Peers))
	}
	for _, p := range d.Peers {
		if p.PublicKey == keys["self"] || p.PersistentKeepaliveInterval.Seconds() != 25 {
			t.Fatalf("peer %v (keepalive %v): the node itself, or not the roster's keepalive", p.PublicKey, p.PersistentKeepaliveInterval)
		}
	}
	f.log = nil
	if rep = h.apply(decl); outcomes(rep) != "mesh.wg=unchanged" || len(f.log) != 0 {
		t.Fatalf("the same roster again: %+v %v", rep, f.log)
	}
	// b leaves, c joins: one removed, one set, in place.
	h.roster = roster(2, "a", "self", "c")
	rep = h.apply(decl)
	if outcomes(rep) != "mesh.wg=applied" || strings.Join(f.log, ",") != "remove peer,set peer" {
		t.Fatalf("a newer roster: %+v %v", rep, f.log)
	}
	var got []wgtypes.Key
	for _, p := range f.ifs["wg0"].Device.Peers {
		got = append(got, p.PublicKey)
	}
	if len(got) != 2 || !slices.Contains(got, keys["a"]) || !slices.Contains(got, keys["c"]) {
		t.Fatalf("peers after the newer roster: %v", got)
	}

	// A declaration composed when the mesh's roster was 3 is not applied
	// from roster 2, which still names c: nothing changes until roster 3.
	floored := strings.Replace(decl, `"roster":true`, `"roster":true,"roster_min":3`, 1)
	h.roster = roster(2, "a", "self", "c")
	f.log = nil
	rep = h.apply(floored)
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "from seq 3 on, and this host holds seq 2") || len(f.log) != 0 {
		t.Fatalf("a roster older than the declaration's floor: %+v %v", rep, f.log)
	}
	h.roster = roster(3, "a", "self")
	if rep = h.apply(floored); outcomes(rep) != "mesh.wg=applied" || len(f.ifs["wg0"].Device.Peers) != 1 {
		t.Fatalf("the roster the floor names: %+v", rep)
	}
}
