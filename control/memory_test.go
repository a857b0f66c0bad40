package control

import "testing"

// Memory is given back once, at the first quiet interval after a burst:
// not while it lasts, not while the fleet is quiet, and a burst is
// measured against the live heap as it grows.
func TestQuietWatch(t *testing.T) {
	const mib = 1 << 20
	var q quietWatch
	for i, c := range []struct {
		allocated, live uint64
		want            bool
	}{
		{10 * mib, 300 * mib, false},  // heartbeats only
		{10 * mib, 300 * mib, false},  // still quiet: nothing to give
		{500 * mib, 300 * mib, false}, // a fan-out
		{400 * mib, 350 * mib, false}, // still going
		{12 * mib, 350 * mib, true},   // passed: give back once
		{12 * mib, 350 * mib, false},  // and not again
		{70 * mib, 40 * mib, false},   // above the floor on a small heap: a burst
		{30 * mib, 40 * mib, true},
		{100 * mib, 800 * mib, false}, // under a quarter of a large heap: quiet
		{100 * mib, 800 * mib, false},
	} {
		if got := q.step(c.allocated, c.live); got != c.want {
			t.Fatalf("interval %d (%d MiB allocated, %d MiB live): give back %v, want %v", i, c.allocated/mib, c.live/mib, got, c.want)
		}
	}
}
