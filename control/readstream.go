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
//
// A read that delivered nothing yet is made again while the broker does
// not answer (answered: a stream electing its leader); one that delivered
// some is not, since each would be handed those again.
func (c *Client) readStream(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, each func(jetstream.Msg) bool) error {
	delivered := false
	var readErr error
	err := answered(ctx, func(context.Context) error {
		readErr = c.readStreamOnce(ctx, stream, cfg, func(m jetstream.Msg) bool {
			delivered = true
			return each(m)
		})
		if delivered {
			return nil // its error, if any, is returned as it is
		}
		return readErr
	}, nil)
	if delivered {
		return readErr
	}
	return err
}

// readStreamOnce is one attempt of readStream.
func (c *Client) readStreamOnce(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, each func(jetstream.Msg) bool) error {
	if cfg.InactiveThreshold == 0 {
		// The read's own backstop, should the process end before its
		// delete: not the client's five minutes.
		cfg.InactiveThreshold = 30 * time.Second
	}
	it, done, err := c.orderedMessages(ctx, stream, cfg)
	if err != nil {
		return err
	}
	defer done()
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

// orderedMessages opens an ordered consumer of stream and its messages;
// done stops them and deletes the consumer on the broker at once, rather
// than leaving it to its inactive threshold.
func (c *Client) orderedMessages(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (it jetstream.MessagesContext, done func(), err error) {
	cons, err := c.JS.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", stream, err)
	}
	if it, err = cons.Messages(); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", stream, err)
	}
	return it, func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.JS.DeleteConsumer(dctx, stream, info.Name)
			cancel()
		}
	}, nil
}
