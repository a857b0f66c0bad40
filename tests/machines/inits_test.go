package machines

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The service shape on OpenRC, runit and s6, through the executor's own
// detection and each init's own tools: the scenario of TestServiceOnSystemd
// (ADR 0118 read off the real init), asserted with the init's own view.
//
// Each lab holds two services: lp-web, which the init knows but neither
// runs nor starts at boot, and lp-found, running (and started at boot)
// before the mesh. lp-web writes its own pid to /run/lp-web.self when it
// starts, so a restart shows as a new pid whatever the init.

// initView is how a test reads and pokes one init with the init's own tools.
type initView struct {
	// seed is the lab's seed: lp-web known, stopped and not started at
	// boot; lp-found running and started at boot.
	seed    func() map[string]string
	running func(m *machine, name string) bool
	enabled func(m *machine, name string) bool
	stop    func(m *machine, name string) // by hand, as an operator would
	// disabledWay says, in the init's own terms, how lp-web was given back
	// disabled.
	disabledWay func(m *machine) string
	// givenBack asserts what the backend documents of a service given back
	// stopped and disabled, where the init's notion differs from systemd's.
	givenBack func(t *testing.T, m *machine)
}

const (
	webCommand   = `/bin/sh -c 'echo $$ >/run/lp-web.self; exec sleep 100001'`
	foundCommand = `sleep 100002`
)

var serviceInits = map[lab.Init]initView{
	lab.OpenRC: {
		seed: func() map[string]string {
			seed := lab.OpenRC.Service("lp-found", foundCommand)
			for p, c := range lab.OpenRC.Service("lp-web", webCommand) {
				if !strings.HasPrefix(p, "/etc/runlevels/") { // not in a runlevel: not started at boot
					seed[p] = c
				}
			}
			return seed
		},
		running: func(m *machine, n string) bool {
			return m.sh("rc-service "+n+" status >/dev/null 2>&1; echo $?") == "0"
		},
		enabled: func(m *machine, n string) bool {
			return strings.Contains(" "+m.sh("rc-update show default")+"\n", " "+n+" |")
		},
		stop: func(m *machine, n string) { m.sh("rc-service " + n + " stop") },
		disabledWay: func(m *machine) string {
			return "rc-update show default: " + m.sh("rc-update show default")
		},
	},
	lab.Runit: {
		seed: func() map[string]string {
			seed := lab.Runit.Service("lp-found", foundCommand)
			// lp-web is defined in /etc/sv, not linked into the
			// directory runsvdir scans: known, not supervised.
			for _, n := range []string{"lp-web", "lp-idle"} {
				for p, c := range lab.Runit.Service(n, webCommand) {
					seed["/etc/sv/"+n+"/"+p[strings.LastIndex(p, "/")+1:]] = c
				}
			}
			return seed
		},
		running: func(m *machine, n string) bool {
			return strings.HasPrefix(m.sh("sv status /etc/service/"+n+" 2>&1 || true"), "run: ")
		},
		// Supervised (linked into runsvdir's directory) and no down file.
		enabled: func(m *machine, n string) bool {
			return m.sh("test -d /etc/service/"+n+" && test ! -e /etc/service/"+n+"/down && echo yes || true") == "yes"
		},
		stop: func(m *machine, n string) { m.sh("sv -w 10 down /etc/service/" + n) },
		disabledWay: func(m *machine) string {
			return "sv status: " + m.sh("sv status /etc/service/lp-web") + "; " + m.sh("ls /etc/sv/lp-web")
		},
		// runit has no "enabled" apart from supervision and runit's own
		// down file: disabling writes the down file and keeps the link (the
		// service stays supervised, down, and does not start at boot).
		givenBack: func(t *testing.T, m *machine) {
			if got := m.sh("readlink /etc/service/lp-web"); got != "/etc/sv/lp-web" {
				t.Errorf("the link went: %q", got)
			}
			if st := m.sh("sv status /etc/service/lp-web"); !strings.HasPrefix(st, "down: ") || strings.Contains(st, "normally up") {
				t.Errorf("sv status %q: want down, and normally down (a down file)", st)
			}
			// runit runs only what it supervises: a service declared
			// running but not enabled, and not linked, fails saying so.
			idle := `{"module":"x","id":"idle","type":"service","unit":"lp-idle","state":"running"}`
			rep, code := m.apply(decl(idle))
			if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "lp-idle is not linked into /etc/service, and runit runs only what it supervises there: declare it enabled to link it") {
				t.Errorf("exit %d %+v", code, rep.Lines)
			}
			if m.sh("test -e /etc/service/lp-idle && echo linked || true") != "" {
				t.Error("lp-idle linked by a declaration that did not say enabled")
			}
			rep, _ = m.apply(decl())
			expect(t, rep, shapes.Forgotten, "x.idle=forgotten")
		},
	},
	lab.S6: {
		seed: func() map[string]string {
			seed := lab.S6.Service("lp-found", foundCommand)
			for p, c := range lab.S6.Service("lp-web", webCommand) {
				seed[p] = c
			}
			seed["/etc/s6/scan/lp-web/down"] = "" // supervised, not started at boot
			return seed
		},
		running: func(m *machine, n string) bool {
			return m.sh("s6-svstat -o up /etc/s6/scan/"+n) == "true"
		},
		// s6-svstat's own word: normally up is no down file.
		enabled: func(m *machine, n string) bool {
			return m.sh("s6-svstat -o normallyup /etc/s6/scan/"+n) == "true"
		},
		stop: func(m *machine, n string) { m.sh("s6-svc -wd -T 10000 -d /etc/s6/scan/" + n) },
		disabledWay: func(m *machine) string {
			return "s6-svstat: " + m.sh("s6-svstat /etc/s6/scan/lp-web")
		},
		givenBack: func(t *testing.T, m *machine) {
			if m.sh("test -e /etc/s6/scan/lp-web/down && echo yes || true") != "yes" {
				t.Error("no down file")
			}
		},
	},
}

// Each runs in parallel with the others (a lab each; the lab package runs
// two at a time): runit's is the slow one, waiting up to 5 s for
// runsvdir to take over the service it links.
func TestServiceOnOpenRC(t *testing.T) { t.Parallel(); serviceOn(t, lab.OpenRC) }
func TestServiceOnRunit(t *testing.T)  { t.Parallel(); serviceOn(t, lab.Runit) }
func TestServiceOnS6(t *testing.T)     { t.Parallel(); serviceOn(t, lab.S6) }

func serviceOn(t *testing.T, in lab.Init) {
	v := serviceInits[in]
	start := time.Now()
	m := boot(t, lab.Options{Init: in, Seed: v.seed()})
	if in != lab.OpenRC {
		// What installing the openrc package leaves on any host: detection
		// goes by PID 1, not by this.
		m.sh("mkdir -p /run/openrc /etc/runlevels/default && echo default >/run/openrc/softlevel")
	}
	// Detection picked this init's backend: it is the one that knows no
	// such unit.
	rep, code := m.apply(decl(`{"module":"x","id":"s","type":"service","unit":"lp-nowhere","state":"running"}`))
	if want := fmt.Sprintf(`%s knows no unit "lp-nowhere"`, in); code != 2 || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, want) {
		t.Fatalf("exit %d %+v, want refused: %s", code, rep, want)
	}
	// The init brings lp-found up shortly after it is up itself.
	untilTrue(t, 10*time.Second, "lp-found running from boot", func() bool { return v.running(m, "lp-found") })
	if !v.enabled(m, "lp-found") || v.running(m, "lp-web") || v.enabled(m, "lp-web") {
		t.Fatalf("seeded wrong: lp-found running %v enabled %v, lp-web running %v enabled %v",
			v.running(m, "lp-found"), v.enabled(m, "lp-found"), v.running(m, "lp-web"), v.enabled(m, "lp-web"))
	}
	// livePid is lp-web's pid once the process that wrote it runs lp-web's
	// sleep: a start returns before the new process has written it.
	livePid := func(not string) string {
		t.Helper()
		var pid string
		untilTrue(t, 5*time.Second, "lp-web running under a pid other than "+not, func() bool {
			pid = m.sh(`p=$(cat /run/lp-web.self 2>/dev/null) && tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q '^sleep 100001 $' && echo $p || true`)
			return pid != "" && pid != not
		})
		return pid
	}

	conf := func(content string) string {
		return `{"module":"web","id":"dir","type":"directory","path":"/etc/lp-web"},` +
			`{"module":"web","id":"conf","type":"file","path":"/etc/lp-web/web.conf","content":"` + content + `"}`
	}
	web := `{"module":"web","id":"web","type":"service","unit":"lp-web","state":"running","enabled":true,"restart_on":["conf"]}`
	found := `{"module":"web","id":"found","type":"service","unit":"lp-found.service","state":"running"}`

	// Declared running and enabled: started and enabled, as the init says.
	rep, code = m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Applied, "web.dir=applied web.conf=applied web.found=unchanged web.web=applied")
	if code != 0 || !v.running(m, "lp-web") || !v.enabled(m, "lp-web") {
		t.Fatalf("lp-web not running and enabled (running %v, enabled %v): %+v", v.running(m, "lp-web"), v.enabled(m, "lp-web"), rep)
	}
	if d := rep.Lines[3].Detail; !strings.Contains(d, "started, enabled at boot (found stopped, disabled)") {
		t.Fatalf("detail: %s", d)
	}
	rep, _ = m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Unchanged, "web.dir=unchanged web.conf=unchanged web.found=unchanged web.web=unchanged")

	// Drift: stopped by hand, started again.
	v.stop(m, "lp-web")
	if v.running(m, "lp-web") {
		t.Fatal("lp-web still running after a stop by hand")
	}
	rep, _ = m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Repaired, "web.dir=unchanged web.conf=unchanged web.found=unchanged web.web=repaired")
	if !v.running(m, "lp-web") {
		t.Fatal("not repaired")
	}

	// restart_on: a changed file restarts the unit after the last step.
	pid := livePid("")
	rep, _ = m.apply(decl(conf("v2"), web, found))
	expect(t, rep, shapes.Applied, "web.dir=unchanged web.conf=applied web.found=unchanged web.web=applied")
	if !strings.Contains(rep.Lines[len(rep.Lines)-1].Detail, "restarted: web.conf changed") {
		t.Fatalf("not restarted: %+v", rep.Lines)
	}
	after := livePid(pid) // fails the test unless a new process runs
	if !v.running(m, "lp-web") {
		t.Fatal("not running after the restart")
	}
	t.Logf("%s restarted lp-web: pid %s → %s", in, pid, after)

	// plan names what the undeclare will stop, before it does.
	rep, _ = m.apply(decl(), "plan")
	if !strings.Contains(fmt.Sprint(rep.Lines), "would be stopped again and disabled again") || !v.running(m, "lp-web") {
		t.Fatalf("plan: %+v", rep.Lines)
	}
	// Undeclared: given back the state it was first found in; a unit
	// found running stays running.
	rep, _ = m.apply(decl())
	details := fmt.Sprint(rep.Lines)
	if !strings.Contains(details, "stopped again and disabled again, as the host found it") ||
		!strings.Contains(details, "it was running before the mesh; its enablement was never declared; left as it is (running, enabled)") {
		t.Fatalf("%+v", rep.Lines)
	}
	if v.running(m, "lp-web") || v.enabled(m, "lp-web") {
		t.Fatalf("lp-web not given back stopped and disabled: running %v, %s", v.running(m, "lp-web"), v.disabledWay(m))
	}
	t.Logf("%s gives lp-web back: %s", in, v.disabledWay(m))
	if v.givenBack != nil {
		v.givenBack(t, m)
	}
	if !v.running(m, "lp-found") || !v.enabled(m, "lp-found") {
		t.Fatal("a unit found running (and enabled) was changed on the way out")
	}
	// Given back as found, the next undeclare has nothing left to do.
	rep, _ = m.apply(decl())
	if len(rep.Lines) != 0 {
		t.Fatalf("%+v", rep.Lines)
	}
	t.Logf("%s: the whole scenario in %v", in, time.Since(start).Round(time.Millisecond))
}

// untilTrue polls cond, which is what says, for up to d.
func untilTrue(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not so after %v: %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
