package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// crossHarness applies declarations composed of several modules, with a
// transcript init and a fake package manager whose installs bring units
// the way Debian's maintainer scripts do (started and enabled).
type crossHarness struct {
	*harness
	f  *fakeInit
	pk *fakePackages
}

func newCrossHarness(t *testing.T) *crossHarness {
	h := &crossHarness{harness: newHarness(t), f: newFakeInit(),
		pk: &fakePackages{have: map[string]string{}, repo: map[string]string{}, files: map[string]string{}}}
	return h
}

// bringsUnit makes installing pkg bring unit, started and enabled by the
// package's own scripts before the service step looks.
func (h *crossHarness) bringsUnit(pkg, unit string) {
	h.pk.repo[pkg] = "1.0"
	prev := h.pk.onInstall
	h.pk.onInstall = func(p string) {
		if prev != nil {
			prev(p)
		}
		if p == pkg {
			h.f.add(unit, true, "enabled")
			h.pk.brings(pkg, unit)
		}
	}
}

func (h *crossHarness) applyDoc(doc string, plan bool) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatalf("parse: %v\n%s", err, doc)
	}
	st, err := store.Open(h.state)
	if err != nil {
		h.t.Fatal(err)
	}
	if !plan {
		st.Lock(time.Second)
		defer st.Unlock()
	}
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: plan, packages: h.pk,
		Init: func() (initsys.Manager, error) { return h.f, nil }})
}

// lineOf is the report's line for module.id, nil when there is none.
func lineOf(rep *shapes.Report, module, id string) *shapes.Line {
	for i := range rep.Lines {
		if rep.Lines[i].Module == module && rep.Lines[i].ID == id {
			return &rep.Lines[i]
		}
	}
	return nil
}

// The lockout ADR 0118 exists to prevent, across modules. Module base
// declares the ssh daemon's package (the host installs it; its scripts
// start and enable the unit); module sshd declares the unit, its settings
// and restart_on. Unassigning sshd while base is still assigned leaves the
// daemon running and enabled: the unit came with a package a declaration
// still names, so it is not given back to "absent". The same for the
// container runtime a private network names only for restart_on (no
// state): undeclaring it never stops it, whoever installed it.
func TestUnassigningAModuleNeverStopsAUnitAnotherModulesPackageBrought(t *testing.T) {
	pkg := func(module, name string) string {
		return `{"module":"` + module + `","id":"` + name + `","type":"package","name":"` + name + `"}`
	}
	conf := func(module, id string) string {
		return `{"module":"` + module + `","id":"` + id + `","type":"file","path":"{root}/` + module + `-` + id + `","content":"x"}`
	}
	service := func(module, id, unit, state, enabled, restartOn string) string {
		s := `{"module":"` + module + `","id":"` + id + `","type":"service","unit":"` + unit + `"`
		if state != "" {
			s += `,"state":"` + state + `"`
		}
		if enabled != "" {
			s += `,"enabled":` + enabled
		}
		return s + `,"restart_on":["` + restartOn + `"]}`
	}
	for _, c := range []struct {
		name, pkg, unit string
		// kept: the declaration that stays; all: it and the module
		// unassigned, which names the unit.
		kept, all []string
		module    string // the unassigned module
		detail    string // what the unassigned unit's line says
	}{
		{name: "sshd unassigned, base keeps openssh-server", pkg: "openssh-server", unit: "ssh.service",
			kept:   []string{pkg("base", "openssh-server")},
			all:    []string{pkg("base", "openssh-server"), conf("sshd", "config"), service("sshd", "ssh", "ssh", "running", "true", "config")},
			module: "sshd", detail: "it came with package openssh-server, which base.openssh-server still declares"},
		{name: "net unassigned, the runtime named only for restart_on", pkg: "containerd", unit: "docker.service",
			kept:   []string{pkg("runtime", "containerd")},
			all:    []string{pkg("runtime", "containerd"), conf("net", "registry"), service("net", "docker", "docker", "", "", "registry")},
			module: "net", detail: "left as it is (running, enabled)"},
		{name: "net unassigned with its package, the runtime named only for restart_on", pkg: "containerd", unit: "docker.service",
			kept:   nil,
			all:    []string{pkg("net", "containerd"), conf("net", "registry"), service("net", "docker", "docker", "", "", "registry")},
			module: "net", detail: "declared with no state: the host never started or stopped it; its enablement was never declared; left as it is (running, enabled)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newCrossHarness(t)
			h.bringsUnit(c.pkg, c.unit)
			if rep := h.applyDoc(h.doc(c.all...), false); rep.Outcome == shapes.Failed {
				t.Fatalf("assign: %+v", rep.Lines)
			}
			h.f.transcript()
			kept := h.doc(c.kept...)
			plan := h.applyDoc(kept, true)
			rep := h.applyDoc(kept, false)
			id := strings.TrimSuffix(c.unit, ".service")
			l, pl := lineOf(rep, c.module, id), lineOf(plan, c.module, id)
			if got := h.f.transcript(); got != "" {
				t.Fatalf("unassigning %s asked the init: %q (%+v)", c.module, got, l)
			}
			if l == nil || l.Outcome != shapes.Forgotten || !strings.Contains(l.Detail, c.detail) {
				t.Fatalf("unassigning %s: %+v; want forgotten saying %q", c.module, l, c.detail)
			}
			if pl == nil || pl.Outcome != l.Outcome || pl.Detail != l.Detail {
				t.Fatalf("the plan said %+v, the apply %+v", pl, l)
			}
			if u := h.f.units[c.unit]; !u.Running || u.Enabled != "enabled" {
				t.Fatalf("%s is %+v", c.unit, u)
			}
			// Then the package's module goes too: the package is
			// forgotten, never uninstalled, and the unit it brought,
			// which no declaration names now, is left as it is.
			if c.kept != nil {
				h.applyDoc(h.doc(), false)
				if got := h.f.transcript(); got != "" {
					t.Fatalf("unassigning the package's module asked the init: %q", got)
				}
			}
		})
	}
}

// The other order: the package's module goes first (the package is
// forgotten, never uninstalled), then the unit's. Nothing that brought the
// unit is declared any more, so it is given back to absent: stopped and
// disabled, the mesh having given it. And a package another source still
// declares (the bundle) keeps the unit as it is, as one of this source does.
func TestAUnitIsGivenBackToAbsentOnlyOnceItsPackageIsUndeclared(t *testing.T) {
	pkg := `{"module":"base","id":"sshd-pkg","type":"package","name":"openssh-server"}`
	service := `{"module":"sshd","id":"ssh","type":"service","unit":"ssh","state":"running","enabled":true}`
	t.Run("package first, then the unit", func(t *testing.T) {
		h := newCrossHarness(t)
		h.bringsUnit("openssh-server", "ssh.service")
		h.applyDoc(h.doc(pkg, service), false)
		h.f.transcript()
		rep := h.applyDoc(h.doc(service), false)
		if got := h.f.transcript(); got != "" || lineOf(rep, "base", "sshd-pkg").Outcome != shapes.Forgotten {
			t.Fatalf("the package undeclared: %q %+v", got, rep.Lines)
		}
		rep = h.applyDoc(h.doc(), false)
		if got := h.f.transcript(); got != "disable ssh.service; stop ssh.service" {
			t.Fatalf("the unit undeclared after its package: %q %+v", got, rep.Lines)
		}
	})
	t.Run("package declared by another source", func(t *testing.T) {
		h := newCrossHarness(t)
		h.bringsUnit("openssh-server", "ssh.service")
		st, _ := store.Open(h.state)
		st.Lock(time.Second)
		d, _ := shapes.ParseTrusted([]byte(h.doc(pkg)))
		Apply(context.Background(), st, d, []byte(h.doc(pkg)), Options{Source: store.Bundle, packages: h.pk})
		st.Unlock()
		h.applyDoc(h.doc(service), false)
		h.f.transcript()
		rep := h.applyDoc(h.doc(), false)
		l := lineOf(rep, "sshd", "ssh")
		if got := h.f.transcript(); got != "" || l == nil || !strings.Contains(l.Detail, "package openssh-server, which bundle:base.sshd-pkg still declares") {
			t.Fatalf("%q %+v", got, rep.Lines)
		}
	})
}

// A resource renamed — its id in a new catalogue version, or moved to
// another module — manages the same unit: the state the unit was first
// found in stays with it (it is the unit's, not the id's), the rename
// changes nothing on the machine, and undeclaring the new id gives back
// what was found before the old one touched it. A package renamed beside
// it still brings the unit, so its unit found absent is not given back
// while the package is declared under its new id.
func TestARenamedResourceKeepsTheUnitsFoundState(t *testing.T) {
	for _, c := range []struct{ name, first, renamed string }{
		{"new id", `{"module":"web","id":"pf","type":"service","unit":"pf","state":"running","enabled":true}`,
			`{"module":"web","id":"packet-filter","type":"service","unit":"pf","state":"running","enabled":true}`},
		{"another module", `{"module":"web","id":"pf","type":"service","unit":"pf","state":"running","enabled":true}`,
			`{"module":"edge","id":"pf","type":"service","unit":"pf.service","state":"running","enabled":true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newCrossHarness(t)
			h.f.add("pf.service", false, "disabled")
			h.applyDoc(h.doc(c.first), false)
			if got := h.f.transcript(); got != "enable pf.service; start pf.service" {
				t.Fatalf("first apply: %q", got)
			}
			for i := range 2 {
				// A plan of the rename says what the apply does: the old
				// name released, nothing given back (it said the unit
				// would be stopped and disabled: a plan writes no new
				// name into the unit's record; model seed 167).
				plan := h.applyDoc(h.doc(c.renamed), true)
				rep := h.applyDoc(h.doc(c.renamed), false)
				if got := h.f.transcript(); got != "" || rep.Outcome == shapes.Failed || rep.Outcome == shapes.Restored {
					t.Fatalf("renamed (%d): %q %+v", i+1, got, rep.Lines)
				}
				if p, a := outcomes(plan), outcomes(rep); p != a {
					t.Fatalf("renamed (%d): the plan says %s, the apply did %s\n%+v", i+1, p, a, plan.Lines)
				}
			}
			st, _ := store.Open(h.state)
			if e := st.Get("service:pf.service"); e == nil || e.Original == nil || e.Original.Running || e.Original.Absent {
				t.Fatalf("the found state after the rename: %+v", e)
			}
			rep := h.applyDoc(h.doc(), false)
			if got := h.f.transcript(); got != "disable pf.service; stop pf.service" || rep.Outcome != shapes.Restored {
				t.Fatalf("undeclared after the rename: %q %+v", got, rep.Lines)
			}
		})
	}
	t.Run("package and unit renamed, then the unit undeclared", func(t *testing.T) {
		h := newCrossHarness(t)
		h.bringsUnit("openssh-server", "ssh.service")
		service := `{"module":"sshd","id":"ssh","type":"service","unit":"ssh","state":"running"}`
		h.applyDoc(h.doc(`{"module":"base","id":"sshd","type":"package","name":"openssh-server"}`, service), false)
		renamed := `{"module":"base","id":"openssh","type":"package","name":"openssh-server"}`
		h.applyDoc(h.doc(renamed, strings.Replace(service, `"id":"ssh"`, `"id":"daemon"`, 1)), false)
		h.applyDoc(h.doc(renamed), false)
		if got := h.f.transcript(); got != "" {
			t.Fatalf("the unit was given back while its package is declared under its new id: %q", got)
		}
	})
}

// On an adopted node a held unit is held-changed only where something else
// changed what the host recorded of it: whether it ran, and its enablement
// once a declaration set it. A unit held with no enabled declared, found
// and left as it is, was said held-changed at every apply after the first
// (its unrecorded enablement compared as changed); a unit brought by a
// package the host installed recorded its enablement only at the next
// apply, so an operator's change in between went unseen. Both found by the
// differential test against the model (seeds 5 and 436).
func TestAHeldUnitIsChangedOnlyInWhatWasRecorded(t *testing.T) {
	adopted := func(h *crossHarness, res ...string) string {
		return strings.Replace(h.doc(res...), `{"version":1,`, `{"version":1,"adopted":true,`, 1)
	}
	t.Run("no enabled declared, nothing changed", func(t *testing.T) {
		h := newCrossHarness(t)
		h.f.add("mu.service", false, "disabled")
		doc := adopted(h, `{"module":"m","id":"mu","type":"service","unit":"mu","state":"stopped"}`)
		for i := range 3 {
			if rep := h.applyDoc(doc, false); rep.Outcome != shapes.Held {
				t.Fatalf("apply %d: %+v", i+1, rep.Lines)
			}
		}
	})
	t.Run("brought by the host's package, enablement changed by the operator", func(t *testing.T) {
		h := newCrossHarness(t)
		h.bringsUnit("p", "pu.service")
		doc := adopted(h, `{"module":"base","id":"p","type":"package","name":"p"}`,
			`{"module":"m","id":"pu","type":"service","unit":"pu","state":"running","enabled":true}`)
		// Planned first: the unit comes with the package, which a plan does
		// not install, and the plan says what the apply does with it — holds
		// it (it said applied, found by the model's sequences planned
		// before each apply, seed 7).
		if plan := h.applyDoc(doc, true); lineOf(plan, "m", "pu").Outcome != shapes.Held {
			t.Fatalf("planned: %+v", plan.Lines)
		}
		if rep := h.applyDoc(doc, false); lineOf(rep, "m", "pu").Outcome != shapes.Held {
			t.Fatalf("%+v", rep.Lines)
		}
		h.f.units["pu.service"].Enabled = "disabled"
		if rep := h.applyDoc(doc, false); lineOf(rep, "m", "pu").Outcome != shapes.HeldChanged {
			t.Fatalf("the operator's change since it was found went unseen: %+v", rep.Lines)
		}
	})
}

// A service declared on the unit the mesh made for a process — a rescue
// file stopping the mesh's program, or a declaration turning the process
// into a service — is refused before anything is touched: taken over as a
// unit the host found, the unit's definition would be left behind when
// the process goes, and the process refused from then on as a unit the
// mesh did not create.
// A process named after a unit the host defined by a file of its own is
// refused as any unit is — a process never takes one over — and the
// refusal says the file, and what to do, rather than that the mesh did
// not create the unit.
func TestAProcessOverAUnitFileTheHostWroteSaysSo(t *testing.T) {
	h := newCrossHarness(t)
	h.f.add("lp.service", true, "enabled")
	st, err := store.Open(h.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	// As an apply of a file at the unit's path records it (the path is
	// the machine's, not written here).
	if err := st.Put(&store.Entry{Target: "path:/etc/systemd/system/lp.service", Type: shapes.TypeFile, Created: true, Digest: "x",
		Claims: []store.Claim{{Source: store.Local, Module: "units", ID: "lp"}}}); err != nil {
		t.Fatal(err)
	}
	st.Unlock()
	rep := h.applyDoc(`{"version":1,"resources":[{"module":"app","id":"lp","type":"process","name":"lp","exec":["/bin/sleep","60"],"user":"nobody"}]}`, false)
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "defined by /etc/systemd/system/lp.service, a file the host made for local:units.lp") || strings.Contains(rep.Refused, "did not create") {
		t.Fatalf("%s %q", rep.Outcome, rep.Refused)
	}
}

func TestAServiceNeverTakesOverAProcesssUnit(t *testing.T) {
	h := newCrossHarness(t)
	unitFile := h.p("lp.service")
	if err := osWriteFile(unitFile, "[Service]\n"); err != nil {
		t.Fatal(err)
	}
	h.f.add("lp.service", true, "enabled")
	st, err := store.Open(h.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	made := &store.Entry{Target: "service:lp.service", Type: shapes.TypeProcess, Created: true, Paths: []string{unitFile},
		Claims: []store.Claim{{Source: store.Link, Module: "app", ID: "api"}}}
	if err := st.Put(made); err != nil {
		t.Fatal(err)
	}
	st.Unlock()
	rep := h.applyDoc(`{"version":1,"resources":[{"module":"rescue","id":"lp","type":"service","unit":"lp","state":"stopped"}]}`, false)
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "never takes over a process's unit") || !strings.Contains(rep.Refused, "link:app.api") {
		t.Fatalf("a service over a process's unit: %s %s %+v", rep.Outcome, rep.Refused, rep.Lines)
	}
	st, _ = store.Open(h.state)
	if e := st.Get("service:lp.service"); e == nil || e.Type != shapes.TypeProcess || !e.Created || len(e.Paths) != 1 {
		t.Fatalf("the process's record after: %+v", e)
	}
	if s, _ := h.f.State(context.Background(), "lp.service"); !s.Running {
		t.Fatal("the unit was stopped by a refused declaration")
	}
}
