package link

import (
	"slices"
	"strings"
	"testing"
)

// Each layout holds a node to names that are its own or shared by every
// node, never another's: every permission subject names the node or is
// one of the shared reads; the two layouts' lists differ, and Either is
// exactly both, each subject once.
func TestLayoutsHoldANodeToItsOwn(t *testing.T) {
	shared := []string{ArchiveGet, RosterGet, RosterNotice}
	for _, l := range []Layout{LayoutByKind, LayoutByNode} {
		pub, sub := NodePermissions("n1", l)
		for _, p := range append(slices.Clone(pub), sub...) {
			if !slices.Contains(shared, p) && !slices.Contains(strings.Split(p, "."), "n1") {
				t.Errorf("layout %d: %q names neither the node nor a shared read", l, p)
			}
			if strings.Contains(p, "*") || (strings.Contains(p, ">") && !strings.HasSuffix(p, ".n1.>") && !strings.Contains(p, ".n1.")) {
				t.Errorf("layout %d: %q is wider than the node's own", l, p)
			}
		}
		s := NodeSubjects("n1", l)
		for _, own := range []string{s.DeclGet, s.Report, s.Heartbeat, s.ArchiveGet, s.RosterGet} {
			if !covered(pub, own) {
				t.Errorf("layout %d: the node may not publish to its own %q", l, own)
			}
		}
		for _, own := range []string{s.Notice, s.Plan, s.RosterNotice, s.Inbox + ".x"} {
			if !covered(sub, own) {
				t.Errorf("layout %d: the node may not hear its own %q", l, own)
			}
		}
		other := NodeSubjects("n1", 1-l)
		if covered(pub, other.DeclGet) || covered(sub, other.Plan) {
			t.Errorf("layout %d also opens the other layout's doors", l)
		}
	}
	pub, sub := NodePermissionsEither("n1")
	for _, l := range []Layout{LayoutByKind, LayoutByNode} {
		p, s := NodePermissions("n1", l)
		for _, x := range append(p, s...) {
			if !slices.Contains(pub, x) && !slices.Contains(sub, x) {
				t.Errorf("Either lacks %q of layout %d", x, l)
			}
		}
	}
	for _, list := range [][]string{pub, sub} {
		if c := slices.Compact(slices.Sorted(slices.Values(list))); len(c) != len(list) {
			t.Errorf("Either lists a subject twice: %v", list)
		}
	}
	if LayoutOf("mesh-agent/n1 "+LayoutTag) != LayoutByNode || LayoutOf("mesh-agent/n1") != LayoutByKind || LayoutOf(LayoutTag) != LayoutByKind {
		t.Error("LayoutOf reads the connection's name wrong")
	}
}

// covered says whether subject matches one of the permission subjects
// (NATS' wildcards: * one token, > the rest).
func covered(perms []string, subject string) bool {
	for _, p := range perms {
		pt, st := strings.Split(p, "."), strings.Split(subject, ".")
		ok := true
		for i, tok := range pt {
			if tok == ">" {
				ok = len(st) > i
				break
			}
			if i >= len(st) || (tok != "*" && tok != st[i]) {
				ok = false
				break
			}
			if i == len(pt)-1 && len(st) != len(pt) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// Each export holds a node to its own: the position it names is the "*"
// of its subject, a node's imports put the node's name there (and only
// there), and what is shared by every node names no node at all.
func TestEachNodesImportsNameItsOwn(t *testing.T) {
	check := func(what, subject string, pos uint) {
		toks := strings.Split(subject, ".")
		stars := strings.Count(subject, "*")
		switch {
		case pos == 0 && stars != 0:
			t.Errorf("%s %q: shared, yet it has a wildcard", what, subject)
		case pos > 0 && (int(pos) > len(toks) || toks[pos-1] != "*" || stars != 1):
			t.Errorf("%s %q: the node's position %d is not its one wildcard", what, subject, pos)
		}
	}
	for _, si := range ServiceImports {
		check("service", si.Subject, si.Node)
	}
	for _, n := range Notices {
		check("notice", n.Subject, n.Node)
	}
	services, notices := NodeImports("n1")
	if len(services) != len(ServiceImports) || len(notices) != len(Notices) {
		t.Fatalf("%d services and %d notices imported, of %d and %d", len(services), len(notices), len(ServiceImports), len(Notices))
	}
	for i, si := range services {
		if strings.Contains(si.Subject+si.To, "*") || strings.Contains(si.Subject+si.To, ">") {
			t.Errorf("import %q as %q: a wildcard", si.Subject, si.To)
		}
		if si.Node > 0 && strings.Split(si.Subject, ".")[si.Node-1] != "n1" {
			t.Errorf("import %q: not the node's own at position %d", si.Subject, si.Node)
		}
		if ServiceImports[i].Node == 0 && strings.Contains(si.Subject, "n1") {
			t.Errorf("import %q: a shared service names the node", si.Subject)
		}
	}
	for i, subj := range notices {
		if Notices[i].Node > 0 && strings.Split(subj, ".")[Notices[i].Node-1] != "n1" {
			t.Errorf("notice %q: not the node's own", subj)
		}
	}
	if NodeAccount("n1") == AccountControl || NodeAccount("n1") == AccountNodes || ValidNodeName(AccountControl) == nil || ValidNodeName(AccountNodes) == nil {
		t.Error("a node's account could be named as CONTROL or NODES")
	}
}

// A node's account imports, for a layout, what that layout's permissions
// use and nothing it cannot: every import of NodeImports is some layout's,
// and no layout is left without its reads, reports or notices.
func TestEachLayoutImportsWhatItsPermissionsUse(t *testing.T) {
	const node = "n1"
	services, notices := NodeImports(node)
	used := map[string]bool{}
	for _, l := range []Layout{LayoutByKind, LayoutByNode} {
		s := NodeSubjects(node, l)
		ls, ln := NodeImportsOf(node, l)
		var tos []string
		for _, si := range ls {
			tos = append(tos, si.To)
			used["s "+si.To] = true
		}
		for _, n := range ln {
			used["n "+n] = true
		}
		for _, want := range []string{s.DeclGet, s.Report, s.Heartbeat, s.HeartbeatGet, s.ArchiveGet, s.RosterGet} {
			if !slices.Contains(tos, want) {
				t.Errorf("layout %d: %s not imported (imports %v)", l, want, tos)
			}
		}
		if len(ls) != 6 {
			t.Errorf("layout %d: %d services imported, want its six: %v", l, len(ls), tos)
		}
		for _, want := range []string{s.Notice, s.RosterNotice, s.Plan} {
			if !slices.Contains(ln, want) {
				t.Errorf("layout %d: notice %s not imported (imports %v)", l, want, ln)
			}
		}
	}
	for _, si := range services {
		if !used["s "+si.To] {
			t.Errorf("service %s as %s: no layout's", si.Subject, si.To)
		}
	}
	for _, n := range notices {
		if !used["n "+n] {
			t.Errorf("notice %s: no layout's", n)
		}
	}
}

func TestPermits(t *testing.T) {
	for _, c := range []struct {
		perm, subject string
		want          bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.b", "a", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false},
		{">", "x", true},
		{"mesh.up.n1.>", "mesh.up.n1.decl", true},
		{"mesh.up.n1.>", "mesh.up.n2.decl", false},
		{"mesh.notice.n1.>", "mesh.notice.n1", false},
	} {
		if got := permits([]string{c.perm}, c.subject); got != c.want {
			t.Errorf("permits(%q, %q) = %v, want %v", c.perm, c.subject, got, c.want)
		}
	}
}
