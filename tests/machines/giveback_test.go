package machines

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// ADR 0118 on the real inits: the table executor/engine proves against a
// transcript init (TestGiveBackTable), read here from the same file and run
// on systemd, OpenRC, runit and s6 in a lab each. Every row gets its own
// unit (gb-01 … gb-60, by its place in the table), so one lab holds the
// whole table:
//
//   - found running, stopped, masked and unknown are seeded at boot (running:
//     started and enabled at boot; stopped and unknown: known to the init,
//     stopped, not started at boot; masked: systemd only);
//   - found absent: a .deb per row, served from a local apt repository in
//     the lab, brings the unit, and its postinst starts and enables it the
//     way that init's Debian maintainer scripts do; the declaration names
//     the package before the service;
//   - found unknown: after the apply, the row's store entry is made a record
//     from before the host kept what it found (Original nil), by this test
//     binary run in the lab in its child mode (giveBackChild).
//
// Then the operator changes the rows the table says (with the init's own
// tools), `plan` of the empty declaration must change nothing and say what
// the undeclare then does, and the undeclare's line for each row must have
// the table's outcome and text, and leave each unit as it was before the
// undeclare except for what the table's transcript says the init was asked
// (stop: not running; disable: not started at boot).

const (
	giveBackTable = "../../executor/engine/testdata/giveback.table"
	// giveBackChildEnv makes this test binary, run inside a lab, drop the
	// Original of the named units' service entries (giveBackChild).
	giveBackChildEnv = "NOX_TEST_GIVEBACK_FORGET"
	// labState is the executor's state directory in a lab (cli.DefaultState).
	labState = "/var/lib/mesh-host/executor"
)

func TestGiveBackTableOnSystemd(t *testing.T) { t.Parallel(); giveBackOn(t, lab.Systemd) }
func TestGiveBackTableOnOpenRC(t *testing.T)  { t.Parallel(); giveBackOn(t, lab.OpenRC) }
func TestGiveBackTableOnRunit(t *testing.T)   { t.Parallel(); giveBackOn(t, lab.Runit) }
func TestGiveBackTableOnS6(t *testing.T)      { t.Parallel(); giveBackOn(t, lab.S6) }

// gbRow is one row of the table, with the unit it runs on.
type gbRow struct {
	unit                                 string // gb-NN
	found, state                         string // state "none" is no state
	enabled, changed                     bool
	apply, undeclare, transcript, detail string
}

func (r gbRow) String() string {
	en, ch := "unset", "-"
	if r.enabled {
		en = "set"
	}
	if r.changed {
		ch = "changed"
	}
	return fmt.Sprintf("%s (%s/%s/%s/%s)", r.unit, r.found, r.state, en, ch)
}

// readGiveBackTable reads the table's rows: '|'-separated fields, comment
// lines starting with '#' (the engine's reader, GiveBackRows, lives in a
// _test file of another package, so this is its own).
func readGiveBackTable(t *testing.T) []gbRow {
	t.Helper()
	b, err := os.ReadFile(giveBackTable)
	if err != nil {
		t.Fatal(err)
	}
	var rows []gbRow
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) != 8 {
			t.Fatalf("%s: %q has %d fields, not 8", giveBackTable, line, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		rows = append(rows, gbRow{unit: fmt.Sprintf("gb-%02d", len(rows)+1), found: f[0], state: f[1],
			enabled: f[2] == "set", changed: f[3] == "changed", apply: f[4], undeclare: f[5], transcript: f[6], detail: f[7]})
	}
	if len(rows) != 5*3*2*2 {
		t.Fatalf("%s: %d rows, want every combination (60)", giveBackTable, len(rows))
	}
	return rows
}

// gbState is a unit as the init's own tools say it is, in describeState's
// words: run "running" or "stopped", en "enabled", "disabled" or "masked".
// Anything else the tools say is kept as it is, so it shows in a failure.
type gbState struct{ run, en string }

func (s gbState) String() string { return s.run + ", " + s.en }

// giveBackInit is how the test seeds, reads and pokes one init.
type giveBackInit struct {
	// masks: the init has the notion of a masked unit (systemd only).
	masks bool
	// seed gives the boot seed of a unit found running, stopped (and
	// unknown, seeded the same) or masked.
	seed func(unit, found string) map[string]string
	// pkg gives the files a package brings for the unit (lab path →
	// content) and its postinst.
	pkg func(unit string) (files map[string]string, postinst string)
	// read is a shell loop over $UNITS printing "UNIT RUN EN" lines.
	read string
	// run is the operator's start (on) or stop of a unit, in shell; enable
	// has it started at boot (on) or not. Each is run only to change the
	// unit (never to ask for what it already is).
	run, enable func(unit string, on bool) string
}

// flip is the operator's change, in shell: running ↔ stopped and enabled
// ↔ disabled; a masked unit (systemd's only) is unmasked and started.
func (g giveBackInit) flip(u string, cur gbState) string {
	if cur.en == "masked" {
		return "systemctl unmask " + u + " && systemctl start " + u
	}
	return g.run(u, cur.run != "running") + " && " + g.enable(u, cur.en != "enabled")
}

// gbCommand is what every gb unit runs: long enough to outlive the test.
const gbCommand = "sleep 100060"

var giveBackInits = map[lab.Init]giveBackInit{
	lab.Systemd: {
		masks: true,
		seed: func(u, found string) map[string]string {
			file := fmt.Sprintf(unit, u)
			switch found {
			case "running": // enabled the way systemctl enable does it
				return map[string]string{
					"/etc/systemd/system/" + u + ".service":                         file,
					"/etc/systemd/system/multi-user.target.wants/" + u + ".service": "symlink:/etc/systemd/system/" + u + ".service",
				}
			case "masked":
				// The mask link in /etc hides a vendor unit file (so
				// unmasking gives that file back, disabled).
				return map[string]string{
					"/usr/lib/systemd/system/" + u + ".service": file,
					"/etc/systemd/system/" + u + ".service":     "symlink:/dev/null",
				}
			}
			return map[string]string{"/etc/systemd/system/" + u + ".service": file}
		},
		// What debhelper's snippets do on a systemd machine (deb-systemd-
		// helper enable, then daemon-reload and deb-systemd-invoke start),
		// with systemctl itself: the lab sees the host's Docker-style
		// /usr/sbin/policy-rc.d, which would deny deb-systemd-invoke any
		// start, and a real Debian machine has none.
		pkg: func(u string) (map[string]string, string) {
			return map[string]string{"/lib/systemd/system/" + u + ".service": fmt.Sprintf(unit, u)},
				"systemctl daemon-reload\nsystemctl enable " + u + ".service\nsystemctl start " + u + ".service\n"
		},
		// One systemctl show for all: a block of properties per unit, in
		// the order asked, blocks apart by an empty line.
		read: `systemctl show -p Id,ActiveState,UnitFileState $(for u in $UNITS; do echo $u.service; done) |
awk -F= 'function out() { if (id != "") print substr(id, 1, length(id)-8), (a == "active" ? "running" : a == "inactive" ? "stopped" : a), (e == "" ? "none" : e); id = a = e = "" }
	/^Id=/ { id = $2 } /^ActiveState=/ { a = $2 } /^UnitFileState=/ { e = $2 } /^$/ { out() } END { out() }'`,
		run: func(u string, on bool) string {
			return "systemctl " + map[bool]string{true: "start ", false: "stop "}[on] + u
		},
		enable: func(u string, on bool) string {
			return "systemctl " + map[bool]string{true: "enable ", false: "disable "}[on] + u
		},
	},
	lab.OpenRC: {
		seed: func(u, found string) map[string]string {
			seed := lab.OpenRC.Service(u, gbCommand)
			if found != "running" { // in no runlevel: not started at boot
				delete(seed, "/etc/runlevels/default/"+u)
			}
			return seed
		},
		// What a maintainer script does on OpenRC (update-rc.d and
		// invoke-rc.d end in these two).
		pkg: func(u string) (map[string]string, string) {
			return map[string]string{"/etc/init.d/" + u: lab.OpenRC.Service(u, gbCommand)["/etc/init.d/"+u]},
				"rc-update add " + u + " default\nrc-service " + u + " start\n"
		},
		// rc-service status: 0 started, 3 stopped; enabled: in the default
		// runlevel, as rc-update shows it.
		read: `levels=$(rc-update show default)
for u in $UNITS; do
	rc-service $u status >/dev/null 2>&1; c=$?; r=status-$c
	[ $c = 0 ] && r=running; [ $c = 3 ] && r=stopped
	e=disabled; printf '%s\n' "$levels" | grep -Eq "^ *$u \|" && e=enabled
	echo "$u $r $e"
done`,
		run: func(u string, on bool) string {
			return "rc-service " + u + map[bool]string{true: " start", false: " stop"}[on]
		},
		enable: func(u string, on bool) string {
			return "rc-update " + map[bool]string{true: "add ", false: "del "}[on] + u + " default"
		},
	},
	lab.Runit: {
		// runit's notion of enabled is supervised (in the directory
		// runsvdir scans) without a down file; stopped is supervised with
		// one, as a service the operator keeps from starting at boot.
		seed: func(u, found string) map[string]string {
			seed := lab.Runit.Service(u, gbCommand)
			if found != "running" {
				seed["/etc/runit/runsvdir/default/"+u+"/down"] = ""
			}
			return seed
		},
		// dh_runit's own postinst snippet: runit-helper links /etc/sv/NAME
		// into runsvdir's directory and asks for a rescan; runsvdir then
		// starts it (there is no down file).
		pkg: func(u string) (map[string]string, string) {
			return map[string]string{"/etc/sv/" + u + "/run": "#!/bin/sh\nexec 2>&1\nexec " + gbCommand + "\n"},
				"NAME='" + u + "' ENABLE='yes' ONUPGRADE='restart' /lib/runit-helper/runit-helper postinst \"$@\"\n"
		},
		read: `for u in $UNITS; do
	d=/etc/service/$u
	case "$(sv status $d 2>&1)" in run:*) r=running;; down:*) r=stopped;; *) r=unsupervised;; esac
	e=disabled; [ -d $d ] && [ ! -e $d/down ] && e=enabled
	echo "$u $r $e"
done`,
		run: func(u string, on bool) string {
			return "sv -w 10 " + map[bool]string{true: "up ", false: "down "}[on] + "/etc/service/" + u
		},
		enable: func(u string, on bool) string { return downFile("/etc/service/"+u, on) },
	},
	lab.S6: {
		// s6's notion of enabled: no down file (s6-svstat's normallyup);
		// stopped is supervised with one.
		seed: func(u, found string) map[string]string {
			seed := lab.S6.Service(u, gbCommand)
			if found != "running" {
				seed["/etc/s6/scan/"+u+"/down"] = ""
			}
			return seed
		},
		// Debian has no maintainer-script convention for s6: the package
		// brings a service directory, and its postinst links it into the
		// scan directory and has s6-svscan rescan, which starts it (there
		// is no down file). Like runit-helper's rescan, that returns before
		// the supervisor runs: the service step may find it running or
		// not yet taken over, and either must end as declared.
		pkg: func(u string) (map[string]string, string) {
			return map[string]string{"/etc/s6/sv/" + u + "/run": "#!/bin/sh\nexec 2>&1\nexec " + gbCommand + "\n"},
				"ln -s /etc/s6/sv/" + u + " /etc/s6/scan/" + u + "\ns6-svscanctl -a /etc/s6/scan\n"
		},
		read: `for u in $UNITS; do
	set -- $(s6-svstat -o up,normallyup /etc/s6/scan/$u 2>/dev/null || echo unsupervised unsupervised)
	r=$1; [ "$1" = true ] && r=running; [ "$1" = false ] && r=stopped
	e=$2; [ "$2" = true ] && e=enabled; [ "$2" = false ] && e=disabled
	echo "$u $r $e"
done`,
		run: func(u string, on bool) string {
			return "s6-svc -T 10000 " + map[bool]string{true: "-wu -u ", false: "-wd -d "}[on] + "/etc/s6/scan/" + u
		},
		enable: func(u string, on bool) string { return downFile("/etc/s6/scan/"+u, on) },
	},
}

// downFile is enabling (on) or disabling a runit or s6 service directory
// dir: a service with a down file is not started when its supervisor is.
func downFile(dir string, on bool) string {
	if on {
		return "rm -f " + dir + "/down"
	}
	return "touch " + dir + "/down"
}

// readUnits reads the units' states with the init's own tools.
func (g giveBackInit) readUnits(m *machine, units []string) map[string]gbState {
	m.t.Helper()
	out := m.sh("UNITS='" + strings.Join(units, " ") + "'\n" + g.read)
	got := map[string]gbState{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			got[f[0]] = gbState{run: f[1], en: f[2]}
		}
	}
	return got
}

// serviceDeb builds a package bringing files (lab path → content; mode 0755
// for a script) with a postinst, with dpkg-deb.
func serviceDeb(t *testing.T, dir, name string, files map[string]string, postinst string) string {
	t.Helper()
	root := filepath.Join(dir, name)
	write := func(p, content string) {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("DEBIAN/control", fmt.Sprintf("Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: tests <t@example.invalid>\nDescription: brings the unit %s\n test package\n", name, name))
	write("DEBIAN/postinst", "#!/bin/sh\nset -e\n"+postinst)
	for p, c := range files {
		write(p, c)
	}
	out := filepath.Join(dir, name+"_1.0_all.deb")
	if b, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", root, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, b)
	}
	return out
}

func giveBackOn(t *testing.T, in lab.Init) {
	g := giveBackInits[in]
	start := time.Now()
	// How long each part took, for the log: the whole is meant to stay
	// well under a minute per init.
	var laps []string
	last := start
	lap := func(what string) {
		laps = append(laps, fmt.Sprintf("%s %v", what, time.Since(last).Round(time.Millisecond)))
		last = time.Now()
	}
	all := readGiveBackTable(t)
	var rows []gbRow
	for _, r := range all {
		if r.found == "masked" && !g.masks {
			continue
		}
		rows = append(rows, r)
	}
	if len(rows) < len(all) {
		t.Logf("%s: %d of %d rows run; the %d found masked are skipped: %s has no notion of a masked unit", in, len(rows), len(all), len(all)-len(rows), in)
	}

	seed := map[string]string{}
	var debs []string
	dir := t.TempDir()
	for _, r := range rows {
		if r.found == "absent" {
			files, postinst := g.pkg(r.unit)
			debs = append(debs, serviceDeb(t, dir, r.unit, files, postinst))
			continue
		}
		for p, c := range g.seed(r.unit, r.found) {
			seed[p] = c
		}
	}
	m := boot(t, lab.Options{Init: in, Seed: seed})
	m.serveRepo(debs...)
	units := make([]string, len(rows))
	for i, r := range rows {
		units[i] = r.unit
	}
	seeded := func() []string {
		var us []string
		for _, r := range rows {
			if r.found != "absent" {
				us = append(us, r.unit)
			}
		}
		return us
	}()
	// read waits until the init has taken every unit over (runsvdir looks
	// at its directory every few seconds), then reads them all.
	read := func(units []string, what string) map[string]gbState {
		t.Helper()
		var got map[string]gbState
		untilTrue(t, 20*time.Second, "every unit running or stopped, as the init says, "+what, func() bool {
			got = g.readUnits(m, units)
			for _, u := range units {
				if s := got[u]; s.run != "running" && s.run != "stopped" {
					return false
				}
			}
			return true
		})
		return got
	}
	seededAs := func(r gbRow) gbState {
		return map[string]gbState{"running": {"running", "enabled"}, "stopped": {"stopped", "disabled"},
			"unknown": {"stopped", "disabled"}, "masked": {"stopped", "masked"}}[r.found]
	}
	// As seeded, once the init has started what it starts at boot: on a
	// loaded machine runit's runsv may say a unit it has yet to start
	// stopped, a state read as settled.
	found := read(seeded, "at boot")
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); found = read(seeded, "at boot") {
		settled := true
		for _, r := range rows {
			settled = settled && (r.found == "absent" || found[r.unit] == seededAs(r))
		}
		if settled {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, r := range rows {
		if want := seededAs(r); r.found != "absent" && found[r.unit] != want {
			t.Fatalf("%v seeded wrong: %v, want %v", r, found[r.unit], want)
		}
	}
	lap("boot")

	svc := func(r gbRow) string {
		s := `{"module":"gb","id":"` + r.unit + `","type":"service","unit":"` + r.unit + `"`
		if r.state != "none" {
			s += `,"state":"` + r.state + `"`
		}
		if r.enabled {
			s += `,"enabled":true`
		}
		return s + "}"
	}
	// The exact text of a row, for this unit: the table says u.service.
	// Every backend says enablement in systemd's words (enabled, disabled;
	// masked on systemd only), so the table's text is compared whole on
	// every init, nothing cut off before " (".
	text := func(r gbRow, s string) string {
		name := r.unit
		if in == lab.Systemd {
			name += ".service"
		}
		return strings.ReplaceAll(s, "u.service", name)
	}

	// A failed step stops the apply: each row whose apply fails (a masked
	// unit declared started or enabled) is applied alone; the rest together.
	var together []string
	for _, r := range rows {
		if r.apply == "failed" {
			rep, code := m.apply(decl(svc(r)))
			if code != 1 || len(rep.Lines) != 1 || rep.Lines[0].Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, text(r, r.detail)) {
				t.Errorf("%v: apply alone: exit %d %+v; want failed, saying %q", r, code, rep.Lines, text(r, r.detail))
			}
			continue
		}
		if r.found == "absent" {
			together = append(together, `{"module":"gb","id":"pkg-`+r.unit+`","type":"package","name":"`+r.unit+`"}`)
		}
		together = append(together, svc(r))
	}
	rep, code := m.apply(decl(together...))
	lines := map[string]shapes.Line{}
	for _, l := range rep.Lines {
		lines[l.ID] = l
	}
	for _, r := range rows {
		if r.apply == "failed" {
			continue
		}
		if l := lines[r.unit]; string(l.Outcome) != r.apply {
			t.Errorf("%v: apply: %s %q, want %s", r, l.Outcome, l.Detail, r.apply)
		}
		if r.found == "absent" {
			if l := lines["pkg-"+r.unit]; l.Outcome != shapes.Applied {
				t.Errorf("%v: its package: %s %q", r, l.Outcome, l.Detail)
			}
		}
	}
	if t.Failed() {
		t.Fatalf("the apply (exit %d) is not the table's; stopping before the undeclare", code)
	}
	lap("apply")

	// What was declared holds, as the init says (not the table's to say,
	// but the give-back below starts from it).
	after := read(units, "after the apply")
	for _, r := range rows {
		s := after[r.unit]
		if r.apply == "failed" {
			if want := found[r.unit]; s != want {
				t.Errorf("%v: a failed apply changed the unit: %v, was %v", r, s, want)
			}
			continue
		}
		if (r.state == "running" && s.run != "running") || (r.state == "stopped" && s.run != "stopped") || (r.enabled && s.en != "enabled") {
			t.Errorf("%v: after the apply the init says %v, not as declared", r, s)
		}
	}
	if t.Failed() {
		t.Fatal("the units are not as declared after the apply; stopping before the undeclare")
	}

	// The same declaration again changes nothing: every line unchanged,
	// one record per unit (a unit brought absent goes by the init's own
	// name from its first apply — OpenRC, runit and s6 name it bare).
	rep, code = m.apply(decl(together...))
	for _, l := range rep.Lines {
		if l.Outcome != shapes.Unchanged {
			t.Errorf("the second apply of the same declaration: %s.%s %s %q", l.Module, l.ID, l.Outcome, l.Detail)
		}
	}
	if again := read(units, "after the second apply"); fmt.Sprint(again) != fmt.Sprint(after) {
		t.Errorf("the second apply changed units:\n%v\nwas\n%v", again, after)
	}
	if t.Failed() {
		t.Fatalf("the second apply (exit %d) changed something; stopping before the undeclare", code)
	}

	// Unknown: records from before the host kept what it found.
	var unknown []string
	for _, r := range rows {
		if r.found == "unknown" {
			unknown = append(unknown, r.unit)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CopyIn(self, "/root/giveback.test"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: originals dropped: %s", in, strings.ReplaceAll(m.sh(giveBackChildEnv+"='"+strings.Join(unknown, " ")+"' /root/giveback.test"), "\n", "; "))
	lap("unknown")

	// The operator's changes, with the init's own tools.
	var flips []string
	for _, r := range rows {
		if r.changed {
			flips = append(flips, g.flip(r.unit, after[r.unit]))
		}
	}
	m.sh("set -e\n" + strings.Join(flips, "\n"))
	before := read(units, "after the operator's changes")
	for _, r := range rows {
		if !r.changed {
			continue
		}
		was, now := after[r.unit], before[r.unit]
		if now.run == was.run || now.en == was.en || now.en == "masked" {
			t.Fatalf("%v: the operator's change did not take: %v → %v", r, was, now)
		}
	}

	// plan: changes nothing, and says what the undeclare will do.
	lap("operator")
	planned, _ := m.apply(decl(), "plan")
	if now := read(units, "after the plan"); fmt.Sprint(now) != fmt.Sprint(before) {
		t.Fatalf("plan changed units:\n%v\nwas\n%v", now, before)
	}
	lap("plan")
	undeclared, _ := m.apply(decl())
	gave := read(units, "after the undeclare")
	lap("undeclare")

	got := map[string]shapes.Line{}
	for _, l := range undeclared.Lines {
		got[l.ID] = l
	}
	if len(got) != len(undeclared.Lines) {
		t.Errorf("the undeclare has two lines for one resource: %+v", undeclared.Lines)
	}
	for _, l := range planned.Lines {
		u, ok := got[l.ID]
		if !ok || l.Outcome != u.Outcome || strings.TrimPrefix(l.Detail, "would be ") != u.Detail {
			t.Errorf("%s: plan said %s %q; the undeclare %s %q", l.ID, l.Outcome, l.Detail, u.Outcome, u.Detail)
		}
	}
	if len(planned.Lines) != len(undeclared.Lines) {
		t.Errorf("plan has %d lines, the undeclare %d", len(planned.Lines), len(undeclared.Lines))
	}
	for _, r := range rows {
		l, ok := got[r.unit]
		switch {
		case r.undeclare == "-":
			if ok {
				t.Errorf("%v: an apply that failed left a line to undeclare: %s %q", r, l.Outcome, l.Detail)
			}
		case !ok:
			t.Errorf("%v: no line on undeclare", r)
		case string(l.Outcome) != r.undeclare || !strings.Contains(l.Detail, text(r, r.detail)):
			t.Errorf("%v: undeclare: %s %q\n\twant %s %q", r, l.Outcome, l.Detail, r.undeclare, text(r, r.detail))
		}
		// The give-back is the transcript's, and nothing else: stop → not
		// running, disable → not started at boot; the rest as it was.
		want := before[r.unit]
		for _, asked := range strings.Split(r.transcript, ";") {
			switch strings.Fields(asked + " -")[0] {
			case "stop":
				want.run = "stopped"
			case "disable":
				want.en = "disabled"
			}
		}
		if gave[r.unit] != want {
			t.Errorf("%v: after the undeclare the init says %v, want %v (was %v; the table's give-back: %q)", r, gave[r.unit], want, before[r.unit], r.transcript)
		}
	}
	// The package lines: forgotten, never uninstalled.
	for _, r := range rows {
		if r.found == "absent" {
			if l := got["pkg-"+r.unit]; l.Outcome != shapes.Forgotten {
				t.Errorf("%v: its package on undeclare: %s %q", r, l.Outcome, l.Detail)
			}
		}
	}
	if len(undeclared.Lines) > 0 && t.Failed() {
		var ls []string
		for _, l := range undeclared.Lines {
			ls = append(ls, fmt.Sprintf("%s %s %q", l.ID, l.Outcome, l.Detail))
		}
		sort.Strings(ls)
		t.Logf("the undeclare's lines:\n%s", strings.Join(ls, "\n"))
	}
	t.Logf("%s: %s; %v in all", in, strings.Join(laps, ", "), time.Since(start).Round(time.Millisecond))
}

// giveBackChild is this test binary's child mode, run inside a lab with
// giveBackChildEnv naming units: it makes each one's service entry in the
// executor's store a record from before the host kept what it found
// (Original nil), as TestGiveBackTable does in-process. The entry's target
// is service:NAME.service on systemd, service:NAME where the init names
// its services bare; the one that is there is taken. ok is false when the
// variable is not set (a normal test run).
func giveBackChild() (code int, ok bool) {
	names, ok := os.LookupEnv(giveBackChildEnv)
	if !ok {
		return 0, false
	}
	fail := func(err error) (int, bool) {
		fmt.Fprintln(os.Stderr, "giveback child:", err)
		return 1, true
	}
	st, err := store.Open(labState)
	if err != nil {
		return fail(err)
	}
	if err := st.Lock(30 * time.Second); err != nil {
		return fail(err)
	}
	defer st.Unlock()
	for _, n := range strings.Fields(names) {
		var e *store.Entry
		for _, target := range []string{"service:" + n + ".service", "service:" + n} {
			if x := st.Get(target); x != nil {
				if e != nil {
					return fail(fmt.Errorf("%s has two entries: %s and %s", n, e.Target, x.Target))
				}
				e = x
			}
		}
		if e == nil {
			return fail(fmt.Errorf("no service entry for %s", n))
		}
		c := *e
		c.Original = nil
		if err := st.Put(&c); err != nil {
			return fail(err)
		}
		fmt.Println(c.Target)
	}
	if err := st.Commit(); err != nil {
		return fail(err)
	}
	return 0, true
}
