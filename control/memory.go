package control

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// serve gives back the memory a burst grew it to once the burst has
// passed, as the agent and the executor do after theirs: a fan-out to
// 10,000 nodes allocates hundreds of MiB, the heap grows to twice what is
// live, and Go's scavenger would return it only over minutes; the
// connections' goroutine stacks, grown while they wrote, shrink only at a
// collection. One collection after the burst costs a fraction of a second
// of CPU, once; a quiet fleet (heartbeats only) costs nothing.
//
// What it does not do is collect on a timer: measured at 10,000 nodes
// (docs/benchmarks.md, session 3), a forced collection every 10 s held
// serve at 62 KiB a node but doubled its idle CPU (4 → 9.6 % of a core),
// every 30 s 81 KiB at 6.6 %; the live heap (each connection's state in
// the broker, 37 KiB) leaves no room for a limit under 60 KiB that does
// not have the collector run all the time.

// burstCheck is how often serve looks at how much it allocated.
const burstCheck = 5 * time.Second

// quietWatch decides, one interval at a time, when a burst has passed.
type quietWatch struct{ inBurst bool }

// burstFloor is the least allocation in one interval that is a burst;
// above it, a burst is also a quarter of the live heap.
const burstFloor = 64 << 20

// step takes the bytes allocated in the last interval and the live heap,
// and says whether now is the time to give memory back: the first quiet
// interval after a burst.
func (q *quietWatch) step(allocated, live uint64) bool {
	if allocated > max(burstFloor, live/4) {
		q.inBurst = true
		return false
	}
	was := q.inBurst
	q.inBurst = false
	return was
}

// giveBackWhenQuiet runs until ctx ends.
func giveBackWhenQuiet(ctx context.Context, log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	read := func() (allocs, live uint64) {
		metrics.Read(samples)
		if samples[0].Value.Kind() != metrics.KindUint64 || samples[1].Value.Kind() != metrics.KindUint64 {
			return 0, 0
		}
		return samples[0].Value.Uint64(), samples[1].Value.Uint64()
	}
	var q quietWatch
	last, _ := read()
	t := time.NewTicker(burstCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		allocs, live := read()
		if q.step(allocs-last, live) {
			start := time.Now()
			debug.FreeOSMemory()
			log.Debug("a burst passed: memory given back", "took", time.Since(start).Round(time.Millisecond))
		}
		last = allocs
	}
}
