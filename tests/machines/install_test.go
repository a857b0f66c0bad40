package machines

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// Installing the host (init/ and packaging/): `make package` builds
// the packages once, then each init boots a lab of its own, two at a time:
//
//   - systemd: the .deb installed with dpkg -i, as an operator would; the
//     package creates mesh-agent and the state directories, enables and
//     starts both units; `systemd-analyze security` scores both;
//   - OpenRC, runit, s6: the static binaries and that init's files from
//     init/ copied in by hand (the tarball's way); the launcher makes the
//     agent's user and state directory on its first start.
//
// Each asserts the same facts with the init's own tools and the kernel's
// view (/proc): the launcher runs the executor, the socket directory is
// root:mesh-agent 0750 with the socket in it, the agent runs as mesh-agent
// on every thread with no capability in any set and no_new_privs, says it
// is hosted and idle, `mesh-executor status` says hosted, and the init
// starts both again when they exit.
func TestInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("installing in a lab needs root (make test runs as root)")
	}
	dist := t.TempDir()
	start := time.Now()
	build := exec.Command("make", "--no-print-directory", "package", "DIST="+dist) // run by make test too, where make says the directories it enters
	build.Dir = "../.."
	var stderr strings.Builder
	build.Stderr = &stderr
	out, err := build.Output()
	if err != nil {
		t.Fatalf("make package: %v\n%s%s", err, out, stderr.String())
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "*.deb"))
	var made []string
	for _, glob := range []string{"*.deb", "*.apk", "*.pkg.tar.zst", "*-linux-amd64.tar.gz", "*-linux-arm64.tar.gz", "*-android-arm64.tar.gz"} {
		m, _ := filepath.Glob(filepath.Join(dist, glob))
		if len(m) != 1 {
			t.Fatalf("make package made %d files %s in %s, want 1", len(m), glob, dist)
		}
		made = append(made, m[0])
	}
	// Quietly: the paths of what it made, and nothing else.
	if want := strings.Join(append(made, filepath.Join(dist, "SHA256SUMS")), "\n") + "\n"; string(out) != want {
		t.Errorf("make package said\n%s\nwant the paths of what it made alone:\n%s", out, want)
	}
	t.Logf("make package: %v", time.Since(start).Round(time.Millisecond))
	// The cross-compiled binaries are what they say: AArch64, static
	// (linux) or needing Android's loader alone (android), no libc.
	for _, c := range []struct{ dir, interp string }{{"linux-arm64", ""}, {"android-arm64", "/system/bin/linker64"}} {
		for _, b := range []string{"mesh-executor", "mesh-agent", "mesh-launch"} {
			checkELF(t, filepath.Join(dist, c.dir, b), c.interp)
		}
	}

	t.Run("DebOnSystemd", func(t *testing.T) { t.Parallel(); installDeb(t, debs[0]) })
	tarballs, _ := filepath.Glob(filepath.Join(dist, "*-linux-amd64.tar.gz"))
	t.Run("TarballOnSystemd", func(t *testing.T) { t.Parallel(); installTarball(t, tarballs[0]) })
	for _, in := range []lab.Init{lab.OpenRC, lab.Runit, lab.S6} {
		t.Run("ByHandOn"+string(in), func(t *testing.T) { t.Parallel(); installByHand(t, in, filepath.Join(dist, "bin")) })
	}
}

// byInit is what differs between the inits: where the agent's output
// goes, and how to find the two supervised processes.
type byInit struct {
	agentLog    string // a command printing the agent's output
	diagnose    string // a command printing what the init says of both
	launcherPID func(m *machine) string
	agentPID    func(m *machine) string
}

func pgrep(name string) func(m *machine) string {
	return func(m *machine) string { return m.sh("pgrep -x " + name + " || true") }
}

// launcherPID is the executor's launcher: mesh-launch, but not the short
// `mesh-launch agent-start` that counts the agent's start before it execs
// the agent (the inits but systemd start the agent through it).
func launcherPID(m *machine) string {
	return m.sh("pgrep -f '^/usr/bin/mesh-launch --state' || true")
}

func mainPID(unit string) func(m *machine) string {
	return func(m *machine) string {
		if p := m.sh("systemctl show -p MainPID --value " + unit); p != "0" {
			return p
		}
		return ""
	}
}

var inits = map[lab.Init]byInit{
	lab.Systemd: {"journalctl -u mesh-agent --no-pager -o cat",
		"systemctl status --no-pager mesh-executor mesh-agent; journalctl --no-pager -n 60 -u mesh-executor -u mesh-agent", mainPID("mesh-executor.service"), mainPID("mesh-agent.service")},
	lab.OpenRC: {"cat /var/log/mesh-agent.log",
		"rc-status; tail -n 30 /var/log/mesh-executor.log /var/log/mesh-agent.log", launcherPID, pgrep("mesh-agent")},
	lab.Runit: {"cat /var/log/mesh-agent/current",
		"sv status /etc/service/*; tail -n 30 /var/log/mesh-executor/current /var/log/mesh-agent/current", launcherPID, pgrep("mesh-agent")},
	lab.S6: {"cat /var/log/mesh-agent/current",
		"s6-svstat /etc/s6/scan/mesh-executor /etc/s6/scan/mesh-agent; tail -n 30 /var/log/mesh-executor/current /var/log/mesh-agent/current", launcherPID, pgrep("mesh-agent")},
}

func installDeb(t *testing.T, deb string) {
	start := time.Now()
	m := &machine{Machine: lab.Boot(t, lab.Options{Init: lab.Systemd}), t: t}
	if err := m.CopyIn(deb, "/root/nox-mesh-host.deb"); err != nil {
		t.Fatal(err)
	}
	if m.sh("id -u mesh-agent 2>/dev/null || echo none") != "none" {
		t.Fatal("the lab has a mesh-agent user before the install")
	}
	// The seeds' two lines: install, then enable and start (which the
	// .deb did already, Debian's way; the second line is then a no-op).
	t.Logf("dpkg -i:\n%s", m.sh("dpkg -i /root/nox-mesh-host.deb 2>&1"))
	m.sh("systemctl enable --now mesh-executor.service mesh-agent.service 2>&1")

	for _, u := range []string{"mesh-executor.service", "mesh-agent.service"} {
		if got := m.sh("systemctl is-enabled " + u + " || true"); got != "enabled" {
			t.Errorf("%s is %s, want enabled", u, got)
		}
		untilTrue(t, 15*time.Second, u+" active", func() bool { return m.sh("systemctl is-active "+u+" || true") == "active" })
	}
	if got := strings.Fields(m.sh("systemctl show -p Restart --value mesh-executor.service mesh-agent.service")); strings.Join(got, " ") != "always always" {
		t.Errorf("Restart= %q, want always for both", got)
	}
	running(t, m, lab.Systemd)

	// Completions and man pages, from each binary's own definitions.
	for _, f := range []string{"/usr/share/bash-completion/completions/mesh-control", "/usr/share/zsh/vendor-completions/_mesh-executor",
		"/usr/share/fish/vendor_completions.d/mesh-launch.fish", "/usr/share/man/man1/mesh-control.1", "/usr/share/man/man8/mesh-executor.8"} {
		if m.sh("test -s "+f+" && echo yes || true") != "yes" {
			t.Errorf("the package does not install %s", f)
		}
	}
	if got := m.sh(`bash -c '. /usr/share/bash-completion/completions/mesh-control && COMP_WORDS=(mesh-control node a) COMP_CWORD=2 && _mesh_control && echo "${COMPREPLY[*]}"'`); got != "add" {
		t.Errorf("bash completes mesh-control node a<TAB> to %q", got)
	}
	for _, b := range []string{"mesh-control", "mesh-launch", "mesh-agent"} {
		if got := m.sh(b + " --version"); !strings.Contains(got, b+" ") {
			t.Errorf("%s --version says %q", b, got)
		}
	}

	// The carried bundle is the one the package was built with: a copy
	// changed on the machine is refused, saying both digests, and nothing
	// changes; the one shipped raises the control side as a service.
	if got := m.sh("systemctl is-enabled mesh-control.service || true"); got != "disabled" {
		t.Errorf("the package enables the control side itself (%s); the bundle does", got)
	}
	m.sh("cp /usr/lib/nox-mesh-host/foundation.lock /root/foundation.lock; sed -i 's/0700/0750/' /usr/lib/nox-mesh-host/foundation.lock")
	out := m.sh("mesh-executor reconcile 2>&1; echo exit $?")
	want := m.sh("sha256sum < /root/foundation.lock | cut -d' ' -f1")
	if !strings.HasSuffix(out, "exit 2") || !strings.Contains(out, "has sha256 "+m.sh("sha256sum < /usr/lib/nox-mesh-host/foundation.lock | cut -d' ' -f1")) ||
		!strings.Contains(out, "carries the bundle with sha256 "+want) {
		t.Errorf("a changed bundle, reconciled:\n%s", out)
	}
	if m.sh("test -e /var/lib/mesh-control && echo yes || echo no") != "no" {
		t.Error("a refused bundle changed the machine")
	}
	m.sh("cp /root/foundation.lock /usr/lib/nox-mesh-host/foundation.lock")
	if out := m.sh("mesh-executor reconcile 2>&1; echo exit $?"); !strings.HasSuffix(out, "exit 0") {
		t.Errorf("the shipped bundle, reconciled:\n%s", out)
	}
	untilTrue(t, 30*time.Second, "the control side the bundle raised serves", func() bool {
		return m.sh("systemctl is-active mesh-control.service || true") == "active" &&
			m.sh("mesh-control nodes --dir /var/lib/mesh-control >/dev/null 2>&1 && echo ok || true") == "ok"
	})
	if out := m.sh("mesh-executor reconcile 2>&1; echo exit $?"); !strings.HasSuffix(out, "exit 0") || !strings.Contains(out, "unchanged") {
		t.Errorf("the bundle again:\n%s", out)
	}

	// systemd's own view of what confines each unit.
	for _, u := range []string{"mesh-executor.service", "mesh-agent.service", "mesh-control.service"} {
		out, _, _ := m.Run(context.Background(), "systemd-analyze", "security", "--no-pager", u)
		score := regexp.MustCompile(`Overall exposure level for ` + regexp.QuoteMeta(u) + `: ([0-9.]+) (\S+)`).FindStringSubmatch(out)
		if score == nil {
			t.Fatalf("systemd-analyze security %s:\n%s", u, out)
		}
		t.Logf("systemd-analyze security %s: %s %s", u, score[1], score[2])
		if u == "mesh-agent.service" {
			if score[2] != "OK" && score[2] != "SAFE" {
				t.Errorf("the agent's exposure is %s %s, want OK or better:\n%s", score[1], score[2], out)
			}
			if testing.Verbose() {
				t.Logf("%s", out)
			}
		}
	}
	t.Logf("the .deb on systemd: %v", time.Since(start).Round(time.Millisecond))
}

// installTarball installs from the tarball alone — no package manager, no
// postinstall — as docs/operations.md says: unpacked at /, the agent's user
// and the state directories made by systemd from the files it carries, the
// two units enabled; then the carried bundle raises the control side,
// which the tarball carries with its unit.
func installTarball(t *testing.T, tarball string) {
	start := time.Now()
	m := &machine{Machine: lab.Boot(t, lab.Options{Init: lab.Systemd}), t: t}
	if err := m.CopyIn(tarball, "/root/nox-mesh-host.tar.gz"); err != nil {
		t.Fatal(err)
	}
	if m.sh("id -u mesh-agent 2>/dev/null || echo none") != "none" {
		t.Fatal("the lab has a mesh-agent user before the install")
	}
	t.Logf("tar:\n%s", m.sh("tar -xzvf /root/nox-mesh-host.tar.gz -C / 2>&1 | tail -n 40"))
	m.sh("systemd-sysusers && systemd-tmpfiles --create && systemctl daemon-reload && systemctl enable --now mesh-executor.service mesh-agent.service 2>&1")
	for _, u := range []string{"mesh-executor.service", "mesh-agent.service"} {
		untilTrue(t, 60*time.Second, u+" active", func() bool { return m.sh("systemctl is-active "+u+" || true") == "active" })
	}
	running(t, m, lab.Systemd)
	if out := m.sh("mesh-executor reconcile 2>&1; echo exit $?"); !strings.HasSuffix(out, "exit 0") {
		t.Fatalf("the carried bundle, reconciled from the tarball's files:\n%s", out)
	}
	untilTrue(t, 30*time.Second, "the control side the bundle raised serves", func() bool {
		return m.sh("systemctl is-active mesh-control.service || true") == "active" &&
			m.sh("mesh-control nodes --dir /var/lib/mesh-control >/dev/null 2>&1 && echo ok || true") == "ok"
	})
	t.Logf("the tarball on systemd: %v", time.Since(start).Round(time.Millisecond))
}

func installByHand(t *testing.T, in lab.Init, bin string) {
	start := time.Now()
	m := &machine{Machine: lab.Boot(t, lab.Options{Init: in}), t: t}
	for _, b := range []string{"mesh-executor", "mesh-agent", "mesh-launch"} {
		if err := m.CopyIn(filepath.Join(bin, b), "/usr/bin/"+b); err != nil {
			t.Fatal(err)
		}
	}
	// No user is made here: on a tarball install the launcher makes the
	// agent's user and state directory before its first start.
	if m.sh("id -u mesh-agent 2>/dev/null || echo none") != "none" {
		t.Fatal("the lab has a mesh-agent user before the install")
	}

	files := map[string]string{} // lab path -> file in init/
	switch in {
	case lab.OpenRC:
		for _, n := range []string{"mesh-executor", "mesh-agent"} {
			files["/etc/init.d/"+n] = "openrc/" + n
		}
	case lab.Runit, lab.S6:
		dir := map[lab.Init]string{lab.Runit: "/etc/sv/", lab.S6: "/etc/s6/sv/"}[in]
		for _, n := range []string{"mesh-executor", "mesh-agent"} {
			files[dir+n+"/run"] = string(in) + "/" + n + "/run"
			files[dir+n+"/log/run"] = string(in) + "/" + n + "/log/run"
		}
	}
	for dst, src := range files {
		data, err := os.ReadFile(filepath.Join("../../init", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	switch in {
	case lab.OpenRC:
		m.sh("rc-update add mesh-executor default && rc-update add mesh-agent default")
		m.sh("rc-service mesh-executor start 2>&1 && rc-service mesh-agent start 2>&1")
	case lab.Runit:
		m.sh("ln -s /etc/sv/mesh-executor /etc/runit/runsvdir/default/ && ln -s /etc/sv/mesh-agent /etc/runit/runsvdir/default/")
	case lab.S6:
		m.sh("ln -s /etc/s6/sv/mesh-executor /etc/s6/scan/ && ln -s /etc/s6/sv/mesh-agent /etc/s6/scan/ && s6-svscanctl -a /etc/s6/scan")
	}
	running(t, m, in)
	if got := m.sh("stat -c '%U %a' /var/lib/mesh-host/agent"); got != "mesh-agent 700" {
		t.Errorf("the agent's state directory is %q, want the launcher to have made it mesh-agent 700", got)
	}
	// The init's own word that both are up.
	switch in {
	case lab.OpenRC:
		t.Logf("rc-status: %s", m.sh("rc-service mesh-executor status 2>&1; rc-service mesh-agent status 2>&1"))
	case lab.Runit:
		t.Logf("sv status: %s", m.sh("sv status /etc/service/mesh-executor /etc/service/mesh-agent"))
	case lab.S6:
		t.Logf("s6-svstat: %s", m.sh("s6-svstat /etc/s6/scan/mesh-executor; s6-svstat /etc/s6/scan/mesh-agent"))
	}
	t.Logf("by hand on %s: %v", in, time.Since(start).Round(time.Millisecond))
}

// running asserts, with the kernel's view, that the host is up as the init
// files say, and that the init starts both processes again when they exit.
func running(t *testing.T, m *machine, in lab.Init) {
	t.Helper()
	v := inits[in]
	t.Cleanup(func() {
		if t.Failed() {
			out, errOut, _ := m.Run(context.Background(), "/bin/sh", "-c", v.diagnose+" 2>&1")
			t.Logf("what %s says:\n%s%s", in, out, errOut)
		}
	})
	sock := "/run/mesh-host/executor.sock"
	untilTrue(t, 20*time.Second, "the executor's socket "+sock, func() bool { return m.sh("test -S "+sock+" && echo yes || true") == "yes" })
	if got := m.sh("stat -c '%U:%G %a' /run/mesh-host"); got != "root:mesh-agent 750" {
		t.Errorf("/run/mesh-host is %s, want root:mesh-agent 750", got)
	}
	if got := m.sh("stat -c '%U:%G %a' " + sock); got != "root:mesh-agent 660" {
		t.Errorf("%s is %s, want root:mesh-agent 660", sock, got)
	}
	for dir, want := range map[string]string{
		"/var/lib/mesh-host/executor": "root:root 700",
		"/var/lib/mesh-host/agent":    "mesh-agent:mesh-agent 700",
	} {
		if got := m.sh("stat -c '%U:%G %a' " + dir); got != want {
			t.Errorf("%s is %s, want %s", dir, got, want)
		}
	}

	// The init runs the launcher, and the launcher the executor.
	launcher := v.launcherPID(m)
	if launcher == "" || m.sh("cat /proc/"+launcher+"/comm") != "mesh-launch" {
		t.Fatalf("the init's executor process is %q (%s), want mesh-launch", launcher, m.sh("cat /proc/"+launcher+"/comm 2>&1 || true"))
	}
	exe := m.sh("pgrep -x -P " + launcher + " mesh-executor || true")
	if exe == "" || !strings.HasPrefix(m.sh("tr '\\0' ' ' </proc/"+exe+"/cmdline"), "/usr/bin/mesh-executor serve --state /var/lib/mesh-host/executor") {
		t.Fatalf("no mesh-executor serve under the launcher (pid %s): %s", launcher, m.sh("ps -ef"))
	}

	// The agent: its user's ids on every thread, no capability in any set
	// (the bounding set included), no_new_privs.
	// The agent starts as root and drops in its first milliseconds; on a
	// tarball install its first starts may also fail until the launcher has
	// made its user, and the init starts it again. So the one looked at is
	// the one whose main thread is past the drop (its real uid the agent's
	// user); every thread of it is then held to the whole rule below. An
	// agent that never drops never gets here, and the test fails.
	var agent string
	uid, gid := "", ""
	untilTrue(t, 15*time.Second, "the agent running past its privilege drop", func() bool {
		if uid == "" {
			uid, gid = m.sh("id -u mesh-agent 2>/dev/null || true"), m.sh("id -g mesh-agent 2>/dev/null || true")
			if uid == "" {
				return false
			}
		}
		agent = v.agentPID(m)
		return agent != "" && m.sh("grep '^Uid:' /proc/"+agent+"/status 2>/dev/null | cut -f2 || true") == uid
	})
	threads := m.sh("for s in /proc/" + agent + "/task/*/status; do grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' $s; echo; done")
	n := 0
	for _, th := range strings.Split(threads, "\n\n") {
		n++
		f := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(th), "\n") {
			k, val, _ := strings.Cut(l, ":")
			f[k] = strings.Join(strings.Fields(val), " ")
		}
		want := map[string]string{
			"Uid": strings.Repeat(uid+" ", 3) + uid, "Gid": strings.Repeat(gid+" ", 3) + gid, "Groups": "",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
		}
		// systemd's User= leaves the primary group as the one
		// supplementary group; nothing else is allowed.
		if f["Groups"] == gid {
			f["Groups"] = ""
		}
		for k, w := range want {
			if f[k] != w {
				t.Errorf("agent (pid %s) thread %d: %s %q, want %q", agent, n, k, f[k], w)
			}
		}
	}
	t.Logf("%s: the agent (pid %s) runs as mesh-agent (%s:%s) on all %d threads, no capabilities, no_new_privs", in, agent, uid, gid, n)
	untilTrue(t, 10*time.Second, "the agent saying it is hosted", func() bool {
		return strings.Contains(m.sh(v.agentLog+" 2>/dev/null || true"), "hosted: no identity")
	})
	if got := m.sh("mesh-executor status"); !strings.Contains(got, "state: hosted") {
		t.Errorf("mesh-executor status:\n%s", got)
	}

	// Always restarted: the agent's clean exit (SIGTERM: what an upgrade
	// looks like to the init) and the launcher killed outright.
	m.sh("kill -TERM " + agent)
	untilTrue(t, 15*time.Second, "the agent started again after a clean exit", func() bool {
		p := v.agentPID(m)
		return p != "" && p != agent
	})
	m.sh("kill -KILL " + launcher)
	untilTrue(t, 20*time.Second, "the launcher started again after SIGKILL", func() bool {
		p := v.launcherPID(m)
		return p != "" && p != launcher && m.sh("test -S "+sock+" && echo yes || true") == "yes"
	})
	t.Logf("%s: agent %s and launcher %s exited; %s started them again (%s, %s)", in, agent, launcher, in,
		v.agentPID(m), v.launcherPID(m))
}

// checkELF asserts p is an AArch64 executable whose only interpreter is
// interp ("" for a static binary) and which needs no shared library.
func checkELF(t *testing.T, p, interp string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 {
		t.Errorf("%s is for %v, not AArch64", p, f.Machine)
	}
	got := ""
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			prog.ReadAt(b, 0)
			got = strings.TrimRight(string(b), "\x00")
		}
	}
	if got != interp {
		t.Errorf("%s: interpreter %q, want %q", p, got, interp)
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("%s needs shared libraries %v", p, libs)
	}
}
