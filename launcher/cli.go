package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/cmdline"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

const usage = `usage: mesh-launch [FLAGS] [-- ARGS for mesh-executor (default: serve --state DIR)]
       mesh-launch status [--state DIR] [--window D] [--json]
       mesh-launch clear [--state DIR]
       mesh-launch agent-start [--state DIR] [--agent PATH] [-- AGENT COMMAND]

mesh-launch is what the init starts: it supervises the executor, counts its
starts, rolls back once to the known-good copy, and halts. It exits only on
SIGTERM or SIGINT (after stopping the executor), with status 0 — or at
once, with status 1, when another mesh-launch holds the state directory
(it names its pid; one launcher per state directory).

  status   the launch state: recent starts, rolled back, halted and why
  clear    clear a halt and the start counter (root only); a running
           launcher resumes within a few seconds
  agent-start
           count one start of the agent (root, run by the init before each
           start of the agent), and when an upgrade's agent crash-loops,
           ask the running launcher to roll back; then exec AGENT COMMAND,
           if given. The agent is started whatever happens here.

Flags of the launcher:
`

// Main is the mesh-launch command line; it returns the exit status: 0, 1
// for a failed status or clear or a launcher refused because another holds
// its state directory, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return statusCmd(args[1:], stdout, stderr)
		case "clear":
			return clearCmd(args[1:], stdout, stderr)
		case "agent-start":
			return agentStartCmd(args[1:], stdout, stderr)
		case "version", "--version", "-version":
			return cmdline.VersionCommand(stdout, stderr, "mesh-launch", Version, Build, args[1:])
		case "completion", "man":
			text, err := Program().Generate(args, Version)
			if err != nil {
				fmt.Fprintf(stderr, "mesh-launch: %v\n", err)
				return 2
			}
			fmt.Fprint(stdout, text)
			return 0
		case "help", "-h", "-help", "--help":
			fmt.Fprint(stdout, usage)
			runFlags(&Config{}, stdout).PrintDefaults()
			return 0
		}
	}
	var cfg Config
	fs := runFlags(&cfg, stderr)
	if err := cmdline.ParseAlone(fs, args, stderr); err != nil {
		return helpOr(err, "", stdout)
	}
	if fs.NArg() > 0 {
		if !slices.Contains(args, "--") {
			fmt.Fprintf(stderr, "mesh-launch: unknown command %q (the executor's arguments follow --)\n", fs.Arg(0))
			return 2
		}
		cfg.Args = fs.Args()
	}
	// Said as the command line wrote them: 0 or below was taken for the
	// default, silently, and a negative one said by the field's name.
	if cfg.MaxStarts <= 0 {
		fmt.Fprintf(stderr, "mesh-launch: --max-starts %d: at least 1\n", cfg.MaxStarts)
		return 2
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"window", cfg.Window}, {"backoff", cfg.Backoff}, {"stop-timeout", cfg.StopTimeout}} {
		if d.v <= 0 {
			fmt.Fprintf(stderr, "mesh-launch: --%s %v: more than zero\n", d.name, d.v)
			return 2
		}
	}
	// A relative path is of the directory it was started in, which the
	// launcher does not stay in.
	for _, p := range []*string{&cfg.StateDir, &cfg.KnownGood} {
		if *p != "" && !filepath.IsAbs(*p) {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs
			}
		}
	}
	if uid := os.Geteuid(); uid != 0 {
		// It makes the agent's user, takes the state directory's lock and
		// starts the executor, which is root's: as anyone else each of
		// these fails, and it would go on trying them for ever.
		fmt.Fprintf(stderr, "mesh-launch: runs as root (uid %d here): it starts the executor, which is root's; the init starts it (mesh-launch status reads what it did, as whoever may read the state directory)\n", uid)
		return 1
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cmdline.KeepOnHangup(cfg.Log)
	// The first SIGTERM or SIGINT stops the executor, given its stop
	// timeout; a second does not wait for it (Config.Hurry).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	hurry := make(chan struct{})
	cfg.Hurry = hurry
	go func() {
		<-sigs
		stop()
		<-sigs
		close(hurry)
	}()
	if err := Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "mesh-launch: %v\n", err)
		if held := (*HeldError)(nil); errors.As(err, &held) {
			return 1
		}
		return 2
	}
	return 0
}

// Flags is mesh-launch's command line, for what checks the files that
// start it (tests/initfiles_test.go).
func Flags(out io.Writer) *flag.FlagSet {
	var cfg Config
	return runFlags(&cfg, out)
}

func runFlags(cfg *Config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mesh-launch", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	cfg.Installed = DefaultInstalled()
	fs.StringVar(&cfg.StateDir, "state", DefaultStateDir, "the executor's state directory, which holds the launch state")
	fs.Func("executor", "the executor's installed `path`, started and rolled back (default "+cfg.Installed["mesh-executor"]+")", func(s string) error {
		cfg.Installed["mesh-executor"] = s
		return nil
	})
	fs.Func("agent", "the agent's installed `path`, rolled back with the executor (default "+cfg.Installed["mesh-agent"]+")", func(s string) error {
		cfg.Installed["mesh-agent"] = s
		return nil
	})
	fs.StringVar(&cfg.KnownGood, "known-good", "", "the directory of known-good copies (default STATE/known-good)")
	fs.IntVar(&cfg.MaxStarts, "max-starts", 5, "starts within --window without a healthy reconcile before rolling back, then halting")
	fs.DurationVar(&cfg.Window, "window", 10*time.Minute, "how far back a start counts")
	fs.DurationVar(&cfg.Backoff, "backoff", 2*time.Second, "the pause before restarting an executor that failed")
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", 30*time.Second, "how long the executor has to stop after SIGTERM before SIGKILL")
	fs.BoolVar(&cfg.Packages, "package-rollback", true, "roll back through the package manager (apt, pacman, apk) when the known-good copy names its package version, else by copying")
	fs.StringVar(&cfg.AgentUser, "agent-user", DefaultAgentUser, "the agent's user, made before the first start when missing (a tarball install); \"\" makes nothing")
	fs.StringVar(&cfg.Notice, "notice", NoticeFile, "where the launcher tells the agent it starts nothing, and why (\"\": nowhere)")
	fs.StringVar(&cfg.AgentState, "agent-state", DefaultAgentState, "the agent's state directory, made with its user")
	return fs
}

func statusFlagSet(out io.Writer) (fs *flag.FlagSet, dir *string, window *time.Duration, asJSON *bool) {
	fs = flag.NewFlagSet("mesh-launch status", flag.ContinueOnError)
	fs.SetOutput(out)
	dir = fs.String("state", DefaultStateDir, "the executor's state directory")
	window = fs.Duration("window", 10*time.Minute, "how far back a start counts")
	asJSON = fs.Bool("json", false, "print the launch state as JSON")
	return fs, dir, window, asJSON
}

func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs, dir, window, asJSON := statusFlagSet(stderr)
	if err := cmdline.ParseAlone(fs, args, stderr); err != nil {
		return helpOr(err, "status", stdout)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mesh-launch status: unexpected %q\n", fs.Arg(0))
		return 2
	}
	// A directory that is not there says so: read as a launch state never
	// written, it would look like a launcher that never started.
	if _, err := os.Stat(*dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(stderr, "mesh-launch status: no state directory %s (--state names the executor's; the launcher makes it at its first start)\n", *dir)
		} else {
			fmt.Fprintf(stderr, "mesh-launch status: %v\n", statedir.ExplainAccess("read", *dir, err, "the launch state is root's where the package installs it: run it as root"))
		}
		return 1
	}
	s, err := ReadState(*dir)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = statedir.ExplainAccess("read", pe.Path, pe.Err, "the launch state is root's where the package installs it: run it as root")
		}
		fmt.Fprintf(stderr, "mesh-launch status: %v\n", err)
		return 1
	}
	if *asJSON {
		data, _ := json.MarshalIndent(s, "", "  ")
		fmt.Fprintf(stdout, "%s\n", data)
		return 0
	}
	fmt.Fprint(stdout, formatStatus(s, *dir, clock.Now(), *window))
	if pid := runningLauncher(*dir); pid > 0 {
		fmt.Fprintf(stdout, "launcher: running (pid %d)\n", pid)
	} else {
		fmt.Fprintln(stdout, "launcher: not running: nothing starts the executor until the init starts it (systemctl start mesh-executor, rc-service mesh-executor start, sv up mesh-executor)")
	}
	return 0
}

func formatStatus(s State, dir string, now time.Time, window time.Duration) string {
	var b strings.Builder
	ts := func(t time.Time) string { return t.Local().Format(time.RFC3339) }
	fmt.Fprintf(&b, "state: %s/%s\n", dir, StateFile)
	n := len(recent(s.Starts, now, window))
	fmt.Fprintf(&b, "starts: %d within %v since the last healthy reconcile", n, window)
	if len(s.Starts) > 0 {
		fmt.Fprintf(&b, " (last %s)", ts(s.Starts[len(s.Starts)-1]))
	}
	b.WriteString("\n")
	switch {
	case s.RolledBack == nil && s.LastRollback != nil:
		// Healthy cleared the mark: the release reinstalled reconciled.
		fmt.Fprintf(&b, "rolled back: yes, at %s: %s; the release reinstalled has reconciled since", ts(s.LastRollback.At), s.LastRollback.Reason)
		if !s.HealthyAt.IsZero() {
			fmt.Fprintf(&b, " (%s)", ts(s.HealthyAt))
		}
		b.WriteString(", so a later release may be rolled back once in its turn\n")
	case s.RolledBack == nil:
		b.WriteString("rolled back: no\n")
	case !s.RolledBack.Reinstalled:
		fmt.Fprintf(&b, "rolled back: started at %s, reinstall not finished: %s\n", ts(s.RolledBack.At), s.RolledBack.Reason)
	default:
		fmt.Fprintf(&b, "rolled back: yes, at %s: %s\n", ts(s.RolledBack.At), s.RolledBack.Reason)
	}
	if s.Failed != nil {
		fmt.Fprintf(&b, "failed release: %s, rolled back from at %s (the executor does not install it again): %s\n", s.Failed.Version, ts(s.Failed.At), s.Failed.Reason)
	}
	if a := s.Agent; a != nil {
		fmt.Fprintf(&b, "agent: %d starts within %v", len(recent(a.Starts, now, window)), window)
		if len(a.Starts) > 0 {
			fmt.Fprintf(&b, " (last %s)", ts(a.Starts[len(a.Starts)-1]))
		}
		if a.Proven != "" {
			fmt.Fprintf(&b, "; stayed up on sha256:%s, %s", a.Proven, ts(a.ProvenAt))
		} else {
			b.WriteString("; never seen to stay up")
		}
		b.WriteString("\n")
	}
	if s.Halted == nil {
		b.WriteString("halted: no\n")
	} else {
		fmt.Fprintf(&b, "halted: yes, at %s: %s\n", ts(s.Halted.At), s.Halted.Reason)
	}
	if s.HealthyAt.IsZero() {
		b.WriteString("healthy: never reported\n")
	} else {
		fmt.Fprintf(&b, "healthy: %s\n", ts(s.HealthyAt))
	}
	kg := s.KnownGoodDir
	if kg == "" {
		kg = dir + "/" + KnownGoodDir
	}
	if s.KnownGood == nil {
		fmt.Fprintf(&b, "known good: none recorded (%s)\n", kg)
	} else {
		fmt.Fprintf(&b, "known good: %s, in %s", ts(s.KnownGood.At), kg)
		if s.KnownGood.Package != "" {
			fmt.Fprintf(&b, " (package %s)", s.KnownGood.Package)
		}
		b.WriteString("\n")
		for _, name := range sortedNames(s.KnownGood.Binaries) {
			fmt.Fprintf(&b, "  %s sha256:%s\n", name, s.KnownGood.Binaries[name])
		}
	}
	return b.String()
}

func clearFlagSet(out io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("mesh-launch clear", flag.ContinueOnError)
	fs.SetOutput(out)
	return fs, fs.String("state", DefaultStateDir, "the executor's state directory")
}

func clearCmd(args []string, stdout, stderr io.Writer) int {
	fs, dir := clearFlagSet(stderr)
	if err := cmdline.ParseAlone(fs, args, stderr); err != nil {
		return helpOr(err, "clear", stdout)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mesh-launch clear: unexpected %q\n", fs.Arg(0))
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "mesh-launch clear: run as root")
		return 2
	}
	if err := Clear(*dir); err != nil {
		fmt.Fprintf(stderr, "mesh-launch clear: %v\n", err)
		return 1
	}
	if pid := runningLauncher(*dir); pid > 0 {
		fmt.Fprintf(stdout, "cleared: the launcher (pid %d) starts the executor again within seconds (the rolled-back mark, if any, stays until it reconciles)\n", pid)
	} else {
		fmt.Fprintln(stdout, "cleared: no launcher runs on this state now; the executor starts when the init starts it (systemctl start mesh-executor, rc-service mesh-executor start, sv up mesh-executor)")
	}
	return 0
}

// AgentStartFlags is agent-start's command line, for what checks the init
// files that run it (tests/initfiles_test.go).
func AgentStartFlags(out io.Writer) *flag.FlagSet {
	fs, _ := agentStartFlagSet(out)
	return fs
}

type agentStartFlags struct {
	dir, agent *string
	maxStarts  *int
	window     *time.Duration
}

func agentStartFlagSet(out io.Writer) (*flag.FlagSet, agentStartFlags) {
	fs := flag.NewFlagSet("mesh-launch agent-start", flag.ContinueOnError)
	fs.SetOutput(out)
	return fs, agentStartFlags{
		dir:       fs.String("state", DefaultStateDir, "the executor's state directory, which holds the launch state"),
		agent:     fs.String("agent", DefaultInstalled()["mesh-agent"], "the agent's installed path: the binary whose starts are counted"),
		maxStarts: fs.Int("max-starts", 5, "starts within --window, the agent not staying up, before an upgrade is rolled back"),
		window:    fs.Duration("window", 10*time.Minute, "how far back a start counts"),
	}
}

// agentStartCmd counts a start of the agent, then execs the agent's
// command when one follows "--". Nothing here keeps the agent from
// starting: an unusable launch state is said and the agent started.
func agentStartCmd(args []string, stdout, stderr io.Writer) int {
	fs, f := agentStartFlagSet(stderr)
	if err := cmdline.ParseAlone(fs, args, stderr); err != nil {
		return helpOr(err, "agent-start", stdout)
	}
	command := fs.Args()
	if len(command) > 0 && !slices.Contains(args, "--") {
		fmt.Fprintf(stderr, "mesh-launch agent-start: unexpected %q (the agent's command follows --)\n", command[0])
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	switch {
	case os.Geteuid() != 0:
		log.Error("mesh-launch agent-start: not root: this start of the agent is not counted (the init runs agent-start as root)")
	default:
		act, why, err := AgentStarting(*f.dir, *f.agent, Policy{MaxStarts: *f.maxStarts, Window: *f.window})
		switch {
		case err != nil:
			log.Error("mesh-launch agent-start: this start of the agent is not counted; starting it all the same", "err", err)
		case act == AgentRollback:
			log.Error("mesh-launch agent-start: rolling back", "reason", why, "state", *f.dir+"/"+StateFile)
		case act == AgentLoops:
			log.Error("mesh-launch agent-start: the agent crash-loops", "reason", why)
		}
	}
	if len(command) == 0 {
		return 0
	}
	err := syscall.Exec(command[0], command, os.Environ())
	fmt.Fprintf(stderr, "mesh-launch agent-start: exec %s: %v\n", command[0], err)
	return 1
}

// Version and Build are set by cmd/mesh-launch from its link-time stamp.
var Version, Build = "dev", "dev"

// Program is mesh-launch's manual and completions, from its own flag sets.
func Program() cmdline.Program {
	var cfg Config
	run := runFlags(&cfg, io.Discard)
	status, _, _, _ := statusFlagSet(io.Discard)
	clear, _ := clearFlagSet(io.Discard)
	agent, _ := agentStartFlagSet(io.Discard)
	return cmdline.Program{Name: "mesh-launch", Section: 8,
		Summary: "the launcher of nox-mesh-host: supervises the executor, rolls back once, halts",
		Description: `mesh-launch is what the init starts: it starts mesh-executor serve, counts its starts (and,
through agent-start, the agent's), rolls back once to the known-good release when an upgrade
crash-loops, and halts, staying up idle, when that fails too. It exits only on SIGTERM or SIGINT,
or at once with status 1 when another mesh-launch holds its state directory (named by pid).`,
		Commands: []cmdline.Command{
			{Name: "", Args: "[-- ARGS for mesh-executor]", Summary: "supervise the executor (default arguments: serve --state DIR)", Flags: run},
			{Name: "status", Summary: "the launch state: recent starts, rolled back, halted and why, the agent's starts", Flags: status},
			{Name: "clear", Summary: "clear a halt and the start counter (root only); a running launcher resumes within seconds", Flags: clear},
			{Name: "agent-start", Args: "[-- AGENT COMMAND]", Summary: "count one start of the agent (root, run by the init before each); when an upgrade's agent crash-loops, ask the running launcher to roll back; then exec the agent's command", Flags: agent},
			{Name: "version", Summary: "print the version and build", Flags: cmdline.VersionFlags("mesh-launch")},
			{Name: "completion", Args: "bash|zsh|fish", Summary: "print the shell's completion"},
			{Name: "man", Summary: "print the manual page (roff)"},
		},
		ExitStatus: []cmdline.Entry{
			{Term: "0", Text: "the launcher stopped on SIGTERM or SIGINT; status, clear and agent-start done; --help"},
			{Term: "1", Text: "another mesh-launch holds the state directory (it is named by pid), or status or clear failed"},
			{Term: "2", Text: "a command line it does not take"},
		},
		Environment: []cmdline.Entry{
			{Term: "", Text: "mesh-launch reads no environment variable: its flags say what it starts, and the executor is started with the arguments given after --."},
		},
		Examples: []cmdline.Entry{
			{Term: "mesh-launch --state /var/lib/mesh-host/executor -- serve --state /var/lib/mesh-host/executor --socket /run/mesh-host/executor.sock --agent-user mesh-agent", Text: "what the packages' init runs: supervise the executor's daemon"},
			{Term: "mesh-launch status", Text: "recent starts, whether it rolled back or halted and why, the agent's starts"},
			{Term: "mesh-launch clear", Text: "clear a halt once the machine is mended; the running launcher resumes within seconds"},
		},
	}
}

// helpOr answers a subcommand's --help (exit 0, on standard output), or
// says a usage error (2).
func helpOr(err error, name string, stdout io.Writer) int {
	if !errors.Is(err, flag.ErrHelp) {
		return 2
	}
	p := Program()
	for _, c := range p.Commands {
		if c.Name == name {
			p.Help(stdout, c)
		}
	}
	return 0
}
