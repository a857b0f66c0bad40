package control

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
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
// them. Measured at 10,000 nodes (docs/benchmarks.md, session 6): 91–94
// KiB a node without, 74 KiB with, 65–70 KiB with two collections after a
// burst, at 5–6.6 % of a core idle against 3.5–5.0 %. A collection on a
// timer was measured before (session 3):
// every 10 s held 62 KiB a node at 9.6 % of a core, every 30 s 81 KiB at
// 6.6 % — a timer collects whether or not there is garbage; this collects
// when there is. Never during a burst: there a collection costs the
// fan-out CPU, and the runtime is told to collect less often (burstPacing).

// burstCheck is how often serve looks at how much it allocated.
const burstCheck = 5 * time.Second

// burstFloor is the least allocation in one interval that is a burst;
// above it, a burst is also a quarter of the live heap.
const burstFloor = 64 << 20

// isBurst says whether allocated bytes over a time of over is a burst:
// the rate of burstFloor, or a quarter of the live heap, per burstCheck.
func isBurst(allocated, live uint64, over time.Duration) bool {
	return allocated > max(burstFloor, live/4)/uint64(burstCheck/over)
}

// During a burst serve collects less often: the runtime's percentage
// (GOGC, 100 unless the operator set it) is raised to burstGCPercent from
// the first burstLook that allocates at a burst's rate until the first
// quiet burstCheck, when it is put back before the collections that give
// the burst's memory back. A collection of a 10,000-node serve marks
// ~300 MB that the broker keeps live for its connections, and the fan-out's
// garbage is short-lived: at 100, a fan-out to 10,000 nodes ran one or two
// collections (0.4–0.8 s of serve's 4.5 s of CPU, docs/benchmarks.md,
// session 8), all of it spent on two shared cores the fan-out needs. The
// cost is memory while the burst lasts (the heap may grow to four times
// the live data instead of two); a GOMEMLIMIT the operator sets still
// holds, and a GOGC of off or above burstGCPercent is left alone.
const (
	burstGCPercent = 300
	burstLook      = 250 * time.Millisecond
)

// burstPacing raises and restores the runtime's collection percentage.
type burstPacing struct {
	raised bool
	before int // the percentage to put back
	set    func(int) int
	// The live heap the last two collections found: only a serve whose
	// live data holds steady is paced. One whose connections are still
	// coming (a fleet linking, live data growing at every collection)
	// is not: collected less often while it grows, its long-lived
	// connection state was spread over more spans among the garbage,
	// and it held 20–40 MB more once quiet (docs/benchmarks.md, session 8).
	cycles           uint64
	live, beforeLive uint64
}

// steady says whether the last two collections found the same live heap,
// within an eighth.
func (p *burstPacing) steady() bool {
	return p.beforeLive > 0 && max(p.live, p.beforeLive)-min(p.live, p.beforeLive) <= p.live/8
}

// look takes the bytes allocated over the last burstLook, the collections
// run so far and the live heap the last one found, and raises the
// percentage when a steady serve allocates at a burst's rate.
func (p *burstPacing) look(allocated, cycles, live uint64) {
	if cycles != p.cycles {
		p.cycles, p.beforeLive, p.live = cycles, p.live, live
		if p.raised && !p.steady() {
			p.restore() // the live data grew: connections coming, not a fan-out
			return
		}
	}
	if p.raised || !p.steady() || !isBurst(allocated, live, burstLook) {
		return
	}
	before := p.set(burstGCPercent)
	if before < 0 || before >= burstGCPercent {
		p.set(before) // off, or the operator's is higher already
		return
	}
	p.raised, p.before = true, before
}

// restore puts the percentage back: once a whole burstCheck was quiet, or
// when a collection found the live data grown.
func (p *burstPacing) restore() {
	if p.raised {
		p.set(p.before)
		p.raised = false
	}
}

// quietSlack is how much garbage a quiet serve holds before it collects:
// an eighth of the live heap, at least quietFloor (a small fleet's serve
// is left to the runtime).
func quietSlack(live uint64) uint64 { return max(quietFloor, live/8) }

const quietFloor = 16 << 20

// quietGap is the least time between two collections of a quiet serve: a
// steady load just under a burst would otherwise have it collect at every
// look (a collection of a 10,000-node serve's heap is half a second of
// CPU).
const quietGap = 20 * time.Second

// quietWatch decides, one interval at a time, when to give memory back.
type quietWatch struct {
	inBurst bool
	since   time.Duration // since the last give-back
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
// quietSlack.
func (q *quietWatch) step(allocated, live, objects uint64) giveBack {
	q.since += burstCheck
	if isBurst(allocated, live, burstCheck) {
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
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"}}
	var cycles uint64
	read := func() (allocs, live, objects uint64) {
		metrics.Read(samples)
		for _, s := range samples {
			if s.Value.Kind() != metrics.KindUint64 {
				return 0, 0, 0
			}
		}
		cycles = samples[3].Value.Uint64()
		return samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
	}
	var q quietWatch
	pacing := &burstPacing{set: debug.SetGCPercent}
	defer pacing.restore()
	last, _, _ := read()
	lastLook := last
	t := time.NewTicker(burstCheck)
	defer t.Stop()
	look := time.NewTicker(burstLook)
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-look.C:
			allocs, live, _ := read()
			was := pacing.raised
			pacing.look(allocs-lastLook, cycles, live)
			if pacing.raised && !was {
				log.Debug("a burst: collecting less often", "gc_percent", burstGCPercent, "live_mib", live>>20)
			}
			lastLook = allocs
			continue
		case <-t.C:
		}
		allocs, live, objects := read()
		give := q.step(allocs-last, live, objects)
		if !q.inBurst && pacing.raised {
			pacing.restore()
			log.Debug("the burst passed: collecting as before", "gc_percent", pacing.before)
		}
		switch give {
		case afterBurst:
			// Two collections: the burst's write buffers sit in the
			// broker's pools until the second, and a writer's stack
			// (grown to 32 KiB by nats-server's flushOutbound) is halved
			// at each.
			start := time.Now()
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
