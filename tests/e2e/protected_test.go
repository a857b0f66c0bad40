package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A rescue apply, a process of its own, refuses where the daemon of its
// state runs from as the daemon itself does — its socket's directory and
// the agent's state wherever the daemon was told they are — and not only
// its own state and the places an installation uses. A path beside them
// applies.
func TestARescueFileIsRefusedWhereTheDaemonRuns(t *testing.T) {
	m := newMeshDirs(t)
	agent := filepath.Join(m.base, "elsewhere", "agent")
	os.MkdirAll(agent, 0o700)
	m.startExecutor("--agent-state", agent)
	f := filepath.Join(m.base, "rescue.json")
	rescue := func(cmd, path string) (string, error) {
		os.WriteFile(f, []byte(fmt.Sprintf(`{"version":1,"resources":[{"module":"fix","id":"planted","type":"file","path":%q,"content":"x\n"}]}`, path)), 0o600)
		out, err := exec.Command(filepath.Join(bin, "mesh-executor"), cmd, "--state", m.state, f).CombinedOutput()
		return string(out), err
	}
	for _, p := range []string{filepath.Join(agent, "planted"), filepath.Join(filepath.Dir(m.sock), "planted")} {
		for _, cmd := range []string{"plan", "apply"} {
			if out, err := rescue(cmd, p); err == nil || !strings.Contains(out, "protected set") {
				t.Errorf("%s of %s: %v\n%s", cmd, p, err, out)
			}
			if _, err := os.Lstat(p); err == nil {
				t.Fatalf("%s wrote %s", cmd, p)
			}
		}
	}
	if out, err := rescue("apply", filepath.Join(m.tree, "planted")); err != nil {
		t.Fatalf("apply beside them: %v\n%s", err, out)
	}
}
