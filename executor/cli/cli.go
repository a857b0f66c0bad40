// Package cli is the mesh-executor command: the rescue commands a person
// runs as root on the machine (apply, plan, owned, status, profile,
// inventory, version). It holds the logic so cmd/mesh-executor stays a thin
// main; nothing but that main imports it.
//
// `apply FILE` is the second of the executor's two sources: a local file
// named by root. It is read only if root owns it and neither group nor
// others may write it or any directory above it, opened without following a
// link, and parsed with shapes.ParseTrusted, which permits an action —
// whoever can write that file and run this command can already do anything
// an action could.
package cli

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/cmdline"
	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/profile"
	"github.com/nox-mesh/nox-mesh-host/executor/serve"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/launcher"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Build is this binary's build id, which the agent compares with its own
// at hello; cmd/mesh-executor sets it from its link-time stamp.
var Build = "dev"

// BundleDigest is the SHA-256 (hex) of the carried bundle the package was
// built with, fixed at build time (cmd/mesh-executor's main.bundle, which
// `make package` stamps from BUNDLE): `mesh-executor reconcile` applies a
// bundle only if it is that one. Empty in a build that carries none (go
// build, a developer's): such a build takes any bundle, and says so.
var BundleDigest = ""

// DefaultState is the executor's state directory.
const DefaultState = "/var/lib/mesh-host/executor"

// Exit statuses of apply and plan.
const (
	ExitApplied = 0 // applied, or nothing to do
	ExitFailed  = 1 // the apply ran and a step failed
	ExitRefused = 2 // refused whole; nothing touched
)

// maxLocalFile bounds a rescue file.
const maxLocalFile = shapes.MaxDeclarationSize

// commands are mesh-executor's commands: their positional arguments
// (from min to max), their flags by name (defined once, in
// (*options).define; serve's are serveFlagSet's) and what each does. The
// usage, each command's --help, the completions and the man page are made
// from this table (cmdline).
var commands = []cmdline.Def{
	cmdline.D("serve", "", 0, 0, nil, `the daemon (what mesh-launch starts): listen on the local socket for the agent; reconcile at
start, on reconnect, on the drift timer and when the host's firewall takes a rule of the mesh's. One per --state: a second is refused, naming the
first one's pid`),
	cmdline.D("apply", "FILE", 1, 1, []string{"state", "json", "wait", "partial", "v"}, `apply a local declaration (root-owned, not group- or other-writable): rescue. Exit 0 applied
(or nothing to do), 1 a step failed, 2 refused (nothing touched)`),
	cmdline.D("plan", "FILE", 1, 1, []string{"state", "json", "partial", "v"}, `print what apply would do, with content diffs; touch nothing (not even the state directory)`),
	cmdline.D("reconcile", "[BUNDLE]", 0, 1, []string{"state", "json", "wait", "partial", "v"}, `apply the carried bundle (default /usr/lib/nox-mesh-host/foundation.lock) as the bundle
source: only the bundle whose digest this build was stamped with`),
	cmdline.D("bundle", "[BUNDLE]", 0, 1, []string{"state", "out", "partial"}, `whether this host can be a first node (raise the control side from the carried bundle, default
/usr/lib/nox-mesh-host/foundation.lock), as JSON, with the bundle's digest and the one this build
carries; a partial host cannot, nor one whose bundle is missing or not the one this build
carries, and says why (exit 2)`),
	cmdline.D("owned", "", 0, 0, []string{"state", "json"}, "what the host holds on this machine, and why"),
	cmdline.D("briefing", "", 0, 0, []string{"state", "json"}, "what adoption found on this machine, and what to look at"),
	cmdline.D("status", "", 0, 0, []string{"state", "json"}, `hosted or enrolled (and disconnected since when), the last apply of each source`),
	cmdline.D("doctor", "", 0, 0, []string{"state", "json", "socket"}, `check what to look at when a node misbehaves: the state directory, the daemon, the identity,
the link, the clock, the disk, the init and recorded faults; a line each, with what to do. Exit 0
when nothing failed, 1 when something did (a warning does not fail)`),
	cmdline.D("profile", "", 0, 0, []string{"state", "json"}, "what this machine can be asked to do"),
	cmdline.D("inventory", "", 0, 0, []string{"state", "json"}, "what this machine is"),
	cmdline.D("enrol", "", 0, 0, []string{"state", "json", "wait", "token-file", "replace", "cancel", "socket", "v"}, `read a token on standard input (or --token-file, root-only; never the command line), make the
node's keys, and wait for the agent to bring back the grant. Exit 0 enrolled, 1 refused (saying by
whom and why), 2 refused before anything changed, 3 still pending. On an enrolled host, a token
for another node is refused by the control side unless --replace; --cancel ends a pending
enrolment`).Vetted(noTokenInArgs),
	cmdline.D("rekey", "", 0, 0, []string{"state", "json", "wait", "cancel", "socket"}, `renew the node's keys (identity, sealing, WireGuard, the agent's NKey) without a token: the
request, signed by the identity key, goes to the control side over the link, and its answer
begins an enrolment that replaces this one under the same node name. Exit 0 renewed, 1 refused,
2 refused before anything changed, 3 still pending; --cancel ends a pending rekey`),
	cmdline.D("version", "", 0, 0, []string{"json"}, "this binary's version, bare (--version says it with the build, as the other programs do)"),
	cmdline.D("completion", "bash|zsh|fish", 1, 1, nil, "print the shell's completion for mesh-executor"),
	cmdline.D("man", "", 0, 0, nil, "print mesh-executor's manual page (roff)"),
}

// options are the commands' flags' values.
type options struct {
	json, verbose, partial, replace, cancel bool
	state, tokenFile, out, socket           string
	wait                                    time.Duration
}

// absolute makes each path a flag gave absolute against the working
// directory, once, where the flags are read: a path is opened beneath
// (fsx takes absolute paths alone), compared with /proc's links (the
// daemon holding a state), and kept in files other processes read. An
// empty one (not given) stays empty.
func absolute(paths ...*string) {
	for _, p := range paths {
		if *p == "" {
			continue
		}
		if a, err := filepath.Abs(*p); err == nil {
			*p = a
		}
	}
}

// define defines flag name of command cmd in fs: the one place each flag
// is written, said as it is for cmd where commands use it differently.
func (o *options) define(fs *flag.FlagSet, name, cmd string) {
	switch name {
	case "json":
		fs.BoolVar(&o.json, "json", false, "print JSON")
	case "state":
		fs.StringVar(&o.state, "state", DefaultState, "the executor's state directory")
	case "wait":
		switch cmd {
		case "enrol":
			fs.DurationVar(&o.wait, "wait", 2*time.Minute, "how long to wait for the grant, which the agent brings back from the control side")
		case "rekey":
			fs.DurationVar(&o.wait, "wait", 2*time.Minute, "how long to wait for the control side's answer, which the agent brings back")
		default:
			fs.DurationVar(&o.wait, "wait", 5*time.Minute, "how long to wait for another applier to finish")
		}
	case "v":
		fs.BoolVar(&o.verbose, "v", false, "log each step to standard error")
	case "partial":
		fs.BoolVar(&o.partial, "partial", false, "a partial host: file, directory, region, keys, action and archive only")
	case "token-file":
		fs.StringVar(&o.tokenFile, "token-file", "", "read the token from this root-only file instead of standard input")
	case "out":
		fs.StringVar(&o.out, "out", "", "write the report to this file instead of standard output")
	case "replace":
		fs.BoolVar(&o.replace, "replace", false, "replace the identity this host holds (the control side revokes it in the same step)")
	case "cancel":
		if cmd == "rekey" {
			fs.BoolVar(&o.cancel, "cancel", false, "end the pending rekey")
		} else {
			fs.BoolVar(&o.cancel, "cancel", false, "end the pending enrolment")
		}
	case "socket":
		fs.StringVar(&o.socket, "socket", wire.SocketPath, "the executor's socket, which the agent must reach")
	default:
		panic("cli: no flag " + name)
	}
}

// flagSet is command i's flags (serve's own set for serve).
func flagSet(i int, o *options, out io.Writer) *flag.FlagSet {
	c := commands[i]
	if c.Name == "serve" {
		fs, _ := serveFlagSet(out)
		return fs
	}
	fs := flag.NewFlagSet("mesh-executor "+c.Name, flag.ContinueOnError)
	fs.SetOutput(out)
	for _, f := range c.Flags {
		o.define(fs, f, c.Name)
	}
	return fs
}

// table is mesh-executor's commands, their flags bound to o.
func table(o *options) cmdline.Table {
	return cmdline.NewTable(cmdline.Program{Name: "mesh-executor", Section: 8,
		Summary: "the root executor of nox-mesh-host: applies, reads back and records",
		Description: `mesh-executor is the node's root half. As a daemon (serve, started by mesh-launch) it applies
what the control plane signed, verifying every declaration again itself, and reconciles at
start, on reconnect and on a timer. At the machine, root drives it directly: apply and plan a
local file (rescue), reconcile the carried bundle, enrol, and inspect what the host holds. The
read-only commands (plan, owned, briefing, status, doctor, profile, inventory) create nothing,
not even the state directory.`,
		ExitStatus: []cmdline.Entry{
			{Term: "0", Text: "done: applied, or nothing to do; a read-only command answered; --help"},
			{Term: "1", Text: "failed: the apply ran and a step failed, or doctor found a check failing"},
			{Term: "2", Text: "refused whole, nothing touched: a declaration refused before any step, a command run as a user that is not root where root is needed, or a command line it does not take"},
		},
		Environment: []cmdline.Entry{
			{Term: "", Text: "mesh-executor reads no environment variable: what it does is its flags, its state directory and what the control plane signed. The init's environment is not passed on to what it runs."},
		},
		Files: []cmdline.Entry{
			{Term: "/usr/lib/nox-mesh-host/foundation.lock", Text: "the carried bundle the packages ship: reconcile applies it, and no other unless given one (a build stamped with its digest takes no other)"},
		},
		Examples: []cmdline.Entry{
			{Term: "mesh-executor doctor", Text: "check the state directory, the daemon, the identity, the agent and the broker, a line each with what to do when it fails"},
			{Term: "mesh-executor plan rescue.json", Text: "say what applying the local declaration rescue.json would do, with content diffs, touching nothing"},
			{Term: "mesh-executor apply rescue.json", Text: "apply it (rescue, when the control side cannot be reached)"},
			{Term: "mesh-executor enrol < token", Text: "enrol this machine with a token read on standard input"},
			{Term: "mesh-executor reconcile", Text: "apply the carried bundle: raise the control side on a mesh's first node"},
		},
	}, commands, func(i int, out io.Writer) *flag.FlagSet { return flagSet(i, o, out) })
}

// Program is mesh-executor's manual, completions and help.
func Program() cmdline.Program { return table(new(options)).Program }

// Main runs the command line and returns the exit status.
func Main(version string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		// The form all four programs print. The version command prints the
		// version bare: a running host reads the installed one's to decide
		// an upgrade (engine.checkHostUpgrade), and every release before
		// reads it so.
		cmdline.Version(stdout, "mesh-executor", version, Build, false)
		return 0
	}
	if len(args) > 0 && args[0] == "serve" {
		// serve parses its own flags (serveFlagSet), positional ones
		// refused, and answers a request for help in any of the flag
		// package's forms (-h, --help, --help=true).
		c := &command{version: version, out: stdout, errw: stderr}
		return c.serve(args[1:])
	}
	var o options
	i, pos, _, code, done := table(&o).Dispatch(args, version, stdout, stderr)
	if done {
		if code == 2 {
			code = ExitRefused
		}
		return code
	}
	absolute(&o.state, &o.socket, &o.tokenFile, &o.out)
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	c := &command{version: version, json: o.json, state: o.state, wait: o.wait, out: stdout, errw: stderr, log: log, partial: o.partial || initsys.Android(""), socket: o.socket}
	switch commands[i].Name {
	case "apply", "plan":
		return c.apply(pos[0], commands[i].Name == "plan")
	case "enrol":
		return c.enrolCmd(pos, enrolFlags{tokenFile: o.tokenFile, replace: o.replace, cancel: o.cancel}, os.Stdin)
	case "rekey":
		return c.rekeyCmd(o.cancel)
	case "bundle":
		bundle := DefaultBundle
		if len(pos) == 1 {
			bundle = pos[0]
		}
		return c.bundle(bundle, o.out)
	case "reconcile":
		bundle := DefaultBundle
		if len(pos) == 1 {
			bundle = pos[0]
		}
		return c.reconcile(bundle)
	case "owned":
		return c.owned()
	case "briefing":
		return c.briefing()
	case "status":
		return c.status()
	case "doctor":
		return c.doctor()
	case "profile":
		return c.profile()
	case "inventory":
		return c.inventory()
	case "version":
		// Bare: the running host reads the installed one's so (above);
		// --json as every program's.
		if c.json {
			cmdline.Version(c.out, "mesh-executor", version, Build, true)
			return 0
		}
		fmt.Fprintln(c.out, version)
		return 0
	}
	return ExitRefused
}

type command struct {
	version string
	json    bool
	state   string
	wait    time.Duration
	out     io.Writer
	errw    io.Writer
	log     *slog.Logger
	partial bool
	// socket is the executor's socket, for enrol's diagnosis.
	socket string
}

func (c *command) print(v any, text string) int {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return ExitFailed
		}
		return 0
	}
	fmt.Fprint(c.out, text)
	return 0
}

func (c *command) refuse(why string) int {
	rep := &shapes.Report{Outcome: shapes.Refused, Source: string(store.Local), Refused: why, Lines: []shapes.Line{}}
	c.report(rep, false, nil)
	return ExitRefused
}

func (c *command) apply(file string, plan bool) int {
	return c.applyFrom(file, plan, store.Local)
}

// DefaultBundle is the carried bundle: a declaration the package (or the
// person who installed it) puts beside the binaries, applied by
// `mesh-executor reconcile` as the bundle source — trusted like a local
// file, and kept apart from what the link and rescue files declare.
const DefaultBundle = "/usr/lib/nox-mesh-host/foundation.lock"

// bundleReport is what `mesh-executor bundle` returns: whether this host
// can be a mesh's first node (raise the control side from the carried
// bundle), and why not.
type bundleReport struct {
	FirstNode bool   `json:"first_node"`
	Partial   bool   `json:"partial"`
	Reason    string `json:"reason,omitempty"`
	Bundle    string `json:"bundle"`
	Present   bool   `json:"present"`
	Resources int    `json:"resources,omitempty"`
	// Pinned is the digest this build takes (BundleDigest), and Digest
	// the file's; reconcile refuses the file when they differ.
	Pinned string `json:"pinned_sha256,omitempty"`
	Digest string `json:"sha256,omitempty"`
}

// bundle says whether this host can be a first node, with the bundle at
// path, as a file (out, or standard output): not a partial host — it may
// drive no init, so it cannot raise the control side as a service — nor
// one whose reconcile would apply nothing (no bundle) or refuse it (not
// the bundle this build carries, or no declaration); the file says why.
func (c *command) bundle(path, out string) int {
	r := bundleReport{Bundle: path, Partial: c.partial, Pinned: BundleDigest}
	// What reconcile does with it, in its order (reconcile, applyFrom).
	var why error
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		why = fmt.Errorf("executor: there is no carried bundle at %s (the packages carry it; a binary built by hand does not): reconcile would apply nothing", path)
	} else if data, err := ReadLocalFile(path); err != nil {
		why = err
	} else {
		r.Present = true
		sum := sha256.Sum256(data)
		r.Digest = hex.EncodeToString(sum[:])
		if why = checkBundle(path, data); why == nil {
			d, err := shapes.ParseTrusted(data)
			if err != nil {
				why = shapes.InFile(path, data, err)
			} else {
				r.Resources = len(d.Resources)
			}
		}
	}
	if c.partial {
		why = errors.New("executor: a partial host cannot be a first node: it may drive no init, so it cannot raise the control side as a service; enrol it into a mesh raised on another machine")
	}
	code := 0
	if why != nil {
		r.Reason = why.Error()
		code = ExitRefused
	} else {
		r.FirstNode = true
	}
	b, _ := json.MarshalIndent(&r, "", "  ")
	b = append(b, '\n')
	if out == "" {
		c.out.Write(b)
	} else if err := os.WriteFile(out, b, 0o644); err != nil {
		fmt.Fprintf(c.errw, "executor: bundle: %v\n", err)
		return ExitFailed
	}
	if why != nil {
		fmt.Fprintln(c.errw, r.Reason)
	}
	return code
}

// reconcile applies the carried bundle, if there is one: only the one
// this build carries (BundleDigest), checked on the very bytes applied.
func (c *command) reconcile(bundle string) int {
	if _, err := os.Lstat(bundle); errors.Is(err, os.ErrNotExist) {
		return c.print(map[string]string{"bundle": bundle, "outcome": string(shapes.Unchanged)}, "no carried bundle at "+bundle+"; nothing to apply\n")
	}
	if BundleDigest == "" {
		c.log.Warn("this build pins no bundle (built without BUNDLE): the bundle is applied as it is", "bundle", bundle)
	}
	return c.applyFrom(bundle, false, store.Bundle)
}

// checkBundle refuses a bundle that is not the one this build carries.
func checkBundle(file string, data []byte) error {
	if BundleDigest == "" {
		return nil
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != BundleDigest {
		return fmt.Errorf("executor: the bundle %s has sha256 %s; this build carries the bundle with sha256 %s, fixed when it was built — it applies no other (to carry another, build the package with BUNDLE=FILE; to apply a file once, use mesh-executor apply)", file, got, BundleDigest)
	}
	return nil
}

func (c *command) applyFrom(file string, plan bool, src store.Source) int {
	// A rescue apply is one short process whose garbage is bounded by the
	// declaration it reads: collecting less often costs a little memory
	// and saves a fifth of a no-op's time.
	debug.SetGCPercent(400)
	if os.Geteuid() != 0 {
		return c.refuse("executor: apply and plan need root: the executor acts on the whole machine")
	}
	data, err := ReadLocalFile(file)
	if err != nil {
		return c.refuse(err.Error())
	}
	if src == store.Bundle {
		if err := checkBundle(file, data); err != nil {
			return c.refuse(err.Error())
		}
	}
	d, err := shapes.ParseTrusted(data)
	if err != nil {
		// Placed in the file, as the control side's commands place theirs:
		// a rescue file is written by hand.
		return c.refuse(shapes.InFile(file, data, err).Error())
	}
	var st *store.Store
	if plan {
		// A plan changes nothing, the state directory included: on a
		// machine the executor never ran on it plans against nothing held.
		var exists bool
		if st, exists, err = store.Peek(c.state); err != nil {
			return c.refuse(err.Error())
		}
		if !exists && !c.json {
			fmt.Fprintf(c.errw, "no state yet: %s does not exist; planned as if the host held nothing\n", c.state)
		}
	} else {
		_, serr := os.Lstat(c.state)
		if st, err = store.Open(c.state); err != nil {
			return c.refuse(err.Error())
		}
		if errors.Is(serr, os.ErrNotExist) && !c.json {
			// Said: a mistyped --state makes a second state, which
			// takes what the first one made for found.
			fmt.Fprintf(c.errw, "no state yet: %s did not exist; made now, and what this apply makes is held there (if another state was meant, give its --state)\n", c.state)
		}
		err := st.Lock(0)
		if errors.Is(err, store.ErrBusy) && c.wait > 0 {
			// Said before the wait, not after it: a rescue that seems to
			// hang for minutes is one a person kills.
			if !c.json {
				fmt.Fprintf(c.errw, "waiting up to %s for the store's lock: %v\n", c.wait, strings.TrimPrefix(err.Error(), "store: "))
			}
			err = st.Lock(c.wait)
		}
		if err != nil {
			return c.refuse(err.Error())
		}
		defer st.Unlock()
	}
	node := nodeID(c.state)
	if src == store.Bundle {
		node = "" // carried for any machine: it names no node
	}
	opt := engine.Options{
		Source: src, Plan: plan, Log: c.log, NodeID: node, Partial: c.partial,
		// Sealed content opens with the key enrolment made, bound to the
		// node and sequence the file itself names: a rescue file carries
		// content the control side sealed for exactly that declaration.
		Unseal:      serve.Unsealer(c.state, d.Node, d.Seq),
		HostVersion: c.version,
		// An overlay whose peers are the roster takes the one the host
		// holds (the control plane's, verified now).
		Roster: serve.HeldRoster(c.state),
	}
	if ls, err := launcher.ReadState(c.state); err == nil && ls.Failed != nil {
		opt.FailedHostRelease, opt.FailedHostReason = ls.Failed.Version, ls.Failed.Reason
	}
	var diffs map[string]string
	if plan && !c.json {
		diffs = map[string]string{}
		opt.OnDiff = func(module, id, diff string) { diffs[module+"."+id] = diff }
	}
	if !plan {
		trigger := "rescue" // root applied a local file
		if src == store.Bundle {
			trigger = "reconcile" // mesh-executor reconcile: the carried bundle
		}
		// Said through the history: durable before the apply's end is
		// journaled (engine.Options.Keep).
		opt.Keep = func(rep *shapes.Report) { st.KeepReport(src, trigger, rep) }
	}
	quit := func() {}
	if !plan {
		opt.Stop, quit = c.stopOnSignal()
	}
	rep := engine.Apply(context.Background(), st, d, data, opt)
	quit() // a signal after the apply is the signal's own
	c.report(rep, plan, diffs)
	if !plan && rep.Outcome != shapes.Refused {
		c.pruneArchives(st)
	}
	switch {
	case rep.Outcome == shapes.Refused:
		return ExitRefused
	case rep.Outcome == shapes.Failed:
		return ExitFailed
	}
	return ExitApplied
}

// pruneArchives drops from the archive cache what no saved target names
// any more, as the daemon does after its applies: a machine rescued by
// hand alone would otherwise keep every archive it ever unpacked. Left to
// the daemon while one runs: it knows what its agent is streaming for a
// declaration not applied yet, which no target names.
func (c *command) pruneArchives(st *store.Store) {
	if serving(c.state) > 0 {
		return
	}
	id, err := identity.Load(c.state)
	if err != nil {
		return
	}
	keep, ok := serve.NamedArchives(c.state, st, id, nil)
	if !ok {
		return
	}
	if gone := engine.PruneArchiveCache(c.state, keep); len(gone) > 0 && !c.json {
		fmt.Fprintf(c.errw, "the archive cache no longer keeps %s no declaration names\n", countArchives(len(gone)))
	}
}

func countArchives(n int) string {
	if n == 1 {
		return "1 archive"
	}
	return fmt.Sprintf("%d archives", n)
}

// nodeID is this node's id once it has an identity; "" while hosted.
func nodeID(state string) string {
	id, err := identity.Load(state)
	if err != nil || id == nil {
		return ""
	}
	return id.Node
}

// report prints rep; diffs (a plan's, by module.id) follow their lines.
func (c *command) report(rep *shapes.Report, plan bool, diffs map[string]string) {
	if c.json {
		// One line: a report may hold thousands of lines, and it is read by
		// programs. Written by hand, as encoding/json would (see shapes).
		b, err := rep.AppendJSON(make([]byte, 0, 64+96*len(rep.Lines)))
		if err != nil {
			b, _ = json.Marshal(rep)
		}
		c.out.Write(append(b, '\n'))
		return
	}
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	out := c.out
	c.out = w
	defer func() { c.out = out }()
	if rep.Refused != "" {
		// Said once, one way: "refused by the executor: …", not
		// "refused: executor: refused: …" nor "refused: executor: local
		// file …" (the report's field keeps the whole). A rescue's
		// refusal is the executor's, whatever refused it in there.
		why := strings.TrimPrefix(rep.Refused, "executor: ")
		why = strings.TrimPrefix(why, "refused: ")
		fmt.Fprintf(c.out, "refused by the executor: %s\nnothing on the machine was changed.\n", why)
		return
	}
	// A plan's lines say what would be (shapes.Outcome.Planned), in a
	// column as wide as its longest word.
	say, width := func(o shapes.Outcome) string { return string(o) }, 13
	if plan {
		fmt.Fprintln(c.out, "plan: what the next apply would do (nothing was changed)")
		say, width = shapes.Outcome.Planned, 20
	}
	// A resource's diff goes under the line that makes it, once: a
	// resource moved or reshaped has a second line, its old target's
	// undoing (removed, restored, kept, forgotten), which is not this diff
	// and may come first.
	nameOf := func(l shapes.Line) string {
		if l.Module == "" {
			return "-"
		}
		return l.Module + "." + l.ID
	}
	under := map[string]int{}
	for i, l := range rep.Lines {
		j, seen := under[nameOf(l)]
		if !seen || undoing(rep.Lines[j].Outcome) && !undoing(l.Outcome) {
			under[nameOf(l)] = i
		}
	}
	counts := map[shapes.Outcome]int{}
	for i, l := range rep.Lines {
		counts[l.Outcome]++
		name := nameOf(l)
		fmt.Fprintf(c.out, "%-*s %-28s %-10s %s\n", width, say(l.Outcome), name, l.Type, l.Detail)
		if d := diffs[name]; d != "" && under[name] == i {
			for _, dl := range strings.SplitAfter(strings.TrimSuffix(d, "\n"), "\n") {
				fmt.Fprintf(c.out, "    %s", strings.TrimSuffix(dl, "\n")+"\n")
			}
		}
	}
	var parts []string
	for _, o := range shapes.LineOutcomes() {
		if counts[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[o], say(o)))
		}
	}
	if len(parts) == 0 {
		parts = []string{"nothing declared, nothing of this source's held"}
	}
	fmt.Fprintf(c.out, "outcome: %s (%s)\n", say(rep.Outcome), strings.Join(parts, ", "))
}

// ReadLocalFile reads a declaration named by root on the command line. It
// must be a regular file owned by root, writable by nobody else, reached
// without a symlink, below directories only root can change.
func ReadLocalFile(name string) ([]byte, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return nil, fmt.Errorf("executor: local file %s: %w", name, err)
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		info, err := fsx.Lstat(dir)
		if err != nil {
			return nil, fmt.Errorf("executor: local file %s: %w", abs, err)
		}
		switch {
		case info.Kind != fsx.Dir:
			return nil, fmt.Errorf("executor: local file %s: %s is a %s on the way to it; the path must have no links", abs, dir, info.Kind)
		case info.UID != 0:
			return nil, fmt.Errorf("executor: local file %s: directory %s is owned by uid %d, not root; another user could swap the file", abs, dir, info.UID)
		case info.Mode&0o022 != 0 && info.Mode&0o1000 == 0:
			return nil, fmt.Errorf("executor: local file %s: directory %s has mode %04o, writable by others without the sticky bit; another user could swap the file", abs, dir, info.Mode)
		}
		if dir == "/" {
			break
		}
	}
	data, info, err := fsx.ReadRegular(abs, maxLocalFile)
	if err != nil {
		if errors.Is(err, fsx.ErrSymlink) {
			return nil, fmt.Errorf("executor: local file %s: a symbolic link is on the path; name the file itself", abs)
		}
		return nil, fmt.Errorf("executor: local file: %w", err)
	}
	switch {
	case info.Kind == fsx.Absent:
		return nil, fmt.Errorf("executor: local file %s does not exist", abs)
	case info.UID != 0:
		return nil, fmt.Errorf("executor: local file %s is owned by uid %d; only a file root owns is applied", abs, info.UID)
	case info.Mode&0o022 != 0:
		return nil, fmt.Errorf("executor: local file %s has mode %04o; group or others may write it, so it is not root's word", abs, info.Mode)
	}
	return data, nil
}

// ownedEntry is how `owned` shows an entry.
type ownedEntry struct {
	Target   string          `json:"target"`
	Type     string          `json:"type"`
	Claims   []store.Claim   `json:"claims"`
	How      string          `json:"how"`
	Original *store.Original `json:"original,omitempty"`
	// Salvaged is set on the list's own kind of item (type "salvaged",
	// target "salvaged:PATH", claimed by nobody): content the store keeps
	// of a hand-edited file the host removed, or gave its found original
	// back over. It is an item of the same
	// list rather than a list beside it, so that every reader of the list
	// `owned --json` has always printed reads it still.
	Salvaged *ownedSalvaged `json:"salvaged,omitempty"`
	// Paths, on an archive, are the files and directories it wrote: what
	// the host holds is each of them, not the archive's record alone.
	Paths []string `json:"paths,omitempty"`
	// Pending is an entry whose last change was begun and not recorded
	// (the apply failed at it, or died): what the machine holds of it is
	// unknown until the next apply looks.
	Pending bool `json:"pending,omitempty"`
	// Undeclared is an entry that every claim's source no longer declares
	// (its saved declaration names no such resource), held still because
	// the apply that undeclared it kept it (a directory holding what the
	// host did not make), could not undo it, or was cut short before it.
	Undeclared bool `json:"undeclared,omitempty"`
}

// declaredNow is, by source, the claims its saved declaration makes, as
// the reconcile reads it (serve.SavedTarget). A source with no saved
// declaration the reconcile reads (none, or one it skips) is absent: what
// it claims is not said to be undeclared.
func declaredNow(state string, st *store.Store) map[store.Source]map[store.Claim]bool {
	id, _ := identity.Load(state)
	out := map[store.Source]map[store.Claim]bool{}
	for _, src := range []store.Source{store.Bundle, store.Link, store.Local} {
		d, _, _, err := serve.SavedTarget(state, st, src, id)
		if err != nil || d == nil {
			continue
		}
		m := map[store.Claim]bool{}
		for _, r := range d.Resources {
			h := r.Head()
			m[store.Claim{Source: src, Module: h.Module, ID: h.ID}] = true
		}
		out[src] = m
	}
	return out
}

// undeclared says whether every claim of e is one its source's saved
// declaration no longer makes.
func undeclared(e *store.Entry, declared map[store.Source]map[store.Claim]bool) bool {
	for _, c := range e.Claims {
		m, known := declared[c.Source]
		if !known || m[c] {
			return false
		}
	}
	return len(e.Claims) > 0
}

// ownedSalvaged says where salvaged content is and until when.
type ownedSalvaged struct {
	Path      string    `json:"path"`
	Module    string    `json:"module"`
	ID        string    `json:"id"`
	Removed   time.Time `json:"removed"` // when it was undeclared (removed, or its original put back)
	Digest    string    `json:"digest"`  // sha256 of the content kept
	Written   string    `json:"written"` // what the host had written there
	KeptAt    string    `json:"kept_at"`
	KeptUntil time.Time `json:"kept_until"`
}

// undeclaredSaid is what owned adds to an entry every claim's source no
// longer declares: why it is there is the last apply's to say (a
// directory kept for what it holds, a removal that failed, an apply cut
// short before it got there), and the next apply's to end.
const undeclaredSaid = "; undeclared: its declaration no longer names it, and the next apply undoes it or its line says why not (a directory holding what the host did not make is kept until it is empty)"

// describe says how the host holds e; applying is the pid of an apply
// running now (0: none), which a pending change may be of.
func describe(e *store.Entry, applying int) string {
	switch {
	case e.Pending != nil && applying > 0:
		return fmt.Sprintf("pending: a change begun and not recorded (%s): the apply running now (pid %d) is making it, or one before failed at it or died; the apply after it looks at what it left", e.Pending.Op, applying)
	case e.Pending != nil:
		return "pending: a change begun and not recorded (" + e.Pending.Op + "), the apply having failed at it or died; the next apply looks at what it left"
	case e.Held:
		return "held as found (adopted node)"
	case len(e.Claims) == 0:
		return "kept: undeclared, but it holds what the host did not make"
	case e.Created:
		return "created by the host"
	case e.Original != nil:
		return "changed by the host; original kept"
	case e.Type == shapes.TypeAction:
		return "applied"
	}
	return "held by the host"
}

// needRoot says, for a command that reads the executor's state, that it
// needs root, rather than letting it fail on the first directory it may
// not read.
func (c *command) needRoot(cmd string) bool {
	if os.Geteuid() == 0 {
		return true
	}
	// Said as it is: the directory the executor makes is root's, 0700,
	// but the one named may be missing, or another's.
	what := "which the executor keeps root's, mode 0700"
	switch fi, err := os.Stat(c.state); {
	case errors.Is(err, os.ErrNotExist):
		what = "which does not exist yet"
	case err != nil:
		// Not to be looked at by this user: as the executor keeps it.
	default:
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			what = fmt.Sprintf("uid %d's here, mode %04o; the executor keeps its own root's", st.Uid, fi.Mode().Perm())
		}
	}
	fmt.Fprintf(c.errw, "mesh-executor: %s: needs root: it reads the executor's state in %s, %s\n", cmd, c.state, what)
	return false
}

// peek opens the state for a read-only command, creating nothing; ok is
// false when it failed (said on standard error).
func (c *command) peek() (st *store.Store, exists, ok bool) {
	st, exists, err := store.Peek(c.state)
	if err != nil {
		fmt.Fprintf(c.errw, "mesh-executor: %v\n", err)
		return nil, exists, false
	}
	return st, exists, true
}

func (c *command) noState() string {
	return fmt.Sprintf("no state yet: %s does not exist (this executor has not applied or enrolled anything here)", c.state)
}

func (c *command) owned() int {
	if !c.needRoot("owned") {
		return ExitRefused
	}
	st, exists, ok := c.peek()
	if !ok {
		return ExitFailed
	}
	if !exists {
		return c.print([]ownedEntry{}, c.noState()+"\nthe host holds nothing on this machine\n")
	}
	var list []ownedEntry
	var b strings.Builder
	declared := declaredNow(c.state, st)
	applying := store.LockHolder(c.state)
	for _, e := range st.Entries() {
		gone := undeclared(e, declared)
		oe := ownedEntry{Target: e.Target, Type: e.Type, Claims: e.Claims, How: describe(e, applying), Original: e.Original, Paths: e.Paths, Pending: e.Pending != nil, Undeclared: gone}
		if oe.Claims == nil {
			oe.Claims = []store.Claim{}
		}
		list = append(list, oe)
		var cl []string
		for _, x := range e.Claims {
			cl = append(cl, x.Key())
		}
		how := oe.How
		if gone {
			how += undeclaredSaid
		}
		fmt.Fprintf(&b, "%-40s %-10s %-30s %s\n", e.Target, e.Type, strings.Join(cl, ","), how)
		for _, p := range e.Paths {
			fmt.Fprintf(&b, "  %s\n", p) // what an archive wrote
		}
	}
	if list == nil {
		list = []ownedEntry{}
		b.WriteString("the host holds nothing on this machine\n")
	}
	if salvaged := st.Salvaged(); len(salvaged) > 0 {
		fmt.Fprintf(&b, "\nwhat the host kept of files when they were undeclared — edited by hand since it wrote them, then removed or given their original back over, or an original with nowhere to go back to — is kept until the date shown:\n")
		for _, x := range salvaged {
			v := &ownedSalvaged{Path: x.Path, Module: x.Module, ID: x.ID, Removed: x.Removed, Digest: x.Digest, Written: x.Written,
				KeptAt: st.OriginalPath(x.Digest), KeptUntil: x.Removed.Add(store.SalvageKeep)}
			fmt.Fprintf(&b, "%s (%s.%s, undeclared %s): %s until %s\n", x.Path, x.Module, x.ID, x.Removed.Format(time.RFC3339), v.KeptAt, v.KeptUntil.Format("2006-01-02"))
			list = append(list, ownedEntry{Target: "salvaged:" + x.Path, Type: "salvaged", Claims: []store.Claim{}, Salvaged: v,
				How: fmt.Sprintf("salvaged: kept when undeclared (edited by hand since the host wrote it, or an original with nowhere to go back to); what it held is kept at %s until %s", v.KeptAt, v.KeptUntil.Format("2006-01-02"))})
		}
	}
	return c.print(list, b.String())
}

type statusReport struct {
	State string `json:"state"`
	// NoState: the state directory does not exist (nothing applied or
	// enrolled here yet); the command created nothing.
	NoState   bool   `json:"no_state,omitempty"`
	Node      string `json:"node,omitempty"`
	Enrolment string `json:"enrolment,omitempty"`
	// Enrolling: an enrolment was begun (mesh-executor enrol) and the
	// agent has not finished it; LastEnrolment is how the last one went.
	Enrolling     bool               `json:"enrolling,omitempty"`
	Pending       *enrol.PendingView `json:"pending,omitempty"`
	LastEnrolment *enrol.Result      `json:"last_enrolment,omitempty"`
	// Rekey: root asked for the node's keys to be renewed (mesh-executor
	// rekey), and the control side has not answered yet.
	Rekey   *enrol.RekeyView         `json:"rekey,omitempty"`
	Version string                   `json:"version"`
	Holds   int                      `json:"holds"`
	Sources map[string]*sourceStatus `json:"sources"`
	// Link is the agent's link as it last told the daemon, enrolled only:
	// "enrolled" and disconnected is a state of its own, said with since
	// when: no fixed "silent" threshold decides it.
	Link *serve.LinkState `json:"link,omitempty"`
	// Faults counts the panics the daemon recovered from at its request
	// boundary, with the last one (its stack is in the daemon's log).
	Faults *serve.Faults `json:"faults,omitempty"`
	// Unheld, enrolled only: the link's last declaration is addressed to
	// another enrolment than the one held (the machine was enrolled
	// again): the daemon reconciles only this enrolment's, so nothing the
	// link declared is held against drift until one comes.
	Unheld *unheldTarget `json:"unheld,omitempty"`
	// DaemonRunning: a mesh-executor serve holds this state now (the pid
	// its lock names is alive); false, what the rest says is what the
	// daemon last wrote.
	DaemonRunning bool `json:"daemon_running"`
	DaemonPID     int  `json:"daemon_pid,omitempty"`
}

// unheldTarget is the link's last declaration, when it is not this
// enrolment's.
type unheldTarget struct {
	Seq       uint64 `json:"seq"`
	Node      string `json:"node"`
	Enrolment string `json:"enrolment"`
}

// unheld says whether the link's saved declaration is another
// enrolment's than id's (read only; verified under the pinned key, as the
// daemon's reconcile reads it).
func unheld(st *store.Store, id *identity.Identity) *unheldTarget {
	raw, err := st.Target(store.Link)
	if err != nil || raw == nil {
		return nil
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeDeclaration, raw)
	if err != nil {
		return nil
	}
	d, err := shapes.Parse(payload)
	if err != nil || serve.AddressedHere(d, id) {
		return nil
	}
	return &unheldTarget{Seq: d.Seq, Node: d.Node, Enrolment: d.Enrolment}
}

// linkSilentAfter: an agent that has said nothing for this long (it says
// its link every few seconds, and the daemon keeps it once a minute) is
// not running, or not reaching the executor.
const linkSilentAfter = 3 * time.Minute

// linkLine says the link as the agent last told it.
func linkLine(l *serve.LinkState, now time.Time, node string) string {
	ts := func(t time.Time) string { return t.Local().Format(time.RFC3339) }
	node = cmp.Or(node, "NAME")
	var b strings.Builder
	switch {
	case l.Up:
		fmt.Fprintf(&b, "link: linked since %s", ts(l.Since))
	case !l.Revoked.IsZero():
		// Not "disconnected": waiting does not bring it back, and the
		// agent tries only seldom (up to once an hour).
		fmt.Fprintf(&b, "link: revoked by the control side at %s (%s ago): the broker refuses this node's credential; mesh-control token issue --node %s (--new --name %s once the node is deleted), then mesh-executor enrol, enrols this machine again",
			ts(l.Revoked), now.Sub(l.Revoked).Round(time.Second), node, node)
	case l.Since.IsZero():
		b.WriteString("link: disconnected (never linked)")
	default:
		fmt.Fprintf(&b, "link: disconnected since %s (%s ago)", ts(l.Since), now.Sub(l.Since).Round(time.Second))
	}
	if !l.Up && l.Revoked.IsZero() && l.LastError != "" {
		fmt.Fprintf(&b, "; the agent's last error: %s", l.LastError)
	}
	if age := now.Sub(l.SaidAt); age > linkSilentAfter {
		fmt.Fprintf(&b, "; but the agent has said nothing since %s: is it running?", ts(l.SaidAt))
	}
	return b.String() + "\n"
}

type sourceStatus struct {
	Seq     uint64         `json:"seq"`
	Outcome shapes.Outcome `json:"outcome,omitempty"`
	// Applying is the pid of an apply of this source running now;
	// CutShort, that one began after the last report and never ended (a
	// kill, a power cut): the outcome is of the apply before it.
	Applying int  `json:"applying,omitempty"`
	CutShort bool `json:"cut_short,omitempty"`
}

func (c *command) status() int {
	if !c.needRoot("status") {
		return ExitRefused
	}
	st, exists, ok := c.peek()
	if !ok {
		return ExitFailed
	}
	s := statusReport{State: "hosted", NoState: !exists, Version: c.version, Holds: len(st.Entries()), Sources: map[string]*sourceStatus{}}
	if exists {
		if id, err := identity.Load(c.state); err == nil && id != nil {
			s.State, s.Node, s.Enrolment = "enrolled", id.Node, id.Enrolment
			s.Unheld = unheld(st, id)
		}
		// Read as it is: enrol.IsPending is the daemon's, and may end an
		// expired enrolment; status changes nothing.
		s.Pending, _ = enrol.ReadPending(c.state)
		s.Enrolling = s.Pending != nil
		s.LastEnrolment, _ = enrol.ReadResult(c.state)
		s.Rekey, _ = enrol.ReadRekey(c.state)
	}
	for _, src := range []store.Source{store.Link, store.Bundle, store.Local} {
		data, _ := st.Report(src)
		if data == nil {
			continue
		}
		var rep store.ReportSummary
		if json.Unmarshal(data, &rep) == nil {
			s.Sources[string(src)] = &sourceStatus{Seq: rep.Seq, Outcome: rep.Outcome}
		}
	}
	holder, unended := store.LockHolder(c.state), st.Unended()
	for i, b := range unended {
		ss := s.Sources[string(b.Source)]
		if ss == nil {
			ss = &sourceStatus{Seq: b.Seq}
			s.Sources[string(b.Source)] = ss
		}
		// The lock's holder runs the last one if it began it: it may
		// hold the lock before it begins (waiting for what a killed
		// executor left running), and the last is then one cut short.
		if holder > 0 && i == len(unended)-1 && (b.PID == holder || b.PID == 0) {
			ss.Applying = holder
		} else {
			ss.CutShort = true
		}
	}
	if s.State == "enrolled" {
		s.Link, _ = serve.ReadLinkState(c.state)
	}
	if exists {
		// What follows is what the daemon last wrote: whether one runs
		// now is said first (the pid its lock names, alive), never left
		// to a stale "linked since".
		s.DaemonPID = serving(c.state)
		s.DaemonRunning = s.DaemonPID > 0
	}
	if f, err := serve.ReadFaults(c.state); err == nil && f.Recovered > 0 {
		s.Faults = &f
	}
	var b strings.Builder
	state := s.State
	switch {
	case s.Link != nil && !s.Link.Up && !s.Link.Revoked.IsZero():
		state += ", revoked"
	case s.Link != nil && !s.Link.Up:
		state += ", disconnected"
	}
	fmt.Fprintf(&b, "state: %s\n", state)
	switch {
	case s.DaemonRunning:
		fmt.Fprintf(&b, "daemon: running (pid %d)\n", s.DaemonPID)
	case exists:
		fmt.Fprintf(&b, "daemon: not running (no mesh-executor serve holds %s): what follows is as the daemon, or the last apply, left it; start it through the init (mesh-executor doctor says more)\n", c.state)
	}
	if s.Link != nil {
		b.WriteString(linkLine(s.Link, clock.Now(), s.Node))
	}
	if s.NoState {
		fmt.Fprintf(&b, "%s\n", c.noState())
	}
	if s.Node != "" {
		fmt.Fprintf(&b, "node: %s (enrolment %s)\n", s.Node, s.Enrolment)
	}
	if r := s.Rekey; r != nil {
		fmt.Fprintf(&b, "rekey: asked for since %s; waiting for the control side's answer (the agent carries the request with its heartbeats)\n", r.Begun.Local().Format(time.RFC3339))
	}
	if p := s.Pending; p != nil {
		fmt.Fprintf(&b, "enrolment: begun (token %s, expires %s)", p.Token, p.Expires.Local().Format(time.RFC3339))
		switch {
		case p.Held != nil && p.Held.Replace:
			fmt.Fprintf(&b, ", replacing %s", p.Held.Name())
		case p.Held != nil:
			fmt.Fprintf(&b, ", over %s (not replacing it)", p.Held.Name())
		}
		b.WriteString("\n")
		last := s.LastEnrolment
		switch {
		case p.Expired:
			b.WriteString("  its token has expired: the daemon ends it the next time the agent asks\n")
		case last != nil && last.Token == p.Token && last.Claimed:
			fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(last.String(), "\n", "\n  "))
			if !p.HeldBack.IsZero() {
				fmt.Fprintf(&b, "  offered to the agent again after %s\n", p.HeldBack.Local().Format(time.RFC3339))
			}
		case last != nil && last.Token == p.Token && last.Reason != "":
			fmt.Fprintf(&b, "  %s\n", last)
		default:
			b.WriteString("  waiting for the agent\n")
		}
	} else if s.LastEnrolment != nil && s.LastEnrolment.Final {
		fmt.Fprintf(&b, "last enrolment: %s", s.LastEnrolment)
		if !s.LastEnrolment.Enrolled && s.State == "enrolled" {
			// A token used again, say: refused, and nothing changed.
			fmt.Fprintf(&b, " — this host keeps the identity it holds (node %s, enrolment %s)", s.Node, s.Enrolment)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "version: %s\nholds: %d\n", s.Version, s.Holds)
	if f := s.Faults; f != nil {
		fmt.Fprintf(&b, "internal errors: %d recovered (the daemon went on); the last at %s serving %s: %s — the daemon's log has its stack\n",
			f.Recovered, f.LastAt.Local().Format(time.RFC3339), f.LastIn, f.LastPanic)
	}
	var names []string
	for n := range s.Sources {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ss := s.Sources[n]
		var said []string
		if ss.Outcome != "" {
			said = append(said, string(ss.Outcome))
		}
		switch {
		case ss.Applying > 0:
			said = append(said, fmt.Sprintf("running now (pid %d)", ss.Applying))
		case ss.CutShort:
			said = append(said, "cut short since (a kill or a power cut: begun, never ended): the next apply settles what it began")
		}
		last := strings.Join(said, "; ")
		if n == string(store.Link) {
			last = fmt.Sprintf("seq %d, %s", ss.Seq, last)
		} // a rescue file or the bundle has no sequence
		fmt.Fprintf(&b, "last %s apply: %s\n", n, last)
	}
	if u := s.Unheld; u != nil {
		fmt.Fprintf(&b, "held: nothing the link declared — its last declaration (seq %d) is addressed to node %s, enrolment %s, not this one, and only this enrolment's is reconciled; what it made stays, a drift is not put back, until the control side declares to this enrolment (mesh-control declare %s FILE)\n",
			u.Seq, u.Node, u.Enrolment, s.Node)
	}
	return c.print(s, b.String())
}

func (c *command) profile() int {
	p := profile.Detect(context.Background(), profile.Options{})
	var b strings.Builder
	for _, cp := range p.Capabilities {
		if cp.Present {
			fmt.Fprintf(&b, "%-18s present  %s\n", cp.Name, cp.Detail)
		} else {
			fmt.Fprintf(&b, "%-18s absent   %s\n", cp.Name, cp.Reason)
		}
	}
	return c.print(p, b.String())
}

func (c *command) inventory() int {
	inv, err := profile.Collect(context.Background(), c.version)
	if err != nil {
		c.log.Warn("inventory incomplete", "err", err)
	}
	// What the host holds is root's to read; the rest of the inventory is
	// anyone's. Either way nothing is created.
	holds := " (not counted: the executor's state is root's)"
	if os.Geteuid() == 0 {
		switch st, exists, err := store.Peek(c.state); {
		case err != nil:
			holds = " (not counted: " + err.Error() + ")"
		case !exists:
			holds = " (no state yet: " + c.state + " does not exist)"
		default:
			inv.Holds, holds = len(st.Entries()), ""
		}
	}
	text := fmt.Sprintf("hostname: %s\nmachine-id: %s\narchitecture: %s\nkernel: %s\nos: %s\nmemory: %d MiB\ncpus: %d\nhost version: %s\nholds: %d%s\n",
		inv.Hostname, inv.MachineID, inv.Arch, inv.Kernel, inv.OSRelease, inv.MemoryBytes>>20, inv.CPUs, inv.HostVersion, inv.Holds, holds)
	return c.print(inv, text)
}

// serveFlags are serve's options.
type serveFlags struct {
	stateDir, socket, agentState, agentUser, vsockCIDs, vsockSecret, build, hostBinary, metricsFile *string
	vsockPort                                                                                       *uint
	agentUID                                                                                        *int
	drift                                                                                           *time.Duration
	partial                                                                                         *bool
}

// serveFlagSet is serve's command line, defined once: serve parses it,
// and so does the test of the init files that start serve with flags of
// their own (Android's mesh-host.rc), so a file cannot name a flag the
// binary does not have.
func serveFlagSet(errw io.Writer) (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("mesh-executor serve", flag.ContinueOnError)
	fs.SetOutput(errw)
	return fs, &serveFlags{
		stateDir:    fs.String("state", DefaultState, "the executor's state directory"),
		socket:      fs.String("socket", wire.SocketPath, "the socket the agent connects to"),
		agentState:  fs.String("agent-state", "/var/lib/mesh-host/agent", "the agent's state directory (in the protected set wherever it is)"),
		agentUser:   fs.String("agent-user", "mesh-agent", "the agent's user: the only one besides root that may connect"),
		vsockPort:   fs.Uint("vsock-port", 0, "also listen for the agent on this vsock port (0: no vsock)"),
		vsockCIDs:   fs.String("vsock-cids", "", "the context ids that may connect over vsock, comma-separated"),
		vsockSecret: fs.String("vsock-secret", "", "a root-only file holding the secret every vsock connection's hello must present"),
		agentUID:    fs.Int("agent-uid", 0, "the agent's uid, numeric (an Android app's, which no passwd names); overrides --agent-user"),
		drift:       fs.Duration("drift", 10*time.Minute, "how often to look for drift (0: never)"),
		build:       fs.String("build", Build, "the build id the agent compares at hello"),
		hostBinary:  fs.String("host-binary", engine.DefaultHostBinary, "where the host's package installs the executor (an upgrade runs it to check it)"),
		partial:     fs.Bool("partial", false, "a partial host: file, directory, region, keys, action and archive only"),
		metricsFile: fs.String("metrics-file", "", "write the executor's metrics after each apply, in Prometheus' text format, to this file (node_exporter's textfile collector, e.g. /var/lib/prometheus/node-exporter/mesh-executor.prom)"),
	}
}

// ServeFlags is serve's command line, for what checks the files that
// start it (tests/initfiles_test.go): parse an init file's arguments with
// it and a flag the binary lacks is an error.
func ServeFlags(errw io.Writer) *flag.FlagSet {
	fs, _ := serveFlagSet(errw)
	return fs
}

// serve runs the daemon until SIGTERM or SIGINT.
func (c *command) serve(args []string) int {
	fs, f := serveFlagSet(c.errw)
	err := cmdline.ParseAlone(fs, args, c.errw)
	if errors.Is(err, flag.ErrHelp) || (err == nil && fs.NArg() == 1 && cmdline.IsHelp(fs.Arg(0))) {
		var o options
		t := table(&o)
		for _, cmd := range t.Commands {
			if cmd.Name == "serve" {
				t.Help(c.out, cmd)
			}
		}
		return 0
	}
	if err != nil {
		return ExitRefused
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.errw, "mesh-executor: serve: unexpected %q\n", fs.Arg(0))
		return ExitRefused
	}
	stateDir, socket, agentState, agentUser := f.stateDir, f.socket, f.agentState, f.agentUser
	absolute(stateDir, socket, agentState, f.hostBinary, f.metricsFile, f.vsockSecret)
	vsockPort, vsockCIDs, vsockSecret, agentUID := f.vsockPort, f.vsockCIDs, f.vsockSecret, f.agentUID
	drift, build, hostBinary, partial := f.drift, f.build, f.hostBinary, f.partial
	log := slog.New(slog.NewTextHandler(c.errw, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if os.Geteuid() != 0 {
		log.Error("executor: serve needs root: it acts on the whole machine")
		return ExitRefused
	}
	if *drift < 0 {
		fmt.Fprintf(c.errw, "mesh-executor: serve: --drift %s: a time to wait must not be negative (0 looks for drift never)\n", *drift)
		return ExitRefused
	}
	var uid, gid int
	if *agentUID > 0 {
		// An Android app's uid: its gid is the same number, and the
		// socket's directory is opened to that group alone.
		uid, gid = *agentUID, *agentUID
		*agentUser = strconv.Itoa(uid)
	} else {
		u, err := user.Lookup(*agentUser)
		if err != nil {
			log.Error("executor: the agent's user is unknown", "user", *agentUser, "err", err)
			return ExitRefused
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	if !*partial && initsys.Android("") {
		*partial = true
		log.Info("executor: a partial host (Android: no init this host may drive): file, directory, region, keys, action and archive only")
	}
	_, serr := os.Lstat(*stateDir)
	if _, err := store.Open(*stateDir); err != nil {
		log.Error("executor: state", "err", err)
		return ExitRefused
	}
	if errors.Is(serr, os.ErrNotExist) {
		// Said: a mistyped --state serves an empty store, which takes
		// what the first one made for found.
		log.Warn("executor: no state yet: made now, and what this daemon applies is held there (if another state was meant, give its --state)", "state", *stateDir)
	}
	// One daemon per state, before the socket is touched: a second one
	// would take the socket from the first and apply beside it.
	lock, err := lockServe(*stateDir)
	if err != nil {
		fmt.Fprintf(c.errw, "mesh-executor: serve: %v\n", err)
		return ExitRefused
	}
	defer lock.Close()
	ln, err := wire.ListenUnix(*socket, gid)
	if err != nil {
		log.Error("executor: socket", "err", err)
		return ExitFailed
	}
	cmdline.KeepOnHangup(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The first signal stops the daemon, which lets the step in progress
	// end; a second is the signal's own and ends it at once (what that
	// cuts, the next start resumes).
	go func() {
		<-ctx.Done()
		stop()
	}()
	// The agent is the one installed beside the executor: Healthy keeps
	// it with the executor, once it is proven to stay up (serve).
	agentBin := ""
	if exe, err := os.Executable(); err == nil && fileExists(filepath.Join(filepath.Dir(exe), "mesh-agent")) {
		agentBin = filepath.Join(filepath.Dir(exe), "mesh-agent")
	}
	healthy := func() error {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		bins := map[string]string{"mesh-executor": exe}
		if agentBin != "" {
			bins["mesh-agent"] = agentBin
		}
		// Run from the installed package, the known-good copy also names
		// the package's version: a rollback reinstalls it through the
		// package manager.
		pkg := ""
		if samePath(exe, launcher.DefaultInstalled()["mesh-executor"]) {
			pkg = launcher.PackageVersion(ctx)
		}
		return launcher.HealthyPackage(*stateDir, bins, pkg)
	}
	cfg := serve.Config{StateDir: *stateDir, Version: c.version, Build: *build, AgentUID: uid,
		DriftEvery: *drift, Partial: *partial, Log: log, Healthy: healthy, HostBinary: *hostBinary, AgentState: *agentState, AgentBinary: agentBin, AgentUser: *agentUser, MetricsFile: *f.metricsFile}
	var vln net.Listener
	if *vsockPort != 0 {
		if cfg.VsockCIDs, err = parseCIDs(*vsockCIDs); err != nil {
			log.Error("executor: --vsock-cids", "err", err)
			return ExitRefused
		}
		if cfg.VsockSecret, err = readSecret(*vsockSecret); err != nil {
			log.Error("executor: --vsock-secret", "err", err)
			return ExitRefused
		}
		if vln, err = wire.ListenVsock(uint32(*vsockPort)); err != nil {
			log.Error("executor: vsock", "err", err)
			return ExitFailed
		}
	}
	srv := serve.New(cfg)
	var more []net.Listener
	if vln != nil {
		log.Info("executor: serving over vsock too", "port", *vsockPort, "cids", cfg.VsockCIDs)
		more = append(more, vln)
	}
	log.Info("executor: serving", "socket", *socket, "state", *stateDir, "agent", *agentUser, "uid", uid, "version", c.version)
	if err := srv.Run(ctx, ln, more...); err != nil {
		log.Error("executor: serve", "err", err)
		return ExitFailed
	}
	// Said, so a log read later tells a stop asked for from a crash.
	if ctx.Err() != nil {
		log.Info("executor: stopped: asked to (SIGTERM or SIGINT)")
	}
	return 0
}

// stopOnSignal makes a first SIGINT or SIGTERM during a rescue apply end
// it after the step in progress (engine.Options.Stop), said at once, not
// kill it in the middle of a package's install; a second one is the
// signal's own, and ends the process where it is (what it cut, the next
// apply resumes). quit stops listening.
func (c *command) stopOnSignal() (stop <-chan struct{}, quit func()) {
	asked := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	// A signal the command was started ignoring (SIGINT, run with & from
	// a script) stays ignored.
	var caught []os.Signal
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM} {
		if !signal.Ignored(sig) {
			caught = append(caught, sig)
		}
	}
	if len(caught) == 0 {
		return asked, func() {}
	}
	signal.Notify(sigs, caught...)
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		signal.Reset(caught...)
		fmt.Fprintln(c.errw, "asked to stop: the apply ends after the step in progress (ask again to stop at once; the next apply resumes what that cuts)")
		close(asked)
	}()
	return asked, func() {
		signal.Stop(sigs)
		close(done)
	}
}

// parseCIDs reads a comma-separated list of vsock context ids.
func parseCIDs(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("context id %q: %w", f, err)
		}
		out = append(out, uint32(n))
	}
	if len(out) == 0 {
		return nil, errors.New("name the context ids that may connect: vsock is opened to named peers only")
	}
	return out, nil
}

// readSecret reads the vsock connection secret from a root-only file.
func readSecret(p string) ([]byte, error) {
	if p == "" {
		return nil, errors.New("a vsock listener needs its connection secret (a root-only file)")
	}
	data, info, err := fsx.ReadRegular(p, 4096)
	switch {
	case err != nil:
		return nil, err
	case info.Kind == fsx.Absent:
		return nil, fmt.Errorf("%s does not exist", p)
	case info.UID != 0 || info.Mode&0o077 != 0:
		return nil, fmt.Errorf("%s is uid %d mode %04o; the secret must be root's and readable by nobody else", p, info.UID, info.Mode)
	}
	secret := []byte(strings.TrimSpace(string(data)))
	if len(secret) < 16 {
		return nil, fmt.Errorf("%s holds %d bytes; a connection secret is at least 16", p, len(secret))
	}
	return secret, nil
}

// samePath tells whether two paths are one file once links are resolved.
func samePath(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func (c *command) briefing() int {
	if !c.needRoot("briefing") {
		return ExitRefused
	}
	st, exists, ok := c.peek()
	if !ok {
		return ExitFailed
	}
	if !exists {
		return c.print(map[string]any{}, "no briefing: "+c.noState()+"\n")
	}
	b, err := st.Briefing()
	if err != nil {
		fmt.Fprintln(c.errw, err)
		return ExitFailed
	}
	if b == nil {
		return c.print(map[string]any{}, "no briefing: no apply on an adopted node yet\n")
	}
	var t strings.Builder
	fmt.Fprintf(&t, "outcome    %s\n", b.Outcome)
	if b.Node != "" {
		fmt.Fprintf(&t, "node       %s\n", b.Node)
	}
	fmt.Fprintf(&t, "adopted    %s\n\n", b.At.Format(time.RFC3339))
	for _, f := range b.Findings {
		fmt.Fprintf(&t, "  %-8s %-28s %-10s %s\n", f.Mark, f.Module+"."+f.ID, f.Type, f.Detail)
	}
	t.WriteString("\nwhat to look at\n")
	for _, l := range b.LookAt {
		fmt.Fprintf(&t, "  %s\n", l)
	}
	return c.print(b, t.String())
}

// undoing says whether a line of this outcome undoes what a source no
// longer declares, rather than making what it declares.
func undoing(o shapes.Outcome) bool {
	return o == shapes.Removed || o == shapes.Restored || o == shapes.Kept || o == shapes.Forgotten
}
