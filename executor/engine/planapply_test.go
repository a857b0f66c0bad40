package engine

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// plan is apply without the changes: for generated declarations and
// machine states, the lines a plan prints are the lines the apply right
// after it reports (a plan's "would be …" said as done). Each round:
// a machine state (some paths there before the host, units known to the
// init in some state), a first declaration applied, hands on the machine
// (files edited, deleted or added inside the host's directories, units
// started, stopped, enabled or disabled, a record made one from before the
// host kept what it found), then a second declaration — planned, then
// applied — and the two sets of lines compared. Services are declared with
// a state, an enablement and restart_on naming files declared before or
// after them, against the transcript init.
func TestPlanEqualsApply(t *testing.T) {
	for seed := range uint64(planApplyRounds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x6e6f78))
			h := newHarness(t)
			g := &gen{h: h, rng: rng, init: newFakeInit()}
			g.machine()
			h.applyWith(g.init, g.declaration(), false)
			g.hands()
			second := g.declaration()
			g.init.transcript()
			plan := h.applyWith(g.init, second, true)
			if got := g.init.transcript(); got != "" {
				t.Fatalf("the plan touched a unit: %s\ndeclaration: %s", got, second)
			}
			rep := h.applyWith(g.init, second, false)
			if p, a := linesOf(plan), linesOf(rep); p != a {
				t.Fatalf("plan and apply differ\nplan:\n%s\napply:\n%s\ndeclaration: %s", p, a, second)
			}
		})
	}
}

// linesOf is a report's lines as text, a plan's "would be " dropped.
func linesOf(rep *shapes.Report) string {
	var b strings.Builder
	if rep.Refused != "" {
		fmt.Fprintf(&b, "refused: %s\n", rep.Refused)
	}
	for _, l := range rep.Lines {
		fmt.Fprintf(&b, "%s.%s %s %s: %s\n", l.Module, l.ID, l.Type, l.Outcome, strings.ReplaceAll(l.Detail, "would be ", ""))
	}
	return b.String()
}

// gen makes machine states and declarations over a small set of paths, so
// that they meet: a directory a and its files, a nested directory a/b.
type gen struct {
	h    *harness
	rng  *rand.Rand
	init *fakeInit
}

var genDirs = []string{"a", "a/b", "c"}
var genFiles = []string{"a/f1", "a/f2", "a/b/f3", "c/f4", "top"}

// genUnits are units the init knows, each found in some state.
var genUnits = []string{"u1", "u2", "u3"}

func (g *gen) machine() {
	for _, d := range genDirs {
		if g.rng.IntN(4) == 0 {
			os.MkdirAll(g.h.p(d), 0o755)
		}
	}
	for _, f := range genFiles {
		if g.rng.IntN(4) == 0 {
			if os.MkdirAll(filepath.Dir(g.h.p(f)), 0o755) == nil {
				os.WriteFile(g.h.p(f), []byte("found "+f), 0o644)
			}
		}
	}
	for _, u := range genUnits {
		en := []string{"enabled", "disabled", "disabled", "masked"}[g.rng.IntN(4)]
		g.init.add(u+".service", en != "masked" && g.rng.IntN(2) == 0, en)
	}
}

// declaration declares a random subset, every file's directory with it
// (or present already), in a valid order.
func (g *gen) declaration() string {
	var res, files []string
	declared := map[string]bool{}
	for _, d := range genDirs {
		parent := filepath.Dir(d)
		if g.rng.IntN(2) == 0 && (parent == "." || declared[parent] || exists(g.h.p(parent))) {
			declared[d] = true
			mode := []string{"", `,"mode":"0750"`}[g.rng.IntN(2)]
			res = append(res, fmt.Sprintf(`{"module":"m","id":%q,"type":"directory","path":"{root}/%s"%s}`, "d-"+strings.ReplaceAll(d, "/", "-"), d, mode))
		}
	}
	for _, f := range genFiles {
		parent := filepath.Dir(f)
		if g.rng.IntN(2) == 0 && (parent == "." || declared[parent] || exists(g.h.p(parent))) {
			content := []string{"one", "two"}[g.rng.IntN(2)]
			res = append(res, fmt.Sprintf(`{"module":"m","id":%q,"type":"file","path":"{root}/%s","content":%q}`, "f-"+strings.ReplaceAll(f, "/", "-"), f, content))
			files = append(files, "f-"+strings.ReplaceAll(f, "/", "-"))
		}
	}
	// Services, each at any place among the rest: restart_on may name a
	// file declared before the service or after it.
	for _, u := range genUnits {
		if g.rng.IntN(3) == 0 {
			continue
		}
		s := fmt.Sprintf(`{"module":"m","id":%q,"type":"service","unit":%q`, "s-"+u, u)
		if state := []string{"", "running", "stopped"}[g.rng.IntN(3)]; state != "" {
			s += fmt.Sprintf(`,"state":%q`, state)
		}
		if en := []string{"", "true", "false"}[g.rng.IntN(3)]; en != "" {
			s += `,"enabled":` + en
		}
		var on []string
		for _, f := range files {
			if g.rng.IntN(3) == 0 {
				on = append(on, fmt.Sprintf("%q", []string{f, "m." + f}[g.rng.IntN(2)]))
			}
		}
		if len(on) > 0 {
			s += `,"restart_on":[` + strings.Join(on, ",") + `]`
		}
		at := g.rng.IntN(len(res) + 1)
		res = append(res[:at], append([]string{s + "}"}, res[at:]...)...)
	}
	return g.h.doc(res...)
}

// hands changes the machine as people do: edits, deletions, additions.
func (g *gen) hands() {
	for _, f := range genFiles {
		switch g.rng.IntN(6) {
		case 0:
			os.WriteFile(g.h.p(f), []byte("edited "+f), 0o644)
		case 1:
			os.Remove(g.h.p(f))
		}
	}
	for _, d := range genDirs {
		if g.rng.IntN(5) == 0 && exists(g.h.p(d)) {
			os.WriteFile(g.h.p(d+"/someone-else"), []byte("x"), 0o644)
		}
	}
	for _, u := range genUnits {
		s := g.init.units[u+".service"]
		if g.rng.IntN(4) == 0 && s.Enabled != "masked" {
			s.Running = !s.Running
		}
		if g.rng.IntN(4) == 0 && s.Enabled != "masked" {
			s.Enabled = map[string]string{"enabled": "disabled", "disabled": "enabled"}[s.Enabled]
		}
		if st, err := store.Open(g.h.state); err == nil && st.Get("service:"+u+".service") != nil && g.rng.IntN(4) == 0 {
			forgetFound(g.h.t, g.h, "service:"+u+".service") // a record from before the host kept it
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// planApplyRounds is how many generated rounds TestPlanEqualsApply runs
// (make test); PLAN_APPLY_ROUNDS runs more.
var planApplyRounds = func() int {
	var n int
	if _, err := fmt.Sscan(os.Getenv("PLAN_APPLY_ROUNDS"), &n); err == nil && n > 0 {
		return n
	}
	return 150
}()
