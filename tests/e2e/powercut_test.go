package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// needLoop skips a test that needs a loop device and an ext4 image (a
// filesystem image mounted as a disk) where the machine has none to give.
func needLoop(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("losetup", "-f").CombinedOutput(); err != nil {
		t.Fatalf("a free loop device (losetup -f: %v: %s): a power cut is played on a filesystem image mounted through one", err, strings.TrimSpace(string(out)))
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Fatalf("mkfs.ext4 (e2fsprogs, which tests/install-deps.sh installs) to make the filesystem image a power cut is played on: %v", err)
	}
}

// mountImage mounts the ext4 image img at dir through a loop device, and
// unmounts it when the test ends (before the test's directories are
// removed, which were made first).
func mountImage(t *testing.T, img, dir string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s on %s: %v\n%s", img, dir, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
}

// moveControl moves the control directory, as init left it, onto a
// filesystem mount mounts at m.ctl.
func (m *mesh) moveControl(mount func()) {
	m.t.Helper()
	initial := m.ctl + ".init"
	if err := os.Rename(m.ctl, initial); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Mkdir(m.ctl, 0o700); err != nil {
		m.t.Fatal(err)
	}
	mount()
	if out, err := exec.Command("cp", "-a", initial+"/.", m.ctl).CombinedOutput(); err != nil {
		m.t.Fatalf("cp: %v\n%s", err, out)
	}
}

// copyFile copies src to dst, as it is now.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// syncDir makes everything written to the filesystem holding dir reach its
// disk (syncfs): what was written long before a power cut.
func syncDir(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatalf("syncfs %s: %v", dir, err)
	}
}

// A power cut of the control side loses nothing it acknowledged. Its
// directory is on an ext4 image mounted through a loop device; right after
// the last acknowledgement the image file is copied while serve still runs
// — what reaches the image is what ext4 handed to its disk, so the copy is
// what a power cut leaves — serve is killed, and a new serve runs on the
// copy (mounted: ext4 replays its journal). Every node added, token issued
// and used, sequence taken, revocation and report seen must be there.
//
// Two of them are the security of the mesh: a token's one-time use (lost,
// the token enrols a second machine) and a revocation (lost, the broker
// lets the revoked key in again). The node revoked and the token used were
// made, and synced to the disk, before the writes under test, so that the
// loss of the node or of the token could not hide the loss of the
// revocation or of the use.
func TestAcknowledgedWritesSurviveAPowerCut(t *testing.T) {
	needLoop(t)
	m := newMeshDirs(t)
	// The control directory moves onto the image, as it was after init.
	img := filepath.Join(m.base, "control.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	m.moveControl(func() { mountImage(t, img, m.ctl) })
	syncDir(t, m.ctl)

	serve := m.startControl()
	m.startExecutor()
	agentProc := m.startAgent("--config", m.agentConfig())

	// Long before the cut: a node (revoked later) and a token (used
	// later), on the disk.
	addNode := func(name string) string {
		t.Helper()
		conf := filepath.Join(m.base, name, "agent.json")
		m.run("mesh-control", "node", "add", name, "--dir", m.ctl, "--out", conf)
		return conf
	}
	revokedConf := addNode("n2")
	used := m.issue("--new", "--name", "n1")
	syncDir(t, m.ctl)

	// The writes under test, each acknowledged to the operator.
	m.enrolled(used, "n1")
	declare := func(content string) uint64 {
		t.Helper()
		f := filepath.Join(m.base, "decl.json")
		os.WriteFile(f, []byte(fmt.Sprintf(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":%q,"content":%q}]}`, filepath.Join(m.tree, "motd"), content)), 0o600)
		out := m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--wait", "--json")
		if !strings.Contains(out, `"outcome": "applied"`) {
			t.Fatalf("declare %q: not applied:\n%s", content, out)
		}
		var seq uint64
		for _, r := range m.reports(10) {
			if r.Trigger == "declaration" && r.Outcome == shapes.Applied && r.Seq > seq {
				seq = r.Seq
			}
		}
		return seq
	}
	declare("one\n")
	seen := declare("two\n")
	added := []string{"n3", "n4", "n5", "n6"}
	confs := map[string]string{}
	for _, n := range added {
		confs[n] = addNode(n)
	}
	pending := m.issue("--node", "n4") // a re-enrolment token: n4's identity revoked until it is used
	tok, err := wire.ParseToken(pending)
	if err != nil {
		t.Fatal(err)
	}
	m.run("mesh-control", "node", "revoke", "n2", "--dir", m.ctl)

	// The cut: the disk as it is now; then serve is gone at once.
	cut := filepath.Join(m.base, "control-after-cut.img")
	copyFile(t, img, cut)
	serve.Process.Signal(syscall.SIGKILL)
	serve.Wait()
	// The node is down too while the control side comes back, so nothing
	// it would send again on reconnecting can stand in for what was lost.
	agentProc.Process.Signal(syscall.SIGTERM)
	agentProc.Wait()
	if out, err := exec.Command("umount", m.ctl).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	mountImage(t, cut, m.ctl)
	m.procs = append(m.procs, startLogged(m, "mesh-control-after-cut", filepath.Join(bin, "mesh-control"), nil, "serve", "--dir", m.ctl, "--listen", fmt.Sprintf("127.0.0.1:%d", m.port)))
	eventually(t, "the control side serves on the disk the cut left", func() bool {
		return exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl).Run() == nil
	})

	// Every node added, and the revocations.
	for _, n := range append([]string{"n1", "n2"}, added...) {
		if m.nodeNamed(n) == nil {
			t.Errorf("node %s, added before the cut, is gone", n)
		}
	}
	for _, n := range []string{"n2", "n4"} {
		if rec := m.nodeNamed(n); rec != nil && rec["state"] != "revoked" {
			t.Errorf("node %s, revoked before the cut, is %v after it", n, rec["state"])
		}
	}
	// The report the operator saw.
	found := false
	for _, r := range m.reports(50) {
		if r.Seq == seen && r.Trigger == "declaration" && r.Outcome == shapes.Applied {
			found = true
		}
	}
	if !found {
		t.Errorf("the report of seq %d, seen with declare --wait before the cut, is gone: %+v", seen, m.reports(50))
	}
	// The re-enrolment token: what refuses a declaration to n4 names it.
	f := filepath.Join(m.base, "n4.json")
	os.WriteFile(f, []byte(`{"version":1,"resources":[{"module":"m","id":"d","type":"directory","path":"/srv/n4"}]}`), 0o600)
	out, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n4", f, "--dir", m.ctl).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "token "+tok.IDString()) {
		t.Errorf("the re-enrolment token for n4, issued before the cut, is not there: %v\n%s", err, out)
	}
	// The revoked key is refused by the broker; a key added beside it is
	// let in (so the refusal is the revocation's, not the broker's).
	for n, wantIn := range map[string]bool{"n2": false, "n3": true} {
		conf := revokedConf
		if n != "n2" {
			conf = confs[n]
		}
		id, err := agent.LoadConfig(conf)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := agent.Dial(id)
		switch {
		case wantIn && err != nil:
			t.Errorf("node %s, added before the cut, refused by the broker after it: %v", n, err)
		case !wantIn && err == nil:
			nc.Close()
			t.Errorf("node %s, revoked before the cut, let in by the broker after it", n)
		case err == nil:
			nc.Close()
		}
	}

	// The node back: its token, used before the cut, is refused as used.
	m.startAgent("--config", m.agentConfig())
	code, stdout, stderr := m.enrol(used)
	if code == 0 || !strings.Contains(stdout+stderr, "was used already") {
		t.Errorf("the token used before the cut, presented again after it: exit %d\n%s%s", code, stdout, stderr)
	}
	// The next sequence is past every one the node applied.
	f = filepath.Join(m.base, "after.json")
	os.WriteFile(f, []byte(fmt.Sprintf(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":%q,"content":"after the cut\n"}]}`, filepath.Join(m.tree, "motd"))), 0o600)
	cmd := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl, "--wait", "--json")
	b, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 0 || !strings.Contains(string(b), `"outcome": "applied"`) {
		t.Fatalf("the first declaration after the cut: exit %d\n%s", cmd.ProcessState.ExitCode(), b)
	}
	var next uint64
	for _, r := range m.reports(10) {
		if r.Trigger == "declaration" && r.Seq > next {
			next = r.Seq
		}
	}
	if next <= seen {
		t.Fatalf("the sequence after the cut is %d, not past %d, applied before it", next, seen)
	}
	if got, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(got) != "after the cut\n" {
		t.Fatalf("the machine after the cut: %q", got)
	}
}
