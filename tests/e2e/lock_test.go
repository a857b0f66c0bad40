package e2e

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// storeSnapshot is every message of every stream of the control side's
// JetStream (the declarations, reports and heartbeats, and the streams
// under the registry's KV bucket and the archive store): per stream, its
// state and a line per stored message (sequence, subject, digest of the
// headers and data).
type storeSnapshot map[string][]string

func snapshotStore(t *testing.T, ctl, url string) storeSnapshot {
	t.Helper()
	k, err := control.LoadKeys(ctl)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := control.Connect(ctx, k, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	snap := storeSnapshot{}
	names := cl.JS.StreamNames(ctx)
	for name := range names.Name() {
		s, err := cl.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st := info.State
		lines := []string{fmt.Sprintf("state msgs=%d bytes=%d first=%d last=%d", st.Msgs, st.Bytes, st.FirstSeq, st.LastSeq)}
		for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // deleted (a KV key's older revision)
			}
			if err != nil {
				t.Fatalf("stream %s seq %d: %v", name, seq, err)
			}
			h := sha256.New()
			fmt.Fprintf(h, "%v\x00", m.Header)
			h.Write(m.Data)
			lines = append(lines, fmt.Sprintf("%d %s %x", seq, m.Subject, h.Sum(nil)))
		}
		snap[name] = lines
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return snap
}

// diff says how b differs from a, "" when it does not.
func (a storeSnapshot) diff(b storeSnapshot) string {
	var out []string
	for name, la := range a {
		lb, ok := b[name]
		switch {
		case !ok:
			out = append(out, "stream "+name+" is gone")
		case !slices.Equal(la, lb):
			out = append(out, fmt.Sprintf("stream %s:\n  before %v\n  after  %v", name, la, lb))
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			out = append(out, "stream "+name+" is new")
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// A second serve on a key directory a serve holds (another port, so the
// port cannot be what stops it) is refused before it opens the embedded
// store, exits 1 and says which serve holds the directory, by pid; init
// is refused the same way. Every stream and the registry keep every
// message, byte for byte, as the running broker sees them and as the
// store reads back after the first serve restarts; the running broker
// logs no lost block. (Before the lock, the second serve opened the store
// under the first and rewrote it: "could not locate msg block 1".)
func TestSecondServeLeavesTheStoreWhole(t *testing.T) {
	m := newBareMesh(t)
	first := m.procs[len(m.procs)-1]
	agentConf := m.addNode()
	m.startExecutor()
	agentCmd := m.startAgent("--config", agentConf)
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	// What the store holds: declarations, reports and heartbeats, the
	// registry (node, report, heartbeat, profile, a token), an archive.
	var last uint64
	for i := range 3 {
		last = m.declare(fmt.Sprintf(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%d\n"}]}`, i))
		m.reportFor(last)
	}
	m.issue("--new", "--name", "later")
	arch := filepath.Join(m.base, "a.tar")
	os.WriteFile(arch, make([]byte, 10240), 0o600) // an empty tar: two zero blocks, and padding
	m.run("mesh-control", "archive", "put", arch, "--dir", m.ctl)
	// Quiet: nothing writes to the store while it is compared.
	agentCmd.Process.Signal(syscall.SIGTERM)
	agentCmd.Wait()
	url := fmt.Sprintf("tls://127.0.0.1:%d", m.port)
	before := snapshotStore(t, m.ctl, url)
	eventually(t, "the store quiet (the agent's last heartbeat recorded)", func() bool {
		time.Sleep(time.Second)
		now := snapshotStore(t, m.ctl, url)
		quiet := before.diff(now) == ""
		before = now
		return quiet
	})
	for _, name := range []string{link.DeclStream, link.NodeReportPartition("n1").Stream, link.HeartbeatStream, "KV_" + control.Bucket, link.ArchiveStream} {
		if len(before[name]) < 2 {
			t.Fatalf("stream %s holds nothing to lose: %v", name, before[name])
		}
	}

	want := fmt.Sprintf("refused: another mesh-control serve (pid %d) holds %s; stop it first", first.Process.Pid, m.ctl)
	for _, args := range [][]string{
		{"serve", "--dir", m.ctl, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))},
		{"init", "--dir", m.ctl},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "mesh-control"), args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "mesh-control "+args[0]+": "+want) {
			t.Fatalf("mesh-control %v beside the running serve: %v, want exit 1 saying %q:\n%s", args, err, want, out)
		}
	}
	if d := before.diff(snapshotStore(t, m.ctl, url)); d != "" {
		t.Fatalf("the store changed under the running serve:\n%s", d)
	}
	// Still written and read: a declaration more.
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"after\n"}]}`)
	if seq != last+1 {
		t.Fatalf("the next sequence is %d, want %d", seq, last+1)
	}
	now := snapshotStore(t, m.ctl, url)
	// (A state line and the messages; the stream keeps DeclsPerNode.)
	had := before[link.DeclStream]
	if decls := now[link.DeclStream]; len(decls) != min(len(had), link.DeclsPerNode)+1 || decls[len(decls)-1] == had[len(had)-1] {
		t.Fatalf("declarations after one more: %v, before %v", decls, before[link.DeclStream])
	}
	if b, _ := os.ReadFile(filepath.Join(m.base, "mesh-control.log")); strings.Contains(string(b), "msg block") || strings.Contains(string(b), "lmb missing") {
		t.Fatalf("the running broker lost blocks of its store:\n%s", b)
	}
	// What the store reads back from disk: the first serve restarted.
	first.Process.Signal(syscall.SIGTERM)
	if _, err := first.Process.Wait(); err != nil {
		t.Fatal(err)
	}
	m.startControl()
	if d := now.diff(snapshotStore(t, m.ctl, url)); d != "" {
		t.Fatalf("the store read back after a restart differs:\n%s", d)
	}
}
