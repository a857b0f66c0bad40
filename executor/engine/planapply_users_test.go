package engine

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Users and what they own, generated: users found or not, declared with a
// shell, a home and groups drawn or not, a directory, a file in it or a
// file alone owned by one of them (one the same declaration makes among
// them), the operator changing a shell by hand between applies. At each
// step the plan changes nothing — no account, no file — and says, line
// for line, what the apply then does.
func TestPlanEqualsApplyForUsersAndWhatTheyOwn(t *testing.T) {
	names := []string{"ua", "ub"}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 0x75736572))
		h := newHarness(t)
		f := &fakeAccounts{users: map[string]*account{}, groups: []string{"wheel", "adm"}}
		for _, n := range names {
			if rng.IntN(2) == 0 {
				f.users[n] = &account{Shell: "/bin/bash", Home: "/home/" + n, Groups: []string{n}}
			}
		}
		decl := func() string {
			var res []string
			declared := map[string]bool{}
			for i, n := range names {
				if rng.IntN(3) == 0 {
					continue
				}
				r := fmt.Sprintf(`{"module":%q,"id":"u%d","type":"user","name":%q`, []string{"m", "n"}[rng.IntN(2)], i, n)
				if rng.IntN(2) == 0 {
					r += fmt.Sprintf(`,"shell":%q`, []string{"/bin/sh", "/usr/sbin/nologin", "/bin/bash"}[rng.IntN(3)])
				}
				if rng.IntN(2) == 0 {
					r += fmt.Sprintf(`,"home":%q`, []string{"/srv/" + n, "/home/" + n}[rng.IntN(2)])
				}
				if rng.IntN(3) == 0 {
					r += `,"groups":["wheel"]`
				}
				res = append(res, r+"}")
				declared[n] = true
			}
			var owners []string
			for _, n := range names {
				if declared[n] || f.users[n] != nil {
					owners = append(owners, n)
				}
			}
			if len(owners) > 0 && rng.IntN(3) > 0 {
				o := owners[rng.IntN(len(owners))]
				if rng.IntN(2) == 0 {
					res = append(res, fmt.Sprintf(`{"module":"m","id":"d","type":"directory","path":"{root}/d","owner":%q}`, o))
					if rng.IntN(2) == 0 {
						res = append(res, fmt.Sprintf(`{"module":"m","id":"f","type":"file","path":"{root}/d/f","owner":"%s:%s","content":"x"}`, o, o))
					}
				} else {
					res = append(res, fmt.Sprintf(`{"module":"m","id":"t","type":"file","path":"{root}/t","owner":%q,"content":"t%d"}`, o, rng.IntN(2)))
				}
			}
			return h.doc(res...) // none: owns_nothing
		}
		for step := range 4 {
			d := decl()
			if rng.IntN(3) == 0 { // the operator changes a shell by hand
				if found := slices.Sorted(maps.Keys(f.users)); len(found) > 0 {
					f.users[found[rng.IntN(len(found))]].Shell = "/bin/zsh"
				}
			}
			before, made := treeOf(t, h.root), len(f.log)
			plan := h.runAccounts(f, d, true)
			if len(f.log) != made || treeOf(t, h.root) != before {
				t.Fatalf("seed %d step %d: the plan changed the machine: %q", seed, step, f.log[made:])
			}
			rep := h.runAccounts(f, d, false)
			if p, a := outcomes(plan)+"|"+plan.Refused, outcomes(rep)+"|"+rep.Refused; p != a {
				p, a = linesOf(plan), linesOf(rep)
				t.Fatalf("seed %d step %d: plan and apply differ\nplan only:\n%s\napply only:\n%s\nplan:\n%s\napply:\n%s\ndeclaration: %s",
					seed, step, onlyIn(p, a), onlyIn(a, p), p, a, strings.ReplaceAll(d, h.root, "{root}"))
			}
		}
	}
}
