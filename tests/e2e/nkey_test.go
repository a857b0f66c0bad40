package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// controlNKeyUser signs in with the control NKey whose seed is seed.
func controlNKeyUser(k *control.Keys, seed []byte, url string) (*nats.Conn, error) {
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	return nats.Connect(url, nats.Secure(link.PinnedTLS(k.Fingerprint, nil)), nats.Nkey(pub, kp.Sign),
		nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// The control NKey is made anew, with serve stopped (refused while the
// embedded broker's serve holds the key directory): the embedded broker,
// started again, lets in the new key alone, and the node, which never
// knew it, is declared to as before; an existing broker configured from a
// file, its configuration written again and reloaded, cuts the old key's
// connection and refuses it from then on.
func TestTheControlNKeyIsMadeAnew(t *testing.T) {
	t.Run("embedded broker", func(t *testing.T) {
		m := newMesh(t)
		serve := m.procs[0]
		url := fmt.Sprintf("tls://127.0.0.1:%d", m.port)
		if code, _, stderr := m.runCode("mesh-control", "", "nkey", "rotate", "--dir", m.ctl); code == 0 || !strings.Contains(stderr, "mesh-control serve (pid ") || !strings.Contains(stderr, "; stop it first: the control NKey is made anew") {
			t.Fatalf("nkey rotate with serve running: exit %d: %s", code, stderr)
		}
		k, err := control.LoadKeys(m.ctl)
		if err != nil {
			t.Fatal(err)
		}
		oldSeed, _ := os.ReadFile(filepath.Join(m.ctl, control.FileNKey))
		serve.Process.Signal(syscall.SIGTERM)
		serve.Wait()
		out := m.run("mesh-control", "nkey", "rotate", "--dir", m.ctl)
		if !strings.Contains(out, "the control NKey is U") || !strings.Contains(out, "(it was "+k.NKeyPublic+")") {
			t.Fatalf("nkey rotate:\n%s", out)
		}
		if fi, err := os.Stat(filepath.Join(m.ctl, control.FileNKey)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("control.nk after the rotation: %v %v", fi, err)
		}
		if _, err := os.Stat(filepath.Join(m.ctl, control.FileNKeyPrevious)); err != nil {
			t.Fatalf("the key replaced is not kept until serve signs in with the new: %v", err)
		}
		m.startControl()
		eventually(t, "the key replaced removed once serve signs in with the new", func() bool {
			_, err := os.Stat(filepath.Join(m.ctl, control.FileNKeyPrevious))
			return os.IsNotExist(err)
		})
		if nc, err := controlNKeyUser(k, oldSeed, url); err == nil {
			nc.Close()
			t.Fatal("the embedded broker lets in the control NKey made anew")
		}
		seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"after the control NKey was made anew\n"}]}`)
		if r := m.reportFor(seq); r.Outcome != shapes.Applied {
			t.Fatalf("a declaration after the control NKey was made anew: %+v", r)
		}
	})

	t.Run("existing broker from a file", func(t *testing.T) {
		m := newMeshDirs(t)
		url := fmt.Sprintf("tls://127.0.0.1:%d", m.port)
		listen := fmt.Sprintf("127.0.0.1:%d", m.port)
		natsServer := buildNATSServer(t, m.base)
		conf, pidFile := filepath.Join(m.base, "broker.conf"), filepath.Join(m.base, "broker.pid")
		os.WriteFile(conf, []byte(m.run("mesh-control", "broker-config", "--dir", m.ctl, "--listen", listen)), 0o644)
		startAbs(m, natsServer, "-c", conf, "-P", pidFile)
		eventually(t, "the broker's pid file", func() bool { _, err := os.Stat(pidFile); return err == nil })
		serve := m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--nats", url, "--listen", listen, "--broker-config", conf, "--broker-pid", pidFile)
		eventually(t, "the control side serves", func() bool {
			return exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl).Run() == nil
		})
		k, err := control.LoadKeys(m.ctl)
		if err != nil {
			t.Fatal(err)
		}
		oldSeed, _ := os.ReadFile(filepath.Join(m.ctl, control.FileNKey))
		// A node linked through the rotation.
		agentConf := m.addNode()
		nkey := nodeNKey(t, agentConf)
		m.startExecutor()
		m.startAgent("--config", agentConf)
		eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
		// A connection of the old key: a thief's, say.
		pre, err := controlNKeyUser(k, oldSeed, url)
		if err != nil {
			t.Fatal(err)
		}
		defer pre.Close()

		serve.Process.Signal(syscall.SIGTERM)
		serve.Wait()
		// Twice before the broker is told: it knows the first key replaced.
		m.run("mesh-control", "nkey", "rotate", "--dir", m.ctl)
		m.run("mesh-control", "nkey", "rotate", "--dir", m.ctl)
		// Written from the registry read with the key the broker knows:
		// the new key let in beside the node, not instead of it.
		os.Truncate(filepath.Join(m.base, "mesh-agent.log"), 0)
		newConf := m.run("mesh-control", "broker-config", "--dir", m.ctl, "--listen", listen)
		if !strings.Contains(newConf, nkey) {
			t.Fatalf("the configuration written after the rotation leaves out the node:\n%s", newConf)
		}
		os.WriteFile(conf, []byte(newConf), 0o644)
		b, _ := os.ReadFile(pidFile)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		syscall.Kill(pid, syscall.SIGHUP)
		eventually(t, "the old key's connection cut at the reload", func() bool { return !pre.IsConnected() })
		if nc, err := controlNKeyUser(k, oldSeed, url); err == nil {
			nc.Close()
			t.Fatal("the broker lets in the control NKey made anew")
		}
		m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--nats", url, "--listen", listen, "--broker-config", conf, "--broker-pid", pidFile)
		eventually(t, "the control side serves with the new key", func() bool {
			return exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl).Run() == nil
		})
		eventually(t, "the key replaced removed once serve signs in with the new", func() bool {
			_, err := os.Stat(filepath.Join(m.ctl, control.FileNKeyPrevious))
			return os.IsNotExist(err)
		})
		if log, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log")); bytes.Contains(log, []byte("authorization refused")) {
			t.Fatalf("the node was refused through the rotation:\n%s", log)
		}
		seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"through the broker after the control NKey was made anew\n"}]}`)
		if r := m.reportFor(seq); r.Outcome != shapes.Applied {
			t.Fatalf("a declaration after the control NKey was made anew: %+v", r)
		}
	})
}
