package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 50, 7 * time.Millisecond},
		{ms(7), 100, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 50, 2 * time.Millisecond}, // nearest rank: the 2nd of 4
		{ms(4, 1, 3, 2), 100, 4 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 50, 3 * time.Millisecond},
		{ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 90, 9 * time.Millisecond},
		{ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 1, 1 * time.Millisecond},
	} {
		in := append([]time.Duration(nil), c.in...)
		if got := percentile(c.in, c.p); got != c.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Fatalf("percentile sorted its argument: %v", c.in)
			}
		}
	}
}

// The verdicts the table prints: PASS only at the fleet size a target is
// stated for, MISS for a miss (measured, extrapolated, incomplete or not
// measured), and a target met on a smaller fleet said so.
func TestJudge(t *testing.T) {
	x := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name string
		t    target
		f    figure
		n    int
		want string
	}{
		{"met at scale", targetFanout, figure{value: 4.2, measured: true}, 10000, "PASS"},
		{"met beyond scale", targetFanout, figure{value: 4.2, measured: true}, 12000, "PASS"},
		{"missed at scale", targetFanout, figure{value: 12.2, measured: true}, 10000, "MISS"},
		{"missed below scale", targetFanout, figure{value: 6, measured: true}, 300, "MISS"},
		{"met below scale", targetFanout, figure{value: 0.4, measured: true}, 300, "met on 300 nodes only; the target is at 10,000"},
		{"at the limit", targetRestart, figure{value: 60, measured: true}, 10000, "PASS"},
		{"incomplete", targetRestart, figure{value: 20, measured: true, failed: true}, 10000, "MISS"},
		{"not measured", targetOverlay, figure{why: "serve did not start"}, 1000, "MISS (not measured)"},
		{"extrapolated miss", targetIdleCPU, figure{value: 1.2, measured: true, atScale: x(40)}, 300, "MISS (extrapolated to 10,000 nodes)"},
		{"extrapolated pass", targetIdleCPU, figure{value: 0.1, measured: true, atScale: x(3)}, 300, "met on 300 nodes only; the target is at 10,000"},
		{"extrapolation ignored at scale", targetIdleCPU, figure{value: 8, measured: true, atScale: x(80)}, 10000, "PASS"},
		{"scale-free met", targetMemory, figure{value: 50, measured: true}, 300, "PASS"},
		{"scale-free missed", targetMemory, figure{value: 160, measured: true}, 300, "MISS"},
		{"all registered below scale", targetRegistrable, figure{value: 300, measured: true}, 300, "met on 300 nodes only; the target is at 10,000"},
		{"registration refused", targetRegistrable, figure{value: 1000, measured: true, failed: true}, 10000, "MISS"},
		{"registration short below scale", targetRegistrable, figure{value: 900, measured: true}, 1000, "MISS"},
		{"all registered at scale", targetRegistrable, figure{value: 10000, measured: true}, 10000, "PASS"},
		{"overlay on 1,000", targetOverlay, figure{value: 29, measured: true}, 1000, "PASS"},
		{"overlay on 300", targetOverlay, figure{value: 29, measured: true}, 300, "met on 300 nodes only; the target is at 1,000"},
	} {
		if got := judge(c.t, c.f, c.n); got != c.want {
			t.Errorf("%s: judge = %q, want %q", c.name, got, c.want)
		}
		if isMiss(judge(c.t, c.f, c.n)) != strings.HasPrefix(c.want, "MISS") {
			t.Errorf("%s: isMiss disagrees with the verdict", c.name)
		}
	}
}

func TestTargetRow(t *testing.T) {
	const notRun = "not run (CLUSTER=1 runs it)"
	r := targetRow(targetCluster, figure{why: notRun}, 10000, "")
	if r.result != notRun || r.verdict != "MISS (not measured)" || r.target != targetCluster.text {
		t.Fatalf("cluster row: %+v", r)
	}
	// A cluster's worst server, measured below scale, is carried to it.
	x := 30.0
	if v := judge(targetCluster, figure{value: 3, measured: true, atScale: &x}, 1000); !isMiss(v) {
		t.Fatalf("3 %% on 1,000 nodes, 30 %% at 10,000: %q", v)
	}
	r = targetRow(targetFanout, figure{why: "no report was recorded"}, 300, "0 of 300 recorded")
	if r.result != "0 of 300 recorded; no report was recorded" {
		t.Fatalf("a figure not measured keeps what was said of it: %q", r.result)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	writeTable(&b, []row{
		{"nodes registrable", "1,000 of 10,000", "10,000", "MISS"},
		infoRow("agents | linked", "≤ all"),
	})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), b.String())
	}
	want := utf8.RuneCountInString(lines[0])
	for i, l := range lines {
		if utf8.RuneCountInString(l) != want {
			t.Errorf("line %d is %d wide, the header %d:\n%s", i, utf8.RuneCountInString(l), want, b.String())
		}
		if strings.Count(l, "|") != 5 {
			t.Errorf("line %d has %d bars, want 5 (a bar in a cell must not make a column): %q", i, strings.Count(l, "|"), l)
		}
	}
	if !strings.HasPrefix(lines[0], "| measure ") || !strings.HasPrefix(lines[1], "| ---") {
		t.Errorf("header and separator:\n%s", b.String())
	}
	if !strings.Contains(lines[3], "agents / linked") || !strings.Contains(lines[3], "| —") {
		t.Errorf("info row: %q", lines[3])
	}
}

func TestFormatting(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{312 * time.Millisecond: "312 ms", 4210 * time.Millisecond: "4.21 s", 0: "0 ms"} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestProcParsing(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (mesh (con) trol) S 1 4242 4242 0 -1 4194560 1234 0 0 0 1500 250 0 0 20 0 12 0 100 2000000 5000 18446744073709551615"
	got, err := parseStatCPU(stat)
	if err != nil || got != 1750 {
		t.Fatalf("parseStatCPU = %d, %v; want 1750", got, err)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Fatal("a short stat line was read")
	}
	a := cpuSample{at: time.Unix(100, 0), ticks: 1000}
	b := cpuSample{at: time.Unix(130, 0), ticks: 1300}
	if p := cpuPercent(a, b); p < 9.99 || p > 10.01 {
		t.Fatalf("300 ticks over 30 s = %.3f %% of a core, want 10", p)
	}
	status := "Name:\tmesh-control\nVmPeak:\t 900000 kB\nVmHWM:\t  250000 kB\nVmRSS:\t  200000 kB\nThreads:\t12\n"
	m, err := parseStatus(status)
	if err != nil || m.RSS != 200000 || m.HWM != 250000 {
		t.Fatalf("parseStatus = %+v, %v", m, err)
	}
	if _, err := parseStatus("Name:\tkworker\n"); err == nil {
		t.Fatal("a status without VmRSS was read")
	}
	limits := "Limit                     Soft Limit           Hard Limit           Units     \nMax processes             63897                63897                processes \nMax open files            20000                20000                files     \n"
	soft, hard, err := parseNofile(limits)
	if err != nil || soft != 20000 || hard != 20000 {
		t.Fatalf("parseNofile = %d, %d, %v", soft, hard, err)
	}
}

func TestExtrapolate(t *testing.T) {
	for _, c := range []struct {
		none, measured float64
		n, at          int
		want           float64
	}{
		{0.5, 3.5, 1000, 10000, 30.5}, // 0.003 % per node
		{0.5, 0.4, 300, 10000, 0.5},   // less than with none: noise, nothing per node
		{1, 2, 0, 10000, 2},
	} {
		if got := extrapolate(c.none, c.measured, c.n, c.at); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("extrapolate(%v, %v, %d, %d) = %v, want %v", c.none, c.measured, c.n, c.at, got, c.want)
		}
	}
}

// A contended run judges the fan-out, the restart and the overlay by their
// contended targets, and gives the idle CPU and the memory none.
func TestContendedTargets(t *testing.T) {
	quiet, busy := config{}, config{contended: true}
	for _, c := range []struct {
		name        string
		t           target
		f           figure
		n           int
		quiet, busy string
	}{
		{"fan-out in 15 s", targetFanout, figure{value: 15, measured: true}, 10000, "MISS", "PASS"},
		{"fan-out in 25 s", targetFanout, figure{value: 25, measured: true}, 10000, "MISS", "MISS"},
		{"relinked in 150 s", targetRestart, figure{value: 150, measured: true}, 10000, "MISS", "PASS"},
		{"overlay in 100 s", targetOverlay, figure{value: 100, measured: true}, 1000, "MISS", "PASS"},
		{"overlay cut off", targetOverlay, figure{value: 100, measured: true, failed: true}, 1000, "MISS", "MISS"},
		{"idle at 30 %", targetIdleCPU, figure{value: 30, measured: true}, 10000, "MISS", "—"},
		{"memory", targetMemory, figure{value: 90, measured: true}, 10000, "MISS", "—"},
	} {
		if got := quiet.judgedRow(c.t, c.f, c.n, "").verdict; got != c.quiet {
			t.Errorf("%s, quiet: %q, want %q", c.name, got, c.quiet)
		}
		r := busy.judgedRow(c.t, c.f, c.n, "")
		if r.verdict != c.busy {
			t.Errorf("%s, contended: %q, want %q", c.name, r.verdict, c.busy)
		}
		if r.measure != c.t.name || (c.busy != "—") != strings.HasSuffix(r.target, ", contended") {
			t.Errorf("%s, contended: the row %+v does not say its contended target", c.name, r)
		}
	}
}
