package rescue

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/edit"
)

// Writing into shared files survives kill -9 at any instant: the real
// binary applies regions into 40 files and keys into 40 others, and takes
// them out again, killed at random instants of each. After every kill each
// file is whole — as found, or with the mesh's lines, never half written —
// and the next complete apply converges; undeclared at last, every file is
// byte for byte as found.
func TestEditsSurviveKill9AtAnyInstant(t *testing.T) {
	needRoot(t)
	seed := crashSeed(t)
	t.Logf("seed %d (set RESCUE_CRASH_SEED to repeat another run)", seed)
	rng := rand.New(rand.NewSource(seed))
	base := rootDir(t)
	tree, state := filepath.Join(base, "tree"), filepath.Join(base, "state")
	os.Mkdir(tree, 0o755)
	const n = 40
	found := map[string]string{}
	var resources []string
	// Each file's two whole states: as found, and with the mesh's lines.
	after := map[string]string{}
	for i := 0; i < n; i++ {
		p := filepath.Join(tree, fmt.Sprintf("hosts%02d", i))
		f := fmt.Sprintf("# the machine's own, %d\n127.0.0.1 localhost\n%s", i, strings.Repeat("# padding line of the found file\n", 40))
		found[p] = f
		content := fmt.Sprintf("10.0.%d.1 node-a\n10.0.%d.2 node-b\n", i, i)
		r := fmt.Sprintf(`{"module":"hosts","id":"r%02d","type":"region","path":%q,"content":%q}`, i, p, content)
		resources = append(resources, r)
		out, _, err := edit.Region{Comment: "#", Name: fmt.Sprintf("hosts.r%02d", i)}.Set([]byte(f), content)
		if err != nil {
			t.Fatal(err)
		}
		after[p] = string(out)

		q := filepath.Join(tree, fmt.Sprintf("sshd%02d", i))
		g := fmt.Sprintf("# sshd %d\nPort 22\nPasswordAuthentication yes\n%sMatch User x\n  PasswordAuthentication yes\n", i, strings.Repeat("# a comment line of the found file\n", 40))
		found[q] = g
		resources = append(resources, fmt.Sprintf(`{"module":"ssh","id":"k%02d","type":"keys","path":%q,"format":"space","set":{"PasswordAuthentication":"no","PermitRootLogin":"no"}}`, i, q))
		out, err = edit.ParseKeys([]byte(g), edit.Space).Apply([]edit.Change{{Key: "PasswordAuthentication", Value: "no"}, {Key: "PermitRootLogin", Value: "no"}})
		if err != nil {
			t.Fatal(err)
		}
		after[q] = string(out)
	}
	for p, f := range found {
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	declared := filepath.Join(base, "declared.json")
	none := filepath.Join(base, "none.json")
	os.WriteFile(declared, []byte(`{"version":1,"resources":[`+strings.Join(resources, ",")+`]}`), 0o644)
	os.WriteFile(none, []byte(`{"version":1,"resources":[],"owns_nothing":true}`), 0o644)
	w := &crashWorld{state: state}

	whole := func(when string) {
		t.Helper()
		for p := range found {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if string(b) != found[p] && string(b) != after[p] {
				t.Fatalf("%s: %s is neither as found nor with the mesh's lines:\n%s", when, filepath.Base(p), b)
			}
		}
		entries, _ := os.ReadDir(tree)
		if len(entries) != len(found) && when == "after a complete apply" {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("%s: %d entries in the tree, want %d (what a write left beside a file?): %v", when, len(entries), len(found), names)
		}
	}
	complete := func(decl string, want map[string]string) {
		t.Helper()
		w.completeApply(t, decl)
		whole("after a complete apply")
		for p, c := range want {
			if b, _ := os.ReadFile(p); string(b) != c {
				t.Fatalf("after a complete apply of %s, %s:\n%s\nwant\n%s", filepath.Base(decl), filepath.Base(p), b, c)
			}
		}
	}
	// Uninterrupted: how long each takes, the span the kills are spread over.
	t0 := time.Now()
	complete(declared, after)
	took := time.Since(t0)
	complete(none, found)
	t.Logf("an apply of %d edits takes %v", 2*n, took)

	// Kills until 8 have landed mid-apply, 64 tries at most: on a machine
	// whose load changes, an apply's time does too, and a span measured
	// once had most kills land after the apply (2 of 16 once, in make
	// test). Each complete apply measures the span again.
	const wantKills, tries = 8, 64
	kills, i := 0, 0
	for ; kills < wantKills && i < tries; i++ {
		decl, want := declared, after
		if i%2 == 1 {
			decl, want = none, found
		}
		delay := time.Duration(rng.Int63n(int64(took) + 1))
		if killed, _ := w.killedApply(t, decl, delay); killed {
			kills++
		}
		whole(fmt.Sprintf("kill %d (%v into %s)", i, delay, filepath.Base(decl)))
		t0 := time.Now()
		complete(decl, want)
		took = time.Since(t0)
	}
	complete(declared, after)
	complete(none, found)
	t.Logf("%d kills landed mid-apply in %d tries", kills, i)
	if kills < wantKills/2 {
		t.Errorf("only %d of %d kills landed mid-apply: the test did not try what it says", kills, i)
	}
	// The store holds nothing at the end.
	res, err := runExecutor(context.Background(), "owned", "--state", state, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var owned []json.RawMessage
	if json.Unmarshal(res.stdout, &owned) != nil || len(owned) != 0 {
		t.Errorf("the store still holds: %s", res.stdout)
	}
}
