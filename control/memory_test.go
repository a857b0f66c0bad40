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

// During a burst the runtime collects less often: the percentage is raised
// at the first look at a burst's rate of a serve whose live heap held
// steady over its last two collections, once, and put back when asked;
// GOGC=off and an operator's higher percentage are left as they are, and
// a serve whose live data is still growing (a fleet linking) is not paced.
func TestBurstPacing(t *testing.T) {
	const mib = 1 << 20
	type look struct{ allocated, cycles, live uint64 } // MiB, collections, MiB
	steady := []look{{1, 1, 300}, {1, 2, 310}}         // two collections, within an eighth
	for _, c := range []struct {
		name          string
		gogc          int // the operator's (100: the default)
		looks         []look
		raised, after int // the percentage after the looks, and after restore
	}{
		{"quiet", 100, append(steady, look{1, 2, 310}, look{3, 2, 310}), 100, 100},
		{"a fan-out", 100, append(steady, look{1, 2, 310}, look{40, 2, 310}, look{40, 2, 310}), burstGCPercent, 100},
		{"an operator's lower", 50, append(steady, look{40, 2, 310}), burstGCPercent, 50},
		{"off", -1, append(steady, look{40, 2, 310}, look{40, 2, 310}), -1, -1},
		{"an operator's higher", 400, append(steady, look{40, 2, 310}), 400, 400},
		{"just under the rate", 100, append(steady, look{3, 2, 310}, look{3, 2, 310}), 100, 100}, // a quarter of 310 MiB per 5 s: 3.9 MiB a look
		{"just over", 100, append(steady, look{3, 2, 310}, look{4, 2, 310}), burstGCPercent, 100},
		{"linking", 100, []look{{40, 1, 100}, {40, 2, 150}, {40, 2, 150}, {40, 3, 250}, {40, 3, 250}}, 100, 100},
		{"one collection only", 100, []look{{40, 1, 300}, {40, 1, 300}}, 100, 100},
		{"linked, then a fan-out", 100, []look{{40, 1, 100}, {40, 2, 250}, {1, 3, 300}, {1, 4, 305}, {40, 4, 305}}, burstGCPercent, 100},
		{"steady, then linking", 100, []look{{1, 1, 10}, {1, 2, 10}, {40, 2, 10}, {40, 3, 30}, {40, 3, 30}}, 100, 100}, // raised, put back at the growth
	} {
		t.Run(c.name, func(t *testing.T) {
			gogc, sets := c.gogc, 0
			p := &burstPacing{set: func(v int) int { old := gogc; gogc = v; sets++; return old }}
			for _, l := range c.looks {
				p.look(l.allocated*mib, l.cycles, l.live*mib)
			}
			if gogc != c.raised {
				t.Fatalf("during the looks GOGC=%d, want %d", gogc, c.raised)
			}
			if c.raised == burstGCPercent && sets != 1 || c.name == "steady, then linking" && sets != 2 {
				t.Fatalf("raised %d times, want once", sets)
			}
			p.restore()
			if gogc != c.after {
				t.Fatalf("after restore GOGC=%d, want %d", gogc, c.after)
			}
		})
	}
}
