package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
)

// Containers, generated: found (an operator's, running or not) or not,
// declared with one of two images and an environment drawn or not, on a
// node adopted or not with their module taken or not, the operator
// stopping or removing one by hand between applies. At each step the plan
// asks the runtime nothing that changes it and says, line for line, what
// the apply then does.
func TestPlanEqualsApplyForContainers(t *testing.T) {
	images := []string{"r/x@sha256:" + strings.Repeat("a", 64), "r/y@sha256:" + strings.Repeat("b", 64)}
	names := []string{"ca", "cb"}
	for seed := range uint64(120) {
		rng := rand.New(rand.NewPCG(seed, 0x63747273))
		h := newHarness(t)
		rt := newFakeRuntime(t, images[0])
		rt.images[images[1]] = "sha256:" + strings.Repeat("2", 64)
		for _, n := range names {
			if rng.IntN(3) == 0 {
				rt.found(n, rng.IntN(2) == 0)
			}
		}
		adopted := rng.IntN(3) == 0
		for step := range 4 {
			var res []string
			for i, n := range names {
				if rng.IntN(3) == 0 {
					continue
				}
				r := fmt.Sprintf(`{"module":%q,"id":"c%d","type":"container","name":%q,"image":%q`, []string{"m", "n"}[i], i, n, images[rng.IntN(2)])
				if rng.IntN(2) == 0 {
					r += fmt.Sprintf(`,"env":{"MODE":"m%d"}`, rng.IntN(2))
				}
				res = append(res, r+"}")
			}
			doc := h.doc(res...)
			if adopted {
				taken := []string{}
				for _, m := range []string{"m", "n"} {
					if rng.IntN(2) == 0 {
						taken = append(taken, fmt.Sprintf("%q", m))
					}
				}
				doc = strings.Replace(doc, `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+strings.Join(taken, ",")+`],`, 1)
			}
			if rng.IntN(4) == 0 { // the operator's hand: one stopped, or removed
				rt.mu.Lock()
				if len(rt.ctrs) > 0 {
					c := rt.ctrs[rng.IntN(len(rt.ctrs))]
					if rng.IntN(2) == 0 {
						c.running = false
					} else {
						rt.ctrs = slices.DeleteFunc(rt.ctrs, func(x *fakeCtr) bool { return x == c })
					}
				}
				rt.mu.Unlock()
			}
			before, wrote := rt.state(), len(rt.writes)
			plan := h.run(store.Local, doc, true)
			if len(rt.writes) != wrote || rt.state() != before {
				t.Fatalf("seed %d step %d: the plan changed the runtime: %q", seed, step, rt.writes[wrote:])
			}
			rep := h.run(store.Local, doc, false)
			if p, a := outcomes(plan)+"|"+plan.Refused, outcomes(rep)+"|"+rep.Refused; p != a {
				p, a = linesOf(plan), linesOf(rep)
				t.Fatalf("seed %d step %d: plan and apply differ\nplan only:\n%s\napply only:\n%s\nplan:\n%s\napply:\n%s\nruntime before: %s\ndeclaration: %s",
					seed, step, onlyIn(p, a), onlyIn(a, p), p, a, before, doc)
			}
		}
	}
}
