package control

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// readStream hands each message an ordered consumer of stream (cfg)
// delivers to each, in order, until none is pending, each returns false,
// or a message is 5 s late. One consumer serves the whole read, and is
// deleted at its end: an ordered consumer's Next makes a new consumer on
// the broker at every call (nats.go: "it will reset the consumer for each
// subsequent Fetch call"), and the last was left there for the client's
// default inactive threshold, five minutes. A read of a node's reports,
// polled four times a second by declare --wait, left a consumer a call
// (and each `mesh-control nodes` one per node's heartbeat); the soak saw
// serve's memory grow with them.
//
// The caller knows the read has something to deliver (a count from the
// stream's state): with nothing, it waits the 5 s and says so.
func (c *Client) readStream(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, each func(jetstream.Msg) bool) error {
	if cfg.InactiveThreshold == 0 {
		// The read's own backstop, should the process end before its
		// delete: not the client's five minutes.
		cfg.InactiveThreshold = 30 * time.Second
	}
	cons, err := c.JS.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("reading %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("reading %s: %w", stream, err)
	}
	defer func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.JS.DeleteConsumer(dctx, stream, info.Name)
			cancel()
		}
	}()
	for {
		next, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := it.Next(jetstream.NextContext(next))
		cancel()
		if err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if !each(m) || err != nil || md.NumPending == 0 {
			return nil
		}
	}
}
