package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nox-mesh/nox-mesh-host/executor/overlay"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// An overlay is a WireGuard interface: the executor's own private key, a
// listen port, exactly the declared peers, the declared address, and the
// link up. It is observed (the link through iproute2, WireGuard's view
// through wgctrl), changed only where it differs — a peer added, changed or
// removed in place, so the sessions of the others are kept — and read back
// whole. The interface lives in the kernel where it has WireGuard, otherwise
// under a userspace wireguard-go that the init runs, never the executor
// (executor/overlay says how). Undeclared, the interface is removed.
//
// The private key is made on the first apply of a host that has none (an
// enrolled host has one from enrolment) and kept in the state directory;
// reports name public keys only.

// overlayBackend is the engine's seam to WireGuard; *overlay.Backend is the
// real one.
type overlayBackend interface {
	Observe(ctx context.Context, iface string) (overlay.Observed, error)
	Describe(iface string, o overlay.Observed) string
	Create(ctx context.Context, iface string) (string, error)
	Configure(ctx context.Context, want overlay.Spec, c overlay.Changes) error
	Remove(ctx context.Context, iface string) error
	Gone(iface string) error
}

// newOverlayBackend gives the backend for one apply; tests replace it.
var newOverlayBackend = func(r *run) overlayBackend {
	b := &overlay.Backend{}
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() && r.connectInit() == nil && r.init.Name() == "systemd" {
		b.Init = r.init
	}
	return b
}

// overlayKeys are the executor's key's seam; tests replace them.
var (
	loadOverlayKey   = overlay.LoadKey
	ensureOverlayKey = overlay.EnsureKey
)

// overlaySpec turns a declared overlay into WireGuard's terms. It refuses
// what WireGuard would silently take otherwise: a peer declared twice.
func overlaySpec(o *shapes.Overlay) (overlay.Spec, error) {
	s := overlay.Spec{Interface: o.Interface, ListenPort: o.ListenPort}
	a, err := netip.ParsePrefix(o.Address)
	if err != nil {
		return s, fmt.Errorf("address %q: %w", o.Address, err)
	}
	s.Address = netip.PrefixFrom(a.Addr().Unmap(), a.Bits())
	seen := map[wgtypes.Key]bool{}
	for i, p := range o.Peers {
		k, err := wgtypes.ParseKey(p.PublicKey)
		if err != nil {
			return s, fmt.Errorf("peers[%d].public_key: %w", i, err)
		}
		if seen[k] {
			return s, fmt.Errorf("peers[%d]: public key %s is declared twice", i, p.PublicKey)
		}
		seen[k] = true
		ps := overlay.PeerSpec{PublicKey: k, Keepalive: time.Duration(p.Keepalive) * time.Second}
		if p.Endpoint != "" {
			ap, err := netip.ParseAddrPort(p.Endpoint)
			if err != nil {
				return s, fmt.Errorf("peers[%d].endpoint %q: %w", i, p.Endpoint, err)
			}
			ps.Endpoint = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		}
		for _, x := range p.AllowedIPs {
			pf, err := netip.ParsePrefix(x)
			if err != nil {
				return s, fmt.Errorf("peers[%d].allowed_ips %q: %w", i, x, err)
			}
			pf = netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()).Masked()
			if !slices.Contains(ps.AllowedIPs, pf) {
				ps.AllowedIPs = append(ps.AllowedIPs, pf)
			}
		}
		overlay.SortPrefixes(ps.AllowedIPs)
		s.Peers = append(s.Peers, ps)
	}
	return s, nil
}

// overlayDigest summarises what is declared (and the key's public half), so
// a later apply tells drift from a changed declaration.
func overlayDigest(s overlay.Spec, pub string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "if=%s addr=%s port=%d pub=%s", s.Interface, s.Address, s.ListenPort, pub)
	peers := slices.Clone(s.Peers)
	slices.SortFunc(peers, func(a, b overlay.PeerSpec) int { return strings.Compare(a.PublicKey.String(), b.PublicKey.String()) })
	for _, p := range peers {
		fmt.Fprintf(&b, " peer=%s,%v,%v,%v", p.PublicKey, p.Endpoint, p.AllowedIPs, p.Keepalive)
	}
	return digest([]byte(b.String()))
}

// overlay observes an interface, changes what differs, and reads it back.
func (r *run) overlay(st *step, rest int) {
	o := st.res.(*shapes.Overlay)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	peersFrom := ""
	if o.Roster {
		if r.opt.Roster == nil {
			r.fail(st, fmt.Errorf("its peers are the mesh's roster, and this host holds none yet (the agent brings it from the link)"), rest)
			return
		}
		if r.opt.Roster.Seq < o.RosterMin {
			// The roster held is older than the mesh this declaration was
			// composed for (a first roster taken from a replay, say): its
			// peers may include a node revoked since. Nothing is changed
			// until the newer one comes; the executor applies again then.
			r.fail(st, fmt.Errorf("its peers are the mesh's roster from seq %d on, and this host holds seq %d, older (the agent brings the newer one from the link)", o.RosterMin, r.opt.Roster.Seq), rest)
			return
		}
		self := r.opt.NodeID
		if self == "" {
			self = r.d.Node
		}
		withPeers := *o
		withPeers.Peers = r.opt.Roster.PeersFor(self)
		o = &withPeers
		peersFrom = fmt.Sprintf(" (the mesh's roster %d)", r.opt.Roster.Seq)
	}
	spec, err := overlaySpec(o)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	// The executor's key: read in a plan, made on the first real apply.
	var made bool
	var k wgtypes.Key
	if r.opt.Plan {
		var ok bool
		if k, ok, err = loadOverlayKey(r.st.Dir()); ok {
			spec.PrivateKey = &k
		}
	} else {
		k, made, err = ensureOverlayKey(r.st.Dir())
		spec.PrivateKey = &k
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	pub := "(not made yet)"
	if spec.PrivateKey != nil {
		pub = spec.PrivateKey.PublicKey().String()
		for _, p := range spec.Peers {
			if p.PublicKey == spec.PrivateKey.PublicKey() {
				r.fail(st, fmt.Errorf("a peer has this node's own public key %s", pub), rest)
				return
			}
		}
	}
	b := newOverlayBackend(r)
	cur, err := b.Observe(r.ctx, o.Interface)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if cur.Exists && cur.Device == nil {
		r.fail(st, fmt.Errorf("interface %s exists and is not WireGuard (a %q link); not touched", o.Interface, cur.Kind), rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeOverlay, Claims: withClaim(e, st.claim), Digest: overlayDigest(spec, pub)}
	if e != nil {
		n.Order, n.Created = e.Order, e.Created
	}

	// Held: found on an adopted node, its module not yet taken. Its key is
	// whatever it has; the rest is compared for the briefing.
	if cur.Exists && r.holds(o.Module, e) {
		noKey := spec
		noKey.PrivateKey = nil
		r.heldOK[o.Key()] = overlay.Diff(noKey, cur).None()
		n.Held, n.Digest = true, ""
		st.line.Outcome, st.line.Detail = shapes.Held, fmt.Sprintf("found on an adopted node (%s); held as found until module %s is taken", b.Describe(o.Interface, cur), o.Module)
		if !r.opt.Plan && (e == nil || !e.Claimed(st.claim)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	n.Held = false

	ch := overlay.Diff(spec, cur)
	if ch.None() {
		st.line.Outcome = shapes.Unchanged
		st.line.Detail = fmt.Sprintf("%s, public key %s, %s%s", b.Describe(o.Interface, cur), pub, countWord(len(spec.Peers), "peer", "peers"), peersFrom)
		r.asDeclared(st, e, n, e != nil && e.Held, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	var said []string
	if made {
		said = append(said, "made the executor's WireGuard key")
	}
	if spec.PrivateKey == nil {
		said = append(said, "would make the executor's WireGuard key")
	}
	said = append(said, ch.Lines...)
	if r.opt.Plan {
		st.line.Detail = strings.Join(said, "; ")
		r.emit(st.line)
		return
	}
	// Brought back to exactly what the store records (a boot took the
	// interface, or a person changed it): there is nothing to announce or
	// record, so a full disk under the store does not keep the overlay
	// down, and a cut in the middle leaves the record as true as it was.
	recorded := r.recordsOwn(e, st.claim) && !e.Recovered && e.Digest == n.Digest && (e.Created || cur.Exists)
	if !recorded && st.restoring {
		// The declaration changes the overlay the store records, and the
		// apply stopped before its step: what it declares is not brought
		// in past the failure, nor the store written on a full disk.
		r.fail(st, errors.New("not put back: the overlay the store records is gone, and this declaration changes it; its step, which the apply did not reach, brings it up"), 0)
		return
	}
	if !recorded && !r.intendNow(st, store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeOverlay, Created: !cur.Exists}, rest) {
		return
	}
	if ch.Create {
		how, err := b.Create(r.ctx, o.Interface)
		if err != nil {
			r.fail(st, err, rest)
			return
		}
		said[len(said)-len(ch.Lines)] = "brought up: " + how
		n.Created = n.Created || !cur.Exists
		// What a new interface already has (wireguard-go's defaults) is
		// seen before it is configured.
		if cur, err = b.Observe(r.ctx, o.Interface); err != nil {
			r.fail(st, err, rest)
			return
		}
		ch = overlay.Diff(spec, cur)
		if ch.Create {
			r.fail(st, fmt.Errorf("read back: %s was brought up but no WireGuard answers for it", o.Interface), rest)
			return
		}
	}
	if err := b.Configure(r.ctx, spec, ch); err != nil {
		r.fail(st, err, rest)
		return
	}
	got, err := b.Observe(r.ctx, o.Interface)
	if err == nil {
		if d := overlay.Diff(spec, got); !d.None() {
			err = fmt.Errorf("%s", strings.Join(d.Lines, "; "))
		}
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	st.line.Detail = strings.Join(said, "; ") + fmt.Sprintf("; public key %s, %s%s", pub, countWord(len(spec.Peers), "peer", "peers"), peersFrom)
	if recorded {
		r.emit(st.line)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// planOverlayRemoval removes an interface nobody declares any more.
func (r *run) planOverlayRemoval(st *step) {
	iface := strings.TrimPrefix(st.entry.Target, "overlay:")
	b := newOverlayBackend(r)
	st.line.Outcome, st.line.Detail = shapes.Removed, "interface "+iface+" removed"
	if r.opt.Plan {
		st.line.Detail = "interface " + iface + " would be removed"
		return
	}
	st.intent = &store.Intent{Op: "remove", Type: shapes.TypeOverlay, Claim: firstClaim(st.entry)}
	st.change = func() error { return b.Remove(r.ctx, iface) }
	st.readback = func() (*store.Entry, error) { return nil, b.Gone(iface) }
}

func init() {
	registerAlone(shapes.TypeOverlay, (*run).overlay, (*run).planOverlayRemoval)
}
