package control

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// A command's connection is tried again for a failure that may pass,
// briefly; for a request the broker left unanswered (a stream's election,
// a stall), as long as a declare's requests are; never for a pinned
// certificate's refusal (final, before this is asked) or, past the brief
// wait, for a broker with no JetStream to answer.
func TestConnectAgain(t *testing.T) {
	timeout := fmt.Errorf("stream %s: %w", link.DeclStream, context.DeadlineExceeded)
	for _, c := range []struct {
		err   error
		since time.Duration
		want  bool
	}{
		{errors.New("broker at tls://h:4222: connection reset"), time.Second, true},
		{errors.New("broker at tls://h:4222: connection reset"), 4 * time.Second, false},
		{timeout, 5 * time.Second, true},
		{timeout, 40 * time.Second, true},
		{timeout, 46 * time.Second, false},
		{fmt.Errorf("x: %w", nats.ErrTimeout), 20 * time.Second, true},
		{fmt.Errorf("x: %w", nats.ErrNoResponders), 5 * time.Second, false},
	} {
		if got := connectAgain(c.err, c.since, connectRetry); got != c.want {
			t.Errorf("connectAgain(%v, %v) = %v, want %v", c.err, c.since, got, c.want)
		}
	}
}
