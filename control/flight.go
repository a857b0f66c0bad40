package control

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// flight is a fan-out's window: how many of its requests to the broker
// (a node's declare, its composition's publish) are in flight at once,
// adapted to how the broker answers rather than a constant, as TCP's
// congestion window is. It opens fast while answers come back quickly
// (one more for each quick answer: slow start), then by one a window's
// worth; an answer that fails for the broker's sake (a timeout, no
// responder) or comes back slower than slowAnswer halves it, once for
// the requests that were in flight together. A constant that keeps an
// idle broker busy overloads a busy one: its answers come late, the
// requests time out and are made again.
type flight struct {
	mu   sync.Mutex
	cond *sync.Cond
	// limit is the window now; min and max bound it.
	limit, min, max float64
	// slowStart: each quick answer opens the window by one, until the
	// first halving.
	slowStart bool
	inUse     int
	// epoch counts the halvings: a request started before the last one
	// does not halve the window again.
	epoch uint64
	// slow is the answer time taken as the broker's distress.
	slow time.Duration
}

// slowAnswer is the answer time a flight takes as the broker's distress:
// on a quiet broker a declare's round trips take milliseconds, and the
// agent's own patience is counted in seconds.
const slowAnswer = 2 * time.Second

// constWindow, when not 0, holds every fan-out's window there, as it was
// before it adapted: set only by a comparison build of the fleet bench
// (flight_benchconst.go), to measure what the adapting does.
var constWindow int

func newFlight(start, lo, hi int) *flight {
	if constWindow > 0 {
		start, lo, hi = constWindow, constWindow, constWindow
	}
	f := &flight{limit: float64(start), min: float64(lo), max: float64(hi), slowStart: true, slow: slowAnswer}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// acquire waits for room in the window (or ctx's end), and returns the
// epoch the request starts in, for release.
func (f *flight) acquire(ctx context.Context) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			f.mu.Lock()
			f.cond.Broadcast()
			f.mu.Unlock()
		})
		defer stop()
	}
	for float64(f.inUse) >= f.limit {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		f.cond.Wait()
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f.inUse++
	return f.epoch, nil
}

// release ends a request started in epoch, which took took and ended with
// err, and adapts the window to it.
func (f *flight) release(epoch uint64, took time.Duration, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inUse--
	switch {
	case brokerDistress(err) || took >= f.slow:
		if epoch == f.epoch { // once for the requests in flight together
			f.limit = max(f.min, f.limit/2)
			f.slowStart = false
			f.epoch++
		}
	case err != nil:
		// The node's own (revoked, a sequence taken): says nothing of
		// the broker.
	case f.slowStart:
		f.limit = min(f.max, f.limit+1)
	default:
		f.limit = min(f.max, f.limit+1/f.limit)
	}
	f.cond.Broadcast()
}

// window is the window now, whole requests.
func (f *flight) window() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int(f.limit)
}

// brokerDistress says whether err is the broker not keeping up: an answer
// that did not come in time, no one to answer (a JetStream API moment
// away during a leader's election or a reload), or a cluster's JetStream
// saying so itself (errClusterUnavailable).
func brokerDistress(err error) bool {
	return err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, errClusterUnavailable))
}

// errClusterUnavailable is nats-server's JSClusterNotAvailErr (503, error
// code 10008, "JetStream system temporarily unavailable"), which nats.go
// names no constant for: a cluster's answer while a server of its group
// is away and a leader not yet elected. Six declares of a fan-out to
// 10,000 nodes failed on it, not tried again, with one server of three
// stopped for 10 s (make bench-scale CLUSTER=1): it is a moment's, as a
// request no one answered.
var errClusterUnavailable = &jetstream.APIError{Code: 503, ErrorCode: 10008}

// fly runs do for each of n items, as many at once as f lets, and waits
// for all; an item not started because ctx ended is given ctx's error.
// progress, when set, is told after each item how many are done of n,
// one call at a time.
func (f *flight) fly(ctx context.Context, n int, do func(i int) error, progress func(done, of int)) []error {
	errs := make([]error, n)
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	for i := range n {
		epoch, err := f.acquire(ctx)
		if err != nil {
			errs[i] = err
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = do(i)
			f.release(epoch, time.Since(start), errs[i])
			if progress != nil {
				mu.Lock()
				done++
				progress(done, n)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}
