package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/engine/model"
	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
)

// What the host made before the mesh came, that the mesh changes without
// owning: a configuration file the node's modules write blocks into
// (region), an environment file whose keys they set (keys), and the
// firewall of the node's network namespace, which they open ports through
// (opening). The mesh must leave every byte, line and rule of the host's
// as it found it, and give back what it changed once nothing declares it
// (ADR 0118): with the modules drawn under every fault, after each step,
// the files outside the mesh's blocks and keys and the host's rules are
// what the host wrote, each block, key and rule of the mesh's is one a
// store claims, and a file nothing is claimed in is, byte for byte, the
// host's.

// hostConf is the shared file as the host wrote it: lines of its own and,
// between markers of the name c.reg, a block a person wrote before the
// mesh first declared that region — found content, to be kept and put
// back byte for byte when the mesh lets it go.
const hostConf = "# the machine's own configuration\n" +
	"host-setting = 1\n" +
	"# BEGIN mesh c.reg\n" +
	"written by a person before the mesh came\n" +
	"# END mesh c.reg\n" +
	"host-setting = 2\n"

// foundRegion and foundBlock: the found block's name and its content.
const (
	foundRegion = "c.reg"
	foundBlock  = "written by a person before the mesh came\n"
)

// hostConfMode is the shared file's mode, which the mesh keeps as found.
const hostConfMode = 0o640

// hostEnv is the shared environment file as the host wrote it: keys of
// its own, a comment, and host_c, which module c's keys also set — found
// at "found", to be put back where it stands when the mesh lets it go.
const hostEnv = "# the machine's own environment\n" +
	"HOST_A=1\n" +
	"host_c = found\n" +
	"; an older comment\n" +
	"HOST_B = two words\n"

// foundKeysModule's keys set foundKey too, which the host wrote with
// foundValue.
const (
	foundKeysModule = "c"
	foundKey        = "host_c"
	foundValue      = "found"
)

// sharedEnv is the node's shared environment file.
func (n *node) sharedEnv() string { return filepath.Join(n.tree, "shared", "env") }

// shared is the node's shared file.
func (n *node) shared() string { return filepath.Join(n.tree, "shared", "conf") }

// makeShared writes the shared files as the host did.
func makeShared(n *node) error {
	if err := os.MkdirAll(filepath.Dir(n.shared()), 0o755); err != nil {
		return err
	}
	for p, content := range map[string]string{n.shared(): hostConf, n.sharedEnv(): hostEnv} {
		if err := os.WriteFile(p, []byte(content), hostConfMode); err != nil {
			return err
		}
		if err := os.Chmod(p, hostConfMode); err != nil {
			return err
		}
	}
	return nil
}

// The firewall of the node's network namespace as the host set it up:
// an inet table whose input chain accepts and whose forward chain drops,
// an ip table filtering input at another priority, an ip6 table filtering
// forward, and a nat chain an opening must not touch. Each rule of the
// host's has a comment of its own, so each is a path of the snapshot.
func setupFirewall(n *node) error {
	c, done, err := nftIn(n)
	if err != nil {
		return err
	}
	defer done()
	accept, drop := nftables.ChainPolicyAccept, nftables.ChainPolicyDrop
	inet := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "host"})
	v4 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "hostv4"})
	v6 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: "hostv6"})
	chain := func(t *nftables.Table, name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, policy *nftables.ChainPolicy) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Table: t, Name: name, Type: typ, Hooknum: hook, Priority: prio, Policy: policy})
	}
	in := chain(inet, "input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, &accept)
	fwd := chain(inet, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, &drop)
	in4 := chain(v4, "input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityRef(10), &accept)
	chain(v4, "snat-in", nftables.ChainTypeNAT, nftables.ChainHookInput, nftables.ChainPriorityNATSource, &accept)
	fwd6 := chain(v6, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, &accept)
	rule := func(ch *nftables.Chain, comment string, port uint16, verdict expr.VerdictKind) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
			Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
				&expr.Verdict{Kind: verdict},
			}})
	}
	rule(in, "host's own: ssh", 22, expr.VerdictAccept)
	rule(in, "host's own: no telnet", 23, expr.VerdictDrop)
	rule(fwd, "host's own: forwarded web", 443, expr.VerdictAccept)
	rule(in4, "host's own: v4 metrics", 9100, expr.VerdictAccept)
	rule(fwd6, "host's own: v6 drop", 25, expr.VerdictDrop)
	return c.Flush()
}

// nftIn is a netlink connection to nftables in n's network namespace.
func nftIn(n *node) (*nftables.Conn, func(), error) {
	f, err := os.Open(filepath.Join("/run/netns", n.netns))
	if err != nil {
		return nil, nil, fmt.Errorf("%s's network namespace: %w", n.name, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("nftables in %s's network namespace: %w", n.name, err)
	}
	return c, func() { f.Close() }, nil
}

// A fwRule is one rule of the namespace's ruleset, as read.
type fwRule struct {
	chain   fwChain
	comment string
	pos     int // in its chain
	digest  [32]byte
}

type fwChain struct {
	family nftables.TableFamily
	table  string
	name   string
	// hook is "input", "forward" or "" (a chain of another hook); filter
	// says the chain's type is filter: the chains an opening writes into.
	hook   string
	filter bool
}

// String names the chain as the executor's lines do.
func (c fwChain) String() string {
	return firewall.Chain{Family: c.family, Table: c.table, Name: c.name}.String()
}

// readFirewall lists every chain and rule of n's namespace.
func readFirewall(n *node) ([]fwChain, []fwRule, error) {
	c, done, err := nftIn(n)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	chains, err := c.ListChains()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables in %s's namespace: list chains: %w", n.name, err)
	}
	var cs []fwChain
	var rs []fwRule
	for _, ch := range chains {
		fc := fwChain{family: ch.Table.Family, table: ch.Table.Name, name: ch.Name, filter: ch.Type == nftables.ChainTypeFilter}
		if ch.Hooknum != nil {
			switch *ch.Hooknum {
			case *nftables.ChainHookInput:
				fc.hook = "input"
			case *nftables.ChainHookForward:
				fc.hook = "forward"
			}
		}
		cs = append(cs, fc)
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables in %s's namespace: list %s: %w", n.name, fc, err)
		}
		for i, r := range rules {
			comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			var b bytes.Buffer
			for _, e := range r.Exprs {
				fmt.Fprintf(&b, "%T%+v;", e, e)
			}
			rs = append(rs, fwRule{chain: fc, comment: comment, pos: i, digest: sha256.Sum256(b.Bytes())})
		}
	}
	return cs, rs, nil
}

// meshMark starts the comment of the mesh's rules.
const meshMark = firewall.Mark

func isMeshRule(comment string) bool {
	return comment == meshMark || strings.HasPrefix(comment, meshMark+" ")
}

// rulePath is a rule's place in the snapshot: beside the tree's paths, so
// that a rule the mesh added, changed or removed is a change the reports
// must say, and a rule of the host's one that must never change.
func rulePath(r fwRule) string {
	return fmt.Sprintf("nft:%s/%s", r.chain, r.comment)
}

// snapshotNode is n's tree and its firewall's rules.
func snapshotNode(n *node) (map[string]entry, error) {
	m := snapshot(n.tree)
	_, rules, err := readFirewall(n)
	if err != nil {
		return m, err
	}
	for _, r := range rules {
		p := rulePath(r)
		for k := 2; ; k++ {
			if _, twice := m[p]; !twice {
				break
			}
			p = fmt.Sprintf("%s#%d", rulePath(r), k)
		}
		m[p] = entry{digest: r.digest}
	}
	return m, nil
}

// hostMadeAt says, for a changed path that is not a module's, whether a
// report line of (mod, id) is the mesh saying it changed it: the shared
// file by any module's region, a rule of the mesh's by its module's
// opening.
func hostMadeAt(n *node, p, mod, id string) bool {
	switch p {
	case n.shared():
		return id == "reg"
	case n.sharedEnv():
		return id == "keys"
	}
	rest, ok := strings.CutPrefix(p, "nft:")
	if !ok {
		return false
	}
	_, comment, _ := strings.Cut(rest, "/")
	comment, _, _ = strings.Cut(comment, "#")
	return comment == meshMark+" "+mod+"."+id
}

// meshMade says whether a path of the snapshot is one the mesh may change:
// the shared file, or a rule carrying the mesh's mark.
func meshMade(n *node, p string) bool {
	if p == n.shared() || p == n.sharedEnv() {
		return true
	}
	rest, ok := strings.CutPrefix(p, "nft:")
	if !ok {
		return false
	}
	_, comment, _ := strings.Cut(rest, "/")
	return isMeshRule(comment)
}

// hostMadeProblems holds the shared file and the firewall to what n's
// store claims (owned): what does not hold, each said under its
// invariant (host-file-kept, host-firewall-kept).
func (w *world) hostMadeProblems(n *node, owned []ownedEntry) []problem {
	var problems []problem
	inv := "host-file-kept"
	say := func(format string, a ...any) { problems = append(problems, problem{inv, fmt.Sprintf(format, a...)}) }

	// A pending claim (a change begun and not recorded: the apply failed
	// at it, or died) is one the file or the firewall may hold as it was
	// before or as declared: neither is required of it.
	pending := map[string]bool{}
	for _, o := range owned {
		if o.Pending {
			pending[o.Target] = true
		}
	}

	// The shared file.
	regions := map[string]bool{}
	for _, o := range owned {
		if rest, ok := strings.CutPrefix(o.Target, "region:"+n.shared()+"#"); ok {
			regions[rest] = true
		}
	}
	regionPending := func(name string) bool { return pending["region:"+n.shared()+"#"+name] }
	w.check("host-file-kept")
	fi, err := os.Lstat(n.shared())
	b, rerr := os.ReadFile(n.shared())
	switch {
	case err != nil || rerr != nil:
		say("the host's file %s is gone: %v %v", n.shared(), err, rerr)
	case !fi.Mode().IsRegular() || fi.Mode().Perm() != hostConfMode:
		say("the host's file %s is a %s of mode %04o; the host made a file of mode %04o", n.shared(), fi.Mode().Type(), fi.Mode().Perm(), hostConfMode)
	default:
		inside, outside, err := model.FileBlocks(string(b))
		_, wantOutside, _ := model.FileBlocks(hostConf)
		switch {
		case err != nil:
			say("the host's file %s: %v:\n%s", n.shared(), err, b)
		case outside != wantOutside:
			say("the host's file %s outside the mesh's blocks is not as the host wrote it:\n%s", n.shared(), b)
		case len(regions) == 0 && string(b) != hostConf:
			say("no store claims a region of %s, and it is not, byte for byte, as the host wrote it:\n%s", n.shared(), b)
		}
		for name, body := range inside {
			switch {
			case regions[name] && regionPending(name) && name == foundRegion && body == foundBlock:
			case regions[name]:
				if !strings.HasPrefix(body, "chaos-region "+name+" v") {
					say("the block %s in %s holds %.60q, none the mesh declared for it", name, n.shared(), body)
				}
			case name == foundRegion && body == foundBlock:
			case name == foundRegion:
				say("the block a person wrote (%s) in %s is not given back as found, and no store claims it: %.60q", name, n.shared(), body)
			default:
				say("the block %s in %s is one no store claims (a leftover, or a write not recorded)", name, n.shared())
			}
		}
		for name := range regions {
			if _, ok := inside[name]; !ok && !regionPending(name) {
				say("%s's store claims the region %s of %s, which the file does not hold", n.name, name, n.shared())
			}
		}
	}

	// The environment file.
	keys := map[string]bool{}
	for _, o := range owned {
		if rest, ok := strings.CutPrefix(o.Target, "keys:"+n.sharedEnv()+"#"); ok {
			keys[strings.TrimSuffix(rest, ".keys")] = true
		}
	}
	keysPending := func(mod string) bool { return pending["keys:"+n.sharedEnv()+"#"+mod+".keys"] }
	fi, err = os.Lstat(n.sharedEnv())
	b, rerr = os.ReadFile(n.sharedEnv())
	switch {
	case err != nil || rerr != nil:
		say("the host's file %s is gone: %v %v", n.sharedEnv(), err, rerr)
	case !fi.Mode().IsRegular() || fi.Mode().Perm() != hostConfMode:
		say("the host's file %s is a %s of mode %04o; the host made a file of mode %04o", n.sharedEnv(), fi.Mode().Type(), fi.Mode().Perm(), hostConfMode)
	case len(keys) == 0 && string(b) != hostEnv:
		say("no store claims keys of %s, and it is not, byte for byte, as the host wrote it:\n%s", n.sharedEnv(), b)
	default:
		var host []string
		held := map[string]bool{}
		for _, l := range strings.SplitAfter(string(b), "\n") {
			k, v, _ := strings.Cut(strings.TrimSuffix(l, "\n"), "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			mod, mesh := strings.CutPrefix(k, "mod_")
			switch {
			case mesh:
				held[mod] = true
				if !keys[mod] || !strings.HasPrefix(v, mod+"-v") {
					say("%s holds %q, which no store's keys set", n.sharedEnv(), l)
				}
			case k == foundKey && keys[foundKeysModule]:
				if !strings.HasPrefix(v, foundKeysModule+"-v") && (!keysPending(foundKeysModule) || v != foundValue) {
					say("%s holds %q where %s.keys sets it", n.sharedEnv(), l, foundKeysModule)
				}
				host = append(host, foundKey+" = "+foundValue+"\n")
			default:
				host = append(host, l)
			}
		}
		if strings.Join(host, "") != hostEnv {
			say("the host's file %s, the mesh's keys aside, is not as the host wrote it (a found value not given back where it stands, a line of the host's changed):\n%s", n.sharedEnv(), b)
		}
		for mod := range keys {
			if !held[mod] && !keysPending(mod) {
				say("%s's store claims %s.keys, and %s holds no mod_%s", n.name, mod, n.sharedEnv(), mod)
			}
		}
	}

	// The firewall.
	inv = "host-firewall-kept"
	w.check(inv)
	chains, rules, err := readFirewall(n)
	if err != nil {
		say("%v", err)
		return problems
	}
	type at struct {
		chain   fwChain
		comment string
	}
	want := map[at]bool{}
	for _, o := range owned {
		rest, ok := strings.CutPrefix(o.Target, "opening:")
		if !ok {
			continue
		}
		f := strings.SplitN(rest, "/", 4)
		if len(f) != 4 {
			say("%s's store claims an opening of target %q, which names no path, port, protocol and source", n.name, o.Target)
			continue
		}
		hook := map[string]string{"incoming": "input", "forwarded": "forward"}[f[0]]
		var from netip.Prefix
		if f[3] != "" {
			if from, err = netip.ParsePrefix(f[3]); err != nil {
				say("%s's store claims an opening from %q: %v", n.name, f[3], err)
				continue
			}
		}
		for _, c := range chains {
			sees := c.family == nftables.TableFamilyINet ||
				c.family == nftables.TableFamilyIPv4 && (!from.IsValid() || from.Addr().Is4()) ||
				c.family == nftables.TableFamilyIPv6 && (!from.IsValid() || from.Addr().Is6())
			if !c.filter || c.hook != hook || !sees {
				continue
			}
			mine := map[string]bool{}
			for _, cl := range o.Claims {
				mine[meshMark+" "+cl.Module+"."+cl.ID] = true
				want[at{c, meshMark + " " + cl.Module + "." + cl.ID}] = true
			}
			found := false
			for _, r := range rules {
				found = found || r.chain == c && mine[r.comment]
			}
			if !found && !pending[o.Target] {
				say("%s's store claims the opening %s, and %s holds no rule of it", n.name, o.Target, c)
			}
		}
	}
	held := map[at]int{}
	hostBefore := map[fwChain]bool{}
	for _, r := range rules {
		if !isMeshRule(r.comment) {
			hostBefore[r.chain] = true
			continue
		}
		k := at{r.chain, r.comment}
		if held[k]++; held[k] == 2 {
			say("%s holds the rule %q twice", r.chain, r.comment)
		}
		switch {
		case !want[k]:
			say("%s holds the rule %q, which no store claims (a leftover, or a write not recorded)", r.chain, r.comment)
		case hostBefore[r.chain]:
			say("%s holds the rule %q after a rule of the host's: an opening is decided before the host's rules", r.chain, r.comment)
		}
	}
	// The overlay: each interface a store claims is up in the node's
	// namespace, and its WireGuard answers (a boot takes both; the
	// executor's start must bring them back).
	inv = "overlay-kept"
	for _, o := range owned {
		iface, ok := strings.CutPrefix(o.Target, "overlay:")
		if !ok {
			continue
		}
		w.check(inv)
		if msg := overlayUp(n, iface); msg != "" {
			say("%s's store claims the overlay %s: %s", n.name, iface, msg)
		}
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].msg < problems[j].msg })
	return problems
}

// overlayUp says what is wrong with the overlay interface iface in n's
// network namespace: absent, down, or no WireGuard answering on its
// socket (the node's /run/wireguard is n.wg); "" when it is up and
// answers.
func overlayUp(n *node, iface string) string {
	out, err := exec.Command("ip", "-n", n.netns, "-j", "link", "show", "dev", iface).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("no such interface in the node's namespace (ip link: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	var links []struct {
		Flags []string `json:"flags"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return fmt.Sprintf("ip link said %q", out)
	}
	if !slices.Contains(links[0].Flags, "UP") {
		return fmt.Sprintf("the interface is down (flags %v)", links[0].Flags)
	}
	// WireGuard's configuration protocol: a get, answered by the
	// device's settings and errno=0.
	c, err := net.DialTimeout("unix", filepath.Join(n.wg, iface+".sock"), 5*time.Second)
	if err != nil {
		return fmt.Sprintf("no WireGuard answers on its socket: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("get=1\n\n")); err != nil {
		return fmt.Sprintf("its WireGuard took no request: %v", err)
	}
	// The answer ends with an empty line; the connection stays open for
	// another request.
	var said []string
	r := bufio.NewReader(c)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return fmt.Sprintf("its WireGuard's answer ended early (%v) after %q", err, said)
		}
		if l == "\n" {
			break
		}
		said = append(said, strings.TrimSuffix(l, "\n"))
	}
	if len(said) == 0 || said[len(said)-1] != "errno=0" {
		return fmt.Sprintf("its WireGuard answered %q", said)
	}
	return ""
}

// A problem is what an invariant (inv) found not holding.
type problem struct{ inv, msg string }
