package control

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// recorderConsumer is the recorder's durable consumer on the report and
// heartbeat streams (Record).
const recorderConsumer = "control-recorder"

// heartbeatsAsWanted is streamAsWanted for the heartbeat stream, which is
// the one stream kept without an fsync before each acknowledgement when it
// has one copy: nats-server's async persist mode, a stream's own setting
// (sync_interval is the whole server's). Every other write is on disk
// before it is acknowledged (serverConfig); a heartbeat need not be. An
// agent publishes it without waiting for any acknowledgement, and sends
// the next one an interval later; what the control side keeps of one — a
// changed profile, a rekey's answer, a link capability — the recorder
// writes to the registry, synced, as it reads it. A power cut loses at
// most the last heartbeats' "last heard", which the next heartbeat of
// each node says again. At 10,000 nodes the heartbeats' fsyncs were 0.63
// s of CPU in every 30 s of an idle fleet (docs/benchmarks.md, "Where the
// idle CPU goes"), a fifth of the broker's idle work.
//
// At more than one copy the mode is refused by the server (a replicated
// stream is synced by its Raft log, and relaxes the fsync of each write
// already); a server before API level 2 does not know it (knowsLevel2).
//
// A stream's persist mode cannot be changed by an update. A stream made
// before in the other mode is made anew — losing the nodes' last
// heartbeats, heard again within an interval — once the recorder has
// read every heartbeat in it, so no profile or rekey waiting to be
// recorded is lost; until then it keeps its mode, unless its new number
// of copies does not allow that mode.
func (c *Client) heartbeatsAsWanted(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := c.JS.Stream(ctx, sc.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if sc.Replicas == 1 && c.serverKnowsLevel2() {
			sc.PersistMode = jetstream.AsyncPersistMode
		}
		return c.JS.CreateStream(ctx, sc)
	case err != nil:
		return nil, err
	}
	have := st.CachedInfo().Config
	if sc.Replicas == 1 && knowsLevel2(st.CachedInfo()) {
		sc.PersistMode = jetstream.AsyncPersistMode
	}
	if have.PersistMode == sc.PersistMode {
		return c.streamAsWanted(ctx, sc)
	}
	pending, perr := c.unrecorded(ctx, st)
	// The mode it has may stay (async is one copy's only) while the
	// recorder has not read everything.
	if (have.PersistMode == jetstream.DefaultPersistMode || sc.Replicas == 1) && (perr != nil || pending > 0) {
		c.log.Info("the heartbeat stream keeps its persist mode until the recorder has read it", "stream", sc.Name, "unrecorded", pending, "err", perr)
		sc.PersistMode = have.PersistMode
		return c.streamAsWanted(ctx, sc)
	}
	c.log.Info("the heartbeat stream is made anew in its persist mode; each node is heard again at its next heartbeat",
		"stream", sc.Name, "persist", sc.PersistMode.String(), "was", have.PersistMode.String(), "replicas", sc.Replicas, "unrecorded", pending)
	if err := c.JS.DeleteStream(ctx, sc.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("made anew in persist mode %s: %w", sc.PersistMode, err)
	}
	return c.JS.CreateOrUpdateStream(ctx, sc)
}

// unrecorded is how many messages of st the recorder has not acknowledged
// yet, at least; 0 when it never read the stream.
func (c *Client) unrecorded(ctx context.Context, st jetstream.Stream) (uint64, error) {
	cons, err := st.Consumer(ctx, recorderConsumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// A consumer counts a message just stored as pending a moment after
	// the store acknowledged it: the stream's last sequence is looked at
	// beside what was delivered.
	ci := cons.CachedInfo()
	n := ci.NumPending + uint64(ci.NumAckPending)
	if last := st.CachedInfo().State.LastSeq; n == 0 && ci.Delivered.Stream < last {
		n = last - ci.Delivered.Stream
	}
	return n, nil
}
