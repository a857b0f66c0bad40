package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// A scenario is one of the four measurements.
type scenario string

const (
	converge scenario = "converge" // from an empty state and an empty tree
	noop     scenario = "no-op"    // re-apply onto the converged tree
	drift    scenario = "drift-repair"
	oneFile  scenario = "one-file" // a one-file declaration, empty state
)

var scenarios = []scenario{converge, noop, drift, oneFile}

// bench holds the tools, the expected tree and everything measured.
type bench struct {
	cfg       config
	files     []benchtree.File
	tools     []*tool
	cfVersion string
	host      hostInfo
	rssFloor  int64 // KiB: what spawn reports for /bin/true, the smallest RSS it can show

	results  map[scenario]map[string]*series
	failures []string // a tool that did not do its job, one line each

	trash   string // DIR/trash: where reset trees wait to be deleted (Close)
	trashed int
}

// series is one (scenario, tool) pair's timed runs.
type series struct {
	samples []sample
	failed  error // the run that went wrong; no further runs were made
}

// sample is one run as spawn reported it, plus what the tool printed.
type sample struct {
	wall   time.Duration
	rssKiB int64
	exit   int
	signal int
	stdout []byte
	stderr []byte
}

func newBench(c config) (*bench, error) {
	b := &bench{cfg: c, files: benchtree.Files(c.files), results: map[scenario]map[string]*series{}}
	run := filepath.Join(c.dir, "run")
	// The trash is outside run and survives it: an earlier bench's run goes
	// into it whole (a rename), and everything in it is deleted after the
	// last scenario (Close), never between measurements.
	b.trash = filepath.Join(c.dir, "trash")
	if err := os.MkdirAll(b.trash, 0o700); err != nil {
		return nil, err
	}
	if err := b.discard(run); err != nil {
		return nil, err
	}
	if err := os.Mkdir(run, 0o755); err != nil {
		return nil, err
	}
	if c.executor != "" {
		t, err := newExecutor(run, c.executor, b.files)
		if err != nil {
			return nil, err
		}
		b.tools = append(b.tools, t)
	}
	for _, batched := range []bool{false, true} {
		t, err := newFloor(run, c.floor, c.files, batched)
		if err != nil {
			return nil, err
		}
		b.tools = append(b.tools, t)
	}
	if c.cfAgent != "" {
		t, version, err := newCFAgent(run, c.cfAgent, b.files)
		if err != nil {
			return nil, err
		}
		b.tools = append(b.tools, t)
		b.cfVersion = version
	}
	b.host = readHostInfo(c.dir)
	b.rssFloor = b.measureRSSFloor()
	return b, nil
}

// runScenario runs every tool that takes part in s: one untimed warm-up round,
// then cfg.runs timed rounds. Within a round the tools take turns, in an order
// that rotates from round to round, so no tool always goes first.
func (b *bench) runScenario(s scenario) {
	var tools []*tool
	for _, t := range b.tools {
		if t.argv(s) != nil {
			tools = append(tools, t)
		}
	}
	b.results[s] = map[string]*series{}
	for _, t := range tools {
		b.results[s][t.name] = &series{}
	}
	fmt.Printf("%-13s", s)
	for round := 0; round <= b.cfg.runs; round++ {
		for i := range tools {
			t := tools[(i+round)%len(tools)]
			ser := b.results[s][t.name]
			if ser.failed != nil {
				continue
			}
			smp, err := b.runOnce(s, t, round == 0)
			if err != nil {
				ser.failed = err
				b.failures = append(b.failures, fmt.Sprintf("%s: %s: %v", s, t.name, err))
				fmt.Printf(" [%s FAILED]", t.name)
				continue
			}
			if round > 0 {
				ser.samples = append(ser.samples, smp)
			}
		}
		fmt.Print(".")
	}
	fmt.Println()
}

// runOnce sets the tool's world up for s (untimed), runs the tool once
// (timed) and checks that it did the job (untimed).
func (b *bench) runOnce(s scenario, t *tool, first bool) (sample, error) {
	if err := b.prepare(s, t, first); err != nil {
		return sample{}, fmt.Errorf("preparing: %w", err)
	}
	smp, err := b.measure(t, t.argv(s))
	if err != nil {
		return smp, err
	}
	return smp, b.verify(s, t, smp)
}

// prepare puts t's tree (and state) where scenario s starts, then syncs, so
// the timed run neither pays for the reset's writeback nor finds it cached
// dirty. The converged tree the no-op and the drift need is made by the tool
// itself, once, in the warm-up round: mesh-executor must have recorded the
// files as its own, or a re-apply would see them as found, not applied.
func (b *bench) prepare(s scenario, t *tool, first bool) error {
	switch s {
	case converge, oneFile:
		if err := b.reset(t); err != nil {
			return err
		}
	case noop, drift:
		if first {
			if err := b.reset(t); err != nil {
				return err
			}
			smp, err := b.measure(t, t.argv(converge))
			if err != nil {
				return err
			}
			if err := b.verify(converge, t, smp); err != nil {
				return fmt.Errorf("the converge before it: %w", err)
			}
		}
		if s == noop {
			snap, err := snapshotTree(t.tree)
			if err != nil {
				return err
			}
			t.snapshot = snap
		} else if err := damage(t.tree, len(b.files)); err != nil {
			return err
		}
	}
	syscall.Sync()
	return nil
}

// reset empties t's tree and makes it forget what it applied.
//
// The old tree and state are moved aside, not deleted, and the trash is
// emptied only once every scenario is measured (Close). Deleting makes the
// next writers pay, each the more the more files it creates: on this kind
// of disk (ext4 without a journal, mounted with discard) a converge
// measured right after an rm -rf took ~350 ms instead of ~40 ms, even after
// sync(2), and for a minute or more afterwards every new inode is searched
// for past the recently deleted ones (ext4 will not reuse an inode freed
// in the last 60–300 s) — a cost no tool's own work has, and one that
// grows with how many inodes a tool creates.
func (b *bench) reset(t *tool) error {
	if err := b.discard(t.tree); err != nil {
		return err
	}
	if err := wipeTree(t.tree); err != nil {
		return err
	}
	if t.state != "" {
		return b.discard(t.state)
	}
	return nil
}

// discard moves path (if it exists) into the trash.
func (b *bench) discard(path string) error {
	b.trashed++
	err := os.Rename(path, filepath.Join(b.trash, fmt.Sprintf("%d-%d", os.Getpid(), b.trashed)))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

// Close deletes what was moved aside, once nothing more is measured.
func (b *bench) Close() error { return b.emptyTrash() }

// emptyTrash deletes what reset moved aside, and syncs.
func (b *bench) emptyTrash() error {
	entries, err := os.ReadDir(b.trash)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(b.trash, e.Name())); err != nil {
			return err
		}
	}
	syscall.Sync()
	return nil
}

// damage is the drift: ten files get other content (written in place, as an
// editor or a stray script would) and five are deleted.
func damage(tree string, n int) error {
	changed, deleted := benchtree.Drift(n)
	files := benchtree.Files(n)
	for _, i := range changed {
		if err := os.WriteFile(filepath.Join(tree, files[i].Rel), []byte(benchtree.Drifted), 0); err != nil {
			return err
		}
	}
	for _, i := range deleted {
		if err := os.Remove(filepath.Join(tree, files[i].Rel)); err != nil {
			return err
		}
	}
	return nil
}

// verify is the correctness half of every run: the exit status, the tool's
// own report where it has one, the tree byte for byte, and for the no-op that
// nothing in the tree was touched at all.
func (b *bench) verify(s scenario, t *tool, smp sample) error {
	if smp.exit != 0 || smp.signal != 0 {
		return fmt.Errorf("exit %d, signal %d\n%s", smp.exit, smp.signal, tail(smp.stdout, smp.stderr))
	}
	if t.checkOutput != nil {
		if err := t.checkOutput(s, smp.stdout); err != nil {
			return fmt.Errorf("%w\n%s", err, tail(smp.stdout, smp.stderr))
		}
	}
	if s == oneFile {
		if err := verifyTree(t.tree, nil, []benchtree.File{benchtree.One()}); err != nil {
			return err
		}
	} else if err := verifyTree(t.tree, benchtree.DirNames(), b.files); err != nil {
		return err
	}
	if s == noop {
		after, err := snapshotTree(t.tree)
		if err != nil {
			return err
		}
		if err := sameSnapshot(t.snapshot, after); err != nil {
			return fmt.Errorf("the no-op was not one: %w", err)
		}
	}
	return nil
}

// measure runs argv through spawn. The tool's output goes to files (not pipes
// the driver would have to drain while the clock runs) and is read back after.
func (b *bench) measure(t *tool, argv []string) (sample, error) {
	var smp sample
	outPath, errPath := filepath.Join(t.home, "stdout"), filepath.Join(t.home, "stderr")
	stdout, err := os.Create(outPath)
	if err != nil {
		return smp, err
	}
	defer stdout.Close()
	stderr, err := os.Create(errPath)
	if err != nil {
		return smp, err
	}
	defer stderr.Close()
	rep, err := b.spawn(argv, stdout, stderr)
	if err != nil {
		return smp, err
	}
	smp = sample{wall: time.Duration(rep.WallNS), rssKiB: rep.MaxRSSKiB, exit: rep.Exit, signal: rep.Signal}
	smp.stdout, _ = os.ReadFile(outPath)
	smp.stderr, _ = os.ReadFile(errPath)
	return smp, nil
}

// spawnReport is what tests/bench/spawn writes on its file descriptor 3.
type spawnReport struct {
	WallNS    int64 `json:"wall_ns"`
	MaxRSSKiB int64 `json:"maxrss_kib"`
	Exit      int   `json:"exit"`
	Signal    int   `json:"signal"`
}

func (b *bench) spawn(argv []string, stdout, stderr *os.File) (spawnReport, error) {
	var rep spawnReport
	r, w, err := os.Pipe()
	if err != nil {
		return rep, err
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.spawn, argv...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.ExtraFiles = []*os.File{w} // its descriptor 3
	err = cmd.Run()
	w.Close()
	if ctx.Err() != nil {
		return rep, fmt.Errorf("%q: no result after %v, killed", argv, b.cfg.timeout)
	}
	if err != nil {
		msg, _ := os.ReadFile(stderr.Name())
		return rep, fmt.Errorf("spawn %q failed: %v\n%s", argv, err, msg)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return rep, fmt.Errorf("spawn %q: bad report %q: %v", argv, data, err)
	}
	return rep, nil
}

// measureRSSFloor asks spawn for /bin/true's peak RSS: the smallest figure
// spawn can report, printed so small RSS figures are read as "at most".
func (b *bench) measureRSSFloor() int64 {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0
	}
	defer devnull.Close()
	var least int64
	for i := 0; i < 3; i++ {
		rep, err := b.spawn([]string{"/bin/true"}, devnull, devnull)
		if err != nil {
			return 0
		}
		if least == 0 || rep.MaxRSSKiB < least {
			least = rep.MaxRSSKiB
		}
	}
	return least
}

// tail keeps the end of a failed tool's output for the error message.
func tail(stdout, stderr []byte) string {
	const keep = 2000
	out := "stdout: " + string(stdout) + "\nstderr: " + string(stderr)
	if len(out) > keep {
		out = "..." + out[len(out)-keep:]
	}
	return out
}
