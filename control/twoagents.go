package control

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
// heard again — while two agents' heartbeats alternate between two. What
// is counted is a heartbeat of an older link right after one of the
// newest: two agents make one at each turn (however many they are, once
// a round), and one agent makes one only when the broker stores a few of
// its old connection's heartbeats after its new one's first (the old
// socket's data, sent late) or its clock went back between two links —
// a burst out of the newest link, not a second. Two within an hour are
// two agents.

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
	// twoAgentsReturns is how many returns out of the newest link make
	// two agents: one is a single agent's late heartbeats.
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

// links is one node's heartbeats' links as watchLinks follows them (about
// 150 bytes a node of serve's memory with its map entry): the last one's
// hash, the newest one's time and text (made when a newer link comes, not
// at every heartbeat), whether the last was the newest, and the returns
// out of the newest counted since firstReturn (unix seconds).
type links struct {
	seq         uint64 // the stream sequence of the last heartbeat whose link changed
	cur         uint64
	newest      int64 // unix nanoseconds
	newestText  string
	atNewest    bool
	returns     int
	firstReturn int64
	said        int64 // when serve last said them (unix seconds)
}

// twoAgentsWithin is how close together the returns that make two agents
// are: two agents return at every round, and one agent's late heartbeats
// now and then never add up.
const twoAgentsWithin = time.Hour

// heard takes a heartbeat's link (its hash, and as said) at now (unix
// seconds), and says whether two agents are linked as the node: true at
// each return out of the newest link from the twoAgentsReturns-th within
// twoAgentsWithin; newest is then the newest link as said.
func (l *links) heard(link uint64, text []byte, now int64) (two bool, newest string) {
	if link == l.cur {
		return false, ""
	}
	l.cur = link
	t, err := time.Parse(time.RFC3339Nano, string(text))
	if err != nil {
		l.atNewest = false
		return false, "" // not the agent's form: not judged
	}
	at := t.UnixNano()
	switch {
	case l.newestText == "" || at > l.newest:
		l.newest, l.newestText, l.atNewest = at, string(text), true
		return false, ""
	case at == l.newest:
		l.atNewest = true
		return false, ""
	}
	out := l.atNewest
	l.atNewest = false
	if !out {
		return false, "" // from one older link to another
	}
	if now-l.firstReturn > int64(twoAgentsWithin/time.Second) {
		l.returns, l.firstReturn = 0, now
	}
	l.returns++
	return l.returns >= twoAgentsReturns, l.newestText
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
	if h == l.cur {
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
	two, newest := l.heard(h, text, now)
	if !two || now-l.said < int64(twoAgentsSayEvery/time.Second) {
		return
	}
	var hb struct {
		Node      string `json:"node"`
		Enrolment string `json:"enrolment"`
	}
	k, why := w.signedBy(ctx, m, node)
	if why != "" || json.Unmarshal(data, &hb) != nil || hb.Node != node || hb.Enrolment != k.enrolment {
		return // not the node's: the recorder says so of it
	}
	older := string(text)
	w.c.log.Warn("two agents are linked as one node: its heartbeats alternate between two links (a machine copied with its state, or a second agent started with its identity); they apply and report in turn and share its overlay key — find the copy, stop its agent and executor, move their state directories aside and enrol it with a token of its own (docs/operations.md, \"A copied machine\")",
		"node", node, "links", older+", "+newest)
	rec := TwoAgents{Enrolment: hb.Enrolment, Links: [2]string{older, newest}, Seen: time.Now().UTC()}
	value, _ := json.Marshal(rec)
	// Not for long: the lane's other nodes wait on it.
	put, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.c.KV.Put(put, twoAgentsKey(node), value); err != nil {
		w.c.log.Warn("the registry could not keep the node's two agents; status does not show them yet (tried again within a minute)", "node", node, "err", err)
		l.said = now - int64(twoAgentsSayEvery/time.Second) + 60
		return
	}
	l.said = now
}

func twoAgentsKey(node string) string { return "twoagents." + node }

// twoAgents is every node's two agents as serve last found them, while
// shown (TwoAgentsShownFor), by node: one listing of the registry for the
// fleet, nearly always empty, not a read a node.
func (c *Client) twoAgents(ctx context.Context) map[string]*TwoAgents {
	vs, err := c.values(ctx, twoAgentsKey(">"))
	if err != nil {
		return nil
	}
	out := map[string]*TwoAgents{}
	for k, v := range vs {
		var t TwoAgents
		if json.Unmarshal(v, &t) == nil && time.Since(t.Seen) <= TwoAgentsShownFor {
			out[strings.TrimPrefix(k, twoAgentsKey(""))] = &t
		}
	}
	return out
}
