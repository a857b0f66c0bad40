package control_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// broker-config --cluster written again over a cluster's directory (as an
// operator key's announcement asks) keeps the routes' secret and
// certificate, so a server restarted onto the new configuration still
// routes to those not restarted yet; written for a host its certificate
// does not name, it makes a new one and says why, and what that asks of
// the servers. One writes the directory at a time: while another holds it,
// broker-config is refused and writes nothing.
func TestBrokerConfigAgainKeepsTheRoutes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := t.TempDir()
	dir, out := filepath.Join(base, "keys"), filepath.Join(base, "cluster")
	if _, errs, code := run(t, ctx, "init", "--dir", dir, "--url", "tls://127.0.0.1:14222"); code != 0 {
		t.Fatalf("init: %s", errs)
	}
	configure := func(routes string) string {
		t.Helper()
		_, errs, code := run(t, ctx, "broker-config", "--dir", dir, "--resolver", "--out", out,
			"--cluster", routes, "--listen", "127.0.0.1:14222,127.0.0.1:14223,127.0.0.1:14224")
		if code != 0 {
			t.Fatalf("broker-config --cluster %s: %s", routes, errs)
		}
		return errs
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	password := regexp.MustCompile(`password: "([0-9a-f]+)"`)
	secrets := func() []string {
		var s []string
		for _, n := range []string{"mesh-broker-1.conf", "mesh-broker-2.conf", "mesh-broker-3.conf"} {
			m := password.FindSubmatch(read(n))
			if m == nil {
				t.Fatalf("%s names no route password", n)
			}
			s = append(s, string(m[1]))
		}
		return s
	}

	const routes = "127.0.0.1:16222,127.0.0.1:16223,127.0.0.1:16224"
	configure(routes)
	cert, ca, secret := read(control.RouteCertFile), read(control.RouteCAFile), secrets()
	if secret[0] != secret[1] || secret[1] != secret[2] {
		t.Fatalf("the servers name different route passwords: %v", secret)
	}
	if errs := configure(routes); errs != "" && strings.Contains(errs, "a new one is made") {
		t.Fatalf("written again: %s", errs)
	}
	if !bytes.Equal(read(control.RouteCertFile), cert) || !bytes.Equal(read(control.RouteCAFile), ca) {
		t.Fatal("written again, the routes' certificate changed")
	}
	if got := secrets(); got[0] != secret[0] || got[2] != secret[0] {
		t.Fatalf("written again, the route password changed: %v, was %v", got, secret)
	}

	// Another writer of the directory (a rotation of the routes, a second
	// broker-config) holds it: refused, nothing written.
	l, err := statedir.LockDir(out, "holder.pid")
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := run(t, ctx, "broker-config", "--dir", dir, "--resolver", "--out", out,
		"--cluster", "127.0.0.1:16222,127.0.0.1:16223,127.0.0.2:16224", "--listen", "127.0.0.1:14222,127.0.0.1:14223,127.0.0.1:14224"); code == 0 || !strings.Contains(errs, "holds "+out) {
		t.Fatalf("broker-config with the directory held: exit %d: %s", code, errs)
	}
	l.Close()
	if !bytes.Equal(read(control.RouteCertFile), cert) || strings.Contains(string(read("mesh-broker-1.conf")), "127.0.0.2") {
		t.Fatal("broker-config refused, and the directory changed")
	}

	// A route on a host the certificate does not name: a new one, said so.
	errs := configure("127.0.0.1:16222,127.0.0.1:16223,127.0.0.2:16224")
	if bytes.Equal(read(control.RouteCertFile), cert) || !strings.Contains(string(read("mesh-broker-1.conf")), "127.0.0.2") {
		t.Fatal("a host the routes' certificate does not name: the certificate kept, or the route not written")
	}
	if !strings.Contains(errs, "does not name 127.0.0.2") || !strings.Contains(errs, "restart every server at once") {
		t.Fatalf("the new certificate not said: %q", errs)
	}
	if got := secrets(); got[0] != secret[0] {
		t.Fatalf("the route password changed with the certificate: %v", got)
	}
}
