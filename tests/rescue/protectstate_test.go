package rescue

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A rescue file is held to the protected set of the executor that runs
// it: its own state directory, wherever --state puts it, is refused —
// apply and plan alike — and the journal is left as it was. Each command
// is its own process, as at the machine: the file is read before the
// store, and so before the state directory is known to be the host's.
func TestARescueFileCannotWriteIntoTheStateItRunsWith(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := rootDir(t)
	state := filepath.Join(d, "state")
	doc := func(name, path string) string {
		p := filepath.Join(d, name)
		if err := os.WriteFile(p, []byte(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"`+path+`","content":"x\n"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if r, err := runExecutor(ctx, "apply", "--state", state, doc("ok.json", filepath.Join(d, "motd"))); err != nil || r.exit != 0 {
		t.Fatalf("apply: %v %d\n%s%s", err, r.exit, r.stdout, r.stderr)
	}
	journal := filepath.Join(state, "journal")
	before, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	into := doc("into.json", journal)
	for _, cmd := range []string{"plan", "apply"} {
		r, err := runExecutor(ctx, cmd, "--state", state, into)
		if err != nil || r.exit != 2 || !strings.Contains(string(r.stdout), "is inside the running host's state directory "+state) {
			t.Errorf("%s of a file in the state directory: %v exit %d\n%s%s", cmd, err, r.exit, r.stdout, r.stderr)
		}
	}
	if after, _ := os.ReadFile(journal); !bytes.Equal(after, before) {
		t.Fatalf("the journal changed:\n%s", after)
	}
}
