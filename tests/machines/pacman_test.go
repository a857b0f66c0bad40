package machines

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The package shape against pacman: Debian's pacman-package-manager in a
// lab, with packages the test builds by hand (a tar holding a .PKGINFO,
// zstd-compressed when the host has zstd) served from a repository of the
// test's own (its database built by hand as pacman reads it: Debian's
// repo-add needs makepkg's library and bsdtar, which pacman-package-manager
// does not bring), through `SigLevel = Never` and `Server = file://`.
// Everything is read back with pacman's own database (`pacman -Q`).

// pacPkg is one package of the test's repository.
type pacPkg struct {
	name, version string // version is pkgver-pkgrel, e.g. 1.0-1
	files         map[string]string
}

// build makes the package file: its name and bytes, and the installed size.
func (p pacPkg) build(t *testing.T) (string, []byte, int) {
	t.Helper()
	size := 0
	for _, c := range p.files {
		size += len(c)
	}
	info := fmt.Sprintf("pkgname = %s\npkgbase = %s\npkgver = %s\npkgdesc = test package %s\n"+
		"url = https://example.invalid/\nbuilddate = 1700000000\npackager = tests <t@example.invalid>\n"+
		"size = %d\narch = any\n", p.name, p.name, p.version, p.name, size)
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	add := func(name, content string) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(content))
	}
	add(".PKGINFO", info)
	paths := make([]string, 0, len(p.files))
	for f := range p.files {
		paths = append(paths, f)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, f := range paths {
		parts := strings.Split(f, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX})
			}
		}
		add(f, p.files[f])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("%s-%s-any.pkg.tar", p.name, p.version)
	if zstd, err := exec.LookPath("zstd"); err == nil {
		cmd := exec.Command(zstd, "-q", "-c")
		cmd.Stdin = &raw
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("zstd: %v", err)
		}
		return base + ".zst", out, size
	}
	return base + ".gz", gzipped(t, raw.Bytes()), size
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// pacmanLab boots an s6 lab (the init does not matter here) holding the
// repository pacrepo with pkgs at /srv/pacrepo, configures pacman for it
// alone, synchronises, and installs "pacman" itself from it, so that
// pacman's own database knows pacman, as on an Arch machine.
func pacmanLab(t *testing.T, pkgs ...pacPkg) *machine {
	t.Helper()
	if _, err := exec.LookPath("pacman"); err != nil {
		t.Fatal("pacman is missing (Debian package pacman-package-manager; tests/install-deps.sh installs it)")
	}
	m := boot(t, lab.Options{Init: lab.S6})
	m.publishPacRepo(append(pkgs, pacPkg{name: "pacman", version: "6.0.2-3"})...)
	conf := "[options]\nArchitecture = auto\nSigLevel = Never\nLocalFileSigLevel = Never\n\n" +
		"[pacrepo]\nServer = file:///srv/pacrepo\n"
	if err := m.WriteFile("/etc/pacman.conf", []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	m.sh("pacman -Sy --noconfirm >/dev/null && pacman -S --noconfirm pacman >/dev/null")
	if got := m.sh("pacman -Q pacman"); got != "pacman 6.0.2-3" {
		t.Fatalf("pacman's database: %q", got)
	}
	return m
}

// publishPacRepo makes /srv/pacrepo hold exactly pkgs, as a release is
// published: the machine's sync database does not know them until it is
// refreshed (pacman -Sy).
func (m *machine) publishPacRepo(pkgs ...pacPkg) {
	t := m.t
	t.Helper()
	var db bytes.Buffer
	tw := tar.NewWriter(&db)
	for _, p := range pkgs {
		file, data, isize := p.build(t)
		if err := m.WriteFile("/srv/pacrepo/"+file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		desc := fmt.Sprintf("%%FILENAME%%\n%s\n\n%%NAME%%\n%s\n\n%%BASE%%\n%s\n\n%%VERSION%%\n%s\n\n"+
			"%%DESC%%\ntest package %s\n\n%%CSIZE%%\n%d\n\n%%ISIZE%%\n%d\n\n%%SHA256SUM%%\n%s\n\n"+
			"%%ARCH%%\nany\n\n%%BUILDDATE%%\n1700000000\n\n%%PACKAGER%%\ntests <t@example.invalid>\n\n",
			file, p.name, p.name, p.version, p.name, len(data), isize, hex.EncodeToString(sum[:]))
		dir := p.name + "-" + p.version + "/"
		tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0)})
		tw.WriteHeader(&tar.Header{Name: dir + "desc", Mode: 0o644, Size: int64(len(desc)), ModTime: time.Unix(1700000000, 0)})
		tw.Write([]byte(desc))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("/srv/pacrepo/pacrepo.db", gzipped(t, db.Bytes()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// pacQ is what pacman's own database says of name: "name version", or "".
func (m *machine) pacQ(name string) string {
	m.t.Helper()
	return m.sh("pacman -Q " + name + " 2>/dev/null || true")
}

var (
	lpHello  = pacPkg{name: "lp-hello", version: "1.0-1", files: map[string]string{"usr/share/lp-hello/version": "1.0-1\n"}}
	lpOther  = pacPkg{name: "lp-other", version: "3.1-2", files: map[string]string{"usr/share/lp-other/version": "3.1-2\n"}}
	lpPinned = pacPkg{name: "lp-pinned", version: "1.0-1", files: map[string]string{"usr/share/lp-pinned/version": "1.0-1\n"}}
)

// The pacman backend: installed and read back, unchanged on re-apply, an
// exact pin kept, a pin the machine does not have failing, a locked
// database a clear and quick failure, a missing package failing in pacman's
// words, and forgotten, never removed, when undeclared.
//
// The executor picks dpkg whenever dpkg-query is on PATH (see
// TestPacmanDetectedByItsDatabase), so this lab hides dpkg-query to reach
// the pacman backend at all.
func TestPacmanBackend(t *testing.T) {
	t.Parallel()
	m := pacmanLab(t, lpHello, lpOther)
	m.sh("rm $(command -v dpkg-query)")
	m.profile("").present(t, "package-manager", "pacman")

	hello := `{"module":"base","id":"hello","type":"package","name":"lp-hello"}`
	rep, code := m.apply(decl(hello))
	expect(t, rep, shapes.Applied, "base.hello=applied")
	if code != 0 || m.pacQ("lp-hello") != "lp-hello 1.0-1" || m.sh("cat /usr/share/lp-hello/version") != "1.0-1" {
		t.Fatalf("not installed from the repository: exit %d %+v", code, rep.Lines)
	}
	if d := rep.Lines[0].Detail; d != "installed 1.0-1" {
		t.Fatalf("detail %q", d)
	}
	rep, code = m.apply(decl(hello))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	if code != 0 || !strings.Contains(rep.Lines[0].Detail, "1.0-1 installed") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}

	// An exact pin that is what is installed: nothing to do.
	pinned := func(v string) string {
		return `{"module":"base","id":"hello","type":"package","name":"lp-hello","version":"` + v + `"}`
	}
	rep, _ = m.apply(decl(pinned("1.0-1")))
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged")
	// A pin of a version the repository does not hold fails, and leaves
	// what is installed alone.
	rep, code = m.apply(decl(pinned("2.0-1")))
	if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "2.0-1") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	if m.pacQ("lp-hello") != "lp-hello 1.0-1" {
		t.Fatalf("lp-hello changed: %q", m.pacQ("lp-hello"))
	}

	// A locked database (another pacman holds db.lck): a clear failure at
	// once, not a hang, and nothing installed.
	other := `{"module":"base","id":"other","type":"package","name":"lp-other"}`
	m.sh("touch /var/lib/pacman/db.lck")
	start := time.Now()
	rep, code = m.apply(decl(hello, other))
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a locked database took %v", took)
	}
	if code != 1 || outcomes(rep) != "base.hello=unchanged base.other=failed" ||
		!strings.Contains(rep.Lines[1].Detail, "the pacman package database is locked by another process; nothing was installed") {
		t.Fatalf("exit %d %s %+v", code, outcomes(rep), rep.Lines)
	}
	if m.pacQ("lp-other") != "" {
		t.Fatal("lp-other installed under the lock")
	}
	m.sh("rm /var/lib/pacman/db.lck")
	rep, _ = m.apply(decl(hello, other))
	expect(t, rep, shapes.Applied, "base.hello=unchanged base.other=applied")
	if m.pacQ("lp-other") != "lp-other 3.1-2" {
		t.Fatalf("lp-other: %q", m.pacQ("lp-other"))
	}

	// A package the repository lacks fails, in pacman's words.
	nowhere := `{"module":"base","id":"nowhere","type":"package","name":"lp-nowhere"}`
	rep, code = m.apply(decl(hello, other, nowhere))
	if code != 1 || rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[2].Detail, "target not found: lp-nowhere") {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}

	// A release published after the machine's last refresh (a pacman
	// repository holds one version of each package: the new one): the pin
	// of it has the sync database refreshed, once, and installs it.
	m.publishPacRepo(pacPkg{name: "lp-hello", version: "2.0-1", files: map[string]string{"usr/share/lp-hello/version": "2.0-1\n"}},
		lpOther, pacPkg{name: "pacman", version: "6.0.2-3"})
	// Published later than the machine's copy, as a release is (pacman
	// fetches a database only when it is newer, to the second).
	m.sh("touch -d @$(( $(date +%s) + 60 )) /srv/pacrepo/pacrepo.db")
	rep, code, log := m.applyLogged(decl(pinned("2.0-1"), other), "apply", "-v")
	expect(t, rep, shapes.Applied, "base.hello=applied base.other=unchanged base.nowhere=forgotten")
	if code != 0 || m.pacQ("lp-hello") != "lp-hello 2.0-1" || strings.Count(log, "package index refreshed") != 1 {
		t.Fatalf("a release published after the last refresh: exit %d %s %+v\n%s", code, m.pacQ("lp-hello"), rep.Lines, log)
	}
	rep, _, log = m.applyLogged(decl(pinned("2.0-1"), other), "apply", "-v")
	expect(t, rep, shapes.Unchanged, "base.hello=unchanged base.other=unchanged")
	if strings.Contains(log, "package index refreshed") {
		t.Fatalf("refreshed for packages installed as declared:\n%s", log)
	}

	// Undeclared: forgotten, never uninstalled.
	rep, code = m.apply(decl())
	if code != 0 || !strings.Contains(outcomes(rep), "base.hello=forgotten") || !strings.Contains(outcomes(rep), "base.other=forgotten") {
		t.Fatalf("exit %d %s %+v", code, outcomes(rep), rep.Lines)
	}
	for _, l := range rep.Lines {
		if l.Outcome != shapes.Forgotten {
			t.Fatalf("undeclared package line %s.%s %s: %s", l.Module, l.ID, l.Outcome, l.Detail)
		}
	}
	if m.pacQ("lp-hello") != "lp-hello 2.0-1" || m.pacQ("lp-other") != "lp-other 3.1-2" {
		t.Fatal("uninstalled")
	}
	// Nothing is left to forget.
	rep, _ = m.apply(decl())
	if len(rep.Lines) != 0 {
		t.Fatalf("%+v", rep.Lines)
	}
}

// An exact pin the repository cannot give must not install another
// version: apt is asked for name=version and installs nothing; pacman
// understands the same "name=version" target and refuses it ("target not
// found"), but the backend asks for the bare name and installs whatever the
// repository has, then fails the read-back with it installed.
func TestPacmanPinNotInRepository(t *testing.T) {
	t.Parallel()
	m := pacmanLab(t, lpPinned)
	m.sh("rm $(command -v dpkg-query)")
	rep, code := m.apply(decl(`{"module":"base","id":"pinned","type":"package","name":"lp-pinned","version":"2.0-1"}`))
	if code != 1 || rep.Outcome != shapes.Failed {
		t.Fatalf("exit %d %+v", code, rep.Lines)
	}
	t.Logf("pin 2.0-1, repository 1.0-1: %s", rep.Lines[0].Detail)
	if got := m.pacQ("lp-pinned"); got != "" {
		t.Fatalf("a declaration pinning lp-pinned 2.0-1 left %q installed, a version nobody declared", got)
	}
}

// The executor drives the package manager whose own database answers, the
// way the profile decides it (engine/pkg.go says so of detectPackages). On
// a pacman machine that also carries dpkg's tools (Arch ships dpkg as an
// ordinary package; its database there knows no dpkg), the profile says
// pacman, and the executor must install through pacman.
func TestPacmanDetectedByItsDatabase(t *testing.T) {
	t.Parallel()
	m := pacmanLab(t, lpHello)
	m.sh(": >/var/lib/dpkg/status") // dpkg-query stays; dpkg's database knows nothing
	if out := m.sh("dpkg-query -W dpkg 2>&1; echo rc=$?"); !strings.HasSuffix(out, "rc=1") {
		t.Fatalf("dpkg's database still answers: %s", out)
	}
	m.profile("").present(t, "package-manager", "pacman")

	rep, code := m.apply(decl(`{"module":"base","id":"hello","type":"package","name":"lp-hello"}`))
	if code != 0 || rep.Outcome != shapes.Applied || m.pacQ("lp-hello") != "lp-hello 1.0-1" {
		t.Fatalf("the profile says pacman, the executor did not install through it: exit %d %s %+v", code, outcomes(rep), rep.Lines)
	}
}
