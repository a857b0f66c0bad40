package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/cmdline"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The defaults of mesh-agent.
const (
	DefaultUser     = "mesh-agent"
	DefaultStateDir = "/var/lib/mesh-host/agent"
	DefaultConfig   = DefaultStateDir + "/config.json"
)

// Main runs mesh-agent with args (without the program name) and returns the
// exit code: 0 when stopped, and when the executor runs another build (the
// init restarts the agent onto its new binary); 1 when it cannot run.
// agentFlags are mesh-agent's flags' values.
type agentFlags struct {
	config, socket, userName, state, vsockAddr, vsockSecret *string
	heartbeat, enrolPoll                                    *time.Duration
	episodic, selfCheck, showVersion, verbose               *bool
}

// flagSet is mesh-agent's command line, defined once: Main parses it, and
// Program makes the manual and completions from it.
func flagSet(out io.Writer) (*flag.FlagSet, agentFlags) {
	fs := flag.NewFlagSet("mesh-agent", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {}
	return fs, agentFlags{
		config:      fs.String("config", DefaultConfig, "the node's identity (JSON, 0600), written by enrolment; missing: stay hosted, never dial"),
		socket:      fs.String("socket", wire.SocketPath, "the executor's socket"),
		userName:    fs.String("user", DefaultUser, "the user to drop to when started as root (and to be, when not)"),
		state:       fs.String("state", DefaultStateDir, "the agent's state directory, written by the agent (one agent holds it: a second is refused)"),
		heartbeat:   fs.Duration("heartbeat", 30*time.Second, "the heartbeat period"),
		vsockAddr:   fs.String("vsock", "", "the executor over vsock, CID:PORT, instead of --socket"),
		vsockSecret: fs.String("vsock-secret", "", "the file holding the vsock connection secret (read before the drop)"),
		episodic:    fs.Bool("episodic", false, "the agent runs only now and then (inside an app): its heartbeat says so, and its silence is not read as an absence"),
		enrolPoll:   fs.Duration("enrol-poll", 2*time.Second, "hosted: how often to ask the executor whether an enrolment was begun"),
		selfCheck:   fs.Bool("self-check", false, "drop privileges, print the kernel's view of every thread's credentials, the version and build as JSON, and exit"),
		showVersion: fs.Bool("version", false, "print the version and build, and exit"),
		verbose:     fs.Bool("v", false, "debug logging"),
	}
}

// Program is mesh-agent's manual and completions.
func Program() cmdline.Program {
	fs, _ := flagSet(io.Discard)
	return cmdline.Program{Name: "mesh-agent", Section: 8,
		Summary: "the unprivileged link agent of nox-mesh-host",
		Description: `mesh-agent holds the node's one outbound link: it dials the broker (TLS pinned to the control
side's certificate, its own NKey), verifies every declaration against the pinned control-plane key,
hands the newest to the executor over its local socket and reports upward. Started as root it drops
itself to its user (no group but its own, no capability, no_new_privs) before it touches the
network; it is trusted for nothing.`,
		Commands: []cmdline.Command{
			{Name: "", Summary: "run the agent", Flags: fs},
			{Name: "version", Summary: "print the version and build", Flags: cmdline.VersionFlags("mesh-agent")},
			{Name: "completion", Args: "bash|zsh|fish", Summary: "print the shell's completion"},
			{Name: "man", Summary: "print the manual page (roff)"},
		},
		ExitStatus: []cmdline.Entry{
			{Term: "0", Text: "the agent stopped on SIGTERM or SIGINT; --help, --version"},
			{Term: "1", Text: "it could not start or run: its identity unreadable, its state directory held by another agent or not writable, its user not found to drop to"},
			{Term: "2", Text: "a command line it does not take"},
		},
		Environment: []cmdline.Entry{
			{Term: "", Text: "mesh-agent reads no environment variable: its identity is its configuration file, its settings are its flags."},
		},
		Examples: []cmdline.Entry{
			{Term: "mesh-agent --config /var/lib/mesh-host/agent/config.json --state /var/lib/mesh-host/agent --socket /run/mesh-host/executor.sock --user mesh-agent", Text: "what the packages' init runs (through mesh-launch agent-start): the agent as root drops to mesh-agent before it dials"},
			{Term: "mesh-agent --version", Text: "its version and build, which must be the executor's"},
		},
	}
}

func Main(ctx context.Context, version, build string, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") && len(args) > 1 {
		// --version --json, as the other binaries take it: the version
		// command with its flags.
		return cmdline.VersionCommand(stdout, stderr, "mesh-agent", version, build, args[1:])
	}
	if len(args) > 0 && (args[0] == "completion" || args[0] == "man") {
		text, err := Program().Generate(args, version)
		if err != nil {
			fmt.Fprintf(stderr, "mesh-agent: %v\n", err)
			return 2
		}
		fmt.Fprint(stdout, text)
		return 0
	}
	fs, f := flagSet(stderr)
	config, socket, userName, state, heartbeat := f.config, f.socket, f.userName, f.state, f.heartbeat
	vsockAddr, vsockSecret, episodic, enrolPoll, selfCheck := f.vsockAddr, f.vsockSecret, f.episodic, f.enrolPoll, f.selfCheck
	showVersion, verbose := f.showVersion, f.verbose
	if err := cmdline.ParseAlone(fs, args, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			p := Program()
			p.Help(stdout, p.Commands[0])
			return 0
		}
		return 2
	}
	// "version" as a command, as the other three binaries take it.
	if fs.NArg() > 0 && fs.Arg(0) == "version" {
		return cmdline.VersionCommand(stdout, stderr, "mesh-agent", version, build, fs.Args()[1:])
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "mesh-agent: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		cmdline.Version(stdout, "mesh-agent", version, build, false)
		return 0
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat", *heartbeat}, {"enrol-poll", *enrolPoll}} {
		if d.v <= 0 {
			fmt.Fprintf(stderr, "mesh-agent: --%s %v: a period longer than zero\n", d.name, d.v)
			return 2
		}
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cmdline.KeepOnHangup(log)

	// The identity is read before the drop, so it may be root's file; the
	// seed then lives only in the dropped process's memory.
	var id *Identity
	if !*selfCheck {
		var err error
		id, err = LoadConfig(*config)
		if errors.Is(err, ErrNoIdentity) {
			id = nil
		} else if err != nil {
			log.Error(err.Error())
			return 1
		}
	}

	var vs *Vsock
	if *vsockAddr != "" {
		var err error
		if vs, err = parseVsock(*vsockAddr, *vsockSecret); err != nil {
			log.Error(err.Error())
			if u := vsockUsage(""); errors.As(err, &u) {
				return 2 // the command line's, as every flag's
			}
			return 1
		}
	}

	// Drop everything before touching the network.
	asRoot := os.Geteuid() == 0
	if *selfCheck {
		// A diagnosis, beside a running agent: it touches no state (it
		// made the state directory --user's, and `--self-check --user
		// nobody` took a running agent's directory from it).
		_, _, err := Drop(*userName)
		return selfReport(stdout, version, build, err)
	}
	if *state == "" {
		log.Error("--state is required: the agent keeps there what must outlive a restart (the NKey a pending enrolment binds, the last sequence applied)")
		return 2
	}
	lock, err := takeStateDir(*state, *userName, asRoot)
	if err != nil {
		log.Error(err.Error(), "state", *state)
		return 1
	}
	defer lock.Close()
	uid, gid, err := Drop(*userName)
	if err != nil {
		log.Error(err.Error())
		return 1
	}
	// The first write into the state directory, as the user the agent
	// runs as: a directory it cannot write is refused here, not found out
	// later as a memory that does not outlive a restart.
	if err := lock.Record("mesh-agent"); err != nil {
		var ae *statedir.AccessError
		if errors.As(err, &ae) {
			ae.Advice = fmt.Sprintf("the agent runs as uid %d gid %d and keeps its memory there: make the directory its own (chown %d:%d %s, mode 0700), or start the agent as root, which makes it so before dropping", uid, gid, uid, gid, ae.Path)
		}
		log.Error("refusing to start: the state directory is not writable: "+err.Error(), "state", *state)
		return 1
	}
	log.Info("privileges dropped", "uid", uid, "gid", gid, "groups", 0, "capabilities", 0, "no_new_privs", 1, "version", version, "build", build)

	err = Run(ctx, Options{
		StateStill: lock.Still,
		Identity:   id, Socket: *socket, StateDir: *state, ConfigPath: *config, Heartbeat: *heartbeat, EnrolPoll: *enrolPoll, Episodic: *episodic, Vsock: vs,
		Version: version, Build: build, Log: log,
	})
	if errors.Is(err, ErrUpgraded) {
		ex := &execClient{path: *socket, uid: 0, vsock: vs, version: version, build: build}
		waitForAnotherBinary(ctx, log, err, 10*time.Second, func() bool {
			defer ex.drop()
			return ex.connect() == nil // the executor runs this agent's build again
		})
		return 0
	}
	if err != nil {
		log.Error(err.Error())
		return 1
	}
	return 0
}

// waitForAnotherBinary returns at once when the agent's binary on disk is
// not the one running (an upgrade installed another: the init restarts
// onto it). When it is the same — the executor upgraded alone, or
// started by hand with another build, or this agent upgraded and the
// executor not restarted onto its own yet — an exit would be restarted
// onto the same binary, link, find the executor's build again and exit,
// every few seconds for good: said once, and the exit waits for another
// binary, for the executor to run this agent's build (sameBuild, asked
// every poll), or for the end of ctx.
func waitForAnotherBinary(ctx context.Context, log *slog.Logger, why error, poll time.Duration, sameBuild func() bool) {
	running := func() (dev, ino uint64, ok bool) {
		var st syscall.Stat_t
		if syscall.Stat("/proc/self/exe", &st) != nil {
			return 0, 0, false
		}
		return st.Dev, st.Ino, true
	}
	rd, ri, ok1 := running()
	// The binary installed is looked for where this one was read from
	// and where the agent was started by: an install that swaps a link
	// (/usr/bin/mesh-agent to a release's own file) leaves the file read
	// in place, and puts the new one behind the path the init starts.
	same := func() bool {
		looked := false
		for _, p := range installedPaths() {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) != nil {
				continue
			}
			looked = true
			if st.Dev != rd || st.Ino != ri {
				return false
			}
		}
		return ok1 && looked
	}
	if !same() {
		return
	}
	p, _ := os.Executable()
	log.Error("the executor runs another build, and the agent's binary installed is the one running: there is nothing to restart onto; install the agent of the executor's release, or restart the executor onto this agent's (the agent exits once either is done)", "why", why.Error(), "binary", p)
	t := time.NewTicker(poll)
	defer t.Stop()
	for same() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if sameBuild != nil && sameBuild() {
			log.Info("the executor runs this agent's build again: exiting to be restarted, and link")
			return
		}
	}
	log.Info("the agent's binary was replaced: exiting to be restarted onto it", "binary", p)
}

// installedPaths are where the agent's binary is: the file this process
// was read from (os.Executable), and the path it was started by
// (invokedAs: its argv[0], as an init gives it: a path; a bare name, a
// shell's search of its PATH, is not looked for).
func installedPaths() []string {
	var out []string
	if p, err := os.Executable(); err == nil {
		out = append(out, p)
	}
	if p := invokedAs(); strings.Contains(p, "/") {
		out = append(out, p)
	}
	return out
}

// invokedAs is the path the agent was started by.
var invokedAs = func() string { return os.Args[0] }

// StateLockRecord is the file in the agent's state directory that names
// the agent holding the directory (statedir.LockDir).
const StateLockRecord = "agent.lock"

// takeStateDir makes the state directory if it is missing and locks it,
// before anything in it is opened or created; as root, then makes it
// userName's (PrepareStateDir), so a second agent started by mistake with
// another --user is refused before it takes the directory from the first.
func takeStateDir(dir, userName string, asRoot bool) (*statedir.DirLock, error) {
	var uid, gid int
	if asRoot {
		var err error
		if uid, gid, err = LookupUser(userName); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("refusing to start: the state directory cannot be made: %w", statedir.ExplainAccess("create", dir, err,
			fmt.Sprintf("the agent runs as uid %d and keeps its memory there: make the directory for it (mode 0700, its own), or start the agent as root, which makes it", os.Geteuid())))
	} else if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink == 0 { // a link: LockDir says so
		// Not root, it cannot make the directory its own: one another
		// user may write is one where its key and identity could be
		// swapped under it. (Its own group may: an Android app's files
		// directory is 0771, of the app's own group; and root, whose
		// directory the agent cannot write, is said so below.)
		st := fi.Sys().(*syscall.Stat_t)
		perm := fi.Mode().Perm()
		byOther := int(st.Uid) != os.Geteuid() && st.Uid != 0 // its owner may make it writable at will
		if byOther || perm&0o002 != 0 || perm&0o020 != 0 && int(st.Gid) != os.Getegid() {
			return nil, fmt.Errorf("refusing to start: the state directory %s is uid %d's, mode %04o: the agent (uid %d) keeps its key there, and another user may write it; make it the agent's own (chown %d %s; chmod 0700 %s)", dir, st.Uid, fi.Mode().Perm(), os.Geteuid(), os.Geteuid(), dir, dir)
		}
	}
	lock, err := statedir.LockDir(dir, StateLockRecord)
	if err != nil {
		return nil, err
	}
	if asRoot {
		if err := PrepareStateDir(dir, uid, gid); err != nil {
			lock.Close()
			return nil, err
		}
	}
	return lock, nil
}

// selfReport prints every thread's credentials after the drop, and the
// version and build that did it: the executor runs an upgrade's new agent
// this way (as root, so the agent's own drop is what is tried) before it
// commits to the release.
func selfReport(stdout io.Writer, version, build string, dropErr error) int {
	type thread struct {
		TID   string `json:"tid"`
		Creds *Creds `json:"creds"`
	}
	out := struct {
		Confined bool     `json:"confined"`
		Version  string   `json:"version"`
		Build    string   `json:"build"`
		Error    string   `json:"error,omitempty"`
		Threads  []thread `json:"threads"`
	}{Confined: dropErr == nil, Version: version, Build: build}
	if dropErr != nil {
		out.Error = dropErr.Error()
	}
	entries, _ := os.ReadDir("/proc/self/task")
	for _, e := range entries {
		c, err := ReadCreds("/proc/self/task/" + e.Name() + "/status")
		if err == nil {
			out.Threads = append(out.Threads, thread{e.Name(), c})
		}
	}
	e := json.NewEncoder(stdout)
	e.SetIndent("", "  ")
	e.Encode(out)
	if dropErr != nil {
		return 1
	}
	return 0
}

// parseVsock reads --vsock CID:PORT and the secret file beside it.
// vsockUsage is a --vsock the command line got wrong (exit 2), not a
// secret file that could not be read.
type vsockUsage string

func (u vsockUsage) Error() string { return string(u) }

func parseVsock(addr, secretFile string) (*Vsock, error) {
	c, p, ok := strings.Cut(addr, ":")
	cid, err1 := strconv.ParseUint(c, 10, 32)
	port, err2 := strconv.ParseUint(p, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return nil, vsockUsage(fmt.Sprintf("--vsock %q: not CID:PORT", addr))
	}
	if secretFile == "" {
		return nil, vsockUsage("--vsock needs --vsock-secret: vsock carries no peer credentials")
	}
	b, err := os.ReadFile(secretFile)
	if err != nil {
		return nil, fmt.Errorf("--vsock-secret: %w", err)
	}
	return &Vsock{CID: uint32(cid), Port: uint32(port), Secret: []byte(strings.TrimSpace(string(b)))}, nil
}
