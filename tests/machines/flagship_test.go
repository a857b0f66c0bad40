package machines

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The flagship: a mesh born from one machine, and its second node, on two
// systemd labs joined by a veth, with the real .deb, apt, launcher, broker,
// WireGuard (wireguard-go under systemd) and systemd:
//
//  1. A installs the .deb; `mesh-executor reconcile` applies the carried
//     bundle the package ships (packaging/foundation.lock, its digest
//     pinned in the executor), which raises the control side as a service
//     from the package's own mesh-control and unit;
//  2. a token from it, and `enrol` on the same machine: node one walks the
//     ordinary path, and its first link declaration (the overlay) leaves
//     the bundle's work in place;
//  3. B installs the .deb and enrols with a token from A;
//  4. both get the overlay first, then a module with a file and a service;
//     they ping each other through the overlay; B renews its keys
//     (mesh-executor rekey) and the overlay carries on with its new one;
//  5. both are upgraded through a declaration; B is then declared a
//     release that crash-loops, and rolls back through apt; B is retired.
func TestMeshBornFromOneMachine(t *testing.T) {
	v1, v2, v3, _ := hostReleases(t)

	A := &machine{Machine: lab.Boot(t, lab.Options{Init: lab.Systemd, Name: "mesh-a"}), t: t}
	B := &machine{Machine: lab.Boot(t, lab.Options{Init: lab.Systemd, Name: "mesh-b"}), t: t}
	for _, m := range []*machine{A, B} {
		m := m
		t.Cleanup(func() {
			if t.Failed() {
				out, _, _ := m.Run(context.Background(), "/bin/sh", "-c",
					"journalctl --no-pager -n 50 -u mesh-agent -u mesh-control -o cat 2>&1; journalctl --no-pager -n 50 -u mesh-executor -o cat 2>&1")
				t.Logf("%s says:\n%s", m.Name(), out)
			}
		})
	}
	lab.Link(t, A.Machine, B.Machine, "10.231.7.1/24", "10.231.7.2/24")
	for _, m := range []*machine{A, B} {
		m.serveRepo(v1, v2, v3)
		m.sh("apt-get install -y -qq nox-mesh-host=0.9.1-1 >/dev/null 2>&1 || apt-get install -y nox-mesh-host=0.9.1-1")
		untilTrue(t, 20*time.Second, m.Name()+": the host runs", func() bool {
			return m.sh("systemctl is-active mesh-executor mesh-agent | sort -u") == "active"
		})
	}

	// 1. The carried bundle raises the control side on A.
	if out := A.sh("mesh-executor reconcile 2>&1; echo exit $?"); !strings.HasSuffix(out, "exit 0") {
		t.Fatalf("mesh-executor reconcile:\n%s", out)
	}
	const ctl = "--dir /var/lib/mesh-control"
	untilTrue(t, 30*time.Second, "the control side serves", func() bool {
		return A.sh("mesh-control nodes "+ctl+" >/dev/null 2>&1 && echo ok || true") == "ok"
	})
	A.sh("mesh-control overlay set --network 10.99.7.0/24 " + ctl)

	// 2. and 3. Node one, then node two, each with its own token.
	for _, n := range []struct {
		m    *machine
		name string
	}{{A, "a"}, {B, "b"}} {
		// The broker as the node reaches it, over the underlay.
		token := A.sh("mesh-control token issue --new --name " + n.name + " --broker-url tls://10.231.7.1:4222 " + ctl + " 2>/dev/null")
		if err := n.m.WriteFile("/root/token", []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := n.m.sh("mesh-executor enrol --token-file /root/token --wait 60s 2>&1 || true"); !strings.Contains(out, "enrolled as node "+n.name) {
			t.Fatalf("%s: enrol: %s", n.name, out)
		}
		A.sh(fmt.Sprintf("mesh-control node endpoint %s 10.231.7.%d:51820 %s", n.name, map[string]int{"a": 1, "b": 2}[n.name], ctl))
	}
	type nodeState struct {
		Name            string `json:"name"`
		ExecutorVersion string `json:"executor_version"`
		Address         string `json:"overlay_address"`
		Assignments     string `json:"assignments"`
		LastOutcome     string `json:"last_outcome"`
		Heartbeat       *struct {
			AgentVersion string `json:"agent_version"`
		}
	}
	nodes := func() map[string]nodeState {
		var ns []nodeState
		json.Unmarshal([]byte(A.sh("mesh-control nodes --json "+ctl+" 2>/dev/null || true")), &ns)
		out := map[string]nodeState{}
		for _, n := range ns {
			out[n.Name] = n
		}
		return out
	}

	// 4. The overlay first, and nothing else: then they ping through it.
	var addr = map[string]string{}
	untilTrue(t, 90*time.Second, "both nodes have the overlay up", func() bool {
		ns := nodes()
		for _, n := range []string{"a", "b"} {
			a := strings.Split(ns[n].Address, "/")[0]
			if a == "" {
				return false
			}
			addr[n] = a
		}
		return A.sh("ip -br addr show mesh0 2>/dev/null || true") != "" && B.sh("ip -br addr show mesh0 2>/dev/null || true") != ""
	})
	// Each node's first applied declaration was the overlay alone.
	for _, n := range []string{"a", "b"} {
		var rs struct {
			Reports []struct {
				Seq     uint64 `json:"seq"`
				Outcome string `json:"outcome"`
				Trigger string `json:"trigger"`
				Lines   []struct {
					Module string `json:"module"`
					ID     string `json:"id"`
				} `json:"lines"`
			} `json:"reports"`
		}
		json.Unmarshal([]byte(A.sh("mesh-control reports "+n+" --json --last 100 "+ctl)), &rs)
		first := -1
		for i, r := range rs.Reports {
			if r.Trigger == "declaration" && r.Outcome != "superseded" && r.Outcome != "refused" {
				first = i
				break
			}
		}
		if first < 0 || len(rs.Reports[first].Lines) != 1 || rs.Reports[first].Lines[0].Module != "mesh" || rs.Reports[first].Lines[0].ID != "overlay" {
			t.Fatalf("%s: the first declaration applied was not the overlay alone: %+v", n, rs.Reports)
		}
	}
	untilTrue(t, 60*time.Second, "a pings b through the overlay", func() bool { return A.pings(addr["b"]) })
	untilTrue(t, 60*time.Second, "b pings a through the overlay", func() bool { return B.pings(addr["a"]) })
	// The overlay, node one's first link declaration, left the bundle's
	// work be: the control side still runs, owned by the bundle.
	if A.sh("systemctl is-active mesh-control") != "active" || !strings.Contains(A.sh("mesh-executor owned"), "bundle:control.serve") {
		t.Fatalf("the bundle's work after the overlay:\n%s", A.sh("mesh-executor owned"))
	}

	// Then a module with a file and a service, on both.
	site := `{"version":1,"resources":[
 {"module":"site","id":"conf","type":"file","path":"/etc/lp-site.conf","content":"greeting=hello\n"},
 {"module":"site","id":"unit","type":"file","path":"/etc/systemd/system/lp-site.service","content":"[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n"},
 {"module":"site","id":"svc","type":"service","unit":"lp-site.service","enabled":true,"state":"running","restart_on":["conf"]}]}`
	A.WriteFile("/root/site.json", []byte(site), 0o600)
	for _, n := range []string{"a", "b"} {
		A.sh("mesh-control assign " + n + " /root/site.json " + ctl)
	}
	for _, m := range []*machine{A, B} {
		untilTrue(t, 60*time.Second, m.Name()+": the module applied", func() bool {
			return m.sh("systemctl is-active lp-site 2>/dev/null || true") == "active" && m.sh("cat /etc/lp-site.conf 2>/dev/null || true") == "greeting=hello"
		})
	}

	// B renews its keys over the link: its WireGuard key too, which A's
	// overlay takes from the roster; they ping through the overlay again,
	// and B's module is not taken away by its new enrolment.
	wgWas := B.sh("cat /var/lib/mesh-host/executor/wireguard.pub")
	if out := B.sh("mesh-executor rekey --wait 90s 2>&1 || true"); !strings.Contains(out, "rekeyed: enrolled as node b") || !strings.Contains(out, "replacing node b") {
		t.Fatalf("b: rekey: %s", out)
	}
	wgNow := B.sh("cat /var/lib/mesh-host/executor/wireguard.pub")
	if wgNow == wgWas {
		t.Fatal("b's WireGuard key is the one before the rekey")
	}
	untilTrue(t, 90*time.Second, "b's new WireGuard key on its interface and in a's peers", func() bool {
		return B.sh("wg show mesh0 public-key 2>/dev/null || true") == wgNow && strings.Contains(A.sh("wg show mesh0 peers 2>/dev/null || true"), wgNow)
	})
	untilTrue(t, 60*time.Second, "a pings b through the overlay after b's rekey", func() bool { return A.pings(addr["b"]) })
	untilTrue(t, 60*time.Second, "b pings a through the overlay after its rekey", func() bool { return B.pings(addr["a"]) })
	if B.sh("systemctl is-active lp-site 2>/dev/null || true") != "active" || B.sh("cat /etc/lp-site.conf 2>/dev/null || true") != "greeting=hello" {
		t.Fatal("b's module after its rekey:\n" + B.sh("mesh-executor owned"))
	}

	// 5. Upgrade both through a declaration.
	A.WriteFile("/root/host.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.2-1"}]}`), 0o600)
	for _, n := range []string{"a", "b"} {
		A.sh("mesh-control assign " + n + " /root/host.json " + ctl)
	}
	untilTrue(t, 120*time.Second, "both report 0.9.2 running, executor and agent", func() bool {
		ns := nodes()
		for _, n := range []string{"a", "b"} {
			if ns[n].ExecutorVersion != "0.9.2" || ns[n].Heartbeat == nil || ns[n].Heartbeat.AgentVersion != "0.9.2" {
				return false
			}
		}
		return true
	})
	if !A.pings(addr["b"]) {
		t.Fatal("the overlay did not survive the upgrade")
	}
	// 0.9.2 is known good on B once both halves ran (its agent stayed up).
	untilTrue(t, 90*time.Second, "b holds 0.9.2 as known-good", func() bool {
		return B.sh("/var/lib/mesh-host/executor/known-good/mesh-executor version 2>/dev/null || true") == "0.9.2"
	})
	// B is declared a release that crash-loops: rolled back once, through
	// apt, and it says why it does not install that release again.
	A.WriteFile("/root/broken.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.3-1"}]}`), 0o600)
	A.sh("mesh-control assign b /root/broken.json " + ctl)
	untilTrue(t, 180*time.Second, "b rolled back to 0.9.2-1 through apt", func() bool {
		return B.sh("dpkg-query -W -f='${db:Status-Status} ${Version}' nox-mesh-host") == "installed 0.9.2-1" &&
			strings.Contains(B.sh("journalctl --no-pager -u mesh-executor -o cat | grep -c 'crash-looped at start and the launcher rolled it back' || true"), "1")
	})
	untilTrue(t, 60*time.Second, "b runs 0.9.2 again", func() bool { return nodes()["b"].ExecutorVersion == "0.9.2" })
	if !A.pings(addr["b"]) {
		t.Fatal("the overlay did not survive the rollback")
	}

	// Retire B: what it holds is removed, and it is hosted again.
	A.WriteFile("/root/retire.json", []byte(`{"version":1,"owns_nothing":true,"retire":true,"resources":[]}`), 0o600)
	A.sh("mesh-control declare b /root/retire.json " + ctl + " --despite-briefing")
	untilTrue(t, 60*time.Second, "b hosted again", func() bool {
		return strings.HasPrefix(B.sh("mesh-executor status"), "state: hosted")
	})
	if B.sh("test -e /etc/lp-site.conf && echo yes || echo no") != "no" || B.sh("systemctl is-active lp-site || true") == "active" {
		t.Fatal("retiring b left the module's work")
	}
	if B.sh("ip link show mesh0 >/dev/null 2>&1 && echo yes || echo no") != "no" {
		t.Fatal("retiring b left its overlay interface")
	}
	// A goes on: its module, its control side.
	if A.sh("systemctl is-active lp-site mesh-control | sort -u") != "active" {
		t.Fatal("retiring b disturbed a")
	}
}
