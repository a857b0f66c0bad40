package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine/model"
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
// modules taken or not. Each apply runs against the engine (the transcript
// init and package manager the engine's tests use) and the model, and the
// first difference — refusal, a line's outcome, what the init or the
// package manager was asked, the machine after — fails with the sequence
// printed and its seed.
func TestTheEngineFollowsTheModel(t *testing.T) {
	n, seed := 500, uint64(1)
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
	for i := range n {
		s := seed + uint64(i)
		seq := generateSequence(s)
		if msg := runAgainstModel(t, seq); msg != "" {
			t.Fatalf("seed %d (%s=%d %s=1 to run it alone): %s\n%s", s, modelSeedEnv, s, modelSequencesEnv, msg, seq)
		}
	}
}

// A generated sequence: a world, a catalogue of modules that changes, and
// the steps taken.
type sequence struct {
	seed    uint64
	world   model.World
	adopted bool
	steps   []seqStep
}

// seqStep is the operator's change (decl nil), or a declaration applied
// after what says what changed.
type seqStep struct {
	what string
	decl *model.Declaration
	op   model.Event
}

func (s sequence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "world (adopted=%v):\n", s.adopted)
	for _, n := range sortedKeys(s.world.Units) {
		u := s.world.Units[n]
		fmt.Fprintf(&b, "  unit %s running=%v enabled=%v\n", n, u.Running, u.Enabled)
	}
	for _, n := range sortedKeys(s.world.Packages) {
		p := s.world.Packages[n]
		fmt.Fprintf(&b, "  package %s installed=%v brings=%s\n", n, p.Installed, p.Brings)
	}
	for i, st := range s.steps {
		fmt.Fprintf(&b, "%2d. %s\n", i+1, st.what)
		if st.decl != nil {
			fmt.Fprintf(&b, "    apply %s\n", describeDecl(*st.decl))
		}
	}
	return b.String()
}

func describeDecl(d model.Declaration) string {
	var parts []string
	for _, r := range d.Resources {
		s := r.Key() + "=" + r.Kind + ":" + r.Name
		if r.Kind == "service" {
			s += "(" + r.State + "," + modelEnabled(r.Enabled) + ")"
		}
		parts = append(parts, s)
	}
	taken := sortedKeys(d.Taken)
	return fmt.Sprintf("[%s] taken=%v", strings.Join(parts, " "), taken)
}

func modelEnabled(e *bool) string {
	if e == nil {
		return "-"
	}
	return strconv.FormatBool(*e)
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// generateSequence draws a sequence from seed: two units found on the
// machine, three packages each bringing a unit (one found installed, at
// times), four modules sharing them out — a unit's service and a package each in
// at most one module, a package often in another than its unit's — and
// eight to fourteen steps.
func generateSequence(seed uint64) sequence {
	rnd := rand.New(rand.NewPCG(seed, 0x0118))
	s := sequence{seed: seed, adopted: rnd.IntN(2) == 0,
		world: model.World{Units: map[string]model.Unit{}, Packages: map[string]model.Package{}}}
	bit := func() bool { return rnd.IntN(2) == 0 }
	for _, u := range []string{"mu0", "mu1"} {
		s.world.Units[u] = model.Unit{Running: bit(), Enabled: bit()}
	}
	for i := range 3 {
		p, u := fmt.Sprintf("mp%d", i), fmt.Sprintf("mpu%d", i)
		pk := model.Package{Brings: u, Installed: rnd.IntN(4) == 0}
		if pk.Installed {
			s.world.Units[u] = model.Unit{Running: bit(), Enabled: bit()}
		}
		s.world.Packages[p] = pk
	}
	modules := []string{"ma", "mb", "mc", "md"}
	// The catalogue: each module's resources, packages then services.
	catalogue := map[string][]model.Resource{}
	state := func() string { return []string{"running", "stopped", ""}[rnd.IntN(3)] }
	enabled := func() *bool {
		switch rnd.IntN(3) {
		case 0:
			return nil
		case 1:
			v := true
			return &v
		}
		v := false
		return &v
	}
	// One thing on the machine has one declaration: a package is in one
	// module at most, as a unit's service is.
	for _, p := range sortedKeys(s.world.Packages) {
		if rnd.IntN(4) > 0 {
			m := modules[rnd.IntN(len(modules))]
			catalogue[m] = append(catalogue[m], model.Resource{Kind: "package", Module: m, ID: p, Name: p})
		}
	}
	for _, u := range []string{"mu0", "mu1", "mpu0", "mpu1", "mpu2"} {
		if rnd.IntN(5) == 0 {
			continue
		}
		m := modules[rnd.IntN(len(modules))]
		catalogue[m] = append(catalogue[m], model.Resource{Kind: "service", Module: m, ID: u, Name: u, State: state(), Enabled: enabled()})
	}
	assigned, taken := map[string]bool{}, map[string]bool{}
	compose := func() *model.Declaration {
		d := &model.Declaration{Adopted: s.adopted, Taken: map[string]bool{}}
		for m := range taken {
			d.Taken[m] = true
		}
		for _, kind := range []string{"package", "service"} {
			for _, m := range modules {
				if !assigned[m] {
					continue
				}
				for _, r := range catalogue[m] {
					if r.Kind == kind {
						d.Resources = append(d.Resources, r)
					}
				}
			}
		}
		return d
	}
	// The first step assigns a module; later ones are drawn.
	first := modules[rnd.IntN(len(modules))]
	assigned[first] = true
	s.steps = append(s.steps, seqStep{what: "assign " + first, decl: compose()})
	steps := 8 + rnd.IntN(7)
	for len(s.steps) < steps {
		m := modules[rnd.IntN(len(modules))]
		var what string
		switch k := rnd.IntN(10); {
		case k < 3:
			if assigned[m] {
				what = "unassign " + m
			} else {
				what = "assign " + m
			}
			assigned[m] = !assigned[m]
		case k < 5:
			units := sortedKeys(s.world.Units)
			for _, p := range sortedKeys(s.world.Packages) {
				units = append(units, s.world.Packages[p].Brings)
			}
			u := units[rnd.IntN(len(units))]
			ev := model.Event{Unit: u, FlipRunning: bit()}
			ev.FlipEnabled = !ev.FlipRunning || bit()
			s.steps = append(s.steps, seqStep{what: fmt.Sprintf("the operator flips %s (running %v, enabled %v)", u, ev.FlipRunning, ev.FlipEnabled), op: ev})
			continue
		case k < 6 && len(catalogue[m]) > 0:
			i := rnd.IntN(len(catalogue[m]))
			r := &catalogue[m][i]
			old := r.Key()
			if strings.HasSuffix(r.ID, "r") {
				r.ID = strings.TrimSuffix(r.ID, "r")
			} else {
				r.ID += "r"
			}
			what = "rename " + old + " to " + r.Key()
		case k < 7 && len(catalogue[m]) > 0:
			i := rnd.IntN(len(catalogue[m]))
			r := catalogue[m][i]
			to := modules[rnd.IntN(len(modules))]
			if to == m || slices.ContainsFunc(catalogue[to], func(x model.Resource) bool { return x.Name == r.Name }) {
				continue
			}
			catalogue[m] = slices.Delete(catalogue[m], i, i+1)
			r.Module = to
			catalogue[to] = append(catalogue[to], r)
			sort.SliceStable(catalogue[to], func(a, b int) bool {
				return catalogue[to][a].Kind == "package" && catalogue[to][b].Kind != "package"
			})
			what = "move " + m + "." + r.ID + " to module " + to
		case k < 8:
			var svcs []int
			for i, r := range catalogue[m] {
				if r.Kind == "service" {
					svcs = append(svcs, i)
				}
			}
			if len(svcs) == 0 {
				continue
			}
			r := &catalogue[m][svcs[rnd.IntN(len(svcs))]]
			r.State, r.Enabled = state(), enabled()
			what = fmt.Sprintf("a new catalogue declares %s (%s, %s)", r.Key(), r.State, modelEnabled(r.Enabled))
		case k < 9 && s.adopted:
			if taken[m] {
				continue
			}
			taken[m] = true
			what = "take " + m
		default:
			what = "apply again"
		}
		s.steps = append(s.steps, seqStep{what: what, decl: compose()})
	}
	return s
}

// runAgainstModel runs seq on the engine and the model, and says the first
// difference ("" for none).
func runAgainstModel(t *testing.T, seq sequence) string {
	t.Helper()
	var events []model.Event
	for _, st := range seq.steps {
		if st.decl == nil {
			events = append(events, st.op)
		} else {
			events = append(events, model.Event{Apply: st.decl})
		}
	}
	want, _ := model.Run(seq.world, events)

	h := newHarness(t)
	f := newFakeInit()
	pk := &fakePackages{have: map[string]string{}, repo: map[string]string{}, files: map[string]string{}}
	for n, u := range seq.world.Units {
		f.add(n+".service", u.Running, enabledState(u.Enabled))
	}
	for n, p := range seq.world.Packages {
		pk.repo[n] = "1.0"
		if p.Installed {
			pk.have[n] = "1.0"
			pk.brings(n, p.Brings+".service")
		}
	}
	pk.onInstall = func(p string) {
		u := seq.world.Packages[p].Brings
		if u != "" && f.units[u+".service"] == nil {
			f.add(u+".service", true, "enabled")
		}
		pk.brings(p, u+".service")
	}
	for i, st := range seq.steps {
		if st.decl == nil {
			u := f.units[st.op.Unit+".service"]
			if u == nil {
				continue
			}
			if st.op.FlipRunning {
				u.Running = !u.Running
			}
			if st.op.FlipEnabled {
				u.Enabled = enabledState(!u.IsEnabled())
			}
			continue
		}
		doc := engineDoc(*st.decl)
		d, err := shapes.ParseTrusted([]byte(doc))
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, doc)
		}
		s, err := store.Open(h.state)
		if err != nil {
			t.Fatal(err)
		}
		s.Lock(time.Second)
		pk.log = nil
		rep := Apply(context.Background(), s, d, []byte(doc), Options{Source: store.Local, packages: pk,
			Init: func() (initsys.Manager, error) { return f, nil }})
		s.Unlock()
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
	}
	_, end := model.Run(seq.world, events)
	for n, u := range end.Units {
		got := f.units[n+".service"]
		if got == nil || got.Running != u.Running || got.IsEnabled() != u.Enabled {
			return fmt.Sprintf("at the end %s is %+v, the model says %+v", n, got, u)
		}
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

// engineDoc is the model's declaration as the engine reads it.
func engineDoc(d model.Declaration) string {
	if len(d.Resources) == 0 {
		return fmt.Sprintf(`{"version":1,"adopted":%v,"taken":%s,"resources":[],"owns_nothing":true}`, d.Adopted, takenJSON(d.Taken))
	}
	var res []string
	for _, r := range d.Resources {
		m := map[string]any{"module": r.Module, "id": r.ID, "type": r.Kind}
		if r.Kind == "package" {
			m["name"] = r.Name
		} else {
			m["unit"] = r.Name
			if r.State != "" {
				m["state"] = r.State
			}
			if r.Enabled != nil {
				m["enabled"] = *r.Enabled
			}
		}
		b, _ := json.Marshal(m)
		res = append(res, string(b))
	}
	return fmt.Sprintf(`{"version":1,"adopted":%v,"taken":%s,"resources":[%s]}`, d.Adopted, takenJSON(d.Taken), strings.Join(res, ","))
}

func takenJSON(t map[string]bool) string {
	b, _ := json.Marshal(append([]string{}, sortedKeys(t)...))
	return string(b)
}
