package control

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// RouteCAFile is the route certificates each server of a cluster accepts
// from its peers (its routes' ca_file): the routes' certificate alone, and,
// while a rotation of it is under way, the next one beside it.
const RouteCAFile = "routes-ca.crt"

// The next routes' certificate and key, announced and not switched to.
const (
	routeNextCert = RouteCertFile + ".next"
	routeNextKey  = RouteKeyFile + ".next"
)

// routeLockRecord is where the command holding a cluster directory's lock
// (a rotation of its routes' certificate, broker-config --cluster writing
// it) says its pid.
const routeLockRecord = ".routes-rotate.pid"

// routeProbeWait is how long a switch waits for every server to present
// the new certificate on its route port (they reload on SIGHUP within a
// second; one on another machine, reloaded by hand, is waited for by
// running the switch again).
const routeProbeWait = 15 * time.Second

// RouteServer is one server of a cluster as its configuration (in the
// directory broker-config --cluster wrote) names it, and the fingerprint
// of the route certificate it presents now ("" when it did not answer).
type RouteServer struct {
	Name     string `json:"name"`
	Route    string `json:"route"`
	Presents string `json:"presents,omitempty"`
}

// RouteResult is what a step of the routes' rotation did.
type RouteResult struct {
	// Phase: "announced" (the servers accept the next certificate beside
	// the current one), "switched" (they present the new one and accept
	// it alone), or "switching" (they were told to present the new one,
	// and not all of them do yet: Waiting names them).
	Phase   string        `json:"phase"`
	Current string        `json:"current"`
	Next    string        `json:"next,omitempty"`
	Servers []RouteServer `json:"servers"`
	Waiting []string      `json:"waiting,omitempty"`
	// Reload is what the operator must still do (servers the command
	// could not signal: no --broker-pid, or on other machines).
	Reload string `json:"reload,omitempty"`
}

// RotateRoutes carries out a step of the rotation of a cluster's route
// certificate, in dir (what broker-config --cluster wrote, which every
// server's configuration names), each server told to reload by SIGHUP
// through pids (nats-server reloads a route's TLS for the route
// connections made after it; those already up stay up):
//
//   - announce: a new certificate for the same addresses beside the
//     current one (routes.crt.next), and both in RouteCAFile, which every
//     server's routes then accept (a configuration of a release before
//     RouteCAFile, whose ca_file is routes.crt itself, is pointed at it);
//   - switch: the new certificate and key take the current ones' place,
//     the servers reload and present it; once every server does on its
//     route port, RouteCAFile holds it alone and they reload again. A
//     server that does not present it yet (on another machine, not
//     reloaded) is named, and the old certificate stays accepted: the
//     switch run again, once it does, finishes.
func RotateRoutes(dir string, switchCert bool, pids []string) (*RouteResult, error) {
	servers, confs, err := clusterServers(dir)
	if err != nil {
		return nil, err
	}
	// One rotation at a time: two announcing at once would each write a
	// next key and certificate, the pair left behind not one.
	l, err := statedir.LockDir(dir, routeLockRecord)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if err := l.Record("mesh-control cert rotate --routes"); err != nil {
		return nil, err
	}
	cur := filepath.Join(dir, RouteCertFile)
	res := &RouteResult{Servers: servers}
	if !switchCert {
		if _, err := os.Stat(filepath.Join(dir, routeNextCert)); errors.Is(err, os.ErrNotExist) {
			hosts, err := certHosts(cur)
			if err != nil {
				return nil, err
			}
			c, k, err := routeCertificate(hosts)
			if err != nil {
				return nil, err
			}
			// The key first: a certificate announced is never without it.
			if err := statedir.WriteBytes(filepath.Join(dir, routeNextKey), k, 0o600); err != nil {
				return nil, err
			}
			if err := statedir.WriteBytes(filepath.Join(dir, routeNextCert), c, 0o600); err != nil {
				return nil, err
			}
		}
		if err := writeRouteCA(dir, RouteCertFile, routeNextCert); err != nil {
			return nil, err
		}
		if err := pointAtRouteCA(dir, confs); err != nil {
			return nil, err
		}
		res.Phase = "announced"
		if res.Current, err = certFingerprint(cur); err == nil {
			res.Next, err = certFingerprint(filepath.Join(dir, routeNextCert))
		}
		if err != nil {
			return nil, err
		}
		res.Reload = reloadServers(pids, len(servers), dir)
		return res, nil
	}
	if _, err := os.Stat(filepath.Join(dir, routeNextCert)); err == nil {
		// Both accepted while the servers move over: the CA file as the
		// announcement left it (written again, in case it was not).
		if err := writeRouteCA(dir, RouteCertFile, routeNextCert); err != nil {
			return nil, err
		}
		// The key first, as the broker's: a switch cut off between the
		// two is finished here, the certificate following its key.
		if _, err := os.Stat(filepath.Join(dir, routeNextKey)); err == nil {
			if err := os.Rename(filepath.Join(dir, routeNextKey), filepath.Join(dir, RouteKeyFile)); err != nil {
				return nil, err
			}
		}
		if err := os.Rename(filepath.Join(dir, routeNextCert), cur); err != nil {
			return nil, err
		}
		if err := statedir.SyncDir(dir); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Told again when the switch is run again: a server that missed the
	// signal (or was down) takes it now.
	res.Reload = reloadServers(pids, len(servers), dir)
	if res.Current, err = certFingerprint(cur); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(routeProbeWait)
	for {
		res.Waiting = nil
		for i := range res.Servers {
			s := &res.Servers[i]
			s.Presents = probeRoute(s.Route)
			if s.Presents != res.Current {
				res.Waiting = append(res.Waiting, s.Name)
			}
		}
		if len(res.Waiting) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(res.Waiting) > 0 {
		res.Phase = "switching"
		return res, fmt.Errorf("not every server presents the new route certificate %s yet: %s — reload them (each with %s, %s and %s from %s), then run the switch again; until then the old certificate stays accepted",
			res.Current, strings.Join(res.Waiting, ", "), RouteCertFile, RouteKeyFile, RouteCAFile, dir)
	}
	if err := writeRouteCA(dir, RouteCertFile); err != nil {
		return nil, err
	}
	res.Phase = "switched"
	if r := reloadServers(pids, len(servers), dir); r != "" {
		res.Reload = r
	}
	return res, nil
}

// writeRouteCA writes RouteCAFile in dir: the certificates of files, one
// after the other.
func writeRouteCA(dir string, files ...string) error {
	var b bytes.Buffer
	for _, f := range files {
		c, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		b.Write(bytes.TrimSpace(c))
		b.WriteByte('\n')
	}
	return statedir.WriteBytes(filepath.Join(dir, RouteCAFile), b.Bytes(), 0o600)
}

// caFileLine is a routes' ca_file line of a configuration.
var caFileLine = regexp.MustCompile(`(?m)^(\s*ca_file:\s*)"[^"\n]*` + regexp.QuoteMeta(RouteCertFile) + `"\s*$`)

// pointAtRouteCA points each configuration whose routes' ca_file is the
// routes' certificate itself (broker-config before RouteCAFile) at
// RouteCAFile.
func pointAtRouteCA(dir string, confs []string) error {
	ca := filepath.Join(dir, RouteCAFile)
	if abs, err := filepath.Abs(ca); err == nil {
		ca = abs
	}
	for _, p := range confs {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		nb := caFileLine.ReplaceAll(b, []byte("${1}"+q(ca)))
		if !bytes.Equal(nb, b) {
			if err := statedir.WriteBytes(p, nb, 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// reloadServers sends SIGHUP to each pid file's server; it returns what is
// left for the operator to do ("" when every server was signalled).
func reloadServers(pids []string, servers int, dir string) string {
	var failed []string
	for _, p := range pids {
		if err := signalReload(p); err != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", p, err))
		}
	}
	switch {
	case len(failed) > 0:
		return "reload these servers (SIGHUP): " + strings.Join(failed, "; ")
	case len(pids) < servers:
		return fmt.Sprintf("copy %s, %s and %s from %s to each server that does not read them there, and reload each (SIGHUP)", RouteCertFile, RouteKeyFile, RouteCAFile, dir)
	}
	return ""
}

// clusterServers reads the servers of the cluster whose configurations
// are in dir (broker-config --cluster's mesh-broker-N.conf): each one's
// name and route address, and the configurations' paths.
func clusterServers(dir string) ([]RouteServer, []string, error) {
	confs, err := filepath.Glob(filepath.Join(dir, "*.conf"))
	if err != nil {
		return nil, nil, err
	}
	var servers []RouteServer
	var paths []string
	for _, p := range confs {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		s, ok := routeOf(b)
		if !ok {
			continue
		}
		servers = append(servers, s)
		paths = append(paths, p)
	}
	if len(servers) == 0 {
		return nil, nil, fmt.Errorf("%s holds no cluster server's configuration (the directory mesh-control broker-config --cluster wrote)", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, RouteCertFile)); err != nil {
		return nil, nil, fmt.Errorf("%s holds no routes' certificate: %w", dir, err)
	}
	return servers, paths, nil
}

// routeOf reads a server's name and its cluster block's host and port.
func routeOf(conf []byte) (RouteServer, bool) {
	var s RouteServer
	var host string
	port, inCluster := 0, false
	scanConf(conf, func(cluster bool, k, v string) {
		inCluster = inCluster || cluster
		switch {
		case !cluster && k == "server_name":
			s.Name = v
		case cluster && k == "host":
			host = v
		case cluster && k == "port":
			port, _ = strconv.Atoi(v)
		}
	})
	if !inCluster || host == "" || port == 0 {
		return s, false
	}
	s.Route = net.JoinHostPort(host, strconv.Itoa(port))
	return s, true
}

// routeSecretOf is the route password a server's configuration names in
// its cluster block, "" for none.
func routeSecretOf(conf []byte) string {
	var secret string
	scanConf(conf, func(cluster bool, k, v string) {
		if cluster && k == "password" && secret == "" {
			secret = v
		}
	})
	return secret
}

// scanConf calls f with each "key: value" line of a server's
// configuration as ClusterConfig writes it (a key a line, quoted values
// unquoted), and whether it comes after the cluster block opens.
func scanConf(conf []byte, f func(cluster bool, key, value string)) {
	inCluster := false
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "cluster {" {
			inCluster = true
			continue
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		} else {
			v = strings.Trim(v, `"`)
		}
		f(inCluster, k, v)
	}
}

// errSeen ends a probe's handshake once the certificate is seen.
var errSeen = errors.New("the route's certificate seen")

// probeRoute is the fingerprint of the certificate the server at addr
// presents on its route port ("" when it does not answer): a TLS
// handshake, which a route with TLS begins with (its INFO comes after), as
// a peer's route makes it. Nothing is trusted or sent: the handshake ends
// once the server's certificate is seen.
func probeRoute(addr string) string {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	var seen string
	tc := tls.Client(conn, &tls.Config{
		InsecureSkipVerify: true, // only looked at: the fingerprint is what is compared
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) > 0 {
				seen = link.Fingerprint(raw[0])
			}
			return errSeen
		},
	})
	tc.Handshake()
	return seen
}
