package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The overlay is derived here, centrally, and nowhere else: the network,
// the interface and the port are the mesh's (KV overlay.settings), each
// node's address is allocated once from the network and kept (address.<n>,
// with the claim ip.<address> that makes it one node's), its peers are the
// other live nodes with the WireGuard key their executors bound at
// enrolment, and an endpoint is what a person said a node is reached at
// (endpoint.<n>). A node never proposes any of it: its agent is trusted for
// nothing, so a key it reported in a heartbeat is not taken either.

// The overlay's defaults, for what `overlay set` is not told.
const (
	DefaultOverlayNetwork   = "10.99.0.0/16"
	DefaultOverlayInterface = "mesh0"
	DefaultOverlayPort      = 51820
	DefaultOverlayKeepalive = 25
)

// OverlayModule and OverlayID name the overlay resource, the first of every
// composed declaration. The module is reserved: no assigned module may use
// it.
const (
	OverlayModule = "mesh"
	OverlayID     = "overlay"
)

const overlaySettingsKey = "overlay.settings"

func addressKey(node string) string  { return "address." + node }
func endpointKey(node string) string { return "endpoint." + node }

// ipKey is the claim on one overlay address. A KV key may not hold ':', so
// an IPv6 address is written with '_' instead.
func ipKey(a netip.Addr) string { return "ip." + strings.ReplaceAll(a.String(), ":", "_") }

// addressOfIPKey is the address of a claim's key (ipKey's inverse).
func addressOfIPKey(k string) (netip.Addr, bool) {
	rest, ok := strings.CutPrefix(k, "ip.")
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(strings.ReplaceAll(rest, "_", ":"))
	return a, err == nil
}

// ErrNoOverlay is returned by what composes or allocates when no overlay is
// set for the mesh (`mesh-control overlay set` sets one).
var ErrNoOverlay = errors.New("no overlay is set for this mesh (mesh-control overlay set)")

// OverlaySettings are the mesh's overlay (KV overlay.settings).
type OverlaySettings struct {
	// Network is the prefix node addresses are allocated from; each node's
	// address carries its length, so the whole network routes through the
	// interface.
	Network    string `json:"network"`
	Interface  string `json:"interface"`
	ListenPort int    `json:"listen_port"`
	// Keepalive (seconds) is set on every peer: a node behind NAT, which
	// no one can reach first, keeps its mapping open by it.
	Keepalive int       `json:"keepalive"`
	Changed   time.Time `json:"changed"`
}

// OverlayChange is what `overlay set` changes; nil keeps the current value
// (or the default, when none is set yet).
type OverlayChange struct {
	Network    *string
	Interface  *string
	ListenPort *int
	Keepalive  *int
}

// take sets what ch gives.
func (s *OverlaySettings) take(ch OverlayChange) {
	if ch.Network != nil {
		s.Network = *ch.Network
	}
	if ch.Interface != nil {
		s.Interface = *ch.Interface
	}
	if ch.ListenPort != nil {
		s.ListenPort = *ch.ListenPort
	}
	if ch.Keepalive != nil {
		s.Keepalive = *ch.Keepalive
	}
}

// Check refuses a change no settings could take — each value it gives is
// checked by itself, by the rule SetOverlay checks the settings with — so
// the command says so before it asks the broker for anything.
func (ch OverlayChange) Check() error {
	s := defaultOverlay()
	s.take(ch)
	if err := ch.checkNew(); err != nil {
		return err
	}
	return s.check()
}

// checkNew refuses, of what ch changes, what no mesh is set to anew: an
// interface a machine's own links are named (a mesh already set so keeps
// it until it is changed: its nodes run it).
func (ch OverlayChange) checkNew() error {
	if ch.Interface == nil || !shapes.IsInterfaceName(*ch.Interface) {
		return nil // the declaration's rule says it (check)
	}
	return notAMachineLink(*ch.Interface)
}

// defaultOverlay is the settings of a mesh that has set none.
func defaultOverlay() *OverlaySettings {
	return &OverlaySettings{Network: DefaultOverlayNetwork, Interface: DefaultOverlayInterface,
		ListenPort: DefaultOverlayPort, Keepalive: DefaultOverlayKeepalive}
}

// prefix checks s and returns its network.
func (s *OverlaySettings) prefix() (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s.Network)
	if err != nil {
		return p, fmt.Errorf("overlay network %q is not a prefix such as %s", s.Network, DefaultOverlayNetwork)
	}
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
	if p != p.Masked() {
		return p, fmt.Errorf("overlay network %s has host bits set; the network is %s", s.Network, p.Masked())
	}
	if p.Addr().BitLen()-p.Bits() < 2 {
		return p, fmt.Errorf("overlay network %s leaves no room for nodes", p)
	}
	return p, nil
}

// check validates the settings the way a node will: the overlay resource
// they make must parse as a link declaration's.
func (s *OverlaySettings) check() error {
	p, err := s.prefix()
	if err != nil {
		return err
	}
	if !shapes.IsInterfaceName(s.Interface) {
		return fmt.Errorf("overlay interface %q is not an interface name: at most 15 of letters, digits, _ and -", s.Interface)
	}
	if s.ListenPort < 1 || s.ListenPort > 65535 {
		return fmt.Errorf("overlay listen port %d is out of range 1..65535", s.ListenPort)
	}
	if s.Keepalive < 0 || s.Keepalive > 65535 {
		return fmt.Errorf("overlay keepalive %d is out of range 0..65535 seconds", s.Keepalive)
	}
	probe := s.resource(netip.PrefixFrom(p.Addr().Next(), p.Bits()))
	raw, _ := json.Marshal(probe)
	return checkResources([]json.RawMessage{raw})
}

// machineLinks are the names the kernel and the usual tools give a
// machine's own links. A node's executor never touches an interface of
// another kind than WireGuard, so an overlay named so would fail on every
// node that has it (its uplink, most often), and fail late: refused here.
var machineLinks = []string{"lo", "eth", "en", "wl", "ww", "ib", "sl", "bond", "br", "virbr", "veth", "docker", "podman", "cni", "tun", "tap", "vlan", "team"}

// notAMachineLink refuses an overlay interface name a machine's own
// links go by.
func notAMachineLink(name string) error {
	for _, p := range machineLinks {
		if strings.HasPrefix(name, p) && (p != "lo" || name == "lo") {
			return fmt.Errorf("overlay interface %q is a name a machine's own links take (%s…): the overlay's is a WireGuard interface the nodes make, named so no link of theirs is, such as %s", name, p, DefaultOverlayInterface)
		}
	}
	return nil
}

// resource is the overlay resource of a node at addr: its peers are the
// roster's.
func (s *OverlaySettings) resource(addr netip.Prefix) *shapes.Overlay {
	return &shapes.Overlay{
		Base:      shapes.Base{Module: OverlayModule, ID: OverlayID, Type: shapes.TypeOverlay},
		Interface: s.Interface, Address: addr.String(), ListenPort: s.ListenPort, Roster: true,
	}
}

// checkResources parses resources as a link declaration would carry them:
// what every node would refuse (an action, an unknown field, two resources
// managing one thing) is refused here, before anything is recorded.
func checkResources(resources []json.RawMessage) error {
	probe, _ := json.Marshal(map[string]any{"version": 1, "node": "probe", "enrolment": "probe", "seq": 1, "resources": resources})
	_, err := linkParse(probe)
	return err
}

// Overlay returns the mesh's overlay settings, or ErrNoOverlay.
func (c *Client) Overlay(ctx context.Context) (*OverlaySettings, error) {
	s, _, err := c.overlaySettings(ctx)
	return s, err
}

func (c *Client) overlaySettings(ctx context.Context) (*OverlaySettings, uint64, error) {
	e, err := c.KV.Get(ctx, overlaySettingsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNoOverlay
	}
	if err != nil {
		return nil, 0, fmt.Errorf("registry: the overlay settings: %w", err)
	}
	var s OverlaySettings
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, 0, fmt.Errorf("registry: the overlay settings: %w", err)
	}
	return &s, e.Revision(), nil
}

// SetOverlay changes the overlay settings (making them, with the defaults
// for what ch leaves nil, when none are set) with compare-and-set. Nodes'
// addresses outside a changed network are allocated again at their next
// composition; the caller publishes.
func (c *Client) SetOverlay(ctx context.Context, ch OverlayChange) (*OverlaySettings, error) {
	for attempt := 0; attempt < 100; attempt++ {
		s, rev, err := c.overlaySettings(ctx)
		if errors.Is(err, ErrNoOverlay) {
			s = defaultOverlay()
		} else if err != nil {
			return nil, err
		}
		was := s.Network
		if rev == 0 {
			was = "" // the first settings: every node takes an address
		}
		s.take(ch)
		if err := ch.checkNew(); err != nil {
			return nil, err
		}
		if err := s.check(); err != nil {
			return nil, err
		}
		p, _ := s.prefix()
		if p.String() != was {
			if err := c.roomFor(ctx, p); err != nil {
				return nil, err
			}
		}
		s.Network, s.Changed = p.String(), time.Now().UTC()
		data, _ := json.Marshal(s)
		if rev == 0 {
			_, err = c.KV.Create(ctx, overlaySettingsKey, data)
		} else {
			_, err = c.KV.Update(ctx, overlaySettingsKey, data, rev)
		}
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("registry: the overlay settings: %w", err)
		}
	}
	return nil, errors.New("registry: the overlay settings kept changing; not set")
}

// roomFor refuses a network with fewer addresses than the nodes in the
// overlay, before the settings are written: taken, some nodes would move
// to it and the rest be left out, the roster unpublished. An address in
// it that a node out of the overlay still holds (revoked, not deleted:
// its claim is kept with its record, claimFreeOnce) is no room.
func (c *Client) roomFor(ctx context.Context, network netip.Prefix) error {
	rs, err := c.records(ctx)
	if err != nil {
		return err
	}
	nodes, held := 0, 0
	for _, r := range rs {
		if _, out := overlayKey(r); out == "" {
			nodes++
		} else if a, _, ok := c.address(ctx, r.Name); ok && network.Contains(a) {
			if owner, _ := c.claimOwner(ctx, a); owner == r.Name {
				held++
			}
		}
	}
	// Its hosts: the network's own address is none's, nor an IPv4
	// network's broadcast address.
	bits := network.Addr().BitLen() - network.Bits()
	if bits >= 31 {
		return nil // more than any fleet
	}
	room := 1<<bits - 1
	if network.Addr().Is4() {
		room--
	}
	if held > 0 && nodes > room-held {
		return fmt.Errorf("overlay network %s has room for %d node(s), %d of its addresses held by nodes out of the overlay (revoked, not deleted: mesh-control node delete frees them), and %d are in the overlay: nothing changed; give a larger network", network, max(room, 0), held, nodes)
	}
	if nodes > room {
		return fmt.Errorf("overlay network %s has room for %d node(s), and %d are in the overlay: nothing changed; give a larger network", network, max(room, 0), nodes)
	}
	return nil
}

// overlayKey returns node's WireGuard public key as bound at enrolment, or
// why the node is out of the overlay. A node registered by hand has no key
// on record; the one its heartbeat reports is not taken, because the agent
// relays it and the agent is trusted for nothing — enrolment is what binds
// a key to a node.
func overlayKey(r *NodeRecord) (key, out string) {
	switch {
	case r.NKey == "" || !r.Revoked.IsZero():
		return "", "revoked"
	case r.Keys == nil || r.Keys.WireGuard == "":
		return "", fmt.Sprintf("registered by hand: no WireGuard key was bound at enrolment (token issue --node %s enrols it)", r.Name)
	}
	if !shapes.IsWireGuardKey(r.Keys.WireGuard) {
		return "", "the WireGuard key on record is not a key"
	}
	return r.Keys.WireGuard, ""
}

// addressRecord is a node's overlay address (KV address.<n>).
type addressRecord struct {
	Address   string    `json:"address"`
	Allocated time.Time `json:"allocated"`
}

// OverlayAddress returns node's overlay address with the network's prefix
// length, allocating it when the node has none in the network yet.
func (c *Client) OverlayAddress(ctx context.Context, node string) (netip.Prefix, error) {
	s, err := c.Overlay(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	p, err := s.prefix()
	if err != nil {
		return netip.Prefix{}, err
	}
	a, err := c.allocate(ctx, node, p)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, p.Bits()), nil
}

// address reads node's address record without allocating.
func (c *Client) address(ctx context.Context, node string) (netip.Addr, uint64, bool) {
	e, err := c.KV.Get(ctx, addressKey(node))
	if err != nil {
		return netip.Addr{}, 0, false
	}
	var r addressRecord
	if json.Unmarshal(e.Value(), &r) != nil {
		return netip.Addr{}, e.Revision(), false
	}
	a, err := netip.ParseAddr(r.Address)
	return a, e.Revision(), err == nil
}

// claimOwner is the node holding the claim on a, with the claim's revision.
func (c *Client) claimOwner(ctx context.Context, a netip.Addr) (string, uint64) {
	e, err := c.KV.Get(ctx, ipKey(a))
	if err != nil {
		return "", 0
	}
	return string(e.Value()), e.Revision()
}

// allocate gives node an address in network, once. The claim ip.<address>
// is made with create-only, so two nodes never hold one address; the
// node's pointer address.<n> with compare-and-set, so two allocations for
// one node at once end on one address (the loser gives its claim back). An
// address is kept across re-enrolment (it is the name's); one outside a
// changed network is given back when a new one is taken. A claim whose node
// record is gone is free again.
func (c *Client) allocate(ctx context.Context, node string, network netip.Prefix) (netip.Addr, error) {
	return c.allocateAmong(ctx, node, network, nil)
}

// allocateAmong is allocate, told which addresses are claimed by a
// snapshot of the registry that the caller read (claimed, kept up to date
// with what it claims and finds claimed; nil: the claims are listed at
// each look). ComposeRoster gives an address to every node new to the
// overlay from one snapshot: a listing of the claims for each of them was
// a consumer over the whole registry each, and with serve composing the
// same roster beside the command, `overlay set` on 1,000 nodes of 10,000
// spent its first 20 s there (make bench-scale, profiled). Not for use
// by two goroutines at once with one claimed.
func (c *Client) allocateAmong(ctx context.Context, node string, network netip.Prefix, claimed map[netip.Addr]bool) (a netip.Addr, err error) {
	defer func() {
		if err == nil && claimed != nil {
			claimed[a] = true
		}
	}()
	for attempt := 0; attempt < 20; attempt++ {
		old, rev, ok := c.address(ctx, node)
		if ok && network.Contains(old) {
			owner, _ := c.claimOwner(ctx, old)
			if owner == node {
				return old, nil
			}
			if owner == "" {
				if _, err := c.KV.Create(ctx, ipKey(old), []byte(node)); err == nil {
					return old, nil
				}
			}
		}
		cand, claimRev, err := c.claimFree(ctx, node, network, claimed)
		if err != nil {
			// Full, perhaps of this node's own address: another
			// allocation for it (serve's roster beside the command's)
			// took the last one while this looked.
			if now, _, ok := c.address(ctx, node); ok && network.Contains(now) {
				if owner, _ := c.claimOwner(ctx, now); owner == node {
					return now, nil
				}
			}
			return netip.Addr{}, err
		}
		// The network may have changed since the caller read it (serve's
		// roster, composed a moment ago, racing a person's overlay set):
		// an address of the old network written now would move the node
		// out of the new one and give back the claim it holds there. So
		// when the node holds an address of another network, the
		// settings are read again just before the write (only then: a
		// first allocation, the common one, moves no one and pays no
		// read — measured, 1,000 of them slowed overlay set by seconds);
		// what is left is the moment between this read and the write.
		if ok && !network.Contains(old) {
			if cur, err := c.Overlay(ctx); err == nil {
				if now, err := cur.prefix(); err == nil && now != network {
					c.KV.Delete(ctx, ipKey(cand), jetstream.LastRevision(claimRev))
					return netip.Addr{}, fmt.Errorf("registry: the overlay network became %s while an address of %s was being taken for %s", now, network, node)
				}
			}
		}
		data, _ := json.Marshal(&addressRecord{Address: cand.String(), Allocated: time.Now().UTC()})
		if rev == 0 {
			_, err = c.KV.Create(ctx, addressKey(node), data)
		} else {
			_, err = c.KV.Update(ctx, addressKey(node), data, rev)
		}
		if err == nil {
			if ok && old != cand {
				c.release(ctx, node, old)
			}
			return cand, nil
		}
		// Another allocation for this node won: give the claim back, take
		// its address.
		c.KV.Delete(ctx, ipKey(cand), jetstream.LastRevision(claimRev))
		delete(claimed, cand)
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return netip.Addr{}, fmt.Errorf("registry: the overlay address of %s: %w", node, err)
		}
	}
	return netip.Addr{}, fmt.Errorf("registry: the overlay address of %s kept changing", node)
}

// claimFree claims the lowest free address of network for node: first
// among those no claim names, then among those whose node is gone. A
// network found full while a claim is not its node's address (the loser
// of two allocations for one node, giving its claim back; an allocation
// between its claim and its pointer) is looked at again, a moment later,
// a few times: such a claim is about to be given back or to be the
// node's, and only a network full of nodes' addresses is full.
//
// The first look takes the claims as claimed says (when not nil); the
// looks again list them, as they are then. A network that looks full by
// claimed alone is looked at again at once with the claims listed: an
// address given back since the snapshot (a node deleted, the loser of two
// allocations) is free, and only the listing says so.
func (c *Client) claimFree(ctx context.Context, node string, network netip.Prefix, claimed map[netip.Addr]bool) (netip.Addr, uint64, error) {
	if claimed != nil {
		a, rev, _, err := c.claimFreeOnce(ctx, node, network, claimed)
		if err == nil {
			return a, rev, nil
		}
	}
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		a, rev, passing, err := c.claimFreeOnce(ctx, node, network, nil)
		if err == nil || !passing || wait > 640*time.Millisecond {
			return a, rev, err
		}
		select {
		case <-ctx.Done():
			return a, rev, err
		case <-time.After(wait):
		}
	}
}

// claimFreeOnce is one look of claimFree; passing says, of a network
// found full, that a claim in it is not its node's address.
func (c *Client) claimFreeOnce(ctx context.Context, node string, network netip.Prefix, claimed map[netip.Addr]bool) (netip.Addr, uint64, bool, error) {
	taken := claimed
	if taken == nil {
		taken = map[netip.Addr]bool{}
		l, err := c.KV.ListKeysFiltered(ctx, "ip.>")
		if err != nil {
			return netip.Addr{}, 0, false, fmt.Errorf("registry: listing overlay addresses: %w", err)
		}
		for k := range l.Keys() {
			if a, ok := addressOfIPKey(k); ok {
				taken[a] = true
			}
		}
	}
	hosts := func(yield func(netip.Addr) bool) {
		for a := network.Addr().Next(); network.Contains(a); a = a.Next() {
			if a.Is4() && !network.Contains(a.Next()) {
				return // the broadcast address
			}
			if !yield(a) {
				return
			}
		}
	}
	for a := range hosts {
		if taken[a] {
			continue
		}
		rev, err := c.KV.Create(ctx, ipKey(a), []byte(node))
		if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
			taken[a] = true
		}
		if err == nil {
			return a, rev, false, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return netip.Addr{}, 0, false, fmt.Errorf("registry: claiming overlay address %s: %w", a, err)
		}
	}
	passing := false
	for a := range hosts {
		owner, rev := c.claimOwner(ctx, a)
		if owner == "" {
			continue
		}
		if _, _, err := c.Node(ctx, owner); err == nil {
			if at, _, ok := c.address(ctx, owner); !ok || at != a {
				passing = true
			}
			continue
		}
		if rev, err := c.KV.Update(ctx, ipKey(a), []byte(node), rev); err == nil {
			return a, rev, false, nil
		}
	}
	return netip.Addr{}, 0, passing, fmt.Errorf("overlay network %s is full: every address is a node's", network)
}

// release gives node's claim on a back, if it still is node's.
func (c *Client) release(ctx context.Context, node string, a netip.Addr) {
	if owner, rev := c.claimOwner(ctx, a); owner == node {
		c.KV.Delete(ctx, ipKey(a), jetstream.LastRevision(rev))
	}
}

// endpointRecord is where a person said a node is reached (KV
// endpoint.<n>).
type endpointRecord struct {
	Endpoint string    `json:"endpoint"`
	Set      time.Time `json:"set"`
}

// SetEndpoint records the underlay address:port node is reached at ("" to
// forget it). A node without one is a peer without an endpoint: the others
// wait for it to reach them, and its keepalive keeps its NAT open. Only an
// address is taken, not a name: a name resolved here would pin whatever it
// resolved to when the declaration was composed, and the declaration says
// address:port.
func (c *Client) SetEndpoint(ctx context.Context, node, endpoint string) error {
	if _, _, err := c.Node(ctx, node); err != nil {
		return err
	}
	if endpoint == "" {
		if err := c.KV.Delete(ctx, endpointKey(node)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("registry: %w", err)
		}
		return nil
	}
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil || ap.Port() == 0 {
		return fmt.Errorf("endpoint %q is not address:port (an IP address, not a name: 192.0.2.7:51820, [2001:db8::7]:51820)", endpoint)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	data, _ := json.Marshal(&endpointRecord{Endpoint: ap.String(), Set: time.Now().UTC()})
	if _, err := c.KV.Put(ctx, endpointKey(node), data); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

// endpoint is where node is reached, "" when no one said.
func (c *Client) endpoint(ctx context.Context, node string) string {
	var r endpointRecord
	c.getJSON(ctx, endpointKey(node), &r)
	return r.Endpoint
}

// overlayOf derives the overlay resource of node (its record rec): its
// interface, port and address, its peers the mesh's roster (roster.go). A
// node out of the overlay gets none, and the reason.
func (c *Client) overlayOf(ctx context.Context, s *OverlaySettings, rec *NodeRecord) (*shapes.Overlay, error) {
	network, err := s.prefix()
	if err != nil {
		return nil, err
	}
	if _, out := overlayKey(rec); out != "" {
		return nil, &OutOfOverlayError{Node: rec.Name, Why: out}
	}
	addr, err := c.allocate(ctx, rec.Name, network)
	if err != nil {
		return nil, err
	}
	return s.resource(netip.PrefixFrom(addr, network.Bits())), nil
}

// OutOfOverlayError says why a node has no place in the overlay, and so is
// composed nothing.
type OutOfOverlayError struct {
	Node, Why string
}

func (e *OutOfOverlayError) Error() string {
	return fmt.Sprintf("node %s is out of the overlay: %s", e.Node, e.Why)
}
