package machines

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// Alpine, as near as this machine gets to one: an OpenRC lab (OpenRC is
// PID 1, as on Alpine) whose package manager is the real apk, built from
// the vendored apk-tools source (lab.APKTools), with Debian's own package
// managers taken out of the lab so that everything the host does with
// packages goes through apk. Its repository is the test's own: packages
// signed with a key the test makes, an index made by `apk mkndx` and signed
// with that key, served over HTTP by busybox httpd inside the lab, and the
// lab trusting the key in /etc/apk/keys as Alpine trusts its developers'
// keys. Nothing in the path under test passes --allow-untrusted.
//
// Served over HTTP rather than read from a directory because apk reads a
// local repository's index afresh on every run, and caches a remote one
// (in /var/cache/apk): only a remote repository can be stale, which is
// what makes the applier's refresh-when-a-version-is-missing a question.

// apkKeyName is the public key's file name in /etc/apk/keys. apk trusts a
// v2 package's signature (nfpm's .apk is one) by that name, which nfpm
// takes from the maintainer's address; v3 packages and indexes are
// matched by the key itself, whatever the file is called.
const apkKeyName = "maintainers@nox-mesh.invalid.rsa.pub"

// apkRepo is the test's repository: its key, and what it publishes.
type apkRepo struct {
	t   *testing.T
	apk string // the apk built from the vendored source, on the host
	// busybox is Alpine's busybox as near as Debian's source gets it
	// (lab.BusyboxAlpine), on the host: the lab's /bin/busybox.
	busybox string
	dir     string // scratch on the host
	key     string // the private key (PEM), on the host
	keys    string // a directory holding only the public key, on the host
	pub     []byte
	tool    apkFile // the apk-tools package, which every publication holds
	n       int
}

// apkFile is one package of a publication.
type apkFile struct{ name, version, path string }

// apkFixture is a package the test builds with `apk mkpkg`.
type apkFixture struct {
	name, version string
	files         map[string]string // path (no leading /) → content; "#!" ones are 0755
}

func newAPKRepo(t *testing.T) *apkRepo {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the labs need root (make test runs as root)")
	}
	r := &apkRepo{t: t, apk: lab.APKTools(t), busybox: lab.BusyboxAlpine(t), dir: t.TempDir()}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	r.pub = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	r.key = filepath.Join(r.dir, "signing.rsa")
	r.keys = filepath.Join(r.dir, "keys")
	if err := os.WriteFile(r.key, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(r.keys, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.keys, apkKeyName), r.pub, 0o644); err != nil {
		t.Fatal(err)
	}
	// apk-tools itself, holding the apk the lab runs: on Alpine, apk's own
	// database knows apk-tools, and that is how the executor and the
	// profile tell an apk machine.
	bin, err := os.ReadFile(r.apk)
	if err != nil {
		t.Fatal(err)
	}
	r.tool = r.build(apkFixture{name: "apk-tools", version: "3.0.6-r0", files: map[string]string{"sbin/apk": string(bin)}})
	return r
}

// run runs the host's apk (building and indexing happen on the host, as
// a distribution's builders do).
func (r *apkRepo) run(args ...string) string {
	r.t.Helper()
	out, err := exec.Command(r.apk, args...).CombinedOutput()
	if err != nil {
		r.t.Fatalf("apk %q: %v\n%s", args, err, out)
	}
	return string(out)
}

// build makes p's package with apk mkpkg, signed with the repository's key.
func (r *apkRepo) build(p apkFixture) apkFile {
	r.t.Helper()
	root := filepath.Join(r.dir, "src", p.name+"-"+p.version)
	for f, c := range p.files {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(c, "#!") || strings.HasPrefix(f, "sbin/") {
			mode = 0o755
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(c), mode); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		r.t.Fatal(err)
	}
	out := filepath.Join(r.dir, "built", p.name+"-"+p.version+".apk")
	os.MkdirAll(filepath.Dir(out), 0o755)
	r.run("mkpkg", "-I", "name:"+p.name, "-I", "version:"+p.version, "-I", "arch:noarch",
		"-I", "description:test package "+p.name, "-I", "license:MIT", "-F", root, "-o", out, "--sign-key", r.key)
	return apkFile{p.name, p.version, out}
}

// publish makes the lab's repository hold exactly apk-tools and pkgs, with
// an index signed by the repository's key, as a release is published: a
// machine that cached the index before does not see them until apk update.
// mkndx checks each package's signature against the repository's key
// (--keys-dir): an unsigned package cannot be published.
func (r *apkRepo) publish(m *machine, pkgs ...apkFile) {
	r.t.Helper()
	r.n++
	out := filepath.Join(r.dir, fmt.Sprintf("pub-%d", r.n))
	if err := os.MkdirAll(out, 0o755); err != nil {
		r.t.Fatal(err)
	}
	args := []string{"mkndx", "--keys-dir", r.keys, "--sign-key", r.key, "-o", filepath.Join(out, "Packages.adb")}
	for _, p := range append([]apkFile{r.tool}, pkgs...) {
		// The name the index's default pkgname-spec gives it.
		dst := filepath.Join(out, p.name+"-"+p.version+".apk")
		data, err := os.ReadFile(p.path)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			r.t.Fatal(err)
		}
		args = append(args, dst)
	}
	r.run(args...)
	// Emptied, not replaced: httpd serves the directory it started in.
	m.sh("mkdir -p /srv/apkrepo && find /srv/apkrepo -mindepth 1 -delete")
	files, _ := filepath.Glob(filepath.Join(out, "*"))
	for _, f := range files {
		if err := m.CopyIn(f, "/srv/apkrepo/"+filepath.Base(f)); err != nil {
			r.t.Fatal(err)
		}
	}
}

// alpineLab boots the Alpine-like lab on r: OpenRC, apk with its database
// made from r (apk-tools installed from it), the key trusted, the
// repository served holding pkgs, and no dpkg, apt or pacman left for
// anything to find.
func alpineLab(t *testing.T, r *apkRepo, pkgs ...apkFile) *machine {
	t.Helper()
	m := boot(t, lab.Options{Init: lab.OpenRC})
	if err := m.CopyIn(r.apk, "/sbin/apk"); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("/etc/apk/keys/"+apkKeyName, r.pub, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("/etc/apk/repositories", []byte("http://127.0.0.1:8080/Packages.adb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.sh("rm -f /usr/bin/dpkg-query /usr/bin/dpkg /usr/bin/apt-get /usr/bin/apt /usr/bin/apt-cache /usr/bin/pacman")
	// Alpine's accounts are busybox's: adduser, addgroup, deluser and
	// delgroup are links to /bin/busybox, and shadow's useradd and its
	// kin are not installed. Debian's own adduser (a Perl script of the
	// same name) and shadow's tools are taken out of the lab, so anything
	// that makes a user here does so with busybox's applets.
	if err := m.CopyIn(r.busybox, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	m.sh("rm -f /usr/sbin/useradd /usr/sbin/groupadd /usr/sbin/userdel /usr/sbin/groupdel /usr/sbin/usermod /usr/sbin/groupmod && " +
		"for a in " + strings.Join(lab.BusyboxApplets, " ") + "; do rm -f /usr/sbin/$a /usr/bin/$a /sbin/$a /bin/$a; ln -s /bin/busybox /usr/sbin/$a; done")
	m.sh("ip link set lo up && mkdir -p /srv/apkrepo /var/cache/apk && busybox httpd -p 127.0.0.1:8080 -h /srv/apkrepo </dev/null >/dev/null 2>&1")
	r.publish(m, pkgs...)
	m.sh("apk add --initdb apk-tools >/dev/null")
	if got := m.sh("apk info -e -v apk-tools"); got != "apk-tools-3.0.6-r0" {
		t.Fatalf("apk's database: %q", got)
	}
	return m
}

// apkQ is what apk's own database says of name: "name-version", or "".
func (m *machine) apkQ(name string) string {
	m.t.Helper()
	return m.sh("apk info -e -v " + name + " 2>/dev/null || true")
}

// The operator's two lines on the Alpine-like lab, as the lifecycle has them: `apk add
// nox-mesh-host` from a signed repository (the .apk signed as nfpm signs
// it, the index by apk mkndx), then rc-update add and rc-service start for
// the executor and the agent. The package's post-install makes the
// agent's user and the state directories and adds both to the default
// runlevel (so the second line's rc-update add finds them there); the executor (through its launcher) and
// the agent come up, the agent not as root (running, as for the other
// inits). apk's database says the package is installed and owns the init
// scripts. And the trust is real: with the key taken out of /etc/apk/keys,
// apk refuses the repository's index.
func TestAlpineInstall(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	pkg := hostPackage(t, t.TempDir(), "0.9.1", "b1", brokenNot, "apk", "APK_SIGN_KEY="+r.key)
	m := alpineLab(t, r, apkFile{"nox-mesh-host", "0.9.1-r1", pkg})
	if m.sh("id -u mesh-agent 2>/dev/null || echo none") != "none" {
		t.Fatal("the lab has a mesh-agent user before the install")
	}
	// Alpine's adduser and addgroup are busybox's (alpineLab): with no
	// useradd on the machine, the post-install takes its busybox branch.
	if got := m.sh("command -v useradd || echo none; readlink /usr/sbin/adduser /usr/sbin/addgroup"); got != "none\n/bin/busybox\n/bin/busybox" {
		t.Fatalf("the lab's account tools: %q", got)
	}

	t.Logf("apk add nox-mesh-host:\n%s", m.sh("apk add nox-mesh-host 2>&1"))
	t.Logf("rc-update add, rc-service start:\n%s", m.sh("rc-update add mesh-executor default 2>&1 && rc-service mesh-executor start 2>&1 && "+
		"rc-update add mesh-agent default 2>&1 && rc-service mesh-agent start 2>&1"))

	if got := m.apkQ("nox-mesh-host"); got != "nox-mesh-host-0.9.1-r1" {
		t.Fatalf("apk's database says %q", got)
	}
	if got := m.sh("apk info -q --who-owns /etc/init.d/mesh-executor /etc/init.d/mesh-agent /usr/bin/mesh-executor"); got != "nox-mesh-host" {
		t.Errorf("apk info --who-owns the init scripts and the executor: %q", got)
	}
	if got := m.sh("rc-update show default | awk '{print $1}' | sort | tr '\\n' ' '"); !strings.Contains(got, "mesh-agent mesh-executor") {
		t.Errorf("the default runlevel holds %q", got)
	}
	// busybox's adduser -S: a system uid (100-999), the group addgroup -S
	// made as its primary group, the comment given with -g, no password.
	pw := strings.Split(m.sh("getent passwd mesh-agent"), ":")
	gr := strings.Split(m.sh("getent group mesh-agent"), ":")
	if len(pw) != 7 || pw[0] != "mesh-agent" || len(pw[2]) != 3 || pw[2] < "100" || len(gr) != 4 || pw[3] != gr[2] ||
		pw[4] != "nox-mesh-host link agent" || pw[5] != "/var/lib/mesh-host/agent" || !strings.HasSuffix(pw[6], "/nologin") {
		t.Errorf("the post-install's mesh-agent: %q, its group %q", pw, gr)
	}
	if sp := strings.Split(m.sh("grep ^mesh-agent: /etc/shadow"), ":"); len(sp) < 2 || (sp[1] != "!" && sp[1] != "*") {
		t.Errorf("mesh-agent's shadow entry: %q (no password expected)", sp)
	}
	if got := m.sh("stat -c '%U:%G %a' /var/lib/mesh-host/agent"); got != "mesh-agent:mesh-agent 700" {
		t.Errorf("the agent's state directory: %s", got)
	}
	running(t, m, lab.OpenRC)

	// Trust: the same repository, its key no longer trusted, is refused.
	m.sh("mv /etc/apk/keys/" + apkKeyName + " /root/")
	out := m.sh("apk update 2>&1; echo rc=$?")
	if strings.HasSuffix(out, "rc=0") || !strings.Contains(out, "UNTRUSTED") {
		t.Fatalf("apk update with the repository's key untrusted:\n%s", out)
	}
}

var (
	apkHello = apkFixture{name: "lp-hello", version: "1.0-r0", files: map[string]string{"usr/share/lp-hello/version": "1.0-r0\n"}}
	apkOther = apkFixture{name: "lp-other", version: "3.1-r2", files: map[string]string{"usr/share/lp-other/version": "3.1-r2\n"}}
)

// The package applier on apk, the same table as on dpkg and pacman
// (TestPacmanBackend): installed from the repository and read back from
// apk's database, unchanged on re-apply, an exact pin kept, a pin the
// repository does not hold failing with what is installed left alone, a
// locked database a clear failure, a package the repository lacks failing
// in apk's words, a release published after the machine's last refresh
// installed by its pin after one refresh (and none when nothing is
// missing), and forgotten, never uninstalled, when undeclared.
func TestAlpinePackageApplier(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	hello, other := r.build(apkHello), r.build(apkOther)
	m := alpineLab(t, r, hello, other)
	m.profile("").present(t, "package-manager", "apk")

	helloRes := `{"module":"base","id":"hello","type":"package","name":"lp-hello"}`
	rep, code := m.apply(decl(helloRes))
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if code != 0 || m.apkQ("lp-hello") != "lp-hello-1.0-r0" || m.sh("cat /usr/share/lp-hello/version") != "1.0-r0" {
		t.Fatalf("not installed from the repository: exit %d %+v", code, rep.Lines)
	}
	if d := rep.Lines[0].Detail; d != "installed 1.0-r0" {
		t.Fatalf("detail %q", d)
	}
	rep, code = m.apply(decl(helloRes))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	if code != 0 || !strings.Contains(rep.Lines[0].Detail, "1.0-r0 installed") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}

	pinned := func(v string) string {
		return `{"module":"base","id":"hello","type":"package","name":"lp-hello","version":"` + v + `"}`
	}
	rep, _ = m.apply(decl(pinned("1.0-r0")))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	rep, code = m.apply(decl(pinned("2.0-r0")))
	if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "2.0-r0") {
		t.Fatalf("a pin the repository lacks: exit %d %+v", code, rep.Lines)
	}
	t.Logf("pin 2.0-r0, repository 1.0-r0: %q", rep.Lines[0].Detail)
	if m.apkQ("lp-hello") != "lp-hello-1.0-r0" {
		t.Fatalf("lp-hello changed: %q", m.apkQ("lp-hello"))
	}

	// A locked database (another apk holds /lib/apk/db/lock): a clear
	// failure at once, and nothing installed.
	otherRes := `{"module":"base","id":"other","type":"package","name":"lp-other"}`
	m.sh("setsid flock /lib/apk/db/lock sleep 300 </dev/null >/dev/null 2>&1 & echo $! >/root/lock.pid")
	untilTrue(t, 10*time.Second, "another process holding apk's lock", func() bool {
		return m.sh("flock -n /lib/apk/db/lock true && echo free || echo held") == "held"
	})
	rep, code = m.apply(decl(helloRes, otherRes))
	if code != 1 || outcomes(rep) != "base.hello=unchanged base.other=failed" ||
		!strings.Contains(rep.Lines[1].Detail, "the apk package database is locked by another process; nothing was installed") {
		t.Fatalf("exit %d %s %+v", code, outcomes(rep), rep.Lines)
	}
	if m.apkQ("lp-other") != "" {
		t.Fatal("lp-other installed under the lock")
	}
	m.sh("kill -- -$(cat /root/lock.pid)") // flock and the sleep holding its descriptor
	untilTrue(t, 10*time.Second, "apk's lock released", func() bool {
		return m.sh("flock -n /lib/apk/db/lock true && echo free || echo held") == "free"
	})
	rep, _ = m.apply(decl(helloRes, otherRes))
	expect(t, rep, shapes.Applied, "base.hello=unchanged base.other=applied")
	if m.apkQ("lp-other") != "lp-other-3.1-r2" {
		t.Fatalf("lp-other: %q", m.apkQ("lp-other"))
	}

	// A package the repository lacks fails, in apk's words.
	nowhere := `{"module":"base","id":"nowhere","type":"package","name":"lp-nowhere"}`
	rep, code = m.apply(decl(helloRes, otherRes, nowhere))
	if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[2].Detail, "lp-nowhere (no such package)") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}

	// A release published after the machine's last refresh: its pin has
	// the index refreshed, once, and installs it.
	r.publish(m, r.build(apkFixture{name: "lp-hello", version: "2.0-r0", files: map[string]string{"usr/share/lp-hello/version": "2.0-r0\n"}}), other)
	if got := m.sh("apk search --exact --all lp-hello"); got != "lp-hello-1.0-r0" {
		t.Fatalf("the machine's index is not stale: apk search says %q", got)
	}
	rep, code, log := m.applyLogged(decl(pinned("2.0-r0"), otherRes), "apply", "-v")
	expect(t, rep, shapes.Applied, "base.hello=applied base.other=unchanged base.nowhere=forgotten")
	if code != 0 || m.apkQ("lp-hello") != "lp-hello-2.0-r0" || strings.Count(log, "package index refreshed") != 1 {
		t.Fatalf("a release published after the last refresh: exit %d %s %+v\n%s", code, m.apkQ("lp-hello"), rep.Lines, log)
	}
	if got := m.sh("cat /usr/share/lp-hello/version"); got != "2.0-r0" {
		t.Fatalf("lp-hello's file says %q", got)
	}
	rep, _, log = m.applyLogged(decl(pinned("2.0-r0"), otherRes), "apply", "-v")
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged base.other=unchanged")
	if strings.Contains(log, "package index refreshed") {
		t.Fatalf("refreshed for packages installed as declared:\n%s", log)
	}

	// Undeclared: forgotten, never uninstalled.
	rep, code = m.apply(decl())
	var lines []string
	for _, l := range rep.Lines {
		lines = append(lines, l.Module+"."+l.ID+"="+string(l.Outcome))
	}
	sort.Strings(lines)
	if code != 0 || strings.Join(lines, " ") != "base.hello=forgotten base.other=forgotten" {
		t.Fatalf("exit %d %s %+v", code, outcomes(rep), rep.Lines)
	}
	if m.apkQ("lp-hello") != "lp-hello-2.0-r0" || m.apkQ("lp-other") != "lp-other-3.1-r2" {
		t.Fatal("uninstalled")
	}
	rep, _ = m.apply(decl())
	if len(rep.Lines) != 0 {
		t.Fatalf("%+v", rep.Lines)
	}
}

// Found absent on apk: a service whose init script came with a package the
// host installed (apk info --who-owns says so) was absent before the mesh,
// and undeclaring it stops it and takes it out of the runlevel; one whose
// package the operator had installed and started is found as it was and
// left running. As Alpine's packages do, neither package starts or adds
// its service itself.
func TestAlpineFoundAbsentByWhoOwns(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	late := r.build(apkSleeper("lp-late"))
	had := r.build(apkSleeper("lp-had"))
	m := alpineLab(t, r, late, had)
	m.sh("apk add lp-had >/dev/null && rc-update add lp-had default >/dev/null && rc-service lp-had start >/dev/null 2>&1")

	rep, code := m.apply(decl(webPackage("lp-late"), webPackage("lp-had"), webService("lp-late"), webService("lp-had")))
	expect(t, rep, shapes.Applied, "web.pkg-lp-late=applied web.pkg-lp-had=unchanged web.lp-late=applied web.lp-had=unchanged")
	if d := rep.Lines[2].Detail; code != 0 || !strings.Contains(d, "found absent: brought by package lp-late, which the host installed") {
		t.Fatalf("exit %d, lp-late: %q", code, d)
	}
	if got := m.sh("rc-service lp-late status 2>&1 || true"); !strings.Contains(got, "started") {
		t.Fatalf("lp-late: %s", got)
	}

	rep, _ = m.apply(decl())
	got := map[string]shapes.Line{}
	for _, l := range rep.Lines {
		got[l.ID] = l
	}
	if l := got["lp-late"]; l.Outcome != shapes.Restored || !strings.Contains(l.Detail, "it did not exist before the declaration that brought it") {
		t.Errorf("lp-late undeclared: %s %q", l.Outcome, l.Detail)
	}
	if l := got["lp-had"]; l.Outcome != shapes.Forgotten || !strings.Contains(l.Detail, "it was running before the mesh") {
		t.Errorf("lp-had undeclared: %s %q", l.Outcome, l.Detail)
	}
	if s := m.sh("rc-service lp-late status 2>&1 || true"); !strings.Contains(s, "stopped") {
		t.Errorf("lp-late after the undeclare: %s", s)
	}
	if s := m.sh("rc-update show default"); strings.Contains(s, "lp-late") || !strings.Contains(s, "lp-had") {
		t.Errorf("the default runlevel after the undeclare: %s", s)
	}
	if s := m.sh("rc-service lp-had status 2>&1 || true"); !strings.Contains(s, "started") {
		t.Errorf("lp-had after the undeclare: %s", s)
	}
	if m.apkQ("lp-late") != "lp-late-1.0-r0" || m.apkQ("lp-had") != "lp-had-1.0-r0" {
		t.Error("a package was uninstalled")
	}
}

// apkSleeper is package n at 1.0-r0 holding an OpenRC script of its own
// name that runs a sleep, neither added to a runlevel nor started by the
// package (as Alpine's packages do).
func apkSleeper(n string) apkFixture {
	return apkFixture{name: n, version: "1.0-r0", files: map[string]string{
		"etc/init.d/" + n: "#!/sbin/openrc-run\ncommand=/bin/sleep\ncommand_args=100000\ncommand_background=true\npidfile=/run/" + n + ".pid\n"}}
}

// webPackage and webService are the resources of module web for package
// or service u.
func webPackage(u string) string {
	return `{"module":"web","id":"pkg-` + u + `","type":"package","name":"` + u + `"}`
}

func webService(u string) string {
	return `{"module":"web","id":"` + u + `","type":"service","unit":"` + u + `","state":"running","enabled":true}`
}

// apk-tools 3 reads global options from /etc/apk/config before the
// command line's (2 has no such file), and a quiet or verbose there
// changes what info and search print: "NAME" without its version, or
// "PATH is owned by NAME-VERSION" in place of who-owns' bare names. The
// applier reads apk the same whatever that file says: with quiet, a
// package installed and read back at its version, unchanged on
// re-apply, a release published after the last refresh found by search
// after one; with verbose, the same, and who-owns deciding "found
// absent" for a unit its package brought.
func TestAlpineApplierWhateverAPKConfigSays(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	hello, late := r.build(apkHello), r.build(apkSleeper("lp-late"))
	m := alpineLab(t, r, hello, late)
	helloAt := func(v string) string {
		return `{"module":"base","id":"hello","type":"package","name":"lp-hello","version":"` + v + `"}`
	}

	m.WriteFile("/etc/apk/config", []byte("quiet\n"), 0o644)
	// The premise: with quiet, what the applier once asked says no version.
	if got := m.sh("apk info -e -v apk-tools"); got != "apk-tools" {
		t.Fatalf("apk info -e -v under a quiet /etc/apk/config: %q", got)
	}
	rep, code := m.apply(decl(helloAt("1.0-r0")))
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if d := rep.Lines[0].Detail; code != 0 || d != "installed 1.0-r0" {
		t.Fatalf("quiet: exit %d, %q", code, d)
	}
	rep, _ = m.apply(decl(helloAt("1.0-r0")))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	r.publish(m, r.build(apkFixture{name: "lp-hello", version: "2.0-r0", files: map[string]string{"usr/share/lp-hello/version": "2.0-r0\n"}}), late)
	rep, code, log := m.applyLogged(decl(helloAt("2.0-r0")), "apply", "-v")
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if code != 0 || m.sh("APK_CONFIG=/dev/null apk info -e -v lp-hello") != "lp-hello-2.0-r0" || strings.Count(log, "package index refreshed") != 1 {
		t.Fatalf("quiet: a release published after the last refresh: exit %d %+v\n%s", code, rep.Lines, log)
	}

	m.WriteFile("/etc/apk/config", []byte("verbose\n"), 0o644)
	if got := m.sh("apk info -q --who-owns /sbin/apk"); got != "/sbin/apk is owned by apk-tools-3.0.6-r0" {
		t.Fatalf("apk info -q --who-owns under a verbose /etc/apk/config: %q", got)
	}
	rep, code = m.apply(decl(helloAt("2.0-r0"), webPackage("lp-late"), webService("lp-late")))
	expect(t, rep, shapes.Applied, "base.hello=unchanged web.pkg-lp-late=applied web.lp-late=applied")
	if d := rep.Lines[0].Detail; !strings.Contains(d, "2.0-r0 installed") {
		t.Errorf("verbose: lp-hello read back as %q", d)
	}
	if d := rep.Lines[2].Detail; code != 0 || !strings.Contains(d, "found absent: brought by package lp-late, which the host installed") {
		t.Fatalf("verbose: exit %d, lp-late: %q", code, d)
	}
}

// The launcher's rollback through apk: the host installed from the signed
// repository at 0.9.1 and running until its launcher keeps that release
// as known good; then a release whose executor crash-loops at every start
// is installed with apk (here by hand, as an operator would; the
// declaration's way is TestUpgradeThroughADeclaration's on apt) and its
// executor started by the launcher. The launcher rolls back once,
// through `apk add nox-mesh-host=0.9.1-r1` (a downgrade, from the same
// repository), checks the binaries against its known-good digests, and
// runs the known-good host again; apk's database says 0.9.1-r1. Then a
// second failure, with the known-good release failing too: rolled back
// through apk once more, then halted.
func TestAlpineRollbackThroughAPK(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	dir := t.TempDir()
	good := hostPackage(t, dir, "0.9.1", "b1", brokenNot, "apk", "APK_SIGN_KEY="+r.key)
	broken := hostPackage(t, dir, "0.9.3", "b3", brokenExecutor, "apk", "APK_SIGN_KEY="+r.key)
	m := alpineLab(t, r, apkFile{"nox-mesh-host", "0.9.1-r1", good}, apkFile{"nox-mesh-host", "0.9.3-r1", broken})
	m.sh("apk add nox-mesh-host=0.9.1-r1 >/dev/null 2>&1 && rc-service mesh-executor start >/dev/null 2>&1 && rc-service mesh-agent start >/dev/null 2>&1")
	t.Cleanup(func() {
		if t.Failed() {
			out, _, _ := m.Run(t.Context(), "/bin/sh", "-c", "tail -n 60 /var/log/mesh-executor.log; mesh-launch status --state /var/lib/mesh-host/executor 2>&1")
			t.Logf("the executor's log:\n%s", out)
		}
	})
	untilTrue(t, 120*time.Second, "0.9.1 is known-good", func() bool {
		return m.sh("/var/lib/mesh-host/executor/known-good/mesh-executor version 2>/dev/null || true") == "0.9.1"
	})
	m.sh("apk add nox-mesh-host=0.9.3-r1 >/dev/null 2>&1")
	if got := m.apkQ("nox-mesh-host"); got != "nox-mesh-host-0.9.3-r1" {
		t.Fatalf("apk installed %q", got)
	}
	// The running executor exits; the launcher starts the new binary.
	m.sh("pkill -x -TERM mesh-executor")
	untilTrue(t, 180*time.Second, "rolled back to the known-good 0.9.1 through apk", func() bool {
		return m.apkQ("nox-mesh-host") == "nox-mesh-host-0.9.1-r1" &&
			m.sh("grep -c 'reinstalled the known-good release through the package manager' /var/log/mesh-executor.log || true") != "0"
	})
	if got := m.sh("/usr/bin/mesh-executor version"); got != "0.9.1" {
		t.Fatalf("after the rollback /usr/bin/mesh-executor says %s", got)
	}
	untilTrue(t, 30*time.Second, "the known-good executor serving again", func() bool {
		return m.sh("mesh-executor status 2>/dev/null | grep -c 'state: hosted' || true") == "1"
	})
	if log := m.sh("cat /var/log/mesh-executor.log"); !strings.Contains(log, "a broken release: it crashes at start") {
		t.Errorf("the broken release never ran:\n%s", log)
	}
	untilTrue(t, 60*time.Second, "the rollback's mark cleared by the known-good release's reconcile", func() bool {
		return strings.Contains(m.sh("mesh-launch status --state /var/lib/mesh-host/executor 2>&1 || true"), "the release reinstalled has reconciled since")
	})

	// A second failure: the broken release again, and this time the
	// machine is at fault too — a file that is not a socket where the
	// executor's socket goes, which no executor removes. The launcher
	// rolls back once more through apk, the known-good release fails at
	// start as well, and the launcher halts: a different diagnosis, for a
	// person. It stays up, idle, starting nothing; once the machine is
	// mended, mesh-launch clear resumes it.
	const sock = "/run/mesh-host/executor.sock"
	m.sh("apk add nox-mesh-host=0.9.3-r1 >/dev/null 2>&1")
	m.sh("rm -f " + sock + " && echo 'not a socket' >" + sock + " && pkill -x -TERM mesh-executor")
	status := func() string { return m.sh("mesh-launch status --state /var/lib/mesh-host/executor 2>&1 || true") }
	untilTrue(t, 180*time.Second, "the launcher halted after the known-good release failed too", func() bool {
		return strings.Contains(status(), "halted: yes")
	})
	st := status()
	if !strings.Contains(st, "after the rollback to the known-good copy") || !strings.Contains(st, "the machine is the problem") {
		t.Errorf("the halt does not say why:\n%s", st)
	}
	t.Logf("mesh-launch status, halted:\n%s", st)
	if got := m.apkQ("nox-mesh-host"); got != "nox-mesh-host-0.9.1-r1" {
		t.Errorf("after the second rollback apk's database says %q", got)
	}
	log := m.sh("cat /var/log/mesh-executor.log")
	if n := strings.Count(log, "reinstalled the known-good release through the package manager"); n != 2 {
		t.Errorf("%d rollbacks through apk, want one for each broken release's crash loop", n)
	}
	if !strings.Contains(log, sock+" exists and is not a socket") {
		t.Errorf("the known-good executor's failure is not in its log:\n%s", log)
	}
	// Idle: the init's process is up, and no executor is started again.
	time.Sleep(5 * time.Second)
	if got := m.sh("rc-service mesh-executor status 2>&1 || true"); !strings.Contains(got, "started") {
		t.Errorf("the halted launcher's service: %s", got)
	}
	if got := m.sh("pgrep -x mesh-executor || echo none"); got != "none" {
		t.Errorf("an executor runs on a halted node: %s", got)
	}
	m.sh("rm -f " + sock + " && mesh-launch clear --state /var/lib/mesh-host/executor >/dev/null")
	untilTrue(t, 60*time.Second, "the known-good executor serving after mesh-launch clear", func() bool {
		return m.sh("mesh-executor status 2>/dev/null | grep -c 'state: hosted' || true") == "1"
	})
}

// A mesh born on the Alpine-like lab, and its second node, on two such
// labs joined by a veth, with the .apk from the signed repository, apk,
// the launcher and OpenRC, as on dpkg (TestMeshBornFromOneMachine):
//
//  1. A installs the host with the operator's two lines (apk add, then
//     rc-update and rc-service); `mesh-executor reconcile` (the package's
//     executor, which pins the carried bundle's digest) applies the
//     bundle, which raises the control side as the OpenRC service the
//     package carries (its unit named mesh-control.service in the
//     bundle, as for systemd);
//  2. A enrols against it with a token, node one; B installs and enrols
//     against A over the veth, node two; both get the overlay first
//     (wireguard-go, without systemd) and ping each other through it,
//     then a module;
//  3. 0.9.2 and 0.9.3 are published after both last read the index; both
//     are upgraded to 0.9.2-r1 through a declaration (apk refreshes its
//     index and installs it, the host checks the new binary, exits, the
//     launcher starts it, the agent follows) and report it running;
//  4. B is declared 0.9.3-r1, whose executor crash-loops: the launcher
//     rolls back through apk to the known-good 0.9.2-r1, which reconciles
//     and says why it does not install the declared release again; the
//     overlay holds.
func TestAlpineMeshBornAndUpgraded(t *testing.T) {
	t.Parallel()
	r := newAPKRepo(t)
	dir, key := t.TempDir(), "APK_SIGN_KEY="+r.key
	v1 := apkFile{"nox-mesh-host", "0.9.1-r1", hostPackage(t, dir, "0.9.1", "b1", brokenNot, "apk", key)}
	v2 := apkFile{"nox-mesh-host", "0.9.2-r1", hostPackage(t, dir, "0.9.2", "b2", brokenNot, "apk", key)}
	v3 := apkFile{"nox-mesh-host", "0.9.3-r1", hostPackage(t, dir, "0.9.3", "b3", brokenExecutor, "apk", key)}
	A, B := alpineLab(t, r, v1), alpineLab(t, r, v1)
	for _, m := range []*machine{A, B} {
		m := m
		t.Cleanup(func() {
			if t.Failed() {
				out, _, _ := m.Run(context.Background(), "/bin/sh", "-c",
					"tail -n 40 /var/log/mesh-executor.log /var/log/mesh-agent.log /var/log/mesh-control.log 2>&1; mesh-launch status --state /var/lib/mesh-host/executor 2>&1; apk info -v nox-mesh-host 2>&1")
				t.Logf("%s says:\n%s", m.Name(), out)
			}
		})
	}
	lab.Link(t, A.Machine, B.Machine, "10.231.31.1/24", "10.231.31.2/24")
	for _, m := range []*machine{A, B} {
		// The lab's test-built executor (boot's) is not the package's:
		// the commands below are the package's, found on the PATH.
		m.sh("rm -f /usr/local/bin/mesh-executor")
		m.sh("apk add nox-mesh-host >/dev/null 2>&1 && rc-update add mesh-executor default >/dev/null 2>&1 && rc-service mesh-executor start >/dev/null 2>&1 && " +
			"rc-update add mesh-agent default >/dev/null 2>&1 && rc-service mesh-agent start >/dev/null 2>&1")
		untilTrue(t, 30*time.Second, m.Name()+": the host runs", func() bool {
			return strings.HasPrefix(m.sh("mesh-executor status 2>/dev/null || true"), "state: hosted")
		})
	}

	// 1. The carried bundle raises the control side on A.
	if out := A.sh("mesh-executor reconcile 2>&1; echo exit $?"); !strings.HasSuffix(out, "exit 0") {
		t.Fatalf("mesh-executor reconcile:\n%s", out)
	}
	const ctl = "--dir /var/lib/mesh-control"
	untilTrue(t, 30*time.Second, "the control side serves", func() bool {
		return A.sh("mesh-control nodes "+ctl+" >/dev/null 2>&1 && echo ok || true") == "ok"
	})
	if got := A.sh("rc-service mesh-control status 2>&1 || true"); !strings.Contains(got, "started") {
		t.Fatalf("the bundle's control side under OpenRC: %s", got)
	}
	if got := A.sh("rc-update show default"); !strings.Contains(got, "mesh-control") {
		t.Errorf("the bundle's control side is not in the default runlevel:\n%s", got)
	}
	if got := A.sh("stat -c '%a' /var/lib/mesh-control && test -s /var/lib/mesh-control/control.key && echo keyed"); got != "700\nkeyed" {
		t.Errorf("the control side's state: %q", got)
	}
	A.sh("mesh-control overlay set --network 10.99.31.0/24 " + ctl)

	// 2. Node one, then node two, each with its own token, over the veth.
	for _, n := range []struct {
		m    *machine
		name string
	}{{A, "a"}, {B, "b"}} {
		token := A.sh("mesh-control token issue --new --name " + n.name + " --broker-url tls://10.231.31.1:4222 " + ctl + " 2>/dev/null")
		if err := n.m.WriteFile("/root/token", []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := n.m.sh("mesh-executor enrol --token-file /root/token --wait 60s 2>&1 || true"); !strings.Contains(out, "enrolled as node "+n.name) {
			t.Fatalf("%s: enrol: %s", n.name, out)
		}
		A.sh(fmt.Sprintf("mesh-control node endpoint %s 10.231.31.%d:51820 %s", n.name, map[string]int{"a": 1, "b": 2}[n.name], ctl))
	}
	type nodeState struct {
		Name            string `json:"name"`
		Address         string `json:"overlay_address"`
		ExecutorVersion string `json:"executor_version"`
		Heartbeat       *struct {
			AgentVersion string `json:"agent_version"`
		}
	}
	nodes := func() map[string]nodeState {
		var ns []nodeState
		json.Unmarshal([]byte(A.sh("mesh-control nodes --json "+ctl+" 2>/dev/null || true")), &ns)
		out := map[string]nodeState{}
		for _, n := range ns {
			out[n.Name] = n
		}
		return out
	}
	runs := func(v string) func() bool {
		return func() bool {
			ns := nodes()
			for _, n := range []string{"a", "b"} {
				if ns[n].ExecutorVersion != v || ns[n].Heartbeat == nil || ns[n].Heartbeat.AgentVersion != v {
					return false
				}
			}
			return true
		}
	}
	untilTrue(t, 60*time.Second, "both nodes heard from, running 0.9.1", runs("0.9.1"))
	// The overlay first (wireguard-go, left to daemonise without systemd):
	// they ping each other through it.
	addr := map[string]string{}
	untilTrue(t, 90*time.Second, "both nodes have the overlay up", func() bool {
		ns := nodes()
		for _, n := range []string{"a", "b"} {
			if addr[n] = strings.Split(ns[n].Address, "/")[0]; addr[n] == "" {
				return false
			}
		}
		return A.sh("ip -br addr show mesh0 2>/dev/null || true") != "" && B.sh("ip -br addr show mesh0 2>/dev/null || true") != ""
	})
	untilTrue(t, 60*time.Second, "a pings b through the overlay", func() bool { return A.pings(addr["b"]) })
	untilTrue(t, 60*time.Second, "b pings a through the overlay", func() bool { return B.pings(addr["a"]) })
	// Then modules, each assigned after the overlay.
	assign := func(file string, nodes []string, resources ...string) {
		A.WriteFile(file, []byte(`{"version":1,"resources":[`+strings.Join(resources, ",")+`]}`), 0o600)
		for _, n := range nodes {
			A.sh("mesh-control assign " + n + " " + file + " " + ctl)
		}
	}
	host := func(v string) string {
		return `{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"` + v + `"}`
	}
	assign("/root/site.json", []string{"a", "b"}, `{"module":"site","id":"conf","type":"file","path":"/etc/lp-site.conf","content":"greeting=hello\n"}`)
	for _, m := range []*machine{A, B} {
		untilTrue(t, 60*time.Second, m.Name()+": the module applied", func() bool {
			return m.sh("cat /etc/lp-site.conf 2>/dev/null || true") == "greeting=hello"
		})
	}
	if !strings.Contains(A.sh("mesh-executor owned"), "bundle:control.serve") {
		t.Fatalf("the bundle's work after the link's declarations:\n%s", A.sh("mesh-executor owned"))
	}

	// 3. Releases published after both machines last read the index, and
	// both upgraded through a declaration.
	for _, m := range []*machine{A, B} {
		r.publish(m, v1, v2, v3)
	}
	assign("/root/host.json", []string{"a", "b"}, host("0.9.2-r1"))
	untilTrue(t, 180*time.Second, "both report 0.9.2 running, executor and agent", runs("0.9.2"))
	for _, m := range []*machine{A, B} {
		if got := m.apkQ("nox-mesh-host"); got != "nox-mesh-host-0.9.2-r1" {
			t.Fatalf("%s: apk's database says %q", m.Name(), got)
		}
	}
	if rep := A.sh("mesh-control reports b --last 5 " + ctl); !strings.Contains(rep, "0.9.1-r1 → 0.9.2-r1") || !strings.Contains(rep, "restarts onto it") {
		t.Fatalf("b's report of the upgrade:\n%s", rep)
	}
	if got := A.sh("rc-service mesh-control status 2>&1 || true"); !strings.Contains(got, "started") {
		t.Fatalf("the control side after A's upgrade: %s", got)
	}

	// 4. B is declared a release that crash-loops: rolled back once,
	// through apk, to the known-good 0.9.2-r1.
	untilTrue(t, 90*time.Second, "b holds 0.9.2 as known-good", func() bool {
		return B.sh("/var/lib/mesh-host/executor/known-good/mesh-executor version 2>/dev/null || true") == "0.9.2"
	})
	assign("/root/broken.json", []string{"b"}, host("0.9.3-r1"))
	untilTrue(t, 60*time.Second, "apk installed the broken release on b", func() bool {
		return B.apkQ("nox-mesh-host") == "nox-mesh-host-0.9.3-r1" || strings.Contains(B.sh("cat /var/log/mesh-executor.log"), "a broken release")
	})
	untilTrue(t, 180*time.Second, "b rolled back to 0.9.2-r1 through apk, and running", func() bool {
		return B.apkQ("nox-mesh-host") == "nox-mesh-host-0.9.2-r1" &&
			B.sh("grep -c 'crash-looped at start and the launcher rolled it back' /var/log/mesh-executor.log || true") != "0"
	})
	untilTrue(t, 60*time.Second, "b runs 0.9.2 again", func() bool { return nodes()["b"].ExecutorVersion == "0.9.2" })
	log := B.sh("cat /var/log/mesh-executor.log")
	for _, want := range []string{"a broken release: it crashes at start", "reinstalled the known-good release through the package manager",
		"nox-mesh-host 0.9.3-r1 crash-looped at start and the launcher rolled it back ("} {
		if !strings.Contains(log, want) {
			t.Errorf("b's executor log does not say %q", want)
		}
	}
	if got := B.sh("grep -c 'nox-mesh-host=0.9.2-r1' /etc/apk/world || true"); got != "1" {
		t.Errorf("b's /etc/apk/world after the rollback:\n%s", B.sh("cat /etc/apk/world"))
	}
	// A goes on: its control side, its own release; the overlay holds.
	if nodes()["a"].ExecutorVersion != "0.9.2" || !strings.Contains(A.sh("rc-service mesh-control status 2>&1 || true"), "started") {
		t.Fatal("b's rollback disturbed a")
	}
	if !A.pings(addr["b"]) {
		t.Fatal("the overlay did not survive the upgrade and the rollback")
	}
}
