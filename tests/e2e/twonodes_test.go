package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// examples/two-nodes.sh, the recipe for several nodes on one machine that
// docs/operations.md gives: a control side and two nodes, each executor in
// a network namespace of its own with its own state, socket and
// /run/wireguard, enrolled with one-time tokens; a file declared to each
// is on its node, each report says it was applied. With TWO_NODES_ONCE it
// then ends, and leaves nothing running: no process, no network
// namespace, no bind mount on /run/wireguard.
func TestTwoNodesExample(t *testing.T) {
	base, err := os.MkdirTemp("", "two-nodes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755) // the agents, as nobody, reach their sockets below it
	scratch := filepath.Join(base, "mesh")
	cmd := exec.Command("bash", "examples/two-nodes.sh", bin)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "TWO_NODES_DIR="+scratch, "TWO_NODES_ONCE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("two-nodes.sh: %v\n%s", err, out)
	}
	for _, n := range []string{"n1", "n2"} {
		b, err := os.ReadFile(filepath.Join(scratch, n, "files", "motd"))
		if err != nil || string(b) != "hello from the control side to "+n+"\n" {
			t.Errorf("%s's file: %q %v", n, b, err)
		}
		for _, want := range []string{"enrolled as node " + n, n + ": ", "hello.motd  file  applied  created"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("two-nodes.sh did not say %q\n%s", want, out)
			}
		}
	}
	if ns, _ := exec.Command("ip", "netns", "list").Output(); bytes.Contains(ns, []byte("two-nodes-")) {
		t.Errorf("network namespaces left: %s", ns)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(scratch)) {
			t.Errorf("left running: %s", bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(m, []byte(scratch)) {
		t.Error("a mount of the example's left behind")
	}
}
