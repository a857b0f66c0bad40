package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The read-only commands run by another user say they need root, and
// what the state directory named is — never a crash, whatever the path:
// one under a directory the user may not enter, one through a file, one
// missing, one the user owns.
func TestReadOnlyCommandsAsAnotherUserSayTheyNeedRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs mesh-executor as nobody: it needs root to do so")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755) // the test's own temporary directory: nobody runs the binary in it
	bin := filepath.Join(dir, "mesh-executor")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/mesh-executor")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	closed := filepath.Join(dir, "closed")
	os.Mkdir(closed, 0o700)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	own := filepath.Join(dir, "own")
	os.Mkdir(own, 0o755)
	os.Chown(own, 65534, 65534)
	for state, says := range map[string]string{
		filepath.Join(closed, "state"): "keeps root's, mode 0700",
		filepath.Join(file, "state"):   "keeps root's, mode 0700",
		filepath.Join(dir, "missing"):  "does not exist yet",
		own:                            "uid 65534's here",
	} {
		for _, cmd := range []string{"status", "owned", "doctor"} {
			c := exec.Command(bin, cmd, "--state", state)
			c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			timer := time.AfterFunc(20*time.Second, func() { c.Process.Kill() })
			out, _ := c.CombinedOutput()
			timer.Stop()
			if code := c.ProcessState.ExitCode(); code == 0 || !strings.Contains(string(out), "needs root") || !strings.Contains(string(out), says) || strings.Contains(string(out), "panic") {
				t.Errorf("%s --state %s as nobody: exit %d\n%s", cmd, state, code, out)
			}
		}
	}
}
