package serve

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The executor's own metrics, as a textfile in Prometheus' text format for
// node_exporter's textfile collector (serve --metrics-file PATH, e.g.
// /var/lib/prometheus/node-exporter/mesh-executor.prom): what it applied
// since it started, by source and outcome, the last apply of each source
// (when, how long, its outcome), what it holds, whether the agent says it
// is linked, and its version. A file, not a listener: the executor opens
// no port, and node_exporter already reads such files. Written whole after
// each apply and replaced by a rename, so a scrape never reads half of it.
// Hand-written: the format is a dozen lines, and the executor's
// dependencies are kept few (docs/dependencies.md).

// execMetrics is what the daemon counts for its textfile.
type execMetrics struct {
	mu      sync.Mutex
	applies map[[2]string]int // source, outcome → count
	last    map[string]lastApply
	holds   int
	// panics counts the panics recovered at the request boundary
	// (recover.go) since the daemon started.
	panics int
}

type lastApply struct {
	at      time.Time
	took    time.Duration
	outcome shapes.Outcome
	seq     uint64
}

// noteApply counts an apply and writes the file, when there is one.
func (s *Server) noteApply(src, outcome string, seq uint64, took time.Duration, holds int) {
	if s.cfg.MetricsFile == "" {
		return
	}
	m := &s.metrics
	m.mu.Lock()
	if m.applies == nil {
		m.applies, m.last = map[[2]string]int{}, map[string]lastApply{}
	}
	m.applies[[2]string{src, outcome}]++
	m.last[src] = lastApply{at: clock.Now(), took: took, outcome: shapes.Outcome(outcome), seq: seq}
	if holds >= 0 {
		m.holds = holds
	}
	m.mu.Unlock()
	s.writeMetrics()
}

// writeMetrics writes the file as the counts are now, when there is one.
func (s *Server) writeMetrics() {
	if s.cfg.MetricsFile == "" {
		return
	}
	m := &s.metrics
	m.mu.Lock() // held while writing: two writers would share the temporary file
	defer m.mu.Unlock()
	if err := writeTextfile(s.cfg.MetricsFile, s.metricsText()); err != nil {
		s.log.Warn("the metrics file could not be written", "path", s.cfg.MetricsFile, "err", err)
	}
}

// metricsText is the file's content. Callers hold metrics.mu.
func (s *Server) metricsText() string {
	m := &s.metrics
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	family("mesh_executor_info", "gauge", "The executor's version and build (value 1).")
	fmt.Fprintf(&b, "mesh_executor_info{version=%s,build=%s} 1\n", quote(s.cfg.Version), quote(s.cfg.Build))
	family("mesh_executor_applies_total", "counter", "Applies since the daemon started, by source (link, local, bundle) and outcome.")
	keys := make([][2]string, 0, len(m.applies))
	for k := range m.applies {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) })
	for _, k := range keys {
		fmt.Fprintf(&b, "mesh_executor_applies_total{source=%s,outcome=%s} %d\n", quote(k[0]), quote(k[1]), m.applies[k])
	}
	srcs := make([]string, 0, len(m.last))
	for src := range m.last {
		srcs = append(srcs, src)
	}
	slices.Sort(srcs)
	family("mesh_executor_last_apply_timestamp_seconds", "gauge", "When each source's last apply ended (Unix time).")
	for _, src := range srcs {
		fmt.Fprintf(&b, "mesh_executor_last_apply_timestamp_seconds{source=%s} %s\n", quote(src), num(float64(m.last[src].at.UnixNano())/1e9))
	}
	family("mesh_executor_last_apply_duration_seconds", "gauge", "How long each source's last apply took.")
	for _, src := range srcs {
		fmt.Fprintf(&b, "mesh_executor_last_apply_duration_seconds{source=%s} %s\n", quote(src), num(m.last[src].took.Seconds()))
	}
	family("mesh_executor_last_apply_failed", "gauge", "1 when each source's last apply has a failed line (or was refused).")
	for _, src := range srcs {
		failed := 0
		if o := m.last[src].outcome; o == shapes.Failed || o == shapes.Refused {
			failed = 1
		}
		fmt.Fprintf(&b, "mesh_executor_last_apply_failed{source=%s} %d\n", quote(src), failed)
	}
	family("mesh_executor_link_sequence", "gauge", "The sequence of the link's last declaration applied.")
	fmt.Fprintf(&b, "mesh_executor_link_sequence %d\n", m.last["link"].seq)
	family("mesh_executor_holds", "gauge", "What the host holds on this machine (entries of its store).")
	fmt.Fprintf(&b, "mesh_executor_holds %d\n", m.holds)
	family("mesh_executor_recovered_panics_total", "counter", "Panics recovered at the request boundary since the daemon started: each answered as an internal error, its stack in the log.")
	fmt.Fprintf(&b, "mesh_executor_recovered_panics_total %d\n", m.panics)
	s.lastMu.Lock()
	l := s.link
	s.lastMu.Unlock()
	if !l.SaidAt.IsZero() {
		up := 0
		if l.Up {
			up = 1
		}
		family("mesh_executor_agent_linked", "gauge", "1 when the agent last said its link is up.")
		fmt.Fprintf(&b, "mesh_executor_agent_linked %d\n", up)
	}
	return b.String()
}

func quote(s string) string { return strconv.Quote(s) }

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// writeTextfile replaces path with text: a temporary beside it, renamed
// (the textfile collector reads only *.prom, and never a half-written one).
func writeTextfile(path, text string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
