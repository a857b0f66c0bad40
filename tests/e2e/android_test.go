package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The Android split, as far as this machine allows: the executor as a root
// helper (started by hand, as a root manager would, a partial host), the
// agent as an app's uid that no passwd names (10123 here, standing in for
// the app), the socket opened to that uid alone. The agent enrols and
// links; a file is applied; a shape the partial host cannot apply is
// refused by name; another app's uid cannot reach the socket.
func TestAndroidSplit(t *testing.T) {
	const app, other = 10123, 10124
	m := newBareMesh(t)
	m.startExecutor("--agent-uid", "10123", "--partial")
	os.MkdirAll(m.agentState(), 0o700)
	os.Chown(m.agentState(), app, app)
	m.start("mesh-agent", &syscall.Credential{Uid: app, Gid: app}, "--socket", m.sock, "--user", "",
		"--state", m.agentState(), "--config", m.agentConfig(), "--heartbeat", "1s", "--enrol-poll", "200ms", "--episodic")
	m.enrolled(m.issue("--new", "--name", "n1"), "n1")
	seq := m.declare(`{"version":1,"resources":[{"module":"app","id":"conf","type":"file","path":"{root}/app.conf","content":"on a phone\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "app.conf")); string(b) != "on a phone\n" {
		t.Fatalf("the machine: %q", b)
	}
	// A partial host refuses what needs an init or a package manager, by
	// name and with the reason; nothing is touched.
	seq = m.declare(`{"version":1,"resources":[{"module":"app","id":"conf","type":"file","path":"{root}/app.conf","content":"on a phone\n"},` +
		`{"module":"app","id":"svc","type":"service","unit":"sshd","state":"running"}]}`)
	r := m.reportFor(seq)
	if r.Outcome != shapes.Refused || !strings.Contains(r.Refused, "partial host") || !strings.Contains(r.Refused, "service") {
		t.Fatalf("a service on a partial host: %+v", r)
	}
	// The episodic agent says what it is.
	eventually(t, "the heartbeat says episodic", func() bool {
		hb, _ := m.node()["heartbeat"].(map[string]any)
		return hb != nil && hb["presence"] == "episodic"
	})
	// Another app cannot reach the executor: the socket's directory is
	// open to the agent's uid alone, and the peer check would refuse it.
	fi, err := os.Stat(filepath.Dir(m.sock))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != app || fi.Mode().Perm() != 0o750 {
		t.Fatalf("the socket directory is gid %d mode %v, want %d 0750", st.Gid, fi.Mode().Perm(), app)
	}
	// A child of this test binary, as the other app's uid, tries; the
	// app's own uid, as a positive control, gets an answer.
	self, _ := os.Executable()
	probeBin := filepath.Join(m.base, "probe")
	if b, err := os.ReadFile(self); err != nil || os.WriteFile(probeBin, b, 0o755) != nil {
		t.Fatalf("copying the probe: %v", err)
	}
	probe := func(uid uint32) error {
		cmd := exec.Command(probeBin)
		cmd.Env = []string{"E2E_DIAL=" + m.sock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := probe(app); err != nil {
		t.Fatalf("the app's own uid could not reach the executor: %v", err)
	}
	if err := probe(other); err == nil {
		t.Fatal("another app's uid reached the executor")
	}
}

// dialProbe says hello to the executor at sock: 0 if it answered.
func dialProbe(sock string) int {
	c, err := wire.DialUnix(sock, 0)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer c.Close()
	if err := c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Build: "e2e"}); err != nil {
		fmt.Println(err)
		return 1
	}
	if k, _, err := c.Read(); err != nil || k != wire.KindHelloReply {
		fmt.Println(k, err)
		return 1
	}
	return 0
}
