package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/fleet"
)

// With a broker of the operator's own (a real nats-server process, not the
// embedded one), `mesh-control serve --nats URL --broker-config FILE
// --broker-pid FILE` keeps that broker's users equal to the registry: a node
// added while serving can connect once the broker is told, and a revoked
// node is cut off at once — the broker disconnects it and refuses it from
// then on, as the embedded broker does.
func TestExistingBrokerFollowsTheRegistry(t *testing.T) {
	m := newMeshDirs(t)
	url := fmt.Sprintf("tls://127.0.0.1:%d", m.port)
	listen := fmt.Sprintf("127.0.0.1:%d", m.port)
	base := m.base

	// The operator's broker, from the configuration mesh-control writes
	// (before any node: only the control side may connect).
	natsServer := buildNATSServer(t, base)
	conf, pidFile := filepath.Join(base, "broker.conf"), filepath.Join(base, "broker.pid")
	os.WriteFile(conf, []byte(m.run("mesh-control", "broker-config", "--dir", m.ctl, "--listen", listen)), 0o644)
	startAbs(m, natsServer, "-c", conf, "-P", pidFile)
	eventually(t, "the broker's pid file", func() bool { _, err := os.Stat(pidFile); return err == nil })

	// The control side on it, keeping its configuration.
	m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--nats", url, "--listen", listen, "--broker-config", conf, "--broker-pid", pidFile)
	eventually(t, "the control side serves", func() bool {
		return exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl).Run() == nil
	})

	// A node added now connects once serve has told the broker.
	agentConf := m.addNode()
	nkey := nodeNKey(t, agentConf)
	eventually(t, "the node's NKey in the broker's configuration", func() bool {
		b, _ := os.ReadFile(conf)
		return bytes.Contains(b, []byte(nkey))
	})
	m.startExecutor()
	m.startAgent("--config", agentConf)
	eventually(t, "the node heard from through the operator's broker", func() bool { return m.node()["executor_version"] == "e2e" })
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"through an existing broker\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("a declaration through the operator's broker: %+v", r)
	}

	// Revoked: gone from the configuration, and the broker, told, cuts
	// the connection it has and refuses the next.
	os.Truncate(filepath.Join(m.base, "mesh-agent.log"), 0)
	m.run("mesh-control", "node", "revoke", "n1", "--dir", m.ctl)
	eventually(t, "the node's NKey out of the broker's configuration", func() bool {
		b, _ := os.ReadFile(conf)
		return !bytes.Contains(b, []byte(nkey))
	})
	eventually(t, "the revoked node refused by the operator's broker", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return bytes.Contains(b, []byte("authorization refused by the broker"))
	})
}

// buildNATSServer builds nats-server from the module the project depends
// on (the version the embedded broker is) into dir.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	natsServer := filepath.Join(dir, "nats-server")
	if err := fleet.BuildNATSServer(t.Context(), natsServer); err != nil {
		t.Fatal(err)
	}
	return natsServer
}

// startAbs is mesh.start for a program outside the test's bin directory.
func startAbs(m *mesh, path string, args ...string) {
	m.t.Helper()
	link := filepath.Join(bin, filepath.Base(path))
	if err := os.Symlink(path, link); err != nil && !os.IsExist(err) {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { os.Remove(link) })
	m.start(filepath.Base(path), nil, args...)
}

// nodeNKey is the public NKey in the agent configuration node add wrote.
// node show is asked again if it fails: serve has the broker reload its
// users right after node add, and a client connecting in that moment was
// once refused (seen in a full parallel run, with the error logged here).
func nodeNKey(t *testing.T, agentConf string) string {
	t.Helper()
	var out []byte
	eventually(t, "node show n1", func() bool {
		cmd := exec.Command(filepath.Join(bin, "mesh-control"), "node", "show", "n1", "--dir", filepath.Join(filepath.Dir(agentConf), "control"), "--json")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			t.Logf("node show: %v: %s", err, stderr.String())
			return false
		}
		return true
	})
	for _, f := range strings.FieldsFunc(string(out), func(r rune) bool { return r == '"' }) {
		if len(f) == 56 && strings.HasPrefix(f, "U") {
			return f
		}
	}
	t.Fatalf("no user NKey in node show:\n%s", out)
	return ""
}
