package overlay

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Spec is what a declaration asks of one interface, in WireGuard's terms.
type Spec struct {
	Interface string
	// PrivateKey is the executor's key; nil when it is not made yet (a
	// plan on a host that has none), and then not compared.
	PrivateKey *wgtypes.Key
	ListenPort int // 0: any port WireGuard picks
	Address    netip.Prefix
	Peers      []PeerSpec
}

// PeerSpec is one declared peer.
type PeerSpec struct {
	PublicKey  wgtypes.Key
	Endpoint   netip.AddrPort // zero: not declared (the peer roams)
	AllowedIPs []netip.Prefix // masked, sorted
	Keepalive  time.Duration
}

// Observed is what the machine has under the interface's name.
type Observed struct {
	Exists bool   // a link of that name exists
	Kind   string // the link's kind: "wireguard" (kernel), "tun" (userspace), ...
	Up     bool   // administratively up
	// Addrs are the link's global addresses.
	Addrs []netip.Prefix
	// Device is WireGuard's own view, nil when no WireGuard answers for
	// the name.
	Device *wgtypes.Device
}

// Changes are what it takes to go from Observed to Spec; none means it
// matches.
type Changes struct {
	Create      bool // no WireGuard interface: bring one up
	Key         bool
	ListenPort  bool
	RemovePeers []wgtypes.Key
	SetPeers    []PeerSpec // added, or changed in place
	AddAddress  bool
	DelAddrs    []netip.Prefix
	Up          bool
	// Lines say each difference, for the report. They name public keys,
	// never the private one.
	Lines []string
}

// None reports whether nothing differs.
func (c Changes) None() bool { return len(c.Lines) == 0 }

// Diff compares what the machine has with what is declared. It is pure: no
// system call, no clock.
func Diff(want Spec, got Observed) Changes {
	var c Changes
	if !got.Exists || got.Device == nil {
		c.Create, c.Key, c.AddAddress, c.Up = true, true, true, true
		c.ListenPort = want.ListenPort != 0
		c.SetPeers = slices.Clone(want.Peers)
		c.Lines = append(c.Lines, "no WireGuard interface "+want.Interface)
		return c
	}
	d := got.Device
	if want.PrivateKey != nil && d.PrivateKey != *want.PrivateKey {
		c.Key = true
		c.Lines = append(c.Lines, fmt.Sprintf("its private key is not the executor's (public key %s, want %s)", short(d.PublicKey), short(want.PrivateKey.PublicKey())))
	}
	if want.ListenPort != 0 && d.ListenPort != want.ListenPort {
		c.ListenPort = true
		c.Lines = append(c.Lines, fmt.Sprintf("listen port %d, want %d", d.ListenPort, want.ListenPort))
	}
	declared := map[wgtypes.Key]bool{}
	for _, p := range want.Peers {
		declared[p.PublicKey] = true
	}
	have := map[wgtypes.Key]wgtypes.Peer{}
	for _, p := range d.Peers {
		have[p.PublicKey] = p
		if !declared[p.PublicKey] {
			c.RemovePeers = append(c.RemovePeers, p.PublicKey)
			c.Lines = append(c.Lines, "peer "+short(p.PublicKey)+" not declared")
		}
	}
	for _, p := range want.Peers {
		h, ok := have[p.PublicKey]
		if !ok {
			c.SetPeers = append(c.SetPeers, p)
			c.Lines = append(c.Lines, "peer "+short(p.PublicKey)+" missing")
			continue
		}
		var why []string
		if p.Endpoint.IsValid() && endpointOf(h.Endpoint) != p.Endpoint {
			why = append(why, fmt.Sprintf("endpoint %v, want %v", endpointOf(h.Endpoint), p.Endpoint))
		}
		if got := prefixesOf(h.AllowedIPs); !slices.Equal(got, p.AllowedIPs) {
			why = append(why, fmt.Sprintf("allowed IPs %v, want %v", got, p.AllowedIPs))
		}
		if h.PersistentKeepaliveInterval != p.Keepalive {
			why = append(why, fmt.Sprintf("keepalive %v, want %v", h.PersistentKeepaliveInterval, p.Keepalive))
		}
		if len(why) > 0 {
			c.SetPeers = append(c.SetPeers, p)
			c.Lines = append(c.Lines, "peer "+short(p.PublicKey)+": "+strings.Join(why, ", "))
		}
	}
	if !slices.Contains(got.Addrs, want.Address) {
		c.AddAddress = true
		c.Lines = append(c.Lines, "address "+want.Address.String()+" missing")
	}
	for _, a := range got.Addrs {
		if a != want.Address {
			c.DelAddrs = append(c.DelAddrs, a)
			c.Lines = append(c.Lines, "address "+a.String()+" not declared")
		}
	}
	if !got.Up {
		c.Up = true
		c.Lines = append(c.Lines, "link down")
	}
	return c
}

// short is a public key as a report names it: its first characters.
func short(k wgtypes.Key) string { return k.String()[:8] + "…" }

func endpointOf(a *net.UDPAddr) netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// prefixesOf turns allowed IPs as WireGuard reports them into masked,
// sorted prefixes.
func prefixesOf(ns []net.IPNet) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ns))
	for _, n := range ns {
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		bits, _ := n.Mask.Size()
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, bits).Masked())
	}
	SortPrefixes(out)
	return out
}

// SortPrefixes sorts prefixes by address, then length.
func SortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// ipNets turns prefixes into what wgtypes takes.
func ipNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	return out
}
