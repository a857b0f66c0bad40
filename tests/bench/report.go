package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// The targets for mesh-executor on a 2-core machine, durable
// throughout. Times are against cf-agent and the floor measured in the same
// run; the floor ratio applies only where the work is a check or one file.
const (
	rssLimitMiB     = 15
	checkCFLimit    = 0.10 // no-op and one-file: at most a tenth of cf-agent's time
	checkFloorLimit = 2.0  // no-op and one-file: at most twice the floor
	convergeCFLimit = 0.50 // converge and drift repair: at most half of cf-agent's time
)

// toolOrder is the order of a scenario's lines in the table.
var toolOrder = map[string]int{executorName: 0, floorName: 1, floorBatchedName: 2, cfAgentName: 3}

// row is one (scenario, tool) line of the table and of results.json.
type row struct {
	Scenario     string    `json:"scenario"`
	Tool         string    `json:"tool"`
	Runs         int       `json:"runs"`
	MedianMS     float64   `json:"median_ms"`
	MinMS        float64   `json:"min_ms"`
	MaxMS        float64   `json:"max_ms"`
	MedianRSSMiB float64   `json:"median_rss_mib"`
	MaxRSSMiB    float64   `json:"max_rss_mib"`
	RatioCFAgent *float64  `json:"ratio_cf_agent"` // null when cf-agent was not measured
	RatioFloor   *float64  `json:"ratio_floor"`
	SamplesMS    []float64 `json:"samples_ms"`
	Failed       string    `json:"failed,omitempty"`
}

// target is one of the targets, judged.
type target struct {
	Scenario string  `json:"scenario"`
	Check    string  `json:"check"`
	Value    float64 `json:"value"`
	Limit    float64 `json:"limit"`
	Verdict  string  `json:"verdict"` // PASS, MISS, n/a (a reference is missing), FAILED (the executor was wrong)
}

type hostInfo struct {
	Kernel  string `json:"kernel"`
	CPUs    int    `json:"cpus"`
	CPU     string `json:"cpu"`
	FSType  string `json:"fs_type"`
	Mount   string `json:"mount"`
	WorkDir string `json:"work_dir"`
	// The load averages before and after the bench: other work on the
	// machine shows up in every figure, most in the ones that fsync.
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

func (b *bench) rows() []row {
	var rows []row
	for _, s := range scenarios {
		res := b.results[s]
		names := make([]string, 0, len(res))
		for name := range res {
			names = append(names, name)
		}
		sort.Slice(names, func(i, j int) bool { return toolOrder[names[i]] < toolOrder[names[j]] })
		cf, floor := medianMS(res[cfAgentName]), medianMS(res[floorName])
		for _, name := range names {
			ser := res[name]
			r := row{Scenario: string(s), Tool: name, Runs: len(ser.samples)}
			if ser.failed != nil {
				r.Failed = brief(ser.failed.Error())
			}
			if len(ser.samples) > 0 {
				var ms, rss []float64
				for _, smp := range ser.samples {
					ms = append(ms, float64(smp.wall.Microseconds())/1000)
					rss = append(rss, float64(smp.rssKiB)/1024)
				}
				r.SamplesMS = ms
				r.MedianMS, r.MinMS, r.MaxMS = median(ms), minOf(ms), maxOf(ms)
				r.MedianRSSMiB, r.MaxRSSMiB = median(rss), maxOf(rss)
				r.RatioCFAgent = ratio(r.MedianMS, cf)
				r.RatioFloor = ratio(r.MedianMS, floor)
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// targets judges mesh-executor's rows against the targets.
func (b *bench) targets(rows []row) []target {
	var ts []target
	for _, r := range rows {
		if r.Tool != executorName {
			continue
		}
		judge := func(check string, value *float64, limit float64) {
			t := target{Scenario: r.Scenario, Check: check, Limit: limit}
			switch {
			case r.Failed != "":
				t.Verdict = "FAILED"
			case value == nil:
				t.Verdict = "n/a"
			case *value <= limit:
				t.Value, t.Verdict = *value, "PASS"
			default:
				t.Value, t.Verdict = *value, "MISS"
			}
			ts = append(ts, t)
		}
		switch scenario(r.Scenario) {
		case noop, oneFile:
			judge("time / cf-agent", r.RatioCFAgent, checkCFLimit)
			judge("time / floor", r.RatioFloor, checkFloorLimit)
		case converge, drift:
			judge("time / cf-agent", r.RatioCFAgent, convergeCFLimit)
		}
		rss := r.MedianRSSMiB
		judge("peak RSS MiB", &rss, rssLimitMiB)
	}
	return ts
}

func (b *bench) printHeader(w io.Writer) {
	h := b.host
	fmt.Fprintf(w, "mesh-executor apply bench: %d files of %d bytes in %d directories, %d timed runs each (median), 1 warm-up\n",
		b.cfg.files, len(b.files[0].Content), benchtree.Dirs, b.cfg.runs)
	fmt.Fprintf(w, "host:    %s, %d CPUs, kernel %s, load average %s\n", h.CPU, h.CPUs, h.Kernel, h.LoadStart)
	fmt.Fprintf(w, "disk:    %s on %s (%s)\n", h.WorkDir, h.FSType, h.Mount)
	fmt.Fprintf(w, "cache:   page cache kept WARM (not dropped); sync(2) before every timed run\n")
	fmt.Fprintf(w, "RSS:     peak RSS of the whole process (ru_maxrss); spawn's own floor is %.1f MiB (/bin/true)\n", float64(b.rssFloor)/1024)
	if b.cfg.executor == "" {
		fmt.Fprintf(w, "NOTE:    no -executor given: measuring the references only\n")
	}
	if b.cfVersion != "" {
		fmt.Fprintf(w, "cf-agent: %s, standalone: -K, own -w workdir, -f policy (files promises with content)\n", b.cfVersion)
	} else {
		fmt.Fprintf(w, "\n*** cf-agent NOT FOUND: targets against cf-agent are not judged (n/a) ***\n\n")
	}
	fmt.Fprintln(w)
}

func (b *bench) printTable(w io.Writer) {
	b.host.LoadEnd = loadAvg()
	rows := b.rows()
	targets := b.targets(rows)
	fmt.Fprintf(w, "\nload average at the end: %s (medians of interleaved rounds; min-max shows the spread)\n\n", b.host.LoadEnd)
	fmt.Fprintf(w, "%-13s %-21s %9s %15s %8s %9s %7s  %s\n",
		"scenario", "tool", "median ms", "min-max ms", "RSS MiB", "/cf-agent", "/floor", "target / verdict")
	last := ""
	for _, r := range rows {
		if r.Scenario != last && last != "" {
			fmt.Fprintln(w)
		}
		last = r.Scenario
		if r.Failed != "" && r.Runs == 0 {
			fmt.Fprintf(w, "%-13s %-21s FAILED: %s\n", r.Scenario, r.Tool, r.Failed)
			continue
		}
		verdict := ""
		if r.Tool == executorName {
			verdict = targetText(scenario(r.Scenario)) + "  " + summary(targets, r.Scenario)
		}
		if r.Failed != "" {
			verdict += "  FAILED: " + r.Failed
		}
		fmt.Fprintf(w, "%-13s %-21s %9.1f %15s %8.1f %9s %7s  %s\n",
			r.Scenario, r.Tool, r.MedianMS, fmt.Sprintf("%.1f-%.1f", r.MinMS, r.MaxMS),
			r.MedianRSSMiB, ratioText(r.RatioCFAgent), ratioText(r.RatioFloor), verdict)
	}

	var misses []string
	for _, t := range targets {
		if t.Verdict == "MISS" {
			misses = append(misses, fmt.Sprintf("%s: mesh-executor %s is %.3f, target <= %.2f", t.Scenario, t.Check, t.Value, t.Limit))
		}
	}
	if len(misses) > 0 {
		fmt.Fprintf(w, "\n%s\n*** MISS: %d target(s) not met\n", strings.Repeat("*", 72), len(misses))
		for _, m := range misses {
			fmt.Fprintf(w, "***   %s\n", m)
		}
		fmt.Fprintln(w, strings.Repeat("*", 72))
	}
	if len(b.failures) > 0 {
		fmt.Fprintf(w, "\n%s\n!!! FAILED: a tool did not produce the declared state (results are not valid)\n", strings.Repeat("!", 72))
		for _, f := range b.failures {
			fmt.Fprintf(w, "!!!   %s\n", f)
		}
		fmt.Fprintln(w, strings.Repeat("!", 72))
	}
}

// targetText states the targets of a scenario in the table.
func targetText(s scenario) string {
	switch s {
	case noop, oneFile:
		return fmt.Sprintf("<=%.2fx cf, <=%.0fx floor, <=%d MiB", checkCFLimit, checkFloorLimit, rssLimitMiB)
	default:
		return fmt.Sprintf("<=%.2fx cf, <=%d MiB", convergeCFLimit, rssLimitMiB)
	}
}

// summary folds a scenario's judged targets into one word.
func summary(ts []target, s string) string {
	verdict := "PASS"
	for _, t := range ts {
		if t.Scenario != s {
			continue
		}
		switch {
		case t.Verdict == "FAILED":
			return "FAILED"
		case t.Verdict == "MISS":
			verdict = "MISS"
		case t.Verdict == "n/a" && verdict == "PASS":
			verdict = "PASS (partly n/a)"
		}
	}
	return verdict
}

func (b *bench) writeJSON(path string) error {
	rows := b.rows()
	out := struct {
		Time        string   `json:"time"`
		Host        hostInfo `json:"host"`
		Files       int      `json:"files"`
		FileBytes   int      `json:"file_bytes"`
		Dirs        int      `json:"dirs"`
		Runs        int      `json:"runs"`
		Cache       string   `json:"cache"`
		RSSFloorMiB float64  `json:"rss_floor_mib"`
		CFAgent     string   `json:"cf_agent_version"`
		Rows        []row    `json:"rows"`
		Targets     []target `json:"targets"`
		Failures    []string `json:"failures"`
	}{
		Time: time.Now().UTC().Format(time.RFC3339), Host: b.host,
		Files: b.cfg.files, FileBytes: len(b.files[0].Content), Dirs: benchtree.Dirs, Runs: b.cfg.runs,
		Cache:       "warm: the page cache is not dropped; sync(2) before every timed run",
		RSSFloorMiB: float64(b.rssFloor) / 1024, CFAgent: b.cfVersion,
		Rows: rows, Targets: b.targets(rows), Failures: b.failures,
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// readHostInfo gathers what a reader needs to compare figures across runs.
func readHostInfo(dir string) hostInfo {
	h := hostInfo{CPUs: runtime.NumCPU(), WorkDir: dir}
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(k))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	h.FSType, _ = fsType(dir)
	h.Mount = mountOf(dir)
	h.LoadStart = loadAvg()
	return h
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// fsType names the filesystem holding dir from its statfs magic number.
func fsType(dir string) (string, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	names := map[int64]string{
		0xEF53:     "ext4",
		0x58465342: "xfs",
		0x9123683E: "btrfs",
		0x01021994: "tmpfs",
		0x858458F6: "ramfs",
		0x794C7630: "overlayfs",
		0x2FC12FC1: "zfs",
		0xF2F52010: "f2fs",
	}
	if n, ok := names[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("fs 0x%x", st.Type), nil
}

// mountOf returns the /proc/self/mounts line of the mount holding dir.
func mountOf(dir string) string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	best, bestLen := "", -1
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		mp := f[1]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > bestLen {
			best, bestLen = f[0]+" on "+mp+" "+f[2]+" "+f[3], len(mp)
		}
	}
	return best
}

func medianMS(s *series) float64 {
	if s == nil || s.failed != nil || len(s.samples) == 0 {
		return 0
	}
	ms := make([]float64, len(s.samples))
	for i, smp := range s.samples {
		ms[i] = float64(smp.wall.Microseconds()) / 1000
	}
	return median(ms)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// ratio is a/ref, or nil when the reference was not measured (or failed).
func ratio(a, ref float64) *float64 {
	if ref <= 0 {
		return nil
	}
	r := a / ref
	return &r
}

func ratioText(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *r)
}

// brief shortens a failure to its first line and, when that line only
// introduces a list, the list's first item.
func brief(s string) string {
	lines := strings.SplitN(s, "\n", 3)
	if len(lines) > 1 && strings.HasSuffix(lines[0], ":") {
		return lines[0] + " " + strings.TrimSpace(lines[1])
	}
	return lines[0]
}
