package control

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Only an error the store may have caused is put down to it: a refusal of
// the control side's own, made while serve says the store was opened
// anew, was said as "the broker's store … was opened anew …: run it
// again: this mesh has an overlay…", sending the operator to run again a
// command that would be refused again.
func TestOnlyTheStoresErrorsArePutDownToIt(t *testing.T) {
	for _, tc := range []struct {
		err   error
		store bool
	}{
		{fmt.Errorf("declare n1: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("token: %w", nats.ErrTimeout), true},
		{fmt.Errorf("nodes: %w", nats.ErrNoResponders), true},
		{fmt.Errorf("registry: the overlay settings: %w", &jetstream.APIError{Code: 500, ErrorCode: 10077, Description: "insufficient resources"}), true},
		{fmt.Errorf("publish: %w", jetstream.ErrNoStreamResponse), true},
		{&exitError{ExitTimedOut, "no plan from n1 within 10s"}, true},
		{&exitError{2, "usage"}, false},
		{errors.New("this mesh has an overlay (chaos0 on 10.231.0.0/24) and the file declares none"), false},
		{errors.New("node n1 is revoked"), false},
		{fmt.Errorf("assign: %w", ErrNoOverlay), false},
	} {
		if got := mayBeTheStore(tc.err); got != tc.store {
			t.Errorf("mayBeTheStore(%v) = %v", tc.err, got)
		}
	}
}
