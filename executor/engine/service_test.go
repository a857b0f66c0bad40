package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// fakeInit is the init as a transcript: units with their state, and a
// line per change the engine asked for. The real systemd is driven in the
// lab; this holds the engine's logic (ADR 0118) to its table.
type fakeInit struct {
	units   map[string]*initsys.State
	aliases map[string]string
	log     []string
	// restarting, when set, is told of each restart as it is asked.
	restarting func(unit string)
}

func newFakeInit() *fakeInit {
	return &fakeInit{units: map[string]*initsys.State{}, aliases: map[string]string{}}
}

func (f *fakeInit) add(name string, running bool, enabled string) {
	f.units[name] = &initsys.State{Name: name, Known: true, Running: running, Enabled: enabled}
}

func (f *fakeInit) Name() string { return "fake-init" }
func (f *fakeInit) Close() error { return nil }
func (f *fakeInit) unit(u string) *initsys.State {
	if a, ok := f.aliases[u]; ok {
		u = a
	}
	return f.units[u]
}
func (f *fakeInit) State(_ context.Context, u string) (initsys.State, error) {
	if s := f.unit(u); s != nil {
		return *s, nil
	}
	return initsys.State{Name: u}, nil
}
func (f *fakeInit) do(verb, u string, apply func(*initsys.State)) error {
	s := f.unit(u)
	if s == nil {
		return fmt.Errorf("no unit %s", u)
	}
	f.log = append(f.log, verb+" "+s.Name)
	apply(s)
	return nil
}
func (f *fakeInit) Start(_ context.Context, u string) error {
	if s := f.unit(u); s != nil && s.Enabled == "masked" {
		return fmt.Errorf("unit %s is masked", u)
	}
	return f.do("start", u, func(s *initsys.State) { s.Running = true })
}
func (f *fakeInit) Stop(_ context.Context, u string) error {
	return f.do("stop", u, func(s *initsys.State) { s.Running = false })
}
func (f *fakeInit) Restart(_ context.Context, u string) error {
	if f.restarting != nil {
		f.restarting(u)
	}
	return f.do("restart", u, func(s *initsys.State) { s.Running = true })
}
func (f *fakeInit) SetEnabled(_ context.Context, u string, on bool) error {
	if s := f.unit(u); s != nil && s.Enabled == "masked" {
		return fmt.Errorf("unit %s is masked", u)
	}
	verb := "disable"
	if on {
		verb = "enable"
	}
	return f.do(verb, u, func(s *initsys.State) {
		s.Enabled = "disabled"
		if on {
			s.Enabled = "enabled"
		}
	})
}

func (f *fakeInit) Reload(context.Context) error {
	f.log = append(f.log, "reload")
	return nil
}

func (f *fakeInit) transcript() string {
	t := strings.Join(f.log, "; ")
	f.log = nil
	return t
}

func (h *harness) applyWith(f *fakeInit, doc string, plan bool) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatalf("parse: %v", err)
	}
	st, err := store.Open(h.state)
	if err != nil {
		h.t.Fatal(err)
	}
	if !plan {
		st.Lock(time.Second)
		defer st.Unlock()
	}
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: plan,
		Init: func() (initsys.Manager, error) { return f, nil }})
}

func svc(id, unit, state string, enabled string, extra string) string {
	s := fmt.Sprintf(`{"module":"web","id":%q,"type":"service","unit":%q`, id, unit)
	if state != "" {
		s += fmt.Sprintf(`,"state":%q`, state)
	}
	if enabled != "" {
		s += `,"enabled":` + enabled
	}
	return s + extra + "}"
}

// ADR 0118, line by line: what the host gives back when a service is
// undeclared depends on the state it first found the unit in.
func TestServiceGivesBackTheStateItFound(t *testing.T) {
	cases := []struct {
		name                string
		found               func(f *fakeInit)
		decl                string
		apply, applyLog     string
		undeclare, giveBack string
		detail              string
	}{
		{"started and enabled by the mesh: stopped and disabled again",
			func(f *fakeInit) { f.add("pf.service", false, "disabled") }, svc("pf", "pf", "running", "true", ""),
			"applied", "enable pf.service; start pf.service", "restored", "disable pf.service; stop pf.service", "stopped again and disabled again, as the host found it"},
		{"found running: left running",
			func(f *fakeInit) { f.add("ssh.service", true, "enabled") }, svc("ssh", "ssh", "running", "true", ""),
			"unchanged", "", "forgotten", "", "it was running before the mesh; left as it is"},
		{"stopped by the mesh: never started on the way out",
			func(f *fakeInit) { f.add("cups.service", true, "enabled") }, svc("cups", "cups", "stopped", "", ""),
			"applied", "stop cups.service", "forgotten", "", "never started on the way out"},
		{"no state: the mesh must not start it",
			func(f *fakeInit) { f.add("docker.service", false, "enabled") }, svc("docker", "docker", "", "", ""),
			"unchanged", "", "forgotten", "", "declared with no state: the host never started or stopped it"},
		{"enabled by the mesh, found running: disabled again, not stopped",
			func(f *fakeInit) { f.add("nm.service", true, "disabled") }, svc("nm", "nm", "running", "true", ""),
			"applied", "enable nm.service", "restored", "disable nm.service", "disabled again, as the host found it"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := newFakeInit()
			c.found(f)
			rep := h.applyWith(f, h.doc(c.decl), false)
			if rep.Outcome != shapes.Outcome(c.apply) || f.transcript() != c.applyLog {
				t.Fatalf("apply: %s %+v, transcript %q", rep.Outcome, rep.Lines, f.log)
			}
			// Planned first: the plan names what the undeclare will do.
			plan := h.applyWith(f, h.doc(), true)
			if f.transcript() != "" || plan.Lines[0].Outcome != shapes.Outcome(c.undeclare) {
				t.Fatalf("plan changed something or disagrees: %+v", plan.Lines)
			}
			rep = h.applyWith(f, h.doc(), false)
			if rep.Outcome != shapes.Outcome(c.undeclare) || f.transcript() != c.giveBack || !strings.Contains(rep.Lines[0].Detail, c.detail) {
				t.Fatalf("undeclare: %s %+v, transcript %q", rep.Outcome, rep.Lines, f.log)
			}
		})
	}
}

// What the host did under one declaration is its change still when the
// next declares the unit with no state or enablement: undeclared after
// it, the unit is given back as found (ADR 0118) — not forgotten because
// the last declaration said nothing of it.
func TestAServiceTheHostStartedIsGivenBackThoughTheLastDeclarationSaidNothing(t *testing.T) {
	cases := []struct {
		name          string
		running       bool
		enabled       string
		first, second string
		giveBack, say string
	}{
		{"started and enabled, then declared with neither", false, "disabled",
			svc("pf", "pf", "running", "true", ""), svc("pf", "pf", "", "", ""),
			"disable pf.service; stop pf.service", "stopped again and disabled again, as the host found it"},
		{"started, then declared enabled only", false, "enabled",
			svc("pf", "pf", "running", "", ""), svc("pf", "pf", "", "true", ""),
			"stop pf.service", "stopped again, as the host found it"},
		{"started, then stopped, then declared with no state: nothing started on the way out", false, "enabled",
			svc("pf", "pf", "running", "", ""), svc("pf", "pf", "stopped", "", ""),
			"", "stopped, as it was found"},
		{"enabled, then declared with neither", false, "disabled",
			svc("pf", "pf", "", "true", ""), svc("pf", "pf", "", "", ""),
			"disable pf.service", "disabled again, as the host found it"},
		{"kept disabled, then declared with neither, then enabled by hand: left enabled", false, "disabled",
			svc("pf", "pf", "", "false", ""), svc("pf", "pf", "", "", ""),
			"", "said disabled: enabled since by someone else"},
		{"enabled, then disabled, then enabled by hand: left enabled", false, "disabled",
			svc("pf", "pf", "", "true", ""), svc("pf", "pf", "", "false", ""),
			"", "said disabled: enabled since by someone else"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := newFakeInit()
			f.add("pf.service", c.running, c.enabled)
			if rep := h.applyWith(f, h.doc(c.first), false); rep.Outcome != shapes.Applied && rep.Outcome != shapes.Unchanged {
				t.Fatalf("first: %s %+v", rep.Outcome, rep.Lines)
			}
			f.transcript()
			h.applyWith(f, h.doc(c.second), false)
			if c.second == svc("pf", "pf", "stopped", "", "") {
				h.applyWith(f, h.doc(svc("pf", "pf", "", "", "")), false)
			}
			if strings.Contains(c.name, "by hand") {
				f.unit("pf.service").Enabled = "enabled" // an operator's systemctl enable
			}
			f.transcript()
			plan := h.applyWith(f, h.doc(), true)
			rep := h.applyWith(f, h.doc(), false)
			if got := f.transcript(); got != c.giveBack || !strings.Contains(rep.Lines[0].Detail, c.say) || plan.Lines[0].Outcome != rep.Lines[0].Outcome {
				t.Fatalf("undeclared: %s %+v (planned %+v), transcript %q", rep.Outcome, rep.Lines, plan.Lines, got)
			}
		})
	}
}

func TestServiceFoundStateIsRecordedOnce(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	h.applyWith(f, h.doc(svc("pf", "pf", "running", "", "")), false)
	// Drift: stopped by hand; repaired, and the found state is still "stopped".
	f.units["pf.service"].Running = false
	rep := h.applyWith(f, h.doc(svc("pf", "pf", "running", "", "")), false)
	if rep.Outcome != shapes.Repaired || f.transcript() != "start pf.service; start pf.service" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	rep = h.applyWith(f, h.doc(), false)
	if rep.Outcome != shapes.Restored || f.transcript() != "stop pf.service" {
		t.Fatalf("the found state was overwritten: %+v %q", rep.Lines, f.log)
	}
}

func TestRestartOn(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("nginx.service", true, "enabled")
	f.add("idle.service", false, "disabled")
	f.add("off.service", true, "enabled")
	conf := func(content string) string {
		return `{"module":"base","id":"conf","type":"file","path":"{root}/nginx.conf","content":"` + content + `"}`
	}
	doc := func(content string) string {
		return h.doc(conf(content),
			svc("nginx", "nginx", "running", "", `,"restart_on":["base.conf"]`),
			svc("idle", "idle", "", "", `,"restart_on":["base.conf"]`),
			svc("off", "off", "stopped", "", `,"restart_on":["base.conf"]`))
	}
	rep := h.applyWith(f, doc("v1"), false)
	// nginx restarted after the last step; idle (no state) not running: not
	// started; off is stopped by its own declaration, and not restarted.
	if got := f.transcript(); got != "stop off.service; restart nginx.service" {
		t.Fatalf("transcript %q", got)
	}
	if !strings.Contains(fmt.Sprint(rep.Lines), "restarted: base.conf changed") || !strings.Contains(fmt.Sprint(rep.Lines), "not running: not started") {
		t.Fatalf("%+v", rep.Lines)
	}
	// Nothing changed: no restart.
	h.applyWith(f, doc("v1"), false)
	if got := f.transcript(); got != "" {
		t.Fatalf("restarted with nothing changed: %q", got)
	}
	// A drift repair of the file restarts too.
	writeFile(t, h.p("nginx.conf"), "vandal")
	h.applyWith(f, doc("v1"), false)
	if got := f.transcript(); got != "restart nginx.service" {
		t.Fatalf("drift repair did not restart: %q", got)
	}
}

// A unit this apply starts read its files as they are when it started:
// a file restart_on names that changed before the start is not a reason to
// restart it again, one that changes after it (declared after the service)
// is. The plan says exactly what the apply then does (DESIGN, the engine).
func TestRestartOnAUnitThisApplyStarts(t *testing.T) {
	conf := func(id, content string) string {
		return `{"module":"web","id":"` + id + `","type":"file","path":"{root}/` + id + `.conf","content":"` + content + `"}`
	}
	web := func(on string) string { return svc("web", "web", "running", "", `,"restart_on":[`+on+`]`) }
	cases := []struct {
		name    string
		running bool // the unit as found
		hands   bool // applied first, then stopped and its file edited by hand
		decl    func(content string) []string
		log     string
		detail  string
	}{
		{"a file before it: started, not restarted", false, false,
			func(c string) []string { return []string{conf("early", c), web(`"early"`)} },
			"start web.service", "started (found stopped, enabled); the state it was found in is kept and given back when this is undeclared; web.early changed before this apply started it: not restarted"},
		{"a file after it: started, then restarted", false, false,
			func(c string) []string { return []string{conf("early", c), web(`"early","late"`), conf("late", c)} },
			"start web.service; restart web.service", "; restarted: web.late changed after this apply started it"},
		{"running already: restarted", true, false,
			func(c string) []string { return []string{conf("early", c), web(`"early"`)} },
			"restart web.service", "running, enabled; restarted: web.early changed"},
		{"stopped by hand and its file edited: started, not restarted", false, true,
			func(c string) []string { return []string{conf("early", c), web(`"early"`)} },
			"start web.service", "service repaired: started (found stopped, enabled); web.early changed before this apply started it: not restarted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := newFakeInit()
			f.add("web.service", c.running, "enabled")
			doc := h.doc(c.decl("v1")...)
			if c.hands {
				h.applyWith(f, doc, false)
				f.units["web.service"].Running = false
				writeFile(t, h.p("early.conf"), "edited")
				f.transcript()
			}
			plan := h.applyWith(f, doc, true)
			if got := f.transcript(); got != "" {
				t.Fatalf("the plan touched the unit: %q", got)
			}
			rep := h.applyWith(f, doc, false)
			if got := f.transcript(); got != c.log {
				t.Fatalf("transcript %q, want %q (%+v)", got, c.log, rep.Lines)
			}
			if p, a := linesOf(plan), linesOf(rep); p != a {
				t.Fatalf("plan and apply differ\nplan:\n%s\napply:\n%s", p, a)
			}
			if !strings.Contains(linesOf(rep), c.detail) {
				t.Fatalf("no line says %q:\n%s", c.detail, linesOf(rep))
			}
		})
	}
}

func TestServiceRefusals(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("ssh.service", true, "enabled")
	f.add("mesh-agent.service", true, "enabled")
	f.aliases["innocent.service"] = "mesh-agent.service"
	f.aliases["sshd.service"] = "ssh.service"
	for _, c := range []struct{ doc, want string }{
		{h.doc(svc("x", "nosuch", "running", "", "")), `fake-init knows no unit "nosuch"`},
		{h.doc(svc("x", "innocent", "stopped", "", "")), `"innocent" is mesh-agent.service, the host's own unit`},
		{h.doc(svc("a", "ssh", "running", "", ""), svc("b", "sshd", "stopped", "", "")), `"sshd" is ssh.service, which web.a declares too`},
	} {
		rep := h.applyWith(f, c.doc, false)
		if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, c.want) || f.transcript() != "" {
			t.Errorf("%+v, want refusal %q", rep, c.want)
		}
	}
}

func TestServiceHeldOnAdoptedNode(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("ssh.service", true, "enabled")
	adopted := strings.Replace(h.doc(svc("ssh", "ssh", "stopped", "false", "")), `{"version":1,`, `{"version":1,"adopted":true,`, 1)
	rep := h.applyWith(f, adopted, false)
	if rep.Outcome != shapes.Held || f.transcript() != "" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	f.units["ssh.service"].Running = false
	if rep = h.applyWith(f, adopted, false); rep.Outcome != shapes.HeldChanged || f.transcript() != "" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
}

// A held service whose record is from before the host kept what it found
// (Original nil): held again, then applied once its module is taken, it
// stays unknown, and its undeclare leaves the unit as it is (ADR 0118).
func TestServiceHeldWithUnknownFoundState(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("ssh.service", true, "enabled")
	adopted := func(taken string) string {
		return strings.Replace(h.doc(svc("ssh", "ssh", "stopped", "false", "")), `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	if rep := h.applyWith(f, adopted(""), false); rep.Outcome != shapes.Held {
		t.Fatalf("%+v", rep.Lines)
	}
	forgetFound(t, h, "service:ssh.service")
	for _, c := range []struct {
		taken   string
		outcome shapes.Outcome
		log     string
	}{
		{"", shapes.Held, ""},
		{`"web"`, shapes.Applied, "disable ssh.service; stop ssh.service"},
		{`"web"`, shapes.Unchanged, ""},
	} {
		rep := h.applyWith(f, adopted(c.taken), false)
		if rep.Outcome != c.outcome || f.transcript() != c.log {
			t.Fatalf("taken [%s]: %s %+v %q, want %s %q", c.taken, rep.Outcome, rep.Lines, f.log, c.outcome, c.log)
		}
		if st, _ := store.Open(h.state); st.Get("service:ssh.service").Original != nil {
			t.Fatalf("taken [%s]: the found state is no longer unknown: %+v", c.taken, st.Get("service:ssh.service"))
		}
	}
	rep := h.applyWith(f, h.doc(), false)
	if rep.Outcome != shapes.Forgotten || f.transcript() != "" || !strings.Contains(rep.Lines[0].Detail, "the state it was found in is unknown; left as it is") {
		t.Fatalf("undeclare: %+v %q", rep.Lines, f.log)
	}
}

// forgetFound makes target's record one from before the host kept what it
// found: its Original dropped.
func forgetFound(t *testing.T, h *harness, target string) {
	t.Helper()
	st, err := store.Open(h.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	defer st.Unlock()
	e := *st.Get(target)
	e.Original = nil
	if err := st.Put(&e); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := osWriteFile(p, content); err != nil {
		t.Fatal(err)
	}
}

// What an entry's digest keeps through an interrupted change (its digest
// otherwise blanked, the thing observed again): the last state,
// enablement, shell and home a declaration set, so a kill between a change and its record does
// not make the host's earlier change no one's.
func TestAnInterruptedChangeKeepsWhatTheHostDidBefore(t *testing.T) {
	for _, c := range []struct {
		typ, digest    string
		cut            string // the digest the change cut would have recorded, as its intent carries it
		enabledSet     bool   // a declaration before set the enablement (the record's found state says so)
		state, enabled string // lastStateOf, lastEnabledOf what is kept (services)
		shell, home    string // declaredUser of what is kept (users)
	}{
		{typ: shapes.TypeService, digest: "state=running enabled=-", state: "running"},
		{typ: shapes.TypeService, digest: "state= enabled=true was=stopped", state: "stopped", enabled: "true"},
		{typ: shapes.TypeService, digest: "state= enabled=- was-enabled=false"},
		{typ: shapes.TypeService, digest: "state= enabled=false"},
		{typ: shapes.TypeService, digest: "state= enabled=- was-enabled=-"},
		{typ: shapes.TypeService, digest: "state=stopped enabled=- was-enabled=true", state: "stopped", enabled: "true"},
		{typ: shapes.TypeService, digest: "state= enabled=-"},
		// The change cut is known: what either set that a give-back
		// reads (running, enabled) is kept, else the change's own.
		{typ: shapes.TypeService, digest: "state=stopped enabled=false", cut: "state=running enabled=false", state: "running", enabled: "false"},
		{typ: shapes.TypeService, digest: "state=running enabled=true", cut: "state=stopped enabled=false", state: "running", enabled: "true"},
		{typ: shapes.TypeService, digest: "state= enabled=- was=stopped", cut: "state= enabled=true was=stopped", state: "stopped", enabled: "true"},
		{typ: shapes.TypeService, digest: "state=stopped enabled=-", cut: "state= enabled=- was=stopped", state: "stopped"},
		{typ: shapes.TypeService, digest: "state= enabled=- was-enabled=-", cut: "state= enabled=- was-enabled=-", enabled: "-"},
		{typ: shapes.TypeService, digest: "", cut: "state=running enabled=-", state: "running"},
		// A record from before the last enablement was carried, some
		// declaration having set it: read as the host's, and kept so,
		// whatever the change cut would set.
		{typ: shapes.TypeService, digest: "state=running enabled=-", cut: "state=running enabled=false", enabledSet: true, state: "running", enabled: "true"},
		{typ: shapes.TypeService, digest: "state=running enabled=-", enabledSet: true, state: "running", enabled: "true"},
		{typ: shapes.TypeService, digest: "state=running enabled=-", cut: "state=running enabled=false", state: "running", enabled: "false"},
		{typ: shapes.TypeUser, digest: "shell=/bin/sh home= groups=", cut: "shell=/bin/zsh home= groups=", shell: "/bin/zsh"},
		{typ: shapes.TypeUser, digest: "shell=/bin/sh home=/h groups=", cut: "shell= home= groups=sudo was-shell=/bin/sh was-home=/h", shell: "/bin/sh", home: "/h"},
		{typ: shapes.TypeUser, digest: "shell=/bin/zsh home= groups=", shell: "/bin/zsh"},
		{typ: shapes.TypeUser, digest: "shell= home= groups=sudo was-home=/srv/a", home: "/srv/a"},
		{typ: shapes.TypeUser, digest: "shell=/bin/sh home=/h groups=", shell: "/bin/sh", home: "/h"},
		{typ: shapes.TypeUser, digest: "shell= home= groups="},
		{typ: shapes.TypeFile, digest: "sha256:ab"},
	} {
		kept := keptOfDigest(c.typ, c.digest, c.cut, c.enabledSet)
		switch c.typ {
		case shapes.TypeService:
			if got, en := lastStateOf(kept), lastEnabledOf(kept); got != c.state || en != c.enabled || (c.state == "" && c.enabled == "" && kept != "") {
				t.Errorf("%q kept as %q: state %q enabled %q, want %q %q", c.digest, kept, got, en, c.state, c.enabled)
			}
		case shapes.TypeUser:
			if shell, home := declaredUser(kept); shell != c.shell || home != c.home || (c.shell == "" && c.home == "" && kept != "") {
				t.Errorf("%q kept as %q: shell %q home %q, want %q %q", c.digest, kept, shell, home, c.shell, c.home)
			}
		default:
			if kept != "" {
				t.Errorf("a %s's digest kept through an interrupted change: %q", c.typ, kept)
			}
		}
		if kept != "" && (kept == c.digest || strings.HasPrefix(kept, "state=") || strings.HasPrefix(kept, "shell=")) {
			t.Errorf("%q kept as %q: a declaration's own digest, which an apply would take for a repair", c.digest, kept)
		}
	}
}

// The same through a kill: the change of the declaration after it cut
// between its intent and its record, the next apply observes the unit
// again and still knows the host started it.
func TestAServiceTheHostStartedIsGivenBackThoughAKillCutTheNextChange(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	h.applyWith(f, h.doc(svc("pf", "pf", "running", "", "")), false)
	second := h.doc(svc("pf", "pf", "", "true", ""))
	if rep := h.applyWith(f, second, false); rep.Outcome != shapes.Applied {
		t.Fatalf("second: %s %+v", rep.Outcome, rep.Lines)
	}
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && target == "service:pf.service" })
	h.applyWith(f, second, false)
	f.transcript()
	rep := h.applyWith(f, h.doc(), false)
	if got := f.transcript(); got != "disable pf.service; stop pf.service" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after a cut: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// A declaration held on an adopted node sets nothing of the unit, though
// its found enablement is recorded then: taken with a declaration that
// says nothing of enabled, then enabled by an operator, the unit is not
// disabled on the way out — the host never enabled it.
func TestAHeldDeclarationsEnablementIsNotTheHosts(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	adopted := func(taken string, res ...string) string {
		return strings.Replace(h.doc(res...), `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	if rep := h.applyWith(f, adopted("", svc("pf", "pf", "", "true", "")), false); rep.Outcome != shapes.Held {
		t.Fatalf("held: %+v", rep.Lines)
	}
	if rep := h.applyWith(f, adopted(`"web"`, svc("pf", "pf", "", "", "")), false); rep.Outcome == shapes.Failed || f.transcript() != "" {
		t.Fatalf("taken: %s %+v %q", rep.Outcome, rep.Lines, f.log)
	}
	f.unit("pf.service").Enabled = "enabled" // an operator's systemctl enable
	rep := h.applyWith(f, adopted(`"web"`), false)
	if got := f.transcript(); got != "" || rep.Outcome != shapes.Forgotten || !strings.Contains(rep.Lines[0].Detail, "its enablement was never declared") {
		t.Fatalf("undeclared: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// appliedThenCut applies doc, which changes the unit as want says, and
// cuts the journal before the change's record: a kill between the host's
// change and its record.
func appliedThenCut(t *testing.T, h *harness, f *fakeInit, doc, want string) {
	t.Helper()
	if rep := h.applyWith(f, doc, false); rep.Outcome != shapes.Applied || f.transcript() != want {
		t.Fatalf("%s: %s %+v %q", want, rep.Outcome, rep.Lines, f.log)
	}
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && target == "service:pf.service" })
}

// A change a kill cut between the host's change and its record counts as
// made: the unit it enabled is disabled again when undeclared, though the
// declaration before it said disabled.
func TestAnEnablementAKillCutIsGivenBack(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	h.applyWith(f, h.doc(svc("pf", "pf", "", "false", "")), false)
	appliedThenCut(t, h, f, h.doc(svc("pf", "pf", "", "true", "")), "enable pf.service")
	rep := h.applyWith(f, h.doc(), false)
	if got := f.transcript(); got != "disable pf.service" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after a cut: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// A start a kill cut between the host's change and its record counts as
// made, though the declaration before it said stopped: the unit the host
// started is stopped again when undeclared (the intent carries what the
// change would record). And where neither the change cut nor the
// declaration before it enabled the unit, an operator's enablement since
// is left: the host never enabled it.
func TestAStartAKillCutIsGivenBack(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	h.applyWith(f, h.doc(svc("pf", "pf", "stopped", "false", "")), false)
	appliedThenCut(t, h, f, h.doc(svc("pf", "pf", "running", "false", "")), "start pf.service")
	f.unit("pf.service").Enabled = "enabled" // an operator's systemctl enable
	rep := h.applyWith(f, h.doc(), false)
	if got := f.transcript(); got != "stop pf.service" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after a cut: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// Two kills in a row: a start cut before its record, then, at the next
// apply, a stop cut after its intent and before the stop. The first cut's
// start is still the host's — what the settle kept of it is recorded
// before the second change's intent replaces the first's — so undeclared,
// the unit the host started is stopped again.
func TestAStartTwoKillsCutIsGivenBack(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	h.applyWith(f, h.doc(svc("pf", "pf", "stopped", "false", "")), false)
	appliedThenCut(t, h, f, h.doc(svc("pf", "pf", "running", "false", "")), "start pf.service")
	// The second kill: after the stop's intent was durable, before the stop
	// (the fake init stopped it; running again, as if it never had).
	appliedThenCut(t, h, f, h.doc(svc("pf", "pf", "stopped", "false", "")), "stop pf.service")
	f.unit("pf.service").Running = true
	rep := h.applyWith(f, h.doc(), false)
	if got := f.transcript(); got != "stop pf.service" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after two cuts: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// On an adopted node, a unit held as found and then taken: the host's
// start under the taken module, cut before its record, is the host's
// change — undeclared, the unit is stopped again, not left as held.
func TestATakenUnitsStartAKillCutIsGivenBack(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("pf.service", false, "disabled")
	adopted := func(taken string, res ...string) string {
		return strings.Replace(h.doc(res...), `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	if rep := h.applyWith(f, adopted("", svc("pf", "pf", "running", "", "")), false); rep.Outcome != shapes.Held {
		t.Fatalf("held: %+v", rep.Lines)
	}
	if rep := h.applyWith(f, adopted(`"web"`, svc("pf", "pf", "running", "", "")), false); rep.Outcome != shapes.Applied || f.transcript() != "start pf.service" {
		t.Fatalf("taken: %s %+v %q", rep.Outcome, rep.Lines, f.log)
	}
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && target == "service:pf.service" })
	rep := h.applyWith(f, adopted(`"web"`), false)
	if got := f.transcript(); got != "stop pf.service" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after a cut: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}

// A restart restart_on owes and an apply could not give — it stopped
// (asked to, or failing) after the file changed and before the unit's
// restart — is given by the next apply, which finds the file as declared:
// the unit does not run on the old file until something else restarts it.
// Said in the line; given once; a plan says it too. One owed to a service
// no longer declared is not given.
func TestARestartOwedIsGivenByTheNextApply(t *testing.T) {
	h, f, conf, nginx := nginxRestartOn(t)

	// v2: the apply stops once the file is written.
	doc := h.doc(conf("v2"), nginx)
	rep, st := h.applyStoppingAfter(f, doc, "conf")
	if got := f.transcript(); got != "" || rep.Outcome != shapes.Failed {
		t.Fatalf("the apply that stopped: %q %+v", got, rep.Lines)
	}
	if owed := st.RestartsOwed(store.Local); len(owed) != 1 || !slices.Equal(owed["nginx.service"], []string{"base.conf"}) {
		t.Fatalf("owed %v", owed)
	}
	plan := h.applyWith(f, doc, true)
	if !strings.Contains(fmt.Sprint(plan.Lines), "would be restarted: base.conf changed (owed by an apply that stopped before it could restart it)") {
		t.Fatalf("the plan: %+v", plan.Lines)
	}
	rep = h.applyWith(f, doc, false)
	if got := f.transcript(); got != "restart nginx.service" || !strings.Contains(fmt.Sprint(rep.Lines), "restarted: base.conf changed (owed by an apply") {
		t.Fatalf("the next apply: %q %+v", got, rep.Lines)
	}
	h.applyWith(f, doc, false)
	if got := f.transcript(); got != "" {
		t.Fatalf("given twice: %q", got)
	}

	// Owed again, then the service undeclared: not restarted for it.
	h.applyStoppingAfter(f, h.doc(conf("v3"), nginx), "conf")
	h.applyWith(f, h.doc(conf("v3")), false)
	if got := f.transcript(); strings.Contains(got, "restart") {
		t.Fatalf("restarted for a service no longer declared: %q", got)
	}
	if owed := st.RestartsOwed(store.Local); len(owed) != 0 {
		t.Fatalf("still owed: %v", owed)
	}
}

// A restart owed for a file declared after the service, then the next
// apply starts the unit (found stopped) and changes that file again: the
// unit read the old content as it started, and is restarted after.
func TestARestartOwedAndTheFileChangedAfterTheStart(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("web.service", true, "enabled")
	f.add("other.service", true, "enabled")
	conf := func(c string) string {
		return `{"module":"web","id":"late","type":"file","path":"{root}/late.conf","content":"` + c + `"}`
	}
	web := svc("web", "web", "running", "", `,"restart_on":["late"]`)
	other := svc("other", "other", "running", "", "")
	h.applyWith(f, h.doc(web, conf("v1"), other), false)
	f.transcript()
	_, st := h.applyStoppingAfter(f, h.doc(web, conf("v2"), other), "late")
	if owed := st.RestartsOwed(store.Local); !slices.Equal(owed["web.service"], []string{"web.late"}) {
		t.Fatalf("owed %v", owed)
	}
	f.units["web.service"].Running = false // stopped by hand meanwhile
	rep := h.applyWith(f, h.doc(web, conf("v3"), other), false)
	if got := f.transcript(); got != "start web.service; restart web.service" {
		t.Fatalf("started before late.conf v3 was written and not restarted after: %q %s", got, fmt.Sprint(rep.Lines))
	}
}

// A unit restart_on restarts is restarted after the apply's removals
// (the declaration's order of work): restarted before, it would read a
// drop-in, or any file it takes, that the same apply then removes.
func TestARestartComesAfterTheRemovals(t *testing.T) {
	h, f, conf, nginx := nginxRestartOn(t)
	dropIn := `{"module":"drop","id":"in","type":"file","path":"{root}/nginx.conf.d/env.conf","content":"FOO=fromdropin"}`
	dir := `{"module":"drop","id":"dir","type":"directory","path":"{root}/nginx.conf.d"}`
	h.applyWith(f, h.doc(conf("v1"), dir, dropIn, nginx), false)
	f.transcript()
	var seen []string
	f.restarting = func(string) {
		_, err := os.Lstat(h.p("nginx.conf.d/env.conf"))
		seen = append(seen, fmt.Sprint(os.IsNotExist(err)))
	}
	h.applyWith(f, h.doc(conf("v2"), nginx), false)
	if got := f.transcript(); got != "restart nginx.service" || len(seen) != 1 || seen[0] != "true" {
		t.Fatalf("restarted %q with the drop-in the apply removes still there: %v", got, seen)
	}
	if _, err := os.Lstat(h.p("nginx.conf.d")); !os.IsNotExist(err) {
		t.Fatalf("the drop-in's directory: %v", err)
	}
}

// A service whose unit file the host made for this source as a file, that
// file no longer declared while the service still is: refused whole —
// the removal of the file later in the apply would leave the unit
// running with no definition, and every apply after saying it gone
// "since". Undeclared with the service, it is applied.
func TestAServiceWhoseUnitFileGoesIsRefused(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("web.service", true, "enabled")
	st := mustStore(t, h.state)
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	// What an apply of a file at the unit's path left (the file's own
	// path is the machine's, so it is recorded here as that apply would).
	unitFile := "path:/etc/systemd/system/web.service"
	if err := st.Put(&store.Entry{Target: unitFile, Type: shapes.TypeFile, Claims: []store.Claim{{Source: store.Local, Module: "units", ID: "web"}}, Created: true, Digest: "x"}); err != nil {
		t.Fatal(err)
	}
	st.Commit()
	st.Sync()
	st.Unlock()
	web := svc("web", "web", "running", "", "")
	rep := h.applyWith(f, h.doc(web), false)
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "web.service is defined by /etc/systemd/system/web.service, a file the host made for") || f.transcript() != "" {
		t.Fatalf("%s %q %q", rep.Outcome, rep.Refused, f.transcript())
	}
	if e := mustStore(t, h.state).Get(unitFile); e == nil {
		t.Fatal("the unit's file was undone")
	}
	// Undeclared with the service: applied (the file, gone already here,
	// forgotten).
	if rep := h.applyWith(f, h.doc(), false); rep.Outcome == shapes.Refused {
		t.Fatalf("undeclared with the service: %q", rep.Refused)
	}
}

// nginxRestartOn is the fixture of the restarts owed: nginx.service
// running, declared with restart_on base.conf, and conf (a file of
// module base, nginx.conf, of the content given) applied at v1 with it
// (local), the init's transcript cleared.
func nginxRestartOn(t *testing.T) (h *harness, f *fakeInit, conf func(content string) string, nginx string) {
	h = newHarness(t)
	f = newFakeInit()
	f.add("nginx.service", true, "enabled")
	conf = func(content string) string {
		return `{"module":"base","id":"conf","type":"file","path":"{root}/nginx.conf","content":"` + content + `"}`
	}
	nginx = svc("nginx", "nginx", "running", "", `,"restart_on":["base.conf"]`)
	h.applyWith(f, h.doc(conf("v1"), nginx), false)
	f.transcript()
	return h, f, conf, nginx
}

// A change an apply a kill or a power cut ended had made (the journal
// keeps what it said) owes the restart its restart_on calls for: the next
// apply finds the file as declared, and restarts the unit — whichever
// source's apply comes first after the cut (it notes every source's cut
// applies, and each source's restarts are given by an apply of its own),
// however many lines the cut apply said before the file's.
func TestARestartACutApplyOwedIsGiven(t *testing.T) {
	for _, tc := range []struct {
		name string
		// first runs between the cut and the next apply of the source.
		first func(h *harness)
		// before is what the declaration holds before the file.
		before int
	}{
		{name: "the next apply its own"},
		{name: "another source's apply first", first: func(h *harness) {
			h.run(store.Bundle, h.doc(`{"module":"found","id":"motd","type":"file","path":"{root}/motd","content":"hi"}`), false)
		}},
		{name: "130 lines said before the file's", before: 130},
		{name: "restarts-owed.json that does not read", first: func(h *harness) {
			// Moved aside: kept there, the cut apply stayed unnoted and
			// was given again at every apply.
			os.WriteFile(filepath.Join(h.state, "restarts-owed.json"), []byte("{"), 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, f, conf, nginx := nginxRestartOn(t)
			many := func(content string) []string {
				var out []string
				for i := range tc.before {
					out = append(out, fmt.Sprintf(`{"module":"base","id":"f%d","type":"file","path":"{root}/f%d","content":%q}`, i, i, content))
					// Beside each, one that does not change: the store holds
					// enough that the apply's records stay in the journal
					// rather than compacted at its end (store.Commit).
					out = append(out, fmt.Sprintf(`{"module":"base","id":"g%d","type":"file","path":"{root}/g%d","content":"g"}`, i, i))
				}
				return out
			}
			h.applyWith(f, h.doc(append(many("x"), conf("v1"), nginx)...), false)
			doc := h.doc(append(many("y"), conf("v2"), nginx)...)
			h.applyWith(f, doc, false)
			f.transcript()
			// The cut: the apply's end and the restart never happened (its
			// end record cut off the journal, as a power cut leaves it).
			cutJournal(t, h.state, func(op, _ string) bool { return op == "end" })
			if tc.first != nil {
				tc.first(h)
			}
			rep := h.applyWith(f, doc, false)
			if got := f.transcript(); got != "restart nginx.service" || !strings.Contains(fmt.Sprint(rep.Lines), "owed by an apply that stopped") {
				t.Fatalf("the apply after the cut: %q %+v", got, rep.Lines)
			}
			h.applyWith(f, doc, false)
			if got := f.transcript(); got != "" {
				t.Fatalf("given twice: %q", got)
			}
		})
	}
}

// applyStoppingAfter applies doc with the init f, asked to stop
// (Options.Stop) once the line of resource id is said; it returns the
// report and the store, unlocked.
func (h *harness) applyStoppingAfter(f *fakeInit, doc, id string) (*shapes.Report, *store.Store) {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, err := store.Open(h.state)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		h.t.Fatal(err)
	}
	defer st.Unlock()
	stop := make(chan struct{})
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Init: func() (initsys.Manager, error) { return f, nil },
		Stop: stop, OnLine: func(l shapes.Line) {
			if l.ID == id {
				close(stop)
			}
		}})
	return rep, st
}
