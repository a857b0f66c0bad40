package e2e

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The operator's key rotates, the server restarted after each step as a
// server takes its operators only when it starts: a switch before any
// announcement is refused; a new key announced and written into the
// configuration beside the old; the switch refused while the server,
// not yet restarted, does not trust it, naming the server; restarted,
// the switch goes through, and every account is pushed again signed by
// the new key; restarted once more on a configuration naming the new key
// alone, the node links and is declared to, a command signs in, and every
// account the resolver holds is the new key's.
func TestTheOperatorKeyRotates(t *testing.T) {
	m, _, store := operatorMesh(t)
	listen := fmt.Sprintf("127.0.0.1:%d", m.port)
	conf := filepath.Join(m.base, "broker.conf")
	var server *exec.Cmd
	for _, p := range m.procs {
		if filepath.Base(p.Path) == "nats-server" {
			server = p
		}
	}
	if server == nil {
		t.Fatal("no nats-server among the mesh's processes")
	}
	restart := func() {
		t.Helper()
		os.WriteFile(conf, []byte(m.run("mesh-control", "broker-config", "--dir", m.ctl, "--listen", listen, "--resolver", "--store", store)), 0o600)
		server.Process.Signal(syscall.SIGTERM)
		server.Wait()
		server = m.start("nats-server", nil, "-c", conf)
	}
	declared := func(what string) {
		t.Helper()
		seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"` + what + `\n"}]}`)
		if r := m.reportFor(seq); r.Outcome != shapes.Applied {
			t.Fatalf("a declaration %s: %+v", what, r)
		}
	}

	if code, _, stderr := m.runCode("mesh-control", "", "operator-key", "rotate", "--switch", "--dir", m.ctl); code == 0 || !strings.Contains(stderr, "operator-key rotate first") {
		t.Fatalf("a switch with nothing announced: exit %d: %s", code, stderr)
	}
	k, err := control.LoadKeys(m.ctl)
	if err != nil {
		t.Fatal(err)
	}
	old := k.Operator.OperatorPublic()
	var res control.OperatorKeyResult
	if out := m.run("mesh-control", "operator-key", "rotate", "--dir", m.ctl, "--json"); json.Unmarshal([]byte(out), &res) != nil || res.Phase != "announced" || res.Next == "" || res.Current != old {
		t.Fatalf("operator-key rotate:\n%s", out)
	}
	code, _, stderr := m.runCode("mesh-control", "", "operator-key", "rotate", "--switch", "--dir", m.ctl)
	if code == 0 || !strings.Contains(stderr, "1 server(s) do not trust the new operator key yet: mesh-control") {
		t.Fatalf("a switch before the server trusts the new key: exit %d: %s", code, stderr)
	}
	if cur, _ := control.LoadKeys(m.ctl); cur.Operator.OperatorPublic() != old {
		t.Fatal("a refused switch changed the operator's key")
	}

	// The configuration names both; the server restarted onto it.
	restart()
	if b, _ := os.ReadFile(conf); strings.Count(operators(string(b)), ",") != 1 {
		t.Fatalf("the configuration after the announcement does not name both operators:\n%s", b)
	}
	declared("with both operator keys trusted")
	out := m.run("mesh-control", "operator-key", "rotate", "--switch", "--dir", m.ctl)
	if !strings.Contains(out, "the operator's key is "+res.Next+" now") {
		t.Fatalf("the switch:\n%s", out)
	}
	// A token issued now has its account pushed under the new key.
	m.issue("--new", "--name", "n2")

	// The configuration names the new key alone; restarted onto it.
	restart()
	if b, _ := os.ReadFile(conf); strings.Count(operators(string(b)), ",") != 0 {
		t.Fatalf("the configuration after the switch names more than one operator:\n%s", b)
	}
	declared("after the operator's key was switched")
	m.run("mesh-control", "nodes", "--dir", m.ctl)
	accounts := 0
	filepath.WalkDir(filepath.Join(store, "accounts"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, ".jwt") {
			return err
		}
		b, _ := os.ReadFile(p)
		c, err := jwt.DecodeGeneric(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if c.Issuer != res.Next {
			t.Errorf("account %s (%s) is signed by %s, not the operator key switched to", c.Subject, c.Name, c.Issuer)
		}
		accounts++
		return nil
	})
	// The system account, CONTROL, n1's and the token's.
	if accounts < 4 {
		t.Fatalf("the resolver holds %d accounts", accounts)
	}
}

// operators is the list of operator JWTs a server's configuration names.
func operators(conf string) string {
	_, after, ok := strings.Cut(conf, "operator: [")
	if !ok {
		return ""
	}
	list, _, _ := strings.Cut(after, "]")
	return list
}

// The operator's key of a three-server cluster in operator mode rotates
// with the servers restarted one at a time after each step: the switch is
// refused while a server does not trust the new key, naming it, and while
// a server is away (fewer answer than the routes name), then goes
// through; restarted onto the new key alone, every server's resolver
// holds the accounts signed by it, and the control side works on.
func TestTheClusterOperatorKeyRotates(t *testing.T) {
	m := newMeshDirs(t)
	natsServer := buildNATSServer(t, m.base)
	clients, routes := clusterAddrs(t)
	confDir := filepath.Join(m.base, "cluster")
	configure := func() {
		t.Helper()
		m.run("mesh-control", "broker-config", "--dir", m.ctl, "--cluster", strings.Join(routes, ","), "--listen", strings.Join(clients, ","), "--out", confDir, "--resolver")
	}
	configure()
	servers := make([]*exec.Cmd, 3)
	start := func(i int) {
		name := fmt.Sprintf("mesh-broker-%d", i+1)
		servers[i] = startLogged(m, name, natsServer, nil, "-c", filepath.Join(confDir, name+".conf"))
	}
	stop := func(i int) {
		servers[i].Process.Signal(syscall.SIGTERM)
		servers[i].Wait()
	}
	for i := range 3 {
		start(i)
	}
	urls := make([]string, len(clients))
	for i, c := range clients {
		urls[i] = "tls://" + c
	}
	urlList := strings.Join(urls, ",")
	serving := func(what string) {
		t.Helper()
		waitAll(t, 2*time.Minute, what, func() (int, bool) {
			code, _, _ := m.runCode("mesh-control", "", "nodes", "--dir", m.ctl, "--nats", urlList)
			return 1, code == 0
		})
	}
	startLogged(m, "control", filepath.Join(bin, "mesh-control"), nil, "serve", "--dir", m.ctl, "--nats", urlList, "--replicas", "3")
	serving("the control side on the cluster")
	m.issue("--new", "--name", "n1", "--nats", urlList)
	rolling := func(what string) {
		t.Helper()
		for i := range 3 {
			stop(i)
			start(i)
			serving(what)
		}
	}
	rotate := func(args ...string) (int, string, string) {
		return m.runCode("mesh-control", "", append([]string{"operator-key", "rotate", "--dir", m.ctl, "--nats", urlList}, args...)...)
	}

	var res control.OperatorKeyResult
	if code, out, stderr := rotate("--json"); code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Next == "" {
		t.Fatalf("operator-key rotate: exit %d\n%s%s", code, out, stderr)
	}
	configure()
	for i := range 2 {
		stop(i)
		start(i)
		serving("servers 1 and 2 restarted onto both keys")
	}
	if code, _, stderr := rotate("--switch"); code == 0 || !strings.Contains(stderr, "1 server(s) do not trust the new operator key yet: mesh-broker-3") {
		t.Fatalf("a switch with mesh-broker-3 not restarted: exit %d: %s", code, stderr)
	}
	stop(2)
	// The two left elect the leaders mesh-broker-3 held: the switch is
	// asked of a cluster that answers, with one server away.
	serving("the cluster without mesh-broker-3")
	if code, _, stderr := rotate("--switch"); code == 0 || !strings.Contains(stderr, "2 server(s) answered") {
		t.Fatalf("a switch with mesh-broker-3 away: exit %d: %s", code, stderr)
	}
	start(2)
	serving("mesh-broker-3 back, trusting both keys")
	if code, out, stderr := rotate("--switch"); code != 0 || !strings.Contains(out, "the operator's key is "+res.Next+" now") {
		t.Fatalf("the switch: exit %d\n%s%s", code, out, stderr)
	}
	configure()
	if b, _ := os.ReadFile(filepath.Join(confDir, "mesh-broker-1.conf")); strings.Count(operators(string(b)), ",") != 0 {
		t.Fatalf("the configuration after the switch names more than one operator:\n%s", b)
	}
	rolling("the cluster restarted onto the new key alone")
	m.issue("--new", "--name", "n2", "--nats", urlList)
	for i := range 3 {
		dir := filepath.Join(confDir, fmt.Sprintf("mesh-broker-%d", i+1), "accounts")
		eventually(t, dir+": every account the new key's", func() bool {
			n, stale := 0, 0
			filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !strings.HasSuffix(p, ".jwt") {
					return nil
				}
				b, _ := os.ReadFile(p)
				if c, err := jwt.DecodeGeneric(strings.TrimSpace(string(b))); err != nil || c.Issuer != res.Next {
					stale++
				}
				n++
				return nil
			})
			return n >= 4 && stale == 0
		})
	}
}
