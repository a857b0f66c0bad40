package machines

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The process shape on each init, in a lab machine of its own: the mesh's
// own program defined under the init the machine has, started, read back
// running as its user with its environment; drift (stopped by hand, its
// definition edited) repaired; a name that is a unit the mesh did not
// create refused by name; undeclared, stopped and its definition gone.
func TestProcessOnSystemd(t *testing.T) { t.Parallel(); processOn(t, lab.Systemd) }
func TestProcessOnOpenRC(t *testing.T)  { t.Parallel(); processOn(t, lab.OpenRC) }
func TestProcessOnRunit(t *testing.T)   { t.Parallel(); processOn(t, lab.Runit) }
func TestProcessOnS6(t *testing.T)      { t.Parallel(); processOn(t, lab.S6) }

// processInit is what differs between the inits for a process.
type processInit struct {
	def  string                        // the definition's file
	gone []string                      // what must not be left after the undeclare
	stop func(m *machine, name string) // by hand
}

var processInits = map[lab.Init]processInit{
	lab.Systemd: {def: "/etc/systemd/system/lp-app.service", gone: []string{"/etc/systemd/system/lp-app.service", "/etc/systemd/system/multi-user.target.wants/lp-app.service"},
		stop: func(m *machine, n string) { m.sh("systemctl stop " + n) }},
	lab.OpenRC: {def: "/etc/init.d/lp-app", gone: []string{"/etc/init.d/lp-app", "/etc/runlevels/default/lp-app"},
		stop: func(m *machine, n string) { m.sh("rc-service " + n + " stop") }},
	lab.Runit: {def: "/etc/sv/lp-app/run", gone: []string{"/etc/sv/lp-app", "/etc/service/lp-app"},
		stop: func(m *machine, n string) { m.sh("sv -w 10 down /etc/service/" + n) }},
	lab.S6: {def: "/etc/s6/scan/lp-app/run", gone: []string{"/etc/s6/scan/lp-app"},
		stop: func(m *machine, n string) { m.sh("s6-svc -wd -T 10000 -d /etc/s6/scan/" + n) }},
}

func processOn(t *testing.T, in lab.Init) {
	v := processInits[in]
	start := time.Now()
	seed := map[string]string{"/etc/systemd/system/lp-found.service": fmt.Sprintf(unit, "found")}
	if s, ok := serviceInits[in]; ok {
		seed = s.seed()
	}
	m := boot(t, lab.Options{Init: in, Seed: seed})
	m.sh("useradd --system --no-create-home --shell /usr/sbin/nologin lp-app")
	uid := m.sh("id -u lp-app")
	app := `{"module":"app","id":"api","type":"process","name":"lp-app","exec":["/bin/sleep","100003"],"user":"lp-app","env":{"MODE":"prod","PORT":"8080"}}`
	// pid is the program's pid, as the kernel sees it: exactly the
	// declared command line.
	pid := func() string {
		return m.sh(`for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' <$p/cmdline 2>/dev/null)" = "/bin/sleep 100003 " ] && echo ${p#/proc/}; done | head -1`)
	}
	runs := func(what string) string {
		t.Helper()
		var p string
		untilTrue(t, 20*time.Second, what, func() bool { p = pid(); return p != "" })
		if got := m.sh("awk '/^Uid:/{print $2, $3}' /proc/" + p + "/status"); got != uid+" "+uid {
			t.Fatalf("%s: the program runs as uid %q, want %s", what, got, uid)
		}
		if env := m.sh("tr '\\0' '\\n' </proc/" + p + "/environ"); !strings.Contains(env, "MODE=prod\n") || !strings.Contains(env, "PORT=8080") {
			t.Fatalf("%s: its environment lacks the declared variables:\n%s", what, env)
		}
		return p
	}

	rep, code := m.apply(decl(app))
	expect(t, rep, shapes.Applied, "app.api=applied")
	if code != 0 || !strings.Contains(rep.Lines[0].Detail, "defined under "+string(in)) || !strings.Contains(rep.Lines[0].Detail, "started as lp-app") {
		t.Fatalf("exit %d: %+v", code, rep.Lines)
	}
	first := runs("the program running as lp-app")
	if in == lab.Systemd {
		for _, p := range []string{"NoNewPrivileges=yes", "ProtectSystem=full", "PrivateTmp=yes", "ProtectKernelModules=yes"} {
			k, _, _ := strings.Cut(p, "=")
			if got := m.sh("systemctl show -p " + k + " lp-app.service"); got != p {
				t.Errorf("the unit's %s: %s", k, got)
			}
		}
	}
	rep, _ = m.apply(decl(app))
	expect(t, rep, shapes.Unchanged, "app.api=unchanged")

	// Stopped by hand: started again.
	v.stop(m, "lp-app")
	untilTrue(t, 10*time.Second, "the program gone after a stop by hand", func() bool { return pid() == "" })
	rep, _ = m.apply(decl(app))
	expect(t, rep, shapes.Repaired, "app.api=repaired")
	second := runs("the program running again")

	// Its definition edited by hand: put back, and the program restarted
	// onto it.
	m.sh("echo '# edited by hand' >>" + v.def)
	rep, _ = m.apply(decl(app))
	expect(t, rep, shapes.Repaired, "app.api=repaired")
	if strings.Contains(m.sh("cat "+v.def), "edited by hand") || !strings.Contains(rep.Lines[0].Detail, "its definition put back") {
		t.Fatalf("the definition was not put back: %+v", rep.Lines)
	}
	var third string
	untilTrue(t, 20*time.Second, "restarted onto the definition put back", func() bool { third = pid(); return third != "" && third != second })
	t.Logf("%s: pids %s, %s (after a stop by hand), %s (after its definition was edited)", in, first, second, third)

	// A link planted where its definition goes (a way to have root write
	// through it): never followed — the step fails at its look, naming
	// the link, which is left as it is with what it points at — and once
	// the link is gone, the definition is put back.
	m.sh("cp -p /etc/shadow /tmp/shadow.before && rm -f " + v.def + " && ln -s /etc/shadow " + v.def)
	rep, code = m.apply(decl(app))
	switch in {
	case lab.OpenRC:
		// OpenRC's own look at a unit runs its script, links included
		// (net.eth0 -> net.lo is its idiom): a link to what is no script
		// fails that look, and the declaration is refused whole.
		if code != 2 || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, `"rc-service" "lp-app" "status"`) {
			t.Fatalf("a link at the definition: exit %d %+v", code, rep)
		}
	default:
		expect(t, rep, shapes.Failed, "app.api=failed")
		if code != 1 || !strings.Contains(rep.Lines[0].Detail, v.def) || !strings.Contains(rep.Lines[0].Detail, "link") {
			t.Fatalf("a link at the definition: exit %d %+v", code, rep.Lines)
		}
	}
	if m.sh("test -L "+v.def+" && cmp /etc/shadow /tmp/shadow.before && echo untouched") != "untouched" {
		t.Fatal("the link at the definition, or what it points at, was changed")
	}
	m.sh("rm " + v.def)
	rep, _ = m.apply(decl(app))
	expect(t, rep, shapes.Repaired, "app.api=repaired")

	// A unit the mesh did not create: refused by name, nothing changed.
	found := `{"module":"app","id":"found","type":"process","name":"lp-found","exec":["/bin/sleep","100004"],"user":"lp-app"}`
	rep, code = m.apply(decl(app, found))
	if code != 2 || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, `field name: `+string(in)+` already knows a unit "lp-found`) {
		t.Fatalf("exit %d %+v", code, rep)
	}

	// Undeclared: stopped, and its definition gone.
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Removed, "app.api=removed")
	untilTrue(t, 20*time.Second, "the program stopped", func() bool { return pid() == "" })
	for _, p := range v.gone {
		if m.sh("test -e "+p+" -o -L "+p+" && echo left || true") != "" {
			t.Errorf("%s is left after the undeclare", p)
		}
	}
	rep, _ = m.apply(decl())
	if len(rep.Lines) != 0 {
		t.Fatalf("a second undeclare: %+v", rep.Lines)
	}
	t.Logf("%s: the whole scenario in %v", in, time.Since(start).Round(time.Millisecond))
}

// A process whose program an archive of the same declaration unpacks (the
// bundle's way: the program and its files carried, then run): applied in
// the stated order, and undeclared together.
func TestProcessFromAnArchiveOnSystemd(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{Init: lab.Systemd})
	m.sh("useradd --system --no-create-home --shell /usr/sbin/nologin lp-app")
	m.sh("mkdir -p /root/pkg/bin && cp /bin/sleep /root/pkg/bin/lp-sleep && tar -C /root/pkg -czf /root/app.tgz bin")
	sum := strings.Fields(m.sh("sha256sum /root/app.tgz"))[0]
	doc := decl(`{"module":"app","id":"dir","type":"directory","path":"/opt/lp"}`,
		`{"module":"app","id":"bundle","type":"archive","url":"file:///root/app.tgz","sha256":"`+sum+`","destination":"/opt/lp"}`,
		`{"module":"app","id":"run","type":"process","name":"lp-run","exec":["/opt/lp/bin/lp-sleep","100005"],"user":"lp-app"}`)
	rep, code := m.apply(doc)
	expect(t, rep, shapes.Applied, "app.dir=applied app.bundle=applied app.run=applied")
	if code != 0 || m.sh("systemctl is-active lp-run") != "active" {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	if got := m.sh(`ps -o user= -C lp-sleep`); got != "lp-app" {
		t.Fatalf("the archive's program runs as %q", got)
	}
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Removed, "app.run=removed app.bundle=removed app.dir=removed")
	if m.sh("test -e /opt/lp/bin/lp-sleep -o -e /etc/systemd/system/lp-run.service && echo left || true") != "" {
		t.Fatal("the archive's program or the unit left behind")
	}
}
