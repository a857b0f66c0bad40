package control

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"time"
)

// serve gives back the memory a burst grew it to once the burst has
// passed, as the agent and the executor do after theirs: a fan-out to
// 10,000 nodes allocates hundreds of MiB, the heap grows to twice what is
// live, and Go's scavenger would return it only over minutes; the
// connections' goroutine stacks, grown while they wrote, shrink only at a
// collection (by half, and only when less than a quarter is in use).
//
// A quiet serve also collects (and gives back) once it holds more garbage
// than quietSlack, at most once every quietGap. Left to the runtime
// (GOGC=100), a quiet serve holds as much garbage as it has live data —
// the broker's state for every connection, 39 KiB a node — before a
// collection comes, and the stacks stay as large as the last burst grew
// them. Measured at 10,000 nodes (make bench-scale): 91–94 KiB a node
// without, 74 KiB with, 65–70 KiB with two collections after a burst, at
// 5–6.6 % of a core idle against 3.5–5.0 %. A collection on a timer,
// measured the same way: every 10 s held 62 KiB a node at 9.6 % of a core, every 30 s 81 KiB at
// 6.6 % — a timer collects whether or not there is garbage; this collects
// when there is. Never during a burst: there the runtime paces itself,
// told to collect less often (burstGCPercent).

// burstGCPercent is serve's GOGC while a burst lasts, from the interval
// that finds it to the give-back after it: the heap may grow to two and a
// half times what is live before a collection, not twice. A collection of
// a 10,000-node serve's heap is some 1.6 s of CPU, and the one the agents'
// linking left due came in the middle of the fan-out that followed it
// (GODEBUG=gctrace=1 under make bench-scale: serve 7.0 s of CPU in that
// fan-out, 5.0 s in one after idle, the two cores 88–92 % busy): a fan-out
// on a busy machine waits on CPU, and the give-back after the burst
// collects anyway. What it costs is memory (make bench-scale, three runs
// each, docs/benchmarks.md; with each account's imports of both layouts,
// 11 KiB a node more than now): at 150 the fan-outs recorded in 4.0–4.9 s,
// serve held 108–114 KiB a node once quiet and peaked at 1.7–1.9 GiB; at
// 200, 4.4–5.0 s, 116–117 KiB and 1.9–2.0 GiB (a heap let grow larger
// keeps more once collected: the same live heap, 105 MiB more resident);
// at 100 (the runtime's own; two runs, one traced), 4.6–6.3 s, 106–107
// KiB and 1.7 GiB.
const burstGCPercent = 150

// burstCheck is how often serve looks at how much it allocated.
const burstCheck = 5 * time.Second

// burstFloor is the least allocation in one interval that is a burst;
// above it, a burst is also twice the fleet's steady allocation (the
// least of the last steadyIntervals: heartbeats, which grow with the
// fleet). A quarter of the live heap was the rule before the broker held
// an account per node: with 700 MiB live at 10,000 nodes, a fan-out's
// 160 MiB an interval passed for quiet, and the give-back after the
// agents' linking (two collections, 3 s of CPU) ran in the middle of the
// fan-out that followed (make bench-scale, GODEBUG=gctrace=1).
const burstFloor = 64 << 20

// steadyIntervals is how far back the steady allocation is looked for: a
// burst (a fan-out, a fleet relinking) lasts less than two minutes.
const steadyIntervals = 24

// quietSlack is how much garbage a quiet serve holds before it collects:
// an eighth of the live heap, at least quietFloor (a small fleet's serve
// is left to the runtime).
func quietSlack(live uint64) uint64 { return max(quietFloor, live/8) }

const quietFloor = 16 << 20

// quietGap is the least time between two collections of a quiet serve: a
// steady load just under a burst would otherwise have it collect at every
// look. A collection of a 10,000-node serve's heap (680 MiB live, 20,000
// goroutines' stacks) is 0.7 s of CPU, and its heartbeats allocate some
// 4.4 MiB a second (GODEBUG=gctrace=1 under make bench-scale): every 20
// s, the give-backs alone were 3.2 % of a core idle; every 40 s they are
// half that, for some 4 KiB a node more held between them.
const quietGap = 40 * time.Second

// quietWatch decides, one interval at a time, when to give memory back.
type quietWatch struct {
	inBurst bool
	since   time.Duration // since the last give-back
	// recent is the allocation of the last steadyIntervals intervals.
	recent []uint64
}

// steady is the least allocation of the recent intervals.
func (q *quietWatch) steady() uint64 {
	if len(q.recent) == 0 {
		return 0
	}
	return slices.Min(q.recent)
}

// giveBack is what step decides.
type giveBack int

const (
	keep       giveBack = iota // nothing now
	afterBurst                 // a burst has passed: two collections
	garbage                    // a quiet serve holds more than quietSlack: one
)

// step takes the bytes allocated in the last interval (of burstCheck),
// the live heap (as the last collection found it) and the heap's objects
// now (live and not yet collected), and says whether now is the time to
// give memory back: the first quiet interval after a burst, and, no more
// often than every quietGap, when a quiet serve holds more garbage than
// quietSlack. An interval is a burst when it allocated more than
// burstFloor and more than twice the steady allocation.
func (q *quietWatch) step(allocated, live, objects uint64) giveBack {
	q.since += burstCheck
	burst := allocated > max(burstFloor, 2*q.steady())
	if q.recent = append(q.recent, allocated); len(q.recent) > steadyIntervals {
		q.recent = q.recent[1:]
	}
	if burst {
		q.inBurst = true
		return keep
	}
	give := keep
	switch {
	case q.inBurst:
		give = afterBurst
	case q.since >= quietGap && objects > live+quietSlack(live):
		give = garbage
	}
	q.inBurst = false
	if give != keep {
		q.since = 0
	}
	return give
}

// giveBackWhenQuiet runs until ctx ends.
func giveBackWhenQuiet(ctx context.Context, log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	read := func() (allocs, live, objects uint64) {
		metrics.Read(samples)
		for _, s := range samples {
			if s.Value.Kind() != metrics.KindUint64 {
				return 0, 0, 0
			}
		}
		return samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
	}
	var q quietWatch
	pacing := &burstPacing{set: debug.SetGCPercent, restore: -1}
	defer pacing.after()
	last, _, _ := read()
	t := time.NewTicker(burstCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		allocs, live, objects := read()
		give := q.step(allocs-last, live, objects)
		if q.inBurst {
			pacing.during()
		}
		switch give {
		case afterBurst:
			// Two collections: the burst's write buffers sit in the
			// broker's pools until the second, and a writer's stack
			// (grown to 32 KiB by nats-server's flushOutbound) is halved
			// at each.
			start := time.Now()
			pacing.after()
			runtime.GC()
			debug.FreeOSMemory()
			log.Debug("a burst passed: memory given back", "took", time.Since(start).Round(time.Millisecond))
		case garbage:
			start := time.Now()
			debug.FreeOSMemory()
			log.Debug("garbage collected while quiet", "took", time.Since(start).Round(time.Millisecond))
		}
		last = allocs
	}
}

// burstPacing holds the GC percent at burstGCPercent while a burst lasts
// (during, at each interval of it) and gives the process's own back after
// (after): set is debug.SetGCPercent, which answers with the percent it
// replaces. A percent already as high, or collection turned off
// (GOGC=off), is left as it is.
type burstPacing struct {
	set     func(int) int
	restore int  // the percent to give back after, -1 when none was replaced
	looked  bool // during this burst
}

func (p *burstPacing) during() {
	if p.looked {
		return
	}
	p.looked = true
	if prev := p.set(burstGCPercent); prev < 0 || prev >= burstGCPercent {
		p.set(prev)
	} else {
		p.restore = prev
	}
}

func (p *burstPacing) after() {
	if p.restore >= 0 {
		p.set(p.restore)
	}
	p.restore, p.looked = -1, false
}
