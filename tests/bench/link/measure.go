package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// bench is one run of the link bench.
type bench struct {
	cfg      config
	m        *mesh
	res      *results
	lastPush uint64 // the newest sequence of the pushes
}

func (b *bench) fail(f string, a ...any) {
	b.res.Failures = append(b.res.Failures, fmt.Sprintf(f, a...))
}

// fileSize is the size of each declared file, as in the rescue bench.
const fileSize = 200

// treeDecl is one declaration of the pushed tree: the directory and its
// files, each file holding content(i, variant).
type treeDecl struct {
	json  []byte
	files map[string][]byte // path → content
}

func content(i int, variant string) []byte {
	head := fmt.Sprintf("mesh link bench: file %d, %s\n", i, variant)
	if len(head) >= fileSize-1 {
		return []byte(head)
	}
	return []byte(head + strings.Repeat(".", fileSize-1-len(head)) + "\n")
}

func (b *bench) declaration(variant string) treeDecl {
	type res struct {
		Module  string `json:"module"`
		ID      string `json:"id"`
		Type    string `json:"type"`
		Path    string `json:"path"`
		Mode    string `json:"mode"`
		Content string `json:"content,omitempty"`
	}
	d := treeDecl{files: map[string][]byte{}}
	rs := []res{{Module: "bench", ID: "tree", Type: "directory", Path: b.m.tree, Mode: "0755"}}
	for i := range b.cfg.files {
		p := filepath.Join(b.m.tree, fmt.Sprintf("f%d", i))
		c := content(i, variant)
		d.files[p] = c
		rs = append(rs, res{Module: "bench", ID: fmt.Sprintf("f%d", i), Type: "file", Path: p, Mode: "0644", Content: string(c)})
	}
	d.json, _ = json.Marshal(map[string]any{"version": 1, "resources": rs})
	return d
}

// onDisk checks that the tree holds exactly what d declared.
func (d treeDecl) onDisk() error {
	for p, want := range d.files {
		got, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s holds %q, declared %q", p, firstLine(got), firstLine(want))
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode() != 0o644 {
			return fmt.Errorf("%s: mode %v, declared 0644", p, fi.Mode())
		}
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// report is a report as the driver received it, checked to be the node's.
type report struct {
	link.Report
	at   time.Time
	size int
}

// decode checks that a is a report signed by the node, for its enrolment.
func (b *bench) decode(a arrival) (*report, error) {
	if err := link.VerifySignature(b.m.rec.NKey, a.data, a.sig); err != nil {
		return nil, fmt.Errorf("a report on mesh.report.%s: %v", node, err)
	}
	r := &report{at: a.at, size: len(a.data)}
	if err := json.Unmarshal(a.data, &r.Report); err != nil {
		return nil, err
	}
	if r.Node != node || r.Enrolment != b.m.rec.Enrolment {
		return nil, fmt.Errorf("a report for node %q enrolment %q", r.Node, r.Enrolment)
	}
	return r, nil
}

// nextReport waits for the next report about a declaration (reports the
// executor's reconciles after the link came back are counted and skipped).
func (b *bench) nextReport(ctx context.Context, within time.Duration) (*report, error) {
	t := time.NewTimer(within)
	defer t.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case a := <-b.m.reports:
			r, err := b.decode(a)
			if err != nil {
				return nil, err
			}
			if r.Trigger != link.TriggerDeclaration {
				b.res.OtherReports++
				continue
			}
			return r, nil
		case <-tick.C:
			if err := b.m.exited(); err != nil {
				return nil, err
			}
		case <-t.C:
			return nil, fmt.Errorf("no report within %v", within)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// drainReports discards what is waiting (reconciles at start, say).
func (b *bench) drainReports() {
	for {
		select {
		case a := <-b.m.reports:
			if r, err := b.decode(a); err == nil && r.Trigger != link.TriggerDeclaration {
				b.res.OtherReports++
			}
		default:
			return
		}
	}
}

// checkApplied checks the report of a declaration pushed alone.
func (b *bench) checkApplied(r *report, seq uint64, first bool) error {
	if r.Seq != seq {
		return fmt.Errorf("a report for seq %d while waiting for seq %d", r.Seq, seq)
	}
	if r.Outcome != shapes.Applied || r.SupersededBy != 0 || r.Duplicate {
		return fmt.Errorf("seq %d: outcome %s (superseded by %d, duplicate %v, refused by %s: %s), want applied",
			seq, r.Outcome, r.SupersededBy, r.Duplicate, r.RefusedBy, r.Refused)
	}
	if len(r.Lines) != b.cfg.files+1 {
		return fmt.Errorf("seq %d: %d report lines, want %d (a directory and %d files)", seq, len(r.Lines), b.cfg.files+1, b.cfg.files)
	}
	files := 0
	for _, l := range r.Lines {
		switch {
		case l.Type == "file" && l.Outcome == shapes.Applied:
			files++
		case l.Type == "directory" && (l.Outcome == shapes.Unchanged || first && l.Outcome == shapes.Applied):
		default:
			return fmt.Errorf("seq %d: line %s.%s %s %s", seq, l.Module, l.ID, l.Type, l.Outcome)
		}
	}
	if files != b.cfg.files {
		return fmt.Errorf("seq %d: %d files applied, want %d", seq, files, b.cfg.files)
	}
	return nil
}

// pushes is the first measurement: declarations one at a time, each
// waiting for its report, with the raw request/reply floor interleaved.
func (b *bench) pushes(ctx context.Context) error {
	m := b.m
	b.drainReports()
	decls := [2]treeDecl{b.declaration("variant A"), b.declaration("variant B")}
	env, err := wire.Seal(m.cl.Keys.Control, wire.PurposeDeclaration, decls[0].json)
	if err != nil {
		return err
	}
	b.res.Push.DeclarationBytes, b.res.Push.EnvelopeBytes = len(decls[0].json), len(env)

	// The floor's responder answers with a report-sized reply, learnt
	// from the first push.
	var reply []byte
	subj := "bench.rtt" + strings.TrimPrefix(nats.NewInbox(), "_INBOX")
	sub, err := m.echo.NC.Subscribe(subj, func(msg *nats.Msg) { msg.Respond(reply) })
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := m.echo.NC.Flush(); err != nil {
		return err
	}

	var lat, decl, floor []float64
	timedSeqs := map[uint64]bool{}
	total := b.cfg.warmup + b.cfg.pushes
	for i := range total {
		d := decls[i%2]
		timed := i >= b.cfg.warmup && reply != nil
		if timed {
			t := time.Now()
			if _, err := m.cl.NC.Request(subj, env, 5*time.Second); err != nil {
				return fmt.Errorf("the floor's request/reply: %w", err)
			}
			floor = append(floor, ms(time.Since(t)))
		}
		t0 := time.Now()
		seq, err := m.cl.Declare(ctx, node, d.json)
		if err != nil {
			return fmt.Errorf("declare: %w", err)
		}
		t1 := time.Now()
		r, err := b.nextReport(ctx, 30*time.Second)
		if err != nil {
			return fmt.Errorf("waiting for the report of seq %d: %w", seq, err)
		}
		if err := b.checkApplied(r, seq, i == 0); err != nil {
			return err
		}
		if err := d.onDisk(); err != nil {
			return fmt.Errorf("after seq %d: %w", seq, err)
		}
		if reply == nil {
			reply = make([]byte, r.size)
			b.res.Push.ReportBytes = r.size
		}
		b.lastPush = seq
		if timed {
			timedSeqs[seq] = true
			lat = append(lat, ms(r.at.Sub(t0)))
			decl = append(decl, ms(t1.Sub(t0)))
		}
	}
	b.res.Push.Latency, b.res.Push.Declare, b.res.Push.Floor = stats(lat), stats(decl), stats(floor)
	// The executor bounds requests per connection (its serve.Config Rate
	// and Burst): a push over the bound is refused busy, the connection
	// closed, and the agent tries again after its retry delay. Say how
	// often, and what the pushes that were not held up took.
	var quick []float64
	for _, x := range lat {
		if x < stallMS {
			quick = append(quick, x)
		}
	}
	b.res.Push.Stalled = len(lat) - len(quick)
	b.res.Push.NotStalled = stats(quick)
	b.res.Push.BusyRefusals = b.m.busyRefusals()
	b.res.Push.Executor = stats(b.m.executorTimes(timedSeqs))
	return nil
}

// stallMS is a push held up by a retry: the agent's retry delay is 2 s.
const stallMS = 1000

// runFlurry is the second measurement: declarations published as fast as
// the control side declares them, then the newest's report awaited, and
// every one accounted for.
func (b *bench) runFlurry(ctx context.Context) error {
	m, n := b.m, b.cfg.flurry
	b.drainReports()
	decls := make([]treeDecl, n)
	for i := range decls {
		decls[i] = b.declaration(fmt.Sprintf("flurry generation %d", i))
	}
	type published struct {
		seqs []uint64
		end  time.Time
		err  error
	}
	done := make(chan published, 1)
	t0 := time.Now()
	go func() {
		var p published
		for _, d := range decls {
			seq, err := m.cl.Declare(ctx, node, d.json)
			if err != nil {
				p.err = err
				break
			}
			p.seqs = append(p.seqs, seq)
		}
		p.end = time.Now()
		done <- p
	}()

	got := map[uint64][]*report{}
	var pub *published
	inFlurry := map[uint64]bool{}
	accounted := func() bool { return pub != nil && len(got) == n }
	deadline := time.NewTimer(90 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for !accounted() {
		select {
		case a := <-m.reports:
			r, err := b.decode(a)
			if err != nil {
				return err
			}
			if r.Trigger != link.TriggerDeclaration {
				b.res.OtherReports++
				continue
			}
			if r.Seq <= b.lastPush {
				b.res.Flurry.DuplicateReports++ // a push's report, sent again
				continue
			}
			// A superseded report covers SupersededFrom to Seq.
			from := r.Seq
			if r.Outcome == shapes.Superseded && r.SupersededFrom != 0 {
				from = max(r.SupersededFrom, b.lastPush+1)
			}
			for s := from; s <= r.Seq; s++ {
				got[s] = append(got[s], r)
			}
		case p := <-done:
			if p.err != nil {
				return fmt.Errorf("declare, after %d: %w", len(p.seqs), p.err)
			}
			pub = &p
			for _, s := range p.seqs {
				inFlurry[s] = true
			}
		case <-tick.C:
			if err := m.exited(); err != nil {
				return err
			}
		case <-deadline.C:
			return fmt.Errorf("after 90s, %d of %d declarations reported (published: %v)", len(got), n, pub != nil)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for s := range got {
		if !inFlurry[s] {
			return fmt.Errorf("a report for seq %d, which the flurry did not declare", s)
		}
	}
	newest := pub.seqs[n-1]
	f := &b.res.Flurry
	f.Declarations = n
	f.PublishMS = ms(pub.end.Sub(t0))
	nr := got[newest][0]
	f.NewestMS = ms(nr.at.Sub(t0))
	f.AfterLastPublishMS = ms(nr.at.Sub(pub.end))
	var last time.Time
	var replays []uint64
	applied := map[uint64]bool{}
	for s, rs := range got {
		f.DuplicateReports += len(rs) - 1
		r := rs[0]
		if r.at.After(last) {
			last = r.at
		}
		switch {
		case r.Outcome == shapes.Superseded:
			f.Superseded++
		case r.Outcome == shapes.Applied && r.SupersededBy == 0:
			f.Applied++
			applied[s] = true
			if err := b.checkApplied(r, s, false); err != nil {
				return err
			}
		case r.Outcome == shapes.Refused && r.Code == "replay":
			// Signed and valid, but it reached a drain after a newer one
			// was applied: refused as older than the last applied, where a
			// drain that saw both would have said superseded. Checked below
			// to be older than one applied; not the system failing its job.
			f.RefusedReplay++
			replays = append(replays, s)
		default:
			return fmt.Errorf("seq %d: outcome %s (refused by %s [%s]: %s)", s, r.Outcome, r.RefusedBy, r.Code, r.Refused)
		}
	}
	for _, s := range replays {
		older := false
		for a := range applied {
			older = older || a > s
		}
		if !older {
			return fmt.Errorf("seq %d refused as a replay, but no newer declaration was applied", s)
		}
	}
	f.AllReportedMS = ms(last.Sub(t0))
	if !applied[newest] {
		return fmt.Errorf("the newest, seq %d, was not applied: %s", newest, nr.Outcome)
	}
	for s, rs := range got {
		if r := rs[0]; r.Outcome == shapes.Superseded && (r.SupersededBy <= s || !applied[r.SupersededBy]) {
			return fmt.Errorf("seq %d superseded by seq %d, which is not a newer one applied", s, r.SupersededBy)
		}
	}
	if err := decls[n-1].onDisk(); err != nil {
		return fmt.Errorf("after the flurry the disk does not hold the newest: %w", err)
	}
	f.BusyRefusals = b.m.busyRefusals() - b.res.Push.BusyRefusals
	return nil
}

// rss is the third measurement: the daemons' resident set once idle.
func (b *bench) rss(ctx context.Context) error {
	b.drainReports()
	select {
	case <-time.After(b.cfg.settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := b.m.exited(); err != nil {
		return err
	}
	for _, name := range []string{"mesh-agent", "mesh-executor", "mesh-control"} {
		pid := b.m.pid(name)
		// A few samples a quarter second apart; the median.
		var rss, anon, file []float64
		var hwm float64
		for range 5 {
			mem, err := vmRSS(pid)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			rss, anon, file = append(rss, mem.rss), append(anon, mem.anon), append(file, mem.file)
			hwm = max(hwm, mem.hwm)
			time.Sleep(250 * time.Millisecond)
		}
		b.res.RSS = append(b.res.RSS, rssRow{Process: name, PID: pid, RSSMiB: median(rss), PeakMiB: hwm, AnonMiB: median(anon), FileMiB: median(file)})
	}
	return nil
}

// memory is what /proc/PID/status says of a process's resident memory (MiB).
type memory struct {
	rss, hwm, anon, file float64
}

// vmRSS reads VmRSS, VmHWM, RssAnon and RssFile of pid.
func vmRSS(pid int) (memory, error) {
	var m memory
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	fields := map[string]*float64{"VmRSS": &m.rss, "VmHWM": &m.hwm, "RssAnon": &m.anon, "RssFile": &m.file}
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		dst := fields[k]
		if !ok || dst == nil {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			return m, fmt.Errorf("/proc/%d/status: %s: %q", pid, k, v)
		}
		kb, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			return m, err
		}
		*dst = kb / 1024
		found++
	}
	if found != len(fields) {
		return m, fmt.Errorf("/proc/%d/status: not all of VmRSS, VmHWM, RssAnon, RssFile", pid)
	}
	return m, sc.Err()
}

// sizes records the binaries' sizes and whether each is static (no
// program interpreter, no shared libraries needed).
func (b *bench) sizes() {
	for _, name := range binaries {
		p := b.m.bin(name)
		row := binRow{Binary: name, Path: p}
		if fi, err := os.Stat(p); err == nil {
			row.Bytes = fi.Size()
			row.MiB = float64(fi.Size()) / (1 << 20)
		}
		row.Static, row.Stripped = elfInfo(p)
		b.res.Binaries = append(b.res.Binaries, row)
	}
}

func elfInfo(p string) (static, stripped bool) {
	f, err := elf.Open(p)
	if err != nil {
		return false, false
	}
	defer f.Close()
	static = true
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			static = false
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		static = false
	}
	_, err = f.Symbols()
	stripped = errors.Is(err, elf.ErrNoSymbols)
	return static, stripped
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
