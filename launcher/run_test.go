package launcher

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func sha(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// A release that fails at once: MaxStarts starts, then one reinstall of the
// known-good copy through the package manager (a stub that records and
// copies), then the known-good copy fails MaxStarts times too, and the
// launcher halts, says the machine is the problem, and stays up idle.
func TestRollbackThenHalt(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "bad", "", 1)
	l.script(filepath.Join(l.kg, "mesh-executor"), "good", "", 1)
	r := start(t, l.config())
	waitFor(t, "the halt", 10*time.Second, func() bool { s, _ := ReadState(l.state); return s.Halted != nil })

	if got, want := strings.Join(l.lines(), " "), "bad bad bad good good good"; got != want {
		t.Errorf("starts: %q, want %q", got, want)
	}
	if rs := l.reinstalls(); len(rs) != 1 || !strings.Contains(rs[0], l.kg+" -> map[mesh-executor:"+l.installed+"]") {
		t.Errorf("the package manager was asked %q; want one reinstall from %s", rs, l.kg)
	}
	s := readState(t, l.state)
	if s.RolledBack == nil || !s.RolledBack.Reinstalled {
		t.Errorf("rolled_back = %+v, want a finished rollback", s.RolledBack)
	}
	if !strings.Contains(s.Halted.Reason, "the machine is the problem") {
		t.Errorf("halt reason %q does not say the machine is the problem", s.Halted.Reason)
	}
	if s.KnownGoodDir != l.kg {
		t.Errorf("known_good_dir = %q, want %q", s.KnownGoodDir, l.kg)
	}

	// Halted: up, idle, and saying so.
	r.alive(500 * time.Millisecond)
	if n := len(l.lines()); n != 6 {
		t.Errorf("%d starts after the halt, want none", n-6)
	}
	if logs := l.logs.String(); !strings.Contains(logs, "halted; starting nothing") || !strings.Contains(logs, "the machine is the problem") {
		t.Errorf("the launcher does not say it is halted:\n%s", logs)
	}
	if n := strings.Count(l.logs.String(), "halted; starting nothing"); n != 1 {
		t.Errorf("the idle launcher said it is halted %d times; once is enough", n)
	}
	// And says it where the agent can read it, to report upward.
	n, err := ReadNotice(l.config().Notice)
	if err != nil || n == nil || !n.Halted || !strings.Contains(n.Reason, "the machine is the problem") {
		t.Errorf("the notice for the agent: %+v %v", n, err)
	}
	r.stop(5 * time.Second)
}

// The known-good copy comes up and reconciles: Healthy clears the counter
// and the rolled_back mark and keeps what runs as known good. Cancel stops
// the executor with SIGTERM, which it gets and exits on.
func TestRollbackToHealthyKnownGood(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "bad", "", 1)
	l.script(filepath.Join(l.kg, "mesh-executor"), "good", "healthy-serve", 0)
	good := sha(t, filepath.Join(l.kg, "mesh-executor"))
	r := start(t, l.config())
	waitFor(t, "the known-good executor serving", 10*time.Second, func() bool { return slices.Contains(l.lines(), "serving") })

	if got, want := strings.Join(l.lines(), " "), "bad bad bad good serving"; got != want {
		t.Errorf("log: %q, want %q", got, want)
	}
	s := readState(t, l.state)
	if s.RolledBack != nil || len(s.Starts) != 0 || s.Halted != nil || s.HealthyAt.IsZero() {
		t.Errorf("after a healthy reconcile: %+v; want no mark, no starts, healthy_at set", s)
	}
	if s.KnownGood == nil || s.KnownGood.Binaries["mesh-executor"] != good {
		t.Errorf("known_good = %+v, want mesh-executor %s", s.KnownGood, good)
	}
	if got := sha(t, l.installed); got != good {
		t.Error("the installed executor is not the known-good copy")
	}
	if took := r.stop(5 * time.Second); took > 3*time.Second {
		t.Errorf("stopping took %v: the executor did not get SIGTERM", took)
	}
	if !slices.Contains(l.lines(), "term") {
		t.Error("the executor did not get SIGTERM")
	}
}

// A clean exit is restarted at once (no backoff: that is how an upgrade
// restarts onto the new binary), and an executor that reconciles before
// each exit clears the counter, so an upgrade loop never trips the
// rollback.
func TestCleanExitRestartsAtOnce(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "healthy-exit", 0, "STUB_CODE=0")
	cfg := l.config()
	cfg.Backoff = time.Hour
	r := start(t, cfg)
	waitFor(t, "ten clean restarts", 10*time.Second, func() bool { return len(l.lines()) >= 10 })
	r.stop(5 * time.Second)
	if rs := l.reinstalls(); len(rs) != 0 {
		t.Errorf("rolled back %d times; an executor that reconciles never is", len(rs))
	}
	s := readState(t, l.state)
	if s.RolledBack != nil || s.Halted != nil || len(s.Starts) > 1 {
		t.Errorf("state after clean restarts: %+v", s)
	}
}

// A clean exit still counts as a start: an executor that exits 0 at once
// without ever reconciling trips the rollback, then the halt.
func TestCleanExitWithoutReconcileCounts(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "quits", "", 0)
	l.script(filepath.Join(l.kg, "mesh-executor"), "quits-too", "", 0)
	cfg := l.config()
	cfg.Backoff = time.Hour
	r := start(t, cfg)
	waitFor(t, "the halt", 10*time.Second, func() bool { s, _ := ReadState(l.state); return s.Halted != nil })
	if got, want := strings.Join(l.lines(), " "), "quits quits quits quits-too quits-too quits-too"; got != want {
		t.Errorf("starts: %q, want %q", got, want)
	}
	r.alive(200 * time.Millisecond)
	r.stop(5 * time.Second)
}

// A halt survives the launcher: a new Run on the same state stays idle.
// `mesh-launch status` says why; `mesh-launch clear` clears it, and the
// idle launcher resumes — and, the rolled_back mark kept, halts again
// after MaxStarts rather than "rolling back" to what just failed.
func TestHaltSurvivesRestartAndClear(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "bad", "", 1)
	l.script(filepath.Join(l.kg, "mesh-executor"), "good", "", 1)
	r := start(t, l.config())
	waitFor(t, "the halt", 10*time.Second, func() bool { s, _ := ReadState(l.state); return s.Halted != nil })
	r.stop(5 * time.Second)

	l.logs = &syncBuffer{}
	r = start(t, l.config())
	r.alive(400 * time.Millisecond)
	if n := len(l.lines()); n != 6 {
		t.Fatalf("a restarted launcher started the executor of a halted node (%d starts)", n-6)
	}
	if !strings.Contains(l.logs.String(), "halted; starting nothing") {
		t.Errorf("the restarted launcher does not say it is halted:\n%s", l.logs)
	}

	bin := buildMeshLaunch(t)
	out, err := exec.Command(bin, "status", "--state", l.state).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "halted: yes") || !strings.Contains(string(out), "the machine is the problem") ||
		!strings.Contains(string(out), "rolled back: yes") {
		t.Errorf("mesh-launch status: %v\n%s", err, out)
	}
	cleared := time.Now()
	if out, err := exec.Command(bin, "clear", "--state", l.state).CombinedOutput(); err != nil {
		t.Fatalf("mesh-launch clear: %v\n%s", err, out)
	}
	// The idle launcher may have resumed already and started the
	// executor again: a start since the clear is its, not one kept.
	s := readState(t, l.state)
	kept := slices.ContainsFunc(s.Starts, func(at time.Time) bool { return at.Before(cleared) })
	if (s.Halted != nil && s.Halted.At.Before(cleared)) || kept || s.RolledBack == nil {
		t.Errorf("after clear: %+v; want no halt, no start from before it, the mark kept", s)
	}
	waitFor(t, "the launcher to resume and halt again", 10*time.Second, func() bool {
		s, _ := ReadState(l.state)
		return s.Halted != nil && len(l.lines()) > 6
	})
	if got := strings.Join(l.lines()[6:], " "); got != "good good good" {
		t.Errorf("after clear: %q, want three starts of what is installed, no second rollback", got)
	}
	if rs := l.reinstalls(); len(rs) != 1 {
		t.Errorf("%d reinstalls; the launcher rolls back once", len(rs))
	}
	r.alive(100 * time.Millisecond)
	r.stop(5 * time.Second)
}

// mesh-launch itself: it runs the executor with the arguments after --,
// and SIGTERM stops the executor and exits 0.
func TestMeshLaunchStopsOnSIGTERM(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "healthy-serve", 0)
	bin := buildMeshLaunch(t)
	cmd := exec.Command(bin, "--state", l.state, "--executor", l.installed, "--known-good", l.kg, "--agent-user=", "--notice=", "--", "serve", "--x")
	cmd.Stdout, cmd.Stderr = l.out, l.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, "the executor serving", 10*time.Second, func() bool { return slices.Contains(l.lines(), "serving") })
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("mesh-launch after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("mesh-launch did not exit on SIGTERM")
	}
	if !slices.Contains(l.lines(), "term") {
		t.Error("the executor was not stopped with SIGTERM")
	}
	if s := readState(t, l.state); s.KnownGoodDir != l.kg || s.KnownGood == nil {
		t.Errorf("state: %+v; want the known-good dir recorded and used by Healthy", s)
	}
	if _, err := os.Stat(filepath.Join(l.kg, "mesh-executor")); err != nil {
		t.Errorf("Healthy did not keep the executor in --known-good: %v", err)
	}
}

// An executor that ignores SIGTERM is killed after StopTimeout; it ran in
// its own process group.
func TestStopEscalatesToSIGKILL(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "ignore-term", 0)
	cfg := l.config()
	cfg.StopTimeout = 300 * time.Millisecond
	r := start(t, cfg)
	var pid int
	waitFor(t, "the executor", 10*time.Second, func() bool {
		data, _ := os.ReadFile(l.log)
		for _, ln := range strings.Split(string(data), "\n") {
			if f := strings.Fields(ln); len(f) == 2 && f[0] == "ready" {
				pid = atoi(f[1])
				return true
			}
		}
		return false
	})
	if pg, err := unix.Getpgid(pid); err != nil || pg != pid {
		t.Errorf("the executor's process group is %d (%v), want its own (%d)", pg, err, pid)
	}
	took := r.stop(5 * time.Second)
	if took < 300*time.Millisecond {
		t.Errorf("Run returned after %v, before StopTimeout", took)
	}
	if err := unix.Kill(pid, 0); err != unix.ESRCH {
		t.Errorf("the executor (pid %d) is still there: %v", pid, err)
	}
	if !strings.Contains(l.logs.String(), "killing it") {
		t.Errorf("the launcher does not say it killed the executor:\n%s", l.logs)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// A launch state someone else owns is refused, and the launcher stays up
// idle, saying why, rather than start uncounted.
func TestForeignStateStaysIdle(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "", 1)
	os.Mkdir(l.state, 0o700)
	p := filepath.Join(l.state, StateFile)
	os.WriteFile(p, []byte("{}"), 0o600)
	if err := os.Chown(p, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	r := start(t, l.config())
	r.alive(300 * time.Millisecond)
	if n := len(l.lines()); n != 0 {
		t.Errorf("started the executor %d times without a usable state", n)
	}
	if logs := l.logs.String(); !strings.Contains(logs, "cannot use the launch state") || !strings.Contains(logs, "uid 12345") {
		t.Errorf("the launcher does not say why it is idle:\n%s", logs)
	}
	r.stop(5 * time.Second)
}

// A reinstall that fails (no known-good copy: the executor never
// reconciled here) halts at once, saying why, and reverts the unfinished
// mark; after a clear the installed binary gets its MaxStarts again, then
// the rollback is tried again.
func TestFailedReinstallHalts(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "bad", "", 1)
	r := start(t, l.config())
	waitFor(t, "the halt", 10*time.Second, func() bool { s, _ := ReadState(l.state); return s.Halted != nil })
	s := readState(t, l.state)
	if !strings.Contains(s.Halted.Reason, "rollback to the known-good copy") || !strings.Contains(s.Halted.Reason, "no known-good copy") {
		t.Errorf("halt reason %q does not say the rollback failed and why", s.Halted.Reason)
	}
	if s.RolledBack != nil {
		t.Errorf("rolled_back = %+v after a reinstall that failed; the mark is reverted", s.RolledBack)
	}
	if len(s.Starts) != 0 {
		t.Errorf("starts %v after a reinstall that failed: the rollback's start never came", s.Starts)
	}
	if got := strings.Join(l.lines(), " "); got != "bad bad bad" {
		t.Errorf("starts: %q; nothing starts after a failed reinstall", got)
	}
	r.alive(200 * time.Millisecond)
	if err := Clear(l.state); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second halt", 10*time.Second, func() bool {
		s, _ := ReadState(l.state)
		return s.Halted != nil && len(l.lines()) == 6
	})
	if rs := l.reinstalls(); len(rs) != 2 {
		t.Errorf("%d reinstalls, want one before the clear and one after", len(rs))
	}
	r.stop(5 * time.Second)
}

// A launcher with no executor to start and none to roll back to refuses
// at once, naming both, and makes, counts and starts nothing: the halt it
// would count its way to would outlive the mistake.
func TestNoExecutorAndNoKnownGoodIsRefusedBeforeAnythingIsMade(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	for _, exe := range []string{filepath.Join(dir, "nope"), dir} {
		err := Run(t.Context(), Config{StateDir: state, Executor: exe, AgentUser: ""})
		if err == nil || !strings.Contains(err.Error(), exe) || !strings.Contains(err.Error(), filepath.Join(state, KnownGoodDir, "mesh-executor")) {
			t.Fatalf("executor %s: %v", exe, err)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Fatalf("executor %s: the state directory was made: %v", exe, err)
		}
	}
}

// status of a directory that is not there says so, rather than reading
// it as a launcher that never started; of one it may not read, whose it is.
func TestStatusOfNoStateDirectorySaysSo(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	var out, errb strings.Builder
	if code := Main([]string{"status", "--state", missing}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "no state directory "+missing) || out.Len() != 0 {
		t.Fatalf("status --state %s: exit %d\n%s%s", missing, code, out.String(), errb.String())
	}
	dir := t.TempDir()
	if code := Main([]string{"status", "--state", dir}, &out, &errb); code != 0 || !strings.Contains(out.String(), "starts: 0") {
		t.Fatalf("status of a directory with no launch state yet: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// A bare executor name is looked for on the PATH, as the start looks.
func TestRunnableLooksABareNameUpOnThePath(t *testing.T) {
	if err := runnable("sh"); err != nil {
		t.Errorf("sh: %v", err)
	}
	if err := runnable("no-such-program-here"); err == nil {
		t.Error("a name on no PATH taken for a program")
	}
	if err := runnable(t.TempDir()); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory: %v", err)
	}
}

// A second SIGTERM (or SIGINT) does not wait out the stop timeout: the
// executor, which ignores the first, is killed at once and mesh-launch
// exits.
func TestMeshLaunchStopsAtOnceWhenAskedTwice(t *testing.T) {
	l := newLab(t)
	l.script(l.installed, "up", "ignore-term", 0)
	bin := buildMeshLaunch(t)
	cmd := exec.Command(bin, "--state", l.state, "--executor", l.installed, "--known-good", l.kg, "--agent-user=", "--notice=", "--stop-timeout", "10m", "--", "serve")
	cmd.Stdout, cmd.Stderr = l.out, l.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, "the executor", 10*time.Second, func() bool {
		data, _ := os.ReadFile(l.log)
		return strings.Contains(string(data), "ready")
	})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(200 * time.Millisecond) // the first, taken: the executor ignores it
	select {
	case err := <-done:
		t.Fatalf("mesh-launch exited before its executor stopped: %v", err)
	default:
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("mesh-launch waited out the stop timeout after a second signal")
	}
}

// A count or a time of the command line that cannot be one (0 or below)
// is refused as written (exit 2), not taken for the default, nor said by
// the field's name; nothing is started.
func TestMeshLaunchRefusesANonsenseCountOrTime(t *testing.T) {
	bin := buildMeshLaunch(t)
	for args, want := range map[string]string{
		"--max-starts=-1":  "mesh-launch: --max-starts -1: at least 1",
		"--max-starts=0":   "mesh-launch: --max-starts 0: at least 1",
		"--stop-timeout=0": "mesh-launch: --stop-timeout 0s: more than zero",
		"--window=-5m":     "mesh-launch: --window -5m0s: more than zero",
	} {
		out, err := exec.Command(bin, args, "--state", t.TempDir()).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
			t.Errorf("%s: %v\n%s\nwant exit 2 and %q", args, err, out, want)
		}
	}
}
