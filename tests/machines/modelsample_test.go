package machines

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine/model"
	"github.com/nox-mesh/nox-mesh-host/executor/engine/model/treefs"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The reference model of ADR 0118 and adoption (executor/engine/model) on
// the real inits. executor/engine's TestTheEngineFollowsTheModel holds the
// engine to the model on hundreds of generated sequences, against a
// transcript init and a package manager of its own; here a fixed sample of
// the same sequences (model.Generate, the same seeds) runs on systemd,
// OpenRC, runit and s6, a lab each, with real apt and dpkg: the mesh-executor
// binary applies each declaration (a root-owned local file), the operator's
// flips are the init's own tools, and the packages are .debs served from a
// local repository in the lab whose postinst starts and enables their unit
// the way that init's Debian maintainer scripts do (giveBackInits, as the
// give-back table's test builds them).
//
// What a real init was asked cannot be read back, so each apply is held to
// the model by what can be: whether it was refused, each line's outcome,
// and after every step (the operator's too) the machine as the init's own
// tools and dpkg say it is — each unit the model knows running or not and
// enabled or not, each package installed or not, the shared file's blocks
// and the keys file's keys, the tree's files and directories — against the
// model's machine after the same steps. The sequences share a lab: each has
// its own units and packages (the model's names with "-SEED" after them),
// its own tree and its own executor state directory.

// modelSample is the seeds the lab runs, chosen (from the first 400) so
// that together they hold what a generated sequence can: packages the host
// installs and packages found installed, renames and moves, services
// declared anew, modules taken on an adopted node, the operator's flips,
// and among the outcomes restored, repaired, held, held-changed, failed
// and refused; in their trees (drawn from a stream of their own, so the
// seeds hold what they held before), files created, restored and removed,
// directories held, kept and removed, the archive unpacked, repaired, kept
// and removed. The test logs what each holds.
var modelSample = []uint64{7, 10, 13, 15, 16, 19, 24, 29}

// modelSampleState is the executor's state directory for one sequence.
const modelSampleState = "/var/lib/mesh-model-sample/"

func TestModelSampleOnSystemd(t *testing.T) { t.Parallel(); modelSampleOn(t, lab.Systemd) }
func TestModelSampleOnOpenRC(t *testing.T)  { t.Parallel(); modelSampleOn(t, lab.OpenRC) }
func TestModelSampleOnRunit(t *testing.T)   { t.Parallel(); modelSampleOn(t, lab.Runit) }
func TestModelSampleOnS6(t *testing.T)      { t.Parallel(); modelSampleOn(t, lab.S6) }

// sampleRun is one sequence in the lab: its names there, and the model's
// steps.
type sampleRun struct {
	seq    model.Sequence
	events []model.Event
	want   []model.Result
}

// name is a model name (unit or package) as this sequence has it in the lab,
// and the shared file's path there.
func (r sampleRun) name(n string) string {
	switch {
	case n == model.SharedFile:
		return r.shared()
	case n == model.KeysFile:
		return r.keysFile()
	case model.InTree(n):
		return treefs.Path(r.tree(), n)
	case strings.HasSuffix(n, ".tar"):
		return r.archives() + "/" + n
	}
	return n + "-" + strconv.FormatUint(r.seq.Seed, 10)
}

// tree is the root of the sequence's tree in the lab (model.TreeRoot).
func (r sampleRun) tree() string {
	return "/var/lib/mesh-model/tree-" + strconv.FormatUint(r.seq.Seed, 10)
}

// archives is the directory of the sequence's archive tars in the lab.
func (r sampleRun) archives() string {
	return "/var/lib/mesh-model/archives-" + strconv.FormatUint(r.seq.Seed, 10)
}

// keysFile is the path of the sequence's keys file in the lab.
func (r sampleRun) keysFile() string {
	return "/etc/mesh-model/" + model.KeysFile + "-" + strconv.FormatUint(r.seq.Seed, 10)
}

// shared is the path of the sequence's shared file (its regions') in the lab.
func (r sampleRun) shared() string {
	return "/etc/mesh-model/" + model.SharedFile + "-" + strconv.FormatUint(r.seq.Seed, 10)
}

// fail is a difference, said whole: the seed, the step, the sequence (in
// the model's names; the lab's have "-SEED" after them), what the step
// gave (context, may be empty), and last the difference itself, after the
// seed and step again — a long log cut in its middle keeps its end.
func (r sampleRun) fail(in lab.Init, step int, context, diff string) string {
	what := "the world as set up"
	if step > 0 {
		what = fmt.Sprintf("step %d (%s)", step, r.seq.Steps[step-1].What)
	}
	head := fmt.Sprintf("%s, seed %d, %s", in, r.seq.Seed, what)
	if context != "" {
		context = "\n" + context
	}
	return fmt.Sprintf("%s\nthe sequence (executor/engine/model Generate(%d); in the lab each name has -%d after it):\n%s%s\n%s: %s",
		head, r.seq.Seed, r.seq.Seed, r.seq, context, head, diff)
}

// machineAt is the model's machine after the first n events.
func (r sampleRun) machineAt(n int) model.World {
	_, w := model.Run(r.seq.World, r.events[:n])
	return w
}

func modelSampleOn(t *testing.T, in lab.Init) {
	g := giveBackInits[in]
	start := time.Now()
	runs := make([]sampleRun, len(modelSample))
	dir := t.TempDir()
	seed := map[string]string{}
	var debs []string
	for i, s := range modelSample {
		r := sampleRun{seq: model.Generate(s)}
		r.events = r.seq.Events()
		r.want, _ = model.Run(r.seq.World, r.events)
		runs[i] = r
		t.Logf("seed %d: %s", s, sampleHolds(r))
		// Every unit no package brings is seeded stopped and disabled;
		// setWorld then makes it as the world has it.
		for n := range r.seq.World.Units {
			if packageOf(r.seq.World, n) == "" {
				maps.Copy(seed, g.seed(r.name(n), "stopped"))
			}
		}
		seed[r.shared()] = model.FileText(r.seq.World.Blocks)
		seed[r.keysFile()] = model.KeysText(r.seq.World.Keys)
		for _, p := range slices.Sorted(maps.Keys(r.seq.World.Packages)) {
			files, postinst := g.pkg(r.name(r.seq.World.Packages[p].Brings))
			debs = append(debs, serviceDeb(t, dir, r.name(p), files, postinst))
		}
	}
	m := boot(t, lab.Options{Init: in, Seed: seed})
	m.serveRepo(debs...)
	setWorld(t, m, g, runs)
	t.Logf("%s: %d sequences set up in %v", in, len(runs), time.Since(start).Round(time.Millisecond))

	for _, r := range runs {
		began := time.Now()
		if msg := runSample(m, g, r); msg != "" {
			t.Error(msg)
			continue
		}
		t.Logf("%s: seed %d, %d steps, as the model says, in %v", in, r.seq.Seed, len(r.seq.Steps), time.Since(began).Round(time.Millisecond))
	}
	t.Logf("%s: %v in all", in, time.Since(start).Round(time.Millisecond))
}

// sampleHolds says what a sequence holds, for the log.
func sampleHolds(r sampleRun) string {
	kinds := map[string]int{}
	for _, st := range r.seq.Steps {
		k := strings.Fields(strings.TrimPrefix(st.What, "the operator "))[0]
		if k == "a" { // a new catalogue declares a service anew
			k = "redeclare"
		}
		kinds[k]++
	}
	outcomes := map[string]int{}
	for _, w := range r.want {
		if w.Refused {
			outcomes["refused"]++
		}
		for _, o := range w.Lines {
			outcomes[o]++
		}
		outcomes["installs"] += len(w.Installs)
	}
	found := 0
	for _, p := range r.seq.World.Packages {
		if p.Installed {
			found++
		}
	}
	return fmt.Sprintf("adopted=%v, %d packages found installed; steps %v; outcomes %v", r.seq.Adopted, found, kinds, outcomes)
}

// setWorld makes the lab each sequence's world, as an operator would before
// the mesh: the packages found installed installed with apt (their postinst
// starts and enables their unit), then every unit started or stopped,
// enabled or disabled, with the init's own tools, and read back.
func setWorld(t *testing.T, m *machine, g giveBackInit, runs []sampleRun) {
	t.Helper()
	var had []string
	for _, r := range runs {
		for p, pk := range r.seq.World.Packages {
			if pk.Installed {
				had = append(had, r.name(p))
			}
		}
	}
	if len(had) > 0 {
		m.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=60 " + strings.Join(had, " ") + " >/dev/null")
	}
	var cmds []string
	for _, r := range runs {
		units := slices.Sorted(maps.Keys(r.seq.World.Units))
		names := make([]string, len(units))
		for i, u := range units {
			names[i] = r.name(u)
		}
		// A unit its package brought is taken over by the supervisor a
		// moment after the postinst: read it once it is.
		var now map[string]gbState
		untilTrue(t, 20*time.Second, fmt.Sprintf("seed %d's units known to the init", r.seq.Seed), func() bool {
			now = g.readUnits(m, names)
			for _, n := range names {
				if s := now[n]; s.run != "running" && s.run != "stopped" {
					return false
				}
			}
			return true
		})
		for _, u := range units {
			want, cur := r.seq.World.Units[u], now[r.name(u)]
			if want.Running != (cur.run == "running") {
				cmds = append(cmds, g.run(r.name(u), want.Running))
			}
			if want.Enabled != (cur.en == "enabled") {
				cmds = append(cmds, g.enable(r.name(u), want.Enabled))
			}
		}
	}
	if len(cmds) > 0 {
		m.sh("set -e\n" + strings.Join(cmds, "\n"))
	}
	for _, r := range runs {
		if err := treefs.Write(m.Path(r.tree()), r.seq.World.Tree); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(m.Path(r.archives()), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := treefs.WriteArchives(m.Path(r.archives())); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range runs {
		if msg := checkMachine(m, g, r, 0); msg != "" {
			t.Fatal(msg)
		}
	}
}

// runSample runs one sequence in the lab and says the first difference
// from the model ("" for none).
func runSample(m *machine, g giveBackInit, r sampleRun) string {
	m.t.Helper()
	state := modelSampleState + strconv.FormatUint(r.seq.Seed, 10)
	for i, st := range r.seq.Steps {
		if st.Decl == nil {
			if msg := operatorFlips(m, g, r, st.Op); msg != "" {
				return r.fail(m.Init(), i+1, "", msg)
			}
		} else {
			doc := model.EngineDoc(st.Decl.Renamed(r.name))
			rep, code, log := m.applyLogged(doc, "apply", "--state", state)
			if msg := sameOutcomes(rep, r.want[i]); msg != "" {
				return r.fail(m.Init(), i+1, fmt.Sprintf("  the declaration: %s\n  the executor logged: %s", doc, log), fmt.Sprintf("%s (exit %d)", msg, code))
			}
		}
		if msg := checkMachine(m, g, r, i+1); msg != "" {
			return msg
		}
	}
	return ""
}

// operatorFlips is the operator's change: the unit's running state or
// enablement turned over with the init's own tools, from what the init says
// it is now. A unit the init does not know (its package is not installed)
// is left alone, as the model leaves it.
func operatorFlips(m *machine, g giveBackInit, r sampleRun, op model.Event) string {
	if op.Block != "" {
		text, err := os.ReadFile(m.Path(r.shared()))
		if err == nil {
			err = m.WriteFile(r.shared(), []byte(model.EditBlock(string(text), op.Block, model.EditedByHand)), 0o644)
		}
		if err != nil {
			return err.Error()
		}
	}
	if op.Key != "" {
		text, err := os.ReadFile(m.Path(r.keysFile()))
		if err == nil {
			err = m.WriteFile(r.keysFile(), []byte(model.EditKey(string(text), op.Key, model.KeyByHand, op.KeyOut)), 0o600)
		}
		if err != nil {
			return err.Error()
		}
	}
	if err := treefs.Do(m.Path(r.tree()), op); err != nil {
		return err.Error()
	}
	u := r.name(op.Unit)
	if p := packageOf(r.seq.World, op.Unit); p != "" && !installedPackages(m, r)[p] {
		return ""
	}
	cur, ok := g.readUnits(m, []string{u})[u]
	if !ok {
		return fmt.Sprintf("the init says nothing of %s", u)
	}
	var cmds []string
	if op.FlipRunning {
		cmds = append(cmds, g.run(u, cur.run != "running"))
	}
	if op.FlipEnabled {
		cmds = append(cmds, g.enable(u, cur.en != "enabled"))
	}
	m.sh("set -e\n" + strings.Join(cmds, "\n"))
	return ""
}

// packageOf is the package of the world that brings unit.
func packageOf(w model.World, unit string) string {
	for n, p := range w.Packages {
		if p.Brings == unit {
			return n
		}
	}
	return ""
}

// installedPackages is which of the sequence's packages dpkg says are
// installed, by their model names.
func installedPackages(m *machine, r sampleRun) map[string]bool {
	m.t.Helper()
	var names []string
	for p := range r.seq.World.Packages {
		names = append(names, r.name(p))
	}
	out := m.sh("dpkg-query -W -f='${Package} ${db:Status-Status}\\n' " + strings.Join(names, " ") + " 2>/dev/null || true")
	got := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] == "installed" {
			got[strings.TrimSuffix(f[0], "-"+strconv.FormatUint(r.seq.Seed, 10))] = true
		}
	}
	return got
}

// sameOutcomes compares an apply's report with the model's result: refused
// or not, and each line's outcome by module.id; "" when they agree.
func sameOutcomes(rep *shapes.Report, want model.Result) string {
	got := map[string]string{}
	var lines []string
	for _, l := range rep.Lines {
		k := l.Module + "." + l.ID
		if _, ok := got[k]; ok {
			return fmt.Sprintf("the executor gave two lines for %s", k)
		}
		got[k] = string(l.Outcome)
		lines = append(lines, fmt.Sprintf("%s %s: %s", k, l.Outcome, l.Detail))
	}
	refused := rep.Outcome == shapes.Refused
	switch {
	case refused != want.Refused:
		return fmt.Sprintf("the executor refused=%v (%s), the model refused=%v", refused, rep.Refused, want.Refused)
	case !maps.Equal(got, want.Lines):
		return fmt.Sprintf("lines differ\n  executor: %v\n  model:    %v\n  the executor's lines:\n      %s", got, want.Lines, strings.Join(lines, "\n      "))
	}
	return ""
}

// checkMachine holds the lab to the model's machine after the first n
// events: each package installed or not as dpkg says, each unit the model
// knows running or not and enabled or not as the init's own tools say. A
// supervisor takes a service over a moment after its package's postinst
// (runsvdir scans every few seconds), so a difference is looked at again
// for a while before it counts.
func checkMachine(m *machine, g giveBackInit, r sampleRun, n int) string {
	m.t.Helper()
	want := r.machineAt(n)
	units := slices.Sorted(maps.Keys(want.Units))
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = r.name(u)
	}
	var diff string
	deadline := time.Now().Add(20 * time.Second)
	for {
		diff = ""
		installed := installedPackages(m, r)
		for _, p := range slices.Sorted(maps.Keys(want.Packages)) {
			if installed[p] != want.Packages[p].Installed {
				diff += fmt.Sprintf("\n  package %s: installed=%v, the model says installed=%v", r.name(p), installed[p], want.Packages[p].Installed)
			}
		}
		got := g.readUnits(m, names)
		for i, u := range units {
			w := want.Units[u]
			s := got[names[i]]
			if (s.run == "running") != w.Running || (s.en == "enabled") != w.Enabled || (s.run != "running" && s.run != "stopped") {
				diff += fmt.Sprintf("\n  unit %s: the init says %v, the model says running=%v enabled=%v", names[i], s, w.Running, w.Enabled)
			}
		}
		text, err := os.ReadFile(m.Path(r.shared()))
		blocks, outside, perr := model.FileBlocks(string(text))
		if err != nil || perr != nil || outside != model.HostText || !maps.Equal(blocks, want.Blocks) {
			diff += fmt.Sprintf("\n  the shared file %s holds the blocks %q, the model says %q (%v %v; outside them %q)", r.shared(), blocks, want.Blocks, err, perr, outside)
		}
		text, err = os.ReadFile(m.Path(r.keysFile()))
		keys, kerr := model.FileKeys(string(text))
		if err != nil || kerr != nil || !maps.Equal(keys, want.Keys) {
			diff += fmt.Sprintf("\n  the keys file %s holds %q, the model says %q (%v %v)", r.keysFile(), keys, want.Keys, err, kerr)
		}
		tree, err := treefs.Read(m.Path(r.tree()))
		if d := treefs.Diff(tree, want.Tree); err != nil || d != "" {
			diff += fmt.Sprintf("\n  the tree %s is not the model's (%v): %s", r.tree(), err, d)
		}
		if diff == "" {
			return ""
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return r.fail(m.Init(), n, "", "the machine after it is not the model's:"+diff)
}
