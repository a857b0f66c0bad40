package machines

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// What a service's found state is, and what undeclaring one gives back
// (ADR 0118), on the real inits, for three cases the give-back table
// (giveback_test.go) does not hold: a unit whose package the host installed
// an apply before the service was declared; a unit removed by
// hand since the host applied it; and a service whose settings are given
// back while it runs. Each init's own tools (giveBackInits) seed, read and
// build the packages, as the table's test does.

// A unit a .deb brings, whose postinst starts and enables it the way that
// init's Debian maintainer scripts do: the host installs the package in one
// apply and the service is declared in a later one. Its found state is
// absent all the same (the package that brings it is one the host
// installed), so undeclaring stops and disables it, and the line says so.
// The same package installed by the operator before the mesh is found as it
// is: running, and left running.
func TestPackageThenItsServiceOnSystemd(t *testing.T) {
	t.Parallel()
	packageThenServiceOn(t, lab.Systemd)
}
func TestPackageThenItsServiceOnOpenRC(t *testing.T) {
	t.Parallel()
	packageThenServiceOn(t, lab.OpenRC)
}
func TestPackageThenItsServiceOnRunit(t *testing.T) { t.Parallel(); packageThenServiceOn(t, lab.Runit) }
func TestPackageThenItsServiceOnS6(t *testing.T)    { t.Parallel(); packageThenServiceOn(t, lab.S6) }

func packageThenServiceOn(t *testing.T, in lab.Init) {
	g := giveBackInits[in]
	const late, had = "lp-late", "lp-had" // installed by the host; by the operator
	units := []string{late, had}
	dir := t.TempDir()
	var debs []string
	for _, u := range units {
		files, postinst := g.pkg(u)
		debs = append(debs, serviceDeb(t, dir, u, files, postinst))
	}
	m := boot(t, lab.Options{Init: in})
	m.serveRepo(debs...)
	// until waits for the init to say what is wanted (runsvdir and
	// s6-svscan take a service over a moment after its postinst returns).
	until := func(what string, want map[string]gbState) {
		t.Helper()
		var got map[string]gbState
		untilTrue(t, 20*time.Second, what, func() bool {
			got = g.readUnits(m, units)
			for u, w := range want {
				if got[u] != w {
					return false
				}
			}
			return true
		})
	}
	up := gbState{"running", "enabled"}
	m.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=60 " + had + " >/dev/null")
	until(had+" running and enabled, as the operator's install left it", map[string]gbState{had: up})

	pkg := func(u string) string {
		return `{"module":"web","id":"pkg-` + u + `","type":"package","name":"` + u + `"}`
	}
	svc := func(u string) string {
		return `{"module":"web","id":"` + u + `","type":"service","unit":"` + u + `","state":"running","enabled":true}`
	}
	rep, code := m.apply(decl(pkg(late), pkg(had)))
	expect(t, rep, shapes.Applied, "web.pkg-lp-late=applied web.pkg-lp-had=unchanged")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	until(late+" running and enabled by its postinst, before any service is declared", map[string]gbState{late: up, had: up})

	// The module grows its services in a later apply.
	rep, code = m.apply(decl(pkg(late), pkg(had), svc(late), svc(had)))
	expect(t, rep, shapes.Applied, "web.pkg-lp-late=unchanged web.pkg-lp-had=unchanged web.lp-late=applied web.lp-had=unchanged")
	if d := rep.Lines[2].Detail; code != 0 || d != "running, enabled; brought by package lp-late, which the host installed (found absent): undeclaring stops and disables it" {
		t.Fatalf("exit %d, %s: %q", code, late, d)
	}
	if d := rep.Lines[3].Detail; d != "running, enabled" {
		t.Fatalf("%s: %q", had, d)
	}

	const tookBack = "stopped again and disabled again: it did not exist before the declaration that brought it (the mesh gave, the mesh takes back)"
	const leftBe = "it was running before the mesh; left as it is (running, enabled)"
	planned, _ := m.apply(decl(), "plan")
	if s := fmt.Sprint(planned.Lines); !strings.Contains(s, "would be "+tookBack) || !strings.Contains(s, leftBe) {
		t.Fatalf("plan: %+v", planned.Lines)
	}
	rep, _ = m.apply(decl())
	got := map[string]shapes.Line{}
	for _, l := range rep.Lines {
		got[l.ID] = l
	}
	for id, want := range map[string]struct {
		outcome shapes.Outcome
		detail  string
	}{
		late:          {shapes.Restored, tookBack},
		had:           {shapes.Forgotten, leftBe},
		"pkg-" + late: {shapes.Forgotten, "never uninstalled"},
		"pkg-" + had:  {shapes.Forgotten, "never uninstalled"},
	} {
		if l := got[id]; l.Outcome != want.outcome || !strings.Contains(l.Detail, want.detail) {
			t.Errorf("undeclare, %s: %s %q; want %s saying %q", id, l.Outcome, l.Detail, want.outcome, want.detail)
		}
	}
	if now := g.readUnits(m, units); now[late] != (gbState{"stopped", "disabled"}) || now[had] != up {
		t.Fatalf("after the undeclare: %v; want %s stopped, disabled and %s running, enabled", now, late, had)
	}
}

// removeByHand is, for each init, how an operator takes a unit away: stop
// it and delete what defines it, with the init's own tools.
var removeByHand = map[lab.Init]func(u string) string{
	lab.Systemd: func(u string) string {
		return "systemctl stop " + u + " && rm /etc/systemd/system/" + u + ".service && systemctl daemon-reload"
	},
	lab.OpenRC: func(u string) string { return "rc-service " + u + " stop && rm /etc/init.d/" + u },
	lab.Runit: func(u string) string {
		d := "/etc/service/" + u
		return "sv -w 10 force-stop " + d + " >/dev/null; sv exit " + d + " && rm -rf /etc/runit/runsvdir/default/" + u
	},
	lab.S6: func(u string) string {
		return "s6-svc -wd -T 10000 -d /etc/s6/scan/" + u + " && rm -rf /etc/s6/scan/" + u + " && s6-svscanctl -an /etc/s6/scan"
	},
}

// A unit removed by hand since the host applied it must not make every
// later apply refuse the whole declaration: that resource's line fails,
// the rest (declared after it) applies, every later apply says the same,
// and undeclared it is forgotten (TestServiceWhoseUnitWasRemovedByHand, on
// the real inits).
func TestServiceWhoseUnitWasRemovedByHandOnSystemd(t *testing.T) {
	t.Parallel()
	removedByHandOn(t, lab.Systemd)
}
func TestServiceWhoseUnitWasRemovedByHandOnOpenRC(t *testing.T) {
	t.Parallel()
	removedByHandOn(t, lab.OpenRC)
}
func TestServiceWhoseUnitWasRemovedByHandOnRunit(t *testing.T) {
	t.Parallel()
	removedByHandOn(t, lab.Runit)
}
func TestServiceWhoseUnitWasRemovedByHandOnS6(t *testing.T) {
	t.Parallel()
	removedByHandOn(t, lab.S6)
}

func removedByHandOn(t *testing.T, in lab.Init) {
	g := giveBackInits[in]
	const u = "lp-gone"
	m := boot(t, lab.Options{Init: in, Seed: g.seed(u, "stopped")})
	untilTrue(t, 20*time.Second, u+" known to the init, stopped", func() bool { return g.readUnits(m, []string{u})[u].run == "stopped" })
	doc := func(content string) string {
		return decl(`{"module":"web","id":"gone","type":"service","unit":"`+u+`","state":"running"}`,
			`{"module":"web","id":"conf","type":"file","path":"/etc/lp-gone.conf","content":"`+content+`"}`)
	}
	rep, code := m.apply(doc("v1"))
	expect(t, rep, shapes.Applied, "web.gone=applied web.conf=applied")
	if code != 0 || g.readUnits(m, []string{u})[u].run != "running" {
		t.Fatalf("exit %d, %s not running: %+v", code, u, rep.Lines)
	}

	m.sh(removeByHand[in](u))
	name := u
	if in == lab.Systemd {
		name += ".service"
	}
	want := fmt.Sprintf("%s knows no unit %q any more: it was removed since the host last applied it (a service never installs one); nothing done, the rest applies", in, name)
	for _, content := range []string{"v2", "v3"} {
		rep, code := m.apply(doc(content))
		if code != 1 || rep.Outcome != shapes.Failed || outcomes(rep) != "web.gone=failed web.conf=applied" || rep.Lines[0].Detail != want {
			t.Fatalf("apply after the removal (%s): exit %d %s %+v; want the service's line failed saying %q, the file applied", content, code, rep.Outcome, rep.Lines, want)
		}
		if got := m.sh("cat /etc/lp-gone.conf"); got != content {
			t.Fatalf("the file after the removed unit: %q, want %q", got, content)
		}
	}

	rep, code = m.apply(decl())
	got := map[string]shapes.Line{}
	for _, l := range rep.Lines {
		got[l.ID] = l
	}
	if l := got["gone"]; code != 0 || len(rep.Lines) != 2 || l.Outcome != shapes.Forgotten || !strings.Contains(l.Detail, "the unit is gone") || got["conf"].Outcome != shapes.Removed {
		t.Fatalf("undeclare: exit %d %+v", code, rep.Lines)
	}
	if rep, _ := m.apply(decl()); len(rep.Lines) != 0 {
		t.Fatalf("forgotten, yet the next undeclare has lines: %+v", rep.Lines)
	}
}

// Settings given back by their own resource (the operator's file, kept when
// the mesh replaced it, put back) do not restart a running service: the
// daemon keeps running on what it read until it reads its configuration
// again (ADR 0118; TestSettingsGivenBackDoNotRestart, on the real inits).
// The declared change did restart it, so the test tells the two apart by
// the daemon's pid.
func TestSettingsGivenBackDoNotRestartOnSystemd(t *testing.T) {
	t.Parallel()
	settingsGivenBackOn(t, lab.Systemd)
}
func TestSettingsGivenBackDoNotRestartOnOpenRC(t *testing.T) {
	t.Parallel()
	settingsGivenBackOn(t, lab.OpenRC)
}
func TestSettingsGivenBackDoNotRestartOnRunit(t *testing.T) {
	t.Parallel()
	settingsGivenBackOn(t, lab.Runit)
}
func TestSettingsGivenBackDoNotRestartOnS6(t *testing.T) {
	t.Parallel()
	settingsGivenBackOn(t, lab.S6)
}

func settingsGivenBackOn(t *testing.T, in lab.Init) {
	const u = "lp-conf"
	// The daemon writes its own pid, so a restart shows whatever the init.
	seed := in.Service(u, `/bin/sh -c 'echo $$ >/run/lp-conf.self; exec sleep 100071'`)
	seed["/etc/lp-conf.conf"] = "the operator's\n"
	m := boot(t, lab.Options{Init: in, Seed: seed})
	// livePid is the daemon's pid once the process that wrote it runs the
	// daemon's sleep, other than not.
	livePid := func(not string) string {
		t.Helper()
		var pid string
		untilTrue(t, 20*time.Second, u+" running under a pid other than "+not, func() bool {
			pid = m.sh(`p=$(cat /run/lp-conf.self 2>/dev/null) && tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q '^sleep 100071 $' && echo $p || true`)
			return pid != "" && pid != not
		})
		return pid
	}
	found := livePid("")

	doc := decl(`{"module":"web","id":"conf","type":"file","path":"/etc/lp-conf.conf","content":"the mesh's\n"}`,
		`{"module":"web","id":"svc","type":"service","unit":"`+u+`","state":"running","restart_on":["conf"]}`)
	rep, code := m.apply(doc)
	expect(t, rep, shapes.Applied, "web.conf=applied web.svc=applied")
	if code != 0 || !strings.Contains(rep.Lines[1].Detail, "restarted: web.conf changed") {
		t.Fatalf("the declared change did not restart it: exit %d %+v", code, rep.Lines)
	}
	restarted := livePid(found) // fails the test unless a new process runs

	rep, code = m.apply(decl())
	got := map[string]shapes.Line{}
	for _, l := range rep.Lines {
		got[l.ID] = l
	}
	if l := got["svc"]; code != 0 || l.Outcome != shapes.Forgotten || !strings.Contains(l.Detail, "it was running before the mesh") || got["conf"].Outcome != shapes.Restored {
		t.Fatalf("undeclare: exit %d %+v", code, rep.Lines)
	}
	if c := m.sh("cat /etc/lp-conf.conf"); c != "the operator's" {
		t.Fatalf("the operator's settings not given back: %q", c)
	}
	// A restart, had one been asked for, may land a moment after the
	// apply returns (a supervisor's): give it that moment.
	time.Sleep(time.Second)
	if now := m.sh(`p=$(cat /run/lp-conf.self) && tr '\0' ' ' </proc/$p/cmdline | grep -q '^sleep 100071 $' && echo $p || echo none`); now != restarted {
		t.Fatalf("giving the settings back restarted or stopped %s: pid %s → %s", u, restarted, now)
	}
	t.Logf("%s: %s ran as pid %s, the declared change restarted it as %s, and giving the settings back left that one running", in, u, found, restarted)
}
