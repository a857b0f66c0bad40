package machines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// How a release the tests build is broken.
const (
	brokenNot      = ""
	brokenExecutor = "executor"  // says its version, crashes at every start
	brokenAgent    = "agent"     // its agent passes its self-check, exits at every start
	brokenAgentAll = "agent-all" // its agent exits at once, self-check included
)

// hostDeb builds the host's .deb at version with build id build, as `make
// package` does (static binaries stamped with both, nfpm). A broken one
// installs and crash-loops, its executor (passing its read-back) or its
// agent (passing its self-check, or not even that).
func hostDeb(t *testing.T, dir, version, build string, broken string) string {
	t.Helper()
	return hostPackage(t, dir, version, build, broken, "deb")
}

// hostPackage is hostDeb for nfpm's packager (deb, apk, archlinux), with
// env added to nfpm's environment (APK_SIGN_KEY, for one).
func hostPackage(t *testing.T, dir, version, build, broken, packager string, env ...string) string {
	t.Helper()
	dist := filepath.Join(dir, version)
	// The carried bundle the package ships, its digest stamped in the
	// executor, as make package does.
	bundle, err := os.ReadFile("../../packaging/foundation.lock")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bundle)
	ld := "-s -w -X main.version=" + version + " -X main.build=" + build + " -X main.bundle=" + hex.EncodeToString(sum[:])
	b := exec.Command("go", "build", "-trimpath", "-ldflags", ld, "-o", filepath.Join(dist, "bin")+"/", "./cmd/mesh-executor", "./cmd/mesh-agent", "./cmd/mesh-launch", "./cmd/mesh-control")
	b.Dir, b.Env = "../..", append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", version, err, out)
	}
	// Completions and man pages, from the binaries as built (before a
	// broken one replaces its binary), as make package makes them.
	if out, err := exec.Command("sh", "../../packaging/gen-share.sh", filepath.Join(dist, "bin"), dist).CombinedOutput(); err != nil {
		t.Fatalf("gen-share %s: %v\n%s", version, err, out)
	}
	bin, script := "", ""
	switch broken {
	case brokenExecutor:
		bin, script = "mesh-executor", "#!/bin/sh\n[ \"$1\" = version ] && { echo "+version+"; exit 0; }\necho 'a broken release: it crashes at start' >&2\nexit 1\n"
	case brokenAgent:
		bin, script = "mesh-agent", "#!/bin/sh\n[ \"$1\" = --self-check ] && { echo '{\"confined\":true,\"version\":\""+version+"\"}'; exit 0; }\necho 'a broken release: its agent exits at start' >&2\nexit 1\n"
	case brokenAgentAll:
		bin, script = "mesh-agent", "#!/bin/sh\necho 'a broken release: its agent exits at once' >&2\nexit 1\n"
	}
	if bin != "" {
		if err := os.WriteFile(filepath.Join(dist, "bin", bin), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := exec.Command("go", "run", "github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2", "package", "-f", "packaging/nfpm.yaml", "-p", packager, "-t", dist+"/")
	n.Dir, n.Env = "../..", append(append(os.Environ(), "DIST="+dist, "BUNDLE=packaging/foundation.lock", "PKG_VERSION="+version, "PKG_ARCH=amd64"), env...)
	if out, err := n.CombinedOutput(); err != nil {
		t.Fatalf("nfpm %s: %v\n%s", version, err, out)
	}
	ext := map[string]string{"deb": "*.deb", "apk": "*.apk", "archlinux": "*.pkg.tar.zst"}[packager]
	pkgs, _ := filepath.Glob(filepath.Join(dist, ext))
	if len(pkgs) != 1 {
		t.Fatalf("nfpm made %v", pkgs)
	}
	return pkgs[0]
}

// hostReleases builds the three releases the lifecycle tests install:
// 0.9.1 and 0.9.2, and 0.9.3 which crash-loops; and mesh-control, the
// control side the first node raises.
func hostReleases(t *testing.T) (v1, v2, v3, ctlBin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the labs need root (make test runs as root)")
	}
	dir := t.TempDir()
	v1 = hostDeb(t, dir, "0.9.1", "b1", brokenNot)
	v2 = hostDeb(t, dir, "0.9.2", "b2", brokenNot)
	v3 = hostDeb(t, dir, "0.9.3", "b3", brokenExecutor)
	ctlBin = filepath.Join(dir, "mesh-control")
	b := exec.Command("go", "build", "-o", ctlBin, "./cmd/mesh-control")
	b.Dir, b.Env = "../..", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("build mesh-control: %v\n%s", err, out)
	}
	return v1, v2, v3, ctlBin
}

// Upgrading the host through a declaration, on a systemd lab with the real
// package manager, launcher and init: the first node of a mesh born on
// this machine (its control side runs here too) is declared a new version
// of the host; apt installs it; the running host checks the new binary
// runs and says that version, finishes, reports and exits 0; the launcher
// starts the new binary; the agent notices the new build and is restarted
// onto its own new binary; the node reports the version running. Then a
// release that installs, passes its read-back and crash-loops: the
// launcher rolls back once, through apt, to the known-good release, which
// reconciles and says why it does not install the declared version again.
//
// Then the agent's half: a release whose agent passes its self-check and
// exits at every start is installed and started; the agent's starts,
// counted by mesh-launch before each, trip the same rollback, and the node
// says so upward once its known-good agent links again. A release whose
// agent fails even its self-check is never committed to: the running
// host carries on, and says why.
func TestUpgradeThroughADeclaration(t *testing.T) {
	v1, v2, v3, ctlBin := hostReleases(t)
	dir := t.TempDir()
	v4 := hostDeb(t, dir, "0.9.4", "b4", brokenAgent)
	v5 := hostDeb(t, dir, "0.9.5", "b5", brokenAgentAll)

	m := &machine{Machine: lab.Boot(t, lab.Options{Init: lab.Systemd}), t: t}
	t.Cleanup(func() {
		if t.Failed() {
			out, errOut, _ := m.Run(context.Background(), "/bin/sh", "-c",
				"journalctl --no-pager -n 40 -u mesh-agent -u lab-control 2>&1; journalctl --no-pager -n 60 -u mesh-executor -o cat 2>&1; ps -ef --forest 2>&1 | tail -40; mesh-launch status --state /var/lib/mesh-host/executor 2>&1")
			t.Logf("the lab says:\n%s%s", out, errOut)
		}
	})
	m.serveRepo(v1, v2, v3, v4, v5)
	m.sh("apt-get install -y -qq nox-mesh-host=0.9.1-1 >/dev/null 2>&1 || apt-get install -y nox-mesh-host=0.9.1-1")
	for _, u := range []string{"mesh-executor", "mesh-agent"} {
		untilTrue(t, 20*time.Second, u+" active", func() bool { return m.sh("systemctl is-active "+u+" || true") == "active" })
	}

	// The mesh born on this machine: its control side, then the token,
	// then enrolment — the ordinary path, on node one.
	if err := m.CopyIn(ctlBin, "/usr/local/bin/mesh-control"); err != nil {
		t.Fatal(err)
	}
	const ctl = "--dir /root/ctl"
	m.sh("mesh-control init " + ctl + " >/dev/null")
	m.sh("systemd-run --unit lab-control /usr/local/bin/mesh-control serve " + ctl)
	untilTrue(t, 20*time.Second, "the control side serves", func() bool {
		return m.sh("mesh-control nodes "+ctl+" >/dev/null 2>&1 && echo ok || true") == "ok"
	})
	token := m.sh("mesh-control token issue --new --name a " + ctl + " 2>/dev/null")
	if err := m.WriteFile("/root/token", []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := m.sh("mesh-executor enrol --token-file /root/token --wait 60s 2>&1 || true"); !strings.Contains(out, "enrolled as node a") {
		t.Fatalf("enrol: %s", out)
	}
	node := func() (executor, agent string) {
		var ns []struct {
			ExecutorVersion string `json:"executor_version"`
			Heartbeat       *struct {
				AgentVersion string `json:"agent_version"`
			}
		}
		json.Unmarshal([]byte(m.sh("mesh-control nodes --json "+ctl+" 2>/dev/null || true")), &ns)
		if len(ns) != 1 || ns[0].Heartbeat == nil {
			return "", ""
		}
		return ns[0].ExecutorVersion, ns[0].Heartbeat.AgentVersion
	}
	untilTrue(t, 60*time.Second, "node a heard from, running 0.9.1", func() bool { e, a := node(); return e == "0.9.1" && a == "0.9.1" })
	launcherPID := m.sh("systemctl show -p MainPID --value mesh-executor")

	// The upgrade: one declaration.
	m.WriteFile("/root/up.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.2-1"}]}`), 0o600)
	m.sh("mesh-control declare a /root/up.json " + ctl)
	untilTrue(t, 90*time.Second, "the node reports 0.9.2 running, executor and agent", func() bool { e, a := node(); return e == "0.9.2" && a == "0.9.2" })
	rep := m.sh("mesh-control reports a --last 5 " + ctl)
	if !strings.Contains(rep, "0.9.1-1 → 0.9.2-1") || !strings.Contains(rep, "restarts onto it") {
		t.Fatalf("the upgrade's report:\n%s", rep)
	}
	if got := m.sh("dpkg-query -W -f='${Version}' nox-mesh-host"); got != "0.9.2-1" {
		t.Fatalf("dpkg says %s", got)
	}
	// The host stopped by finishing: the launcher (the init's process) is
	// the same one, it was never asked to restart anything.
	if now := m.sh("systemctl show -p MainPID --value mesh-executor"); now != launcherPID {
		t.Fatalf("the init restarted the executor's unit (launcher %s, then %s)", launcherPID, now)
	}
	// Known good once both halves ran: the executor reconciled, and the
	// agent stayed up (serve.DefaultAgentProofAfter).
	untilTrue(t, 90*time.Second, "0.9.2 is known-good", func() bool {
		return m.sh("/var/lib/mesh-host/executor/known-good/mesh-executor version 2>/dev/null || true") == "0.9.2"
	})

	// A release that installs and crash-loops: rolled back once.
	m.WriteFile("/root/broken.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.3-1"}]}`), 0o600)
	m.sh("mesh-control declare a /root/broken.json " + ctl)
	untilTrue(t, 60*time.Second, "apt installed the broken release", func() bool {
		return m.sh("dpkg-query -W -f='${Version}' nox-mesh-host") == "0.9.3-1"
	})
	// Rolled back through the package manager: dpkg says 0.9.2-1 again.
	untilTrue(t, 180*time.Second, "rolled back to the known-good 0.9.2 through apt, and running", func() bool {
		return m.sh("dpkg-query -W -f='${db:Status-Status} ${Version}' nox-mesh-host") == "installed 0.9.2-1" &&
			m.sh("journalctl --no-pager -u mesh-executor -o cat | grep -c 'crash-looped at start and the launcher rolled it back' || true") != "0"
	})
	if got := m.sh("/usr/bin/mesh-executor version"); got != "0.9.2" {
		t.Fatalf("after the rollback /usr/bin/mesh-executor says %s", got)
	}
	untilTrue(t, 60*time.Second, "the known-good host running again", func() bool { e, _ := node(); return e == "0.9.2" })
	logs := m.sh("journalctl --no-pager -u mesh-executor -o cat")
	for _, want := range []string{"a broken release: it crashes at start", "reinstalled the known-good release through the package manager",
		"nox-mesh-host 0.9.3-1 crash-looped at start and the launcher rolled it back (", "without a reconcile running to its end: reinstalling the known-good copy); it is not installed again"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the executor's journal does not say %q", want)
		}
	}
	if !strings.Contains(m.sh("mesh-launch status --state /var/lib/mesh-host/executor 2>&1 || true"), "halted: no") {
		t.Fatal("the launcher halted after one rollback that worked")
	}

	// A release whose agent exits at every start (its self-check passes):
	// the executor half upgrades and reconciles, but the release is not
	// known good until its agent stays up; the agent's starts trip the
	// rollback, through apt, back to 0.9.2, both halves.
	rolledBack := func() (from, why string) {
		var ns []struct {
			RolledBackFrom string `json:"rolled_back_from"`
			RollbackReason string `json:"rollback_reason"`
		}
		json.Unmarshal([]byte(m.sh("mesh-control nodes --json "+ctl+" 2>/dev/null || true")), &ns)
		if len(ns) != 1 {
			return "", ""
		}
		return ns[0].RolledBackFrom, ns[0].RollbackReason
	}
	m.WriteFile("/root/agent-broken.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.4-1"}]}`), 0o600)
	m.sh("mesh-control declare a /root/agent-broken.json " + ctl)
	untilTrue(t, 60*time.Second, "apt installed the release whose agent crash-loops", func() bool {
		return m.sh("dpkg-query -W -f='${Version}' nox-mesh-host") == "0.9.4-1"
	})
	untilTrue(t, 180*time.Second, "rolled back to 0.9.2 through apt for the agent's crash loop, and said so upward", func() bool {
		from, why := rolledBack()
		return m.sh("dpkg-query -W -f='${db:Status-Status} ${Version}' nox-mesh-host") == "installed 0.9.2-1" &&
			from == "0.9.4-1" && strings.Contains(why, "the agent crash-loops")
	})
	if got := m.sh("/var/lib/mesh-host/executor/known-good/mesh-agent --version"); !strings.Contains(got, "0.9.2") {
		t.Errorf("the known-good agent is %q: the release whose agent crash-looped became known good", got)
	}
	untilTrue(t, 60*time.Second, "node a runs 0.9.2 again, both halves", func() bool { e, a := node(); return e == "0.9.2" && a == "0.9.2" })
	agentLog := m.sh("journalctl --no-pager -u mesh-agent -o cat")
	for _, want := range []string{"a broken release: its agent exits at start", "mesh-launch agent-start: rolling back"} {
		if !strings.Contains(agentLog, want) {
			t.Errorf("the agent's journal does not say %q", want)
		}
	}
	if rep := m.sh("mesh-control reports a --last 3 " + ctl); !strings.Contains(rep, "0.9.4-1 crash-looped at start and the launcher rolled it back (the agent started") {
		t.Errorf("the report on the declared 0.9.4-1 does not say why it is not installed:\n%s", rep)
	}

	// A release whose agent does not even pass its self-check: never
	// committed to; 0.9.2 carries on, executor and agent, and says why.
	m.WriteFile("/root/agent-dead.json", []byte(`{"version":1,"resources":[{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"0.9.5-1"}]}`), 0o600)
	m.sh("mesh-control declare a /root/agent-dead.json " + ctl)
	untilTrue(t, 60*time.Second, "the upgrade to 0.9.5 fails on its agent's self-check", func() bool {
		return strings.Contains(m.sh("mesh-control reports a --last 1 "+ctl), "the installed agent does not pass its self-check")
	})
	time.Sleep(5 * time.Second) // the heartbeat after the verdict
	if e, a := node(); e != "0.9.2" || a != "0.9.2" {
		t.Errorf("after a release whose agent fails its self-check, the node runs executor %s and agent %s; the running host carries on", e, a)
	}
}
