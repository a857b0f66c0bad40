package control

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nox-mesh/nox-mesh-host/link"
)

// Two agents linked as one node — a machine copied with its state (a
// cloned virtual machine, a restored disk image beside the original), or
// a second agent started by hand on another state directory with the
// node's identity — are each let in by the broker: they hold the same
// credential. They then apply the same declarations, report in turn, and
// claim one overlay address with one WireGuard key. Refusing the second
// connection (an account limited to one) would also refuse an agent's
// own reconnection while the broker still holds its stale connection,
// for up to the broker's ping timeout, at every network fault of every
// node; so it is found and said instead.
//
// It is found in the heartbeats: each says when its agent's link came up
// (link.Heartbeat.LinkedSince, to the nanosecond). One agent's link
// changes only forward — a relink is a new time, and the old one is not
// heard again — while two agents' heartbeats alternate between two. A
// heartbeat that returns to one of the last few links, twice within an
// hour, is two agents (or more: three in turn return as well).

// TwoAgents is what serve keeps (registry key twoagents.<node>) once it
// finds two agents linked as the node, and what status shows of it.
type TwoAgents struct {
	Enrolment string `json:"enrolment"`
	// Links are the two links' times, as their heartbeats say them.
	Links [2]string `json:"links"`
	// Seen is when serve last found it (written at most once every
	// twoAgentsSayEvery while it lasts).
	Seen time.Time `json:"seen"`
}

const (
	// twoAgentsReturns is how many returns to the link before the last
	// make two agents: one could be a heartbeat delayed past a relink.
	twoAgentsReturns = 2
	// twoAgentsSayEvery is how often, at most, serve logs a node's two
	// agents and writes them down again while they last.
	twoAgentsSayEvery = time.Hour
	// TwoAgentsShownFor is how long after serve last found them status
	// shows them: past it, one of the two has stopped.
	TwoAgentsShownFor = 2 * twoAgentsSayEvery
)

// linkedSinceField is how a heartbeat, as the agent encodes it, says when
// its link came up: found in the bytes, as the recorder's other fields
// are, so the fleet's heartbeats cost no decoding.
var linkedSinceField = []byte(`"linked_since":"`)

// linkOf is the link time a heartbeat says (within data), its hash, and
// whether it says one.
func linkOf(data []byte) ([]byte, uint64, bool) {
	i := bytes.Index(data, linkedSinceField)
	if i < 0 {
		return nil, 0, false
	}
	rest := data[i+len(linkedSinceField):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 || bytes.HasPrefix(rest, []byte("0001-01-01T")) {
		return nil, 0, false
	}
	h := fnv.New64a()
	h.Write(rest[:j])
	return rest[:j], h.Sum64(), true
}

// links is one node's heartbeats' last links (about 200 bytes a node of
// serve's memory with its map entry), by hash, the newest first,
// and the newest as said (made a string only when the link changes: at a
// relink, not at every heartbeat of one agent); how many times within
// twoAgentsWithin a heartbeat returned to one of the others, and when
// the first of those was (unix seconds).
type links struct {
	seq         uint64 // the stream sequence of the last heartbeat heard
	recent      [4]uint64
	text        string
	returns     int
	firstReturn int64
	said        int64 // when serve last said them (unix seconds)
}

// twoAgentsWithin is how close together the returns that make two agents
// are: two agents return at every heartbeat or two, and one agent's
// heartbeat delivered late now and then never adds up.
const twoAgentsWithin = time.Hour

// heard takes a heartbeat's link (its hash, and as said) at now, and
// says whether two agents are linked as the node: true at each return
// from the twoAgentsReturns-th within twoAgentsWithin. other is the link
// heard before this one, as said.
func (l *links) heard(link uint64, text []byte, now int64) (two bool, other string) {
	if link == l.recent[0] {
		return false, ""
	}
	at := len(l.recent) - 1 // where it was, or the oldest, dropped
	for i := 1; i < len(l.recent); i++ {
		if l.recent[i] == link {
			at = i
			break
		}
	}
	returned := l.recent[at] == link
	copy(l.recent[1:at+1], l.recent[:at])
	l.recent[0] = link
	other, l.text = l.text, string(text)
	if !returned {
		return false, ""
	}
	if now-l.firstReturn > int64(twoAgentsWithin/time.Second) {
		l.returns, l.firstReturn = 0, now
	}
	l.returns++
	return l.returns >= twoAgentsReturns, other
}

// watchLinks follows node's heartbeats' links (the recorder of the node's
// lane, which alone sees them) and, while two agents are linked as it,
// says so in serve's log and the registry at most every
// twoAgentsSayEvery. data is the heartbeat as the broker took it on the
// node's own subject, which only the node's credential may publish to.
func (w *recorder) watchLinks(ctx context.Context, m jetstream.Msg, node string) {
	data := m.Data()
	text, h, ok := linkOf(data)
	if !ok {
		return
	}
	if w.links == nil {
		w.links = map[string]*links{}
	}
	l := w.links[node]
	if l == nil {
		l = &links{}
		w.links[node] = l
	}
	if h == l.recent[0] {
		return // the link of the heartbeat before: nearly every heartbeat
	}
	// A heartbeat delivered again (its acknowledgement lost) is an older
	// one, whose link may be one before: not heard twice. Every heartbeat
	// of one agent's older link is before the first of its newer one in
	// the stream, so the sequence is kept only where the link changes.
	if md, err := m.Metadata(); err == nil {
		if md.Sequence.Stream <= l.seq {
			return
		}
		l.seq = md.Sequence.Stream
	}
	now := time.Now().Unix()
	two, other := l.heard(h, text, now)
	if !two || now-l.said < int64(twoAgentsSayEvery/time.Second) {
		return
	}
	var hb struct {
		Node      string `json:"node"`
		Enrolment string `json:"enrolment"`
	}
	k, ok := w.keys.get(ctx, node)
	if !ok || link.VerifySignature(k.nkey, data, m.Headers().Get(link.SignatureHeader)) != nil ||
		json.Unmarshal(data, &hb) != nil || hb.Node != node || hb.Enrolment != k.enrolment {
		return // not the node's: the recorder says so of it
	}
	l.said = now
	w.c.log.Warn("two agents are linked as one node: its heartbeats alternate between two links (a machine copied with its state, or a second agent started with its identity); they apply and report in turn and share its overlay key — find the copy, stop its agent and executor, move their state directories aside and enrol it with a token of its own (docs/operations.md, \"A copied machine\")",
		"node", node, "links", other+", "+l.text)
	rec := TwoAgents{Enrolment: hb.Enrolment, Links: [2]string{other, l.text}, Seen: time.Now().UTC()}
	value, _ := json.Marshal(rec)
	if _, err := w.c.KV.Put(ctx, twoAgentsKey(node), value); err != nil {
		w.c.log.Warn("the registry could not keep the node's two agents; status will not show them", "node", node, "err", err)
	}
}

func twoAgentsKey(node string) string { return "twoagents." + node }

// twoAgentsOf is node's two agents as serve last found them, while shown
// (TwoAgentsShownFor) and of its enrolment now; nil otherwise.
func (c *Client) twoAgentsOf(ctx context.Context, node, enrolment string) *TwoAgents {
	var t TwoAgents
	if !c.getJSON(ctx, twoAgentsKey(node), &t) || t.Enrolment != enrolment || time.Since(t.Seen) > TwoAgentsShownFor {
		return nil
	}
	return &t
}
