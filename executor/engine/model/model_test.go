package model

import (
	"slices"
	"testing"
)

// The ADR's own cases, read from the model: the lockout it exists to
// prevent, the packet filter a converge started, and a unit the mesh
// brought taken back once nothing that brought it is declared.
func TestTheADRsCases(t *testing.T) {
	on := true
	pkg := func(module, name string) Resource {
		return Resource{Kind: "package", Module: module, ID: name, Name: name}
	}
	svc := func(module, unit, state string, enabled *bool) Resource {
		return Resource{Kind: "service", Module: module, ID: unit, Name: unit, State: state, Enabled: enabled}
	}
	apply := func(res ...Resource) Event { return Event{Apply: &Declaration{Resources: res}} }
	world := World{
		Units:    map[string]Unit{"pf": {}},
		Packages: map[string]Package{"openssh-server": {Brings: "ssh"}},
	}
	for _, c := range []struct {
		name   string
		events []Event
		// last: what the last apply asks of the init.
		last []string
	}{
		{"sshd unassigned while base installs openssh-server: ssh left running",
			[]Event{apply(pkg("base", "openssh-server"), svc("sshd", "ssh", "running", &on)), apply(pkg("base", "openssh-server"))}, nil},
		{"both unassigned: the mesh gave, the mesh takes back",
			[]Event{apply(pkg("base", "openssh-server"), svc("sshd", "ssh", "running", &on)), apply()}, []string{"disable ssh", "stop ssh"}},
		{"the package's module first, then the unit's: taken back then",
			[]Event{apply(pkg("base", "openssh-server"), svc("sshd", "ssh", "running", &on)), apply(svc("sshd", "ssh", "running", &on)), apply()}, []string{"disable ssh", "stop ssh"}},
		{"named with no state (restart_on only): never stopped",
			[]Event{apply(pkg("net", "openssh-server"), svc("net", "ssh", "", nil)), apply()}, nil},
		{"the packet filter a converge started and enabled: stopped and disabled again",
			[]Event{apply(svc("fw", "pf", "running", &on)), apply()}, []string{"disable pf", "stop pf"}},
		{"renamed: the found state stays with the unit",
			[]Event{apply(svc("fw", "pf", "running", &on)), apply(Resource{Kind: "service", Module: "edge", ID: "filter", Name: "pf", State: "running", Enabled: &on}), apply()}, []string{"disable pf", "stop pf"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, _ := Run(world, c.events)
			if got := res[len(res)-1].Init; !slices.Equal(got, c.last) {
				t.Fatalf("the last apply asks %q, want %q (%+v)", got, c.last, res)
			}
		})
	}
}
