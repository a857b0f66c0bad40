package control

import (
	"strings"
	"testing"
)

// nodeArgs is the commands table's, both ways: every command whose
// arguments name an existing node — NODE, [NODE], NODE[,NODE...], or NAME
// of the node group but node add's (a node to be) — is in it at that
// argument, and every entry is such a command's.
func TestNodeArgsAreTheTable(t *testing.T) {
	takes := map[string]int{}
	for _, c := range commands {
		for i, a := range strings.Fields(c.Args) {
			a = strings.Trim(strings.TrimSuffix(a, "[,NODE...]"), "[]")
			if a == "NODE" || a == "NAME" && strings.HasPrefix(c.Name, "node ") && c.Name != "node add" {
				takes[c.Name] = i
			}
		}
	}
	for name, i := range takes {
		if j, ok := nodeArgs[name]; !ok || j != i {
			t.Errorf("%s takes a node as argument %d; nodeArgs says %d (%v)", name, i, j, ok)
		}
	}
	for name := range nodeArgs {
		if _, ok := takes[name]; !ok {
			t.Errorf("nodeArgs has %s, which takes no node", name)
		}
	}
}
