package control

import (
	"slices"
	"testing"
)

// Memory is given back at the first quiet interval after a burst (not
// while it lasts), and while the fleet is quiet only when the garbage is
// over the slack, no more often than quietGap; a burst is measured
// against the fleet's steady allocation, not the live heap.
func TestQuietWatch(t *testing.T) {
	const mib = 1 << 20
	gap := int(quietGap / burstCheck)
	type interval struct {
		allocated, live, objects uint64
		want                     giveBack
	}
	// quiet is n intervals of a quiet fleet, its garbage over the slack
	// from the start, none of them given back.
	quiet := func(n int, allocated, live, objects uint64) []interval {
		out := make([]interval, n)
		for i := range out {
			out[i] = interval{allocated, live, objects, keep}
		}
		return out
	}
	for name, steps := range map[string][]interval{
		"a fleet under the floor": slices.Concat([]interval{
			{10 * mib, 300 * mib, 310 * mib, keep},       // heartbeats only: little garbage
			{10 * mib, 300 * mib, 320 * mib, keep},       // still under the slack (37.5 MiB)
			{500 * mib, 300 * mib, 800 * mib, keep},      // a fan-out
			{400 * mib, 350 * mib, 900 * mib, keep},      // still going: the runtime paces it
			{12 * mib, 350 * mib, 700 * mib, afterBurst}, // passed: give back once
			{12 * mib, 350 * mib, 362 * mib, keep},       // and not again
		},
			quiet(gap-2, 12*mib, 350*mib, 420*mib), // over the slack, but too soon after
			[]interval{
				{12 * mib, 350 * mib, 440 * mib, garbage}, // quietGap since the last: collect
				{12 * mib, 350 * mib, 362 * mib, keep},
				{70 * mib, 40 * mib, 110 * mib, keep}, // above the floor on a small heap: a burst
				{30 * mib, 40 * mib, 70 * mib, afterBurst},
			},
			quiet(gap+1, 10*mib, 40*mib, 55*mib), // a small heap's garbage under the floor (16 MiB)
		),
		"a fan-out small against a large heap": {
			{20 * mib, 700 * mib, 710 * mib, keep},
			{20 * mib, 700 * mib, 730 * mib, keep},
			{300 * mib, 700 * mib, 1000 * mib, keep}, // the agents linking
			{160 * mib, 700 * mib, 1100 * mib, keep}, // a fan-out: under a quarter of the heap, still a burst
			{160 * mib, 700 * mib, 1200 * mib, keep},
			{20 * mib, 720 * mib, 900 * mib, afterBurst},
			{20 * mib, 720 * mib, 740 * mib, keep},
		},
		"a large fleet's heartbeats over the floor": slices.Concat([]interval{
			{80 * mib, 2000 * mib, 2080 * mib, keep}, // nothing known yet: taken for a burst
			{80 * mib, 2000 * mib, 2100 * mib, afterBurst},
		},
			quiet(gap-1, 80*mib, 2000*mib, 2300*mib), // the steady rate now: quiet
			[]interval{
				{90 * mib, 2000 * mib, 2390 * mib, garbage}, // 390 MiB over a slack of 250
				{600 * mib, 2000 * mib, 3000 * mib, keep},   // a fan-out
				{80 * mib, 2000 * mib, 2900 * mib, afterBurst},
			}),
	} {
		var q quietWatch
		for i, c := range steps {
			if got := q.step(c.allocated, c.live, c.objects); got != c.want {
				t.Fatalf("%s: interval %d (%d MiB allocated, %d MiB live, %d MiB of objects): gave back %d, want %d",
					name, i, c.allocated/mib, c.live/mib, c.objects/mib, got, c.want)
			}
		}
	}
}

// While a burst lasts the collector is told to let the heap grow to two
// and a half times what is live (burstGCPercent), once, and given its own percent
// back after; a percent already as high, or collection turned off, is
// left as it was.
func TestABurstLetsTheHeapGrow(t *testing.T) {
	for _, tc := range []struct {
		own, during int
	}{{100, burstGCPercent}, {50, burstGCPercent}, {burstGCPercent, burstGCPercent}, {400, 400}, {-1, -1}} {
		gogc, sets := tc.own, 0
		p := &burstPacing{set: func(n int) int { sets++; prev := gogc; gogc = n; return prev }, restore: -1}
		for range 3 { // three intervals of one burst
			p.during()
			if gogc != tc.during {
				t.Fatalf("GOGC %d: %d during a burst, want %d", tc.own, gogc, tc.during)
			}
		}
		if sets > 2 {
			t.Fatalf("GOGC %d: set %d times in one burst, want once (and once back when left as it was)", tc.own, sets)
		}
		p.after()
		if gogc != tc.own {
			t.Fatalf("GOGC %d: %d after the burst", tc.own, gogc)
		}
		p.after() // a second give-back changes nothing
		if gogc != tc.own {
			t.Fatalf("GOGC %d: %d after a second give-back", tc.own, gogc)
		}
	}
}
