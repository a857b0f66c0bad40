package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The waits between attempts to link spread a fleet that lost its link at
// one instant: each is drawn from a window that doubles with the failed
// attempts, up to a ceiling, and never shorter than RetryWait.
func TestLinkWaitsGrowWithFullJitter(t *testing.T) {
	a := &Agent{o: Options{RetryWait: time.Second}}
	for _, tc := range []struct {
		attempt int
		window  time.Duration // the waits are RetryWait + [0, window]
	}{
		{1, 4 * time.Second},
		{2, 8 * time.Second},
		{3, 16 * time.Second},
		{4, 32 * time.Second},
		{5, 60 * time.Second},
		{50, 60 * time.Second},
	} {
		lo, hi := time.Hour, time.Duration(0)
		for range 2000 {
			d := a.linkWait(tc.attempt)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < time.Second || hi > time.Second+tc.window {
			t.Errorf("attempt %d: waits in [%v, %v], want within [1s, %v]", tc.attempt, lo, hi, time.Second+tc.window)
		}
		// Full jitter: the draws cover the window, not a second of it.
		if hi-lo < tc.window*9/10 {
			t.Errorf("attempt %d: waits in [%v, %v] cover less than the window %v", tc.attempt, lo, hi, tc.window)
		}
	}
}

// An agent that cannot link says its error once, then again once a
// longest wait between attempts with how many times it came since — not
// at every attempt, and not never again; another error is said at once.
func TestALinkErrorIsSaidOncePerCeiling(t *testing.T) {
	var logs []map[string]any
	h := &recordHandler{f: func(r slog.Record) {
		m := map[string]any{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
		logs = append(logs, m)
	}}
	a := &Agent{o: Options{RetryWait: 10 * time.Millisecond}, log: slog.New(h)}
	gone := &LinkError{Reason: LinkUnreachable, Msg: "broker unreachable at tls://192.0.2.1:4222: connection refused"}
	start := time.Now()
	tries := 0
	for time.Since(start) < 3*a.linkLogEvery()+a.linkLogEvery()/2 {
		a.linkFailed(gone)
		tries++
		time.Sleep(5 * time.Millisecond)
	}
	if len(logs) < 3 || len(logs) > 5 || len(logs) >= tries {
		t.Fatalf("%d tries said %d times, want about once each %v:\n%v", tries, len(logs), a.linkLogEvery(), logs)
	}
	if _, ok := logs[0]["again"]; ok {
		t.Errorf("the first saying counts repeats: %v", logs[0])
	}
	for _, l := range logs[1:] {
		if n, _ := l["again"].(int64); n < 2 {
			t.Errorf("said again without how many times it came since: %v", l)
		}
	}
	a.linkFailed(&LinkError{Reason: LinkUnreachable, Msg: "broker unreachable at tls://192.0.2.1:4222: i/o timeout"})
	if last := logs[len(logs)-1]["msg"]; last != "link: broker unreachable at tls://192.0.2.1:4222: i/o timeout" {
		t.Fatalf("another error was not said at once: %v", last)
	}
}

// recordHandler hands each record to f.
type recordHandler struct{ f func(slog.Record) }

func (h *recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error { h.f(r); return nil }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h *recordHandler) WithGroup(string) slog.Handler                 { return h }

// One failure said twice by nats.go, in two cases ("authorization
// violation", "Authorization Violation"), is logged once: the second is a
// repeat, counted into the next line.
func TestALinkFailureSaidInTwoCasesIsLoggedOnce(t *testing.T) {
	var buf strings.Builder
	a := &Agent{o: Options{RetryWait: time.Second}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	a.linkFailed(&LinkError{Reason: LinkUnreachable, Msg: "refused: nats: authorization violation"})
	a.linkFailed(&LinkError{Reason: LinkUnreachable, Msg: "refused: nats: Authorization Violation"})
	if n := strings.Count(buf.String(), "link: refused"); n != 1 {
		t.Fatalf("%d lines:\n%s", n, buf.String())
	}
}
