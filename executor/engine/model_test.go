package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine/model"
	"github.com/nox-mesh/nox-mesh-host/executor/engine/model/treefs"
	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// modelSequencesEnv runs that many generated sequences instead of the
// fixed set (NOX_MODEL_SEQUENCES=5000 go test ./executor/engine -run
// TestTheEngineFollowsTheModel); modelSeedEnv starts them at that seed
// (the one a failure prints, to run it again alone).
const (
	modelSequencesEnv = "NOX_MODEL_SEQUENCES"
	modelSeedEnv      = "NOX_MODEL_SEED"
)

// The engine held to the reference model of ADR 0118 and adoption
// (executor/engine/model), on generated sequences across several modules:
// modules assigned, unassigned and assigned again; a resource renamed or
// moved to another module; a service's declared state changed; a package
// declared by one module and its unit by another; the operator flipping a
// unit's running state or enablement between applies; on an adopted node,
// modules taken or not; regions of several modules in one shared file,
// blocks a person wrote found there, a block edited by hand; keys of
// several resources in one configuration file, found or not, renamed,
// moved and handed from one resource to another, set or taken out by
// hand; and either file declared whole in some declarations and edited
// in others; a directory, files in it and beside it and an archive
// unpacked into it, found or not, edited, deleted and added to by hand, a
// path declared a directory in one declaration and a file in the next;
// and a rescue file (a local file's declarations, above the link's)
// declaring some of what the link does otherwise — keys and a region of
// its own among them — then nothing any more.
// Each declaration is planned first (the plan touches nothing and
// gives each line the apply's outcome), then each apply
// runs against the engine (the transcript init and package manager the
// engine's tests use, a real file) and the model, and the first difference
// — refusal, a line's outcome, what the init or the package manager was
// asked, the file's blocks and keys, the tree, the machine after — fails with the sequence
// printed and its seed.
func TestTheEngineFollowsTheModel(t *testing.T) {
	n, seed := modelRange(t, 500)
	for i := range n {
		s := seed + uint64(i)
		seq := model.Generate(s).WithRescues()
		if msg := runAgainstModel(t, seq, nil); msg != "" {
			t.Fatalf("seed %d (%s=%d %s=1 to run it alone): %s\n%s", s, modelSeedEnv, s, modelSequencesEnv, msg, seq)
		}
	}
}

// runAgainstModel runs seq on the engine and the model, and says the first
// difference ("" for none).
// modelRange is how many generated sequences to run (n by default) and
// from which seed (1), as modelSequencesEnv and modelSeedEnv say.
func modelRange(t *testing.T, n int) (int, uint64) {
	seed := uint64(1)
	if s := os.Getenv(modelSequencesEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s=%q", modelSequencesEnv, s)
		}
		n = v
	}
	if s := os.Getenv(modelSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q", modelSeedEnv, s)
		}
		seed = v
	}
	return n, seed
}

// stopAt, when not nil, names declarations (by step, from 0) whose apply
// is first stopped (Options.Stop) once it has said that many lines, then
// run again whole: the machine after the second must be the model's, and
// every step after it as the model says, lines and all.
func runAgainstModel(t *testing.T, seq model.Sequence, stopAt map[int]int) string {
	t.Helper()
	events := seq.Events()
	want, _ := model.Run(seq.World, events)

	h := newHarness(t)
	f := newFakeInit()
	pk := &fakePackages{have: map[string]string{}, repo: map[string]string{}, files: map[string]string{}}
	for n, u := range seq.World.Units {
		f.add(n+".service", u.Running, enabledState(u.Enabled))
	}
	for n, p := range seq.World.Packages {
		pk.repo[n] = "1.0"
		if p.Installed {
			pk.have[n] = "1.0"
			pk.brings(n, p.Brings+".service")
		}
	}
	shared := h.p(model.SharedFile)
	if err := os.WriteFile(shared, []byte(model.FileText(seq.World.Blocks)), 0o644); err != nil {
		t.Fatal(err)
	}
	keysFile := h.p(model.KeysFile)
	if err := os.WriteFile(keysFile, []byte(model.KeysText(seq.World.Keys)), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := h.p(model.TreeRoot)
	if err := treefs.Write(tree, seq.World.Tree); err != nil {
		t.Fatal(err)
	}
	// Over the link an archive comes as obj://, streamed by the agent into
	// the executor's cache before the declaration: there already.
	objURL := map[string]string{}
	if err := os.MkdirAll(ArchiveCacheDir(h.state), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1", "v2"} {
		sum := sha256.Sum256(model.ArchiveTar(v))
		hexSum := hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(ArchiveCacheDir(h.state), hexSum), model.ArchiveTar(v), 0o600); err != nil {
			t.Fatal(err)
		}
		objURL[model.ArchiveURL(v)] = "obj://" + hexSum
	}
	atShared := func(n string) string {
		switch {
		case n == model.SharedFile:
			return shared
		case n == model.KeysFile:
			return keysFile
		case model.InTree(n):
			return treefs.Path(tree, n)
		case objURL[n] != "":
			return objURL[n]
		}
		return n
	}
	pk.onInstall = func(p string) {
		u := seq.World.Packages[p].Brings
		if u != "" && f.units[u+".service"] == nil {
			f.add(u+".service", true, "enabled")
		}
		pk.brings(p, u+".service")
	}
	for i, st := range seq.Steps {
		if st.Decl == nil {
			u := f.units[st.Op.Unit+".service"]
			if st.Op.Block != "" {
				b, _ := os.ReadFile(shared)
				os.WriteFile(shared, []byte(model.EditBlock(string(b), st.Op.Block, model.EditedByHand)), 0o644)
			}
			if st.Op.Key != "" {
				b, _ := os.ReadFile(keysFile)
				os.WriteFile(keysFile, []byte(model.EditKey(string(b), st.Op.Key, model.KeyByHand, st.Op.KeyOut)), 0o600)
			}
			if err := treefs.Do(tree, st.Op); err != nil {
				t.Fatal(err)
			}
			if u == nil {
				continue
			}
			if st.Op.FlipRunning {
				u.Running = !u.Running
			}
			if st.Op.FlipEnabled {
				u.Enabled = enabledState(!u.IsEnabled())
			}
			continue
		}
		doc := model.EngineDoc(st.Decl.Renamed(atShared))
		d, err := shapes.ParseTrusted([]byte(doc))
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, doc)
		}
		s, err := store.Open(h.state)
		if err != nil {
			t.Fatal(err)
		}
		s.Lock(time.Second)
		// The plan first: it touches nothing, and says what the apply then
		// does, an outcome for each line.
		f.transcript()
		pk.log = nil
		files := func() string {
			a, _ := os.ReadFile(shared)
			b, _ := os.ReadFile(keysFile)
			e, _ := json.Marshal(s.Entries())
			return string(a) + "\x00" + string(b) + "\x00" + string(e) + "\x00" + treeOf(t, tree)
		}
		was := files()
		// The link's declarations as the link's, a rescue file's as a
		// local file's: the source above.
		src := store.Link
		if st.Decl.Rescue {
			src = store.Local
		}
		plan := Apply(context.Background(), s, d, []byte(doc), Options{Source: src, packages: pk, Plan: true,
			Init: func() (initsys.Manager, error) { return f, nil }})
		if tr, now := f.transcript(), files(); tr != "" || len(pk.log) > 0 || now != was {
			s.Unlock()
			return fmt.Sprintf("step %d: the plan changed the machine: the init was asked %q, the package manager %q, the files or the store changed: %v", i+1, tr, pk.log, now != was)
		}
		pk.log = nil
		after, stopped := stopAt[i]
		if stopped {
			stop, said := make(chan struct{}), 0
			if after == 0 {
				close(stop)
			}
			first := Apply(context.Background(), s, d, []byte(doc), Options{Source: src, packages: pk, Stop: stop,
				Init: func() (initsys.Manager, error) { return f, nil },
				OnLine: func(shapes.Line) {
					if said++; said == after {
						close(stop)
					}
				}})
			// Asked before it began, it is refused for the moment.
			if first.Refused != "" && plan.Refused == "" && (after > 0 || !first.Passing) {
				s.Unlock()
				return fmt.Sprintf("step %d: the apply stopped after %d lines was refused: %s", i+1, after, first.Refused)
			}
		}
		rep := Apply(context.Background(), s, d, []byte(doc), Options{Source: src, packages: pk,
			Init: func() (initsys.Manager, error) { return f, nil }})
		s.Unlock()
		if stopped {
			// Applied in two: its lines, the init's and the package
			// manager's words are split between them; what it made is not.
			f.transcript()
			w := want[i]
			if msg := sameFile(shared, w.Blocks); msg != "" {
				return fmt.Sprintf("step %d, stopped after %d lines and applied again: %s", i+1, after, msg)
			}
			if msg := sameKeys(keysFile, w.Keys); msg != "" {
				return fmt.Sprintf("step %d, stopped after %d lines and applied again: %s", i+1, after, msg)
			}
			if got, err := treefs.Read(tree); err != nil || treefs.Diff(got, w.Tree) != "" {
				return fmt.Sprintf("step %d, stopped after %d lines and applied again: the tree is not the model's: %v%s", i+1, after, err, treefs.Diff(got, w.Tree))
			}
			if rep.Outcome == shapes.Failed && !slices.Contains(slices.Collect(maps.Values(w.Lines)), string(shapes.Failed)) {
				return fmt.Sprintf("step %d, stopped after %d lines, failed when applied again: %s", i+1, after, linesOf(rep))
			}
			continue
		}
		// Each line's outcome: the words may differ where the plan cannot
		// know (the version a package manager installs). An apply that
		// failed is compared up to its first failed line (planAgreesUpTo).
		if p, a := outcomes(plan), outcomes(rep); rep.Outcome != shapes.Failed && (p != a || plan.Refused != rep.Refused) ||
			rep.Outcome == shapes.Failed && !planAgreesUpTo(plan, rep) {
			return fmt.Sprintf("step %d: plan and apply differ\nplan:\n%s\napply:\n%s", i+1, linesOf(plan), linesOf(rep))
		}
		got := model.Result{Refused: rep.Refused != "", Lines: map[string]string{}}
		var dup []string
		for _, l := range rep.Lines {
			k := l.Module + "." + l.ID
			if _, ok := got.Lines[k]; ok {
				dup = append(dup, k)
			}
			got.Lines[k] = string(l.Outcome)
		}
		if tr := f.transcript(); tr != "" {
			got.Init = strings.Split(tr, "; ")
			sort.Strings(got.Init)
		}
		for _, l := range pk.log {
			if p, ok := strings.CutPrefix(l, "install "); ok {
				got.Installs = append(got.Installs, strings.TrimSuffix(p, "="))
			}
		}
		sort.Strings(got.Installs)
		w := want[i]
		w.Init = append([]string{}, w.Init...)
		for j := range w.Init {
			w.Init[j] += ".service"
		}
		sort.Strings(w.Init)
		lines := func(rep *shapes.Report) string {
			var s []string
			for _, l := range rep.Lines {
				s = append(s, fmt.Sprintf("%s.%s %s: %s", l.Module, l.ID, l.Outcome, l.Detail))
			}
			return strings.Join(s, "\n      ")
		}
		switch {
		case len(dup) > 0:
			return fmt.Sprintf("step %d: the engine gave two lines for %v\n      %s", i+1, dup, lines(rep))
		case got.Refused != w.Refused:
			return fmt.Sprintf("step %d: engine refused=%v (%s), model refused=%v", i+1, got.Refused, rep.Refused, w.Refused)
		case !sameLines(got.Lines, w.Lines):
			return fmt.Sprintf("step %d: lines differ\n  engine: %v\n  model:  %v\n  engine's lines:\n      %s", i+1, got.Lines, w.Lines, lines(rep))
		case !slices.Equal(got.Init, w.Init):
			return fmt.Sprintf("step %d: the init was asked %q, the model says %q\n  engine's lines:\n      %s", i+1, got.Init, w.Init, lines(rep))
		case !slices.Equal(got.Installs, w.Installs):
			return fmt.Sprintf("step %d: installed %q, the model says %q", i+1, got.Installs, w.Installs)
		}
		if msg := sameFile(shared, w.Blocks); msg != "" {
			return fmt.Sprintf("step %d: %s\n  engine's lines:\n      %s", i+1, msg, lines(rep))
		}
		if msg := sameKeys(keysFile, w.Keys); msg != "" {
			return fmt.Sprintf("step %d: %s\n  engine's lines:\n      %s", i+1, msg, lines(rep))
		}
		if got, err := treefs.Read(tree); err != nil || treefs.Diff(got, w.Tree) != "" {
			return fmt.Sprintf("step %d: the tree is not the model's: %v%s\n  engine's lines:\n      %s", i+1, err, treefs.Diff(got, w.Tree), lines(rep))
		}
	}
	_, end := model.Run(seq.World, events)
	for n, u := range end.Units {
		got := f.units[n+".service"]
		if got == nil || got.Running != u.Running || got.IsEnabled() != u.Enabled {
			return fmt.Sprintf("at the end %s is %+v, the model says %+v", n, got, u)
		}
	}
	return ""
}

// A stop at any point of any apply (Options.Stop: the daemon asked to
// stop, a rescue apply's Ctrl-C), then the same declaration applied again,
// leaves the machine as the apply not stopped would, and every apply
// after it does what the model says: the stop leaves nothing the store
// and the machine disagree on. On the model's generated sequences, a
// stop drawn at one declaration of each, after a drawn number of lines.
func TestAStoppedApplyAppliedAgainEndsAsTheModel(t *testing.T) {
	n, seed := modelRange(t, 200)
	for i := range n {
		s := seed + uint64(i)
		seq := model.Generate(s).WithRescues()
		var decls []int
		for j, st := range seq.Steps {
			if st.Decl != nil {
				decls = append(decls, j)
			}
		}
		if len(decls) == 0 {
			continue
		}
		r := rand.New(rand.NewPCG(s, 0x5709))
		at := decls[r.IntN(len(decls))]
		after := r.IntN(len(seq.Steps[at].Decl.Resources) + 1)
		if msg := runAgainstModel(t, seq, map[int]int{at: after}); msg != "" {
			t.Fatalf("seed %d (%s=%d %s=1 to run it alone), stopped at step %d after %d lines: %s\n%s", s, modelSeedEnv, s, modelSequencesEnv, at+1, after, msg, seq)
		}
	}
}

// sameFile holds the shared file to the model's blocks, and what lies
// outside them to what the person wrote: "" when it is.
func sameFile(path string, want map[string]string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	got, outside, err := model.FileBlocks(string(b))
	switch {
	case err != nil:
		return fmt.Sprintf("the shared file: %v:\n%s", err, b)
	case outside != model.HostText:
		return fmt.Sprintf("the shared file outside its blocks is not the person's:\n%s", b)
	case !sameLines(got, want):
		return fmt.Sprintf("the shared file's blocks are %q, the model says %q", got, want)
	}
	return ""
}

// sameKeys holds the keys file to the model's keys, and its person's line
// to theirs: "" when it is.
func sameKeys(path string, want map[string]string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	got, err := model.FileKeys(string(b))
	switch {
	case err != nil:
		return fmt.Sprintf("the keys file: %v:\n%s", err, b)
	case !sameLines(got, want):
		return fmt.Sprintf("the keys file holds %q, the model says %q", got, want)
	}
	return ""
}

func sameLines(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func enabledState(on bool) string {
	if on {
		return "enabled"
	}
	return "disabled"
}

// planAgreesUpTo says whether plan said what the failed apply rep did up to
// its first failed line: the same resources in the same order, the same
// outcome for each before it, and that line failing in the plan too — or
// resting on what the plan does not apply (a unit or an owner this
// declaration brings: a plan installs no package, so it cannot know that
// one brings no unit). After that line the two part: what follows it in
// an apply depends on what failed.
func planAgreesUpTo(plan, rep *shapes.Report) bool {
	fail := slices.IndexFunc(rep.Lines, func(l shapes.Line) bool { return l.Outcome == shapes.Failed })
	if plan.Refused != rep.Refused || fail < 0 || fail >= len(plan.Lines) {
		return false
	}
	for j := 0; j <= fail; j++ {
		p, a := plan.Lines[j], rep.Lines[j]
		if p.Module != a.Module || p.ID != a.ID || j < fail && p.Outcome != a.Outcome {
			return false
		}
	}
	p := plan.Lines[fail]
	return p.Outcome == shapes.Failed || strings.Contains(p.Detail, planDoesNotApply)
}
