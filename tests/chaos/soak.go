package main

// The soak (make soak): the chaos run's mesh — a control side and a few
// nodes, real binaries — with no fault injected, through as many
// declarations as its time allows (nine in ten through the control side's
// own client, the tenth through mesh-control declare --wait), drift
// repaired by the executors' own timer, archives put (mesh-control
// archive put) and replaced, nodes revoked and enrolled again; sampling, all
// along, every file and directory of every state (the control side's, each
// executor's and agent's, the daemons' logs), each daemon's resident
// memory and open descriptors, and the broker's streams on disk. Whatever
// still grows over the second half of the run, as a line fitted to it
// says, fails it: a regression over the work done, never a threshold of
// time.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// soakArchive is the module, and the directory under L/, of the soak's
// archives.
const soakArchive = "arch"

// soakConfig is what a soak runs: its length, how often it samples, and
// how often a node is revoked and enrolled again.
type soakConfig struct {
	length time.Duration
	every  time.Duration
	revoke time.Duration
	// warming: a run too short to tell a daemon's memory growing from
	// its warming up (the broker's caches fill for minutes): its memory is
	// shown, not judged.
	warming bool
}

// soaker is a soak under way: the world, and what it has done and seen.
type soaker struct {
	w   *world
	cfg soakConfig
	// work is the declarations applied (a report came back), the x of
	// every fit: growth is judged per unit of work, not per second.
	work atomic.Int64
	// counts of what was done, and failed, by kind.
	mu      sync.Mutex
	done    map[string]int
	failed  map[string]int
	lastErr map[string]string
	// held is each node's lock: its worker holds it for a step, the
	// revocation for the whole revoke and enrolment.
	held    map[*node]*sync.Mutex
	samples []soakSample
	// cl reads the broker's streams, as the control side; clients are
	// the workers'.
	cl      *control.Client
	clients map[*node]*control.Client
}

type soakSample struct {
	work float64
	vals map[string]float64
}

// minSamples is the fewest samples a soak judges: half of them make the
// second half a line is fitted to.
const minSamples = 10

// soakResult is what a soak found: the series that grew, and the table.
type soakResult struct {
	grew       []string
	failed     map[string]int
	violations []string
	table      string
}

func (s *soaker) count(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failed[kind]++
		s.lastErr[kind] = err.Error()
		return
	}
	s.done[kind]++
}

// soak runs the mesh for cfg.length and judges what grew.
func soak(c config, cfg soakConfig, out io.Writer) (soakResult, error) {
	if cfg.every <= 0 || int(cfg.length/cfg.every)+2 < minSamples {
		least := time.Duration(minSamples-2) * max(cfg.every, time.Second)
		return soakResult{}, fmt.Errorf("%s sampled every %s is too few samples to judge growth (%d at least): give it %s or more (-soak %s, or SOAK_TIME=%s)",
			cfg.length, cfg.every, minSamples, least, least, least)
	}
	w, mw, done, err := newWorld(c, out, "soak")
	if err != nil {
		return soakResult{}, err
	}
	defer done()
	w.drift, w.archiveGrace = 2*time.Second, time.Minute
	fmt.Fprintf(mw, "soak: seed %d, %s, %d nodes, sampled every %s, work directory %s\n", c.seed, cfg.length, c.nodes, cfg.every, w.base)
	if err := w.setup(); err != nil {
		return soakResult{}, fmt.Errorf("setting the mesh up: %w (logs in %s)", err, w.base)
	}
	s := &soaker{w: w, cfg: cfg, done: map[string]int{}, failed: map[string]int{}, lastErr: map[string]string{}, held: map[*node]*sync.Mutex{}, clients: map[*node]*control.Client{}}
	for _, n := range w.nodes {
		s.held[n] = &sync.Mutex{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, n := range w.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.worker(n, rand.New(rand.NewPCG(c.seed, uint64(i+1))), stop)
		}()
	}
	start := time.Now()
	s.sample()
	tick := time.NewTicker(cfg.every)
	defer tick.Stop()
	nextRevoke, which := start.Add(cfg.revoke), 0
	nextSay := start.Add(time.Minute)
	for time.Since(start) < cfg.length {
		<-tick.C
		if time.Now().After(nextSay) {
			// A long run says where it is, a line a minute.
			fmt.Fprintf(mw, "soak: %s of %s, %d declarations applied; failed: %s\n", time.Since(start).Round(time.Second), cfg.length, s.work.Load(), orNone(s.failedSoFar()))
			nextSay = nextSay.Add(time.Minute)
		}
		if cfg.revoke > 0 && time.Now().After(nextRevoke) {
			s.revokeAndEnrol(w.nodes[which%len(w.nodes)])
			which++
			nextRevoke = time.Now().Add(cfg.revoke)
		}
		s.sample()
	}
	close(stop)
	wg.Wait()
	s.sample()
	if s.cl != nil {
		s.cl.Close()
	}
	for n := range s.clients {
		s.dropClient(n)
	}
	// The mesh still does what it says at the end: each node converges,
	// and its store and its machine agree.
	w.stepN = -1
	for _, n := range w.nodes {
		n.before = nil
		if w.converged(n, w.cfg.bound) {
			w.checkMachine(n)
		}
	}
	res := s.judge()
	res.failed, res.violations = s.failed, w.violations
	fmt.Fprintf(mw, "\nsoak: %s, %d declarations applied (%s); failed: %s\n%s", time.Since(start).Round(time.Second), s.work.Load(),
		sortedCounts(s.done), orNone(sortedCounts(s.failed)), res.table)
	for k, e := range s.lastErr {
		fmt.Fprintf(mw, "  the last %s that failed: %s\n", k, firstLine(e))
	}
	for _, v := range w.violations {
		fmt.Fprintf(mw, "  %s\n", v)
	}
	if len(res.grew) > 0 || len(s.failed) > 0 || len(w.violations) > 0 {
		w.violations = append(w.violations, res.grew...)
		w.failedRun = true // keeps the directory, whose logs it names
		fmt.Fprintf(mw, "\nFAILED: soak seed %d: %d series grew, %d steps failed, %d invariants failed; logs: %s\n", c.seed, len(res.grew), len(s.failed), len(w.violations)-len(res.grew), w.base)
	}
	return res, nil
}

func (s *soaker) failedSoFar() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortedCounts(s.failed)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// worker drives one node until stop: mostly declarations (each waited for,
// so each is applied, not superseded), some hand edits for the drift timer
// to repair, some new archives.
func (s *soaker) worker(n *node, r *rand.Rand, stop chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		mu := s.held[n]
		mu.Lock()
		switch p := r.IntN(100); {
		case p < 10:
			s.count("drift", s.drift(n, r))
		case p < 20:
			s.count("archive", s.declare(n, r, i, true))
		default:
			s.count("declare", s.declare(n, r, i, false))
		}
		mu.Unlock()
	}
}

// declare sends n a new declaration of 1–4 modules (an archive beside
// them when withArchive) and waits for its report.
func (s *soaker) declare(n *node, r *rand.Rand, i int, withArchive bool) error {
	w := s.w
	var doc map[string]any
	json.Unmarshal(w.docJSON(n, genDoc(r, 1+r.IntN(4)), false), &doc)
	if withArchive {
		tarPath := filepath.Join(w.base, "soak-"+n.name+".tar")
		if err := os.WriteFile(tarPath, soakTar(r), 0o600); err != nil {
			return err
		}
		a, err := w.putArchive(tarPath)
		if err != nil {
			return err
		}
		dir := filepath.Join(n.tree, "L", soakArchive)
		rs, _ := doc["resources"].([]any)
		doc["resources"] = append(rs,
			map[string]any{"module": soakArchive, "id": "dir", "type": "directory", "path": dir},
			map[string]any{"module": soakArchive, "id": "files", "type": "archive", "url": a.url, "sha256": a.sha256, "destination": dir})
	}
	b, _ := json.Marshal(doc)
	if r.IntN(10) > 0 {
		// Most through the control side's own client, as serve's
		// publisher and a fan-out declare: the CLI's process and TLS
		// handshake per declaration would hold the soak to a few a second.
		return s.declareDirect(n, b)
	}
	f := filepath.Join(w.base, "soak-"+n.name+".json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		return err
	}
	out, code, err := w.control("declare", n.name, f, "--json", "--wait=2m")
	if err != nil || code != 0 {
		return fmt.Errorf("declare %s (%d): exit %d %v: %s", n.name, i, code, err, firstLine(out))
	}
	s.work.Add(1)
	return nil
}

// declareDirect declares b to n through a client of the control side's
// own, and waits (2 min at most) until the recorder keeps a report of it
// (the registry's report.<node>, the newest).
func (s *soaker) declareDirect(n *node, b []byte) error {
	cl, err := s.client(n)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, _, err := cl.Node(ctx, n.name)
	if err != nil {
		s.dropClient(n)
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	seq, err := cl.Declare(ctx, n.name, b)
	if err != nil {
		s.dropClient(n)
		return fmt.Errorf("declare %s: %w", n.name, err)
	}
	for {
		var rep struct {
			Seq       uint64 `json:"seq"`
			Enrolment string `json:"enrolment"`
		}
		if e, err := cl.KV.Get(ctx, "report."+n.name); err == nil && json.Unmarshal(e.Value(), &rep) == nil && rep.Enrolment == rec.Enrolment && rep.Seq >= seq {
			s.work.Add(1)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("declare %s: no report of seq %d in 2m", n.name, seq)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// client is n's worker's connection to the control side, made at first
// use and again after a failure.
func (s *soaker) client(n *node) (*control.Client, error) {
	s.mu.Lock()
	cl := s.clients[n]
	s.mu.Unlock()
	if cl != nil {
		return cl, nil
	}
	cl, err := s.connect()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.clients[n] = cl
	s.mu.Unlock()
	return cl, nil
}

// connect is a client of the run's control side, as its key directory
// says.
func (s *soaker) connect() (*control.Client, error) {
	k, err := control.LoadKeys(s.w.ctl)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return control.Connect(ctx, k, "", slog.New(slog.DiscardHandler))
}

func (s *soaker) dropClient(n *node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cl := s.clients[n]; cl != nil {
		cl.Close()
		delete(s.clients, n)
	}
}

// soakTar is a small tar of two files, of a size and content drawn from
// r: each archive is new.
func soakTar(r *rand.Rand) []byte {
	files := map[string][]byte{}
	for _, name := range []string{"one", "two"} {
		files[name] = bytes.Repeat([]byte{byte('a' + r.IntN(26))}, 1+r.IntN(32<<10))
	}
	return tarOf(nil, files)
}

// drift edits by hand a file the mesh wrote on n; the executor's drift
// timer puts it back.
func (s *soaker) drift(n *node, r *rand.Rand) error {
	var files []string
	filepath.WalkDir(filepath.Join(n.tree, "L"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && declaredFile(n, p) {
			files = append(files, p)
		}
		return nil
	})
	if len(files) == 0 {
		return nil
	}
	path := files[r.IntN(len(files))]
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil // removed by an apply meanwhile
	}
	edited := time.Now()
	_, err = f.WriteString("edited by hand\n")
	f.Close()
	if err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // the drift timer's look (every 2 s) comes first
	return s.driftSaid(n, path, edited)
}

// declaredFile says whether p is a file resource's path on n (a module's
// "f_…" file, in its directory or below it in sub): its content is the
// mesh's whole, so an edit is a drift the executor puts back — unlike an
// archive's unpacked file or a file found beside the mesh's.
func declaredFile(n *node, p string) bool {
	rel, err := filepath.Rel(filepath.Join(n.tree, "L"), p)
	if err != nil {
		return false
	}
	mod, _, _ := strings.Cut(rel, string(filepath.Separator))
	base := filepath.Base(p)
	return idPath(n, mod, "f_"+base) == p || idPath(n, mod, "f_sub_"+base) == p
}

// driftSaid waits, 20 s at most, for a report of n since edited that names
// the repair of path: the executor's drift repair is reported while the
// node is linked (an activity report), not left for a disconnection.
func (s *soaker) driftSaid(n *node, path string, edited time.Time) error {
	cl, err := s.client(n)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rs, _, err := cl.Reports(ctx, n.name, 20)
		cancel()
		if err != nil {
			s.dropClient(n)
			return fmt.Errorf("reports %s: %w", n.name, err)
		}
		for _, r := range rs {
			if r.At.Before(edited.Add(-time.Second)) {
				continue
			}
			lines := r.Lines
			for _, a := range r.Meanwhile {
				lines = append(lines, a.Lines...)
			}
			for _, l := range lines {
				if l.Outcome.Changes() && idPath(n, l.Module, l.ID) == path {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s on %s was edited by hand at %s and put back, and no report named it within 20 s", path, n.name, edited.Format(time.RFC3339))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// revokeAndEnrol revokes n and enrols it again, as an operator replacing
// a node's credentials would; its worker waits meanwhile.
func (s *soaker) revokeAndEnrol(n *node) {
	mu := s.held[n]
	mu.Lock()
	defer mu.Unlock()
	out, code, err := s.w.control("node", "revoke", n.name, "--json")
	if err != nil || code != 0 {
		s.count("revoke", fmt.Errorf("node revoke %s: exit %d %v: %s", n.name, code, err, firstLine(out)))
		return
	}
	s.count("revoke", nil)
	time.Sleep(2 * time.Second) // the revoked agent meets the broker's refusal
	s.count("re-enrol", s.w.enrol(n, "--node", n.name))
}

// sample reads, now, the size of every file and directory under each
// state (a directory's is its whole tree's, with its count of files), and
// each daemon's resident memory and open descriptors.
func (s *soaker) sample() {
	w := s.w
	v := map[string]float64{}
	roots := [][2]string{{"control", w.ctl}, {"logs", filepath.Join(w.base, "logs")}}
	for _, n := range w.nodes {
		roots = append(roots, [2]string{n.name + "/executor", n.state}, [2]string{n.name + "/agent", n.agent})
	}
	for _, rt := range roots {
		sizeTree(rt[0], rt[1], v)
	}
	s.streams(v)
	for _, p := range w.procs {
		if !p.running() || strings.Contains(p.name, "#") {
			continue
		}
		pid := p.cmd.Process.Pid
		name := p.name
		if n := w.nodeOfProc(p); n != nil && p == n.exec {
			procFigures(name[:strings.IndexByte(name, '/')]+"/launcher", pid, v)
			pid = w.executorPid(n)
		}
		if pid != 0 {
			procFigures(name, pid, v)
		}
	}
	s.mu.Lock()
	s.samples = append(s.samples, soakSample{work: float64(s.work.Load()), vals: v})
	s.mu.Unlock()
}

// streams adds each of the broker's streams' size as the broker keeps it
// (its messages, and their bytes): what its limits bound. Its files on
// disk are sampled too, but they are the broker's to roll and compact — a
// block grows to its size whatever the stream holds — so the stream is
// judged by this.
func (s *soaker) streams(v map[string]float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if s.cl == nil {
		cl, err := s.connect()
		if err != nil {
			s.count("sample the streams", err)
			return
		}
		s.cl = cl
	}
	names := s.cl.JS.StreamNames(ctx)
	for name := range names.Name() {
		st, err := s.cl.JS.Stream(ctx, name)
		if err != nil {
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			continue
		}
		v["stream "+name+" bytes"], v["stream "+name+" msgs"] = float64(info.State.Bytes), float64(info.State.Msgs)
	}
}

// sizeTree adds, for each file under root, "label/rel bytes", and for
// each directory "label/rel bytes" and "label/rel files" of its whole tree.
func sizeTree(label, root string, v map[string]float64) {
	type tot struct{ bytes, files float64 }
	dirs := map[string]*tot{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		key := label
		if rel != "." {
			key = label + "/" + rel
		}
		if d.IsDir() {
			dirs[rel] = &tot{}
			return nil
		}
		fi, err := d.Info()
		if err != nil || !fi.Mode().IsRegular() || d.Name() == "zz-filler" {
			return nil
		}
		size := float64(fi.Size())
		v[key+" bytes"] = size
		for dir := filepath.Dir(rel); ; dir = filepath.Dir(dir) {
			if t := dirs[dir]; t != nil {
				t.bytes += size
				t.files++
			}
			if dir == "." || dir == "/" {
				break
			}
		}
		return nil
	})
	for rel, t := range dirs {
		key := label
		if rel != "." {
			key = label + "/" + rel
		}
		v[key+" bytes"], v[key+" files"] = t.bytes, t.files
	}
}

// procFigures adds name's resident memory and open descriptors.
func procFigures(name string, pid int, v map[string]float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			v[name+" rss"] = kb * 1024
		}
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		v[name+" fds"] = float64(len(fds))
	}
}

// floors are the growth over the run's second half below which a series
// is not judged, by its unit: a few blocks, a few files, a descriptor or
// two, what a Go heap wanders by.
var floors = map[string]float64{"bytes": 1 << 20, "files": 64, "msgs": 200, "fds": 8, "rss": 24 << 20}

// A series grows without bound when a line fitted to its second half
// explains it (R² at least minR2), and rises over that half by at least
// its floor and by at least minRise of its mean there. Something bounded
// levels off or saws (kept to a count or an age, compacted): the line
// fits it poorly, or flat.
const (
	minR2   = 0.6
	minRise = 0.25
)

// bounded names what grows by design over a run as short as a soak, with
// what bounds it, and so is shown but not judged.
var bounded = map[string]string{
	"logs": "a line or two per apply, by design; the init's journal rotates them",
	// A node's reports are kept for `mesh-control reports`, the newest
	// control.ReportsPerNode of each: a soak of a few nodes reaches the
	// count only after thousands of applies each. The key names the
	// partitions too (MESH_REPORT_<i>, link.ReportPlaces).
	"stream MESH_REPORT": fmt.Sprintf("%d reports a node", control.ReportsPerNode),
}

// judged says whether a series is judged on its own: the broker's files
// on disk are its to roll and compact within each stream's limits, so a
// stream is judged by its size as the broker reports it (streams), not
// its files (nor by the control directory's totals, which hold them).
func judged(name string) bool {
	return !strings.HasPrefix(name, "control/jetstream") && name != "control bytes" && name != "control files"
}

type fit struct {
	name                       string
	first, last, max, rise, r2 float64
	per10k                     float64
	grew                       bool
	samples                    int
	verdict                    string
}

// judge fits a line to each series over the run's second half.
func (s *soaker) judge() soakResult {
	s.mu.Lock()
	samples := s.samples
	s.mu.Unlock()
	names := map[string]bool{}
	for _, sm := range samples {
		for k := range sm.vals {
			names[k] = true
		}
	}
	var res soakResult
	var fits []fit
	lastWork := samples[len(samples)-1].work
	for name := range names {
		var xs, ys []float64
		f := fit{name: name}
		for i, sm := range samples {
			y := sm.vals[name] // absent: 0 (not yet made, or removed)
			if i == 0 {
				f.first = y
			}
			f.last, f.max = y, math.Max(f.max, y)
			if sm.work >= lastWork/2 {
				xs, ys = append(xs, sm.work), append(ys, y)
			}
		}
		f.samples = len(xs)
		if len(xs) < 5 {
			f.verdict = "too few samples"
			fits = append(fits, f)
			continue
		}
		b, r2, mean := lineFit(xs, ys)
		f.rise, f.r2, f.per10k = b*(xs[len(xs)-1]-xs[0]), r2, b*10000
		unit := name[strings.LastIndexByte(name, ' ')+1:]
		rising := r2 >= minR2 && f.rise > 0
		f.grew = judged(name) && rising && f.rise >= floors[unit] && f.rise >= minRise*math.Max(mean, 1)
		if f.grew && unit == "rss" && s.cfg.warming {
			f.grew, f.verdict = false, "rises: warming up, not judged in a short run"
			fits = append(fits, f)
			continue
		}
		switch why, ok := boundedBy(name); {
		case f.grew && ok:
			f.grew, f.verdict = false, "grows, bounded by design: "+why
		case f.grew:
			f.verdict = "GROWS"
		case !judged(name):
			f.verdict = "not judged: the broker's files (its streams are)"
		case rising:
			f.verdict = "rises, within its floor"
		default:
			f.verdict = "levels off"
		}
		if f.grew {
			res.grew = append(res.grew, fmt.Sprintf("%s grew by %s over the run's second half (%s per 10,000 declarations, R² %.2f)", name, human(f.rise, unit), human(f.per10k, unit), r2))
		}
		fits = append(fits, f)
	}
	sort.Strings(res.grew)
	res.table = soakTable(fits, lastWork)
	return res
}

func boundedBy(name string) (string, bool) {
	for k, why := range bounded {
		if strings.Contains(name, k) {
			return why, true
		}
	}
	return "", false
}

// lineFit is the least-squares line through (xs, ys): its slope, R², and
// the mean of ys.
func lineFit(xs, ys []float64) (slope, r2, mean float64) {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx, sy = sx+xs[i], sy+ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy, syy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx, sxy, syy = sxx+dx*dx, sxy+dx*dy, syy+dy*dy
	}
	if sxx == 0 || syy == 0 {
		return 0, 0, my
	}
	slope = sxy / sxx
	return slope, sxy * sxy / (sxx * syy), my
}

// soakTable is the table of the run: every daemon, every state's top two
// levels of directories, the broker's streams, and whatever grew.
func soakTable(fits []fit, work float64) string {
	sort.Slice(fits, func(i, j int) bool { return fits[i].name < fits[j].name })
	var b strings.Builder
	fmt.Fprintf(&b, "%-58s %10s %10s %10s %12s %5s  %s\n", "series (over "+strconv.Itoa(int(work))+" declarations)", "first", "last", "max", "per 10k decl", "R²", "verdict")
	for _, f := range fits {
		i := strings.LastIndexByte(f.name, ' ')
		name, unit := f.name[:i], f.name[i+1:]
		depth := strings.Count(name, "/")
		stream := strings.Contains(name, "/streams/") && strings.Count(name[strings.Index(name, "/streams/")+9:], "/") == 0
		if !(f.grew || unit == "rss" || unit == "fds" || depth <= 2 || stream) {
			continue
		}
		if strings.HasPrefix(name, "logs/") && depth > 1 {
			continue
		}
		fmt.Fprintf(&b, "%-58s %10s %10s %10s %12s %5.2f  %s\n", f.name, human(f.first, unit), human(f.last, unit), human(f.max, unit), human(f.per10k, unit), f.r2, f.verdict)
	}
	return b.String()
}

// human is a figure in its unit's words.
func human(x float64, unit string) string {
	switch unit {
	case "bytes", "rss":
		a := math.Abs(x)
		switch {
		case a >= 1<<30:
			return fmt.Sprintf("%.1f GiB", x/(1<<30))
		case a >= 1<<20:
			return fmt.Sprintf("%.1f MiB", x/(1<<20))
		case a >= 1<<10:
			return fmt.Sprintf("%.1f KiB", x/(1<<10))
		}
		return fmt.Sprintf("%.0f B", x)
	}
	return fmt.Sprintf("%.0f", x)
}
