package launcher

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A second launcher on the same state directory is refused by name
// before it counts a start or starts an executor: counted in the running
// launcher's state, its failed starts would have rolled the node back at
// the next ordinary restart. It exits non-zero, naming the holder's pid
// and the directory; the running one goes on untouched; and once the
// first is gone, its lock is too.
func TestSecondLauncherIsRefused(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "healthy-serve", 0)
	r := start(t, l.config())
	waitFor(t, "the first launcher's executor serving", 10*time.Second, func() bool { return slices.Contains(l.lines(), "serving") })
	before := readState(t, l.state)

	bin := buildMeshLaunch(t)
	second := exec.Command(bin, "--state", l.state, "--executor", l.installed, "--known-good", l.kg,
		"--agent-user=", "--notice=", "--max-starts", "3", "--backoff", "10ms")
	var out bytes.Buffer
	second.Stdout, second.Stderr = &out, &out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		second.Process.Kill()
		<-done
		t.Fatalf("a second mesh-launch on %s was not refused: it ran on (killed)\nlauncher log: %s\nits output:\n%s\nstarts: %v",
			l.state, l.logs, out.String(), l.lines())
	}
	want := "refused: another mesh-launch (pid " + strconv.Itoa(os.Getpid()) + ") holds " + l.state
	if code := second.ProcessState.ExitCode(); code == 0 || !strings.Contains(out.String(), want) {
		t.Errorf("the second mesh-launch: exit %d\n%s\nwant a non-zero exit saying %q", code, out.String(), want)
	}
	if got := strings.Join(l.lines(), " "); got != "up serving" {
		t.Errorf("executor log %q: the refused launcher started one", got)
	}
	after := readState(t, l.state)
	if len(after.Starts) != len(before.Starts) || after.RolledBack != nil || after.Halted != nil {
		t.Errorf("the refused launcher changed the launch state: %+v, was %+v", after, before)
	}
	r.alive(100 * time.Millisecond)

	// The first one gone, so is its lock: the next launcher supervises.
	r.stop(5 * time.Second)
	r = start(t, l.config())
	waitFor(t, "the next launcher's executor serving", 10*time.Second, func() bool { return count(l.lines(), "serving") == 2 })
	r.stop(5 * time.Second)
}

// The supervising launcher's lock is opened without following a link: a
// link planted in its place steers nothing, and the launcher says what is
// wrong rather than start an executor it cannot count alone.
func TestRunLockIsNotALink(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "", 1)
	if err := os.Mkdir(l.state, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(l.dir, "elsewhere")
	if err := os.Symlink(target, filepath.Join(l.state, RunLockFile)); err != nil {
		t.Fatal(err)
	}
	r := start(t, l.config())
	r.alive(300 * time.Millisecond)
	if n := len(l.lines()); n != 0 {
		t.Errorf("started the executor %d times without its lock", n)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the lock's open followed the link: %v", err)
	}
	if logs := l.logs.String(); !strings.Contains(logs, RunLockFile) || !strings.Contains(logs, "symbolic link") {
		t.Errorf("the launcher does not say its lock is a link:\n%s", logs)
	}
	r.stop(5 * time.Second)
}

// After a rollback to a known-good release that reconciles, the rollback
// mark is cleared (so a later release may be rolled back once in its
// turn), but the node was rolled back: status says so, when and why,
// rather than "rolled back: no".
func TestStatusAfterRollbackToHealthy(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "bad", "", 1)
	l.script(filepath.Join(l.kg, "mesh-executor"), "good", "healthy-serve", 0)
	r := start(t, l.config())
	waitFor(t, "the known-good executor serving", 10*time.Second, func() bool { return slices.Contains(l.lines(), "serving") })
	// Whether a launcher runs is said (a stopped one's status read as a
	// healthy one's).
	out, err := exec.Command(buildMeshLaunch(t), "status", "--state", l.state).CombinedOutput()
	if want := fmt.Sprintf("launcher: running (pid %d)", os.Getpid()); err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("mesh-launch status, the launcher running: %v\n%s\nwant %q", err, out, want)
	}
	r.stop(5 * time.Second)

	out, err = exec.Command(buildMeshLaunch(t), "status", "--state", l.state).CombinedOutput()
	if err != nil {
		t.Fatalf("mesh-launch status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "launcher: not running") {
		t.Errorf("mesh-launch status, no launcher running:\n%s", out)
	}
	if !strings.Contains(string(out), "rolled back: yes") || !strings.Contains(string(out), "3 starts within") ||
		!strings.Contains(string(out), "reconciled since") {
		t.Errorf("mesh-launch status after a rollback to a release that reconciled:\n%s\nwant \"rolled back: yes\", the reason, and that it reconciled since", out)
	}
	if s := readState(t, l.state); s.RolledBack != nil {
		t.Errorf("rolled_back = %+v after the known-good release reconciled; the mark is cleared", s.RolledBack)
	}
}

// An executor this launcher did not start holds the state (started by
// hand while the launcher's was down): the launcher starts nothing and
// counts nothing while it does — each start refused by the executor's own
// lock, counted, rolled the node back and then halted it, "the machine is
// the problem" — says so once, and starts its executor once the other
// has ended.
func TestAnotherExecutorHoldingTheStateIsWaitedFor(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "healthy-serve", 0)
	if err := os.Mkdir(l.state, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(l.state, ExecutorServeLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	r := start(t, l.config())
	waitFor(t, "the launcher to say another executor holds the state", 10*time.Second, func() bool {
		return strings.Contains(l.logs.String(), "another mesh-executor serve holds the state directory")
	})
	r.alive(time.Second)
	if got := l.lines(); len(got) != 0 {
		t.Fatalf("the launcher started %v while another executor held the state", got)
	}
	if s, err := ReadState(l.state); err == nil && (len(s.Starts) != 0 || s.RolledBack != nil || s.Halted != nil) {
		t.Fatalf("the launch state while another executor held the state: %+v", s)
	}
	if n := strings.Count(l.logs.String(), "another mesh-executor serve holds"); n != 1 {
		t.Errorf("said %d times; once is enough", n)
	}
	f.Close()
	waitFor(t, "the launcher's executor, once the other ended", 10*time.Second, func() bool { return slices.Contains(l.lines(), "serving") })
	r.stop(5 * time.Second)
}
