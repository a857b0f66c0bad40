package control

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nox-mesh/nox-mesh-host/cmdline"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
)

// DefaultControlDir is the key directory of a control side installed as
// a service (the packages' mesh-control.service, raised by the carried
// bundle), and DirEnv the variable that names another.
const (
	DefaultControlDir = "/var/lib/mesh-control"
	DirEnv            = "MESH_CONTROL_DIR"
)

// DefaultDir is --dir's default: $MESH_CONTROL_DIR, else DefaultControlDir.
func DefaultDir() string {
	if d := os.Getenv(DirEnv); d != "" {
		return d
	}
	return DefaultControlDir
}

// commands are mesh-control's commands: what each takes (its positional
// arguments, from min to max of them, and its flags by name, defined once
// in (*options).define) and what it does. Its --help, the usage, the shell
// completions and the man page are all made from this table (cmdline).
var commands = []cmdline.Def{
	cmdline.D("init", "", 0, 0, []string{"dir", "host", "url", "json"},
		"make the control-plane key, the broker certificate and the control NKey in the key directory"),
	cmdline.D("serve", "", 0, 0, []string{"dir", "listen", "nats", "replicas", "broker-config", "broker-accounts", "broker-pid", "metrics", "ui", "archive-grace"},
		`run the embedded broker (or use --nats URL) and keep the registry; with an existing broker,
keep FILE its configuration and send it SIGHUP on each change; the embedded broker's store is in
the key directory: one serve holds it (a second is refused)`),
	cmdline.D("token issue", "", 0, 0, []string{"dir", "nats", "new", "name", "node", "ttl", "broker-url", "json"},
		`print, once, a one-time enrolment token; it expires whether used or not (--new, or --node NAME,
which revokes the identity that node has now: a re-enrolment)`),
	cmdline.D("token list", "", 0, 0, []string{"dir", "nats", "json"},
		`list the enrolment tokens; each one's id, the node it is for, new or re-enrolment, when issued,
when it expires, and whether used (by which node), revoked, expired or usable (a token's record
goes a day after it expires)`),
	cmdline.D("token revoke", "ID", 1, 1, []string{"dir", "nats", "json"},
		`make a token unusable now; it enrols no one and the broker refuses its one-time credential from
then on. A used token is refused (it enrols no one again: node revoke NAME cuts off the machine it
enrolled), as is an unknown one; a token revoked already is said so (exit 0)`),
	cmdline.D("node revoke", "NAME", 1, 1, []string{"dir", "nats", "json"},
		`revoke the node's identity; the broker refuses it from now on, and nothing is declared, assigned
or published to it until a machine enrols as it again (token issue --node NAME); a node revoked
already is said so (exit 0)`),
	cmdline.D("node delete", "NAME", 1, 1, []string{"dir", "nats", "json"},
		`remove a revoked node from the control side; its registry records (the node, its address and its
claim, endpoint, assignments, composition, last report, briefing, profile and owned copy), its
declarations, reports and heartbeats, and the re-enrolment tokens issued for it, so the name can
be used again. A live node is refused: revoke it first`),
	cmdline.D("key rotate", "", 0, 0, []string{"dir", "nats", "recovery-key", "json"},
		`rotate the control-plane key (serve carries it out): a new key, announced to every enrolled node
in a statement addressed to it, signed by the key retired and by the new one, which the node takes
with the first message the new key signs; the roster and each node's newest declaration are
signed again to carry it. --recovery-key FILE signs it with the offline recovery key instead,
for when the control key is stolen (docs/operations.md, Rotating the control key)`),
	cmdline.D("nkey rotate", "", 0, 0, []string{"dir", "json"},
		`make the control NKey (control.nk) anew: the key serve and the commands sign in with to the
embedded broker, or to an existing broker configured from a file. Run with every serve of the key
directory stopped (refused while the embedded broker's serve holds it): each signs in with the new
key from its next start. The embedded broker lets it in as serve starts; an existing broker once
its configuration is written again (broker-config) and loaded, which cuts the old key's
connections. In operator mode there is no control NKey: see account-key rotate`),
	cmdline.D("operator-key rotate", "", 0, 0, []string{"dir", "nats", "switch", "force", "json"},
		`rotate the operator's key of a broker in NATS operator mode (broker-config --resolver), which signs
every account. A server trusts the operators its configuration names when it starts, so each step
is followed by writing the servers' configuration again and restarting each server: first a new
key beside the old, which broker-config --resolver then names beside it; then, with --switch once
every server trusts it (serve asks each; refused otherwise, naming them; --force when fewer
servers answer than the routes name), serve pushes every account again signed by the new key, and
broker-config --resolver names it alone`),
	cmdline.D("account-key rotate", "", 0, 0, []string{"dir", "nats", "switch", "force", "json"},
		`rotate the account signing keys of a broker in NATS operator mode (broker-config --resolver; serve
carries it out): the nodes' account key, and the control side's signing key, which issues the users
serve and the commands sign in with. In two steps: first a new key, listed beside the old in every node's account,
and each node sent a user JWT of it, signed by the control key, which it signs in with from then
on and names in its heartbeat; then, with --switch once every node has (refused otherwise, naming
those that have not; --force switches anyway), every account lists the new key alone, and the
broker disconnects whoever signed in with a JWT of the old one`),
	cmdline.D("cert rotate", "", 0, 0, []string{"dir", "nats", "switch", "force", "routes", "broker-pid", "json"},
		`rotate the broker's certificate (serve carries it out), in two steps: first a new certificate,
announced to every node in a statement the control key signs: nodes accept both from then on,
and say so with their heartbeat; then, with --switch once every node has taken it (refused
otherwise, naming those that have not; --force switches anyway), the broker presents the new one,
linked nodes staying linked, and nodes accept it alone. With --routes DIR, a cluster's route
certificate in the same two steps: the servers accept both, then present the new one and, once
each does on its route port, accept it alone`),
	cmdline.D("node show", "NAME", 1, 1, []string{"dir", "nats", "json"},
		"the node's record, keys, and the profile and inventory it reported"),
	cmdline.D("node add", "NAME", 1, 1, []string{"dir", "nats", "out", "broker-url", "json"},
		`register a node by hand (no enrolment); write its agent config and executor-identity.json, to
be installed on the node by a person`),
	cmdline.D("node endpoint", "NAME ADDRESS:PORT|none", 2, 2, []string{"dir", "nats", "json"},
		"where the node's peers reach it on the underlay; none: they wait for it"),
	cmdline.D("overlay set", "", 0, 0, []string{"dir", "nats", "network", "interface", "port", "keepalive", "json"},
		`set the mesh's overlay and publish every node's composition; what is not given is, the first
time, 10.99.0.0/16, mesh0, port 51820, keepalive 25`),
	cmdline.D("overlay show", "", 0, 0, []string{"dir", "nats", "json"},
		"the overlay, each node's address, endpoint and WireGuard key"),
	cmdline.D("assign", "NODE FILE", 2, 2, []string{"dir", "nats", "despite-briefing", "wait", "json", "plan"},
		`assign the module FILE (resources of one module) to NODE and publish the node's composition:
the overlay, then its modules in the order assigned. A module the node refuses is given back
(the assignment as it was before). --plan asks the node what the composition would do, and keeps
nothing`),
	cmdline.D("unassign", "NODE MODULE", 2, 2, []string{"dir", "nats", "wait", "json"},
		"take MODULE off NODE and publish the node's composition"),
	cmdline.D("publish", "[NODE]", 0, 1, []string{"dir", "nats", "wait", "json"},
		"publish the node's composition (every node's) again, with a new sequence"),
	cmdline.D("declare", "NODE[,NODE...] FILE", 2, 2, []string{"dir", "nats", "seal", "without-overlay", "despite-briefing", "wait", "json"},
		`sign FILE for NODE with the next sequence and publish it; say the sequence ("declared seq 7 to
NODE"; --json: one value, {"node", "seq"} and the "report" --wait saw; several nodes: their
declares pipelined, a line each, --json an array of those); on a mesh
with an overlay, a FILE without it (holding something) is refused (use assign) unless
declared --without-overlay`),
	cmdline.D("plan", "NODE FILE", 2, 2, []string{"dir", "nats", "seal", "wait", "json"},
		`ask NODE what FILE would do there, changing nothing: the executor plans it on the path an apply
takes and answers with the lines an apply would report, and the content diffs of the files the
mesh holds as it wrote them (never content the mesh did not write, never sealed content: --seal
as declare's, sealed for this plan alone). Exit as --wait: 0, 1 a line would fail, 2 refused, 3
no answer in time (the node must be linked)`),
	cmdline.D("archive put", "FILE", 1, 1, []string{"dir", "nats", "json"},
		`store FILE (a tar, gzipped or not) in the archive store under its sha256; print the sha256 and
the URL an archive resource names it by (obj://SHA256)`),
	cmdline.D("nodes", "", 0, 0, []string{"dir", "nats", "json", "names"},
		`each node: its state (revoked, never heard from, or what its agent says), when it was last
heard from, executor version, declared vs applied, last outcome; --names: the names alone, a line
each (what bash completes a node with)`),
	cmdline.D("status", "", 0, 0, []string{"dir", "nats", "json"},
		`the fleet at a glance: nodes by state as nodes shows them (counts, names, the one last heard
longest ago), those with a failed or held line in their last report or briefing, those whose
agent cannot reach its executor, those enrolled
again that nothing has been declared to since, the executor and agent versions in use, the broker, its store (a full disk) and the registry, and the overlay. Exit
1 when the control side cannot be read`),
	cmdline.D("reports", "NODE", 1, 1, []string{"dir", "nats", "last", "json"},
		`the node's last reports, with their lines; then a summary as --wait's: a row a report (its
outcome, its lines changed, unchanged, failed and held) and the total`),
	cmdline.D("broker-config", "", 0, 0, []string{"dir", "nats", "listen", "cluster", "out", "store", "resolver"},
		`a nats-server configuration for an existing broker (serve --nats); with --cluster, each
server's configuration of a NATS cluster (OUTDIR/mesh-broker-N.conf: clients on TLS with the key
directory's certificate, routes between them on OUTDIR/routes.crt, which a run over the same
OUTDIR keeps, with the route password, so servers take it one at a time) and the accounts they
all include (OUTDIR/accounts.conf: serve --nats URLS --replicas 3 --broker-accounts it); with
--resolver, in NATS operator mode: each node in an account of its own, which serve pushes to the
servers (no accounts file, no reload); the key directory keeps the operator's keys, and stays in
that mode`),
	cmdline.D("completion", "bash|zsh|fish", 1, 1, nil, "print the shell's completion for mesh-control"),
	cmdline.D("man", "", 0, 0, nil, "print mesh-control's manual page (roff)"),
	cmdline.D("version", "", 0, 0, []string{"json"}, "print the version and build"),
}

// Version and Build are set by cmd/mesh-control from its link-time stamp.
var Version, Build = "dev", "dev"

// options are every command's flags' values; a command defines only its
// own (define), so its --help lists only them.
type options struct {
	dir, nats, url, listen, brokerConfig, brokerPID, brokerAccounts string
	cluster, store, out, brokerURL, forNode, newName, metrics, ui   string
	recoveryKey, routes                                             string
	switchCert, force, resolver                                     bool
	json, verbose, withoutOverlay, despiteBriefing, isNew, plan     bool
	names                                                           bool
	hosts, seals                                                    listFlag
	replicas, last                                                  int
	ttl, archiveGrace                                               time.Duration
	wait                                                            waitFlag
}

// define defines the flag name of command cmd in fs: the one place each
// flag is written, said as it is for cmd where commands use it
// differently (a command's --help lists its own meaning, not every one).
func (o *options) define(fs *flag.FlagSet, name, cmd string) {
	switch name {
	case "dir":
		fs.StringVar(&o.dir, "dir", DefaultDir(), "the key directory ($"+DirEnv+" sets the default)")
	case "nats":
		if cmd == "serve" {
			fs.StringVar(&o.nats, "nats", "", "an existing broker's URL, used instead of the embedded one")
		} else {
			fs.StringVar(&o.nats, "nats", "", "the broker's URL (default the broker_url of DIR/control.json)")
		}
	case "json":
		fs.BoolVar(&o.json, "json", false, "JSON output")
	case "host":
		fs.Var(&o.hosts, "host", "another name or address for the broker certificate (repeatable)")
	case "url":
		fs.StringVar(&o.url, "url", "", "where client commands find the broker (default "+DefaultBrokerURL+")")
	case "listen":
		if cmd == "serve" {
			fs.StringVar(&o.listen, "listen", "", "the embedded broker's address (default from DIR/control.json: 127.0.0.1:4222); with --broker-config, the existing broker's")
		} else {
			fs.StringVar(&o.listen, "listen", "", "the broker's client address (default from DIR/control.json); with --cluster, the servers' client addresses, in the order of --cluster")
		}
	case "replicas":
		fs.IntVar(&o.replicas, "replicas", 0, "with --nats: keep the control side's streams and registry at this many copies (3 on a three-server cluster); 0 keeps what exists")
	case "broker-config":
		fs.StringVar(&o.brokerConfig, "broker-config", "", "with --nats: keep this file the existing broker's configuration, equal to the registry")
	case "broker-accounts":
		fs.StringVar(&o.brokerAccounts, "broker-accounts", "", "with --nats: keep this file (a cluster's "+AccountsFile+", from broker-config --cluster) the accounts every server includes, equal to the registry")
	case "broker-pid":
		with := "with --broker-config or --broker-accounts"
		if cmd == "cert rotate" {
			with = "with --routes"
		}
		fs.StringVar(&o.brokerPID, "broker-pid", "", with+": the existing broker's pid file (a cluster: a comma-separated list, one per server); each is sent SIGHUP to reload after each change")
	case "new":
		fs.BoolVar(&o.isNew, "new", false, "for a machine the mesh has not seen")
	case "name":
		fs.StringVar(&o.newName, "name", "", "with --new: the name the node gets (default: from its hostname)")
	case "node":
		fs.StringVar(&o.forNode, "node", "", "for this existing node (revokes its identity now)")
	case "ttl":
		fs.DurationVar(&o.ttl, "ttl", DefaultTokenTTL, "how long the token lives, used or not")
	case "broker-url":
		fs.StringVar(&o.brokerURL, "broker-url", "", "the broker as the node reaches it (default the URL used)")
	case "out":
		if cmd == "node add" {
			fs.StringVar(&o.out, "out", "", "the agent config file (default NAME/agent.json)")
		} else {
			fs.StringVar(&o.out, "out", "", "with --cluster: the directory the configurations are written to")
		}
	case "network":
		fs.String("network", DefaultOverlayNetwork, "the prefix node addresses are allocated from")
	case "interface":
		fs.String("interface", DefaultOverlayInterface, "the WireGuard interface on every node")
	case "port":
		fs.Int("port", DefaultOverlayPort, "the WireGuard listen port on every node")
	case "keepalive":
		fs.Int("keepalive", DefaultOverlayKeepalive, "the keepalive on every peer, seconds (0: none)")
	case "plan":
		fs.BoolVar(&o.plan, "plan", false, "ask the node for a plan of the composition with the module, and keep nothing")
	case "despite-briefing":
		fs.BoolVar(&o.despiteBriefing, "despite-briefing", false, "send to a node whose adoption briefing has a failed line (to push the fix)")
	case "without-overlay":
		fs.BoolVar(&o.withoutOverlay, "without-overlay", false, "send a file without the overlay on a mesh that has one (the node takes its overlay down)")
	case "seal":
		fs.Var(&o.seals, "seal", "MODULE.ID=PATH: seal PATH's content to the node's key as that file's content (repeatable)")
	case "last":
		fs.IntVar(&o.last, "last", 20, "how many")
	case "routes":
		fs.StringVar(&o.routes, "routes", "", "rotate a cluster's route certificate instead, in this directory (what broker-config --cluster wrote); --broker-pid: the servers' pid files, to reload them")
	case "switch":
		if cmd == "cert rotate" {
			fs.BoolVar(&o.switchCert, "switch", false, "switch the broker (--routes: the cluster's routes) to the certificate announced")
		} else {
			fs.BoolVar(&o.switchCert, "switch", false, "switch to the key announced")
		}
	case "force":
		what := "key"
		if cmd == "cert rotate" {
			what = "certificate"
		}
		fs.BoolVar(&o.force, "force", false, "with --switch: switch although some nodes have not taken the new "+what+" (they must be enrolled again)")
	case "recovery-key":
		fs.StringVar(&o.recoveryKey, "recovery-key", "", "the recovery key's file ("+FileRecoveryKey+", kept off this machine): sign the rotation with it, the control key being stolen")
	case "names":
		fs.BoolVar(&o.names, "names", false, "the node names alone, a line each")
	case "cluster":
		fs.StringVar(&o.cluster, "cluster", "", "the servers' route addresses, HOST:PORT,... (one per server; --listen their client addresses, in the same order; --out the directory to write to)")
	case "resolver":
		fs.BoolVar(&o.resolver, "resolver", false, "NATS operator mode: every account a JWT, each node's own, pushed by serve to the servers' account resolver (the operator's keys are made in the key directory once)")
	case "store":
		fs.StringVar(&o.store, "store", "", "with --cluster: the directory each server's JetStream store is made under (default --out)")
	case "metrics":
		fs.StringVar(&o.metrics, "metrics", "", "serve /metrics (Prometheus' text format) on this address, e.g. 127.0.0.1:9469: nodes by state, last heard, declared and applied, outcomes, apply durations, link errors")
	case "archive-grace":
		fs.DurationVar(&o.archiveGrace, "archive-grace", DefaultArchiveGrace, "an archive no kept declaration and no assignment names leaves the store this long after it was put (0: never)")
	case "ui":
		fs.StringVar(&o.ui, "ui", "", "serve the read-only status page on this address, e.g. 127.0.0.1:9470: every node's state, last heard, versions, outcome, last report and briefing, and each node's timeline")
	case "wait":
		fs.Var(&o.wait, "wait", "wait for the node's report (--wait: 2m; --wait=5m), print it, and exit by its outcome: 0 applied or unchanged, 1 failed, 2 refused, 3 no report in time")
	case "v":
		if cmd == "serve" {
			fs.BoolVar(&o.verbose, "v", false, "log its debug lines too")
		} else {
			fs.BoolVar(&o.verbose, "v", false, "log on standard error what the command does; without it the command prints its result and its errors only")
		}
	default:
		panic("control: no flag " + name)
	}
}

// flagSet is command i's flag set, its flags defined into o.
func flagSet(i int, o *options, out io.Writer) *flag.FlagSet {
	c := commands[i]
	fs := flag.NewFlagSet("mesh-control "+c.Name, flag.ContinueOnError)
	fs.SetOutput(out)
	for _, f := range c.Flags {
		o.define(fs, f, c.Name)
	}
	if c.Flags != nil && c.Name != "version" {
		o.define(fs, "v", c.Name)
	}
	return fs
}

// table is mesh-control's commands, with the options the last flag set
// made is bound to (Main makes one).
func table(o *options) cmdline.Table {
	return cmdline.NewTable(cmdline.Program{Name: "mesh-control", Section: 1, Asks: true,
		Summary: "the control side of a nox mesh: keys, the broker, the registry, declarations and reports",
		Description: `mesh-control keeps a mesh's control plane: the signing key, the embedded NATS broker (or an
existing one), the node registry and enrolment tokens; it signs and publishes declarations and
compositions, and shows what nodes report. Client commands talk to the broker (--nats URL, default
the broker_url of DIR/control.json), TLS pinned to DIR/broker.crt, authenticated with
DIR/control.nk. DIR is --dir, else $MESH_CONTROL_DIR, else /var/lib/mesh-control (where the
packages' service keeps it).`,
		ExitStatus: []cmdline.Entry{
			{Term: "0", Text: "done; with --wait, every node applied (or found nothing to change); --help"},
			{Term: "1", Text: "failed: the control side could not be read or refused the command; with --wait, a line failed on a node"},
			{Term: "2", Text: "a command line it does not take; with --wait, a node refused what was declared"},
			{Term: "3", Text: "with --wait, a node did not report within the time"},
		},
		Environment: []cmdline.Entry{
			{Term: DirEnv, Text: "the key directory when --dir is not given (else " + DefaultControlDir + ")"},
		},
		Files: []cmdline.Entry{
			{Term: "DIR/" + FileControlKey, Text: "the control plane's Ed25519 signing key (0600): whoever holds it declares what every node runs"},
			{Term: "DIR/" + FileControlPub, Text: "its public key, which every node pins"},
			{Term: "DIR/" + FileBrokerCert + ", DIR/" + FileBrokerKey, Text: "the broker's certificate, which nodes and clients pin, and its key (0600)"},
			{Term: "DIR/" + FileNKey, Text: "the control side's broker user (0600)"},
			{Term: "DIR/" + FileNodesAccount, Text: "the nodes' account key, which signs each node's credential (0600)"},
			{Term: "DIR/" + FileSettings, Text: "the broker's URL client commands dial when --nats is not given"},
		},
		Examples: []cmdline.Entry{
			{Term: "mesh-control init --url tls://10.0.0.1:4222", Text: "make the key directory of a new mesh"},
			{Term: "mesh-control serve --listen 0.0.0.0:4222 --ui 127.0.0.1:8080", Text: "run the control side and its broker, with the status page on loopback"},
			{Term: "mesh-control token issue --new --name web1 > web1.token", Text: "a token for a new machine, carried to it: mesh-executor enrol reads it on standard input"},
			{Term: "mesh-control declare web1 site.json --wait", Text: "sign and send a declaration to web1, wait for its report and summarize it"},
			{Term: "mesh-control status", Text: "the fleet at a glance: nodes by state, failed and held lines, versions, the broker"},
		},
	},
		commands, func(i int, out io.Writer) *flag.FlagSet { return flagSet(i, o, out) })
}

// Program is mesh-control's manual, completions and help.
func Program() cmdline.Program { return table(new(options)).Program }

// Main runs mesh-control with args (without the program name). Exit
// status: 0 done (and --help), 1 failed, 2 a usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == cmdline.AskCommand {
		return complete(ctx, args[1:], stdout)
	}
	var o options
	i, pos, fs, code, done := table(&o).Dispatch(args, Version, stdout, stderr)
	if done {
		return code
	}
	cmd := commands[i].Name
	if cmd == "version" {
		cmdline.Version(stdout, "mesh-control", Version, Build, o.json)
		return 0
	}
	if o.dir == "" {
		fmt.Fprintf(stderr, "mesh-control %s: --dir is empty: name the key directory\n", cmd)
		return 2
	}
	c := &cli{ctx: ctx, cmd: cmd, stdout: stdout, stderr: stderr, dir: o.dir, nats: o.nats, json: o.json, verbose: o.verbose,
		despiteBriefing: o.despiteBriefing, withoutOverlay: o.withoutOverlay, wait: o.wait.d,
		log: commandLog(cmd, stderr, o.verbose)}
	if isTerminal(stderr) {
		c.tty = stderr
	}
	err := flagForms(cmd, o)
	run := cmd
	if err != nil {
		run = "" // refused as written: no command runs
	}
	switch run {
	case "init":
		err = c.init(o.hosts, o.url)
	case "serve":
		err = c.serve(o.listen, o.brokerConfig, o.brokerAccounts, o.brokerPID, o.replicas, o.metrics, o.ui, o.archiveGrace)
	case "node add":
		err = c.nodeAdd(pos[0], o.out, o.brokerURL)
	case "token issue":
		err = c.tokenIssue(o.isNew, o.forNode, o.newName, o.ttl, o.brokerURL)
	case "token list":
		err = c.tokenList()
	case "token revoke":
		err = c.tokenRevoke(pos[0])
	case "node delete":
		err = c.nodeDelete(pos[0])
	case "node revoke":
		err = c.nodeRevoke(pos[0])
	case "node show":
		err = c.nodeShow(pos[0])
	case "key rotate":
		err = c.keyRotate(o.recoveryKey)
	case "account-key rotate":
		err = c.accountKeyRotate(o.switchCert, o.force)
	case "nkey rotate":
		err = c.nkeyRotate()
	case "operator-key rotate":
		err = c.operatorKeyRotate(o.switchCert, o.force)
	case "cert rotate":
		if o.routes != "" {
			err = c.routesRotate(o.routes, o.switchCert, o.force, o.brokerPID)
			break
		}
		if o.brokerPID != "" {
			err = errors.New("--broker-pid is for --routes: the broker's own certificate is switched by serve, which reloads the broker it was told of")
			break
		}
		err = c.certRotate(o.switchCert, o.force)
	case "declare":
		err = c.declare(pos[0], pos[1], o.seals)
	case "archive put":
		err = c.archivePut(pos[0])
	case "plan":
		err = c.plan(pos[0], pos[1], o.wait.d, o.seals)
	case "nodes":
		if o.names {
			err = c.nodeNames()
		} else {
			err = c.nodes()
		}
	case "status":
		err = c.status()
	case "reports":
		err = c.reports(pos[0], o.last)
	case "broker-config":
		if o.cluster != "" {
			err = c.brokerCluster(o.listen, o.cluster, o.out, o.store, o.resolver)
		} else {
			err = c.brokerConfig(o.listen, o.store, o.resolver)
		}
	case "node endpoint":
		err = c.nodeEndpoint(pos[0], pos[1])
	case "overlay set":
		err = c.overlaySet(overlayChangeFrom(fs))
	case "overlay show":
		err = c.overlayShow()
	case "assign":
		if o.plan {
			err = c.assignPlan(pos[0], pos[1])
		} else {
			err = c.assign(pos[0], pos[1])
		}
	case "unassign":
		err = c.unassign(pos[0], pos[1])
	case "publish":
		err = c.publish(pos)
	}
	if err != nil && cmd != "init" && cmd != "serve" {
		err = c.explainStoreError(err)
	}
	if err != nil && os.Getenv(DirEnv) != "" && !cmdline.Given(fs, "dir") && strings.Contains(err.Error(), o.dir) {
		// A directory the operator never typed: say where it came from,
		// or the hint to init it invites a second control side.
		err = fmt.Errorf("%w (the key directory is $%s's; --dir names another)", err, DirEnv)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintf(stderr, "mesh-control %s: %v\n", cmd, err)
		return ee.code
	}
	if err != nil {
		fmt.Fprintf(stderr, "mesh-control %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

type cli struct {
	ctx            context.Context
	cmd            string // as typed: "declare", "token issue"
	stdout, stderr io.Writer
	dir, nats      string
	json, verbose  bool
	// despiteBriefing: declare to a node whose briefing has a failed line.
	despiteBriefing bool
	withoutOverlay  bool
	// wait: how long declare, assign and publish wait for the reports
	// (0: they do not).
	wait time.Duration
	log  *slog.Logger
	// tty is standard error when it is a terminal, for what only a person
	// watching is told (progress); nil otherwise.
	tty io.Writer
}

func (c *cli) printJSON(v any) error {
	e := json.NewEncoder(c.stdout)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

func (c *cli) init(hosts []string, url string) error {
	k, err := Init(c.dir, hosts, url)
	if err != nil {
		return err
	}
	if onlyLoopback(hosts) {
		fmt.Fprintf(c.stderr, "mesh-control init: warning: the broker certificate names only 127.0.0.1, ::1 and localhost. Nodes pin its fingerprint and reach it by any address, but a TLS client that checks names (the nats tool, a monitoring probe) will not accept it by another: give --host NAME for each name or address the broker is reached by (a new init: move %s aside first)\n", c.dir)
	}
	recovery := filepath.Join(c.dir, FileRecoveryKey)
	if c.json {
		err = c.printJSON(map[string]string{"control_key_id": k.KeyID(), "control_key": k.ControlPublicBase64(), "broker_fingerprint": k.Fingerprint, "broker_url": k.BrokerURL,
			"recovery_key_id": wire.KeyID(k.Recovery), "recovery_key_file": recovery})
	} else {
		fmt.Fprintf(c.stdout, "control key id:            %s\ncontrol public key:        %s\nbroker certificate sha256: %s\nbroker url:                %s\nrecovery key id:           %s\n",
			k.KeyID(), k.ControlPublicBase64(), k.Fingerprint, k.BrokerURL, wire.KeyID(k.Recovery))
	}
	// The one key that undoes a theft of the control key is no use on
	// the machine the thief is on.
	fmt.Fprintf(c.stderr, "mesh-control init: move %s off this machine, to offline media: it signs one thing, a rotation of the control key when that key is stolen (mesh-control key rotate --recovery-key FILE); every node pins its public half when it enrols\n", recovery)
	c.next("mesh-control serve" + c.dirFlag())
	return err
}

func (c *cli) serve(listen, brokerConfig, brokerAccounts, brokerPID string, replicas int, metrics, ui string, archiveGrace time.Duration) error {
	if (brokerConfig != "" || brokerAccounts != "" || brokerPID != "" || replicas != 0) && c.nats == "" {
		return usageError("--broker-config, --broker-accounts, --broker-pid and --replicas are for an existing broker (serve --nats URL); the embedded one follows the registry by itself and is one server")
	}
	if brokerPID != "" && brokerConfig == "" && brokerAccounts == "" {
		return errors.New("--broker-pid says whom to tell that --broker-config (or --broker-accounts) changed: name the file too")
	}
	if brokerConfig != "" && brokerAccounts != "" {
		return errors.New("--broker-config (one server's whole configuration) or --broker-accounts (the accounts a cluster's servers include), not both")
	}
	if replicas < 0 || replicas > 5 {
		return fmt.Errorf("--replicas %d: JetStream keeps 1 to 5 copies", replicas)
	}
	// The embedded broker's store is in the key directory: the directory
	// is taken before anything in it is read (FileLock).
	var lock *statedir.DirLock
	if c.nats == "" {
		l, err := lockDir(c.dir, "serve")
		if err != nil {
			return err
		}
		defer l.Close()
		lock = l
	}
	if done, err := FinishCertSwitch(c.dir); err != nil {
		return err
	} else if done {
		c.log.Warn("serve: a switch of the broker's certificate cut off between its key and its certificate was finished", "dir", c.dir)
	}
	k, err := LoadKeys(c.dir)
	if err != nil {
		return err
	}
	ready := func(url string, _ *Server) { c.nextAfterServe(k, url, listen) }
	cmdline.KeepOnHangup(c.log)
	err = Serve(c.ctx, k, ServeOptions{Listen: listen, NATSURL: c.nats, BrokerConfig: brokerConfig, BrokerAccounts: brokerAccounts, BrokerPID: brokerPID, Replicas: replicas, Lock: lock, Log: c.log, Metrics: metrics, UI: ui, ArchiveGrace: archiveGrace, Ready: ready})
	if err == nil && c.ctx.Err() != nil {
		// Said, so a log read later tells a stop asked for from a crash.
		c.log.Info("serve stopped: asked to (SIGTERM or SIGINT)")
	}
	return err
}

func (c *cli) connect() (*Client, error) {
	k, err := LoadKeys(c.dir)
	if err != nil {
		return nil, err
	}
	// Bounded: a broker that does not answer is waited out for as long as
	// an unanswered request is (connectAgain), plus a slow handshake.
	ctx, cancel := context.WithTimeout(c.ctx, unansweredWithin+link.ConnectTimeout)
	defer cancel()
	return Connect(ctx, k, c.nats, c.log)
}

// firstMissing is the outermost directory of dir's path that does not
// exist yet ("" when dir does), once the nearest that does is found to
// be a directory this process may make one in.
func firstMissing(dir string) (string, error) {
	missing := ""
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir():
			return "", fmt.Errorf("%s is not a directory", d)
		case err == nil:
			if missing != "" {
				if err := unix.Access(d, unix.W_OK|unix.X_OK); err != nil {
					return "", statedir.ExplainAccess("make a directory in", d, err, "")
				}
			}
			return missing, nil
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR):
			return "", statedir.ExplainAccess("look at", d, err, "")
		}
		if _, lerr := os.Lstat(d); lerr == nil {
			return "", fmt.Errorf("%s is a symbolic link to nothing", d)
		}
		missing = d // or below a file: said of the file, further up
		if d == filepath.Dir(d) {
			return missing, nil
		}
	}
}

func (c *cli) nodeAdd(name, out, brokerURL string) error {
	// Nothing is made on the disk for a node that is not registered: the
	// name is checked, and the files' directory made, only around the
	// registration.
	if err := link.ValidNodeName(name); err != nil {
		return err
	}
	if out == "" {
		out = filepath.Join(name, "agent.json")
	}
	exPath := filepath.Join(filepath.Dir(out), "executor-identity.json")
	for _, p := range []string{out, exPath} {
		if _, err := os.Lstat(p); err == nil {
			why := ""
			if p == exPath {
				why = " (another node's, perhaps: the executor's identity is written beside --out, so each node takes a directory of its own, as the default NAME/agent.json)"
			}
			return fmt.Errorf("%s exists; not overwriting it%s", p, why)
		}
	}
	// A directory the files cannot go in is said before the node is
	// registered; one made for them goes again with a failure after.
	made, err := firstMissing(filepath.Dir(out))
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	undo := func() {
		os.Remove(out)
		os.Remove(exPath)
		// The directories made for them, as far as each is empty: another
		// command may have put its own files in one meanwhile.
		for d := filepath.Dir(out); made != "" && d != filepath.Dir(made); d = filepath.Dir(d) {
			if os.Remove(d) != nil {
				break
			}
		}
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	cfg, ex, err := cl.AddNode(c.ctx, name, brokerURL)
	if err != nil {
		return err
	}
	// The agent's config holds the node's NKey seed, made here and kept
	// nowhere else: not written (a full disk), the node is taken out of
	// the registry again, or it would stay registered on a seed no one
	// holds, and the command run again be told it exists.
	for _, f := range []struct {
		path string
		v    any
	}{{out, cfg}, {exPath, ex}} {
		err := os.MkdirAll(filepath.Dir(f.path), 0o700)
		if err == nil {
			err = statedir.WriteFile(f.path, f.v)
		}
		if err != nil {
			undo()
			if uerr := cl.UnregisterNew(context.WithoutCancel(c.ctx), name, ex.Enrolment); uerr != nil {
				return fmt.Errorf("%s: %w; and node %s, registered, could not be taken out again (%v): mesh-control node revoke %s, then node delete %s", f.path, err, name, uerr, name, name)
			}
			return fmt.Errorf("%s: %w; node %s is not registered (nothing kept): run it again once the file can be written", f.path, err, name)
		}
	}
	if c.json {
		return c.printJSON(map[string]any{"node": name, "enrolment": ex.Enrolment, "agent_config": out, "executor_identity": exPath, "executor": ex})
	}
	fmt.Fprintf(c.stdout, "node %s registered, enrolment %s\n", name, ex.Enrolment)
	fmt.Fprintf(c.stdout, "agent config:      %s (0600, holds the node's NKey seed: for mesh-agent --config)\n", out)
	fmt.Fprintf(c.stdout, "executor identity: %s (install as /var/lib/mesh-host/executor/identity.json, root 0600)\n", exPath)
	fmt.Fprintf(c.stdout, "the executor pins:\n  node:        %s\n  enrolment:   %s\n  control_key: %s\n", ex.Node, ex.Enrolment, ex.ControlKey)
	return nil
}

func (c *cli) declare(node, file string, sealSpecs []string) error {
	var nodes []string
	if strings.Contains(node, ",") {
		var err error
		if nodes, err = nodeList(node); err != nil {
			return usageError("%v", err)
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if len(data) > shapes.MaxDeclarationSize {
		return fmt.Errorf("%s: over %d bytes", file, shapes.MaxDeclarationSize)
	}
	to := nodes
	if to == nil {
		to = []string{node}
	}
	if err := namesAnother(file, data, to); err != nil {
		return err
	}
	seals, err := ReadSeals(sealSpecs)
	if err != nil {
		return err
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.DespiteBriefing = c.despiteBriefing
	cl.Seals = seals
	if nodes != nil {
		return c.declareMany(cl, nodes, file, data)
	}
	// A revoked node first: whatever else is wrong with the file, it
	// could not reach the node.
	if err := cl.refuseRevoked(c.ctx, node); err != nil {
		return err
	}
	if !c.withoutOverlay {
		if err := withOverlay(c.ctx, cl, data, []string{node}); err != nil {
			return err
		}
	}
	seq, err := cl.Declare(c.ctx, node, data)
	if err != nil {
		return inFile(file, data, err)
	}
	c.noteAssigned(cl, []string{node})
	if !c.json {
		fmt.Fprintln(c.stdout, declaredLine(node, seq))
	}
	return c.await(cl, []nodeSeq{{node, seq}}, func(w waited) any {
		v := map[string]any{"node": node, "seq": seq}
		if r := w.of(node, seq); r != nil {
			v["report"] = r
		}
		return v
	})
}

// noteAssigned says, on standard error, of nodes just declared to, those
// with modules assigned: the declaration replaced their composition, and
// the next publish (an assign, an overlay change, publish) sends the
// modules again over it. A note, not a refusal: declare sends a file as
// written.
func (c *cli) noteAssigned(cl *Client, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	assigned, err := cl.AssignedModules(c.ctx, nodes)
	if err != nil {
		return
	}
	for _, n := range nodes {
		if ms := assigned[n]; len(ms) > 0 {
			fmt.Fprintf(c.stderr, "note: %s has modules assigned (%s): this declaration replaced its composition, and its next publish sends them again over it (mesh-control unassign %s MODULE to keep it so)\n", n, strings.Join(ms, ", "), n)
		}
	}
}

// declaredLine says what declare did for one node, labelled, so a person
// reading it later — in a terminal's scrollback, a job's log — knows what
// the number is and whose it is. Scripts read --json.
func declaredLine(node string, seq uint64) string {
	return fmt.Sprintf("declared seq %d to %s", seq, node)
}

// declareMany declares data, file's content, to each of nodes
// (DeclareAll), a line each: the sequence, or why not; it fails if any was
// not declared to. A refusal of the file itself is the same for every
// node, and is said once, placed in the file.
func (c *cli) declareMany(cl *Client, nodes []string, file string, data []byte) error {
	if !c.withoutOverlay {
		if err := withOverlay(c.ctx, cl, data, nodes); err != nil {
			return err
		}
	}
	end := c.fanningOut(cl, "declaring to the nodes")
	seqs, errs := cl.DeclareAll(c.ctx, nodes, data)
	end()
	var declared []string
	for i, n := range nodes {
		if errs[i] == nil {
			declared = append(declared, n)
		}
	}
	c.noteAssigned(cl, declared)
	if fe := (*shapes.FileError)(nil); len(errs) > 0 && errors.As(inFile(file, data, errs[0]), &fe) && sameError(errs) {
		return fe
	}
	failed := 0
	type line struct {
		Node   string        `json:"node"`
		Seq    uint64        `json:"seq,omitempty"`
		Error  string        `json:"error,omitempty"`
		Report *SignedReport `json:"report,omitempty"`
	}
	lines := make([]line, len(nodes))
	for i, n := range nodes {
		lines[i] = line{Node: n, Seq: seqs[i]}
		if errs[i] != nil {
			failed++
			lines[i] = line{Node: n, Error: errs[i].Error()}
		}
	}
	if !c.json {
		for _, l := range lines {
			if l.Error != "" {
				fmt.Fprintf(c.stdout, "not declared to %s: %s\n", l.Node, l.Error)
			} else {
				fmt.Fprintln(c.stdout, declaredLine(l.Node, l.Seq))
			}
		}
	}
	// The nodes declared to are waited for whatever happened to the
	// others: their reports are what --wait was asked for.
	var want []nodeSeq
	for _, l := range lines {
		if l.Error == "" {
			want = append(want, nodeSeq{l.Node, l.Seq})
		}
	}
	werr := c.await(cl, want, func(w waited) any {
		for i := range lines {
			lines[i].Report = w.of(lines[i].Node, lines[i].Seq)
		}
		return lines
	})
	if failed > 0 {
		if werr != nil {
			return fmt.Errorf("%d of %d node(s) not declared to; and %v", failed, len(nodes), werr)
		}
		return fmt.Errorf("%d of %d node(s) not declared to", failed, len(nodes))
	}
	return werr
}

// namesAnother refuses a declaration file that names a node ("node", as
// a rescue file does) other than the ones it is declared or planned to.
// The control side sets a declaration's node, enrolment and sequence: a
// file naming another node (a rescue file reused, another node's file
// picked) is a slip more likely than a wish, and sent it would change
// the wrong machine. One that names the node it goes to passes, and its
// enrolment and sequence are set as any file's.
func namesAnother(file string, data []byte, nodes []string) error {
	var f struct {
		Node *string `json:"node"`
	}
	if json.Unmarshal(data, &f) != nil || f.Node == nil {
		return nil // the declaration's parse says what is wrong with it
	}
	for _, n := range nodes {
		if n != *f.Node {
			return fmt.Errorf("%s names node %q, and is sent to %s: send it to %s, or take \"node\" out of it (the control side sets a declaration's node, enrolment and sequence)", file, *f.Node, strings.Join(nodes, ","), *f.Node)
		}
	}
	return nil
}

// flagForms refuses, before a command runs, a flag's value that is not
// of the form the command takes — a broker address, a lifetime — as the
// flag parser refuses one that does not parse: the command line's fault,
// exit 2, by the rule the command itself applies later.
func flagForms(cmd string, o options) error {
	switch cmd {
	case "init":
		if o.url != "" {
			if _, err := brokerURLsOf(o.url); err != nil {
				return usageError("--url: %v", err)
			}
		}
	case "token issue", "node add":
		if o.brokerURL != "" {
			if _, err := brokerURLsOf(o.brokerURL); err != nil {
				return usageError("--broker-url: %v", err)
			}
		}
		if cmd == "token issue" && o.ttl <= 0 {
			return usageError("--ttl %v: a token lives a while (--ttl 1h; the default is %v)", o.ttl, DefaultTokenTTL)
		}
	case "reports":
		if o.last <= 0 {
			return usageError("--last %d: how many of the node's newest reports, one or more", o.last)
		}
	}
	return nil
}

// nodeList is a comma-separated list of nodes as declare takes it: each
// once (a name given twice would be declared to twice, two sequences for
// one declaration), none empty (a comma too many is a typo, not a node).
func nodeList(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			return nil, fmt.Errorf("the node list %q has an empty name (a comma too many?)", s)
		case seen[f]:
			return nil, fmt.Errorf("the node list %q names %s twice", s, f)
		}
		seen[f] = true
		out = append(out, f)
	}
	return out, nil
}

// sameError says whether every one of errs is the one error: DeclareAll's
// when the declaration itself was refused, before any node was tried.
func sameError(errs []error) bool {
	for _, e := range errs {
		if e != errs[0] {
			return false
		}
	}
	return true
}

// withOverlay refuses a raw declaration that would take a node out of the
// mesh's overlay: sent as written, it replaces the node's whole
// composition, and one without the overlay has the node remove it; and
// one whose overlay is not each node's own (another node's address, an
// interface the mesh's is not), which would put nodes on one address.
func withOverlay(ctx context.Context, cl *Client, data []byte, nodes []string) error {
	s, err := cl.Overlay(ctx)
	if errors.Is(err, ErrNoOverlay) {
		return nil
	}
	if err != nil {
		return err
	}
	var d struct {
		OwnsNothing bool `json:"owns_nothing"`
		Resources   []struct {
			Type      string `json:"type"`
			Interface string `json:"interface"`
			Address   string `json:"address"`
		} `json:"resources"`
	}
	if json.Unmarshal(data, &d) != nil || d.OwnsNothing {
		// Malformed: the declaration's own checks say what is wrong with
		// it. Holding nothing (a retirement among them): the overlay goes
		// with everything else, as asked.
		return nil
	}
	for _, r := range d.Resources {
		if r.Type != shapes.TypeOverlay {
			continue
		}
		if r.Interface != s.Interface {
			return fmt.Errorf("the file's overlay is interface %s, and this mesh's is %s (mesh-control overlay show): use assign, which composes each node's overlay, or declare --without-overlay to send it anyway", r.Interface, s.Interface)
		}
		p, err := s.prefix()
		if err != nil {
			return err
		}
		declared, _ := netip.ParsePrefix(r.Address)
		for _, n := range nodes {
			own := "none yet"
			a, _, ok := cl.address(ctx, n)
			if ok {
				own = netip.PrefixFrom(a, p.Bits()).String()
			}
			if !ok || declared != netip.PrefixFrom(a, p.Bits()) {
				return fmt.Errorf("the file's overlay address is %s, and %s's in this mesh's overlay is %s (mesh-control overlay show): sent as written, %s would take that address; use assign, which composes each node's own overlay, or declare --without-overlay to send it anyway", r.Address, n, own, n)
			}
		}
		return nil
	}
	return fmt.Errorf("this mesh has an overlay (%s on %s) and the file declares none: sent as written it replaces the node's whole composition, and the node would take its overlay down; use assign (the overlay, then the node's modules), or declare --without-overlay to send it anyway", s.Interface, s.Network)
}

func (c *cli) archivePut(file string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	sum, size, err := cl.PutArchive(c.ctx, file)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"sha256": sum, "url": ArchiveURL(sum), "size": size})
	}
	fmt.Fprintf(c.stdout, "sha256: %s\nurl:    %s\nsize:   %d\n", sum, ArchiveURL(sum), size)
	return nil
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

// skewShort is a clock skew in a table's few words: "+8760h0m0s" (ahead)
// or "-2m0s" (behind).
func skewShort(ms int64) string {
	d := (time.Duration(ms) * time.Millisecond).Round(time.Second)
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// executorSaid is a node's executor as nodes and node show say it: its
// version and build, or why there is none to say (halted, unreachable by
// its agent), "-" when nothing was heard of it.
func executorSaid(n *NodeStatus) string {
	switch {
	case n.ExecutorVersion != "" || n.ExecutorBuild != "":
		ex := n.ExecutorVersion
		if n.ExecutorBuild != "" {
			ex += " (" + n.ExecutorBuild + ")"
		}
		if n.RolledBackFrom != "" {
			ex += ", rolled back from " + n.RolledBackFrom
		}
		return ex
	case n.ExecutorHalted != "":
		return "halted (" + n.ExecutorHalted + ")"
	case n.ExecutorError != "":
		return "unreachable"
	}
	return "-"
}

// outcomeSaid is a node's last outcome and its sequence, "-" for none;
// a report of no declaration (a reconcile when the link came back, on a
// node declared nothing yet) by what made it, not as "seq 0".
func outcomeSaid(n *NodeStatus) string {
	switch {
	case n.LastOutcome == "":
		return "-"
	case n.LastSeq == 0 && n.LastReport != nil && n.LastReport.Trigger != "":
		return fmt.Sprintf("%s (%s, no declaration yet)", n.LastOutcome, n.LastReport.Trigger)
	}
	return fmt.Sprintf("%s (seq %d)", n.LastOutcome, n.LastSeq)
}

func (c *cli) nodes() error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	ns, err := cl.Nodes(c.ctx)
	if err != nil {
		return err
	}
	if c.json {
		if ns == nil {
			ns = []*NodeStatus{}
		}
		return c.printJSON(ns)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tSTATE\tLAST HEARD\tEXECUTOR\tDECLARED\tAPPLIED\tLAST OUTCOME\tOVERLAY\tASSIGNMENTS")
	for _, n := range ns {
		ex, outcome := executorSaid(n), outcomeSaid(n)
		if n.ExecutorHalted != "" && n.ExecutorVersion == "" && n.ExecutorBuild == "" {
			// The launcher's reason runs to hundreds of characters: the
			// table says halted, node show says why.
			ex = "halted (node show " + n.Name + " says why)"
		}
		state := n.State
		if n.Presence == link.PresenceEpisodic {
			// An app, linked only while it runs: its silence is the
			// ordinary case, said as a fact, not an alarm.
			state += " (episodic)"
		}
		if n.ClockSkewMS != 0 {
			state += ", clock " + skewShort(n.ClockSkewMS)
		}
		switch {
		case n.State == StateRevoked:
		case n.RotationOutOfReach:
			state += ", control key " + n.ControlKeyID + ": no rotation from it is kept, enrol it again"
		case n.RotationPending:
			state += ", control key " + n.ControlKeyID + ": the rotation not taken yet"
		}
		if n.NothingDeclaredSince > 0 {
			state += fmt.Sprintf(", nothing declared to this enrolment (seq %d went to the one before): declare to it again", n.NothingDeclaredSince)
		}
		if n.OutsideSkew != "" {
			// Nothing is declared to it: the reason, at the line.
			state += fmt.Sprintf(", link capability %d: outside the version skew policy", n.Capability)
		}
		if n.TwoAgents != nil {
			state += ", TWO AGENTS linked as it (a copied machine?): mesh-control node show " + n.Name
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", n.Name, state, ago(n.LastHeard), ex, n.Declared, n.Applied, outcome, dash(n.Address), dash(n.Assignments))
	}
	return w.Flush()
}

func (c *cli) reports(node string, last int) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	rs, skipped, err := cl.Reports(c.ctx, node, last)
	if err != nil {
		return err
	}
	if c.json {
		if rs == nil {
			rs = []*SignedReport{}
		}
		return c.printJSON(map[string]any{"node": node, "reports": rs, "unsigned_skipped": skipped})
	}
	if len(rs) == 0 {
		fmt.Fprintf(c.stdout, "no reports from %s\n", node)
	}
	for _, r := range rs {
		c.printReport(r)
	}
	if skipped > 0 {
		fmt.Fprintf(c.stdout, "(%d message(s) on mesh.report.%s not shown: signed by no key of the node's enrolments the registry keeps — an enrolment more than 8 before, or not the node's)\n", skipped, node)
	}
	if len(rs) > 0 {
		// What the reports above did, counted as --wait counts it: a
		// row each, and the total, left on the screen when they scroll.
		rows := make([]summaryRow, len(rs))
		for i, r := range rs {
			rows[i] = summaryRow{seq: r.Seq, r: r}
		}
		fmt.Fprintln(c.stdout)
		c.summarize(rows, "report", false)
	}
	return nil
}

// brokerCluster writes a cluster's configurations into out: one per
// server, with a route secret they share, and the accounts they include,
// listing the registry's users if the control side can be reached (the
// first serve --broker-accounts writes them otherwise). Written over a
// cluster's directory again, it keeps the routes' secret and certificate
// there (keptRoutes): the servers take the new configurations one at a
// time.
func (c *cli) brokerCluster(listen, routes, out, store string, resolver bool) error {
	k, err := c.brokerKeys(resolver)
	if err != nil {
		return err
	}
	servers, err := ParseCluster(listen, routes)
	if err != nil {
		return err
	}
	if out == "" {
		return errors.New("--cluster writes a file per server: name the directory with --out")
	}
	if store == "" {
		store = out
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	// One writer of a cluster's directory at a time: two at once would
	// each make a certificate, key and password, and leave them mixed.
	l, err := statedir.LockDir(out, routeLockRecord)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.Record("mesh-control broker-config --cluster"); err != nil {
		return err
	}
	secret, keep, why := keptRoutes(out, servers)
	if secret == "" {
		secret = RouteSecret()
	}
	files := map[string]string{}
	if !keep {
		if why != "" {
			c.warn("%s: a new one is made, so restart every server at once (one restarted alone will not route to those still presenting the one before)", why)
		}
		rc, rk, err := RouteCertificate(servers)
		if err != nil {
			return err
		}
		files[RouteCertFile], files[RouteKeyFile], files[RouteCAFile] = string(rc), string(rk), string(rc)
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if k.Operator == nil {
		c.warnSharedAccount()
		nodes, tokens := c.registryUsers()
		files[AccountsFile] = AccountsConfig(k, nodes, tokens, true)
	}
	for i, s := range servers {
		if files[s.Name+".conf"], err = ClusterConfig(k, servers, i, abs, store, secret); err != nil {
			return err
		}
	}
	for name, text := range files {
		if err := statedir.WriteBytes(filepath.Join(out, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	if k.Operator != nil {
		if c.json {
			return c.printJSON(map[string]any{"servers": servers, "dir": out, "operator": k.Operator.OperatorPublic(), "nats": ClientURLs(servers)})
		}
		for _, s := range servers {
			fmt.Fprintf(c.stdout, "%s\t%s\tclients %s, routes %s\n", s.Name, filepath.Join(out, s.Name+".conf"), s.Client, s.Route)
		}
		fmt.Fprintf(c.stdout, "operator\t%s\t(every account a JWT; serve pushes each node's)\n", k.Operator.OperatorPublic())
		c.sayOperatorAnnounced(k)
		fmt.Fprintf(c.stdout, "then: mesh-control serve --dir %s --nats %s --replicas %d\n", c.dir, ClientURLs(servers), min(len(servers), 3))
		return nil
	}
	if c.json {
		return c.printJSON(map[string]any{"servers": servers, "dir": out, "accounts": filepath.Join(out, AccountsFile), "nats": ClientURLs(servers)})
	}
	for _, s := range servers {
		fmt.Fprintf(c.stdout, "%s\t%s\tclients %s, routes %s\n", s.Name, filepath.Join(out, s.Name+".conf"), s.Client, s.Route)
	}
	fmt.Fprintf(c.stdout, "accounts\t%s\t(included by each; serve --broker-accounts keeps it)\n", filepath.Join(out, AccountsFile))
	fmt.Fprintf(c.stdout, "then: mesh-control serve --dir %s --nats %s --replicas %d --broker-accounts %s --broker-pid PIDFILE,...\n", c.dir, ClientURLs(servers), min(len(servers), 3), filepath.Join(out, AccountsFile))
	return nil
}

// registryUsers is the registry's nodes and tokens, when the control side
// can be reached; none otherwise (said so).
func (c *cli) registryUsers() ([]*NodeRecord, []*TokenRecord) {
	cl, err := c.connectAsBrokerKnows()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.warn("no broker to read the registry from, so the configuration lists no nodes (serve --broker-config writes them once it runs): %v", err)
		}
		return nil, nil
	}
	defer cl.Close()
	nodes, err := cl.records(c.ctx)
	if err != nil {
		c.warn("the registry's nodes not read, so the configuration lists none: %v", err)
		return nil, nil
	}
	tokens, err := cl.tokens(c.ctx)
	if err != nil {
		c.warn("the registry's tokens not read, so the configuration lists none: %v", err)
	}
	return nodes, tokens
}

// warn says on standard error, as a sentence, something the command did
// not do that the person may count on; the command still does the rest.
func (c *cli) warn(format string, args ...any) {
	fmt.Fprintf(c.stderr, "mesh-control %s: warning: %s\n", c.cmd, fmt.Sprintf(format, args...))
}

func (c *cli) brokerConfig(listen, store string, resolver bool) error {
	k, err := c.brokerKeys(resolver)
	if err != nil {
		return err
	}
	if listen == "" {
		listen = listenOf(k.BrokerURL)
	}
	host, port, err := splitListen(listen)
	if err != nil {
		return err
	}
	if k.Operator != nil {
		if store == "" {
			store = filepath.Join(k.Dir, "jetstream")
		}
		if err := c.carryStore(k, store, listen); err != nil {
			return err
		}
		rc, err := k.ResolverConfig(store)
		if err != nil {
			return err
		}
		fmt.Fprint(c.stdout, serverConfig(k, "mesh-control", host, port, store)+rc)
		c.sayOperatorAnnounced(k)
		return nil
	}
	if store != "" {
		return errors.New("--store is for --cluster and --resolver; a configuration from a file keeps its store in the key directory")
	}
	c.warnSharedAccount()
	nodes, tokens := c.registryUsers()
	fmt.Fprint(c.stdout, BrokerConfig(k, host, port, nodes, tokens, true))
	return nil
}

// warnSharedAccount says what the configuration-file form of an existing
// broker does not give: an account per node (see AccountsConfig).
func (c *cli) warnSharedAccount() {
	c.warn("this form keeps every node in one account (NODES), where a node can have the broker deliver the answers to its own requests onto another node's subjects; --resolver (NATS operator mode) gives each node its own, as the embedded broker does")
}

// carryStore carries the control side's streams over to operator mode in
// store, a server's JetStream store: nats-server keeps an account's
// streams in a directory named as the account, CONTROL before and the
// CONTROL account's public key in operator mode, so without this a broker
// in operator mode on the same store would start with none — no registry,
// no declarations. The directory is renamed only with no broker on the
// store: the key directory's lock taken (no embedded broker runs) and
// nothing answering at listen.
func (c *cli) carryStore(k *Keys, store, listen string) error {
	from := filepath.Join(store, "jetstream", link.AccountControl)
	to := filepath.Join(store, "jetstream", k.Operator.ControlPublic)
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := os.Stat(to); err == nil {
		c.warn("%s and %s both hold streams: the second is operator mode's, and the first is left as it is", from, to)
		return nil
	}
	if conn, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("a broker answers at %s: stop it (serve, or the broker on %s), then run this again — the control side's streams (%s) are carried over to operator mode by renaming their directory, with no broker on the store", listen, store, from)
	}
	l, err := lockDir(k.Dir, "broker-config")
	if err != nil {
		return fmt.Errorf("carrying the control side's streams over to operator mode: %w", err)
	}
	defer l.Close()
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("carrying the control side's streams over to operator mode: %w", err)
	}
	if err := statedir.SyncDir(filepath.Dir(to)); err != nil {
		return err
	}
	c.warn("the control side's streams carried over to operator mode: %s is now %s", from, to)
	return nil
}

// brokerKeys loads the key directory for broker-config: with resolver,
// its operator keys made first where it has none. A key directory in
// operator mode stays in it: serve refuses a configuration from a file
// there.
func (c *cli) brokerKeys(resolver bool) (*Keys, error) {
	if resolver {
		// Not in operator mode yet: the nodes enrolled before are named.
		if _, err := os.Stat(filepath.Join(c.dir, FileBrokerOperator)); errors.Is(err, fs.ErrNotExist) {
			if _, err := LoadKeys(c.dir); err != nil {
				return nil, err
			}
			c.warnEnrolledBefore()
		}
		// Made where missing, before the whole directory is loaded: a
		// key directory in operator mode from before the control side's
		// signing key loads only with it.
		if _, err := MakeOperator(c.dir); err != nil {
			return nil, err
		}
	}
	return LoadKeys(c.dir)
}

// warnEnrolledBefore says, as the key directory moves to operator mode,
// which nodes hold a credential of the form before, which a broker in
// operator mode refuses: each must enrol again.
func (c *cli) warnEnrolledBefore() {
	cl, err := c.connect()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.warn("the registry was not read (%v): nodes enrolled before this key directory moved to operator mode, if any, hold a broker credential such a broker refuses, and must enrol again (mesh-control token issue --node NAME)", err)
		}
		return
	}
	nodes, err := cl.records(c.ctx)
	cl.Close()
	if err != nil {
		c.warn("the registry's nodes were not read (%v): those enrolled before this key directory moved to operator mode, if any, must enrol again", err)
		return
	}
	var live []string
	for _, n := range nodes {
		if n.NKey != "" {
			live = append(live, n.Name)
		}
	}
	if len(live) == 0 {
		return
	}
	sort.Strings(live)
	shown := live
	if len(shown) > 10 {
		shown = append(shown[:10:10], fmt.Sprintf("and %d more", len(live)-10))
	}
	c.warn("%d node(s) enrolled before this key directory moved to operator mode hold a broker credential such a broker refuses (%s): once serve runs on it, enrol each again (mesh-control token issue --node NAME, then mesh-executor enrol --replace on its machine)", len(live), strings.Join(shown, ", "))
}

// onlyLoopback reports whether the certificate's names would be loopback's
// alone: no --host, or only loopback ones.
func onlyLoopback(hosts []string) bool {
	for _, h := range hosts {
		for _, n := range strings.Split(h, ",") {
			n = strings.TrimSpace(n)
			if n == "" || n == "localhost" {
				continue
			}
			if ip := net.ParseIP(n); ip != nil && ip.IsLoopback() {
				continue
			}
			return false
		}
	}
	return true
}

// printReport prints one report and its lines, as reports does.
func (c *cli) printReport(r *SignedReport) {
	plan := r.Trigger == link.TriggerPlan
	head := fmt.Sprintf("seq %d  %s", r.Seq, r.Outcome)
	if plan {
		// A plan changed nothing and took no sequence: said as a plan,
		// in the conditional, never beside the applies as one of them.
		head = fmt.Sprintf("plan %s  %s", r.PlanID, r.Outcome.Planned())
	}
	if r.SupersededFrom != 0 && r.SupersededFrom < r.Seq {
		head = fmt.Sprintf("seq %d-%d  %s", r.SupersededFrom, r.Seq, r.Outcome)
	}
	switch {
	case r.Outcome == shapes.Superseded:
		head += fmt.Sprintf(" by seq %d (%s)", r.SupersededBy, r.SupersededOutcome)
	case r.Outcome == shapes.Refused:
		// Who refused is said once: not "by the executor: executor: refused:".
		why := strings.TrimPrefix(strings.TrimPrefix(r.Refused, r.RefusedBy+": "), "refused: ")
		head += fmt.Sprintf(" by the %s [%s]: %s", r.RefusedBy, r.Code, why)
	}
	if r.Trigger == link.TriggerReconnect {
		head += "  (reconcile after the link came back)"
	}
	if r.Trigger == link.TriggerActivity {
		// Not a declaration's: what the executor did on its own.
		head = fmt.Sprintf("on its own  %s", r.Outcome)
	}
	if r.Duplicate {
		head += "  (already applied: nothing done now; its lines are of when it was)"
	}
	fmt.Fprintf(c.stdout, "%s  %s\n", r.At.Local().Format(time.RFC3339), head)
	if !r.DisconnectedFrom.IsZero() {
		fmt.Fprintf(c.stdout, "    disconnected from %s to %s (%s)", r.DisconnectedFrom.Local().Format(time.RFC3339),
			r.DisconnectedTo.Local().Format(time.RFC3339), r.DisconnectedTo.Sub(r.DisconnectedFrom).Round(time.Second))
		if len(r.Meanwhile) == 0 {
			fmt.Fprint(c.stdout, "; meanwhile the executor changed nothing")
		}
		fmt.Fprintln(c.stdout)
	}
	if !r.DisconnectedFrom.IsZero() || r.Trigger == link.TriggerActivity {
		label := "meanwhile "
		if r.Trigger == link.TriggerActivity {
			label = ""
		}
		if r.MeanwhileMore > 0 {
			fmt.Fprintf(c.stdout, "    %s%d earlier activity(ies) not listed (an apply that changed much is several)\n", label, r.MeanwhileMore)
		}
		for _, a := range r.Meanwhile {
			fmt.Fprintf(c.stdout, "    %s%s  %s (%s", label, a.At.Local().Format(time.RFC3339), a.Outcome, a.Trigger)
			if a.Seq != 0 {
				fmt.Fprintf(c.stdout, ", seq %d", a.Seq)
			}
			if a.Part > 0 {
				fmt.Fprintf(c.stdout, ", continued")
			}
			fmt.Fprintf(c.stdout, "): %d changed, %d failed\n", a.Changed, a.Failed)
			for _, l := range a.Lines {
				fmt.Fprintf(c.stdout, "      %s.%s %s %s", l.Module, l.ID, l.Type, l.Outcome)
				if l.Detail != "" {
					fmt.Fprintf(c.stdout, "  %s", l.Detail)
				}
				fmt.Fprintln(c.stdout)
			}
			if a.LinesMore > 0 {
				fmt.Fprintf(c.stdout, "      and %d more\n", a.LinesMore)
			}
		}
	}
	for _, l := range r.Lines {
		d := ""
		if l.Detail != "" {
			d = "  " + l.Detail
		}
		o := string(l.Outcome)
		if plan {
			o = l.Outcome.Planned()
		}
		fmt.Fprintf(c.stdout, "    %s.%s  %s  %s%s\n", l.Module, l.ID, l.Type, o, d)
	}
}

// refusedForTime says whether a plan was refused for its time: past it
// (the node's clock ahead), or good for longer than a plan is (behind).
func refusedForTime(r *SignedReport) bool {
	return r.Outcome == shapes.Refused && wire.IsPlanTimeRefusal(r.Refused)
}

// plan asks a node for a plan of file and prints its answer.
func (c *cli) plan(node, file string, wait time.Duration, sealSpecs []string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := namesAnother(file, data, []string{node}); err != nil {
		return err
	}
	seals, err := ReadSeals(sealSpecs)
	if err != nil {
		return err
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.Seals = seals
	return inFile(file, data, c.planOf(cl, node, data, wait))
}

// planOf asks node for a plan of the declaration data and prints its
// answer: plan's, and assign --plan's of the composition it would send.
func (c *cli) planOf(cl *Client, node string, data []byte, wait time.Duration) error {
	id, err := cl.Plan(c.ctx, node, data)
	if err != nil {
		return err
	}
	if wait <= 0 {
		wait = DefaultWait
	}
	start := time.Now()
	r, err := cl.WaitPlan(c.ctx, node, id, wait, func() { c.waiting("the node's plan", 0, 1, start, wait) })
	c.progress("")
	if err != nil {
		return err
	}
	if refusedForTime(r) {
		// A plan request is good for wire.PlanWithin by the control side's
		// clock, and judged by the node's: said beside the refusal when the
		// two differ, or the operator looks for the fault elsewhere.
		if ns, err := cl.Nodes(c.ctx); err == nil {
			for _, n := range ns {
				if n.Name == node && n.ClockSkewMS != 0 {
					r.Refused += "; the two clocks differ: " + SkewText(n.ClockSkewMS)
				}
			}
		}
	}
	if c.json {
		if err := c.printJSON(r); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "plan on %s (nothing was changed):\n", node)
		c.printReport(r)
		var head struct {
			Retire bool `json:"retire"`
		}
		if json.Unmarshal(data, &head) == nil && head.Retire && r.Outcome != shapes.Refused {
			fmt.Fprintf(c.stdout, "then %s is retired: its executor drops the node's identity (hosted again) once the above ran to its end, and the control side revokes it when its report comes\n", node)
		}
		for _, d := range r.Diffs {
			fmt.Fprintf(c.stdout, "\n%s:\n%s\n", d.Resource, strings.TrimRight(d.Diff, "\n"))
		}
	}
	if r.Outcome == shapes.Refused && r.RefusedBy == "agent" && r.Code == wire.CodeInternal.String() {
		// The agent could not ask its executor, or read the archive
		// store: no verdict on the declaration, and none of a refusal —
		// there is no plan.
		why := "its agent could not ask its executor (is mesh-executor running there? mesh-executor doctor says)"
		if !strings.HasPrefix(r.Refused, link.PlanUnasked) {
			why = "its agent says " + r.Refused
		}
		return &exitError{ExitTimedOut, fmt.Sprintf("%s made no plan: %s", node, why)}
	}
	if code := outcomeExit(r); code != ExitApplied {
		return &exitError{code, fmt.Sprintf("%s would %s", node, map[int]string{ExitFailed: "fail a line", ExitRefused: "refuse it"}[code])}
	}
	return nil
}
