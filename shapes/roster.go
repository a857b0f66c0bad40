package shapes

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Roster is the mesh's overlay: every node in it, with its WireGuard key,
// its overlay address and where it is reached. The control plane signs it
// (wire.PurposeRoster) once per change and publishes it once; each node's
// executor holds the newest it verified, and an overlay declared with
// "roster": true takes its peers from it (PeersFor). It is addressed to no
// node: it is the mesh's, and every node of the mesh pins the key that
// signs it. Seq orders rosters as a declaration's sequence orders
// declarations: an executor takes only a newer one.
type Roster struct {
	Version int    `json:"version"`
	Seq     uint64 `json:"seq"`
	// Keepalive (seconds) is set on every peer.
	Keepalive int          `json:"keepalive,omitempty"`
	Nodes     []RosterNode `json:"nodes"`
}

// RosterNode is one node of the roster. Address is its overlay address as
// one host (a /32 or /128): what its peers route to it.
type RosterNode struct {
	Node      string `json:"node"`
	PublicKey string `json:"public_key"`
	Address   string `json:"address"`
	Endpoint  string `json:"endpoint,omitempty"`
}

// MaxRosterSize bounds a roster's payload: about 150 bytes a node, so
// room for a few hundred thousand.
const MaxRosterSize = 48 << 20

// ParseRoster decodes and checks a roster strictly: version 1, a sequence,
// unknown fields refused, every node named once, every key a WireGuard key
// and held by one node only, every address one host and one node's.
func ParseRoster(payload []byte) (*Roster, error) {
	if len(payload) > MaxRosterSize {
		return nil, fmt.Errorf("roster: %d bytes, over %d", len(payload), MaxRosterSize)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var r Roster
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("roster: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("roster: data after the roster")
	}
	if r.Version != 1 {
		return nil, fmt.Errorf("roster: version %d; this host reads version 1", r.Version)
	}
	if r.Seq == 0 {
		return nil, errors.New("roster: no sequence")
	}
	if r.Keepalive < 0 || r.Keepalive > 65535 {
		return nil, fmt.Errorf("roster: keepalive %d is out of range 0..65535 seconds", r.Keepalive)
	}
	// Sized for the roster at once, and the error's place made only for
	// an error: a roster of 1,000 nodes is parsed by every node of the
	// overlay twice (agent, executor) each time it changes.
	size := len(r.Nodes)
	names, keys, addrs := make(map[string]bool, size), make(map[string]string, size), make(map[netip.Addr]string, size)
	for i, n := range r.Nodes {
		at := func() string { return fmt.Sprintf("roster: nodes[%d]", i) }
		if n.Node == "" || names[n.Node] {
			return nil, fmt.Errorf("%s: node %q is empty or named twice", at(), n.Node)
		}
		names[n.Node] = true
		if !IsWireGuardKey(n.PublicKey) {
			return nil, fmt.Errorf("%s (%s): public_key is not a base64 WireGuard public key (32 bytes)", at(), n.Node)
		}
		if other, dup := keys[n.PublicKey]; dup {
			return nil, fmt.Errorf("%s (%s): public_key is %s's too", at(), n.Node, other)
		}
		keys[n.PublicKey] = n.Node
		p, err := netip.ParsePrefix(n.Address)
		if err != nil || p.Bits() != p.Addr().BitLen() {
			return nil, fmt.Errorf("%s (%s): address %q is not one host (such as 10.44.0.3/32)", at(), n.Node, n.Address)
		}
		if other, dup := addrs[p.Addr()]; dup {
			return nil, fmt.Errorf("%s (%s): address %s is %s's too", at(), n.Node, p.Addr(), other)
		}
		addrs[p.Addr()] = n.Node
		if n.Endpoint != "" {
			if _, err := netip.ParseAddrPort(n.Endpoint); err != nil {
				return nil, fmt.Errorf("%s (%s): endpoint %q is not address:port", at(), n.Node, n.Endpoint)
			}
		}
	}
	return &r, nil
}

// IsWireGuardKey says whether s is a WireGuard public key as the mesh
// carries one: base64 of 32 bytes. The one rule for it — the control side
// puts a node in the roster by it, and every node reads the roster by it:
// a key one side took and the other refused would have every node refuse
// the whole roster.
func IsWireGuardKey(s string) bool {
	k, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(k) == 32
}

// PeersFor is the peers of node's overlay: every node of the roster but
// node itself, in the roster's order.
func (r *Roster) PeersFor(node string) []Peer {
	out := make([]Peer, 0, len(r.Nodes))
	for _, n := range r.Nodes {
		if n.Node == node {
			continue
		}
		out = append(out, Peer{PublicKey: n.PublicKey, Endpoint: n.Endpoint, AllowedIPs: []string{n.Address}, Keepalive: r.Keepalive})
	}
	return out
}

// RosterFloor is the oldest roster d's overlays may take their peers from
// (the highest roster_min; 0: any).
func (d *Declaration) RosterFloor() uint64 {
	var floor uint64
	for _, res := range d.Resources {
		if o, ok := res.(*Overlay); ok && o.Roster {
			floor = max(floor, o.RosterMin)
		}
	}
	return floor
}

// UsesRoster says whether d declares an overlay whose peers are the mesh's
// roster: what decides whether its host needs the roster at all.
func (d *Declaration) UsesRoster() bool {
	for _, res := range d.Resources {
		if o, ok := res.(*Overlay); ok && o.Roster {
			return true
		}
	}
	return false
}
