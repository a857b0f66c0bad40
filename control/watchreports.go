package control

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// WatchReports hands each the signed reports of nodes (each checked as
// Reports checks it: the node's registered NKey, its enrolment), as the
// broker stored them from just before the newest declaration on any of
// their subjects — by the broker's clock, which stamped both — and then
// as they come, through ordered consumers, until each returns false,
// ctx ends, or idle (when not nil) returns false; idle is called whenever
// nothing came for tick. A wait on ten thousand nodes is so one consumer
// of each report stream, not one read of each node's whole report
// subject four times a second.
func (c *Client) WatchReports(ctx context.Context, nodes []string, tick time.Duration, idle func() bool, each func(node string, r *SignedReport) bool) error {
	type known struct{ nkey, enrolment string }
	recs := make(map[string]known, len(nodes))
	var since time.Time
	for _, n := range nodes {
		rec, _, err := c.Node(ctx, n)
		if err != nil {
			return err
		}
		recs[n] = known{rec.NKey, rec.Enrolment}
		m, err := c.decls.GetLastMsgForSubject(ctx, link.SubjectsOf(n).Decl)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return fmt.Errorf("reading %s's newest declaration: %w", n, err)
		}
		if since.IsZero() || m.Time.Before(since) {
			since = m.Time
		}
	}
	if since.IsZero() {
		since = time.Now()
	}
	since = since.Add(-time.Second)
	// One ordered consumer of each stream that may hold their reports
	// (link.ReportPlaces), merged here as they come.
	type got struct {
		m   jetstream.Msg
		err error
	}
	came := make(chan got)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	for _, p := range link.ReportPlaces() {
		filter := []string{p.Subjects}
		if len(nodes) <= 64 {
			filter = filter[:0]
			for _, n := range nodes {
				for _, nr := range link.NodeReports(n) {
					if nr.Stream == p.Stream {
						filter = append(filter, nr.Subject)
					}
				}
			}
			if len(filter) == 0 {
				continue
			}
		}
		it, done, err := c.orderedMessages(ctx, p.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: filter,
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since, InactiveThreshold: 30 * time.Second})
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // a control side older than the partitions
		}
		if err != nil {
			return err
		}
		wg.Add(1)
		go func(stream string) {
			defer wg.Done()
			defer done()
			for {
				m, err := it.Next(jetstream.NextContext(wctx))
				if wctx.Err() != nil {
					return
				}
				if errors.Is(err, jetstream.ErrNoHeartbeat) {
					continue
				}
				if err != nil {
					err = fmt.Errorf("reading %s: %w", stream, err)
				}
				select {
				case came <- got{m, err}:
				case <-wctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}(p.Stream)
	}
	quiet := time.NewTimer(tick)
	defer quiet.Stop()
	for {
		var m jetstream.Msg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-quiet.C:
			if idle != nil && !idle() {
				return nil
			}
			quiet.Reset(tick)
			continue
		case g := <-came:
			if g.err != nil {
				return g.err
			}
			m = g.m
			quiet.Reset(tick)
		}
		node := link.ReportNode(m.Subject())
		k, ok := recs[node]
		if !ok {
			continue
		}
		r := signedReport(m, node, k.nkey, k.enrolment)
		if r == nil {
			continue
		}
		if !each(node, r) {
			return nil
		}
	}
}
