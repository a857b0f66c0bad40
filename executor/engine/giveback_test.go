package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// ADR 0118 as one table: how a unit was found × what was declared (state
// running, stopped or none; enabled set or not) × whether the operator
// changed it since → the exact give-back (what the init is asked to do)
// and the report line, on undeclare. The same table runs on the real
// inits in the lab (tests/machines, TestGiveBackTableOn*).
//
// Found: running (and enabled), stopped (and disabled), absent (brought by
// a package of the same declaration whose maintainer script started and
// enabled it), masked (stopped), unknown (a record from before the host
// kept what it found). The operator's change flips the unit's running
// state and its enablement (unmasking a masked one).
func TestGiveBackTable(t *testing.T) {
	rows := GiveBackRows(t, "testdata/giveback.table")
	for _, row := range rows {
		f := row
		// A found state that is unknown stays unknown through every later
		// apply, of the same declaration or a changed one: each unknown
		// row runs again with two more applies of each before the
		// undeclare, which must then do what the row says.
		again := []string{""}
		if f[0] == "unknown" {
			again = append(again, "same", "changed")
		}
		for _, a := range again {
			c := giveBackCase{found: f[0], state: f[1], enabled: f[2] == "set", changed: f[3] == "changed",
				again: a, apply: f[4], undeclare: f[5], transcript: f[6], detail: f[7]}
			name := strings.Join(f[:4], "/")
			if a != "" {
				name += "/applied-again-" + a
			}
			t.Run(name, func(t *testing.T) { c.run(t) })
		}
	}
	if len(rows) != 5*3*2*2 {
		t.Fatalf("%d rows, want every combination (60)", len(rows))
	}
}

// GiveBackRows reads the table's rows, each split into its eight fields.
func GiveBackRows(t *testing.T, file string) [][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) != 8 {
			t.Fatalf("%s: %q has %d fields, not 8", file, line, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		rows = append(rows, f)
	}
	return rows
}

type giveBackCase struct {
	found, state     string
	enabled, changed bool
	// again is applied twice after the operator's change, before the
	// undeclare: "same" declaration, or a "changed" one (its state and
	// enablement declared otherwise); "" for neither.
	again                                string
	apply, undeclare, transcript, detail string
}

// changedService is the row's service declared otherwise: another state
// (running for none) and the other enablement (false for true, true for
// unset), so that applying it changes the unit.
func changedService(state string, enabled bool) string {
	state = map[string]string{"running": "stopped", "stopped": "running", "": "running"}[state]
	if enabled {
		return svc("u", "u", state, "false", "")
	}
	return svc("u", "u", state, "true", "")
}

func (c giveBackCase) run(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	pk := &fakePackages{have: map[string]string{}, repo: map[string]string{"u": "1.0"}}
	switch c.found {
	case "running":
		f.add("u.service", true, "enabled")
	case "stopped", "unknown":
		f.add("u.service", false, "disabled")
	case "masked":
		f.add("u.service", false, "masked")
	case "absent":
		// The package brings the unit, and its maintainer script starts
		// and enables it before the service step looks.
		pk.onInstall = func(string) {
			f.add("u.service", true, "enabled")
			pk.brings("u", "u.service")
		}
	}
	state := c.state
	if state == "none" {
		state = ""
	}
	enabled := ""
	if c.enabled {
		enabled = "true"
	}
	res := []string{svc("u", "u", state, enabled, "")}
	if c.found == "absent" {
		res = append([]string{`{"module":"web","id":"pkg","type":"package","name":"u"}`}, res...)
	}
	apply := func(doc string) *shapes.Report {
		t.Helper()
		d, err := shapes.ParseTrusted([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(h.state)
		if err != nil {
			t.Fatal(err)
		}
		st.Lock(time.Second)
		defer st.Unlock()
		return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: pk,
			Init: func() (initsys.Manager, error) { return f, nil }})
	}
	rep := apply(h.doc(res...))
	line := rep.Lines[len(rep.Lines)-1]
	if string(line.Outcome) != c.apply {
		t.Fatalf("apply: %s, want %s: %+v", line.Outcome, c.apply, rep.Lines)
	}
	if c.apply == "failed" && !strings.Contains(line.Detail, c.detail) {
		t.Fatalf("apply's line %q does not say %q", line.Detail, c.detail)
	}
	if c.found == "unknown" {
		// A record written before the host kept what it found.
		st, _ := store.Open(h.state)
		st.Lock(time.Second)
		e := *st.Get("service:u.service")
		e.Original = nil
		if err := st.Put(&e); err != nil {
			t.Fatal(err)
		}
		st.Commit()
		st.Unlock()
	}
	if c.changed {
		u := f.units["u.service"]
		u.Running = !u.Running
		if u.Enabled == "enabled" {
			u.Enabled = "disabled"
		} else {
			u.Enabled = "enabled"
			if c.found == "masked" {
				u.Enabled = "disabled" // unmasked by the operator
			}
		}
	}
	if c.again != "" {
		doc := h.doc(res...)
		if c.again == "changed" {
			doc = h.doc(changedService(state, c.enabled))
		}
		for i := range 2 {
			rep := apply(doc)
			if line := rep.Lines[len(rep.Lines)-1]; line.Outcome == shapes.Failed {
				t.Fatalf("applied again (%s, %d): %+v", c.again, i+1, rep.Lines)
			}
			st, err := store.Open(h.state)
			if err != nil {
				t.Fatal(err)
			}
			if e := st.Get("service:u.service"); e == nil || e.Original != nil {
				t.Fatalf("applied again (%s, %d), the found state is no longer unknown: %+v", c.again, i+1, e)
			}
		}
	}
	f.transcript()
	// The plan says what the undeclare will do, and does nothing.
	planned := h.applyWith(f, h.doc(), true)
	if got := f.transcript(); got != "" {
		t.Fatalf("plan changed the unit: %s", got)
	}
	rep = apply(h.doc())
	var got *shapes.Line
	for i := range rep.Lines {
		if rep.Lines[i].ID == "u" {
			got = &rep.Lines[i]
		}
	}
	transcript := f.transcript()
	if c.undeclare == "-" {
		if got != nil || transcript != "" {
			t.Fatalf("an apply that failed left something to undeclare: %+v %q", rep.Lines, transcript)
		}
		return
	}
	if got == nil {
		t.Fatalf("no line for the service on undeclare: %+v", rep.Lines)
	}
	if string(got.Outcome) != c.undeclare || transcript != c.transcript || !strings.Contains(got.Detail, c.detail) {
		t.Fatalf("undeclare: %s %q, transcript %q; want %s %q, transcript %q", got.Outcome, got.Detail, transcript, c.undeclare, c.detail, c.transcript)
	}
	for _, l := range planned.Lines {
		if l.ID == "u" && (l.Outcome != got.Outcome || strings.TrimPrefix(l.Detail, "would be ") != got.Detail) {
			t.Fatalf("plan said %s %q, the apply %s %q", l.Outcome, l.Detail, got.Outcome, got.Detail)
		}
	}
}

// A unit removed by hand since the host applied it: that line fails, the
// rest of the declaration (after it too) applies, and every later apply
// says the same instead of refusing the declaration whole. Undeclared, it
// is forgotten.
func TestServiceWhoseUnitWasRemovedByHand(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("web.service", false, "disabled")
	doc := func(content string) string {
		return h.doc(svc("web", "web", "running", "", ""),
			`{"module":"web","id":"conf","type":"file","path":"{root}/web.conf","content":"`+content+`"}`)
	}
	if rep := h.applyWith(f, doc("v1"), false); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep)
	}
	delete(f.units, "web.service") // removed by hand
	for _, content := range []string{"v2", "v3"} {
		rep := h.applyWith(f, doc(content), false)
		if rep.Outcome != shapes.Failed || len(rep.Lines) != 2 {
			t.Fatalf("%+v", rep)
		}
		if l := rep.Lines[0]; l.Outcome != shapes.Failed || !strings.Contains(l.Detail, `knows no unit "web.service" any more: it was removed since the host last applied it`) {
			t.Fatalf("%+v", l)
		}
		if l := rep.Lines[1]; l.Outcome != shapes.Applied {
			t.Fatalf("the resource after the removed unit was not applied: %+v", l)
		}
	}
	rep := h.applyWith(f, h.doc(), false)
	if l := rep.Lines[len(rep.Lines)-1]; l.ID != "web" || l.Outcome != shapes.Forgotten || !strings.Contains(l.Detail, "the unit is gone") {
		t.Fatalf("%+v", rep.Lines)
	}
}

// Settings given back by their own resources (a kept original restored)
// never restart a running service (ADR 0118).
func TestSettingsGivenBackDoNotRestart(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("nginx.service", true, "enabled")
	writeFile(t, h.p("nginx.conf"), "the operator's")
	doc := h.doc(`{"module":"web","id":"conf","type":"file","path":"{root}/nginx.conf","content":"the mesh's"}`,
		svc("nginx", "nginx", "running", "", `,"restart_on":["conf"]`))
	h.applyWith(f, doc, false)
	if got := f.transcript(); got != "restart nginx.service" {
		t.Fatalf("the declared change did not restart: %q", got)
	}
	rep := h.applyWith(f, h.doc(), false)
	if got := f.transcript(); got != "" {
		t.Fatalf("giving the settings back touched the unit: %q (%+v)", got, rep.Lines)
	}
	if b, _ := os.ReadFile(h.p("nginx.conf")); string(b) != "the operator's" {
		t.Fatalf("nginx.conf = %q", b)
	}
}

// On an init that names units bare (OpenRC, runit, s6), a unit this
// declaration's package brought is recorded under the init's own name from
// the first apply, so the second apply finds the same record — unchanged,
// not a second record and the first given back — and the undeclare still
// takes it back (found in the lab, TestGiveBackTableOnS6).
func TestAbsentUnitKeepsOneRecordUnderTheInitsName(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	pk := &fakePackages{have: map[string]string{}, repo: map[string]string{"u": "1.0"}}
	pk.onInstall = func(string) {
		f.add("u", true, "enabled")
		f.aliases["u.service"] = "u"
		pk.brings("u", "u")
	}
	apply := func(doc string) *shapes.Report {
		t.Helper()
		d, err := shapes.ParseTrusted([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		st, _ := store.Open(h.state)
		st.Lock(time.Second)
		defer st.Unlock()
		return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: pk,
			Init: func() (initsys.Manager, error) { return f, nil }})
	}
	doc := h.doc(`{"module":"web","id":"pkg","type":"package","name":"u"}`, svc("u", "u", "running", "true", ""))
	if rep := apply(doc); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep.Lines)
	}
	rep := apply(doc)
	if rep.Outcome != shapes.Unchanged || f.transcript() != "" {
		t.Fatalf("the second apply: %+v %q", rep.Lines, f.log)
	}
	if st, _ := store.Open(h.state); st.Get("service:u") == nil || st.Get("service:u.service") != nil {
		t.Fatalf("recorded under %v", st.Entries())
	}
	rep = apply(h.doc())
	if got := f.transcript(); got != "disable u; stop u" || !strings.Contains(fmt.Sprint(rep.Lines), "it did not exist before") {
		t.Fatalf("undeclare: %q %+v", got, rep.Lines)
	}
}

// A unit's found state is absent when the package that brings it — the one
// whose file the unit's definition is, by the package manager's database —
// is one the host installed (its own record says it was not found
// installed), whenever the service's record is first made: in the same
// apply as the package or a later one. Any other package does
// not count, not even one of the same declaration; a unit of a package
// found installed is found as it is.
func TestAUnitIsFoundAbsentOnlyWhenTheHostInstalledItsPackage(t *testing.T) {
	pkgU := `{"module":"web","id":"pkg","type":"package","name":"u"}`
	pkgOther := `{"module":"web","id":"other","type":"package","name":"other"}`
	service := svc("u", "u", "running", "true", "")
	const (
		stopBoth = "disable u.service; stop u.service"
		tookBack = "it did not exist before the declaration that brought it (the mesh gave, the mesh takes back)"
		wasThere = "it was running before the mesh; left as it is (running, enabled)"
	)
	for _, c := range []struct {
		name string
		// installed: u is found installed, its unit running and enabled.
		installed bool
		// unitOf is the package that owns the unit's file, and brings
		// the unit when the host installs it.
		unitOf  string
		applies [][]string
		// The service's line on its first apply, and on undeclare.
		apply                        shapes.Outcome
		applyDetail, undeclareDetail string
		undeclare                    shapes.Outcome
		transcript                   string
	}{
		{name: "package and service in one declaration", unitOf: "u", applies: [][]string{{pkgU, service}},
			apply: shapes.Applied, applyDetail: "brought by package u, which the host installed (found absent)", undeclare: shapes.Restored, undeclareDetail: tookBack, transcript: stopBoth},
		{name: "package in one apply, service in a later one", unitOf: "u", applies: [][]string{{pkgU}, {pkgU, service}},
			apply: shapes.Applied, applyDetail: "brought by package u, which the host installed (found absent)", undeclare: shapes.Restored, undeclareDetail: tookBack, transcript: stopBoth},
		{name: "package in one apply, service alone in a later one", unitOf: "u", applies: [][]string{{pkgU}, {service}},
			apply: shapes.Applied, applyDetail: "brought by package u, which the host installed (found absent)", undeclare: shapes.Restored, undeclareDetail: tookBack, transcript: stopBoth},
		{name: "package found installed, service in the same declaration", installed: true, unitOf: "u", applies: [][]string{{pkgU, service}},
			apply: shapes.Unchanged, applyDetail: "running, enabled", undeclare: shapes.Forgotten, undeclareDetail: wasThere},
		{name: "package found installed, service in a later apply", installed: true, unitOf: "u", applies: [][]string{{pkgU}, {pkgU, service}},
			apply: shapes.Unchanged, applyDetail: "running, enabled", undeclare: shapes.Forgotten, undeclareDetail: wasThere},
		{name: "another package of the declaration, not the one that brings the unit", unitOf: "u-common", applies: [][]string{{pkgOther, service}},
			apply: shapes.Unchanged, applyDetail: "running, enabled", undeclare: shapes.Forgotten, undeclareDetail: wasThere},
		{name: "another package the host installed earlier, not the one that brings the unit", installed: true, unitOf: "u", applies: [][]string{{pkgOther}, {pkgOther, service}},
			apply: shapes.Unchanged, applyDetail: "running, enabled", undeclare: shapes.Forgotten, undeclareDetail: wasThere},
		{name: "a unit no package owns, the host having installed a package", installed: true, applies: [][]string{{pkgOther}, {pkgOther, service}},
			apply: shapes.Unchanged, applyDetail: "running, enabled", undeclare: shapes.Forgotten, undeclareDetail: wasThere},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := newFakeInit()
			pk := &fakePackages{have: map[string]string{}, repo: map[string]string{"u": "1.0", "other": "2.0"}}
			if c.installed {
				pk.have["u"] = "1.0"
				f.add("u.service", true, "enabled")
				if c.unitOf != "" {
					pk.brings(c.unitOf, "u.service")
				}
			} else {
				// Installing the package that owns the unit (or, where
				// that is another one, the declared package) brings it,
				// and its maintainer script starts and enables it before
				// the service step looks.
				pk.onInstall = func(string) {
					f.add("u.service", true, "enabled")
					pk.brings(c.unitOf, "u.service")
				}
			}
			apply := func(doc string) *shapes.Report {
				t.Helper()
				d, err := shapes.ParseTrusted([]byte(doc))
				if err != nil {
					t.Fatal(err)
				}
				st, err := store.Open(h.state)
				if err != nil {
					t.Fatal(err)
				}
				st.Lock(time.Second)
				defer st.Unlock()
				return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: pk,
					Init: func() (initsys.Manager, error) { return f, nil }})
			}
			var line *shapes.Line
			for i, res := range c.applies {
				rep := apply(h.doc(res...))
				for j := range rep.Lines {
					if l := rep.Lines[j]; l.Outcome == shapes.Failed {
						t.Fatalf("apply %d: %+v", i+1, rep.Lines)
					} else if l.ID == "u" {
						line = &rep.Lines[j]
					}
				}
			}
			if line == nil || line.Outcome != c.apply || !strings.Contains(line.Detail, c.applyDetail) {
				t.Fatalf("the service's apply: %+v; want %s saying %q", line, c.apply, c.applyDetail)
			}
			f.transcript()
			var got *shapes.Line
			rep := apply(h.doc())
			for i := range rep.Lines {
				if rep.Lines[i].ID == "u" {
					got = &rep.Lines[i]
				}
			}
			if tr := f.transcript(); got == nil || got.Outcome != c.undeclare || !strings.Contains(got.Detail, c.undeclareDetail) || tr != c.transcript {
				t.Fatalf("undeclare: %+v, transcript %q; want %s saying %q, transcript %q", got, tr, c.undeclare, c.undeclareDetail, c.transcript)
			}
		})
	}
}

// Where the package manager cannot say who owns the unit's file, the found
// state is not guessed (it is recorded once, and a wrong one outlives the
// mistake): the service's line fails, nothing is recorded for it, and the
// next apply asks again.
func TestAFoundStateIsNotGuessedWhenThePackageManagerCannotSay(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	pk := &fakePackages{have: map[string]string{}, repo: map[string]string{"u": "1.0"}}
	pk.onInstall = func(string) {
		f.add("u.service", true, "enabled")
		pk.brings("u", "u.service")
	}
	apply := func(doc string) *shapes.Report {
		t.Helper()
		d, err := shapes.ParseTrusted([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		st, _ := store.Open(h.state)
		st.Lock(time.Second)
		defer st.Unlock()
		return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: pk,
			Init: func() (initsys.Manager, error) { return f, nil }})
	}
	pkg := `{"module":"web","id":"pkg","type":"package","name":"u"}`
	if rep := apply(h.doc(pkg)); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep.Lines)
	}
	pk.ownersErr = errors.New("dpkg-query: error: the database is broken")
	doc := h.doc(pkg, svc("u", "u", "running", "true", ""))
	rep := apply(doc)
	if l := rep.Lines[1]; l.Outcome != shapes.Failed || l.Detail != "cannot tell whether u.service comes with a package the host installed, so not the state it was found in either: dpkg-query: error: the database is broken" {
		t.Fatalf("%+v", rep.Lines)
	}
	if st, _ := store.Open(h.state); st.Get("service:u.service") != nil {
		t.Fatal("a found state was recorded that nobody could tell")
	}
	pk.ownersErr = nil
	if rep := apply(doc); !strings.Contains(rep.Lines[1].Detail, "brought by package u, which the host installed (found absent)") {
		t.Fatalf("asked again: %+v", rep.Lines)
	}
}

// The files a unit's package may own: systemd's unit file in each of its
// directories (an instance's by its template too), and the bare name's
// OpenRC script and runit and s6 run scripts.
func TestUnitDefinitions(t *testing.T) {
	for unit, want := range map[string][]string{
		"u.service":          {"/lib/systemd/system/u.service", "/usr/lib/systemd/system/u.service", "/etc/systemd/system/u.service", "/etc/init.d/u", "/etc/sv/u/run", "/etc/s6/scan/u/run"},
		"getty@tty1.service": {"/lib/systemd/system/getty@.service", "/lib/systemd/system/getty@tty1.service", "/etc/init.d/getty@tty1"},
		"u":                  {"/lib/systemd/system/u", "/etc/init.d/u", "/etc/service/u/run"},
	} {
		got := unitDefinitions(unit)
		for _, p := range want {
			if !slices.Contains(got, p) {
				t.Errorf("%s: %s is not among %q", unit, p, got)
			}
		}
	}
}
