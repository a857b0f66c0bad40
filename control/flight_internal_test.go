package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The window opens by one for each quick answer until the broker first
// shows distress, halves once for the requests in flight together, then
// opens by one a window's worth; a node's own refusal moves nothing.
func TestFlightAdaptsToTheBrokersAnswers(t *testing.T) {
	f := newFlight(16, 4, 64)
	quick := func(n int) {
		for range n {
			e, _ := f.acquire(context.Background())
			f.release(e, time.Millisecond, nil)
		}
	}
	quick(10)
	if w := f.window(); w != 26 {
		t.Fatalf("slow start: window %d after 10 quick answers from 16, want 26", w)
	}
	quick(100)
	if w := f.window(); w != 64 {
		t.Fatalf("the window went past its most: %d", w)
	}
	// Three in flight together, all timing out: one halving.
	var epochs []uint64
	for range 3 {
		e, _ := f.acquire(context.Background())
		epochs = append(epochs, e)
	}
	for _, e := range epochs {
		f.release(e, 10*time.Second, context.DeadlineExceeded)
	}
	if w := f.window(); w != 32 {
		t.Fatalf("three timeouts of one flight: window %d, want 32 (halved once)", w)
	}
	// Then additive: 32 quick answers open it by about one.
	quick(32)
	if w := f.window(); w != 32 && w != 33 {
		t.Fatalf("after the halving, 32 quick answers: window %d, want 32 or 33", w)
	}
	for _, c := range []struct {
		name   string
		took   time.Duration
		err    error
		halves bool
	}{
		{"a slow answer", 3 * time.Second, nil, true},
		{"no responders", time.Millisecond, fmt.Errorf("publish: %w", nats.ErrNoResponders), true},
		{"a node's own refusal", time.Millisecond, errors.New("node n1 is revoked"), false},
	} {
		before := f.window()
		e, _ := f.acquire(context.Background())
		f.release(e, c.took, c.err)
		if after := f.window(); (after < before) != c.halves || (c.halves && after != max(4, before/2)) {
			t.Errorf("%s: window %d → %d", c.name, before, after)
		}
	}
	for range 10 {
		e, _ := f.acquire(context.Background())
		f.release(e, 0, context.DeadlineExceeded)
	}
	if w := f.window(); w != 4 {
		t.Fatalf("the window went under its least: %d", w)
	}
}

// fly never has more in flight than the window, gives each item its own
// result, says its progress item by item, and gives an item not started
// once ctx ended its error.
func TestFlightHoldsItsWindow(t *testing.T) {
	f := newFlight(3, 1, 3)
	var now, most atomic.Int32
	var mu sync.Mutex
	var said []int
	errs := f.fly(context.Background(), 50, func(i int) error {
		n := now.Add(1)
		mu.Lock()
		most.Store(max(most.Load(), n))
		mu.Unlock()
		time.Sleep(time.Millisecond)
		now.Add(-1)
		if i%7 == 0 {
			return fmt.Errorf("item %d", i)
		}
		return nil
	}, func(done, of int) {
		if of != 50 {
			t.Errorf("progress of %d items, want 50", of)
		}
		said = append(said, done) // one call at a time: no lock
	})
	if len(said) != 50 || !slices.IsSorted(said) || said[49] != 50 {
		t.Fatalf("progress said %v, want 1 to 50 in order", said)
	}
	if m := most.Load(); m > 3 || m < 2 {
		t.Fatalf("at most %d in flight, window 3", m)
	}
	for i, err := range errs {
		if (err != nil) != (i%7 == 0) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	done := make(chan []error)
	go func() {
		done <- newFlight(1, 1, 1).fly(ctx, 3, func(int) error { <-block; return nil }, nil)
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	close(block)
	errs = <-done
	if errs[0] != nil || !errors.Is(errs[1], context.Canceled) || !errors.Is(errs[2], context.Canceled) {
		t.Fatalf("a flight whose context ended: %v", errs)
	}
}

// The comparison build's window (constWindow) holds whatever the broker
// answers: the bench compares it with the adapting one.
func TestAConstantWindowHolds(t *testing.T) {
	constWindow = 256
	defer func() { constWindow = 0 }()
	f := newFlight(64, 8, 512)
	for i, took := range []time.Duration{time.Millisecond, 3 * time.Second, time.Millisecond} {
		e, _ := f.acquire(context.Background())
		f.release(e, took, nil)
		if f.window() != 256 {
			t.Fatalf("after answer %d (%s): window %d, want 256 held", i, took, f.window())
		}
	}
}

// A cluster's "JetStream system temporarily unavailable" is the broker's
// distress, as a request no one answered: a declare is made again on it,
// and the window closes; a node's own refusal (a sequence taken by
// another) is not.
func TestAClustersUnavailableAnswerIsDistress(t *testing.T) {
	unavailable := fmt.Errorf("publishing sequence 3 for n1: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"})
	if !brokerDistress(unavailable) {
		t.Fatal("503 10008 is not taken for the broker's distress")
	}
	if brokerDistress(fmt.Errorf("wrapped: %w", jetstream.ErrKeyExists)) || brokerDistress(&jetstream.APIError{Code: 400, ErrorCode: 10071}) {
		t.Fatal("a node's own refusal is taken for the broker's distress")
	}
	tries := 0
	err := answered(context.Background(), func(context.Context) error {
		if tries++; tries < 3 {
			return unavailable
		}
		return nil
	}, nil)
	if err != nil || tries != 3 {
		t.Fatalf("made %d times, then %v: want again until answered", tries, err)
	}
}
