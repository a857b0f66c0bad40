package control

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"golang.org/x/sys/unix"
)

// MaxPayload is the largest message the embedded broker takes: a signed
// declaration at its largest in practice (NATS advises against more).
const MaxPayload = 8 << 20

// q quotes s for the nats-server configuration language.
func q(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\x%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func qs(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = q(s)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// BrokerConfig is a nats-server configuration with the embedded broker's
// layout: TLS with the key directory's certificate, JetStream, the accounts
// CONTROL and NODES with their exports and imports. With users, it lists
// the control side's NKey and each node's with link.NodePermissionsEither — what an
// existing broker (serve --nats) needs, reloaded whenever a node is added.
// The embedded broker is made from it without users, and authenticates
// against the registry itself (registryAuth), so it never reloads.
func BrokerConfig(k *Keys, host string, port int, nodes []*NodeRecord, tokens []*TokenRecord, users bool) string {
	return serverConfig(k, "mesh-control", host, port, filepath.Join(k.Dir, "jetstream")) + AccountsConfig(k, nodes, tokens, users)
}

// JetStreamSync is the sync_interval every broker's configuration writes
// (serverConfig says why it is "always"). Only the fleet bench's
// comparison build (-tags benchnosync: what fsync before each
// acknowledgement costs a fan-out) sets it to "", nats-server's default;
// the Makefile and the packages never do.
var JetStreamSync = "always"

// serverConfig is the part of a server's configuration that is its own:
// its name, where it listens, its TLS, its JetStream store.
func serverConfig(k *Keys, name, host string, port int, store string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nhost: %s\nport: %d\nmax_payload: %d\n", q(name), q(host), port, MaxPayload)
	// The handshake's timeout is the link's (link.ConnectTimeout says why).
	fmt.Fprintf(&b, "tls {\n  cert_file: %s\n  key_file: %s\n  timeout: %d\n}\n", q(k.CertFile()), q(k.KeyFile()), int(link.ConnectTimeout/time.Second))
	// sync_interval: always — JetStream fsyncs each write before it
	// acknowledges it. nats-server's default flushes every two minutes, so
	// a power cut loses what was acknowledged in between: a node added, a
	// token's one-time use, a revocation, a sequence a node has already
	// applied (the next declare would reuse it). Acknowledged must mean on
	// disk, as etcd and PostgreSQL have it; the NATS maintainers advise the
	// same where that is the promise. Every broker the control side makes
	// or writes a configuration for (embedded, broker-config, --cluster)
	// has its server part from here.
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n", q(store))
	if JetStreamSync != "" {
		fmt.Fprintf(&b, "  sync_interval: %s\n", JetStreamSync)
	}
	b.WriteString("}\n")
	return b.String()
}

// AccountsConfig is the accounts block every server of the mesh's broker
// has alike. Its two forms share CONTROL (the control side, JetStream) and
// NODES (the enrolment tokens), and differ in where the nodes live:
//
//   - Without users, the embedded broker's: each node in an account of its
//     own, made as it first connects (registryAuth.nodeAccount), importing
//     its own subjects in the layouts its agents link in
//     (link.NodeImportsOf) from CONTROL's exports, which hold the importer
//     to the subject naming it (account_token_position).
//   - With users, an existing broker's or a cluster's (broker-config,
//     --broker-config, --broker-accounts): every node an NKey user of
//     NODES with permissions on its own subjects only, NODES importing
//     every service once with wildcards, and exporting the notices, which
//     CONTROL imports. Not an account each: such a broker learns of a node
//     by a configuration reload, and nats-server 2.15.2 wires the imports of
//     an account a reload introduces to the exporting account as that
//     reload parsed it — its services answer "no responders", and a
//     subscription to one of its stream imports crashed every server of a
//     cluster (Sublist.Insert on a nil sublist, from addShadowSub). In one
//     account nodes can have the broker's answers delivered onto each
//     other's subjects; the agent drops what is no notice (SECURITY.md).
func AccountsConfig(k *Keys, nodes []*NodeRecord, tokens []*TokenRecord, users bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "accounts {\n  %s {\n    jetstream: enabled\n", link.AccountControl)
	if users {
		fmt.Fprintf(&b, "    users: [{nkey: %s}]\n", q(k.NKeyPublic))
	}
	b.WriteString("    exports: [\n")
	exported := map[string]bool{}
	for _, si := range link.ServiceImports {
		if exported[si.Subject] {
			continue // imported under two names: exported once
		}
		exported[si.Subject] = true
		switch {
		case users:
			fmt.Fprintf(&b, "      {service: %s, accounts: [%s]}\n", q(si.Subject), link.AccountNodes)
		case si.Node > 0:
			fmt.Fprintf(&b, "      {service: %s, account_token_position: %d}\n", q(si.Subject), si.Node)
		default:
			fmt.Fprintf(&b, "      {service: %s}\n", q(si.Subject))
		}
	}
	fmt.Fprintf(&b, "      {service: %s, response_type: singleton, accounts: [%s]}\n", q(link.EnrolService), link.AccountNodes)
	if !users {
		for _, n := range link.Notices {
			if n.Node > 0 {
				fmt.Fprintf(&b, "      {stream: %s, account_token_position: %d}\n", q(n.Subject), n.Node)
			} else {
				fmt.Fprintf(&b, "      {stream: %s}\n", q(n.Subject))
			}
		}
	}
	b.WriteString("    ]\n")
	// Reports spread over their partitions (link.ReportMapping): applied
	// to what the nodes' imports bring, whichever account they are in.
	fmt.Fprintf(&b, "    mappings: {%s: %s}\n", q(link.ReportMapping.From), q(link.ReportMapping.To))
	if users {
		// The notices, from NODES: a service import is one subscription
		// in CONTROL for every node, where a stream import would mirror
		// each node's own subscription into CONTROL.
		b.WriteString("    imports: [\n")
		for _, n := range link.Notices {
			fmt.Fprintf(&b, "      {service: {account: %s, subject: %s}}\n", link.AccountNodes, q(n.Subject))
		}
		b.WriteString("    ]\n")
	}
	fmt.Fprintf(&b, "  }\n  %s {\n", link.AccountNodes)
	if users {
		b.WriteString("    users: [\n")
		sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
		for _, n := range nodes {
			if n.NKey == "" {
				continue // revoked
			}
			pub, sub := link.NodePermissionsEither(n.Name) // its agent may be of either layout
			fmt.Fprintf(&b, "      {nkey: %s, permissions: {publish: {allow: %s}, subscribe: {allow: %s}}}\n", q(n.NKey), qs(pub), qs(sub))
		}
		now := time.Now()
		for _, t := range tokens {
			if !t.usable(now) {
				continue
			}
			pub, sub := link.EnrolPermissions(t.ID)
			fmt.Fprintf(&b, "      {nkey: %s, permissions: {publish: {allow: %s}, subscribe: {allow: %s}}}\n", q(t.Credential), qs(pub), qs(sub))
		}
		b.WriteString("    ]\n    exports: [\n")
		for _, n := range link.Notices {
			fmt.Fprintf(&b, "      {service: %s, accounts: [%s]}\n", q(n.Subject), link.AccountControl)
		}
		b.WriteString("    ]\n")
	}
	b.WriteString("    imports: [\n")
	if users {
		for _, si := range link.ServiceImports {
			if si.To != "" {
				fmt.Fprintf(&b, "      {service: {account: %s, subject: %s}, to: %s}\n", link.AccountControl, q(si.Subject), q(si.To))
			} else {
				fmt.Fprintf(&b, "      {service: {account: %s, subject: %s}}\n", link.AccountControl, q(si.Subject))
			}
		}
	}
	fmt.Fprintf(&b, "      {service: {account: %s, subject: %s}}\n    ]\n  }\n}\n", link.AccountControl, q(link.EnrolService))
	return b.String()
}

func splitListen(listen string) (string, int, error) {
	host, ps, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("listen %q: bad port", listen)
	}
	return host, port, nil
}

// Server is the embedded broker.
type Server struct {
	ns   *server.Server
	auth *registryAuth
	keys *Keys
	host string
	// lock is the key directory's, when the server took it (StartServer):
	// released once the store is closed.
	lock *statedir.DirLock
	// opts is the configuration the broker started with: its store is
	// opened again with it after a full disk (see store.go).
	opts *server.Options
	// kick has keepStoreWriting look at the store now: the broker's log
	// named a write that failed.
	kick chan struct{}
	// tooMany: the registry has more nodes than the broker holds
	// connections (brokerMaxConn), said once each time it comes to be.
	tooMany atomic.Bool
	mu      sync.Mutex
	// reopened is closed when the store is opened anew (see Reopened).
	// +checklocks:mu
	reopened chan struct{}
	// reopenedAt is when the store was last opened anew.
	// +checklocks:mu
	reopenedAt time.Time
	// cert is the certificate the broker presents (SwitchCertificate).
	cert *atomic.Pointer[tls.Certificate]
}

// SwitchCertificate has the broker present the key directory's
// certificate, as it is on disk now, from the next handshake on: linked
// clients stay linked.
func (s *Server) SwitchCertificate() error {
	c, err := tls.LoadX509KeyPair(s.keys.CertFile(), s.keys.KeyFile())
	if err != nil {
		return fmt.Errorf("the broker's certificate: %w", err)
	}
	s.cert.Store(&c)
	return nil
}

// StartServer starts the embedded broker on listen (host:port; port 0
// picks one). It lets in the control side; SetNodes lets in the nodes.
//
// The broker's JetStream store is in the key directory: StartServer takes
// the directory's lock first (FileLock), so a key directory another serve
// holds is refused (an *statedir.HeldError) before its store is opened, and
// holds it until Shutdown.
func StartServer(k *Keys, listen string, log *slog.Logger) (*Server, error) {
	lock, err := lockDir(k.Dir, "serve")
	if err != nil {
		return nil, err
	}
	s, err := startServer(k, listen, log)
	if err != nil {
		lock.Close()
		return nil, err
	}
	s.lock = lock
	return s, nil
}

// startServer is StartServer for a caller holding the key directory's
// lock.
func startServer(k *Keys, listen string, log *slog.Logger) (*Server, error) {
	host, port, err := splitListen(listen)
	if err != nil {
		return nil, err
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if log == nil {
		log = slog.Default()
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(BrokerConfig(k, host, port, nil, nil, false)); err != nil {
		return nil, fmt.Errorf("broker configuration: %w", err)
	}
	auth := &registryAuth{control: k.NKeyPublic, account: k.AccountPublic, nodes: map[string]string{}, tokens: map[string]tokenUser{}, known: make(chan struct{}), quit: make(chan struct{})}
	opts.CustomClientAuthentication = auth
	// The certificate is handed at each handshake from cert, so that a
	// rotation (cert rotate --switch) changes it without a reload — which
	// would rebuild the accounts this broker makes as nodes connect.
	cert := new(atomic.Pointer[tls.Certificate])
	if opts.TLSConfig != nil && len(opts.TLSConfig.Certificates) == 1 {
		c := opts.TLSConfig.Certificates[0]
		cert.Store(&c)
		opts.TLSConfig.Certificates = nil
		opts.TLSConfig.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }
	}
	if opts.JetStreamMaxStore, err = storeLimit(opts.StoreDir); err != nil {
		return nil, fmt.Errorf("the broker's store: %w", err)
	}
	opts.MaxConn = brokerMaxConn()
	opts.AlwaysEnableNonce = true // the NKey challenge
	// nats-server pings a client 2 s after its CONNECT, before it has
	// answered it: a connect held longer (registryWait: serve reading its
	// registry; or the broker busy making accounts for a fleet relinking)
	// then reads that PING where the client waits for its PONG, and
	// nats.go gives the connect up ("expected 'PONG', got 'PING'"), to do
	// it all again later. The first ping comes at the ping interval
	// instead; the client's own timeout (link.ConnectTimeout) bounds the
	// wait. Only the embedded broker holds connects, and only its options
	// (not a configuration file) have this setting.
	opts.DisableShortFirstPing = true
	opts.NoSigs = true
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	srv := &Server{ns: ns, auth: auth, keys: k, host: host, opts: opts, kick: make(chan struct{}, 1), reopened: make(chan struct{}), cert: cert}
	fatal := make(chan string, 1)
	ns.SetLoggerV2(&serverLog{l: log.With("part", "broker"), onError: srv.noteWriteError, fatal: fatal}, false, false, false)
	auth.ns = ns
	go ns.Start()
	ready := make(chan bool, 1)
	go func() { ready <- ns.ReadyForConnections(15 * time.Second) }()
	select {
	case ok := <-ready:
		if !ok {
			ns.Shutdown()
			return nil, fmt.Errorf("the embedded broker did not start on %s within 15 s", listen)
		}
	case line := <-fatal:
		// An address taken by another process, a port it may not bind:
		// said at once, with the broker's reason.
		ns.Shutdown()
		return nil, fmt.Errorf("the embedded broker did not start on %s: %s", listen, line)
	}
	return srv, nil
}

// SetNodes makes the registered nodes the broker's node users, at once: a
// new node can connect, and a node removed or given another NKey is
// disconnected.
func (s *Server) SetNodes(nodes []*NodeRecord) {
	m := make(map[string]string, len(nodes))
	for _, n := range nodes {
		if n.NKey != "" { // revoked
			m[n.NKey] = n.Name
		}
	}
	s.auth.mu.Lock()
	gone := map[string]string{} // NKey → the node it was
	for k, name := range s.auth.nodes {
		if m[k] != name {
			gone[k] = name
		}
	}
	s.auth.nodes = m
	s.auth.mu.Unlock()
	s.auth.set(true)
	if most := s.opts.MaxConn; most > 0 {
		if over := len(m) > most; over != s.tooMany.Swap(over) && over {
			s.ns.Warnf("%d nodes, and the broker holds %d connections at most (the open-file limit less a reserve for its store): nodes past that are refused until the limit is raised (LimitNOFILE)", len(m), most)
		}
	}
	for k, name := range gone {
		if k == "" {
			continue // an empty user filter would match every connection
		}
		cz, err := s.ns.Connz(&server.ConnzOptions{User: k, Account: link.NodeAccount(name)})
		if err != nil {
			continue
		}
		for _, c := range cz.Conns {
			s.ns.DisconnectClientByID(c.Cid)
		}
	}
}

// SetTokens makes the tokens that may still be used the broker's one-time
// users; a used or revoked token's credential is refused from now on.
func (s *Server) SetTokens(tokens []*TokenRecord) {
	m := make(map[string]tokenUser, len(tokens))
	now := time.Now()
	for _, t := range tokens {
		if t.usable(now) {
			m[t.Credential] = tokenUser{id: t.ID, until: t.Expires.Add(tokenGrace)}
		}
	}
	s.auth.mu.Lock()
	s.auth.tokens = m
	s.auth.mu.Unlock()
	s.auth.set(false)
}

// Knows reports whether the broker lets in node's NKey now.
func (s *Server) Knows(node, nkey string) bool {
	s.auth.mu.Lock()
	defer s.auth.mu.Unlock()
	return s.auth.nodes[nkey] == node
}

// ClientURL is the broker's address for clients (tls://host:port).
func (s *Server) ClientURL() string {
	addr := s.ns.Addr().(*net.TCPAddr)
	host := s.host
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "tls://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// NATS is the embedded server itself (tests read its monitoring state).
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the broker and waits for it; then the key directory is
// free for another serve.
func (s *Server) Shutdown() {
	s.auth.quitOnce.Do(func() { close(s.auth.quit) })
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.lock.Close()
}

// registryAuth authenticates clients by NKey against the registry: the
// signature over the server's nonce is checked as nats-server checks its
// own NKey users, then the client is placed in its account with its
// permissions. Nothing else gets in: no password, no token, no anonymous
// user.
type registryAuth struct {
	ns      *server.Server
	control string
	account string // the nodes' account key, which signs node JWTs
	mu      sync.Mutex
	nodes   map[string]string    // NKey public → node name
	tokens  map[string]tokenUser // one-time credential's NKey → token
	// accMu makes each node's account once, however many of its
	// connections arrive at once; made holds those made whole.
	accMu sync.Mutex
	made  map[string]*madeAccount
	// known is closed once the registry's nodes and tokens have been set
	// (SetNodes and SetTokens, the first time): until then a node is not
	// known to be refused (see Check).
	known               chan struct{}
	quit                chan struct{} // closed at Shutdown: nothing waits for known then
	quitOnce            sync.Once
	nodesSet            sync.Once
	setMu               sync.Mutex
	haveNodes, haveToks bool
}

// registryWait is how long a node's connection waits for serve to read
// the registry when it comes before (serve starting): longer than a
// client waits for its connect to be answered, so the client gives up and
// tries again as after any failed connect, rather than being told its
// credential is refused — which an agent takes for its revocation and
// waits for, longer each time (a fleet relinking after serve's restart
// took two minutes so).
const registryWait = 30 * time.Second

// set notes that the nodes (or the tokens) have been set once; known is
// closed when both have.
func (a *registryAuth) set(nodes bool) {
	a.setMu.Lock()
	defer a.setMu.Unlock()
	if nodes {
		a.haveNodes = true
	} else {
		a.haveToks = true
	}
	if a.haveNodes && a.haveToks {
		a.nodesSet.Do(func() { close(a.known) })
	}
}

type tokenUser struct {
	id    string
	until time.Time
}

// Check lets in, by the signature over the server's nonce: the control
// side's NKey; a node's NKey as the registry has it now, with its user
// JWT (issued by the nodes' account, for that NKey and node: a JWT that
// does not verify refuses the connection) or without (registered by hand);
// a token's one-time credential while the token may be used. Everyone is
// given the permissions the registry says, whatever a JWT claims; a node
// those of the layout its connection's name asks for (link.LayoutOf), and
// of that one only.
func (a *registryAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	o := c.GetOpts()
	nonce := c.GetNonce()
	if o == nil || len(nonce) == 0 {
		return false
	}
	// A node's user JWT comes as the connect token beside its NKey: a
	// broker outside operator mode drops the JWT field of a connect, and
	// an external broker configured with NKey users ignores the token.
	nkey, node := o.Nkey, ""
	if o.Token != "" {
		uc, err := jwt.DecodeUserClaims(o.Token)
		if err != nil || uc.Issuer != a.account || uc.Subject != nkey || uc.Name == "" {
			return false
		}
		node = uc.Name
	}
	if nkey == "" || !nkeys.IsValidPublicUserKey(nkey) {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(o.Sig)
	if err != nil {
		if sig, err = base64.StdEncoding.DecodeString(o.Sig); err != nil {
			return false
		}
	}
	pub, err := nkeys.FromPublicKey(nkey)
	if err != nil || pub.Verify(nonce, sig) != nil {
		return false
	}
	if nkey == a.control && o.Token == "" {
		acc, err := a.ns.LookupAccount(link.AccountControl)
		if err != nil {
			return false
		}
		c.RegisterUser(&server.User{Username: nkey, Account: acc})
		return true
	}
	select {
	case <-a.known:
	default:
		t := time.NewTimer(registryWait)
		select {
		case <-a.known:
		case <-a.quit:
		case <-t.C:
		}
		t.Stop()
	}
	a.mu.Lock()
	name, isNode := a.nodes[nkey]
	tok, isToken := a.tokens[nkey]
	a.mu.Unlock()
	var pubs, subs []string
	var acc *server.Account
	switch {
	case isNode && (node == "" || node == name):
		l := link.LayoutOf(o.Name)
		pubs, subs = link.NodePermissions(name, l)
		acc, err = a.nodeAccount(name, l)
	case isToken && o.Token == "" && time.Now().Before(tok.until):
		pubs, subs = link.EnrolPermissions(tok.id)
		acc, err = a.ns.LookupAccount(link.AccountNodes)
	default:
		return false
	}
	if err != nil {
		a.ns.Errorf("node %s refused: its account: %v", name, err)
		return false
	}
	c.RegisterUser(&server.User{Username: nkey, Account: acc, Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pubs},
		Subscribe: &server.SubjectPermission{Allow: subs},
	}})
	return true
}

// nodeAccount is node's own account (link.NodeAccount), made the first
// time the node connects to this broker, with the imports of layout l
// (link.NodeImportsOf), and given those of another layout the first time
// a connection of that layout comes: the embedded broker's configuration
// lists no node (AccountsConfig without users), so a node enrolled while
// it runs has an account at once, and an account holds only the imports
// its agents use (an agent of today never asks for the earlier layout's:
// half the imports, a third of what an account costs, docs/benchmarks.md).
// Imports come before the connection is let in, so before any of its
// subscriptions: a stream import added later shadows only the
// subscriptions made after it, and each layout subscribes to its own. An
// account stays once made (a revoked node's is left without users; the
// broker has no call to take an account away): it holds the node's
// imports, which reach only the node's own subjects, and no user.
func (a *registryAuth) nodeAccount(node string, l link.Layout) (*server.Account, error) {
	name := link.NodeAccount(node)
	a.accMu.Lock()
	defer a.accMu.Unlock()
	m := a.made[name]
	if m != nil && m.layouts[l] {
		return m.acc, nil
	}
	if m == nil {
		if _, err := a.ns.LookupAccount(name); err == nil {
			// Registered, and an import failed: never handed out half made.
			return nil, fmt.Errorf("account %s was made without all its imports", name)
		}
	} else if m.broken {
		return nil, fmt.Errorf("account %s was left without all its imports", name)
	}
	ctl, err := a.ns.LookupAccount(link.AccountControl)
	if err != nil {
		return nil, err
	}
	if m == nil {
		acc, err := a.ns.RegisterAccount(name)
		if err != nil {
			return nil, err
		}
		m = &madeAccount{acc: acc}
	}
	have := map[string]bool{}
	for ll, ok := range m.layouts {
		if ok {
			s, n := link.NodeImportsOf(node, link.Layout(ll))
			for _, si := range s {
				have["s "+si.To] = true
			}
			for _, subj := range n {
				have["n "+subj] = true
			}
		}
	}
	fail := func(err error) (*server.Account, error) {
		if a.made[name] != nil {
			// The layouts it has whole still let their connections
			// in; no other layout is added to it (its connections
			// refused) rather than let in half wired.
			m.broken = true
		}
		return nil, err
	}
	services, notices := link.NodeImportsOf(node, l)
	for _, si := range services {
		if have["s "+si.To] {
			continue
		}
		if err := m.acc.AddServiceImport(ctl, si.To, si.Subject); err != nil {
			return fail(fmt.Errorf("import %s as %s: %w", si.Subject, si.To, err))
		}
	}
	for _, subj := range notices {
		if have["n "+subj] {
			continue
		}
		if err := m.acc.AddMappedStreamImport(ctl, subj, subj); err != nil {
			return fail(fmt.Errorf("import the notices %s: %w", subj, err))
		}
	}
	m.layouts[l] = true
	if a.made == nil {
		a.made = map[string]*madeAccount{}
	}
	a.made[name] = m
	return m.acc, nil
}

// madeAccount is a node's account as nodeAccount made it: the layouts
// whose imports it has, whole; broken when adding a layout's failed part
// way.
type madeAccount struct {
	acc     *server.Account
	layouts [2]bool // by link.Layout
	broken  bool
}

// serverLog sends the broker's log to slog. Its notices (a banner at start)
// are debug; its warnings and errors stay what they are. Each error line
// also goes to onError, when set: the broker tells of a failed write only
// in its log (see store.go). Its first fatal line goes to fatal, when set:
// a broker that cannot listen says so only there, and goes on not
// starting (startServer).
type serverLog struct {
	l       *slog.Logger
	onError func(line string)
	fatal   chan string
}

func (s *serverLog) Noticef(f string, v ...any) { s.l.Debug(fmt.Sprintf(f, v...)) }
func (s *serverLog) Warnf(f string, v ...any)   { s.l.Warn(fmt.Sprintf(f, v...)) }
func (s *serverLog) Fatalf(f string, v ...any) {
	line := fmt.Sprintf(f, v...)
	s.error(line)
	if s.fatal != nil {
		select {
		case s.fatal <- line:
		default:
		}
	}
}
func (s *serverLog) Errorf(f string, v ...any) { s.error(fmt.Sprintf(f, v...)) }
func (s *serverLog) Debugf(f string, v ...any) { s.l.Debug(fmt.Sprintf(f, v...)) }
func (s *serverLog) Tracef(f string, v ...any) { s.l.Debug(fmt.Sprintf(f, v...)) }

func (s *serverLog) error(line string) {
	s.l.Error(line)
	if s.onError != nil {
		s.onError(line)
	}
}

// linking says how many of the nodes the broker lets in are linked to it
// now, of how many.
func (s *Server) linking() (linked, of int) {
	a := s.auth
	a.mu.Lock()
	names := make([]string, 0, len(a.nodes))
	for _, name := range a.nodes {
		names = append(names, link.NodeAccount(name))
	}
	a.mu.Unlock()
	a.accMu.Lock()
	defer a.accMu.Unlock()
	for _, name := range names {
		if m := a.made[name]; m != nil && m.acc.NumLocalConnections() > 0 {
			linked++
		}
	}
	return linked, len(names)
}

// Relinking is how often serve says, after it starts, how many nodes have
// linked again, and for how long at most.
const (
	relinkingEvery = 5 * time.Second
	relinkingFor   = 10 * time.Minute
)

// sayRelinking logs, while the fleet links again after serve's start (a
// restart: every node at once), how many nodes have linked of how many,
// every period (relinkingEvery), until all have or relinkingFor has
// passed — a storm of reconnections the operator can watch end, or see
// stop short.
func (s *Server) sayRelinking(ctx context.Context, log *slog.Logger, every time.Duration) {
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		linked, of := s.linking()
		took := time.Since(start).Round(time.Second)
		if linked >= of {
			if of > 0 {
				log.Info("every node has linked again", "nodes", of, "after", took.String())
			}
			return
		}
		if took >= relinkingFor {
			log.Warn("not every node has linked again", "linked", linked, "of", of, "after", took.String())
			return
		}
		log.Info("nodes linking again", "linked", linked, "of", of, "after", took.String())
	}
}

// brokerMaxConn is how many client connections the embedded broker holds
// at most: the process's open-file limit less a reserve for its store
// (fdReserve). nats-server's own default, 65,536, is past most limits: a
// fleet of 10,000 relinking at once after a restart held 20,000 files of
// a 20,000 limit, with connections the nodes had given up on not yet
// closed, and the store could not open its blocks ("too many open files"
// in a read of the registry). Refused at its accept, a connection over
// the limit costs a file for a moment, and its node tries again later. 0
// (nats-server's default) when the limit cannot be read or is none.
func brokerMaxConn() int {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil || r.Cur == unix.RLIM_INFINITY || r.Cur > 1<<30 {
		return 0
	}
	return max(1, int(r.Cur)-fdReserve(int(r.Cur)))
}

// fdReserve is the files kept for the broker's store, its listeners and
// the control side's own connections out of a limit of n: a twentieth, at
// least 256 — the store holds a few files open for each stream and opens
// a message block for a read.
func fdReserve(n int) int { return max(256, n/20) }
