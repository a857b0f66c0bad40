package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// WatchReports hands each the signed reports of nodes (each checked as
// Reports checks it: the node's registered NKey, its enrolment), as the
// broker stored them from just before the newest declaration on any of
// their subjects — by the broker's clock, which stamped both — and then
// as they come, through one ordered consumer, until each returns false,
// ctx ends, or idle (when not nil) returns false; idle is called whenever
// nothing came for tick. A wait on ten thousand nodes is so one consumer,
// not one read of each node's whole report subject four times a second.
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
	filter := []string{strings.TrimSuffix(link.SubjectsOf("*").Report, "*") + "*"}
	if len(nodes) <= 64 {
		filter = filter[:0]
		for _, n := range nodes {
			filter = append(filter, link.SubjectsOf(n).Report)
		}
	}
	cons, err := c.JS.OrderedConsumer(ctx, link.ReportStream, jetstream.OrderedConsumerConfig{FilterSubjects: filter,
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since, InactiveThreshold: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("reading %s: %w", link.ReportStream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("reading %s: %w", link.ReportStream, err)
	}
	defer func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.JS.DeleteConsumer(dctx, link.ReportStream, info.Name)
			cancel()
		}
	}()
	for {
		next, cancel := context.WithTimeout(ctx, tick)
		m, err := it.Next(jetstream.NextContext(next))
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat) {
				if idle != nil && !idle() {
					return nil
				}
				continue
			}
			return fmt.Errorf("reading %s: %w", link.ReportStream, err)
		}
		subj := m.Subject()
		node := subj[strings.LastIndexByte(subj, '.')+1:]
		k, ok := recs[node]
		md, _ := m.Metadata()
		var r link.Report
		if !ok || md == nil || link.VerifySignature(k.nkey, m.Data(), m.Headers().Get(link.SignatureHeader)) != nil ||
			json.Unmarshal(m.Data(), &r) != nil || r.Node != node || r.Enrolment != k.enrolment {
			continue
		}
		if !each(node, &SignedReport{Report: r, StreamSeq: md.Sequence.Stream}) {
			return nil
		}
	}
}
