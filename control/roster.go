package control

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The roster is the overlay's peers, for the whole mesh at once: every
// live node with the WireGuard key its executor bound at enrolment, its
// overlay address and its endpoint (shapes.Roster). A node's declaration
// carries only its own overlay — interface, address, port — with
// "roster": true, so its size does not grow with the mesh, and a node
// joining or leaving changes one roster, published once (link.RosterStream),
// not every node's declaration. The control plane signs it as it signs a
// declaration (wire.PurposeRoster); the executor verifies it under the
// pinned key and takes only a newer one.
//
// It is composed from one snapshot of the registry (one watch of the keys
// it needs, not a read per node), so publishing it is O(N) however many
// nodes changed.

// DigestHeader carries the digest of a roster's content (without its
// sequence) beside its envelope: a roster the same as the last is not
// published again. Nothing a node reads.
const DigestHeader = "Mesh-Digest"

// RosterPublished says what PublishRoster did.
type RosterPublished struct {
	// Seq is the roster's sequence; Sent says this call published it
	// (otherwise the last roster was exactly this one).
	Seq   uint64 `json:"seq"`
	Sent  bool   `json:"sent"`
	Nodes int    `json:"nodes"`
	// Bytes is the size of its envelope.
	Bytes int `json:"bytes"`
}

// ComposeRoster composes the mesh's roster now, from one snapshot of the
// registry, without its sequence. A node in the overlay without an address
// in the network yet is given one.
func (c *Client) ComposeRoster(ctx context.Context) (*shapes.Roster, error) {
	s, err := c.Overlay(ctx)
	if err != nil {
		return nil, err
	}
	network, err := s.prefix()
	if err != nil {
		return nil, err
	}
	vals, err := c.values(ctx, "node.*", "address.*", "ip.>", "endpoint.*")
	if err != nil {
		return nil, err
	}
	var names []string
	for k := range vals {
		if n, ok := strings.CutPrefix(k, "node."); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	// The claims the snapshot holds, for the nodes given an address here.
	claimed := map[netip.Addr]bool{}
	for k := range vals {
		if a, ok := addressOfIPKey(k); ok {
			claimed[a] = true
		}
	}
	r := &shapes.Roster{Version: 1, Keepalive: s.Keepalive, Nodes: []shapes.RosterNode{}}
	for _, name := range names {
		var rec NodeRecord
		if json.Unmarshal(vals["node."+name], &rec) != nil {
			continue
		}
		key, out := overlayKey(&rec)
		if out != "" {
			continue
		}
		var a netip.Addr
		var ar addressRecord
		if json.Unmarshal(vals[addressKey(name)], &ar) == nil {
			a, _ = netip.ParseAddr(ar.Address)
		}
		// The snapshot's address stands if it is in the network and its
		// claim is this node's; otherwise it is allocated (rare: a node
		// new to the overlay, or a changed network).
		if !a.IsValid() || !network.Contains(a) || string(vals[ipKey(a)]) != name {
			if a, err = c.allocateAmong(ctx, name, network, claimed); err != nil {
				return nil, fmt.Errorf("roster: %s: %w", name, err)
			}
		}
		var ep endpointRecord
		json.Unmarshal(vals[endpointKey(name)], &ep)
		r.Nodes = append(r.Nodes, shapes.RosterNode{Node: name, PublicKey: key,
			Address: netip.PrefixFrom(a, a.BitLen()).String(), Endpoint: ep.Endpoint})
	}
	return r, nil
}

// rosterDigest is the digest of r's content, its sequence aside.
func rosterDigest(r *shapes.Roster) string {
	cp := *r
	cp.Seq = 0
	b, _ := json.Marshal(&cp)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// PublishRoster composes the roster and publishes it, unless the last one
// published is the same. Its sequence is the last one's plus one, or the
// time in microseconds if that is higher — so a roster stream made anew
// (a lost store) still goes on above what every node holds. Several
// processes may publish at once: each publishes only on top of the roster
// it read as the last (the broker checks), and looks again otherwise.
func (c *Client) PublishRoster(ctx context.Context) (*RosterPublished, error) {
	for attempt := 0; attempt < 100; attempt++ {
		r, err := c.ComposeRoster(ctx)
		if err != nil {
			return nil, err
		}
		// The key that signs it is part of what it is: a rotation
		// publishes the same roster again, signed by the new key.
		digest := rosterDigest(r) + "." + wire.KeyID(c.Keys.ControlPublic())
		var lastSeq, lastStream uint64
		m, err := c.rosters.GetLastMsgForSubject(ctx, link.RosterSubject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return nil, fmt.Errorf("roster: reading the last: %w", err)
		default:
			lastSeq, _ = strconv.ParseUint(m.Header.Get(link.SeqHeader), 10, 64)
			lastStream = m.Sequence
			if m.Header.Get(DigestHeader) == digest {
				c.noteRoster(lastSeq)
				return &RosterPublished{Seq: lastSeq, Nodes: len(r.Nodes), Bytes: len(m.Data)}, nil
			}
		}
		r.Seq = max(lastSeq+1, uint64(time.Now().UnixMicro()))
		payload, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		env, err := wire.Seal(c.Keys.Signer(), wire.PurposeRoster, payload)
		if err != nil {
			return nil, err
		}
		msg := &nats.Msg{Subject: link.RosterSubject, Data: env, Header: nats.Header{
			link.SeqHeader: []string{strconv.FormatUint(r.Seq, 10)}, DigestHeader: []string{digest}}}
		ack, err := c.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(lastStream))
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			continue // another process published meanwhile: compose again
		}
		if err != nil {
			return nil, fmt.Errorf("roster: publishing %d nodes (%d bytes): %w", len(r.Nodes), len(env), err)
		}
		c.noteRoster(r.Seq)
		c.NC.Publish(link.RosterNotice, []byte(strconv.FormatUint(ack.Sequence, 10)))
		c.log.Info("published the mesh's roster", "seq", r.Seq, "nodes", len(r.Nodes), "bytes", len(env))
		return &RosterPublished{Seq: r.Seq, Sent: true, Nodes: len(r.Nodes), Bytes: len(env)}, nil
	}
	return nil, errors.New("roster: it kept changing; not published")
}

// rosterFloor is the sequence of the newest roster published (0: none),
// what a composition's overlay takes as its roster_min. It is read at most
// once a second, and never goes back: a floor a moment old is lower than
// the newest, which only lets a node take a roster a moment older, while
// the roster this process publishes raises it at once (noteRoster), so a
// node enrolled is composed a floor that names the roster with it in.
func (c *Client) rosterFloor(ctx context.Context) uint64 {
	f := c.floor
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.read) < time.Second {
		return f.seq
	}
	m, err := c.rosters.GetLastMsgForSubject(ctx, link.RosterSubject)
	if err != nil {
		return f.seq
	}
	seq, _ := strconv.ParseUint(m.Header.Get(link.SeqHeader), 10, 64)
	f.seq, f.read = max(f.seq, seq), time.Now()
	return f.seq
}

// noteRoster raises the roster floor to seq, a roster just published.
func (c *Client) noteRoster(seq uint64) {
	c.floor.mu.Lock()
	c.floor.seq = max(c.floor.seq, seq)
	c.floor.mu.Unlock()
}

// LastRoster is the roster last published, verified under the control
// key; nil when there is none.
func (c *Client) LastRoster(ctx context.Context) (*shapes.Roster, error) {
	m, err := c.rosters.GetLastMsgForSubject(ctx, link.RosterSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("roster: reading the last: %w", err)
	}
	payload, err := wire.Open(c.Keys.ControlPublic(), wire.PurposeRoster, m.Data)
	if err != nil {
		return nil, fmt.Errorf("roster: the last does not open: %w", err)
	}
	return shapes.ParseRoster(payload)
}
