package rescue

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The read-only commands look and create nothing: on a machine where the
// executor never ran, its state directory is not made by looking at it
// (nor its parent, nor originals/, nor a lock file), and each says there
// is no state yet.
func TestReadOnlyCommandsCreateNothing(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	parent := filepath.Join(base, "var-lib-mesh-host")
	state := filepath.Join(parent, "executor")
	decl := writeDecl(t, base, "decl.json", declaration{Version: 1, Resources: []resource{fileRes("m", "f", filepath.Join(base, "out"), "x\n", "0644")}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		args []string
		says string // "" for a command that reads no state
	}{
		{[]string{"status"}, "no state yet: " + state + " does not exist"},
		{[]string{"status", "--json"}, `"no_state": true`},
		{[]string{"owned"}, "no state yet"},
		{[]string{"owned", "--json"}, "[]"},
		{[]string{"briefing"}, "no state yet"},
		{[]string{"inventory"}, "no state yet"},
		{[]string{"plan", decl}, "no state yet"},
		{[]string{"plan", "--json", decl}, `"outcome":"applied"`},
		{[]string{"profile"}, ""},
		{[]string{"enrol", "--cancel"}, "nothing to cancel"},
	} {
		res, err := runExecutor(ctx, append(tc.args[:1:1], append([]string{"--state", state}, tc.args[1:]...)...)...)
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.stdout) + string(res.stderr)
		if res.exit != 0 || !strings.Contains(out, tc.says) {
			t.Errorf("%v: exit %d, want 0 and %q:\n%s", tc.args, res.exit, tc.says, out)
		}
		if _, err := os.Lstat(parent); !os.IsNotExist(err) {
			t.Fatalf("%v created %s (or its state below it): %v", tc.args, parent, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(base, "out")); !os.IsNotExist(err) {
		t.Fatal("plan wrote the file it planned")
	}
	// doctor looks too: with no daemon it fails its check of the daemon
	// (exit 1), and makes nothing either.
	for _, args := range [][]string{{"doctor"}, {"doctor", "--json"}} {
		res, err := runExecutor(ctx, append(args[:1:1], append([]string{"--state", state, "--socket", filepath.Join(base, "run", "executor.sock")}, args[1:]...)...)...)
		if err != nil {
			t.Fatal(err)
		}
		if res.exit != 1 || !strings.Contains(string(res.stdout), "daemon") {
			t.Errorf("%v: exit %d, want 1 and the daemon's check:\n%s%s", args, res.exit, res.stdout, res.stderr)
		}
		for _, p := range []string{parent, filepath.Join(base, "run")} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Fatalf("%v created %s: %v", args, p, err)
			}
		}
	}
}

// Run by anyone but root, the commands that read the executor's state say
// they need root, naming the state and what it is; they do not fail on the
// first directory they may not read, never crash on a path they cannot
// look at (under a directory closed to them, through a file), and create
// nothing.
func TestStateCommandsSayTheyNeedRoot(t *testing.T) {
	needRoot(t)
	base := rootDir(t)
	existing := filepath.Join(base, "executor")
	if err := os.Mkdir(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(base, "missing", "executor")
	file := filepath.Join(base, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(base, "own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(own, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := os.Chown(own, attackerUID, attackerGID); err != nil {
		t.Fatal(err)
	}
	for state, is := range map[string]string{
		existing:                         "which the executor keeps root's, mode 0700",
		missing:                          "which does not exist yet",
		filepath.Join(existing, "state"): "which the executor keeps root's, mode 0700", // closed to the user
		filepath.Join(file, "state"):     "which the executor keeps root's, mode 0700", // through a file
		own:                              fmt.Sprintf("uid %d's here, mode 0755", attackerUID),
	} {
		for _, cmd := range []string{"status", "owned", "briefing", "doctor"} {
			c := exec.Command(executorBin, cmd, "--state", state)
			c.Dir = "/"
			c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: attackerUID, Gid: attackerGID}}
			var out bytes.Buffer
			c.Stdout, c.Stderr = &out, &out
			err := c.Run()
			want := "mesh-executor: " + cmd + ": needs root: it reads the executor's state in " + state + ", " + is
			if err == nil || !strings.Contains(out.String(), want) || strings.Contains(out.String(), "permission denied") || strings.Contains(out.String(), "panic") {
				t.Errorf("%s as uid %d on %s: %v\n%s\nwant %q", cmd, attackerUID, state, err, out.String(), want)
			}
		}
	}
	if _, err := os.Lstat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Fatalf("a stranger's status created %s: %v", filepath.Dir(missing), err)
	}
}
