package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// routePeers is how many other servers the server whose monitoring port is
// mon has a route to (nats-server's /routez).
func routePeers(mon int) int {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/routez", mon))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var rz struct {
		Routes []struct {
			RemoteID string `json:"remote_id"`
		} `json:"routes"`
	}
	if json.NewDecoder(resp.Body).Decode(&rz) != nil {
		return -1
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteID] = true
	}
	return len(peers)
}

// A three-server cluster (real nats-server processes) rotates its route
// certificate without coming apart: announced (every server accepts the
// old and the new), then switched (each presents the new one, and once
// all do, accepts it alone). Its configuration is of the release before
// the routes' CA file (ca_file is routes.crt itself), which the
// announcement points at it. A switch whose servers were not reloaded
// waits, names them, and keeps the old certificate accepted; run again
// with their pids it finishes. A server started again afterwards joins
// with the new certificate alone.
func TestTheClusterRouteCertificateRotates(t *testing.T) {
	m := newMeshDirs(t)
	natsServer := buildNATSServer(t, m.base)
	clients, routes := clusterAddrs(t)
	dir := filepath.Join(m.base, "cluster")
	m.run("mesh-control", "broker-config", "--dir", m.ctl, "--cluster", strings.Join(routes, ","), "--listen", strings.Join(clients, ","), "--out", dir)
	// As the release before wrote it: the routes' certificate is its own CA.
	caLine := regexp.MustCompile(`ca_file: "[^"]*routes-ca\.crt"`)
	confs, _ := filepath.Glob(filepath.Join(dir, "mesh-broker-*.conf"))
	for _, c := range confs {
		b, _ := os.ReadFile(c)
		os.WriteFile(c, caLine.ReplaceAll(b, []byte(`ca_file: "`+filepath.Join(dir, control.RouteCertFile)+`"`)), 0o600)
	}
	os.Remove(filepath.Join(dir, control.RouteCAFile))

	var pids []string
	mons := make([]int, 3)
	servers := make([]*exec.Cmd, 3)
	runs := 0
	start := func(i int) {
		name := fmt.Sprintf("mesh-broker-%d", i+1)
		runs++
		servers[i] = startLogged(m, fmt.Sprintf("%s-run%d", name, runs), natsServer, nil,
			"-c", filepath.Join(dir, name+".conf"), "-P", pids[i], "-m", fmt.Sprint(mons[i]))
	}
	stop := func(i int) {
		servers[i].Process.Signal(syscall.SIGTERM)
		servers[i].Wait()
	}
	for i := range 3 {
		pids = append(pids, filepath.Join(dir, fmt.Sprintf("mesh-broker-%d.pid", i+1)))
		mons[i] = freePort(t)
		start(i)
	}
	formed := func(what string) {
		t.Helper()
		eventually(t, what, func() bool {
			for _, mon := range mons {
				if routePeers(mon) != 2 {
					return false
				}
			}
			return true
		})
	}
	formed("the cluster formed")
	old, _ := os.ReadFile(filepath.Join(dir, control.RouteCertFile))

	out := m.run("mesh-control", "cert", "rotate", "--routes", dir, "--broker-pid", strings.Join(pids, ","))
	if !strings.Contains(out, "route certificate") || !strings.Contains(out, "announced beside") {
		t.Fatalf("announce:\n%s", out)
	}
	if ca, _ := os.ReadFile(filepath.Join(dir, control.RouteCAFile)); bytes.Count(ca, []byte("BEGIN CERTIFICATE")) != 2 || !bytes.Contains(ca, bytes.TrimSpace(old)) {
		t.Fatalf("the CA file after the announcement:\n%s", ca)
	}
	for _, c := range confs {
		if b, _ := os.ReadFile(c); !caLine.Match(b) {
			t.Fatalf("%s is not pointed at the CA file:\n%s", c, b)
		}
	}
	formed("the cluster whole after the announcement")

	// A switch without the pids: the servers present the old certificate
	// still; it says so, and the old stays accepted.
	code, out, errOut := m.runCode("mesh-control", "", "cert", "rotate", "--routes", dir, "--switch")
	if code == 0 || !strings.Contains(errOut, "not every server presents the new route certificate") || !strings.Contains(errOut, "mesh-broker-1") {
		t.Fatalf("a switch with no server reloaded: exit %d\n%s%s", code, out, errOut)
	}
	if ca, _ := os.ReadFile(filepath.Join(dir, control.RouteCAFile)); bytes.Count(ca, []byte("BEGIN CERTIFICATE")) != 2 {
		t.Fatal("the old route certificate stopped being accepted before every server presents the new one")
	}
	formed("the cluster whole after a switch cut short")
	out = m.run("mesh-control", "cert", "rotate", "--routes", dir, "--switch", "--broker-pid", strings.Join(pids, ","))
	if !strings.Contains(out, "every server presents route certificate") {
		t.Fatalf("switch:\n%s", out)
	}
	now, _ := os.ReadFile(filepath.Join(dir, control.RouteCertFile))
	if ca, _ := os.ReadFile(filepath.Join(dir, control.RouteCAFile)); bytes.Equal(now, old) || bytes.Count(ca, []byte("BEGIN CERTIFICATE")) != 1 || !bytes.Equal(bytes.TrimSpace(ca), bytes.TrimSpace(now)) {
		t.Fatalf("after the switch: the CA file holds\n%s", ca)
	}
	formed("the cluster whole after the switch")
	// New routes are made with the new certificate alone.
	stop(2)
	start(2)
	formed("a server started again joins with the new certificate")
}
