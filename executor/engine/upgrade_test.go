package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// hostPackages is a package manager whose nox-mesh-host package installs an
// executor that says a version: binaries[version] is the script a version
// installs (what a broken release would put there).
type hostPackages struct {
	fakePackages
	bin      string
	binaries map[string]string
}

func (h *hostPackages) install(ctx context.Context, p, v string) error {
	if err := h.fakePackages.install(ctx, p, v); err != nil {
		return err
	}
	if p == HostPackage {
		return os.WriteFile(h.bin, []byte(h.binaries[v]), 0o755)
	}
	return nil
}

// applyHost applies, as a rescue file, the host's package at version.
func applyHost(t *testing.T, h *harness, version string, opt Options) *shapes.Report {
	t.Helper()
	doc := h.doc(`{"module":"host","id":"pkg","type":"package","name":"nox-mesh-host","version":"` + version + `"}`)
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	opt.Source = store.Local
	return Apply(context.Background(), st, d, []byte(doc), opt)
}

func says(version string) string {
	return "#!/bin/sh\n[ \"$1\" = version ] && { echo " + version + "; exit 0; }\nexit 1\n"
}

func TestHostUpgrade(t *testing.T) {
	h := newHarness(t)
	bin := filepath.Join(t.TempDir(), "mesh-executor")
	pm := &hostPackages{fakePackages: fakePackages{have: map[string]string{HostPackage: "0.1.0-1"}}, bin: bin, binaries: map[string]string{
		"0.2.0-1": says("0.2.0"),
		"0.3.0-1": says("0.2.9"),                                 // a package that installs the wrong binary
		"0.4.0-1": "\x7fELF\x02\x01\x01garbage for another arch", // does not run here
	}}
	os.WriteFile(bin, []byte(says("0.1.0")), 0o755)
	failed := ""
	apply := func(version, running string) *shapes.Report {
		t.Helper()
		return applyHost(t, h, version, Options{packages: pm, HostBinary: bin, HostVersion: running, FailedHostRelease: failed})
	}

	// Installed, run once, says the declared version: the apply finishes
	// and says the host restarts onto it.
	rep := apply("0.2.0-1", "0.1.0")
	if rep.Outcome != shapes.Applied || rep.Upgraded != "0.2.0" || !strings.Contains(rep.Lines[0].Detail, "restarts onto it") {
		t.Fatalf("upgrade: %+v", rep)
	}
	// The new host, started: nothing to do, nothing to restart onto.
	if rep := apply("0.2.0-1", "0.2.0"); rep.Outcome != shapes.Unchanged || rep.Upgraded != "" {
		t.Fatalf("after the restart: %+v", rep)
	}
	// Installed earlier by an apply cut off before its restart: the
	// running host is still the old one, and restarts now.
	if rep := apply("0.2.0-1", "0.1.0"); rep.Outcome != shapes.Unchanged || rep.Upgraded != "0.2.0" {
		t.Fatalf("installed, not yet running: %+v", rep)
	}
	// A package whose binary says another version, or does not run here:
	// the apply fails saying why, and no restart.
	for v, want := range map[string]string{
		"0.3.0-1": `the installed host says version "0.2.9", not the declared 0.3.0-1`,
		"0.4.0-1": "the installed host does not run here",
	} {
		rep := apply(v, "0.2.0")
		if rep.Outcome != shapes.Failed || rep.Upgraded != "" || !strings.Contains(rep.Lines[0].Detail, want) || !strings.Contains(rep.Lines[0].Detail, "the running host (0.2.0) carries on") {
			t.Fatalf("%s: %+v", v, rep)
		}
	}
	// A release the launcher rolled back from is not installed again.
	failed = "0.5.0-1"
	pm.log = nil
	if rep := apply("0.5.0-1", "0.2.0"); rep.Outcome != shapes.Failed || len(pm.log) != 0 || !strings.Contains(rep.Lines[0].Detail, "crash-looped at start and the launcher rolled it back") {
		t.Fatalf("a failed release: %+v %v", rep, pm.log)
	}
}

func TestSameRelease(t *testing.T) {
	for _, c := range []struct {
		declared, installed, bin string
		want                     bool
	}{
		{"0.2.0-1", "", "0.2.0", true},
		{"1:0.2.0-1", "", "0.2.0", true},
		{"0.2.0-r1", "", "0.2.0", true},
		{"0.2.0", "", "v0.2.0", true},
		{"", "0.2.0-1", "0.2.0", true},
		{"0.2.0-1", "", "0.2.1", false},
		{"0.2.0-rc1", "", "0.2.0", false}, // a pre-release is not a revision
		{"0.2.0-rc1", "", "0.2.0-rc1", true},
		{"0.2.0-1", "", "", false},
		{"", "", "0.2.0", false},
	} {
		if got := SameRelease(c.declared, c.installed, c.bin); got != c.want {
			t.Errorf("SameRelease(%q, %q, %q) = %v", c.declared, c.installed, c.bin, got)
		}
	}
}

// agentSays is an agent whose self-check reports confined and version.
func agentSays(version string, confined bool, code int) string {
	return "#!/bin/sh\n[ \"$1\" = --self-check ] && [ \"$2\" = --user ] && [ \"$3\" = mesh-agent ] || { echo 'a bad command line' >&2; exit 9; }\n" +
		"echo '{\"confined\":" + map[bool]string{true: "true", false: "false, \"error\":\"setgroups: operation not permitted\""}[confined] + ",\"version\":\"" + version + "\"}'\nexit " + string(rune('0'+code)) + "\n"
}

// Before the host commits to a release it runs the new agent too: its
// self-check, as root, must end confined and say the declared version. An
// agent that exits at start, does not drop, or is another version fails
// the step, and the running host carries on (no restart).
func TestHostUpgradeTriesTheAgent(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	bin, agent := filepath.Join(dir, "mesh-executor"), filepath.Join(dir, "mesh-agent")
	agents := map[string]string{
		"0.2.0-1": agentSays("0.2.0", true, 0),
		"0.3.0-1": "#!/bin/sh\necho 'panic: a release whose agent exits at start' >&2\nexit 2\n",
		"0.4.0-1": agentSays("0.4.0", false, 1),
		"0.5.0-1": agentSays("0.4.9", true, 0),
	}
	pm := &hostPackages{fakePackages: fakePackages{have: map[string]string{HostPackage: "0.1.0-1"}}, bin: bin, binaries: map[string]string{
		"0.2.0-1": says("0.2.0"), "0.3.0-1": says("0.3.0"), "0.4.0-1": says("0.4.0"), "0.5.0-1": says("0.5.0"),
	}}
	os.WriteFile(bin, []byte(says("0.1.0")), 0o755)
	apply := func(version string) *shapes.Report {
		t.Helper()
		os.WriteFile(agent, []byte(agents[version]), 0o755) // the package's agent, beside its executor
		return applyHost(t, h, version, Options{packages: pm, HostBinary: bin, HostVersion: "0.1.0"})
	}
	for _, c := range []struct {
		version, want string
	}{
		{"0.3.0-1", "the installed agent does not pass its self-check: " + agent + " --self-check --user mesh-agent: exit status 2, and it printed no self-check"},
		{"0.4.0-1", "it does not drop to user mesh-agent: setgroups: operation not permitted"},
		{"0.5.0-1", `it says version "0.4.9", not the declared 0.5.0-1`},
	} {
		rep := apply(c.version)
		if rep.Outcome != shapes.Failed || rep.Upgraded != "" || !strings.Contains(rep.Lines[0].Detail, c.want) || !strings.Contains(rep.Lines[0].Detail, "the running host (0.1.0) carries on") {
			t.Errorf("%s: %+v", c.version, rep)
		}
	}
	if rep := apply("0.2.0-1"); rep.Outcome != shapes.Applied || rep.Upgraded != "0.2.0" {
		t.Fatalf("an agent that passes its self-check: %+v", rep)
	}
}
