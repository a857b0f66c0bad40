package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// clusterRow is the cluster's target: each server's idle CPU, the worst
// of the three judged (CLUSTER=1).
func (b *bench) clusterRow() row {
	i := b.res.Idle
	if !b.cfg.cluster {
		return targetRow(targetCluster, figure{why: "not run (CLUSTER=1 runs it)"}, b.res.Requested, "")
	}
	if i == nil || len(i.Servers) == 0 {
		return targetRow(targetCluster, figure{why: "not reached"}, b.res.Agents, "")
	}
	n := b.res.Agents
	worst, worstAtScale := 0.0, 0.0
	var each []string
	for k, s := range i.Servers {
		worst = max(worst, s.CPU)
		each = append(each, fmt.Sprintf("%s %.1f %% (VmRSS %s MiB)", s.Name, s.CPU, mib(s.RSSKiB)))
		// Carried to the target's fleet as the embedded broker's idle
		// CPU is: what the server spends with no node, and what each
		// node added.
		none := 0.0
		if k < len(b.res.ServersBaselineCPU) {
			none = b.res.ServersBaselineCPU[k]
		}
		worstAtScale = max(worstAtScale, extrapolate(none, s.CPU, n, targetCluster.nodes))
	}
	fig := figure{value: worst, measured: true}
	res := fmt.Sprintf("%s on %s nodes over %s (%s heartbeats stored); serve itself %.1f %%", strings.Join(each, ", "),
		thousands(n), secs(i.WindowSeconds), thousands(int(i.Heartbeats)), i.ControlCPU)
	if len(b.res.ServersBaselineCPU) > 0 {
		res += fmt.Sprintf("; before any node %s %%", strings.Trim(fmt.Sprintf("%.1f", b.res.ServersBaselineCPU), "[]"))
	}
	if n > 0 && n < targetCluster.nodes {
		fig.atScale = &worstAtScale
		res += fmt.Sprintf("; ≈ %.0f %% at %s, linearly", worstAtScale, thousands(targetCluster.nodes))
	}
	return targetRow(targetCluster, fig, n, res)
}

// rows are the table: the targets in their order, with the figures
// that explain them.
func (b *bench) rows() []row {
	r := b.res
	n := r.Agents
	var rows []row

	// Registration.
	reg := fmt.Sprintf("%s of %s in %.1f s (%d at a time)", thousands(r.Registered), thousands(r.Requested), r.RegisterSeconds, b.cfg.registerWorkers)
	if r.RegisterRefused > 0 {
		reg += fmt.Sprintf("; %d refused, the first: %s", r.RegisterRefused, r.RegisterFirstErr)
		if r.RegisterStopped {
			reg += fmt.Sprintf("; stopped after %d in a row", b.cfg.maxRefusals)
		}
	}
	rows = append(rows, targetRow(targetRegistrable, figure{value: float64(r.Registered), measured: true, failed: r.Registered < r.Requested}, r.Requested, reg))
	if r.Agents > 0 {
		l := fmt.Sprintf("%s of %s linked in %s (started in batches of %d)", thousands(r.Linked), thousands(r.Agents), secs(r.LinkSeconds), b.cfg.startBatch)
		l += fmt.Sprintf("; open files once linked: %s here, %s in serve, of %s each", thousands(r.FDsHere), thousands(r.FDsControl), thousands(int(r.Host.NoFile)))
		if r.FDLimited > 0 {
			l += fmt.Sprintf("; %s registered nodes left out: one NATS connection each does not fit the open-file limit", thousands(r.FDLimited))
		}
		rows = append(rows, infoRow("agents linked (one NATS connection each)", l))
	}

	if b.cfg.cluster {
		return append(rows, b.clusterRows(n)...)
	}

	// Fan-out, to a fleet just linked and to a fleet that has idled.
	rows = append(rows, b.fanoutRows(r.Fanout, "just linked", n)...)
	rows = append(rows, b.fanoutRows(r.FanoutIdle, "after idle", n)...)

	// Restart.
	if s := r.Restart; s != nil {
		var res string
		fig := figure{value: s.TotalSeconds, measured: true}
		if b.cfg.contended {
			fig.value = s.LinkedP100 // its target runs from serve's return
		}
		switch {
		case s.StartError != "" && s.StartSeconds == 0:
			res = fmt.Sprintf("stop %s%s; serve did not start again: %s", secs(s.StopSeconds), killedNote(s), s.StartError)
			fig.failed = true
		default:
			res = fmt.Sprintf("%s: stop %s%s, start %s, all linked %s after serving", secs(s.TotalSeconds), secs(s.StopSeconds), killedNote(s), secs(s.StartSeconds), secs(s.LinkedP100))
			if s.Reconnected < s.Nodes {
				res = fmt.Sprintf("%s of %s linked again within %s of the stop (stop %s%s, start %s)", thousands(s.Reconnected), thousands(s.Nodes), b.cfg.restartTimeout, secs(s.StopSeconds), killedNote(s), secs(s.StartSeconds))
				fig.failed = true
			}
			if s.StartError != "" {
				res += "; the first start failed: " + s.StartError
			}
			res += fmt.Sprintf("; %s of %s executors told the link came back, the last %s after the stop", thousands(s.Reconciled), thousands(s.Nodes), secs(s.ReconciledP100))
		}
		rows = append(rows, b.cfg.judgedRow(targetRestart, fig, n, res))
	} else {
		rows = append(rows, b.cfg.judgedRow(targetRestart, figure{why: "not reached"}, n, ""))
	}

	// Idle.
	if i := r.Idle; i != nil {
		cpu := figure{value: i.ControlCPU, measured: true}
		res := fmt.Sprintf("%.1f %% of a core on %s nodes over %s (%s heartbeats stored)", i.ControlCPU, thousands(n), secs(i.WindowSeconds), thousands(int(i.Heartbeats)))
		res += fmt.Sprintf("; %.1f %% before any node", r.BaselineCPU)
		if n > 0 && n < targetIdleCPU.nodes {
			x := extrapolate(r.BaselineCPU, i.ControlCPU, n, targetIdleCPU.nodes)
			cpu.atScale = &x
			res += fmt.Sprintf("; ≈ %.0f %% at %s, linearly", x, thousands(targetIdleCPU.nodes))
		}
		rows = append(rows, b.cfg.judgedRow(targetIdleCPU, cpu, n, res))
		mem := figure{value: i.PerNodeKiB, measured: n > 0}
		rows = append(rows, b.cfg.judgedRow(targetMemory, mem, n, fmt.Sprintf("%.0f KiB: VmRSS %s MiB on %s nodes, %s MiB before any (peak %s MiB)",
			i.PerNodeKiB, mib(i.RSSKiB), thousands(n), mib(i.BaselineKiB), mib(i.HWMKiB))))
		rows = append(rows, infoRow("this process (the agents and stand-ins), idle", fmt.Sprintf("%.1f %% of a core, VmRSS %s MiB (%.0f KiB per agent)",
			i.AgentsCPU, mib(i.AgentsRSSKiB), float64(i.AgentsRSSKiB)/float64(max(n, 1)))))
	} else {
		rows = append(rows, b.cfg.judgedRow(targetIdleCPU, figure{why: "not reached"}, n, ""), b.cfg.judgedRow(targetMemory, figure{why: "not reached"}, n, ""))
	}

	// Overlay.
	if o := r.Overlay; o != nil && o.Skipped == "" {
		fig := figure{value: o.AppliedP100, measured: o.Applied > 0, failed: o.Applied < o.Nodes}
		var res string
		if o.Applied < o.Nodes {
			res = fmt.Sprintf("%s of %s nodes applied within %s (cut off)", thousands(o.Applied), thousands(o.Nodes), b.cfg.overlayTimeout)
			if o.Applied > 0 {
				res += fmt.Sprintf(", p50 %s", secs(o.AppliedP50))
			}
		} else {
			res = fmt.Sprintf("%s on %s nodes (p50 %s)", secs(o.AppliedP100), thousands(o.Nodes), secs(o.AppliedP50))
		}
		res += fmt.Sprintf("; %s recorded", thousands(o.Recorded))
		if o.Recorded == o.Nodes {
			res += fmt.Sprintf(", the last at %s", secs(o.RecordedP100))
		}
		if o.CommandDone {
			res += fmt.Sprintf("; the command took %s", secs(o.CommandSeconds))
		} else if o.CommandError != "" {
			res += "; the command: " + o.CommandError
		}
		if o.RosterBytes > 0 {
			res += fmt.Sprintf("; its roster %s bytes, one for every node, handed over %s times", thousands(o.RosterBytes), thousands(int(o.RostersHanded)))
		}
		if o.ControlCPUSeconds > 0 {
			res += fmt.Sprintf("; CPU meanwhile: serve %.1f s, this process %.1f s, the command %.1f s", o.ControlCPUSeconds, o.AgentsCPUSeconds, o.CommandCPUSeconds)
		}
		if o.Applied == 0 {
			fig.why = "no node applied its overlay"
		}
		rows = append(rows, b.cfg.judgedRow(targetOverlay, fig, o.Nodes, res))
	} else {
		why := "not reached"
		if o != nil {
			why = o.Skipped
		}
		rows = append(rows, b.cfg.judgedRow(targetOverlay, figure{why: why}, 0, ""))
	}
	rows = append(rows, b.clusterRow())
	return rows
}

// clusterRows are CLUSTER=1's rows after the registration: the fan-outs
// and the cluster's target.
func (b *bench) clusterRows(n int) []row {
	// The fan-outs just linked and after idle are judged as the embedded
	// broker's; the one after them stops a server mid-way, and every node
	// must still record.
	rows := b.fanoutRows(b.res.Fanout, "just linked, cluster", n)
	rows = append(rows, b.fanoutRows(b.res.FanoutAllUp, "after idle, cluster", n)...)
	if f := b.res.FanoutIdle; f != nil {
		rs := b.fanoutRows(f, "a server stopped, cluster", n)
		last := &rs[len(rs)-1]
		last.target = "every node records, a server stopped mid fan-out"
		last.verdict = verdictPass
		if f.Recorded < f.Nodes {
			last.verdict = verdictMiss
		}
		if f.Paused != "" {
			last.result += fmt.Sprintf("; server %s stopped (SIGSTOP) %s after the first declare for %s", f.Paused, secs(f.PausedAt), secs(f.PausedSeconds))
		} else {
			last.verdict = verdictMiss + " (no server was stopped)"
		}
		rows = append(rows, rs...)
	}
	// The embedded broker's restart, idle, memory and overlay targets
	// are not this run's: `make bench-scale` without CLUSTER measures
	// them.
	return append(rows, b.clusterRow())
}

// fanoutRows are the rows of one fan-out: until received (information),
// and until recorded (the target).
func (b *bench) fanoutRows(f *fanoutResult, when string, n int) []row {
	t := *b.cfg.targetOf(targetFanout)
	t.name = fmt.Sprintf("%s (%s)", t.name, when)
	if f == nil {
		return []row{targetRow(t, figure{why: "not reached"}, n, "")}
	}
	recv := infoRow(fmt.Sprintf("one declaration to all nodes, until received (%s)", when),
		fmt.Sprintf("p50 %s, p100 %s (%s of %s); the declares took %s (one DeclareAll: `declare n1,n2,…`)%s; the reports stored in their stream p50 %s, p100 %s (%s)",
			secs(f.ReceivedP50), secs(f.ReceivedP100), thousands(f.Received), thousands(f.Nodes), secs(f.DeclareSeconds), declareErrors(f),
			secs(f.StoredP50), secs(f.StoredP100), thousands(f.Stored)))
	fig := figure{value: f.RecordedP100, measured: f.Recorded > 0, failed: f.Recorded < f.Nodes}
	res := fmt.Sprintf("p50 %s, p100 %s on %s nodes%s", secs(f.RecordedP50), secs(f.RecordedP100), thousands(f.Nodes), fanoutCPU(f))
	if f.Recorded < f.Nodes {
		res = fmt.Sprintf("%s of %s recorded within %s (p50 %s)", thousands(f.Recorded), thousands(f.Nodes), b.cfg.fanoutTimeout, secs(f.RecordedP50))
	}
	if f.Recorded == 0 {
		fig.why = "no report was recorded"
	}
	return []row{recv, targetRow(t, fig, n, res)}
}

// printTable prints the table and keeps it in the results.
func (b *bench) printTable(w io.Writer) {
	rows := b.rows()
	writeTable(w, rows)
	b.res.Targets = map[string]rowJ{}
	var missed []string
	for _, r := range rows {
		b.res.Targets[r.measure] = rowJ{Result: r.result, Target: r.target, Verdict: r.verdict}
		if isMiss(r.verdict) {
			missed = append(missed, r.measure)
		}
	}
	if len(missed) > 0 {
		fmt.Fprintf(w, "\nMISS: %s\n", strings.Join(missed, "; "))
	}
}

func secs(s float64) string { return seconds(time.Duration(s * float64(time.Second))) }

func mib(kib uint64) string { return fmt.Sprintf("%.0f", float64(kib)/1024) }

func killedNote(s *restartResult) string {
	if s.Killed {
		return " (killed: it did not stop within the limit)"
	}
	return ""
}

func declareErrors(f *fanoutResult) string {
	if f.DeclareErrors == 0 {
		return ""
	}
	return fmt.Sprintf("; %d declares failed, the first: %s", f.DeclareErrors, f.FirstError)
}

// fanoutCPU says what the cores went to during a fan-out: each process's
// CPU time against the wall time times the cores (the cluster's servers
// among them, with CLUSTER=1: on this machine they share its cores).
func fanoutCPU(f *fanoutResult) string {
	if f.WallSeconds <= 0 || f.Cores <= 0 || f.ControlCPUSeconds+f.AgentsCPUSeconds == 0 {
		return ""
	}
	total := f.ControlCPUSeconds + f.AgentsCPUSeconds
	servers := ""
	if len(f.ServersCPUSeconds) > 0 {
		var each []string
		for _, s := range f.ServersCPUSeconds {
			each = append(each, fmt.Sprintf("%.1f", s))
			total += s
		}
		servers = fmt.Sprintf(", the servers %s s", strings.Join(each, " / "))
	}
	return fmt.Sprintf("; CPU meanwhile: serve %.1f s, this process %.1f s%s: %.1f s of %.1f s × %d cores (%.0f %%); one ed25519 verification took %.0f µs just before",
		f.ControlCPUSeconds, f.AgentsCPUSeconds, servers, total, f.WallSeconds, f.Cores,
		total/(f.WallSeconds*float64(f.Cores))*100, f.VerifyMicros)
}
