package rescue

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// netns makes a network namespace for the test, removed after it.
func netns(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
}

// applyIn runs `mesh-executor apply` in the network namespace ns.
func applyIn(t *testing.T, ns, state, decl string) (*report, string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, executorBin, "apply", "--state", state, "--json", decl)
	cmd.Dir = "/"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("apply in %s: %v\n%s", ns, err, stderr.String())
	}
	var rep report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("apply in %s: %v\nstdout: %s\nstderr: %s", ns, err, out, stderr.String())
	}
	return &rep, stderr.String()
}

// Two nodes' overlays under userspace wireguard-go, with one interface
// name in two network namespaces of one machine: wireguard-go's control
// socket (/var/run/wireguard/NAME.sock) is the machine's, not the
// namespace's, so the second one fails — and its report names why
// ("UAPI listen error: unix socket in use"), not the last line
// wireguard-go printed (its banner's bottom edge, "└───…┘").
func TestASecondWireguardGoSaysItsError(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("wireguard-go"); err != nil {
		t.Fatal("wireguard-go is missing (tests/install-deps.sh installs it)")
	}
	base := rootDir(t)
	id := os.Getpid() % 100000
	iface := fmt.Sprintf("lprs%d", id)
	nsA, nsB := fmt.Sprintf("lprs-%d-a", id), fmt.Sprintf("lprs-%d-b", id)
	netns(t, nsA)
	netns(t, nsB)
	decl := filepath.Join(base, "overlay.json")
	doc := fmt.Sprintf(`{"version":1,"resources":[{"module":"mesh","id":"wg","type":"overlay","interface":%q,"address":"10.239.7.1/24","listen_port":51899,"peers":[]}]}`, iface)
	if err := os.WriteFile(decl, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}

	rep, stderr := applyIn(t, nsA, filepath.Join(base, "a"), decl)
	if rep.Outcome != "applied" {
		t.Fatalf("the first node's overlay: %+v\n%s", rep, stderr)
	}
	// Undeclared, the first node's overlay is removed by the executor
	// itself: its interface and the wireguard-go holding it.
	release := filepath.Join(base, "nothing.json")
	if err := os.WriteFile(release, []byte(`{"version":1,"resources":[],"owns_nothing":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rep, stderr := applyIn(t, nsA, filepath.Join(base, "a"), release); rep.Outcome != "removed" {
			t.Errorf("removing the first node's overlay: %+v\n%s", rep, stderr)
		}
	})
	sock := filepath.Join("/var/run/wireguard", iface+".sock")
	was := snapshotPath(t, sock)

	rep, stderr = applyIn(t, nsB, filepath.Join(base, "b"), decl)
	if rep.Outcome != "failed" || len(rep.Lines) != 1 {
		t.Fatalf("the second node's overlay on the same name: %+v\n%s", rep, stderr)
	}
	if d := rep.Lines[0].Detail; !strings.Contains(d, "UAPI listen error: unix socket in use") || strings.Contains(d, "└") {
		t.Errorf("the failed overlay's report: %q\nwant wireguard-go's error line (UAPI listen error: unix socket in use)", d)
	}
	if d := sameAs(sock, was); d != "" {
		t.Errorf("the first node's wireguard-go socket changed: %s", d)
	}
	if out, err := exec.Command("ip", "-n", nsA, "link", "show", iface).CombinedOutput(); err != nil {
		t.Errorf("the first node's interface is gone: %v\n%s", err, out)
	}
}
