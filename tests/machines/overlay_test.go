package machines

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

const stateDir = "/var/lib/mesh-host/executor"

// overlayDecl is lab n's overlay declaration: wg0 at 10.233.9.n/24,
// listening on 51820, with the given peers (JSON objects).
func overlayDecl(n int, peers ...string) string {
	return decl(fmt.Sprintf(`{"module":"mesh","id":"wg","type":"overlay","interface":"wg0","address":"10.233.9.%d/24","listen_port":51820,"peers":[%s]}`,
		n, strings.Join(peers, ",")))
}

func overlayPeer(pub string, n int) string {
	return fmt.Sprintf(`{"public_key":%q,"endpoint":"10.231.9.%d:51820","allowed_ips":["10.233.9.%d/32"],"keepalive":5}`, pub, n, n)
}

// pings reports whether m reaches addr within a few seconds (the first
// packets also wait for the handshake).
func (m *machine) pings(addr string) bool {
	m.t.Helper()
	return m.sh(fmt.Sprintf("for i in 1 2 3 4 5; do ping -c 1 -W 1 %s >/dev/null 2>&1 && { echo yes; exit 0; }; done; echo no", addr)) == "yes"
}

// applyAsService applies lab n's declaration with the executor running as a
// systemd service that ends when it does (as mesh-executor.service would on
// a restart or upgrade): systemd kills whatever is left in its cgroup, so a
// wireguard-go started as the executor's child, or in its cgroup, would die
// with it.
func (m *machine) applyAsService(doc string) {
	m.t.Helper()
	if err := m.WriteFile("/root/decl.json", []byte(doc), 0o600); err != nil {
		m.t.Fatal(err)
	}
	out := m.sh("systemd-run --wait --collect --quiet --unit=lp-mesh-executor -p KillMode=control-group " +
		"-p StandardOutput=truncate:/root/report.json /usr/local/bin/mesh-executor apply --json /root/decl.json; echo $?")
	if out != "0" {
		m.t.Fatalf("the executor as a service: %s\n%s", out, m.sh("journalctl -u lp-mesh-executor --no-pager | tail -20"))
	}
}

// Two systemd labs joined by a veth converge an overlay declaration each —
// the other as their peer — and ping each other through the tunnel:
// userspace wireguard-go (this kernel has no WireGuard) run by systemd,
// configured and read back through wgctrl, asserted from outside the
// executor with `wg show`, `ip` and systemctl.
func TestOverlayTwoLabsPingThroughTheTunnel(t *testing.T) {
	if _, err := exec.LookPath("wg"); err != nil {
		t.Fatal("wg is missing (wireguard-tools; tests/install-deps.sh installs it)")
	}
	a, b := boot(t, lab.Options{Name: "ov-a"}), boot(t, lab.Options{Name: "ov-b"})
	lab.Link(t, a.Machine, b.Machine, "10.231.9.1/24", "10.231.9.2/24")
	if !a.pings("10.231.9.2") {
		t.Fatal("the veth does not carry a ping")
	}
	kernelWG := a.sh("ip link add lpwgprobe type wireguard 2>/dev/null && ip link del lpwgprobe && echo yes || echo no") == "yes"

	// First pass: no peers; it makes each executor's key. The first
	// executor runs as a service whose cgroup systemd empties when it ends.
	a.applyAsService(overlayDecl(1))
	var rep shapes.Report
	if err := jsonFile(a, "/root/report.json", &rep); err != nil {
		t.Fatal(err)
	}
	expect(t, &rep, shapes.Applied, "mesh.wg=applied")
	rb, code := b.apply(overlayDecl(2))
	expect(t, rb, shapes.Applied, "mesh.wg=applied")
	if code != 0 || !strings.Contains(rb.Lines[0].Detail, "made the executor's WireGuard key") {
		t.Fatalf("exit %d %+v", code, rb.Lines)
	}
	pubs := map[*machine]string{}
	for _, m := range []*machine{a, b} {
		pubs[m] = m.sh("cat " + stateDir + "/wireguard.pub")
		// The key: root's, 0600, in the state directory; its public half
		// is what the interface has; the private one is in no report.
		if got := m.sh("stat -c '%U %a' " + stateDir + "/wireguard.key"); got != "root 600" {
			t.Fatalf("%s: key file %s", m.Name(), got)
		}
		if got := m.sh("wg show wg0 public-key"); got != pubs[m] {
			t.Fatalf("%s: wg0 has public key %q, wireguard.pub says %q", m.Name(), got, pubs[m])
		}
		priv := m.sh("cat " + stateDir + "/wireguard.key")
		if m.sh("wg show wg0 private-key") != priv {
			t.Fatalf("%s: wg0's private key is not the executor's", m.Name())
		}
		if strings.Contains(m.sh("cat /root/report.json 2>/dev/null; cat "+stateDir+"/*.json 2>/dev/null || true"), priv) {
			t.Fatalf("%s: the private key is in a report", m.Name())
		}
		if !kernelWG {
			// Userspace: run by systemd as its own unit, not the executor's
			// child (its parent is the lab's PID 1).
			if got := m.sh("systemctl is-active mesh-wg-wg0.service"); got != "active" {
				t.Fatalf("%s: mesh-wg-wg0.service %s", m.Name(), got)
			}
			pid := m.sh("systemctl show -p MainPID --value mesh-wg-wg0.service")
			if ppid := m.sh("ps -o ppid= -p " + pid); ppid != "1" {
				t.Fatalf("%s: wireguard-go (pid %s) has parent %s, not the init", m.Name(), pid, ppid)
			}
		}
	}
	if got := a.sh("ip -br addr show wg0"); !strings.Contains(got, "10.233.9.1/24") || !strings.Contains(got, "UP") && !strings.Contains(got, "UNKNOWN") {
		t.Fatalf("a: %s", got)
	}

	// Second pass: each names the other as its peer.
	declA, declB := overlayDecl(1, overlayPeer(pubs[b], 2)), overlayDecl(2, overlayPeer(pubs[a], 1))
	ra, _ := a.apply(declA)
	expect(t, ra, shapes.Applied, "mesh.wg=applied")
	rb, _ = b.apply(declB)
	expect(t, rb, shapes.Applied, "mesh.wg=applied")
	if !a.pings("10.233.9.2") || !b.pings("10.233.9.1") {
		t.Fatalf("no ping through the tunnel\na: %s\nb: %s", a.sh("wg show"), b.sh("wg show"))
	}
	if got := a.sh("wg show wg0 peers"); got != pubs[b] {
		t.Fatalf("a's peers: %q", got)
	}
	if got := a.sh("wg show wg0 endpoints"); got != pubs[b]+"\t10.231.9.2:51820" {
		t.Fatalf("a's endpoints: %q", got)
	}
	if a.sh("wg show wg0 persistent-keepalive") != pubs[b]+"\t5" || a.sh("wg show wg0 allowed-ips") != pubs[b]+"\t10.233.9.2/32" || a.sh("wg show wg0 listen-port") != "51820" {
		t.Fatalf("a: %s", a.sh("wg show wg0"))
	}
	ra, _ = a.apply(declA)
	expect(t, ra, shapes.Unchanged, "mesh.wg=unchanged")

	// The ping goes on while the executor comes and goes: killed with -9
	// mid-apply, run again as a service that ends (its cgroup emptied),
	// and run again by hand. Not a packet may be lost: the tunnel's
	// process is the init's, not the executor's.
	a.sh("rm -f /tmp/ping.log; setsid ping -i 0.2 -c 60 -W 1 10.233.9.2 >/tmp/ping.log 2>&1 </dev/null &")
	b.sh("(/usr/local/bin/mesh-executor apply --json /root/decl.json >/dev/null 2>&1 & p=$!; sleep 0.05; kill -9 $p) ; true")
	b.applyAsService(declB)
	rb, _ = b.apply(declB)
	expect(t, rb, shapes.Unchanged, "mesh.wg=unchanged")
	a.applyAsService(declA)
	if a.sh("grep -c 'packets transmitted' /tmp/ping.log || true") != "0" {
		t.Fatal("the ping ended before the executor's restarts did; it proves nothing")
	}
	a.sh("for i in $(seq 100); do grep -q 'packets transmitted' /tmp/ping.log && break; sleep 0.2; done")
	summary := a.sh("grep 'packets transmitted' /tmp/ping.log")
	if !strings.Contains(summary, "60 packets transmitted, 60 received") {
		t.Fatalf("the ping did not go on while the executor restarted: %s\n%s", summary, a.sh("cat /tmp/ping.log | tail -5"))
	}
	t.Logf("while the executor restarted: %s", summary)

	// Drift: the peer removed by hand, and the address; repaired.
	a.sh("wg set wg0 peer " + pubs[b] + " remove")
	if a.pings("10.233.9.2") {
		t.Fatal("a ping without the peer")
	}
	ra, _ = a.apply(declA)
	expect(t, ra, shapes.Repaired, "mesh.wg=repaired")
	if !strings.Contains(ra.Lines[0].Detail, "missing") || !a.pings("10.233.9.2") {
		t.Fatalf("not repaired: %+v", ra.Lines)
	}
	a.sh("ip addr del 10.233.9.1/24 dev wg0")
	ra, _ = a.apply(declA)
	expect(t, ra, shapes.Repaired, "mesh.wg=repaired")
	if !strings.Contains(a.sh("ip -br addr show wg0"), "10.233.9.1/24") || !a.pings("10.233.9.2") {
		t.Fatal("the address was not put back")
	}
	// The interface's process stopped by hand: brought up again.
	if !kernelWG {
		a.sh("systemctl stop mesh-wg-wg0.service")
		if a.sh("ip link show wg0 >/dev/null 2>&1 && echo yes || echo no") != "no" {
			t.Fatal("wg0 outlived its process")
		}
		ra, _ = a.apply(declA)
		expect(t, ra, shapes.Repaired, "mesh.wg=repaired")
		if !a.pings("10.233.9.2") || !b.pings("10.233.9.1") {
			t.Fatal("no ping after the interface was brought up again")
		}
	}

	// Undeclared: the interface is gone, its unit stopped, the ping fails.
	ra, _ = a.apply(decl())
	expect(t, ra, shapes.Removed, "mesh.wg=removed")
	if a.sh("ip link show wg0 >/dev/null 2>&1 && echo yes || echo no") != "no" {
		t.Fatal("wg0 is still there")
	}
	if !kernelWG && a.sh("systemctl is-active mesh-wg-wg0.service || true") == "active" {
		t.Fatal("mesh-wg-wg0.service still runs")
	}
	if b.pings("10.233.9.1") {
		t.Fatal("b still reaches a through the tunnel")
	}
	// The key stays: it is the node's.
	if a.sh("cat "+stateDir+"/wireguard.pub") != pubs[a] {
		t.Fatal("the key changed")
	}
	// An interface already gone by hand when it is undeclared: removed all
	// the same (nothing left to stop is not a failure).
	b.sh("ip link del wg0; for i in $(seq 50); do systemctl is-active -q mesh-wg-wg0.service || break; sleep 0.1; done")
	rb, code = b.apply(decl())
	expect(t, rb, shapes.Removed, "mesh.wg=removed")
	if code != 0 || b.sh("ip link show wg0 >/dev/null 2>&1 && echo yes || echo no") != "no" {
		t.Fatalf("exit %d %+v", code, rb.Lines)
	}
}

func jsonFile(m *machine, p string, v any) error {
	b, err := os.ReadFile(m.Path(p))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Without systemd (s6 here), wireguard-go is started in its own session and
// left to daemonise: the daemon is adopted by PID 1, never the executor's
// child, and undeclaring ends it.
func TestOverlayWithoutSystemd(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{Init: lab.S6})
	if m.sh("ip link add lpwgprobe type wireguard 2>/dev/null && ip link del lpwgprobe && echo yes || echo no") == "yes" {
		t.Skip("this kernel has WireGuard: the userspace path is not taken")
	}
	rep, code := m.apply(overlayDecl(1))
	expect(t, rep, shapes.Applied, "mesh.wg=applied")
	if code != 0 || !strings.Contains(rep.Lines[0].Detail, "in its own session") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	pid := m.sh("pgrep -x wireguard-go")
	if ppid := m.sh("ps -o ppid= -p " + pid); ppid != "1" {
		t.Fatalf("wireguard-go (pid %s) has parent %s, not PID 1", pid, ppid)
	}
	if m.sh("wg show wg0 public-key") != m.sh("cat "+stateDir+"/wireguard.pub") || !strings.Contains(m.sh("ip -br addr show wg0"), "10.233.9.1/24") {
		t.Fatal("wg0 is not as declared")
	}
	rep, _ = m.apply(overlayDecl(1))
	expect(t, rep, shapes.Unchanged, "mesh.wg=unchanged")
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Removed, "mesh.wg=removed")
	if m.sh("ip link show wg0 >/dev/null 2>&1 && echo yes || echo no") != "no" || m.sh("pgrep -x wireguard-go || echo none") != "none" {
		t.Fatal("wg0 or its process is still there")
	}
}
