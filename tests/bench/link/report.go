package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

// The link's targets on a 2-core machine.
const (
	pushP50Limit   = 10.0   // ms
	pushP99Limit   = 30.0   // ms
	flurryLimit    = 2000.0 // ms, from the first declare to the newest's report
	rssLimitMiB    = 15.0
	rssInfoProcess = "mesh-control"
)

// latency is a series of samples, summarised (ms).
type latency struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

type pushResult struct {
	DeclarationBytes int `json:"declaration_bytes"`
	EnvelopeBytes    int `json:"envelope_bytes"`
	ReportBytes      int `json:"report_bytes"`
	// Latency: from the call of control.Client.Declare to the report's
	// arrival on the driver's connection.
	Latency latency `json:"push_to_report"`
	// Declare: the call itself (sequence taken, signed, publish acked).
	Declare latency `json:"declare_call"`
	// Floor: a raw NATS request/reply between two control-side
	// connections over the same broker, envelope out, report-sized back.
	Floor latency `json:"nats_request_reply"`
	// Executor: from the agent forwarding the declaration to the
	// executor's verdict, from the agent's log (whole milliseconds).
	Executor latency `json:"executor_from_agent_log"`
	// Stalled pushes took over a second: held up by a retry (the
	// executor refused the agent busy, BusyRefusals times in this phase);
	// NotStalled is the others.
	Stalled      int     `json:"stalled_over_1s"`
	NotStalled   latency `json:"push_to_report_not_stalled"`
	BusyRefusals int     `json:"executor_busy_refusals"`
}

type flurryResult struct {
	Declarations       int     `json:"declarations"`
	PublishMS          float64 `json:"publish_ms"`            // the declares, one after another
	NewestMS           float64 `json:"newest_reported_ms"`    // first declare → the newest's report
	AfterLastPublishMS float64 `json:"after_last_publish_ms"` // last declare returned → the newest's report
	AllReportedMS      float64 `json:"all_reported_ms"`       // first declare → the last report of the flurry
	Applied            int     `json:"applied"`
	Superseded         int     `json:"superseded"`
	RefusedReplay      int     `json:"refused_replay"` // valid, but reached a drain after a newer one was applied
	BusyRefusals       int     `json:"executor_busy_refusals"`
	DuplicateReports   int     `json:"duplicate_reports"` // reports sent twice (at least once)
}

type rssRow struct {
	Process string  `json:"process"`
	PID     int     `json:"pid"`
	RSSMiB  float64 `json:"vm_rss_mib"`
	PeakMiB float64 `json:"vm_hwm_mib"`
	AnonMiB float64 `json:"rss_anon_mib"` // of VmRSS: the heap, stacks
	FileMiB float64 `json:"rss_file_mib"` // of VmRSS: the binary's pages in memory
}

type binRow struct {
	Binary   string  `json:"binary"`
	Path     string  `json:"path"`
	Bytes    int64   `json:"bytes"`
	MiB      float64 `json:"mib"`
	Static   bool    `json:"static"`
	Stripped bool    `json:"stripped"`
}

type target struct {
	Check   string  `json:"check"`
	Value   float64 `json:"value"`
	Limit   float64 `json:"limit"`
	Unit    string  `json:"unit"`
	Verdict string  `json:"verdict"` // PASS, MISS, FAILED (the system did not do the job)
}

type hostInfo struct {
	Kernel    string `json:"kernel"`
	CPUs      int    `json:"cpus"`
	CPU       string `json:"cpu"`
	FSType    string `json:"fs_type"`
	Mount     string `json:"mount"`
	WorkDir   string `json:"work_dir"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

type results struct {
	Time         string       `json:"time"`
	Host         hostInfo     `json:"host"`
	Build        string       `json:"build"`
	Files        int          `json:"files"`
	FileBytes    int          `json:"file_bytes"`
	Pushes       int          `json:"pushes"`
	Warmup       int          `json:"warmup"`
	Heartbeat    string       `json:"agent_heartbeat"`
	Push         pushResult   `json:"push"`
	Flurry       flurryResult `json:"flurry"`
	RSS          []rssRow     `json:"rss"`
	Binaries     []binRow     `json:"binaries"`
	Targets      []target     `json:"targets"`
	OtherReports int          `json:"reconcile_reports"` // reports of reconciles (link came back), not of pushes
	Failures     []string     `json:"failures"`
	Seconds      float64      `json:"seconds"`
}

func stats(xs []float64) latency {
	if len(xs) == 0 {
		return latency{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return latency{N: len(s), Mean: sum / float64(len(s)), Min: s[0], P50: rank(s, 0.50), P90: rank(s, 0.90), P99: rank(s, 0.99), Max: s[len(s)-1]}
}

// rank is the nearest-rank percentile of sorted s.
func rank(s []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 { return stats(xs).P50 }

// targets judges the results. A measurement the system failed to complete
// is FAILED, not judged.
func (b *bench) targets() []target {
	r := b.res
	var ts []target
	judge := func(check string, value, limit float64, unit string, measured bool) {
		t := target{Check: check, Value: value, Limit: limit, Unit: unit}
		switch {
		case !measured:
			t.Verdict = "FAILED"
		case value <= limit:
			t.Verdict = "PASS"
		default:
			t.Verdict = "MISS"
		}
		ts = append(ts, t)
	}
	pushed := r.Push.Latency.N > 0
	judge("push → report p50", r.Push.Latency.P50, pushP50Limit, "ms", pushed)
	judge("push → report p99", r.Push.Latency.P99, pushP99Limit, "ms", pushed)
	judge("flurry: newest reported", r.Flurry.NewestMS, flurryLimit, "ms", r.Flurry.Declarations > 0)
	for _, name := range []string{"mesh-agent", "mesh-executor"} {
		var v float64
		ok := false
		for _, row := range r.RSS {
			if row.Process == name {
				v, ok = row.RSSMiB, true
			}
		}
		judge(name+" steady RSS", v, rssLimitMiB, "MiB", ok)
	}
	return ts
}

func (b *bench) printHeader(w io.Writer) {
	h, c := b.res.Host, b.cfg
	fmt.Fprintf(w, "\nmesh link bench: control side (embedded NATS, TLS, JetStream) → agent (as %s) → executor (root), loopback, build %s\n", c.agentUser, b.m.build)
	fmt.Fprintf(w, "host:    %s, %d CPUs, kernel %s, load average %s\n", h.CPU, h.CPUs, h.Kernel, h.LoadStart)
	fmt.Fprintf(w, "disk:    %s on %s (%s)\n", b.m.work, h.FSType, h.Mount)
	fmt.Fprintf(w, "push:    a directory and %d files of %d bytes, two contents alternating (every push rewrites every file);\n", c.files, fileSize)
	fmt.Fprintf(w, "         %d timed pushes one at a time after %d untimed; time from Declare (sequence, sign, publish) to the report's arrival\n", c.pushes, c.warmup)
	fmt.Fprintf(w, "floor:   NATS request/reply between two control-side connections on the same broker, interleaved with the pushes\n")
	fmt.Fprintf(w, "flurry:  %d declarations declared back to back; time from the first declare to the newest's report\n", c.flurry)
	fmt.Fprintf(w, "RSS:     VmRSS after %v idle once the flurry is reported (median of 5 samples); agent heartbeat every %v\n", c.settle, c.heartbeat)
}

func (b *bench) printTable(w io.Writer) {
	r := b.res
	r.Host.LoadEnd = loadAvg()
	r.Targets = b.targets()
	verdict := func(check string) string {
		for _, t := range r.Targets {
			if t.Check == check {
				return t.Verdict
			}
		}
		return ""
	}
	fmt.Fprintf(w, "\nload average at the end: %s\n\n", r.Host.LoadEnd)
	fmt.Fprintf(w, "%-34s %5s %8s %8s %8s %8s %8s  %s\n", "measure", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms", "target / verdict")
	line := func(name string, l latency, tgt string) {
		if l.N == 0 {
			fmt.Fprintf(w, "%-34s %5s  not measured\n", name, "-")
			return
		}
		fmt.Fprintf(w, "%-34s %5d %8.2f %8.2f %8.2f %8.2f %8.2f  %s\n", name, l.N, l.P50, l.P90, l.P99, l.Max, l.Mean, tgt)
	}
	pv := verdict("push → report p50")
	if v := verdict("push → report p99"); v != "PASS" && pv == "PASS" || v == "FAILED" {
		pv = v
	}
	line("push → applied → report", r.Push.Latency, fmt.Sprintf("p50<=%.0f, p99<=%.0f  %s", pushP50Limit, pushP99Limit, pv))
	line("  of which the declare call", r.Push.Declare, "(sequence from the registry, sign, publish acked)")
	line("  of which the executor", r.Push.Executor, "(agent forwards → verdict, from the agent's log, whole ms)")
	if r.Push.Stalled > 0 || r.Push.BusyRefusals > 0 {
		line(fmt.Sprintf("  without the %d stalled >1 s", r.Push.Stalled), r.Push.NotStalled,
			fmt.Sprintf("(information: the executor refused the agent busy %d time(s))", r.Push.BusyRefusals))
	}
	line("raw NATS request/reply (floor)", r.Push.Floor, fmt.Sprintf("(%d B out, %d B back)", r.Push.EnvelopeBytes, r.Push.ReportBytes))

	f := r.Flurry
	fmt.Fprintln(w)
	if f.Declarations > 0 {
		fmt.Fprintf(w, "%-34s %5d %8.0f ms to the newest's report  <=%.0f ms  %s\n", "flurry", f.Declarations, f.NewestMS, flurryLimit, verdict("flurry: newest reported"))
		fmt.Fprintf(w, "%-34s       declaring took %.0f ms; the newest reported %.0f ms after the last declare; all reported at %.0f ms\n", "", f.PublishMS, f.AfterLastPublishMS, f.AllReportedMS)
		fmt.Fprintf(w, "%-34s       applied %d, superseded %d", "", f.Applied, f.Superseded)
		if f.RefusedReplay > 0 {
			fmt.Fprintf(w, ", refused as older than the last applied %d", f.RefusedReplay)
		}
		if f.BusyRefusals > 0 {
			fmt.Fprintf(w, "; the executor refused the agent busy %d time(s)", f.BusyRefusals)
		}
		if f.DuplicateReports > 0 {
			fmt.Fprintf(w, ", %d report(s) sent twice", f.DuplicateReports)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "%-34s  not measured\n", "flurry")
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-34s %8s %8s %8s %8s  %s\n", "steady RSS (idle), MiB", "VmRSS", "anon", "file", "VmHWM", "target / verdict")
	for _, row := range r.RSS {
		tgt := fmt.Sprintf("<=%.0f MiB  %s", rssLimitMiB, verdict(row.Process+" steady RSS"))
		if row.Process == rssInfoProcess {
			tgt = "(information: the control side with its embedded broker)"
		}
		fmt.Fprintf(w, "%-34s %8.1f %8.1f %8.1f %8.1f  %s\n", row.Process, row.RSSMiB, row.AnonMiB, row.FileMiB, row.PeakMiB, tgt)
	}
	if len(r.RSS) == 0 {
		fmt.Fprintf(w, "%-34s  not measured\n", "")
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-34s %8s\n", "binary size", "MiB")
	for _, row := range r.Binaries {
		kind := "static"
		if !row.Static {
			kind = "DYNAMIC"
		}
		if row.Stripped {
			kind += ", stripped"
		}
		fmt.Fprintf(w, "%-34s %8.2f  %d bytes, %s\n", row.Binary, row.MiB, row.Bytes, kind)
	}

	var misses []string
	for _, t := range r.Targets {
		if t.Verdict == "MISS" {
			misses = append(misses, fmt.Sprintf("%s is %.2f %s, target <= %.0f %s", t.Check, t.Value, t.Unit, t.Limit, t.Unit))
		}
	}
	if len(misses) > 0 {
		fmt.Fprintf(w, "\n%s\n*** MISS: %d target(s) not met\n", strings.Repeat("*", 72), len(misses))
		for _, m := range misses {
			fmt.Fprintf(w, "***   %s\n", m)
		}
		fmt.Fprintln(w, strings.Repeat("*", 72))
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "\n%s\n!!! FAILED: the system did not do the job (results are not valid)\n", strings.Repeat("!", 72))
		for _, f := range r.Failures {
			fmt.Fprintf(w, "!!!   %s\n", f)
		}
		fmt.Fprintln(w, strings.Repeat("!", 72))
	}
}

func (b *bench) writeJSON(path string) error {
	r := b.res
	r.Time = time.Now().UTC().Format(time.RFC3339)
	r.Build, r.Files, r.FileBytes, r.Pushes, r.Warmup = b.m.build, b.cfg.files, fileSize, b.cfg.pushes, b.cfg.warmup
	r.Heartbeat = b.cfg.heartbeat.String()
	if r.Targets == nil {
		r.Targets = b.targets()
	}
	if r.Failures == nil {
		r.Failures = []string{}
	}
	data, err := json.MarshalIndent(r, "", "  ")
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
