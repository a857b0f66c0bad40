package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// Config is the launcher's configuration; the zero value of each field is
// its default.
type Config struct {
	// StateDir is the executor's state directory (DefaultStateDir), which
	// holds the launch state.
	StateDir string
	// Installed maps each of the host's binaries to its installed path
	// (DefaultInstalled): what a rollback reinstalls.
	Installed map[string]string
	// Executor is the program started (Installed["mesh-executor"]).
	Executor string
	// Args are its arguments (serve --state StateDir).
	Args []string
	// KnownGood is the directory of known-good copies, by name
	// (StateDir/known-good). The launcher records it in the launch state,
	// where Healthy finds it.
	KnownGood string
	// MaxStarts (5) within Window (10 min) without a healthy report trip
	// the rollback, then the halt.
	MaxStarts int
	Window    time.Duration
	// Backoff is the pause before restarting an executor that failed (2 s);
	// a clean exit is restarted at once.
	Backoff time.Duration
	// StopTimeout is how long the executor has to stop after SIGTERM before
	// SIGKILL (30 s).
	StopTimeout time.Duration
	// Hurry, once closed (a second SIGTERM or SIGINT), ends the wait for
	// the executor's stop: it is killed at once.
	Hurry <-chan struct{}
	// Poll is how often an idle launcher looks at the launch state again
	// (5 s), so `mesh-launch clear` resumes it.
	Poll time.Duration
	// Reinstall puts the known-good binaries back. When nil: through the
	// package manager if Packages and the known-good copy names its
	// package version, else (or when that fails) CopyReinstall. A test's
	// stub goes here.
	Reinstall func(ctx context.Context, knownGood string, installed map[string]string) error
	// Stdout and Stderr are passed to the executor (os.Stdout, os.Stderr).
	Stdout, Stderr *os.File
	// Log is where the launcher says what it does (slog.Default()).
	Log *slog.Logger
	// Packages lets a rollback reinstall the known-good release through the
	// package manager (falling back to copying the known-good binaries).
	Packages bool
	// Notice is where the launcher tells the agent it starts nothing
	// (halted, or its state unusable), and why ("" says nothing).
	Notice string
	// AgentUser and AgentState: the agent's account and state directory,
	// made before the first start when missing (a tarball install); an
	// empty AgentUser makes nothing.
	AgentUser, AgentState string
}

func (c Config) withDefaults() (Config, error) {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Installed == nil {
		c.Installed = DefaultInstalled()
	} else {
		c.Installed = maps.Clone(c.Installed)
	}
	if c.Executor == "" {
		c.Executor = c.Installed["mesh-executor"]
	}
	if c.Executor == "" {
		return c, errors.New("launcher: no executor to start (Config.Executor, or Installed[\"mesh-executor\"])")
	}
	if c.Args == nil {
		c.Args = []string{"serve", "--state", c.StateDir}
	}
	if c.KnownGood == "" {
		c.KnownGood = filepath.Join(c.StateDir, KnownGoodDir)
	}
	if !filepath.IsAbs(c.KnownGood) {
		return c, fmt.Errorf("launcher: the known-good directory %q is not absolute", c.KnownGood)
	}
	c.KnownGood = filepath.Clean(c.KnownGood)
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d < 0 {
			return fmt.Errorf("launcher: %s %v is negative", name, *d)
		}
		if *d == 0 {
			*d = v
		}
		return nil
	}
	if c.MaxStarts < 0 {
		return c, fmt.Errorf("launcher: MaxStarts %d is negative", c.MaxStarts)
	}
	if c.MaxStarts == 0 {
		c.MaxStarts = 5
	}
	for _, e := range []error{
		def(&c.Window, 10*time.Minute, "Window"),
		def(&c.Backoff, 2*time.Second, "Backoff"),
		def(&c.StopTimeout, 30*time.Second, "StopTimeout"),
		def(&c.Poll, 5*time.Second, "Poll"),
	} {
		if e != nil {
			return c, e
		}
	}

	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c, nil
}

// Run supervises the executor until ctx ends, by Decide's algorithm (see
// the package doc). It returns an error only for a Config it cannot use,
// at once, or a *HeldError when another launcher supervises StateDir;
// otherwise it never returns before ctx ends — halted, or unable to read
// or write its state, it says so and stays up idle, because an exit would
// only have the init start it again.
//
// A launcher refused for another one's lock does return, though the init
// may start it again (systemd's Restart=always, every RestartSec): each
// such start is refused before it counts or starts anything, and says
// again which pid holds the directory, which is what the operator needs to
// see; and once that one is stopped, the init's own launcher takes over by
// itself at its next start. Staying up idle instead would hide, behind a
// service that looks running, that it supervises nothing. When ctx ends it sends the
// executor's process group SIGTERM, waits up to StopTimeout, then SIGKILL,
// and returns nil.
//
// The executor runs in its own process group, with stdin /dev/null,
// Config.Stdout and Config.Stderr, and SIGTERM as its parent-death signal.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	// An executor that is not there, with no known-good copy to roll back
	// to, could only be counted to a halt — one that outlives the mistake
	// (a launcher started by hand, a wrong --executor) and blocks the real
	// install after it: refused before anything is made or counted. With
	// a known-good copy, its rollback is the launcher's work.
	if err := runnable(cfg.Executor); err != nil {
		kg := filepath.Join(cfg.KnownGood, "mesh-executor")
		st, _ := ReadState(cfg.StateDir) // makes nothing; missing reads as empty
		// The package manager puts back the installed path, not another
		// --executor names.
		byPackage := cfg.Packages && st.KnownGood != nil && st.KnownGood.Package != "" && cfg.Executor == cfg.Installed["mesh-executor"]
		if runnable(kg) != nil && !byPackage {
			return fmt.Errorf("launcher: no executor to start: %w, and no known-good copy at %s to roll back to; nothing was made, counted or started (--executor names another)", err, kg)
		}
	}
	l := &launcher{cfg: cfg, log: cfg.Log, policy: Policy{MaxStarts: cfg.MaxStarts, Window: cfg.Window}}
	// The lock before anything is made, counted or started. A state
	// directory that cannot be locked for another reason (not private, a
	// link planted as the lock) is said by the loop, which tries again.
	var held *HeldError
	if err := l.takeLock(); errors.As(err, &held) {
		return err
	}
	defer l.releaseLock()
	if cfg.AgentUser != "" {
		if made, err := EnsureAgentUser(ctx, cfg.AgentUser, cfg.AgentState); err != nil {
			l.log.Error("launcher: the agent's user: "+err.Error(), "user", cfg.AgentUser)
		} else if made {
			l.log.Info("launcher: made the agent's user and its state directory (a tarball install has no package to)", "user", cfg.AgentUser, "state", cfg.AgentState)
		}
	}
	return l.run(ctx)
}

// runnable says why p cannot be started as a program, if it cannot: as
// the start finds it (exec.LookPath: a bare name on the PATH, a path as it
// is, an executable file).
func runnable(p string) error {
	_, err := exec.LookPath(p)
	return err
}

type launcher struct {
	cfg    Config
	log    *slog.Logger
	policy Policy
	// said is the last idle reason logged, so an idle launcher says it once.
	said string
	// lock is RunLockFile, held open (lockRun) while this launcher runs.
	lock *os.File
}

// takeLock takes the state directory's launcher lock, making the
// directory first if it is missing.
func (l *launcher) takeLock() error {
	if err := checkDir(l.cfg.StateDir, true); err != nil {
		return err
	}
	f, err := lockRun(l.cfg.StateDir)
	if err != nil {
		return err
	}
	l.lock = f
	return nil
}

func (l *launcher) releaseLock() {
	if l.lock != nil {
		l.lock.Close()
		l.lock = nil
	}
}

func (l *launcher) run(ctx context.Context) error {
	for ctx.Err() == nil {
		if l.lock == nil {
			var held *HeldError
			if err := l.takeLock(); errors.As(err, &held) {
				return err
			} else if err != nil {
				l.idle(ctx, "cannot take the launcher's lock in the state directory; starting nothing until it can", err.Error())
				continue
			}
		}
		if held, pid := serveHeld(l.cfg.StateDir); held {
			l.othersServe(ctx, pid)
			continue
		}
		act, st, err := l.decide()
		if err != nil {
			l.idle(ctx, "cannot use the launch state; starting nothing until it can", err.Error())
			continue
		}
		switch act {
		case Idle:
			l.idle(ctx, "halted; starting nothing until a person runs mesh-launch clear", st.Halted.Reason)
			continue
		case Halt:
			l.log.Error("launcher: halting", "reason", st.Halted.Reason, "state", l.statePath())
			continue
		case Rollback:
			l.log.Warn("launcher: rolling back", "reason", st.RolledBack.Reason, "known_good", l.cfg.KnownGood)
			if l.cfg.Packages {
				// The release that failed, as the package manager names it:
				// the executor will not install it again.
				if v := PackageVersion(ctx); v != "" && (st.KnownGood == nil || st.KnownGood.Package != v) {
					update(l.cfg.StateDir, func(s *State) (bool, error) {
						s.Failed = &FailedRelease{Version: v, At: clock.Now().UTC(), Reason: st.RolledBack.Reason}
						return true, nil
					})
				}
			}
			if err := l.reinstall(ctx, st); err != nil {
				if ctx.Err() != nil {
					// Stopped mid-reinstall: the mark stays unfinished, and
					// the next launcher finishes it.
					return nil
				}
				if l.halt(fmt.Sprintf("the rollback to the known-good copy in %s failed: %v; a person has to look, then run mesh-launch clear", l.cfg.KnownGood, err)) != nil {
					// Unrecorded, the next round tries the reinstall
					// again: not in a tight loop.
					sleep(ctx, l.cfg.Backoff)
				}
				continue
			}
			if _, err := update(l.cfg.StateDir, func(s *State) (bool, error) {
				if s.RolledBack == nil {
					return false, nil
				}
				s.RolledBack.Reinstalled = true
				last := *s.RolledBack
				s.LastRollback = &last
				return true, nil
			}); err != nil {
				// The next decision reinstalls again, which is harmless.
				l.log.Warn("launcher: could not record the finished reinstall", "err", err)
			}
			l.log.Warn("launcher: reinstalled the known-good copy", "known_good", l.cfg.KnownGood)
		}
		if l.said != "" {
			l.notice("") // starting again
		}
		l.said = ""
		if ctx.Err() != nil {
			return nil
		}
		status, err := l.child(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			l.log.Error("launcher: the executor could not be started", "path", l.cfg.Executor, "err", err, "retry_in", l.cfg.Backoff)
			sleep(ctx, l.cfg.Backoff)
		case status.Success():
			l.log.Info("launcher: the executor exited cleanly; starting it again (an upgrade ends this way)")
		default:
			l.log.Warn("launcher: the executor failed", "status", status.String(), "retry_in", l.cfg.Backoff)
			sleep(ctx, l.cfg.Backoff)
		}
	}
	return nil
}

func (l *launcher) statePath() string { return filepath.Join(l.cfg.StateDir, StateFile) }

// decide reads the launch state under its lock, decides, and persists the
// decision (the counted start, the mark, the halt) before it is acted on.
func (l *launcher) decide() (Action, State, error) {
	if err := checkDir(l.cfg.StateDir, true); err != nil {
		return Idle, State{}, err
	}
	var act Action
	st, err := update(l.cfg.StateDir, func(s *State) (bool, error) {
		var next State
		act, next = Decide(*s, clock.Now(), l.policy)
		changed := act != Idle
		if next.KnownGoodDir != l.cfg.KnownGood {
			next.KnownGoodDir, changed = l.cfg.KnownGood, true
		}
		if exe, err := os.Executable(); err == nil && next.Launcher != exe {
			next.Launcher, changed = exe, true
		}
		*s = next
		return changed, nil
	})
	return act, st, err
}

// halt records the halt of a failed reinstall, and reverts the unfinished
// rollback mark with it: the switch did not happen, so after `mesh-launch
// clear` the installed binary gets its MaxStarts again before another
// rollback is tried, rather than the same reinstall failing at once.
func (l *launcher) halt(reason string) error {
	l.log.Error("launcher: halting", "reason", reason, "state", l.statePath())
	_, err := update(l.cfg.StateDir, func(s *State) (bool, error) {
		s.Halted = &Mark{At: clock.Now().UTC(), Reason: reason}
		if s.RolledBack != nil && !s.RolledBack.Reinstalled {
			// The rollback's start (Decide counts it as it decides) never
			// came: not said as one.
			s.RolledBack, s.Starts = nil, nil
		}
		return true, nil
	})
	if err != nil {
		l.log.Error("launcher: could not record the halt", "err", err)
	}
	return err
}

// othersServe waits while an executor this launcher did not start (one
// started by hand, or by a launcher before this one) holds the state: a
// start now would be refused, and each refusal counted toward a rollback
// and a halt the binary did not earn. It counts nothing and says so once a
// holder; the executor that holds the state serves the node meanwhile, so
// the agent is told nothing. Its end is looked for every second.
func (l *launcher) othersServe(ctx context.Context, pid int) {
	if msg := fmt.Sprintf("another executor holds %d", pid); l.said != msg {
		l.said = msg
		l.log.Warn("launcher: another mesh-executor serve holds the state directory, not started by this launcher; starting nothing and counting nothing until it ends", "pid", pid, "state", l.cfg.StateDir)
	}
	sleep(ctx, time.Second)
}

// idle says why once, then waits Poll (or until ctx ends).
func (l *launcher) idle(ctx context.Context, msg, reason string) {
	if l.said != msg+reason {
		l.said = msg + reason
		l.log.Error("launcher: "+msg, "reason", reason, "state", l.statePath())
		l.notice(msg + ": " + reason)
	}
	sleep(ctx, l.cfg.Poll)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// child starts the executor and waits for it, or stops it when ctx ends.
func (l *launcher) child(ctx context.Context) (*os.ProcessState, error) {
	// The parent-death signal follows the thread that forked: keep it for
	// the child's lifetime.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(l.cfg.Executor, l.cfg.Args...)
	cmd.Stdin = nil // /dev/null
	cmd.Stdout, cmd.Stderr = l.cfg.Stdout, l.cfg.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	l.log.Info("launcher: started the executor", "pid", pid, "path", l.cfg.Executor, "args", l.cfg.Args)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// While the executor runs, the launch state is looked at every Poll:
	// a rollback mark set meanwhile (the agent of an upgrade crash-loops,
	// `mesh-launch agent-start` said so) stops the executor, and the next
	// decision finishes the rollback — the launcher's one path for it.
	poll := time.NewTicker(l.cfg.Poll)
	defer poll.Stop()
wait:
	for {
		select {
		case <-done:
			return cmd.ProcessState, nil
		case <-ctx.Done():
			break wait
		case <-poll.C:
			if st, err := ReadState(l.cfg.StateDir); err == nil && st.RolledBack != nil && !st.RolledBack.Reinstalled {
				l.log.Warn("launcher: a rollback was asked for while the executor runs; stopping it to reinstall the known-good release", "reason", st.RolledBack.Reason)
				break wait
			}
		}
	}
	select {
	case <-done:
		return cmd.ProcessState, nil
	default:
	}
	// Known race: if the executor is reaped between the check above and the
	// kill, and its group id is reused at once, the signal reaches a
	// stranger. The window is a few instructions.
	l.log.Info("launcher: stopping the executor", "pid", pid, "timeout", l.cfg.StopTimeout)
	syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(l.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		l.log.Warn("launcher: the executor did not stop in time; killing it", "pid", pid, "timeout", l.cfg.StopTimeout)
		syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	case <-l.cfg.Hurry:
		l.log.Warn("launcher: asked again to stop: killing the executor now (what it cut, its next start resumes)", "pid", pid)
		syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	}
	return cmd.ProcessState, nil
}
