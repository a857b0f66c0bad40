package overlay

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func key(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// device is what WireGuard would report for spec, as a real device reads
// back: allowed IPs as net.IPNet, endpoints as *net.UDPAddr.
func device(s Spec) *wgtypes.Device {
	d := &wgtypes.Device{Name: s.Interface, Type: wgtypes.Userspace, ListenPort: s.ListenPort}
	if s.PrivateKey != nil {
		d.PrivateKey, d.PublicKey = *s.PrivateKey, s.PrivateKey.PublicKey()
	}
	for _, p := range s.Peers {
		wp := wgtypes.Peer{PublicKey: p.PublicKey, AllowedIPs: ipNets(p.AllowedIPs), PersistentKeepaliveInterval: p.Keepalive}
		if p.Endpoint.IsValid() {
			wp.Endpoint = net.UDPAddrFromAddrPort(p.Endpoint)
		}
		d.Peers = append(d.Peers, wp)
	}
	return d
}

func TestDiff(t *testing.T) {
	priv, a, b, c := key(t), key(t).PublicKey(), key(t).PublicKey(), key(t).PublicKey()
	spec := Spec{Interface: "wg0", PrivateKey: &priv, ListenPort: 51820, Address: netip.MustParsePrefix("10.233.0.1/24"),
		Peers: []PeerSpec{
			{PublicKey: a, Endpoint: netip.MustParseAddrPort("10.231.0.2:51820"), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.233.0.2/32")}, Keepalive: 5 * time.Second},
			{PublicKey: b, AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.233.1.0/24"), netip.MustParsePrefix("fd00::/64")}},
		}}
	match := func() Observed {
		return Observed{Exists: true, Kind: "tun", Up: true, Addrs: []netip.Prefix{spec.Address}, Device: device(spec)}
	}

	if c := Diff(spec, match()); !c.None() {
		t.Fatalf("a matching device differs: %v", c.Lines)
	}
	// An IPv4 endpoint WireGuard reports as IPv4-in-IPv6 is the same one.
	o := match()
	o.Device.Peers[0].Endpoint = &net.UDPAddr{IP: net.ParseIP("10.231.0.2").To16(), Port: 51820}
	if c := Diff(spec, o); !c.None() {
		t.Fatalf("a mapped endpoint differs: %v", c.Lines)
	}
	// A peer that roams (no endpoint declared) may be anywhere.
	o = match()
	o.Device.Peers[1].Endpoint = &net.UDPAddr{IP: net.ParseIP("192.0.2.9"), Port: 4000}
	if c := Diff(spec, o); !c.None() {
		t.Fatalf("a roaming peer's endpoint differs: %v", c.Lines)
	}
	// Listen port 0 means any.
	s0 := spec
	s0.ListenPort = 0
	o = match()
	o.Device.ListenPort = 40123
	if c := Diff(s0, o); !c.None() {
		t.Fatalf("an undeclared port differs: %v", c.Lines)
	}
	// Nothing there: everything is to do.
	if c := Diff(spec, Observed{}); !c.Create || !c.Key || !c.ListenPort || len(c.SetPeers) != 2 || !c.AddAddress || !c.Up {
		t.Fatalf("absent: %+v", c)
	}

	cases := []struct {
		name  string
		drift func(o *Observed)
		check func(c Changes) bool
		line  string
	}{
		{"a peer removed by hand", func(o *Observed) { o.Device.Peers = o.Device.Peers[1:] },
			func(c Changes) bool {
				return len(c.SetPeers) == 1 && c.SetPeers[0].PublicKey == a && len(c.RemovePeers) == 0
			}, "missing"},
		{"a peer added by hand", func(o *Observed) { o.Device.Peers = append(o.Device.Peers, wgtypes.Peer{PublicKey: c}) },
			func(ch Changes) bool {
				return len(ch.RemovePeers) == 1 && ch.RemovePeers[0] == c && len(ch.SetPeers) == 0
			}, "not declared"},
		{"another private key", func(o *Observed) { k := key(t); o.Device.PrivateKey, o.Device.PublicKey = k, k.PublicKey() },
			func(c Changes) bool { return c.Key }, "private key is not the executor's"},
		{"another port", func(o *Observed) { o.Device.ListenPort = 1 }, func(c Changes) bool { return c.ListenPort }, "listen port 1, want 51820"},
		{"another endpoint", func(o *Observed) { o.Device.Peers[0].Endpoint.Port = 9 },
			func(c Changes) bool { return len(c.SetPeers) == 1 && c.SetPeers[0].PublicKey == a }, "endpoint 10.231.0.2:9"},
		{"an allowed IP dropped", func(o *Observed) { o.Device.Peers[1].AllowedIPs = o.Device.Peers[1].AllowedIPs[:1] },
			func(c Changes) bool { return len(c.SetPeers) == 1 && c.SetPeers[0].PublicKey == b }, "allowed IPs"},
		{"keepalive changed", func(o *Observed) { o.Device.Peers[0].PersistentKeepaliveInterval = 0 },
			func(c Changes) bool { return len(c.SetPeers) == 1 }, "keepalive 0s, want 5s"},
		{"the address removed", func(o *Observed) { o.Addrs = nil }, func(c Changes) bool { return c.AddAddress && len(c.DelAddrs) == 0 }, "address 10.233.0.1/24 missing"},
		{"another address", func(o *Observed) { o.Addrs = []netip.Prefix{netip.MustParsePrefix("10.9.9.9/8")} },
			func(c Changes) bool { return c.AddAddress && len(c.DelAddrs) == 1 }, "address 10.9.9.9/8 not declared"},
		{"same address, other length", func(o *Observed) { o.Addrs = []netip.Prefix{netip.MustParsePrefix("10.233.0.1/16")} },
			func(c Changes) bool { return c.AddAddress && len(c.DelAddrs) == 1 }, "10.233.0.1/16 not declared"},
		{"the link down", func(o *Observed) { o.Up = false }, func(c Changes) bool { return c.Up }, "link down"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := match()
			tc.drift(&o)
			ch := Diff(spec, o)
			if ch.None() || ch.Create || !tc.check(ch) || !strings.Contains(strings.Join(ch.Lines, "; "), tc.line) {
				t.Fatalf("%+v", ch)
			}
			if strings.Contains(strings.Join(ch.Lines, " "), priv.String()) {
				t.Fatal("a line names the private key")
			}
		})
	}
}

func TestParseLink(t *testing.T) {
	out := `[{"ifindex":5,"ifname":"wg0","flags":["POINTOPOINT","NOARP","UP","LOWER_UP"],"mtu":1420,"linkinfo":{"info_kind":"tun","info_data":{"type":"tun","pi":true}},
	"addr_info":[{"family":"inet","local":"10.233.0.1","prefixlen":24,"scope":"global","label":"wg0"},{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]}]`
	o, err := parseLink([]byte(out))
	if err != nil || !o.Exists || !o.Up || o.Kind != "tun" || len(o.Addrs) != 1 || o.Addrs[0] != netip.MustParsePrefix("10.233.0.1/24") {
		t.Fatalf("%+v %v", o, err)
	}
	o, err = parseLink([]byte(`[{"ifname":"wg0","flags":["POINTOPOINT","NOARP"],"linkinfo":{"info_kind":"wireguard"},"addr_info":[]}]`))
	if err != nil || o.Up || o.Kind != "wireguard" || len(o.Addrs) != 0 {
		t.Fatalf("%+v %v", o, err)
	}
}

// The key is made once, root-only, with its public half beside it; a key
// file anyone else could have written is refused, not used.
func TestKey(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := LoadKey(dir); ok || err != nil {
		t.Fatalf("a key before one was made: %v %v", ok, err)
	}
	k, made, err := EnsureKey(dir)
	if err != nil || !made {
		t.Fatalf("%v %v", made, err)
	}
	info, _ := os.Stat(filepath.Join(dir, KeyFile))
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", info.Mode())
	}
	pub, _ := os.ReadFile(filepath.Join(dir, PubFile))
	if strings.TrimSpace(string(pub)) != k.PublicKey().String() {
		t.Fatalf("pub %q", pub)
	}
	k2, made, err := EnsureKey(dir)
	if err != nil || made || k2 != k {
		t.Fatal("the key was made again")
	}
	// The public file is made again from the key when it is wrong.
	os.WriteFile(filepath.Join(dir, PubFile), []byte("x\n"), 0o644)
	EnsureKey(dir)
	if pub, _ := os.ReadFile(filepath.Join(dir, PubFile)); strings.TrimSpace(string(pub)) != k.PublicKey().String() {
		t.Fatalf("pub %q", pub)
	}
	os.Chmod(filepath.Join(dir, KeyFile), 0o644)
	if _, _, err := EnsureKey(dir); err == nil || !strings.Contains(err.Error(), "not used") {
		t.Fatalf("a group-readable key was used: %v", err)
	}
	os.Chmod(filepath.Join(dir, KeyFile), 0o600)
	os.Rename(filepath.Join(dir, KeyFile), filepath.Join(dir, "elsewhere"))
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, KeyFile))
	if _, _, err := EnsureKey(dir); err == nil {
		t.Fatal("a key through a symbolic link was used")
	}
}
