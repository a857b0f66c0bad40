package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// The fleet's targets, on this machine's kind (2 cores), embedded broker.
// Each is stated for a fleet size: a figure that grows with the fleet and meets its target on a smaller fleet
// proves nothing about the stated one, and is said so, not PASS.
var (
	targetRegistrable = target{name: "nodes registrable", limit: 10000, atLeast: true, nodes: 10000, scales: true,
		text: "10,000"}
	targetFanout = target{name: "one declaration to all nodes, p100 recorded", limit: 5, nodes: 10000, scales: true,
		unit: "s", text: "≤ 5 s at 10,000 nodes"}
	targetRestart = target{name: "stop + start + all reconnected", limit: 60, nodes: 10000, scales: true,
		unit: "s", text: "≤ 60 s at 10,000 nodes"}
	targetIdleCPU = target{name: "idle CPU of control + broker, 30 s heartbeats", limit: 10, nodes: 10000, scales: true,
		unit: "%", text: "≤ 10 % of a core at 10,000 nodes"}
	targetMemory = target{name: "broker + control memory per node", limit: 60, unit: "KiB",
		text: "≤ 60 KiB"}
	targetOverlay = target{name: "`overlay set`, all applied", limit: 30, nodes: 1000, scales: true,
		unit: "s", text: "≤ 30 s on 1,000 nodes"}
	targetCluster = target{name: "3-node cluster, idle CPU per server", limit: 10, nodes: 10000, scales: true,
		unit: "%", text: "≤ 10 % at 10,000 nodes"}
)

// The targets of a contended run (-contended: one core kept busy
// throughout): the fleet slows down in proportion, and never falls off a
// cliff. The idle CPU and the memory have none: the burner's core is not
// the broker's cost.
var contendedTargets = map[string]target{
	targetFanout.name: {name: targetFanout.name, limit: 20, nodes: 10000, scales: true,
		unit: "s", text: "≤ 20 s at 10,000 nodes, contended"},
	targetRestart.name: {name: targetRestart.name, limit: 180, nodes: 10000, scales: true,
		unit: "s", text: "≤ 180 s after serving at 10,000 nodes, contended"},
	targetOverlay.name: {name: targetOverlay.name, limit: 120, nodes: 1000, scales: true,
		unit: "s", text: "≤ 120 s on 1,000 nodes, contended"},
}

// targetOf is t as this run judges it: its contended form in a contended
// run, nil when it has none there (the row says so and is not judged).
func (c config) targetOf(t target) *target {
	if !c.contended {
		return &t
	}
	if ct, ok := contendedTargets[t.name]; ok {
		return &ct
	}
	return nil
}

// judgedRow is targetRow for t as this run judges it (targetOf): a row
// with no target when the run has none for it.
func (c config) judgedRow(t target, f figure, n int, result string) row {
	jt := c.targetOf(t)
	if jt == nil {
		r := targetRow(t, f, n, result)
		r.target, r.verdict = "— (no target when contended)", "—"
		return r
	}
	return targetRow(*jt, f, n, result)
}

// target is one row of the targets' table.
type target struct {
	name string
	// limit is the most the figure may be, or with atLeast the least.
	limit   float64
	atLeast bool
	// nodes is the fleet size the target is stated for (0: any).
	nodes int
	// scales: the figure grows with the fleet, so meeting the target
	// on a smaller fleet than nodes does not meet it.
	scales bool
	unit   string
	text   string // the target as the table prints it
}

// figure is what the bench measured for a target.
type figure struct {
	value float64
	// measured is false when the bench could not measure it; why says
	// why (the row is a MISS: the target is not shown to be met).
	measured bool
	why      string
	// atScale, when set, is the figure carried to the target's fleet size
	// (a linear extrapolation, said so): a smaller fleet whose
	// extrapolated figure misses is a MISS.
	atScale *float64
	// failed: the figure is incomplete in a way that misses the target
	// whatever its value (registration stopped short, nodes never
	// reconnected): why says how.
	failed bool
}

// The verdicts.
const (
	verdictPass = "PASS"
	verdictMiss = "MISS"
)

// judge is the verdict of f against t on a fleet of n nodes: PASS only
// when the target is met at (or beyond) the fleet size it is stated for;
// MISS when it is missed, not measured, or (extrapolated) missed at scale;
// otherwise it says the target was met on n nodes only.
func judge(t target, f figure, n int) string {
	if !f.measured {
		return verdictMiss + " (not measured)"
	}
	if f.failed {
		return verdictMiss
	}
	limit := t.limit
	small := t.scales && t.nodes > 0 && n < t.nodes
	if t.atLeast && small {
		// Everything asked for was had: the most a smaller fleet can show.
		limit = math.Min(limit, float64(n))
	}
	if !meets(t, f.value, limit) {
		return verdictMiss
	}
	if !small {
		return verdictPass
	}
	if f.atScale != nil && !meets(t, *f.atScale, t.limit) {
		return fmt.Sprintf("%s (extrapolated to %s nodes)", verdictMiss, thousands(t.nodes))
	}
	return fmt.Sprintf("met on %s nodes only; the target is at %s", thousands(n), thousands(t.nodes))
}

func meets(t target, v, limit float64) bool {
	if t.atLeast {
		return v >= limit
	}
	return v <= limit
}

// extrapolate carries a figure measured on n nodes to at nodes, linearly:
// what it was with no node, and what each node added.
func extrapolate(none, measured float64, n, at int) float64 {
	if n <= 0 {
		return measured
	}
	per := max(0, measured-none) / float64(n)
	return none + per*float64(at)
}

// isMiss says whether a verdict is a miss.
func isMiss(v string) bool { return strings.HasPrefix(v, verdictMiss) }

// percentile is the nearest-rank p-th percentile of ds (p in (0, 100]):
// the smallest sample at least p % of the samples are not above. p100 is
// the largest. It is 0 for no samples.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// seconds prints a duration the way the table does: milliseconds under a
// second, seconds with two decimals above.
func seconds(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// thousands prints n with thousands separated by commas, as the targets
// write fleet sizes.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// row is one line of the printed table.
type row struct {
	measure, result, target, verdict string
}

// writeTable prints rows as a Markdown table, its columns padded so it
// reads in a terminal as well as in docs/benchmarks.md.
func writeTable(w io.Writer, rows []row) {
	head := row{"measure", "result", "target", "verdict"}
	all := append([]row{head}, rows...)
	width := [4]int{}
	for _, r := range all {
		for i, c := range r.cells() {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(cells [4]string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			b.WriteString(" ")
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)))
			b.WriteString(" |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(head.cells())
	var sep [4]string
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r.cells())
	}
}

func (r row) cells() [4]string {
	clean := func(s string) string { return strings.ReplaceAll(s, "|", "/") }
	return [4]string{clean(r.measure), clean(r.result), clean(r.target), clean(r.verdict)}
}

// targetRow is the row of a target: its figure's text, the target, and the
// verdict on n nodes.
func targetRow(t target, f figure, n int, result string) row {
	if !f.measured && f.why != "" {
		if result == "" {
			result = f.why
		} else {
			result += "; " + f.why
		}
	}
	return row{measure: t.name, result: result, target: t.text, verdict: judge(t, f, n)}
}

// infoRow is a row with no target: a figure that explains the others.
func infoRow(measure, result string) row {
	return row{measure: measure, result: result, target: "—", verdict: "—"}
}
