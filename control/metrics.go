package control

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The fleet at a glance, for Prometheus (serve --metrics ADDRESS): what
// each node last said, read from the registry at each scrape (nodes by
// state, last heard, declared and applied sequences, last outcome, a link
// error), and what this serve recorded since it started (reports by
// outcome and trigger, how long applies took on the nodes). The
// client library is Prometheus' own; a scrape reads the registry once
// (Nodes), as `mesh-control nodes` does.

// metrics is what the recorder counts.
type fleetMetrics struct {
	reports *prometheus.CounterVec
	apply   prometheus.Histogram
}

func newMetrics() *fleetMetrics {
	return &fleetMetrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mesh_reports_total",
			Help: "Reports this serve recorded, by outcome and trigger (declaration, reconnect, roster, activity: what an executor did on its own, a drift repaired among it).",
		}, []string{"outcome", "trigger"}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mesh_apply_duration_seconds",
			Help:    "How long the executors took to apply a declaration, as the nodes reported it (from the declaration handed over to the verdict).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300},
		}),
	}
}

// recorded counts one report the recorder kept.
func (m *fleetMetrics) recorded(outcome shapes.Outcome, trigger string, applyMS int64) {
	if m == nil {
		return
	}
	if trigger == "" {
		trigger = link.TriggerDeclaration
	}
	m.reports.WithLabelValues(string(outcome), trigger).Inc()
	if applyMS > 0 {
		m.apply.Observe(float64(applyMS) / 1000)
	}
}

// fleet is the collector of what the registry says of each node, read at
// each scrape.
type fleet struct {
	c *Client
	// scrapeWithin bounds one scrape's read of the registry.
	scrapeWithin                                            time.Duration
	nodes, heard, declared, applied, outcome, linkError, up *prometheus.Desc
}

func newFleet(c *Client) *fleet {
	return &fleet{c: c, scrapeWithin: 20 * time.Second,
		nodes:     prometheus.NewDesc("mesh_nodes", "Nodes, by the state each last said (revoked, never heard from, enrolled, disconnected, hosted).", []string{"state"}, nil),
		heard:     prometheus.NewDesc("mesh_node_last_heard_seconds", "Seconds since the node was last heard from (a report or a heartbeat); absent for a node never heard from.", []string{"node", "presence"}, nil),
		declared:  prometheus.NewDesc("mesh_node_declared_sequence", "The newest sequence declared to the node.", []string{"node"}, nil),
		applied:   prometheus.NewDesc("mesh_node_applied_sequence", "The newest sequence the node applied.", []string{"node"}, nil),
		outcome:   prometheus.NewDesc("mesh_node_last_outcome", "1 for the outcome of the node's last report.", []string{"node", "outcome"}, nil),
		linkError: prometheus.NewDesc("mesh_node_link_error", "1 when the node's last heartbeat carried a link error (it linked again since, and says the last one).", []string{"node"}, nil),
		up:        prometheus.NewDesc("mesh_registry_up", "1 when this scrape could read the registry.", nil, nil),
	}
}

func (f *fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{f.nodes, f.heard, f.declared, f.applied, f.outcome, f.linkError, f.up} {
		ch <- d
	}
}

func (f *fleet) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), f.scrapeWithin)
	defer cancel()
	ns, err := f.c.Nodes(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(f.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(f.up, prometheus.GaugeValue, 1)
	states := map[string]float64{}
	now := time.Now()
	for _, n := range ns {
		states[n.State]++
		if !n.LastHeard.IsZero() {
			ch <- prometheus.MustNewConstMetric(f.heard, prometheus.GaugeValue, now.Sub(n.LastHeard).Seconds(), n.Name, n.Presence)
		}
		ch <- prometheus.MustNewConstMetric(f.declared, prometheus.GaugeValue, float64(n.Declared), n.Name)
		ch <- prometheus.MustNewConstMetric(f.applied, prometheus.GaugeValue, float64(n.Applied), n.Name)
		if n.LastOutcome != "" {
			ch <- prometheus.MustNewConstMetric(f.outcome, prometheus.GaugeValue, 1, n.Name, string(n.LastOutcome))
		}
		linkErr := 0.0
		if n.LastLinkError != "" {
			linkErr = 1
		}
		ch <- prometheus.MustNewConstMetric(f.linkError, prometheus.GaugeValue, linkErr, n.Name)
	}
	for s, v := range states {
		ch <- prometheus.MustNewConstMetric(f.nodes, prometheus.GaugeValue, v, s)
	}
}

// serveMetrics serves /metrics on addr until ctx ends. Loopback is the
// expected address: what it shows (node names, sequences, outcomes) is the
// fleet's, for the operator's own Prometheus.
func serveMetrics(ctx context.Context, ln net.Listener, c *Client, m *fleetMetrics, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.reports, m.apply, newFleet(c))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	log.Info("metrics served", "address", "http://"+ln.Addr().String()+"/metrics")
	return serveHTTP(ctx, ln, mux, log)
}
