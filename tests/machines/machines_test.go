package machines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// executor is the mesh-executor binary built for these tests.
var executor string

func TestMain(m *testing.M) {
	// The lab's inner stage re-executes this binary; it never gets here.
	// Copied into a lab, it may run as a child of a test (giveback_test.go).
	if code, ok := giveBackChild(); ok {
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "machines-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	executor = filepath.Join(dir, "mesh-executor")
	build := exec.Command("go", "build", "-o", executor, "./cmd/mesh-executor")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build mesh-executor: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// machine is a lab with the executor installed in it.
type machine struct {
	*lab.Machine
	t *testing.T
}

func boot(t *testing.T, opt lab.Options) *machine {
	t.Helper()
	m := lab.Boot(t, opt)
	if err := m.CopyIn(executor, "/usr/local/bin/mesh-executor"); err != nil {
		t.Fatal(err)
	}
	return &machine{Machine: m, t: t}
}

// sh runs a shell command line in the lab and returns its output.
func (m *machine) sh(cmd string) string {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, _, err := m.Run(ctx, "/bin/sh", "-c", cmd)
	if err != nil {
		m.t.Fatalf("%s: %v", cmd, err)
	}
	return strings.TrimSpace(out)
}

// apply writes a declaration into the lab as a root-owned file and applies
// it with the executor, as a person at the machine would.
func (m *machine) apply(doc string, args ...string) (*shapes.Report, int) {
	m.t.Helper()
	rep, code, _ := m.applyLogged(doc, args...)
	return rep, code
}

// applyLogged is apply, with what the executor logged (its standard error).
func (m *machine) applyLogged(doc string, args ...string) (*shapes.Report, int, string) {
	m.t.Helper()
	if err := m.WriteFile("/root/decl.json", []byte(doc), 0o600); err != nil {
		m.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if len(args) == 0 {
		args = []string{"apply"}
	}
	argv := append([]string{"/usr/local/bin/mesh-executor"}, args...)
	argv = append(argv, "--json", "/root/decl.json")
	out, stderr, err := m.Run(ctx, argv...)
	code := 0
	if ee, ok := asExit(err); ok {
		code = ee
	} else if err != nil {
		m.t.Fatalf("%v\n%s", err, stderr)
	}
	var rep shapes.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		m.t.Fatalf("report %q: %v\n%s", out, err, stderr)
	}
	return &rep, code, stderr
}

func asExit(err error) (int, bool) {
	for e := err; e != nil; {
		if ee, ok := e.(*exec.ExitError); ok {
			return ee.ExitCode(), true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return 0, false
}

func outcomes(rep *shapes.Report) string {
	var s []string
	for _, l := range rep.Lines {
		s = append(s, l.Module+"."+l.ID+"="+string(l.Outcome))
	}
	return strings.Join(s, " ")
}

func expect(t *testing.T, rep *shapes.Report, outcome shapes.Outcome, lines string) {
	t.Helper()
	if rep.Outcome != outcome || outcomes(rep) != lines {
		t.Fatalf("report %s [%s], want %s [%s]\n%+v", rep.Outcome, outcomes(rep), outcome, lines, rep)
	}
}

func decl(resources ...string) string {
	if len(resources) == 0 {
		return `{"version":1,"resources":[],"owns_nothing":true}`
	}
	return `{"version":1,"resources":[` + strings.Join(resources, ",") + `]}`
}

const unit = `[Unit]
Description=%s
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`

// The service shape against a real systemd, through its D-Bus API, and
// ADR 0118 read off the real init: what the host started is stopped again,
// what was running before the mesh stays running.
func TestServiceOnSystemd(t *testing.T) {
	m := boot(t, lab.Options{Seed: map[string]string{
		"/etc/systemd/system/lp-web.service":                           fmt.Sprintf(unit, "web"),
		"/etc/systemd/system/lp-found.service":                         fmt.Sprintf(unit, "found running"),
		"/etc/systemd/system/multi-user.target.wants/lp-found.service": "symlink:/etc/systemd/system/lp-found.service",
		"/etc/systemd/system/mesh-agent.service":                       fmt.Sprintf(unit, "the host's own"),
		"/etc/systemd/system/innocent.service":                         "symlink:/etc/systemd/system/mesh-agent.service",
	}})
	if got := m.sh("systemctl is-active lp-found"); got != "active" {
		t.Fatalf("lp-found should run from boot: %s", got)
	}
	conf := func(content string) string {
		return `{"module":"web","id":"dir","type":"directory","path":"/etc/lp-web"},` +
			`{"module":"web","id":"conf","type":"file","path":"/etc/lp-web/web.conf","content":"` + content + `"}`
	}
	web := `{"module":"web","id":"web","type":"service","unit":"lp-web","state":"running","enabled":true,"restart_on":["conf"]}`
	found := `{"module":"web","id":"found","type":"service","unit":"lp-found.service","state":"running"}`

	rep, code := m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Applied, "web.dir=applied web.conf=applied web.found=unchanged web.web=applied")
	if code != 0 || m.sh("systemctl is-active lp-web") != "active" || m.sh("systemctl is-enabled lp-web") != "enabled" {
		t.Fatalf("lp-web not running and enabled: %+v", rep)
	}
	rep, _ = m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Unchanged, "web.dir=unchanged web.conf=unchanged web.found=unchanged web.web=unchanged")

	// Drift: stopped by hand, started again.
	m.sh("systemctl stop lp-web")
	rep, _ = m.apply(decl(conf("v1"), web, found))
	expect(t, rep, shapes.Repaired, "web.dir=unchanged web.conf=unchanged web.found=unchanged web.web=repaired")

	// restart_on: a changed file restarts the unit after the last step.
	pid := m.sh("systemctl show -p MainPID --value lp-web")
	rep, _ = m.apply(decl(conf("v2"), web, found))
	if after := m.sh("systemctl show -p MainPID --value lp-web"); after == pid || !strings.Contains(rep.Lines[len(rep.Lines)-1].Detail, "restarted: web.conf changed") {
		t.Fatalf("not restarted (pid %s → %s): %+v", pid, after, rep.Lines)
	}

	// plan names what the undeclare will stop, before it does.
	rep, _ = m.apply(decl(), "plan")
	if !strings.Contains(fmt.Sprint(rep.Lines), "would be stopped again and disabled again") || m.sh("systemctl is-active lp-web") != "active" {
		t.Fatalf("plan: %+v", rep.Lines)
	}
	// Undeclared: given back the state it was first found in.
	rep, _ = m.apply(decl())
	details := fmt.Sprint(rep.Lines)
	if !strings.Contains(details, "stopped again and disabled again, as the host found it") || !strings.Contains(details, "it was running before the mesh; its enablement was never declared; left as it is (running, enabled)") {
		t.Fatalf("%+v", rep.Lines)
	}
	if m.sh("systemctl is-active lp-web || true") != "inactive" || m.sh("systemctl is-enabled lp-web || true") != "disabled" {
		t.Fatal("lp-web not given back stopped and disabled")
	}
	if m.sh("systemctl is-active lp-found") != "active" {
		t.Fatal("a unit found running was stopped on the way out")
	}

	// An alias of the host's own unit is refused whole, as its name is.
	rep, code = m.apply(decl(`{"module":"x","id":"s","type":"service","unit":"innocent","state":"stopped"}`))
	if code != 2 || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "mesh-agent.service, the host's own unit") {
		t.Fatalf("exit %d %+v", code, rep)
	}
}

// deb builds a tiny package with dpkg-deb.
func deb(t *testing.T, dir, name, version string) string {
	t.Helper()
	root := filepath.Join(dir, name+"_"+version)
	os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755)
	os.MkdirAll(filepath.Join(root, "usr/share", name), 0o755)
	os.WriteFile(filepath.Join(root, "DEBIAN/control"), []byte(fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: tests <t@example.invalid>\nDescription: test package\n test package\n", name, version)), 0o644)
	os.WriteFile(filepath.Join(root, "usr/share", name, "version"), []byte(version+"\n"), 0o644)
	out := filepath.Join(dir, fmt.Sprintf("%s_%s_all.deb", name, version))
	if b, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", root, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, b)
	}
	return out
}

// serveRepo puts the .deb files into a local apt repository in the lab
// (/srv/repo, trusted, no network) and makes it apt's only source.
func (m *machine) serveRepo(debs ...string) {
	m.t.Helper()
	m.publishRepo("/srv/repo", debs...)
	m.WriteFile("/etc/apt/sources.list", []byte("deb [trusted=yes] file:/srv/repo ./\n"), 0o644)
	m.sh("rm -f /etc/apt/sources.list.d/*; apt-get update -qq -o APT::Get::List-Cleanup=1 >/dev/null 2>&1 || apt-get update")
}

// publishRepo puts debs in the repository at dir, as a release is
// published: the node's package index does not know them until it is
// refreshed.
func (m *machine) publishRepo(dir string, debs ...string) {
	m.t.Helper()
	var index strings.Builder
	for _, p := range debs {
		b, _ := os.ReadFile(p)
		if err := m.WriteFile(dir+"/"+filepath.Base(p), b, 0o644); err != nil {
			m.t.Fatal(err)
		}
		info, _ := exec.Command("dpkg-deb", "-f", p).Output()
		sum := sha256.Sum256(b)
		fmt.Fprintf(&index, "%sFilename: ./%s\nSize: %d\nSHA256: %s\n\n", info, filepath.Base(p), len(b), hex.EncodeToString(sum[:]))
	}
	m.WriteFile(dir+"/Packages", []byte(index.String()), 0o644)
}

// The package shape against dpkg and apt, with packages built by the test
// and served from a local repository inside the lab (no network).
func TestPackageOnApt(t *testing.T) {
	m := boot(t, lab.Options{Init: lab.S6})
	dir := t.TempDir()
	m.serveRepo(deb(t, dir, "lp-hello", "1.0"), deb(t, dir, "lp-hello", "2.0"))

	hello := `{"module":"base","id":"hello","type":"package","name":"lp-hello"}`
	rep, code := m.apply(decl(hello))
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if code != 0 || m.sh("dpkg-query -W -f='${Version}' lp-hello") != "2.0" {
		t.Fatalf("not installed from the repository: %+v", rep)
	}
	rep, _ = m.apply(decl(hello))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")

	// An exact pin, older than the repository's newest: exactly it.
	pinned := `{"module":"base","id":"hello","type":"package","name":"lp-hello","version":"1.0"}`
	rep, _ = m.apply(decl(pinned))
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if m.sh("dpkg-query -W -f='${Version}' lp-hello") != "1.0" {
		t.Fatal("the pin was not honoured")
	}
	// Without a version, a present package is never upgraded.
	rep, _ = m.apply(decl(hello))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	if m.sh("dpkg-query -W -f='${Version}' lp-hello") != "1.0" {
		t.Fatal("upgraded without a declared version")
	}
	// Undeclared: forgotten, never uninstalled.
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Forgotten, "base.hello=forgotten")
	if m.sh("dpkg-query -W -f='${db:Status-Status}' lp-hello") != "installed" {
		t.Fatal("uninstalled")
	}
	// A package the repository lacks fails, saying apt's own words.
	rep, code = m.apply(decl(`{"module":"base","id":"nope","type":"package","name":"lp-nowhere"}`))
	if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "lp-nowhere") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}

	// A release published after the node's last refresh: the declaration
	// naming it has the index refreshed, once, and installs it.
	m.publishRepo("/srv/repo", deb(t, dir, "lp-hello", "1.0"), deb(t, dir, "lp-hello", "2.0"), deb(t, dir, "lp-hello", "3.0"))
	refreshes := func(stderr string) int { return strings.Count(stderr, "package index refreshed") }
	hello3 := `{"module":"base","id":"hello","type":"package","name":"lp-hello","version":"3.0"}`
	rep, code, log := m.applyLogged(decl(hello3), "apply", "-v")
	expect(t, rep, shapes.Applied, "base.hello=applied base.nope=forgotten") // the one that failed, recorded, no longer declared
	if code != 0 || m.sh("dpkg-query -W -f='${Version}' lp-hello") != "3.0" || refreshes(log) != 1 {
		t.Fatalf("a release published after the last refresh: exit %d, %d refreshes, %+v\n%s", code, refreshes(log), rep.Lines, log)
	}
	// As declared: nothing to refresh for.
	rep, _, log = m.applyLogged(decl(hello3), "apply", "-v")
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	if refreshes(log) != 0 {
		t.Fatalf("refreshed for a package installed as declared:\n%s", log)
	}
	// A file of the declaration writes a repository's configuration; a
	// package after it is one only that repository has.
	m.publishRepo("/srv/repo2", deb(t, dir, "lp-extra", "1.0"))
	rep, code, log = m.applyLogged(decl(hello3,
		`{"module":"base","id":"repo2","type":"file","path":"/etc/apt/sources.list.d/lp-extra.list","content":"deb [trusted=yes] file:/srv/repo2 ./\n"}`,
		`{"module":"base","id":"extra","type":"package","name":"lp-extra"}`), "apply", "-v")
	expect(t, rep, shapes.Applied, "base.hello=unchanged base.repo2=applied base.extra=applied")
	if code != 0 || m.sh("dpkg-query -W -f='${Version}' lp-extra") != "1.0" || refreshes(log) != 1 {
		t.Fatalf("a package of a repository the same declaration configures: exit %d, %d refreshes, %+v\n%s", code, refreshes(log), rep.Lines, log)
	}
}

// The user shape against the shadow tools and the name service.
func TestUserOnTheShadowTools(t *testing.T) {
	m := boot(t, lab.Options{Init: lab.S6})
	alice := `{"module":"people","id":"alice","type":"user","name":"lpalice","shell":"/bin/bash","home":"/home/lpalice","groups":["audio"]}`
	rep, _ := m.apply(decl(alice))
	expect(t, rep, shapes.Applied, "people.alice=applied")
	if got := m.sh("getent passwd lpalice | cut -d: -f6,7"); got != "/home/lpalice:/bin/bash" {
		t.Fatalf("passwd: %s", got)
	}
	if !strings.Contains(m.sh("id -nG lpalice"), "audio") || m.sh("test -d /home/lpalice && echo yes") != "yes" {
		t.Fatal("groups or home missing")
	}
	// A group the operator added stays: groups are added, never pruned.
	m.sh("usermod -a -G video lpalice")
	rep, _ = m.apply(decl(alice))
	expect(t, rep, shapes.Unchanged, "people.alice=unchanged")
	m.sh("chsh -s /bin/sh lpalice")
	rep, _ = m.apply(decl(alice))
	expect(t, rep, shapes.Repaired, "people.alice=repaired")
	if g := m.sh("id -nG lpalice"); !strings.Contains(g, "video") || !strings.Contains(g, "audio") {
		t.Fatalf("groups pruned: %s", g)
	}
	// Undeclared: forgotten, never deleted.
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Forgotten, "people.alice=forgotten")
	if m.sh("getent passwd lpalice >/dev/null && echo yes") != "yes" {
		t.Fatal("deleted")
	}
	// A service account and what it owns, in one declaration: the owner
	// is resolved after the user is made (useradd, then the name service).
	svc := `{"module":"app","id":"user","type":"user","name":"lpsvc","home":"/srv/lpsvc"}`
	data := `{"module":"app","id":"data","type":"directory","path":"/srv/lpsvc-data","owner":"lpsvc","mode":"0750"}`
	conf := `{"module":"app","id":"conf","type":"file","path":"/srv/lpsvc-data/app.conf","owner":"lpsvc:lpsvc","content":"x\n"}`
	rep, _ = m.apply(decl(svc, data, conf))
	expect(t, rep, shapes.Applied, "app.user=applied app.data=applied app.conf=applied")
	if got, want := m.sh("stat -c %U:%G /srv/lpsvc-data /srv/lpsvc-data/app.conf | tr '\\n' ' '"), "lpsvc:lpsvc lpsvc:lpsvc"; got != want {
		t.Fatalf("owned by %q, want %q", got, want)
	}
	// A partial host refuses a user by name.
	rep, code := m.apply(decl(alice), "apply", "--partial")
	if code != 2 || !strings.Contains(rep.Refused, `a partial host applies only file, directory, region, keys, action and archive, not "user"`) {
		t.Fatalf("exit %d %+v", code, rep)
	}
}

// A user who can write a directory above a declared home plants a link
// where the home will be made: the shadow tools are never pointed at it.
func TestUserHomeThroughAPlantedLink(t *testing.T) {
	m := boot(t, lab.Options{Init: lab.S6})
	m.sh("mkdir -p /srv/shared && chmod 1777 /srv/shared && ln -s /etc /srv/shared/lpbob && chown -h nobody /srv/shared/lpbob")
	before := m.sh("stat -c '%U %a' /etc; ls /etc | wc -l")
	rep, code := m.apply(decl(`{"module":"p","id":"bob","type":"user","name":"lpbob","home":"/srv/shared/lpbob"}`))
	if code != 1 || !strings.Contains(rep.Lines[0].Detail, "is a symbolic link") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	if m.sh("stat -c '%U %a' /etc; ls /etc | wc -l") != before || m.sh("getent passwd lpbob >/dev/null && echo yes || echo no") != "no" {
		t.Fatal("the planted link steered the shadow tools")
	}
	// Through a link further up, too.
	m.sh("mkdir -p /srv/shared/real && ln -s /etc /srv/shared/up && chown -h nobody /srv/shared/up")
	rep, code = m.apply(decl(`{"module":"p","id":"bob","type":"user","name":"lpbob","home":"/srv/shared/up/lpbob"}`))
	if code != 1 || !strings.Contains(rep.Lines[0].Detail, "symbolic link") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
}

// A locked dpkg database is a clear failure, not a hang: apt waits its
// bounded time (10 s), and the step fails saying the database is locked.
func TestPackageLockedDpkgIsAClearFailure(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{Init: lab.S6})
	m.sh("(" + dpkgLocker + " > /tmp/locker.out 2>&1 &) ; for i in $(seq 100); do grep -q locked /tmp/locker.out 2>/dev/null && break; sleep 0.05; done; cat /tmp/locker.out")
	rep, code := m.apply(decl(`{"module":"base","id":"jq","type":"package","name":"lp-absent-locked"}`))
	if code != 1 || !strings.Contains(rep.Lines[0].Detail, "package database is locked by another process; nothing was installed") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
}

// A module that ships its own unit: the unit file is written, systemd is
// told to read it (daemon-reload), and only then is the unit started; a
// changed unit file is read again before the unit is asked about.
func TestServiceWithItsOwnUnitFile(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{})
	unitFile := func(desc string) string {
		return `{"module":"app","id":"unit","type":"file","path":"/etc/systemd/system/lp-new.service","content":` +
			strings.ReplaceAll(fmt.Sprintf("%q", fmt.Sprintf(unit, desc)), `\n`, `\n`) + `}`
	}
	svc := `{"module":"app","id":"svc","type":"service","unit":"lp-new","state":"running","enabled":true,"restart_on":["unit"]}`
	rep, code := m.apply(decl(unitFile("first"), svc))
	if code != 0 || rep.Outcome != shapes.Applied || m.sh("systemctl is-active lp-new") != "active" {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	rep, _ = m.apply(decl(unitFile("second"), svc))
	if got := m.sh("systemctl show -p Description --value lp-new"); got != "second" {
		t.Fatalf("systemd did not read the changed unit file: %q (%+v)", got, rep.Lines)
	}
	if m.sh("systemctl show -p NeedDaemonReload --value lp-new") != "no" {
		t.Fatal("systemd still wants a daemon-reload")
	}
	// Undeclared: stopped and disabled again, its file removed, and
	// systemd told.
	m.apply(decl())
	if m.sh("systemctl is-active lp-new || true") != "inactive" || m.sh("test -e /etc/systemd/system/lp-new.service && echo yes || echo no") != "no" {
		t.Fatal("not given back")
	}
}

// A file and a directory the host made before a package the host then
// installs ships them: undeclared, they are the package's, left to it —
// dpkg's own check finds nothing of the package missing.
func TestWhatAPackageShipsNowIsLeftToItOnApt(t *testing.T) {
	m := boot(t, lab.Options{Init: lab.S6})
	dir := t.TempDir()
	m.serveRepo(serviceDeb(t, dir, "lp-lib", map[string]string{"etc/lp-lib/main.conf": "the package's\n", "usr/share/lp-lib/data": "data\n"}, ""))
	conf := `{"module":"a","id":"conf","type":"file","path":"/etc/lp-lib/main.conf","content":"mine\n"}`
	libdir := `{"module":"a","id":"dir","type":"directory","path":"/etc/lp-lib"}`
	lib := `{"module":"b","id":"lib","type":"package","name":"lp-lib"}`
	rep, code := m.apply(decl(libdir, conf, lib))
	if code != 0 || rep.Outcome != shapes.Applied {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	rep, code = m.apply(decl(lib))
	if code != 0 || !strings.Contains(outcomes(rep), "a.conf=forgotten") || !strings.Contains(outcomes(rep), "a.dir=forgotten") {
		t.Fatalf("exit %d [%s] %+v", code, outcomes(rep), rep.Lines)
	}
	if got := m.sh("dpkg -V lp-lib; echo end"); got != "end" {
		t.Fatalf("dpkg finds the package's files changed or missing:\n%s", got)
	}
	if got := m.sh("cat /etc/lp-lib/main.conf"); got == "" {
		t.Fatal("the package's file was removed")
	}
}
