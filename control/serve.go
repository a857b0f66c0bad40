package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// ServeOptions configure Serve.
type ServeOptions struct {
	// Listen is the embedded broker's address (host:port; port 0 picks
	// one). Ignored with NATSURL.
	Listen string
	// NATSURL, when set, is an existing broker to use instead of the
	// embedded one. Its users and permissions are then that broker's
	// business: it must know the control side's NKey (control.nk's public
	// half) with all permissions, each node's NKey with link.NodePermissions,
	// and present the certificate in the key directory (broker.crt), whose
	// fingerprint is what nodes pin.
	NATSURL string
	// BrokerConfig, with NATSURL, is a file kept equal to the registry:
	// the existing broker's configuration (BrokerConfig, with its users),
	// written again whenever a node is added or revoked or a token issued
	// or spent, listening on Listen (default from the key directory).
	BrokerConfig string
	// BrokerAccounts, with NATSURL, is the file a cluster's servers all
	// include (AccountsFile, written by broker-config --cluster): only the
	// accounts and their users, kept equal to the registry as BrokerConfig
	// is. One of the two, not both.
	BrokerAccounts string
	// BrokerPID, with BrokerConfig or BrokerAccounts, is the existing
	// broker's pid file, or a comma-separated list of them (a cluster's
	// servers): each is sent SIGHUP (nats-server reloads its
	// configuration) after each write, so a revoked node is cut off at
	// once. Without it the operator reloads the broker.
	BrokerPID string
	// Replicas is how many copies a NATS cluster keeps of the control
	// side's streams, registry and archive store (ConnectReplicas); 0
	// keeps what exists.
	Replicas int
	// Lock is the key directory's lock (FileLock), when the caller took
	// it before reading anything in the directory (mesh-control serve
	// does). Nil: with the embedded broker, Serve takes it itself
	// (StartServer). An existing broker (NATSURL) needs none: its store
	// is its own, and several serve may share one.
	Lock *statedir.DirLock
	Log  *slog.Logger
	// Metrics, when set, is the address /metrics is served on (Prometheus'
	// text format): the fleet as the registry says it, and what this
	// serve recorded.
	Metrics string
	// UI, when set, is the address the read-only status page is served on.
	UI string
	// ArchiveGrace is how long an archive no kept declaration and no
	// assignment names stays in the store after it was put
	// (PruneArchives); 0 keeps every archive.
	ArchiveGrace time.Duration
	// Ready, when set, is called with the broker's client URL once serve
	// is up (tests).
	Ready func(url string, s *Server)
}

// Serve runs the control side until ctx ends: the embedded broker (unless
// NATSURL), its users kept equal to the registry (a node added while
// serving can connect at once, without a restart), and the recorder that
// folds reports and heartbeats into the registry.
func Serve(ctx context.Context, k *Keys, o ServeOptions) error {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	url := o.NATSURL
	var srv *Server
	if url == "" && k.Operator != nil {
		return fmt.Errorf("the key directory %s is set up for an existing broker in operator mode (%s, from broker-config --resolver): serve --nats URL, the embedded broker does not sign in its users by JWT", k.Dir, FileBrokerOperator)
	}
	if k.Operator != nil && (o.BrokerConfig != "" || o.BrokerAccounts != "") {
		return errors.New("a broker in operator mode takes its accounts from serve over its system account: no --broker-config, no --broker-accounts")
	}
	if url == "" {
		listen := o.Listen
		if listen == "" {
			listen = listenOf(k.BrokerURL)
		}
		var err error
		if o.Lock != nil {
			srv, err = startServer(k, listen, log)
		} else {
			srv, err = StartServer(k, listen, log)
		}
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
	}
	// Over TCP and TLS even to the broker serve embeds: an in-process
	// connection (nats.InProcessServer, a net.Pipe) was measured at
	// 10,000 nodes and left out — no fan-out faster beyond the runs'
	// spread, and the three restarts measured with it were the slowest
	// (26–31 s; 16–20 s in four of five without). A pipe has no buffer:
	// the broker's writes to the recorder wait for its reads.
	c, err := ConnectReplicas(ctx, k, url, o.Replicas, log)
	if err != nil {
		return err
	}
	defer c.Close()
	finishNKeyRotation(k, log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)
	var set func(nodes []*NodeRecord, tokens []*TokenRecord)
	var resolver *resolverSink
	switch {
	case srv != nil:
		set = func(nodes []*NodeRecord, tokens []*TokenRecord) {
			srv.SetNodes(nodes)
			srv.SetTokens(tokens)
		}
	case k.Operator != nil:
		rs, err := newResolverSink(k, url, log)
		if err != nil {
			return err
		}
		defer rs.close()
		set, c.brokerKnows = rs.set, rs.knows
		resolver = rs
	case o.BrokerConfig != "" || o.BrokerAccounts != "":
		set, err = brokerFile(k, o, log)
		if err != nil {
			return err
		}
	default:
		log.Info("using an existing broker: its users and permissions are its own business (mesh-control broker-config, or serve --broker-config)", "broker", url)
	}
	if set != nil {
		ready := make(chan struct{})
		// The embedded broker takes a change at once; an existing one
		// reloads its whole configuration for it (on every server of a
		// cluster), and its JetStream API may not answer for a moment
		// while it does: changes that come together are one reload.
		window := 20 * time.Millisecond
		if srv == nil {
			window = 250 * time.Millisecond
		}
		var reopened func() <-chan struct{}
		if srv != nil {
			reopened = srv.Reopened
		}
		go func() { errs <- c.keepUsers(ctx, set, window, ready, reopened, log) }()
		select {
		case <-ready:
		case err := <-errs:
			return err
		}
	}
	if srv != nil {
		// The embedded broker's store after a full disk: serve says so to
		// a command that failed, and opens the store again once there is
		// room (see store.go).
		if err := answerStore(c.NC, srv); err != nil {
			return err
		}
		go srv.keepStoreWriting(ctx, log)
	}
	if err := answerKeys(c, log); err != nil {
		return err
	}
	var pids []string
	if o.BrokerPID != "" {
		pids = strings.Split(o.BrokerPID, ",")
	}
	if err := answerCert(c, srv, pids, log); err != nil {
		return err
	}
	if err := answerAccountKey(c, resolver, log); err != nil {
		return err
	}
	if err := answerOperatorKey(c, resolver, log); err != nil {
		return err
	}
	go giveBackWhenQuiet(ctx, log)
	if o.Metrics != "" {
		c.metrics = newMetrics()
		ln, err := net.Listen("tcp", o.Metrics)
		if err != nil {
			return fmt.Errorf("--metrics %s: %w", o.Metrics, err)
		}
		go func() { errs <- serveMetrics(ctx, ln, c, c.metrics, log) }()
	}
	if o.UI != "" {
		ln, err := net.Listen("tcp", o.UI)
		if err != nil {
			return fmt.Errorf("--ui %s: %w", o.UI, err)
		}
		go func() { errs <- serveUI(ctx, ln, c, log) }()
	}
	go func() { errs <- keepRunning(ctx, log, "recorder", untilReopened(srv, c.Record)) }()
	if srv != nil {
		c.brokerKnows = srv.Knows
		go srv.sayRelinking(ctx, log, relinkingEvery)
	}
	go func() { errs <- keepRunning(ctx, log, "enrolment responder", untilReopened(srv, c.Enrolments)) }()
	go func() { errs <- keepRunning(ctx, log, "publisher", untilReopened(srv, c.KeepComposed)) }()
	if o.ArchiveGrace > 0 {
		prune := func(ctx context.Context) error { return c.keepArchivesPruned(ctx, o.ArchiveGrace, log) }
		go func() { errs <- keepRunning(ctx, log, "archive pruner", untilReopened(srv, prune)) }()
	}
	log.Info("serving", "broker", url, "control_key", k.KeyID(), "broker_fingerprint", k.Fingerprint)
	if o.Ready != nil {
		o.Ready(url, srv)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

// keepRunning runs part until ctx ends, starting it again after a pause
// when it fails: against an existing broker — a cluster reloading its
// users, electing a leader — a watch or a consumer can fail for a moment
// ("jetstream not enabled" while an account reloads), and one part's
// moment must not end serve and leave the registry unrecorded.
func keepRunning(ctx context.Context, log *slog.Logger, name string, part func(context.Context) error) error {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		began := time.Now()
		err := part(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(began) > time.Minute || errors.Is(err, errStoreReopened) {
			// It ran a good while: this stop is a new one, not the
			// next of a run of failures (a store reopened after a full
			// disk stops each part once).
			wait = time.Second
		}
		if errors.Is(err, errStoreReopened) {
			// Planned: each part reads the store anew.
			log.Info("serve: the "+name+" starts again on the store opened anew", "in", wait)
		} else {
			log.Error("serve: the "+name+" stopped; starting it again", "err", err, "in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// keepUsers watches the registry and makes the broker's users equal to it:
// the nodes with their NKeys (none for a revoked node), and the one-time
// credentials of tokens that may still be used. When reopened (non-nil)
// says the broker's store was opened anew, the watch is made again and
// the registry read whole (see Server.Reopened).
func (c *Client) keepUsers(ctx context.Context, set func([]*NodeRecord, []*TokenRecord), window time.Duration, ready chan<- struct{}, reopened func() <-chan struct{}, log *slog.Logger) error {
	var again <-chan struct{} // nil: never
	if reopened != nil {
		again = reopened()
	}
	w, err := c.KV.WatchFiltered(ctx, []string{"node.*", "token.*"})
	if err != nil {
		return fmt.Errorf("watching the registry: %w", err)
	}
	defer func() { w.Stop() }()
	nodes := map[string]*NodeRecord{}
	tokens := map[string]*TokenRecord{}
	initial, readied := true, false
	apply := func() {
		list := make([]*NodeRecord, 0, len(nodes))
		for _, n := range nodes {
			list = append(list, n)
		}
		tl := make([]*TokenRecord, 0, len(tokens))
		for _, t := range tokens {
			tl = append(tl, t)
		}
		set(list, tl)
		log.Debug("broker users", "nodes", len(list), "tokens", len(tl))
	}
	// fold takes one entry in; changed says the broker's users may differ.
	fold := func(e jetstream.KeyValueEntry) (changed bool) {
		key := e.Key()
		put := e.Operation() == jetstream.KeyValuePut
		if name, ok := strings.CutPrefix(key, "node."); ok {
			var r NodeRecord
			if !put || json.Unmarshal(e.Value(), &r) != nil {
				if put {
					log.Error("registry: unreadable record; its node cannot connect", "node", name)
				}
				delete(nodes, name)
				return true
			}
			old, had := nodes[name]
			nodes[name] = &r
			return !had || old.NKey != r.NKey || old.Enrolment != r.Enrolment
		}
		id := strings.TrimPrefix(key, "token.")
		var t TokenRecord
		if !put || json.Unmarshal(e.Value(), &t) != nil {
			delete(tokens, id)
			return true
		}
		tokens[id] = &t
		return true
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-again:
			again = reopened()
			w.Stop()
			if w, err = c.KV.WatchFiltered(ctx, []string{"node.*", "token.*"}); err != nil {
				return fmt.Errorf("watching the registry after the store was opened anew: %w", err)
			}
			clear(nodes)
			clear(tokens)
			initial = true
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("the registry watch ended")
			}
			if e == nil { // the initial values are all in
				apply()
				initial = false
				if !readied {
					close(ready)
					readied = true
				}
				continue
			}
			if !fold(e) || initial {
				continue
			}
			// Drain what else arrived at once into one change.
			coalesce(w, window, func(e jetstream.KeyValueEntry) { fold(e) })
			apply()
		}
	}
}

// brokerFile is keepUsers' sink for an existing broker: the configuration
// BrokerConfig makes, with the registry's users, written atomically to
// o.BrokerConfig — or, for a cluster, only its accounts (AccountsConfig)
// to o.BrokerAccounts, which every server includes — then SIGHUP to each
// pid in o.BrokerPID, if given, for nats-server to reload it (a user it no
// longer lists is disconnected). A token's credential leaves the list when
// it stops being usable, not only at the next change of the registry: the
// file is written again then.
func brokerFile(k *Keys, o ServeOptions, log *slog.Logger) (func([]*NodeRecord, []*TokenRecord), error) {
	file, render := o.BrokerConfig, func(nodes []*NodeRecord, tokens []*TokenRecord) string { return "" }
	switch {
	case o.BrokerConfig != "" && o.BrokerAccounts != "":
		return nil, errors.New("--broker-config (one server's whole configuration) or --broker-accounts (the accounts a cluster's servers include), not both")
	case o.BrokerAccounts != "":
		file = o.BrokerAccounts
		render = func(nodes []*NodeRecord, tokens []*TokenRecord) string { return AccountsConfig(k, nodes, tokens, true) }
	default:
		listen := o.Listen
		if listen == "" {
			listen = listenOf(k.BrokerURL)
		}
		host, port, err := splitListen(listen)
		if err != nil {
			return nil, err
		}
		render = func(nodes []*NodeRecord, tokens []*TokenRecord) string {
			return BrokerConfig(k, host, port, nodes, tokens, true)
		}
	}
	pids := splitList(o.BrokerPID)
	var mu sync.Mutex
	var expiry *time.Timer
	var write func(nodes []*NodeRecord, tokens []*TokenRecord)
	write = func(nodes []*NodeRecord, tokens []*TokenRecord) {
		mu.Lock()
		defer mu.Unlock()
		if expiry != nil {
			expiry.Stop()
		}
		now := time.Now()
		var next time.Time
		for _, t := range tokens {
			if until := t.Expires.Add(tokenGrace); t.usable(now) && (next.IsZero() || until.Before(next)) {
				next = until
			}
		}
		if !next.IsZero() {
			expiry = time.AfterFunc(time.Until(next)+time.Second, func() { write(nodes, tokens) })
		}
		if err := statedir.WriteBytes(file, []byte(render(nodes, tokens)), 0o644); err != nil {
			log.Error("the broker's configuration could not be written; the broker still lets in who it did", "file", file, "err", err)
			return
		}
		if len(pids) == 0 {
			log.Warn("the broker's configuration changed: reload the broker", "file", file)
			return
		}
		for _, p := range pids {
			if err := signalReload(p); err != nil {
				log.Error("the broker's configuration changed but a server was not told; reload it", "file", file, "pid_file", p, "err", err)
			}
		}
		log.Info("the broker reloads its users", "file", file, "servers", len(pids), "nodes", len(nodes))
	}
	return write, nil
}

// signalReload sends SIGHUP to the process whose pid the file holds. The
// file is believed only if no one but root or this process's user could
// have written it: otherwise it could name any process to signal.
func signalReload(pidFile string) error {
	fi, err := os.Stat(pidFile)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", pidFile)
	case !ok || (st.Uid != 0 && int(st.Uid) != os.Geteuid()):
		return fmt.Errorf("%s is not root's or this user's: its pid is not believed", pidFile)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s may be written by others (mode %04o): its pid is not believed", pidFile, fi.Mode().Perm())
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("%s does not hold a process id", pidFile)
	}
	return syscall.Kill(pid, syscall.SIGHUP)
}
