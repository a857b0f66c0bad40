package cli

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/shapegen"
)

// Every shape through the rescue command's two doors, generated: planned
// on a full host (a plan writes nothing; every shape's observe step runs
// against this machine) and applied on a partial host (which refuses by
// name what it does not do). Each answers with a report — never a panic,
// never an answer that is not JSON — and the plan leaves the state as it
// was.
func TestEveryShapeAsARescueFile(t *testing.T) {
	d := base(t)
	state := filepath.Join(d, "state")
	root := filepath.Join(d, "tree")
	os.Mkdir(root, 0o755)
	// The declared resource's own line (the report also says what the
	// file before it held and this one does not: removed). An action
	// whose verify passes already is not run.
	partialDoes := map[string]shapes.Outcome{shapes.TypeFile: shapes.Applied, shapes.TypeDirectory: shapes.Applied, shapes.TypeAction: shapes.Unchanged,
		shapes.TypeArchive: shapes.Failed, shapes.TypeRegion: shapes.Failed, shapes.TypeKeys: shapes.Failed}
	n := 0
	for round := range uint64(2) {
		g := shapegen.New(round, root)
		for _, typ := range shapegen.Types() {
			n++
			f := write(t, filepath.Join(d, typ+".json"), string(g.Each(shapegen.Options{})[typ]), 0o600)
			var rep struct {
				Outcome shapes.Outcome `json:"outcome"`
				Refused string         `json:"refused"`
				Lines   []shapes.Line  `json:"lines"`
			}
			was := treeOf(t, state)
			_, out, errs := run("plan", "--json", "--state", state, f)
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("plan of a %s: %v\n%s\n%s", typ, err, out, errs)
			}
			if now := treeOf(t, state); now != was {
				t.Errorf("the plan of a %s changed the state:\nbefore:\n%s\nafter:\n%s", typ, was, now)
			}
			if rep.Outcome == shapes.Refused && !strings.Contains(rep.Refused, "resource base.r0") {
				t.Errorf("plan of a valid %s refused without naming it: %s", typ, rep.Refused)
			}
			_, out, errs = run("apply", "--json", "--partial", "--state", state, f)
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("apply of a %s: %v\n%s\n%s", typ, err, out, errs)
			}
			want, does := partialDoes[typ]
			switch {
			case !does && (rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, typ)):
				t.Errorf("a partial host took a %s: %s", typ, out)
			case does && (len(rep.Lines) == 0 || rep.Lines[0].Type != typ || rep.Lines[0].Outcome != want):
				t.Errorf("%s on a partial host: want its line %s\n%s", typ, want, out)
			}
		}
	}
	if n != 2*len(shapes.TypeNames()) {
		t.Fatalf("%d files for %d shapes", n, len(shapes.TypeNames()))
	}
}

// treeOf is every entry under dir, its mode and content, in order: what a
// plan must leave as it found it. A dir not there is "".
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		fmt.Fprintf(&b, "%s %v %d\n", p, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "%x\n", sha256.Sum256(data))
		}
		return nil
	})
	return b.String()
}
