package machines

import (
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// foundRuleset is a distribution's firewall as an operator left it: input
// dropped by default, ssh let in, and a table of the operator's own.
const foundRuleset = `table inet filter {
	chain input {
		type filter hook input priority 0; policy drop;
		ct state established,related accept
		iif "lo" accept
		tcp dport 22 accept comment "operator ssh"
	}
	chain forward {
		type filter hook forward priority 0; policy drop;
	}
}
table ip operator {
	chain input {
		type filter hook input priority 10; policy accept;
		tcp dport 9999 drop comment "operator's own"
	}
}
`

// The opening shape against the real firewall of a lab: a found nftables
// ruleset whose input policy is drop, a TCP listener in the lab (systemd
// socket activation, Accept=yes), and a second lab linked to it that tries
// to connect. Proved from outside the executor: the connection itself,
// and nft's / iptables' own listings.
func TestOpeningThroughTheFoundFirewall(t *testing.T) {
	srv := boot(t, lab.Options{Name: "open-srv", Seed: map[string]string{
		"/etc/systemd/system/lp-echo.socket":   "[Socket]\nListenStream=8080\nAccept=yes\n",
		"/etc/systemd/system/lp-echo@.service": "[Service]\nExecStart=/bin/echo hello\nStandardInput=socket\nStandardOutput=socket\n",
		"/root/fw.nft":                         foundRuleset,
	}})
	cli := boot(t, lab.Options{Name: "open-cli", Init: lab.S6})
	lab.Link(t, srv.Machine, cli.Machine, "10.231.7.1/24", "10.231.7.2/24")
	srv.sh("systemctl start lp-echo.socket")
	connects := func() bool {
		t.Helper()
		out := cli.sh("timeout 2 bash -c 'exec 3<>/dev/tcp/10.231.7.1/8080 && cat <&3' 2>/dev/null || true")
		return out == "hello"
	}
	if !connects() {
		t.Fatal("the listener does not answer before the firewall is loaded")
	}
	srv.sh("nft -f /root/fw.nft")
	if connects() {
		t.Fatal("reachable through the found policy drop")
	}
	operator := srv.sh("nft list ruleset")

	open := func(from string) string {
		return `{"module":"web","id":"http","type":"opening","port":8080,"protocol":"tcp","from":"` + from + `","path":"incoming"}`
	}
	// plan says what it would add, and adds nothing.
	rep, _ := srv.apply(decl(open("10.231.7.0/24")), "plan")
	if outcomes(rep) != "web.http=applied" || !strings.Contains(rep.Lines[0].Detail, "would add an accept rule for tcp 8080 from 10.231.7.0/24 (incoming) in inet filter input, ip operator input") || connects() {
		t.Fatalf("plan: %+v", rep.Lines)
	}
	rep, code := srv.apply(decl(open("10.231.7.0/24")))
	expect(t, rep, shapes.Applied, "web.http=applied")
	if code != 0 || !connects() {
		t.Fatalf("not reachable after the opening: %+v\n%s", rep, srv.sh("nft list ruleset"))
	}
	listed := srv.sh("nft list chain inet filter input")
	if !strings.Contains(listed, "policy drop;\n\t\tip saddr 10.231.7.0/24 tcp dport 8080 accept comment \"nox-mesh-host web.http\"\n") ||
		!strings.Contains(listed, `tcp dport 22 accept comment "operator ssh"`) {
		t.Fatalf("the mesh's rule is not first, or the operator's rule is gone:\n%s", listed)
	}
	rep, _ = srv.apply(decl(open("10.231.7.0/24")))
	expect(t, rep, shapes.Unchanged, "web.http=unchanged")

	// Deleted by hand: closed, and repaired by the next apply.
	srv.sh(`nft delete rule inet filter input handle $(nft -a list chain inet filter input | sed -n 's/.*"nox-mesh-host web.http" # handle //p')`)
	if connects() {
		t.Fatal("still reachable with the mesh's rule deleted")
	}
	rep, _ = srv.apply(decl(open("10.231.7.0/24")))
	expect(t, rep, shapes.Repaired, "web.http=repaired")
	if !connects() {
		t.Fatal("not reachable after the repair")
	}

	// From another prefix only: this client is kept out, and the old rule
	// goes.
	rep, _ = srv.apply(decl(open("10.231.99.0/24")))
	expect(t, rep, shapes.Applied, "web.http=applied web.http=removed")
	if connects() {
		t.Fatalf("reachable from outside the declared prefix:\n%s", srv.sh("nft list ruleset"))
	}

	// Undeclared: removed, closed again, the operator's ruleset exactly as
	// it was.
	rep, _ = srv.apply(decl())
	expect(t, rep, shapes.Removed, "web.http=removed")
	if connects() {
		t.Fatal("reachable after the opening was undeclared")
	}
	if got := srv.sh("nft list ruleset"); got != operator {
		t.Fatalf("the operator's ruleset changed:\n%s\nwas\n%s", got, operator)
	}

	// iptables-nft found instead: written with its own tool, read back
	// from its own listing, and the operator's rules left as they were.
	srv.sh("nft flush ruleset && iptables-nft -P INPUT DROP && iptables-nft -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT && " +
		"iptables-nft -A INPUT -p tcp --dport 22 -m comment --comment 'operator ssh' -j ACCEPT")
	before := srv.sh("iptables-nft -S")
	if connects() {
		t.Fatal("reachable through iptables' policy DROP")
	}
	rep, _ = srv.apply(decl(open("10.231.7.2")))
	expect(t, rep, shapes.Applied, "web.http=applied")
	if !connects() || !strings.Contains(srv.sh("iptables-nft -S INPUT"), `-A INPUT -s 10.231.7.2/32 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-host web.http" -j ACCEPT`) {
		t.Fatalf("not reachable through iptables-nft: %+v\n%s", rep.Lines, srv.sh("iptables-nft -S"))
	}
	srv.sh(`iptables-nft -D INPUT -s 10.231.7.2/32 -p tcp -m tcp --dport 8080 -m comment --comment "nox-mesh-host web.http" -j ACCEPT`)
	rep, _ = srv.apply(decl(open("10.231.7.2")))
	expect(t, rep, shapes.Repaired, "web.http=repaired")
	rep, _ = srv.apply(decl())
	expect(t, rep, shapes.Removed, "web.http=removed")
	if connects() || srv.sh("iptables-nft -S") != before {
		t.Fatalf("not closed again, or the operator's rules changed:\n%s\nwas\n%s", srv.sh("iptables-nft -S"), before)
	}

	// A partial host refuses an opening by name.
	rep, code = srv.apply(decl(open("")), "apply", "--partial")
	if code != 2 || !strings.Contains(rep.Refused, `not "opening"`) {
		t.Fatalf("exit %d %+v", code, rep)
	}

	// iptables-legacy with a rule loaded keeps the ruleset out of
	// nftables: the profile names it, and an opening is refused with its
	// name, nothing written.
	srv.sh("iptables-legacy -A INPUT -p tcp --dport 9 -j DROP")
	if prof := srv.sh("/usr/local/bin/mesh-executor profile"); !strings.Contains(prof, "iptables-legacy owns the ruleset") {
		t.Fatalf("the profile does not name iptables-legacy:\n%s", prof)
	}
	nftBefore := srv.sh("nft list ruleset")
	rep, _ = srv.apply(decl(open("10.231.7.2")))
	if rep.Outcome != shapes.Failed || !strings.Contains(outcomesDetail(rep), "iptables-legacy has rules loaded") || srv.sh("nft list ruleset") != nftBefore {
		t.Fatalf("an opening beside iptables-legacy: %+v", rep)
	}
}

// outcomesDetail joins a report's line details and its refusal.
func outcomesDetail(rep *shapes.Report) string {
	var b strings.Builder
	b.WriteString(rep.Refused)
	for _, l := range rep.Lines {
		b.WriteString(" " + l.Detail)
	}
	return b.String()
}
