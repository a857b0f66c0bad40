package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mesh-control run by someone who may not read the key directory says
// so, naming the file or directory in the way, whose it is and its mode —
// not "run init", which would send the operator to make new keys over
// the ones there. A directory with no keys still says run init.
func TestControlNamesAnUnreadableKey(t *testing.T) {
	m := newMeshDirs(t) // init as root: the directory root's 0700, the keys root's 0600
	const nobody = 65534
	empty := filepath.Join(m.base, "empty")
	os.Mkdir(empty, 0o755)
	asNobody := func(args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "mesh-control"), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String()
	}
	key := filepath.Join(m.ctl, "control.key")
	for _, c := range []struct {
		name    string
		dirMode os.FileMode
		args    []string
		want    string
	}{
		{"the directory closed", 0o700, []string{"nodes", "--dir", m.ctl},
			"mesh-control nodes: cannot read " + key + ": permission denied (" + m.ctl + " is root's, mode 0700; run as its owner)"},
		{"the key closed", 0o755, []string{"nodes", "--dir", m.ctl},
			"mesh-control nodes: cannot read " + key + ": permission denied (it is root's, mode 0600; run as its owner)"},
		{"token issue, the key closed", 0o755, []string{"token", "issue", "--new", "--dir", m.ctl},
			"mesh-control token issue: cannot read " + key + ": permission denied (it is root's, mode 0600; run as its owner)"},
		{"serve, the directory closed", 0o700, []string{"serve", "--dir", m.ctl},
			"mesh-control serve: cannot open " + m.ctl + ": permission denied (it is root's, mode 0700; run as its owner)"},
		{"serve, the directory read-only to it", 0o755, []string{"serve", "--dir", m.ctl},
			"mesh-control serve: cannot write in " + m.ctl + ": permission denied (it is root's, mode 0755; run as its owner)"},
		{"no keys at all", 0o700, []string{"nodes", "--dir", empty},
			"run mesh-control init --dir " + empty},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Chmod(m.ctl, c.dirMode)
			code, out := asNobody(c.args...)
			if code != 1 || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want 1 saying %q:\n%s", code, c.want, out)
			}
			if c.want != "" && !strings.Contains(c.want, "run mesh-control init") && strings.Contains(out, "init") {
				t.Fatalf("sends the operator to init over existing keys:\n%s", out)
			}
		})
	}
	// Nothing was made or changed in the directory by the refused.
	entries, _ := os.ReadDir(m.ctl)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("a refused command left %s behind", e.Name())
		}
	}
}
