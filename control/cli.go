package control

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
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

const usage = `usage: mesh-control COMMAND [flags]

  init     --dir DIR [--host NAME|IP]... [--url tls://HOST:PORT]
           make the control-plane key, the broker certificate and the control NKey
  serve    --dir DIR [--listen 127.0.0.1:4222] [--nats URL[,URL...] [--replicas N]
           [--broker-config FILE | --broker-accounts FILE] [--broker-pid FILE[,FILE...]]] [-v]
           run the embedded broker (or use --nats URL) and keep the registry; with an
           existing broker, keep FILE its configuration and send it SIGHUP on each change;
           the embedded broker's store is in DIR: one serve holds DIR (a second is refused)
  token issue (--new [--name NAME] | --node NAME) --dir DIR [--ttl 1h] [--broker-url URL]
           print, once, a one-time enrolment token that expires whether used or not;
           --node revokes the identity that node has now (a re-enrolment)
  node revoke NAME --dir DIR [--json]
           revoke the node's identity: the broker refuses it from now on, and nothing
           is declared, assigned or published to it until a machine enrols as it again
           (token issue --node NAME); a node revoked already is said so (exit 0)
  node show NAME --dir DIR [--json]
           the node's record, keys, and the profile and inventory it reported
  node add NAME --dir DIR [--out FILE] [--broker-url URL]
           register a node by hand (no enrolment): write its agent config and
           executor-identity.json, to be installed on the node by a person
  node endpoint NAME ADDRESS:PORT|none --dir DIR
           where the node's peers reach it on the underlay (none: they wait for it)
  overlay set --dir DIR [--network CIDR] [--interface NAME] [--port N] [--keepalive S]
           set the mesh's overlay (defaults 10.99.0.0/16, mesh0, 51820, 25) and publish
           every node's composition
  overlay show --dir DIR [--json]
           the overlay, each node's address, endpoint and WireGuard key
  assign   NODE FILE --dir DIR [--despite-briefing]
           assign the module FILE (resources of one module) to NODE and publish the node's
           composition: the overlay, then its modules in the order assigned
  unassign NODE MODULE --dir DIR
           take MODULE off NODE and publish the node's composition
  publish  [NODE] --dir DIR
           publish the node's composition (every node's) again, with a new sequence
  declare  NODE[,NODE...] FILE --dir DIR [--seal MODULE.ID=PATH]... [--without-overlay]
           sign FILE for NODE with the next sequence and publish it; print the sequence
           (several nodes: their declares pipelined, a line each);
           --seal seals PATH's content to the node's key as file MODULE.ID's content;
           on a mesh with an overlay, a FILE without it (holding something) is refused
           (use assign) unless --without-overlay
  archive put FILE --dir DIR [--json]
           store FILE (a tar, gzipped or not) in the archive store under its sha256;
           print the sha256 and the URL an archive resource names it by (obj://SHA256)
  nodes    --dir DIR [--json]
           each node: state (revoked, never heard from, silent, or what its agent says),
           last heard from, executor version, declared vs applied, outcome
  reports  NODE --dir DIR [--last N] [--json]
           the node's last reports, with their lines
  broker-config --dir DIR [--listen HOST:PORT]
           a nats-server configuration for an existing broker (serve --nats)
  broker-config --dir DIR --cluster ROUTE,ROUTE,ROUTE --listen CLIENT,CLIENT,CLIENT --out OUTDIR [--store DIR]
           each server's configuration of a NATS cluster (OUTDIR/mesh-broker-N.conf, routes
           between them, TLS with DIR's certificate) and the accounts they all include
           (OUTDIR/accounts.conf: serve --nats URLS --replicas 3 --broker-accounts it)

Client commands talk to the broker (--nats URL, default the broker_url of DIR/control.json),
TLS pinned to DIR/broker.crt, authenticated with DIR/control.nk.
`

// Main runs mesh-control with args (without the program name).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, rest := args[0], args[1:]
	if cmd == "node" || cmd == "token" {
		subs := map[string][]string{"node": {"add", "revoke", "show", "endpoint"}, "token": {"issue"}}[cmd]
		if len(rest) == 0 || !slices.Contains(subs, rest[0]) {
			fmt.Fprintf(stderr, "mesh-control %s: the subcommand is one of %s\n", cmd, strings.Join(subs, ", "))
			return 2
		}
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	if cmd == "overlay" {
		if len(rest) == 0 || (rest[0] != "set" && rest[0] != "show") {
			fmt.Fprintln(stderr, "mesh-control overlay: the subcommand is one of set, show")
			return 2
		}
		cmd, rest = "overlay "+rest[0], rest[1:]
	}
	if cmd == "archive" {
		if len(rest) == 0 || rest[0] != "put" {
			fmt.Fprintln(stderr, "mesh-control archive: the subcommand is put")
			return 2
		}
		cmd, rest = "archive put", rest[1:]
	}
	c := &cli{ctx: ctx, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("mesh-control "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.dir, "dir", "", "the key directory")
	fs.StringVar(&c.nats, "nats", "", "the broker URL (client commands); serve: an existing broker instead of the embedded one")
	fs.BoolVar(&c.json, "json", false, "JSON output")
	fs.BoolVar(&c.withoutOverlay, "without-overlay", false, "declare: send a file without the overlay on a mesh that has one (the node takes its overlay down)")
	fs.BoolVar(&c.despiteBriefing, "despite-briefing", false, "declare, assign: assign to a node whose adoption briefing has a failed line (to push the fix)")
	fs.BoolVar(&c.verbose, "v", false, "debug logging")
	var hosts, seals listFlag
	fs.Var(&seals, "seal", "declare: MODULE.ID=PATH, seal PATH's content to the node's key as that file's content (repeatable)")
	fs.Var(&hosts, "host", "init: another name or address for the broker certificate (repeatable)")
	url := fs.String("url", "", "init: where client commands find the broker (default "+DefaultBrokerURL+")")
	listen := fs.String("listen", "", "serve: the embedded broker's address (default from DIR/control.json: 127.0.0.1:4222); with --broker-config, the existing broker's")
	brokerConfig := fs.String("broker-config", "", "serve --nats: keep this file the existing broker's configuration, equal to the registry")
	brokerPID := fs.String("broker-pid", "", "serve --broker-config/--broker-accounts: the existing broker's pid file (a cluster: a comma-separated list, one per server); each is sent SIGHUP to reload after each change")
	brokerAccounts := fs.String("broker-accounts", "", "serve --nats: keep this file (a cluster's "+AccountsFile+", from broker-config --cluster) the accounts every server includes, equal to the registry")
	replicas := fs.Int("replicas", 0, "serve --nats: keep the control side's streams and registry at this many copies (3 on a three-server cluster); 0 keeps what exists")
	cluster := fs.String("cluster", "", "broker-config: the servers' route addresses, HOST:PORT,... (one per server; --listen their client addresses, in the same order; --out the directory to write to)")
	store := fs.String("store", "", "broker-config --cluster: the directory each server's JetStream store is made under (default --out)")
	out := fs.String("out", "", "node add: the agent config file (default NAME/agent.json); broker-config --cluster: the directory the configurations are written to")
	brokerURL := fs.String("broker-url", "", "node add: the broker as the node reaches it (default the URL used)")
	last := fs.Int("last", 20, "reports: how many")
	isNew := fs.Bool("new", false, "token issue: for a machine the mesh has not seen")
	forNode := fs.String("node", "", "token issue: for this existing node (revokes its identity now)")
	newName := fs.String("name", "", "token issue --new: the name the node gets (default: from its hostname)")
	ttl := fs.Duration("ttl", DefaultTokenTTL, "token issue: how long the token lives, used or not")
	fs.String("network", DefaultOverlayNetwork, "overlay set: the prefix node addresses are allocated from")
	fs.String("interface", DefaultOverlayInterface, "overlay set: the WireGuard interface on every node")
	fs.Int("port", DefaultOverlayPort, "overlay set: the WireGuard listen port on every node")
	fs.Int("keepalive", DefaultOverlayKeepalive, "overlay set: the keepalive on every peer, seconds (0: none)")
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		return 2
	}
	if c.dir == "" {
		fmt.Fprintf(stderr, "mesh-control %s: --dir is required\n", cmd)
		return 2
	}
	want := map[string]int{"token issue": 0, "node revoke": 1, "node show": 1, "init": 0, "serve": 0, "node add": 1, "declare": 2, "archive put": 1, "nodes": 0, "reports": 1, "broker-config": 0,
		"node endpoint": 2, "overlay set": 0, "overlay show": 0, "assign": 2, "unassign": 2, "publish": 1}
	n, ok := want[cmd]
	if !ok {
		fmt.Fprintf(stderr, "mesh-control: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if len(pos) != n && !(cmd == "publish" && len(pos) == 0) {
		fmt.Fprintf(stderr, "mesh-control %s: takes %d argument(s), got %d\n\n%s", cmd, n, len(pos), usage)
		return 2
	}
	level := slog.LevelInfo
	if c.verbose {
		level = slog.LevelDebug
	}
	c.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	switch cmd {
	case "init":
		err = c.init(hosts, *url)
	case "serve":
		err = c.serve(*listen, *brokerConfig, *brokerAccounts, *brokerPID, *replicas)
	case "node add":
		err = c.nodeAdd(pos[0], *out, *brokerURL)
	case "token issue":
		err = c.tokenIssue(*isNew, *forNode, *newName, *ttl, *brokerURL)
	case "node revoke":
		err = c.nodeRevoke(pos[0])
	case "node show":
		err = c.nodeShow(pos[0])
	case "declare":
		err = c.declare(pos[0], pos[1], seals)
	case "archive put":
		err = c.archivePut(pos[0])
	case "nodes":
		err = c.nodes()
	case "reports":
		err = c.reports(pos[0], *last)
	case "broker-config":
		if *cluster != "" {
			err = c.brokerCluster(*listen, *cluster, *out, *store)
		} else {
			err = c.brokerConfig(*listen)
		}
	case "node endpoint":
		err = c.nodeEndpoint(pos[0], pos[1])
	case "overlay set":
		err = c.overlaySet(overlayChangeFrom(fs))
	case "overlay show":
		err = c.overlayShow()
	case "assign":
		err = c.assign(pos[0], pos[1])
	case "unassign":
		err = c.unassign(pos[0], pos[1])
	case "publish":
		err = c.publish(pos)
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

// parseInterleaved parses flags anywhere among the positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

type cli struct {
	ctx            context.Context
	stdout, stderr io.Writer
	dir, nats      string
	json, verbose  bool
	// despiteBriefing: declare to a node whose briefing has a failed line.
	despiteBriefing bool
	withoutOverlay  bool
	log             *slog.Logger
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
	if c.json {
		return c.printJSON(map[string]string{"control_key_id": k.KeyID(), "control_key": k.ControlPublicBase64(), "broker_fingerprint": k.Fingerprint, "broker_url": k.BrokerURL})
	}
	fmt.Fprintf(c.stdout, "control key id:            %s\ncontrol public key:        %s\nbroker certificate sha256: %s\nbroker url:                %s\n",
		k.KeyID(), k.ControlPublicBase64(), k.Fingerprint, k.BrokerURL)
	return nil
}

func (c *cli) serve(listen, brokerConfig, brokerAccounts, brokerPID string, replicas int) error {
	if (brokerConfig != "" || brokerAccounts != "" || brokerPID != "" || replicas != 0) && c.nats == "" {
		return errors.New("--broker-config, --broker-accounts, --broker-pid and --replicas are for an existing broker (serve --nats URL); the embedded one follows the registry by itself and is one server")
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
	var lock *agent.DirLock
	if c.nats == "" {
		l, err := lockDir(c.dir, "serve")
		if err != nil {
			return err
		}
		defer l.Close()
		lock = l
	}
	k, err := LoadKeys(c.dir)
	if err != nil {
		return err
	}
	return Serve(c.ctx, k, ServeOptions{Listen: listen, NATSURL: c.nats, BrokerConfig: brokerConfig, BrokerAccounts: brokerAccounts, BrokerPID: brokerPID, Replicas: replicas, Lock: lock, Log: c.log})
}

func (c *cli) connect() (*Client, error) {
	k, err := LoadKeys(c.dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
	defer cancel()
	return Connect(ctx, k, c.nats, c.log)
}

func (c *cli) nodeAdd(name, out, brokerURL string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	if out == "" {
		out = filepath.Join(name, "agent.json")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		return err
	}
	exPath := filepath.Join(filepath.Dir(out), "executor-identity.json")
	for _, p := range []string{out, exPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s exists; not overwriting it", p)
		}
	}
	cfg, ex, err := cl.AddNode(c.ctx, name, brokerURL)
	if err != nil {
		return err
	}
	if err := agent.WriteFile(out, cfg); err != nil {
		return err
	}
	if err := agent.WriteFile(exPath, ex); err != nil {
		return err
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
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if len(data) > shapes.MaxDeclarationSize {
		return fmt.Errorf("%s: over %d bytes", file, shapes.MaxDeclarationSize)
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
	if strings.Contains(node, ",") {
		return c.declareMany(cl, splitList(node), data)
	}
	// A revoked node first: whatever else is wrong with the file, it
	// could not reach the node.
	if err := cl.refuseRevoked(c.ctx, node); err != nil {
		return err
	}
	if !c.withoutOverlay {
		if err := withOverlay(c.ctx, cl, data); err != nil {
			return err
		}
	}
	seq, err := cl.Declare(c.ctx, node, data)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"node": node, "seq": seq})
	}
	fmt.Fprintln(c.stdout, seq)
	return nil
}

// declareMany declares data to each of nodes (DeclareAll), a line each:
// the sequence, or why not; it fails if any was not declared to.
func (c *cli) declareMany(cl *Client, nodes []string, data []byte) error {
	if !c.withoutOverlay {
		if err := withOverlay(c.ctx, cl, data); err != nil {
			return err
		}
	}
	seqs, errs := cl.DeclareAll(c.ctx, nodes, data)
	failed := 0
	type line struct {
		Node  string `json:"node"`
		Seq   uint64 `json:"seq,omitempty"`
		Error string `json:"error,omitempty"`
	}
	lines := make([]line, len(nodes))
	for i, n := range nodes {
		lines[i] = line{Node: n, Seq: seqs[i]}
		if errs[i] != nil {
			failed++
			lines[i] = line{Node: n, Error: errs[i].Error()}
		}
	}
	if c.json {
		if err := c.printJSON(lines); err != nil {
			return err
		}
	} else {
		for _, l := range lines {
			if l.Error != "" {
				fmt.Fprintf(c.stdout, "%s\tnot declared: %s\n", l.Node, l.Error)
			} else {
				fmt.Fprintf(c.stdout, "%s\t%d\n", l.Node, l.Seq)
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d node(s) not declared to", failed, len(nodes))
	}
	return nil
}

// withOverlay refuses a raw declaration that would take a node out of the
// mesh's overlay: sent as written, it replaces the node's whole
// composition, and one without the overlay has the node remove it.
func withOverlay(ctx context.Context, cl *Client, data []byte) error {
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
			Type string `json:"type"`
		} `json:"resources"`
	}
	if json.Unmarshal(data, &d) != nil || d.OwnsNothing {
		// Malformed: the declaration's own checks say what is wrong with
		// it. Holding nothing (a retirement among them): the overlay goes
		// with everything else, as asked.
		return nil
	}
	for _, r := range d.Resources {
		if r.Type == shapes.TypeOverlay {
			return nil
		}
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
		ex := "-"
		if n.ExecutorVersion != "" || n.ExecutorBuild != "" {
			ex = n.ExecutorVersion
			if n.ExecutorBuild != "" {
				ex += " (" + n.ExecutorBuild + ")"
			}
			if n.RolledBackFrom != "" {
				ex += ", rolled back from " + n.RolledBackFrom
			}
		} else if n.ExecutorHalted != "" {
			ex = "halted (" + n.ExecutorHalted + ")"
		} else if n.ExecutorError != "" {
			ex = "unreachable"
		}
		outcome := string(n.LastOutcome)
		if outcome == "" {
			outcome = "-"
		} else {
			outcome = fmt.Sprintf("%s (seq %d)", outcome, n.LastSeq)
		}
		state := n.State
		if n.Presence == link.PresenceEpisodic {
			// An app, linked only while it runs: its silence is the
			// ordinary case, said as a fact, not an alarm.
			state += " (episodic)"
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
		head := fmt.Sprintf("seq %d  %s", r.Seq, r.Outcome)
		if r.SupersededFrom != 0 && r.SupersededFrom < r.Seq {
			head = fmt.Sprintf("seq %d-%d  %s", r.SupersededFrom, r.Seq, r.Outcome)
		}
		switch {
		case r.Outcome == shapes.Superseded:
			head += fmt.Sprintf(" by seq %d (%s)", r.SupersededBy, r.SupersededOutcome)
		case r.Outcome == shapes.Refused:
			head += fmt.Sprintf(" by the %s [%s]: %s", r.RefusedBy, r.Code, r.Refused)
		}
		if r.Trigger == link.TriggerReconnect {
			head += "  (reconcile after the link came back)"
		}
		if r.Duplicate {
			head += "  (already applied: nothing done)"
		}
		fmt.Fprintf(c.stdout, "%s  %s\n", r.At.Local().Format(time.RFC3339), head)
		if !r.DisconnectedFrom.IsZero() {
			fmt.Fprintf(c.stdout, "    disconnected from %s to %s (%s)", r.DisconnectedFrom.Local().Format(time.RFC3339),
				r.DisconnectedTo.Local().Format(time.RFC3339), r.DisconnectedTo.Sub(r.DisconnectedFrom).Round(time.Second))
			if len(r.Meanwhile) == 0 {
				fmt.Fprint(c.stdout, "; meanwhile the executor changed nothing")
			}
			fmt.Fprintln(c.stdout)
			if r.MeanwhileMore > 0 {
				fmt.Fprintf(c.stdout, "    meanwhile: %d earlier apply(s) not listed\n", r.MeanwhileMore)
			}
			for _, a := range r.Meanwhile {
				fmt.Fprintf(c.stdout, "    meanwhile %s  %s (%s", a.At.Local().Format(time.RFC3339), a.Outcome, a.Trigger)
				if a.Seq != 0 {
					fmt.Fprintf(c.stdout, ", seq %d", a.Seq)
				}
				fmt.Fprintf(c.stdout, "): %d changed, %d failed\n", a.Changed, a.Failed)
			}
		}
		for _, l := range r.Lines {
			d := ""
			if l.Detail != "" {
				d = "  " + l.Detail
			}
			fmt.Fprintf(c.stdout, "    %s.%s  %s  %s%s\n", l.Module, l.ID, l.Type, l.Outcome, d)
		}
	}
	if skipped > 0 {
		fmt.Fprintf(c.stdout, "(%d message(s) on mesh.report.%s not signed by the node: ignored)\n", skipped, node)
	}
	return nil
}

// brokerCluster writes a cluster's configurations into out: one per
// server, with a fresh route secret they share, and the accounts they
// include, listing the registry's users if the control side can be
// reached (the first serve --broker-accounts writes them otherwise).
func (c *cli) brokerCluster(listen, routes, out, store string) error {
	k, err := LoadKeys(c.dir)
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
	nodes, tokens := c.registryUsers()
	secret := RouteSecret()
	rc, rk, err := RouteCertificate(servers)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	files := map[string]string{AccountsFile: AccountsConfig(k, nodes, tokens, true), RouteCertFile: string(rc), RouteKeyFile: string(rk)}
	for i, s := range servers {
		files[s.Name+".conf"] = ClusterConfig(k, servers, i, abs, store, secret)
	}
	for name, text := range files {
		if err := agent.WriteBytes(filepath.Join(out, name), []byte(text), 0o600); err != nil {
			return err
		}
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
	cl, err := c.connect()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			c.log.Warn("no broker to read the registry from; the configuration lists no nodes", "err", err)
		}
		return nil, nil
	}
	defer cl.Close()
	nodes, err := cl.records(c.ctx)
	if err != nil {
		c.log.Warn("the registry's nodes not read; the configuration lists none", "err", err)
		return nil, nil
	}
	tokens, err := cl.tokens(c.ctx)
	if err != nil {
		c.log.Warn("the registry's tokens not read; the configuration lists none", "err", err)
	}
	return nodes, tokens
}

func (c *cli) brokerConfig(listen string) error {
	k, err := LoadKeys(c.dir)
	if err != nil {
		return err
	}
	if listen == "" {
		listen = strings.TrimPrefix(strings.TrimPrefix(k.BrokerURL, "tls://"), "nats://")
	}
	host, port, err := splitListen(listen)
	if err != nil {
		return err
	}
	nodes, tokens := c.registryUsers()
	fmt.Fprint(c.stdout, BrokerConfig(k, host, port, nodes, tokens, true))
	return nil
}
