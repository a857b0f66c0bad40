package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// fill writes a file at path until the filesystem holding it has no room
// left.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 256<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			return
		}
	}
}

// meshOnASmallDisk is a mesh whose control directory is a 48 MiB tmpfs
// of its own, to fill.
func meshOnASmallDisk(t *testing.T) *mesh {
	m := newMeshDirs(t)
	m.moveControl(func() {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", m.ctl).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", m.ctl).Run() })
	})
	return m
}

// readsAnswer: on a full disk, what only looks still answers (nodes).
func readsAnswer(t *testing.T, m *mesh) {
	t.Helper()
	if out, err := exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl, "--json").CombinedOutput(); err != nil || !strings.Contains(string(out), `"n1"`) {
		t.Errorf("nodes on a full disk: %v\n%s", err, out)
	}
}

// declareMotd declares to n1 a file of content, and waits for its report
// (a minute at most): what the command printed, and its error.
func declareMotd(m *mesh, content string) (string, error) {
	f := filepath.Join(m.base, "decl.json")
	os.WriteFile(f, []byte(fmt.Sprintf(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":%q,"content":%q}]}`, filepath.Join(m.tree, "motd"), content)), 0o600)
	out, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl, "--wait=1m", "--json").CombinedOutput()
	return string(out), err
}

// The control side's disk full, then space again: a write is either taken
// (the broker's files had room allocated ahead: it is then on disk like
// any acknowledged write) or refused saying which disk is full; reads keep
// answering; and serve takes writes again once there is room — without a
// restart, and with everything acknowledged before still there. The
// control directory is on a small tmpfs, filled by a file beside the
// broker's store.
func TestAFullControlDiskThenSpaceAgain(t *testing.T) {
	m := meshOnASmallDisk(t)
	// The one serve of the test: nothing starts another.
	m.startControl()
	agentConf := m.addNode()
	m.startExecutor()
	m.startAgent("--config", agentConf)
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })

	declare := func(content string) (string, error) { return declareMotd(m, content) }
	if out, err := declare("before\n"); err != nil || !strings.Contains(out, `"outcome": "applied"`) {
		t.Fatalf("declare before the disk is full: %v\n%s", err, out)
	}
	before := m.reportFor(1)
	nodeAdd := func(name string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, "mesh-control"), "node", "add", name, "--dir", m.ctl, "--out", filepath.Join(m.base, name, "agent.json")).CombinedOutput()
		return string(out), err
	}
	if out, err := nodeAdd("n2"); err != nil {
		t.Fatalf("node add before the disk is full: %v\n%s", err, out)
	}

	filler := filepath.Join(m.ctl, "filler")
	fill(t, filler)
	full := "the disk holding " + filepath.Join(m.ctl, "jetstream") + " is full"
	acked := []string{"n1", "n2"}
	if out, err := nodeAdd("n3"); err == nil {
		acked = append(acked, "n3")
	} else if !strings.Contains(out, full) {
		t.Errorf("node add on a full disk: %v, and it does not say %q:\n%s", err, full, out)
	}
	if out, err := declare("while full\n"); err != nil && !strings.Contains(out, full) {
		t.Errorf("declare on a full disk: %v, and it does not say %q:\n%s", err, full, out)
	}
	// Reads still answer: a full disk stops what writes, not what looks.
	readsAnswer(t, m)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var out string
	var err error
	eventually(t, "node add once there is space again", func() bool {
		out, err = nodeAdd("n4")
		return err == nil
	})
	acked = append(acked, "n4")
	out, err = declare("after\n")
	if err != nil || !strings.Contains(out, `"outcome": "applied"`) {
		t.Fatalf("declare once there is space again: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "after\n" {
		t.Fatalf("the machine: %q", b)
	}
	// The broker's users still follow the registry: the node added once
	// there was space again is let in.
	id, err := agent.LoadConfig(filepath.Join(m.base, "n4", "agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "n4, added once there was space again, let in by the broker", func() bool {
		nc, err := agent.Dial(id)
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	// Nothing acknowledged before is lost.
	for _, n := range acked {
		if m.nodeNamed(n) == nil {
			t.Errorf("node %s is gone", n)
		}
	}
	found := false
	for _, r := range m.reports(50) {
		if r.Seq == before.Seq && r.Trigger == "declaration" && r.Outcome == shapes.Applied {
			found = true
		}
	}
	if !found {
		t.Errorf("the report of seq %d, seen before the disk was full, is gone", before.Seq)
	}
}

// A control machine started again after its disk filled (a reboot, a
// package upgrade restarting serve): serve comes up on the full disk (its
// lock's record written over the last one), answers what reads, takes a
// write into room its files hold or says the disk is full, and once the
// disk has room takes writes again without a restart — nats-server, left
// to itself, caps its store at three quarters of what was free when it
// started, and refused every write as "insufficient resources" long after.
func TestServeStartedOnAFullDisk(t *testing.T) {
	m := meshOnASmallDisk(t)
	serve := m.startControl()
	agentConf := m.addNode()
	m.startExecutor()
	m.startAgent("--config", agentConf)
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	declare := func(content string) (string, error) { return declareMotd(m, content) }
	if out, err := declare("before\n"); err != nil || !strings.Contains(out, `"outcome": "applied"`) {
		t.Fatalf("declare before the disk is full: %v\n%s", err, out)
	}
	serve.Process.Signal(syscall.SIGTERM)
	serve.Wait()

	filler := filepath.Join(m.ctl, "filler")
	fill(t, filler)
	m.startControl() // it answers `nodes`, or the test ends here
	full := "the disk holding " + filepath.Join(m.ctl, "jetstream") + " is full"
	issue := func(name string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, "mesh-control"), "token", "issue", "--new", "--name", name, "--dir", m.ctl).CombinedOutput()
		return string(out), err
	}
	if out, err := issue("n2"); err != nil && !strings.Contains(out, full) {
		t.Errorf("token issue on a full disk: %v, and it does not say %q:\n%s", err, full, out)
	}
	readsAnswer(t, m)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var out string
	var err error
	eventually(t, "a token issued once there is space again", func() bool {
		out, err = issue("n3")
		return err == nil
	})
	if out, err = declare("after\n"); err != nil || !strings.Contains(out, `"outcome": "applied"`) {
		t.Fatalf("declare once there is space again: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "after\n" {
		t.Fatalf("the machine: %q", b)
	}
}
