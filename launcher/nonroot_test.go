package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mesh-launch started by someone other than root refuses at once, saying
// why, and makes nothing: it tried to add the agent's user, take its
// state directory's lock and start the executor, each failing, for ever.
// Its status still answers.
func TestNotRootIsRefusedAtOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs mesh-launch as nobody: it needs root to do so")
	}
	bin := buildMeshLaunch(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	os.Chmod(filepath.Dir(bin), 0o755)
	state := filepath.Join(dir, "state")
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		timer := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := run("--state", state)
	if code != 1 || !strings.Contains(out, "mesh-launch: runs as root (uid 65534 here)") {
		t.Fatalf("as nobody: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("it made %s: %v", state, err)
	}
	if out, code := run("status", "--state", state); code == 2 || strings.Contains(out, "runs as root") {
		t.Fatalf("status as nobody: exit %d\n%s", code, out)
	}
}
