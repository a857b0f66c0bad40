package e2e

import (
	"archive/tar"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// archive put outlasts a broker that stalls mid-put, as a busy control
// machine's does: serve (its embedded broker inside) is stopped for 7 s
// while the chunks go in, longer than the 5 s nats.go gives each chunk's
// acknowledgement by default; the put waits, and stores the archive.
func TestArchivePutOutlastsAStall(t *testing.T) {
	m := newBareMesh(t)
	serve := m.procs[0]
	file := filepath.Join(m.base, "big.tar")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	body := make([]byte, 48<<20)
	rand.Read(body)
	tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	f.Close()

	put := exec.Command(m.binary("mesh-control"), "archive", "put", file, "--dir", m.ctl, "--json")
	out := &strings.Builder{}
	put.Stdout, put.Stderr = out, out
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	stall(serve)
	if err := put.Wait(); err != nil {
		t.Fatalf("archive put across a 7 s stall: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), `"sha256"`) {
		t.Fatalf("archive put: %s", out)
	}
}

// The operator's commands outlast a broker that stalls, as a busy control
// machine's does: serve (its embedded broker inside) is stopped for 7 s
// — longer than the 5 s nats.go gives a connection's handshake by
// default — as each command starts, so the stall meets the handshake;
// each command waits, and ends as it would have.
func TestCommandsOutlastAStalledBroker(t *testing.T) {
	m := newMesh(t)
	serve := m.procs[0]
	decl := filepath.Join(m.base, "stall.json")
	os.WriteFile(decl, []byte(strings.ReplaceAll(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"after a stall\n"}]}`, "{root}", m.tree)), 0o600)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"nodes", "--json"}, `"name": "n1"`},
		{[]string{"declare", "n1", decl, "--json"}, `"seq"`},
		{[]string{"node", "show", "n1", "--json"}, `"record"`},
		{[]string{"token", "issue", "--new", "--name", "later"}, "nmt1-"},
		{[]string{"status"}, "nodes"},
	} {
		cmd := exec.Command(m.binary("mesh-control"), append(c.args, "--dir", m.ctl)...)
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		stall(serve, func() {
			if err := cmd.Start(); err != nil {
				t.Error(err)
			}
		})
		if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), c.says) {
			t.Errorf("mesh-control %v across a 7 s stall: %v\n%s", c.args, err, out)
		}
	}
}

// stall stops serve (its embedded broker inside) for 7 s, as a busy
// control machine's stalls, doing what starts each while it is stopped.
func stall(serve *exec.Cmd, starts ...func()) {
	serve.Process.Signal(syscall.SIGSTOP)
	defer serve.Process.Signal(syscall.SIGCONT)
	for _, f := range starts {
		f()
	}
	time.Sleep(7 * time.Second)
}
