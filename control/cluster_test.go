package control

import (
	"strings"
	"testing"
)

func TestParseCluster(t *testing.T) {
	s, err := ParseCluster("10.0.0.1:4222, 10.0.0.2:4222,10.0.0.3:4222", "10.0.0.1:6222,10.0.0.2:6222,10.0.0.3:6222")
	if err != nil || len(s) != 3 || s[1] != (ClusterServer{Name: "mesh-broker-2", Client: "10.0.0.2:4222", Route: "10.0.0.2:6222"}) {
		t.Fatalf("%+v %v", s, err)
	}
	if got := ClientURLs(s); got != "tls://10.0.0.1:4222,tls://10.0.0.2:4222,tls://10.0.0.3:4222" {
		t.Fatalf("ClientURLs = %s", got)
	}
	for _, c := range []struct{ clients, routes, want string }{
		{"a:1", "a:2", "two or more"},
		{"a:1,b:1", "a:2,b:2,c:2", "one of each per server"},
		{"a:1,a:1", "a:2,b:2", "named twice"},
		{"a:1,b:1", "a:2,a:1", "named twice"},
		{"a:1,b", "a:2,b:2", "listen"},
	} {
		if _, err := ParseCluster(c.clients, c.routes); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s / %s: %v, want an error saying %q", c.clients, c.routes, err, c.want)
		}
	}
}

// Each server's configuration routes to the others, never to itself, with
// the shared secret, TLS on the routes with the routes' certificate as the
// one authority, and includes the accounts every server has alike.
func TestClusterConfig(t *testing.T) {
	k := &Keys{Dir: "/etc/mesh"}
	s, _ := ParseCluster("10.0.0.1:4222,10.0.0.2:4222,10.0.0.3:4222", "10.0.0.1:6222,10.0.0.2:6222,10.0.0.3:6222")
	conf, err := ClusterConfig(k, s, 1, "/etc/nats/mesh", "/var/lib/nats", "sekrit")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`server_name: "mesh-broker-2"`, `host: "10.0.0.2"`, "port: 4222", `store_dir: "/var/lib/nats/mesh-broker-2"`,
		`name: "mesh"`, "port: 6222", `password: "sekrit"`, `ca_file: "/etc/nats/mesh/routes-ca.crt"`,
		`"nats-route://mesh-route:sekrit@10.0.0.1:6222", "nats-route://mesh-route:sekrit@10.0.0.3:6222"`, `include "accounts.conf"`} {
		if !strings.Contains(conf, want) {
			t.Errorf("the configuration lacks %s:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "@10.0.0.2:6222") {
		t.Errorf("a server routes to itself:\n%s", conf)
	}
}
