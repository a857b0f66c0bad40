package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// The run's look at what the host made catches each way the mesh could
// get it wrong: a block or a rule left behind, one claimed and missing, a
// found block not given back, the host's lines or rules touched, a rule
// after the host's. Each is made by hand here, on a real network
// namespace, and the look must name it.
func TestTheLookAtWhatTheHostMadeCatchesEachFault(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("a network namespace takes root (make test runs as root)")
	}
	n := &node{name: "t1", tree: t.TempDir(), netns: fmt.Sprintf("chaostest%d", os.Getpid())}
	if out, err := exec.Command("ip", "netns", "add", n.netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", n.netns).Run() })
	if err := makeShared(n); err != nil {
		t.Fatal(err)
	}
	if err := setupFirewall(n); err != nil {
		t.Fatal(err)
	}
	w := &world{checks: map[string]int{}}
	claim := func(target, mod, id string) ownedEntry {
		o := ownedEntry{Target: target}
		o.Claims = append(o.Claims, struct {
			Source string `json:"source"`
			Module string `json:"module"`
			ID     string `json:"id"`
		}{"link", mod, id})
		return o
	}
	look := func(owned []ownedEntry, want ...string) {
		t.Helper()
		ps := w.hostMadeProblems(n, owned)
		var got []string
		for _, p := range ps {
			got = append(got, p.inv+": "+p.msg)
		}
		if len(want) == 0 && len(got) > 0 {
			t.Fatalf("found fault with a host as it was made: %q", got)
		}
		for _, x := range want {
			if !strings.Contains(strings.Join(got, "\n"), x) {
				t.Fatalf("the look did not say %q; it said %q", x, got)
			}
		}
		if len(want) > 0 && len(got) == 0 {
			t.Fatal("the look found nothing")
		}
	}
	look(nil)

	// The shared file.
	region := claim("region:"+n.shared()+"#a.reg", "a", "reg")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(n.shared(), []byte(s), hostConfMode); err != nil {
			t.Fatal(err)
		}
	}
	block := "# BEGIN mesh a.reg\nchaos-region a.reg v1\n# END mesh a.reg\n"
	write(hostConf + block)
	look(nil, "host-file-kept: the block a.reg", "one no store claims")
	look([]ownedEntry{region})
	write(hostConf)
	look([]ownedEntry{region}, "claims the region a.reg", "which the file does not hold")
	// A claim pending (a change begun and not recorded: the apply failed
	// at it) may be held or not.
	pend := region
	pend.Pending = true
	look([]ownedEntry{pend})
	write(hostConf + block)
	look([]ownedEntry{pend})
	write(hostConf)
	write(strings.Replace(hostConf, foundBlock, "the mesh's now\n", 1))
	look(nil, "the block a person wrote (c.reg)", "not given back as found")
	write(strings.Replace(hostConf, "host-setting = 2", "host-setting = 3", 1))
	look(nil, "outside the mesh's blocks is not as the host wrote it")
	write(strings.Replace(hostConf, "# END mesh c.reg\n", "", 1))
	look(nil, "the block c.reg does not end")
	write(hostConf)
	os.Chmod(n.shared(), 0o644)
	look(nil, "of mode 0644")
	os.Chmod(n.shared(), hostConfMode)
	look(nil)

	// The environment file.
	keysOf := func(mod string) ownedEntry { return claim("keys:"+n.sharedEnv()+"#"+mod+".keys", mod, "keys") }
	env := func(s string) {
		t.Helper()
		if err := os.WriteFile(n.sharedEnv(), []byte(s), hostConfMode); err != nil {
			t.Fatal(err)
		}
	}
	env(hostEnv + "mod_a = a-v1\n")
	look(nil, "no store claims keys of")
	look([]ownedEntry{keysOf("b")}, `holds "mod_a = a-v1\n", which no store's keys set`, "claims b.keys", "holds no mod_b")
	look([]ownedEntry{keysOf("a")})
	env(hostEnv)
	look([]ownedEntry{keysOf("a")}, "holds no mod_a")
	found := strings.Replace(hostEnv, "host_c = found", "host_c = c-v2", 1)
	env(found + "mod_c=c-v2\n")
	look([]ownedEntry{keysOf("c")})
	look([]ownedEntry{keysOf("a"), keysOf("c")}, "holds no mod_a")
	env(found + "mod_a=a-v0\n")
	look([]ownedEntry{keysOf("a")}, "a found value not given back where it stands")
	env(strings.Replace(hostEnv, "HOST_A=1", "HOST_A=2", 1) + "mod_a=a-v0\n")
	look([]ownedEntry{keysOf("a")}, "a line of the host's changed")
	env(hostEnv)
	look(nil)

	// The overlay: an interface claimed and absent, down, or with no
	// WireGuard answering on its socket (the node's /run/wireguard).
	n.wg = t.TempDir()
	ov := claim("overlay:chaos0", "mesh", "overlay")
	look([]ownedEntry{ov}, "overlay-kept: t1's store claims the overlay chaos0: no such interface")
	if out, err := exec.Command("ip", "-n", n.netns, "tuntap", "add", "dev", "chaos0", "mode", "tun").CombinedOutput(); err != nil {
		t.Fatalf("ip tuntap add: %v %s", err, out)
	}
	look([]ownedEntry{ov}, "the interface is down")
	if out, err := exec.Command("ip", "-n", n.netns, "link", "set", "chaos0", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set up: %v %s", err, out)
	}
	look([]ownedEntry{ov}, "no WireGuard answers on its socket")
	ln, err := net.Listen("unix", filepath.Join(n.wg, "chaos0.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var answer atomic.Value
	answer.Store("listen_port=51820\nerrno=0\n\n")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			for l, err := r.ReadString('\n'); err == nil && l != "\n"; l, err = r.ReadString('\n') {
			}
			c.Write([]byte(answer.Load().(string)))
			// Held open, as WireGuard holds it for another request.
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	look([]ownedEntry{ov})
	answer.Store("errno=22\n\n")
	look([]ownedEntry{ov}, `its WireGuard answered ["errno=22"]`)

	// The firewall: an opening from anywhere on input is one rule in the
	// inet input chain and one in the ip one (not the ip6 forward chain,
	// nor the nat chain).
	opening := claim("opening:incoming/10001/tcp/", "a", "open")
	look([]ownedEntry{opening}, "holds no rule of it", "inet host input", "ip hostv4 input")
	c, done, err := nftIn(n)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	chainNamed := func(family nftables.TableFamily, table, name string) *nftables.Chain {
		for _, ch := range chains {
			if ch.Table.Family == family && ch.Table.Name == table && ch.Name == name {
				return ch
			}
		}
		t.Fatalf("no chain %s %s", table, name)
		return nil
	}
	rule := func(ch *nftables.Chain, comment string, first bool) {
		t.Helper()
		r := &nftables.Rule{Table: ch.Table, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
			Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}}
		if first {
			c.InsertRule(r)
		} else {
			c.AddRule(r)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	in := chainNamed(nftables.TableFamilyINet, "host", "input")
	in4 := chainNamed(nftables.TableFamilyIPv4, "hostv4", "input")
	rule(in, "nox-mesh-host a.open", true)
	look(nil, "host-firewall-kept: inet host input holds the rule \"nox-mesh-host a.open\", which no store claims")
	look([]ownedEntry{opening}, "ip hostv4 input holds no rule of it")
	rule(in4, "nox-mesh-host a.open", false)
	look([]ownedEntry{opening}, "after a rule of the host's")
	rule(in, "nox-mesh-host a.open", true)
	look([]ownedEntry{opening}, "holds the rule \"nox-mesh-host a.open\" twice")

	// The snapshot holds each rule as a path: the host's never change,
	// the mesh's are the mesh's to change.
	snap, err := snapshotNode(n)
	if err != nil {
		t.Fatal(err)
	}
	host, mesh := 0, 0
	for p := range snap {
		switch {
		case !strings.HasPrefix(p, "nft:"):
		case meshMade(n, p):
			mesh++
			if !hostMadeAt(n, p, "a", "open") || hostMadeAt(n, p, "b", "open") {
				t.Fatalf("%s is not a.open's alone", p)
			}
		default:
			host++
		}
	}
	if host != 5 || mesh != 3 {
		t.Fatalf("the snapshot holds %d rules of the host's and %d of the mesh's, want 5 and 3: %v", host, mesh, snap)
	}
	said := []line{{Module: "a", ID: "open", Outcome: "applied"}}
	if msg := unexplained(n, "nft:inet host input/nox-mesh-host a.open", "created", said); msg != "" {
		t.Errorf("a rule its opening's line says: %s", msg)
	}
	if msg := unexplained(n, "nft:inet host input/nox-mesh-host b.open", "created", said); msg == "" {
		t.Error("a rule of another opening passed")
	}
	if msg := unexplained(n, "nft:inet host input/host's own: ssh", "changed", said); !strings.Contains(msg, "nothing declares it") {
		t.Errorf("a rule of the host's changed: %q", msg)
	}
	if msg := unexplained(n, n.shared(), "changed", []line{{Module: "a", ID: "reg", Outcome: "unchanged"}}); msg == "" {
		t.Error("the shared file changed with only an unchanged line passed")
	}
	if !meshMade(n, n.shared()) || !hostMadeAt(n, n.shared(), "b", "reg") || hostMadeAt(n, n.shared(), "b", "keys") ||
		!hostMadeAt(n, n.sharedEnv(), "b", "keys") || meshMade(n, filepath.Join(n.tree, "found", "notes")) {
		t.Fatal("the shared file is not the regions' alone, or the environment file the keys'")
	}
}
