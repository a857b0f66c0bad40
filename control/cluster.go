package control

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A NATS cluster for the control side, past what one server carries: every
// server has the same accounts (AccountsConfig, one file they all include,
// which serve --broker-accounts keeps equal to the registry), its own name,
// client address and JetStream store, and routes to the others. The
// control side's few streams and its registry are kept at 3 replicas there
// (serve --replicas 3); nothing is kept per node (no consumer, no stream),
// so the cluster's replicated assets do not grow with the fleet.

// ClusterName is the NATS cluster's name in every server's configuration.
const ClusterName = "mesh"

// routeUser is the user servers present to one another on their routes.
const routeUser = "mesh-route"

// AccountsFile is the accounts part every cluster server includes.
const AccountsFile = "accounts.conf"

// The routes' certificate and key, beside the servers' configurations.
const (
	RouteCertFile = "routes.crt"
	RouteKeyFile  = "routes.key"
)

// RouteCertificate makes the routes' certificate for servers (their route
// addresses' hosts).
func RouteCertificate(servers []ClusterServer) (certPEM, keyPEM []byte, err error) {
	var hosts []string
	for _, s := range servers {
		h, _, _ := splitListen(s.Route)
		hosts = append(hosts, h)
	}
	return routeCertificate(hosts)
}

// ClusterServer is one server of the cluster: its name, the address clients
// (the nodes, mesh-control) connect to and the one its routes listen on.
type ClusterServer struct {
	Name, Client, Route string
}

// ParseCluster pairs the client addresses with the route addresses, one per
// server, in order: "h1:4222,h2:4222,h3:4222" and "h1:6222,h2:6222,h3:6222".
func ParseCluster(clients, routes string) ([]ClusterServer, error) {
	cs, rs := splitList(clients), splitList(routes)
	if len(rs) < 2 {
		return nil, fmt.Errorf("--cluster %q: a cluster is two or more servers' route addresses (HOST:PORT,HOST:PORT,...); three is what survives one lost", routes)
	}
	if len(cs) != len(rs) {
		return nil, fmt.Errorf("--listen names %d client address(es) and --cluster %d route address(es): one of each per server, in the same order", len(cs), len(rs))
	}
	seen := map[string]bool{}
	var out []ClusterServer
	for i := range rs {
		for _, a := range []string{cs[i], rs[i]} {
			if _, _, err := splitListen(a); err != nil {
				return nil, err
			}
			if seen[a] {
				return nil, fmt.Errorf("%s is named twice: every server listens on its own addresses", a)
			}
			seen[a] = true
		}
		out = append(out, ClusterServer{Name: fmt.Sprintf("mesh-broker-%d", i+1), Client: cs[i], Route: rs[i]})
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// RouteSecret is a fresh password for the servers' routes.
func RouteSecret() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ClusterConfig is server i's configuration: its own part (serverConfig:
// name, client address, TLS, a JetStream store of its own under
// storeBase), the cluster block — its route address, the route user and
// secret the others present, TLS on the routes with the routes'
// certificate (RouteCertFile in dir), which is also, in RouteCAFile, the
// one authority a route's peer is checked against (every server has the
// same; a route to anything else fails; while a rotation of it is under
// way, RotateRoutes, the next one too) — and the shared accounts,
// included from AccountsFile beside it.
func ClusterConfig(k *Keys, servers []ClusterServer, i int, dir, storeBase, secret string) (string, error) {
	s := servers[i]
	host, port, _ := splitListen(s.Client)
	rhost, rport, _ := splitListen(s.Route)
	var b strings.Builder
	b.WriteString(serverConfig(k, s.Name, host, port, filepath.Join(storeBase, s.Name)))
	fmt.Fprintf(&b, "cluster {\n  name: %s\n  host: %s\n  port: %d\n", q(ClusterName), q(rhost), rport)
	fmt.Fprintf(&b, "  authorization {\n    user: %s\n    password: %s\n    timeout: 5\n  }\n", q(routeUser), q(secret))
	rc, rk, ca := filepath.Join(dir, RouteCertFile), filepath.Join(dir, RouteKeyFile), filepath.Join(dir, RouteCAFile)
	fmt.Fprintf(&b, "  tls {\n    cert_file: %s\n    key_file: %s\n    ca_file: %s\n    timeout: 5\n  }\n", q(rc), q(rk), q(ca))
	var routes []string
	for j, o := range servers {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats-route://%s:%s@%s", routeUser, secret, o.Route))
		}
	}
	fmt.Fprintf(&b, "  routes: %s\n}\n", qs(routes))
	if k.Operator != nil {
		// Operator mode: the accounts are the resolver's, which the
		// servers pass among themselves.
		rc, err := k.ResolverConfig(filepath.Join(storeBase, s.Name))
		if err != nil {
			return "", err
		}
		b.WriteString(rc)
		return b.String(), nil
	}
	fmt.Fprintf(&b, "include %s\n", q(AccountsFile))
	return b.String(), nil
}

// ClientURLs is the cluster's client addresses as one NATS URL list (what
// serve --nats and the nodes' broker URL take).
func ClientURLs(servers []ClusterServer) string {
	var out []string
	for _, s := range servers {
		out = append(out, "tls://"+s.Client)
	}
	return strings.Join(out, ",")
}

// keptRoutes is what a cluster's directory already holds of its routes,
// for broker-config run over it again (to name an announced operator key,
// to list the registry's users anew): the servers are restarted onto the
// new configurations one at a time, and each restarted one must still
// route to those not restarted yet, so the secret they present one another
// and the certificate they accept stay as they are. secret is the one the
// directory's configurations name ("" for none). keep says the routes'
// certificate, key and accepted list stay (the list may hold a rotation's
// next certificate too): they read and the certificate names every
// route's host. why says, when they are there and not kept, why not.
func keptRoutes(dir string, servers []ClusterServer) (secret string, keep bool, why string) {
	for _, s := range servers {
		if b, err := os.ReadFile(filepath.Join(dir, s.Name+".conf")); err == nil {
			if secret = routeSecretOf(b); secret != "" {
				break
			}
		}
	}
	certFile, keyFile := filepath.Join(dir, RouteCertFile), filepath.Join(dir, RouteKeyFile)
	if _, err := os.Stat(certFile); errors.Is(err, fs.ErrNotExist) {
		return secret, false, ""
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return secret, false, fmt.Sprintf("the routes' certificate and key in %s do not read: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, RouteCAFile)); err != nil {
		return secret, false, fmt.Sprintf("%s: %v", RouteCAFile, err)
	}
	cert := pair.Leaf
	if cert == nil {
		if cert, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return secret, false, fmt.Sprintf("the routes' certificate in %s: %v", dir, err)
		}
	}
	for _, s := range servers {
		h, _, _ := splitListen(s.Route)
		if err := cert.VerifyHostname(h); err != nil {
			return secret, false, fmt.Sprintf("the routes' certificate in %s does not name %s", dir, h)
		}
	}
	return secret, true, ""
}
