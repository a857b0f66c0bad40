package firewall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

func spec(t *testing.T, path, proto string, port int, from string) Spec {
	t.Helper()
	s, err := ParseSpec(path, proto, port, from)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseSpec(t *testing.T) {
	for _, c := range []struct {
		path, proto string
		port        int
		from, want  string
		bad         bool
	}{
		{"incoming", "tcp", 8080, "", "tcp 8080 from anywhere (incoming)", false},
		{"forwarded", "udp", 53, "10.1.2.3", "udp 53 from 10.1.2.3/32 (forwarded)", false},
		{"incoming", "tcp", 22, "10.1.2.3/16", "tcp 22 from 10.1.0.0/16 (incoming)", false}, // masked
		{"incoming", "tcp", 22, "fd00::1/64", "tcp 22 from fd00::/64 (incoming)", false},
		{"outgoing", "tcp", 22, "", "", true},
		{"incoming", "icmp", 22, "", "", true},
		{"incoming", "tcp", 0, "", "", true},
		{"incoming", "tcp", 65536, "", "", true},
		{"incoming", "tcp", 22, "example.org", "", true},
	} {
		s, err := ParseSpec(c.path, c.proto, c.port, c.from)
		if (err != nil) != c.bad || (!c.bad && s.String() != c.want) {
			t.Errorf("%+v: got %q, %v", c, s, err)
		}
	}
}

func TestSees(t *testing.T) {
	for _, c := range []struct {
		from          string
		inet, ip, ip6 bool
	}{
		{"", true, true, true},
		{"10.0.0.0/8", true, true, false},
		{"fd00::/8", true, false, true},
	} {
		s := spec(t, "incoming", "tcp", 1, c.from)
		got := [3]bool{s.sees(nftables.TableFamilyINet), s.sees(nftables.TableFamilyIPv4), s.sees(nftables.TableFamilyIPv6)}
		if got != [3]bool{c.inet, c.ip, c.ip6} || s.sees(nftables.TableFamilyBridge) {
			t.Errorf("%q: %v", c.from, got)
		}
	}
}

// The rule built for each kind of opening, as nft would print it.
func TestExprs(t *testing.T) {
	show := func(es []expr.Any) string {
		var s []string
		for _, e := range es {
			switch e := e.(type) {
			case *expr.Meta:
				s = append(s, fmt.Sprintf("meta%d", e.Key))
			case *expr.Cmp:
				s = append(s, fmt.Sprintf("==%x", e.Data))
			case *expr.Payload:
				s = append(s, fmt.Sprintf("payload%d@%d/%d", e.Base, e.Offset, e.Len))
			case *expr.Bitwise:
				s = append(s, fmt.Sprintf("&%x", e.Mask))
			case *expr.Verdict:
				s = append(s, "accept")
			}
		}
		return strings.Join(s, " ")
	}
	tail := "meta16 ==06 payload2@2/2 ==1f90 accept" // l4proto tcp, th dport 8080
	for _, c := range []struct {
		fam  nftables.TableFamily
		from string
		want string
	}{
		{nftables.TableFamilyINet, "", tail},
		{nftables.TableFamilyIPv4, "", tail},
		{nftables.TableFamilyINet, "10.231.1.0/24", "meta15 ==02 payload1@12/4 &ffffff00 ==0ae70100 " + tail},
		{nftables.TableFamilyIPv4, "10.231.1.0/24", "payload1@12/4 &ffffff00 ==0ae70100 " + tail},
		{nftables.TableFamilyIPv4, "10.231.1.7", "payload1@12/4 ==0ae70107 " + tail},
		{nftables.TableFamilyINet, "fd00::/16", "meta15 ==0a payload1@8/16 &ffff0000000000000000000000000000 ==fd000000000000000000000000000000 " + tail},
	} {
		if got := show(Exprs(c.fam, spec(t, "incoming", "tcp", 8080, c.from))); got != c.want {
			t.Errorf("%d %q:\n got %s\nwant %s", c.fam, c.from, got, c.want)
		}
	}
	udp := show(Exprs(nftables.TableFamilyINet, spec(t, "incoming", "udp", 53, "")))
	if udp != "meta16 ==11 payload2@2/2 ==0035 accept" {
		t.Errorf("udp: %s", udp)
	}
}

func TestSameExprs(t *testing.T) {
	a := Exprs(nftables.TableFamilyINet, spec(t, "incoming", "tcp", 8080, "10.0.0.0/8"))
	for _, c := range []struct {
		other []expr.Any
		same  bool
	}{
		{Exprs(nftables.TableFamilyINet, spec(t, "incoming", "tcp", 8080, "10.0.0.0/8")), true},
		{Exprs(nftables.TableFamilyINet, spec(t, "incoming", "tcp", 8081, "10.0.0.0/8")), false},
		{Exprs(nftables.TableFamilyINet, spec(t, "incoming", "udp", 8080, "10.0.0.0/8")), false},
		{Exprs(nftables.TableFamilyINet, spec(t, "incoming", "tcp", 8080, "10.0.0.0/16")), false},
		{Exprs(nftables.TableFamilyINet, spec(t, "incoming", "tcp", 8080, "")), false},
		{Exprs(nftables.TableFamilyIPv4, spec(t, "incoming", "tcp", 8080, "10.0.0.0/8")), false},
	} {
		if SameExprs(a, c.other) != c.same {
			t.Errorf("SameExprs(%v) != %v", c.other, c.same)
		}
	}
}

func TestIptables(t *testing.T) {
	s := spec(t, "incoming", "tcp", 8080, "10.231.1.0/24")
	if got := strings.Join(IptablesArgs(s, "nox-mesh-host web.http"), " "); got != "-s 10.231.1.0/24 -p tcp -m tcp --dport 8080 -m comment --comment nox-mesh-host web.http -j ACCEPT" {
		t.Errorf("args: %s", got)
	}
	listing := `-P INPUT DROP
-A INPUT -s 10.231.1.0/24 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-host web.http" -j ACCEPT
-A INPUT -s 10.231.1.0/24 -p tcp -m tcp --dport 8080 -m comment --comment "operator's own" -j ACCEPT
-A INPUT -s 10.231.1.0/24 -p tcp -m tcp --dport 8080 -j ACCEPT
-A INPUT -s 10.231.2.0/24 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-host web.http" -j ACCEPT
-A INPUT -s 10.231.1.0/24 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-hostile x" -j ACCEPT
`
	got := MeshLines(listing, "INPUT", s)
	if fmt.Sprint(got) != "[nox-mesh-host web.http]" {
		t.Errorf("mesh lines: %q", got)
	}
	if len(MeshLines(listing, "FORWARD", s)) != 0 {
		t.Error("a line of another chain was taken")
	}
	host := spec(t, "incoming", "udp", 53, "10.0.0.1")
	if l := IptablesLine("INPUT", host, "nox-mesh-host a.b"); l != `-A INPUT -s 10.0.0.1/32 -p udp -m udp --dport 53 -m comment --comment "nox-mesh-host a.b" -j ACCEPT` {
		t.Errorf("line: %s", l)
	}
}

func TestComment(t *testing.T) {
	if c := Comment("web.http"); c != "nox-mesh-host web.http" || !isMesh(c) {
		t.Error(c)
	}
	if c := Comment(strings.Repeat("m", 64) + "." + strings.Repeat("i", 64)); len(c) != maxComment || !isMesh(c) {
		t.Error(len(c))
	}
	for _, c := range []string{"", "nox-mesh-hostile", "operator nox-mesh-host x"} {
		if isMesh(c) {
			t.Errorf("%q taken for the mesh's", c)
		}
	}
}

// stub answers firewall-cmd, ufw and iptables-legacy-save as told.
func stub(answers map[string]string) Runner {
	return func(ctx context.Context, argv ...string) (string, int, error) {
		out, ok := answers[argv[0]]
		if !ok {
			return "", -1, fmt.Errorf("%s: %w", argv[0], command.ErrNotFound)
		}
		return out, 0, nil
	}
}

// firewalld and ufw cannot run here: their refusal is proved against stubs
// of their own status commands.
func TestFrontEndsRefused(t *testing.T) {
	for _, c := range []struct {
		answers map[string]string
		want    string
	}{
		{map[string]string{"firewall-cmd": "running\n"}, "firewalld is running: an opening through it is not built; refused rather than half-done"},
		{map[string]string{"firewall-cmd": "not running\n", "ufw": "Status: active\n\nTo Action From\n"}, "ufw is active: an opening through it is not built"},
		{map[string]string{"iptables-legacy-save": "*filter\n:INPUT DROP [0:0]\nCOMMIT\n"}, "iptables-legacy has rules loaded"},
		{map[string]string{"iptables-legacy-save": "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\nCOMMIT\n"}, "iptables-legacy has rules loaded"},
		{map[string]string{"iptables-legacy-save": "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", "ufw": "Status: inactive\n"}, ""},
		{map[string]string{}, ""},
	} {
		err := frontEnds(context.Background(), stub(c.answers))
		var ref *Refused
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: refused: %v", c.answers, err)
		case c.want != "" && (!errors.As(err, &ref) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %q", c.answers, err, c.want)
		}
	}
}

// ---- in a bare network namespace, against the kernel.

// bareNetns makes a network namespace of the test's own and returns an nft
// reading it, and a function running nft in it.
func bareNetns(t *testing.T) (*nft, func(string) string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (make test runs as root)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("nft is not installed (tests/install-deps.sh installs it)")
	}
	name := fmt.Sprintf("fwtest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ns, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	in := func(ctx context.Context, argv ...string) (string, int, error) {
		return Run(ctx, append([]string{"ip", "netns", "exec", name}, argv...)...)
	}
	n, err := open(in, nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	sh := func(cmd string) string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", name, "sh", "-c", cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return string(out)
	}
	return n, sh
}

const found = `table inet filter {
	chain input {
		type filter hook input priority 0; policy drop;
		ct state established,related accept
		tcp dport 22 accept comment "operator ssh"
	}
	chain forward { type filter hook forward priority 0; policy drop; }
}
table ip other {
	chain in { type filter hook input priority 10; policy accept; reject; }
}
table ip6 v6only {
	chain in { type filter hook input priority 10; policy drop; }
}
`

// The mesh's rule goes at the top of every base chain on the hook that sees
// the traffic, is read back from the kernel's listing, and goes again; the
// operator's rules are left exactly as they were.
func TestNftablesInABareNetns(t *testing.T) {
	n, sh := bareNetns(t)
	ctx := context.Background()
	sh("nft -f - <<'EOF'\n" + found + "EOF")
	before := sh("nft list ruleset")

	s := spec(t, "incoming", "tcp", 8080, "10.231.1.0/24")
	st, err := n.Observe(ctx, s)
	if err != nil || len(st.Open) != 0 || Chains(st.Missing) != "inet filter input, ip other in" {
		t.Fatalf("%+v %v", st, err)
	}
	if err := n.Open(ctx, s, Comment("web.http"), st.Missing); err != nil {
		t.Fatal(err)
	}
	st, err = n.Observe(ctx, s)
	if err != nil || len(st.Missing) != 0 || Chains(st.Open) != "inet filter input, ip other in" {
		t.Fatalf("%+v %v", st, err)
	}
	listed := sh("nft list chain inet filter input")
	if !strings.Contains(listed, `policy drop;
		ip saddr 10.231.1.0/24 tcp dport 8080 accept comment "nox-mesh-host web.http"`) {
		t.Fatalf("not first, or not as built:\n%s", listed)
	}
	if !strings.Contains(sh("nft list chain ip other in"), `ip saddr 10.231.1.0/24 tcp dport 8080 accept comment "nox-mesh-host web.http"`) {
		t.Fatal(sh("nft list ruleset"))
	}
	// Another spec is not this one: the forwarded path, another port.
	if st, _ := n.Observe(ctx, spec(t, "incoming", "tcp", 8081, "10.231.1.0/24")); len(st.Open) != 0 {
		t.Fatalf("port 8081 read as open: %+v", st)
	}
	if st, _ := n.Observe(ctx, spec(t, "forwarded", "tcp", 8080, "")); Chains(st.Missing) != "inet filter forward" {
		t.Fatalf("forwarded: %+v", st)
	}
	// An operator's rule identical to the mesh's but unmarked, and one
	// marked otherwise, are never read as the mesh's or removed.
	sh(`nft insert rule inet filter input ip saddr 10.231.1.0/24 tcp dport 8080 accept comment '"operator twin"'`)
	from, err := n.Close(ctx, s)
	if err != nil || Chains(from) != "inet filter input, ip other in" {
		t.Fatalf("%v %v", from, err)
	}
	after := sh("nft list ruleset")
	if !strings.Contains(after, `comment "operator twin"`) || strings.Contains(after, "nox-mesh-host") {
		t.Fatalf("%s", after)
	}
	sh(`nft delete rule inet filter input handle $(nft -a list chain inet filter input | sed -n 's/.*"operator twin" # handle //p')`)
	if got := sh("nft list ruleset"); got != before {
		t.Fatalf("the operator's ruleset changed:\n%s\nwas\n%s", got, before)
	}
}

// iptables-nft's chains are written with its own tool and read back from its
// own -S listing.
func TestIptablesNftInABareNetns(t *testing.T) {
	n, sh := bareNetns(t)
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Fatal("iptables-nft is not installed (tests/install-deps.sh installs it)")
	}
	ctx := context.Background()
	sh("iptables-nft -P INPUT DROP && iptables-nft -A INPUT -p tcp --dport 22 -m comment --comment 'operator ssh' -j ACCEPT")
	before := sh("iptables-nft -S")
	s := spec(t, "incoming", "tcp", 8080, "10.231.1.5")
	st, err := n.Observe(ctx, s)
	if err != nil || Chains(st.Missing) != "ip filter INPUT (iptables-nft)" {
		t.Fatalf("%+v %v", st, err)
	}
	if err := n.Open(ctx, s, Comment("web.http"), st.Missing); err != nil {
		t.Fatal(err)
	}
	if got := sh("iptables-nft -S INPUT"); !strings.Contains(got, "-P INPUT DROP\n"+`-A INPUT -s 10.231.1.5/32 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-host web.http" -j ACCEPT`) {
		t.Fatalf("not first:\n%s", got)
	}
	if st, err := n.Observe(ctx, s); err != nil || len(st.Missing) != 0 {
		t.Fatalf("%+v %v", st, err)
	}
	if from, err := n.Close(ctx, s); err != nil || len(from) != 1 {
		t.Fatalf("%v %v", from, err)
	}
	if got := sh("iptables-nft -S"); got != before {
		t.Fatalf("the operator's rules changed:\n%s\nwas\n%s", got, before)
	}
}
