package control

import "testing"

// Memory is given back at the first quiet interval after a burst (not
// while it lasts), and while the fleet is quiet only when the garbage is
// over the slack, no more often than quietGap; a burst is measured
// against the live heap as it grows.
func TestQuietWatch(t *testing.T) {
	const mib = 1 << 20
	if steps := int(quietGap / burstCheck); steps != 4 {
		t.Fatalf("the table is written for a quietGap of 4 intervals, it is %d", steps)
	}
	var q quietWatch
	for i, c := range []struct {
		allocated, live, objects uint64
		want                     giveBack
	}{
		{10 * mib, 300 * mib, 310 * mib, keep},       // heartbeats only: little garbage
		{10 * mib, 300 * mib, 320 * mib, keep},       // still under the slack (37.5 MiB)
		{500 * mib, 300 * mib, 800 * mib, keep},      // a fan-out
		{400 * mib, 350 * mib, 900 * mib, keep},      // still going: the runtime paces it
		{12 * mib, 350 * mib, 700 * mib, afterBurst}, // passed: give back once
		{12 * mib, 350 * mib, 362 * mib, keep},       // and not again
		{12 * mib, 350 * mib, 420 * mib, keep},       // over the slack, but too soon after
		{12 * mib, 350 * mib, 430 * mib, keep},
		{12 * mib, 350 * mib, 440 * mib, garbage}, // quietGap since the last: collect
		{12 * mib, 350 * mib, 362 * mib, keep},
		{70 * mib, 40 * mib, 110 * mib, keep}, // above the floor on a small heap: a burst
		{30 * mib, 40 * mib, 70 * mib, afterBurst},
		{10 * mib, 40 * mib, 50 * mib, keep}, // a small heap's garbage under the floor (16 MiB)
		{10 * mib, 40 * mib, 54 * mib, keep},
		{10 * mib, 40 * mib, 55 * mib, keep},
		{10 * mib, 40 * mib, 55 * mib, keep},
		{10 * mib, 40 * mib, 55 * mib, keep},    // a gap has passed: still under the floor
		{100 * mib, 800 * mib, 810 * mib, keep}, // under a quarter of a large heap: quiet
		{100 * mib, 800 * mib, 890 * mib, keep}, // over its slack (100 MiB)? not yet
		{100 * mib, 800 * mib, 901 * mib, garbage},
	} {
		if got := q.step(c.allocated, c.live, c.objects); got != c.want {
			t.Fatalf("interval %d (%d MiB allocated, %d MiB live, %d MiB of objects): gave back %d, want %d",
				i, c.allocated/mib, c.live/mib, c.objects/mib, got, c.want)
		}
	}
}
