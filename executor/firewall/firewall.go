// Package firewall makes a port reachable through the firewall found on the
// machine, and reads that back from the firewall's own listing.
//
// How an opening meets a found ruleset. In nftables every base chain on a
// hook sees the packet, in priority order, whatever table it is in; an
// accept ends only the chain it is in, and a drop anywhere is final. So an
// accept in a table of the host's own can never make a port reachable
// through a distribution's table whose input chain says "policy drop": the
// packet is accepted by the host's chain and then dropped by the found one.
// An opening is therefore written into the found ruleset itself: one rule,
// inserted at the top of every base chain of type filter on the opening's
// hook (input for "incoming", forward for "forwarded") in the families that
// see the packet (inet always; ip for an IPv4 or any-address "from"; ip6 for
// an IPv6 or any-address one). At the top, it is decided before any of the
// operator's rules, including a final drop or reject. No table or chain of
// the host's own is made; where no chain filters the hook, nothing is added
// and the port is reachable as far as the firewall goes (the next reconcile
// writes the rule into a filtering chain that appears later).
//
// Marking. Every rule the host writes carries the comment
// "nox-mesh-host <module.id>" (nftables: the rule's comment user data;
// iptables: -m comment). A rule is the mesh's opening of a spec only when it
// carries that mark and is exactly the rule built for the spec (the same
// expressions, or the same iptables -S line); an operator's rule, even one
// that matches the same traffic, never carries the mark and is never read
// as the mesh's, changed or removed. Handles are not kept: they change when
// a ruleset is reloaded, and the listing is read again on every reconcile.
//
// Writers. Native nftables chains are written through netlink
// (google/nftables). Chains of iptables-nft's tables (ip/ip6 "filter" with
// the built-in upper-case chains INPUT and FORWARD) are written with
// iptables-nft / ip6tables-nft, whose own -S listing is the read back:
// native expressions in its chains would make iptables unable to list them.
//
// Refused: a running firewalld or an active ufw owns the ruleset and would
// rewrite it on its next reload; iptables-legacy rules are not in nftables
// at all. Each is refused by name, before anything is written, rather than
// half-done.
package firewall

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// Mark starts the comment of every rule the host writes.
const Mark = "nox-mesh-host"

// maxComment keeps a comment within what the nft command line lists.
const maxComment = 128

// Comment is the mark of the rule an opening of owner ("module.id") writes.
func Comment(owner string) string {
	c := Mark + " " + owner
	if len(c) > maxComment {
		c = c[:maxComment]
	}
	return c
}

func isMesh(comment string) bool {
	return comment == Mark || strings.HasPrefix(comment, Mark+" ")
}

// Spec is an opening: the traffic it lets through and on which path.
type Spec struct {
	Path     string // "incoming" or "forwarded"
	Protocol string // "tcp" or "udp"
	Port     uint16
	From     netip.Prefix // !IsValid(): from anywhere
}

// ParseSpec makes a Spec of an opening's fields; from is an address, a
// prefix, or "" for anywhere.
func ParseSpec(path, protocol string, port int, from string) (Spec, error) {
	s := Spec{Path: path, Protocol: protocol}
	if path != "incoming" && path != "forwarded" {
		return s, fmt.Errorf("path %q is not incoming or forwarded", path)
	}
	if protocol != "tcp" && protocol != "udp" {
		return s, fmt.Errorf("protocol %q is not tcp or udp", protocol)
	}
	if port < 1 || port > 65535 {
		return s, fmt.Errorf("port %d is out of range", port)
	}
	s.Port = uint16(port)
	if from != "" {
		p, err := netip.ParsePrefix(from)
		if err != nil {
			a, aerr := netip.ParseAddr(from)
			if aerr != nil {
				return s, fmt.Errorf("from %q is not an address or prefix", from)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		s.From = p.Masked()
	}
	return s, nil
}

func (s Spec) String() string {
	from := "anywhere"
	if s.From.IsValid() {
		from = s.From.String()
	}
	return fmt.Sprintf("%s %d from %s (%s)", s.Protocol, s.Port, from, s.Path)
}

func (s Spec) hook() nftables.ChainHook {
	if s.Path == "forwarded" {
		return *nftables.ChainHookForward
	}
	return *nftables.ChainHookInput
}

// sees reports whether a chain of family f sees the spec's traffic.
func (s Spec) sees(f nftables.TableFamily) bool {
	switch f {
	case nftables.TableFamilyINet:
		return true
	case nftables.TableFamilyIPv4:
		return !s.From.IsValid() || s.From.Addr().Is4()
	case nftables.TableFamilyIPv6:
		return !s.From.IsValid() || s.From.Addr().Is6()
	}
	return false
}

// Chain is a base chain an opening is written into.
type Chain struct {
	Family nftables.TableFamily
	Table  string
	Name   string
	// IPTables: the chain is iptables-nft's, written with its own tool.
	IPTables bool
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family-%d", f)
}

func (c Chain) String() string {
	s := familyName(c.Family) + " " + c.Table + " " + c.Name
	if c.IPTables {
		s += " (iptables-nft)"
	}
	return s
}

// Chains names chains for a report line.
func Chains(cs []Chain) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.String())
	}
	return strings.Join(s, ", ")
}

// State is what the firewall's listing says of one opening.
type State struct {
	// Open are the chains that carry the mesh's rule for the spec; Missing
	// the chains on its hook that do not.
	Open, Missing []Chain
}

// Refused is an opening the host will not build through what it found.
type Refused struct{ Firewall, Reason string }

func (e *Refused) Error() string { return e.Reason }

// Firewall is the machine's firewall, as far as openings go.
type Firewall interface {
	Name() string
	// Observe reads the listing: which chains carry the spec's rule.
	Observe(ctx context.Context, s Spec) (State, error)
	// Open writes the spec's rule, marked with comment, into each chain.
	Open(ctx context.Context, s Spec, comment string, into []Chain) error
	// Close removes every rule of the mesh's for the spec; it returns the
	// chains it removed one from.
	Close(ctx context.Context, s Spec) ([]Chain, error)
}

// Runner runs a program and returns its standard output and exit code;
// a non-zero exit is also an error naming argv and its standard error, and
// a program that is not there is an error wrapping command.ErrNotFound.
type Runner func(ctx context.Context, argv ...string) (stdout string, code int, err error)

// runTimeout bounds one program of the firewall's.
const runTimeout = 30 * time.Second

// Run is the Runner of the machine: executor/command's, so the program is
// found in the fixed search path, never the executor's inherited PATH, and
// killed with its process group if it is not done within thirty seconds.
func Run(ctx context.Context, argv ...string) (string, int, error) {
	res, err := command.Run(ctx, argv, command.Options{Timeout: runTimeout})
	if err != nil {
		return "", -1, err
	}
	if res.Code != 0 {
		return res.Stdout, res.Code, fmt.Errorf("%q: exit status %d: %s", argv, res.Code, res.Stderr)
	}
	return res.Stdout, 0, nil
}

// Detect finds the machine's firewall: a front end that owns the ruleset
// (firewalld, ufw) or iptables-legacy refuse with their name; otherwise
// nftables, read over netlink.
func Detect(ctx context.Context) (Firewall, error) { return DetectWith(ctx, Run) }

// DetectWith is Detect with the programs run by run.
func DetectWith(ctx context.Context, run Runner) (Firewall, error) {
	if err := frontEnds(ctx, run); err != nil {
		return nil, err
	}
	return open(run)
}

// Listable says whether nftables can be listed here over netlink, the
// way every opening reads and writes it (no program is needed): nil when
// it can. The profile's firewall capability is this answer, so that a
// module is assigned to a host exactly when its openings can be written.
func Listable() error {
	_, err := open(Run)
	return err
}

// open reads nftables over netlink, in the namespace opts name (the
// executor's own when none).
func open(run Runner, opts ...nftables.ConnOption) (*nft, error) {
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: netlink: %w", err)
	}
	if _, err := conn.ListChains(); err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("nftables cannot be listed over netlink (it takes CAP_NET_ADMIN): %w", err)
		}
		return nil, fmt.Errorf("nftables cannot be listed over netlink (no nf_tables here?): %w", err)
	}
	return &nft{conn: conn, run: run}, nil
}

// FrontEnd names what owns the machine's ruleset, or keeps it out of
// nftables — firewalld running, ufw active, iptables-legacy with rules —
// as the Refused an opening would get; nil when there is none. The
// profile names the firewall with it, so what it reports is what an
// opening finds.
func FrontEnd(ctx context.Context) error { return frontEnds(ctx, Run) }

// frontEnds refuses what owns the ruleset, or keeps it out of nftables.
func frontEnds(ctx context.Context, run Runner) error {
	if out, code, err := run(ctx, "firewall-cmd", "--state"); err == nil && code == 0 && strings.TrimSpace(out) == "running" {
		return &Refused{"firewalld", "firewalld is running: an opening through it is not built; refused rather than half-done"}
	}
	if out, code, err := run(ctx, "ufw", "status"); err == nil && code == 0 && strings.HasPrefix(strings.TrimSpace(out), "Status: active") {
		return &Refused{"ufw", "ufw is active: an opening through it is not built; refused rather than half-done"}
	}
	if out, code, err := run(ctx, "iptables-legacy-save"); err == nil && code == 0 && legacyInUse(out) {
		return &Refused{"iptables-legacy", "iptables-legacy has rules loaded: they are outside nftables, and an opening through them is not built; refused rather than half-done"}
	}
	return nil
}

// legacyInUse reports whether an iptables-legacy-save listing holds a rule
// or a built-in chain whose policy is not ACCEPT.
func legacyInUse(save string) bool {
	for _, l := range strings.Split(save, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "-A":
			return true
		case len(f) > 1 && strings.HasPrefix(f[0], ":") && f[1] != "ACCEPT" && f[1] != "-":
			return true
		}
	}
	return false
}

// nft is nftables, with iptables-nft's chains written through its tool.
type nft struct {
	conn *nftables.Conn
	run  Runner
}

func (*nft) Name() string { return "nftables" }

// iptablesChain reports whether a chain is one of iptables-nft's.
func iptablesChain(c *nftables.Chain) bool {
	f := c.Table.Family
	return (f == nftables.TableFamilyIPv4 || f == nftables.TableFamilyIPv6) && c.Table.Name == "filter" &&
		(c.Name == "INPUT" || c.Name == "FORWARD")
}

// chains lists the base filter chains on the spec's hook that see its
// traffic, in a stable order.
func (n *nft) chains(s Spec) ([]*nftables.Chain, error) {
	all, err := n.conn.ListChains()
	if err != nil {
		return nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	var out []*nftables.Chain
	for _, c := range all {
		if c.Hooknum == nil || *c.Hooknum != s.hook() || c.Type != nftables.ChainTypeFilter || !s.sees(c.Table.Family) {
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *nftables.Chain) int {
		return strings.Compare(chainOf(a).String(), chainOf(b).String())
	})
	return out, nil
}

func chainOf(c *nftables.Chain) Chain {
	return Chain{Family: c.Table.Family, Table: c.Table.Name, Name: c.Name, IPTables: iptablesChain(c)}
}

// meshRules returns the handles of the mesh's rules for s in a native chain.
func (n *nft) meshRules(c *nftables.Chain, s Spec) ([]*nftables.Rule, error) {
	rules, err := n.conn.GetRules(c.Table, c)
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s: %w", chainOf(c), err)
	}
	want := Exprs(c.Table.Family, s)
	var mine []*nftables.Rule
	for _, r := range rules {
		comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		if isMesh(comment) && SameExprs(r.Exprs, want) {
			mine = append(mine, r)
		}
	}
	return mine, nil
}

func (n *nft) Observe(ctx context.Context, s Spec) (State, error) {
	var st State
	cs, err := n.chains(s)
	if err != nil {
		return st, err
	}
	for _, c := range cs {
		var open bool
		if iptablesChain(c) {
			lines, err := n.iptablesRules(ctx, c, s)
			if err != nil {
				return st, err
			}
			open = len(lines) > 0
		} else {
			rules, err := n.meshRules(c, s)
			if err != nil {
				return st, err
			}
			open = len(rules) > 0
		}
		if open {
			st.Open = append(st.Open, chainOf(c))
		} else {
			st.Missing = append(st.Missing, chainOf(c))
		}
	}
	return st, nil
}

func (n *nft) Open(ctx context.Context, s Spec, comment string, into []Chain) error {
	cs, err := n.chains(s)
	if err != nil {
		return err
	}
	native := 0
	for _, want := range into {
		i := slices.IndexFunc(cs, func(c *nftables.Chain) bool { return chainOf(c) == want })
		if i < 0 {
			return fmt.Errorf("chain %s is gone from the ruleset", want)
		}
		c := cs[i]
		if want.IPTables {
			if _, _, err := n.run(ctx, append([]string{iptablesTool(c.Table.Family), "-w", "5", "-I", c.Name, "1"}, IptablesArgs(s, comment)...)...); err != nil {
				return err
			}
			continue
		}
		n.conn.InsertRule(&nftables.Rule{Table: c.Table, Chain: c, Exprs: Exprs(c.Table.Family, s),
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment)})
		native++
	}
	if native > 0 {
		if err := n.conn.Flush(); err != nil {
			return fmt.Errorf("nftables: insert the rule: %w", err)
		}
	}
	return nil
}

func (n *nft) Close(ctx context.Context, s Spec) ([]Chain, error) {
	cs, err := n.chains(s)
	if err != nil {
		return nil, err
	}
	var from []Chain
	native := 0
	for _, c := range cs {
		if iptablesChain(c) {
			comments, err := n.iptablesRules(ctx, c, s)
			if err != nil {
				return from, err
			}
			for _, comment := range comments {
				if _, _, err := n.run(ctx, append([]string{iptablesTool(c.Table.Family), "-w", "5", "-D", c.Name}, IptablesArgs(s, comment)...)...); err != nil {
					return from, err
				}
			}
			if len(comments) > 0 {
				from = append(from, chainOf(c))
			}
			continue
		}
		rules, err := n.meshRules(c, s)
		if err != nil {
			return from, err
		}
		for _, r := range rules {
			if err := n.conn.DelRule(&nftables.Rule{Table: c.Table, Chain: c, Handle: r.Handle}); err != nil {
				return from, err
			}
			native++
		}
		if len(rules) > 0 {
			from = append(from, chainOf(c))
		}
	}
	if native > 0 {
		if err := n.conn.Flush(); err != nil {
			return from, fmt.Errorf("nftables: delete the rule: %w", err)
		}
	}
	return from, nil
}

// ---- the rules themselves: pure, and tested as tables.

// Exprs is the nftables rule of an opening in a chain of family f:
// [nfproto] [saddr [& mask] ==] l4proto == ; th dport == ; accept.
func Exprs(f nftables.TableFamily, s Spec) []expr.Any {
	var e []expr.Any
	if s.From.IsValid() {
		a := s.From.Addr()
		offset, size, nfproto := uint32(12), uint32(4), byte(unix.NFPROTO_IPV4)
		if a.Is6() {
			offset, size, nfproto = 8, 16, unix.NFPROTO_IPV6
		}
		if f == nftables.TableFamilyINet {
			e = append(e,
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}})
		}
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size})
		if s.From.Bits() < a.BitLen() {
			mask := netip.PrefixFrom(a, s.From.Bits())
			e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: maskBytes(mask), Xor: make([]byte, size)})
		}
		e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()})
	}
	proto := byte(unix.IPPROTO_TCP)
	if s.Protocol == "udp" {
		proto = unix.IPPROTO_UDP
	}
	e = append(e,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(s.Port >> 8), byte(s.Port)}},
		&expr.Verdict{Kind: expr.VerdictAccept})
	return e
}

func maskBytes(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}

// SameExprs reports whether a rule read from the kernel is the rule built.
// Expressions are compared field by field through their printed form, which
// holds every field; the kernel gives back what it was given for these.
func SameExprs(got, want []expr.Any) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if fmt.Sprintf("%T%+v", got[i], got[i]) != fmt.Sprintf("%T%+v", want[i], want[i]) {
			return false
		}
	}
	return true
}

func iptablesTool(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6tables-nft"
	}
	return "iptables-nft"
}

// IptablesArgs is the rule of an opening for iptables, after the chain.
func IptablesArgs(s Spec, comment string) []string {
	var a []string
	if s.From.IsValid() {
		a = append(a, "-s", s.From.String())
	}
	p := strconv.Itoa(int(s.Port))
	return append(a, "-p", s.Protocol, "-m", s.Protocol, "--dport", p, "-m", "comment", "--comment", comment, "-j", "ACCEPT")
}

// IptablesLine is the line iptables -S lists for the rule in chain.
func IptablesLine(chain string, s Spec, comment string) string {
	a := IptablesArgs(s, comment)
	for i, x := range a {
		if i > 0 && a[i-1] == "--comment" {
			a[i] = strconv.Quote(x)
		}
	}
	return "-A " + chain + " " + strings.Join(a, " ")
}

// iptablesComment returns the comment of an iptables -S line.
func iptablesComment(line string) (string, bool) {
	_, rest, ok := strings.Cut(line, " --comment ")
	if !ok {
		return "", false
	}
	if strings.HasPrefix(rest, `"`) {
		end := strings.Index(rest[1:], `"`)
		if end < 0 {
			return "", false
		}
		return rest[1 : end+1], true
	}
	c, _, _ := strings.Cut(rest, " ")
	return c, true
}

// MeshLines returns the comments of the mesh's rules for s in an iptables
// -S listing of chain.
func MeshLines(listing, chain string, s Spec) []string {
	var out []string
	for _, l := range strings.Split(listing, "\n") {
		l = strings.TrimSpace(l)
		c, ok := iptablesComment(l)
		if !ok || !isMesh(c) {
			continue
		}
		// iptables lists a /32 address as "-s 10.0.0.1/32": the line built
		// from the masked prefix is the same.
		if l == IptablesLine(chain, s, c) {
			out = append(out, c)
		}
	}
	return out
}

func (n *nft) iptablesRules(ctx context.Context, c *nftables.Chain, s Spec) ([]string, error) {
	out, _, err := n.run(ctx, iptablesTool(c.Table.Family), "-w", "5", "-S", c.Name)
	if err != nil {
		return nil, err
	}
	return MeshLines(out, c.Name, s), nil
}
