package machines

import (
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// ADR 0100 with a real package manager and the real shadow tools: what
// adoption holds stays held. A held package removed with dpkg, and a held
// user removed with userdel, are reported held-changed at every apply and
// neither installed nor made again before their module is taken; once it
// is taken, they converge like anything else
// (TestHeldPackageThatVanishesIsNotReinstalled and
// TestHeldUserThatVanishesIsNotMadeAgain, against dpkg/apt and
// useradd/userdel).
func TestHeldPackageAndUserThatVanishAreNotMadeAgain(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{})
	m.serveRepo(deb(t, t.TempDir(), "lp-held", "1.0"))
	// The operator's, before the node was adopted.
	m.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=60 lp-held >/dev/null && useradd -m -s /bin/sh lpheld")
	adopted := func(taken string) string {
		return strings.Replace(decl(`{"module":"base","id":"held","type":"package","name":"lp-held"}`,
			`{"module":"people","id":"lpheld","type":"user","name":"lpheld"}`),
			`{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	installed := func() bool {
		return m.sh("dpkg-query -W -f='${db:Status-Status}' lp-held 2>/dev/null || true") == "installed"
	}
	exists := func() bool { return m.sh("getent passwd lpheld >/dev/null && echo yes || true") == "yes" }

	rep, _ := m.apply(adopted(""))
	expect(t, rep, shapes.Held, "base.held=held people.lpheld=held")

	// Removed by something other than the mesh.
	m.sh("dpkg -r lp-held >/dev/null && userdel -r lpheld 2>/dev/null")
	for i := range 2 {
		rep, _ := m.apply(adopted(""))
		expect(t, rep, shapes.HeldChanged, "base.held=held-changed people.lpheld=held-changed")
		for _, l := range rep.Lines {
			if !strings.Contains(l.Detail, "removed by something else since it was found; not made again before the module is taken") {
				t.Fatalf("apply %d, %s: %q", i+1, l.ID, l.Detail)
			}
		}
		if installed() || exists() {
			t.Fatalf("apply %d made what adoption held again: lp-held installed %v, lpheld exists %v", i+1, installed(), exists())
		}
		if b := rep.Briefing; b == nil || b.Outcome != shapes.MarkKept {
			t.Fatalf("apply %d: briefing %+v", i+1, b)
		}
	}

	// Taken: converged as declared.
	rep, _ = m.apply(adopted(`"base","people"`))
	expect(t, rep, shapes.Applied, "base.held=applied people.lpheld=applied")
	if !installed() || !exists() {
		t.Fatalf("taken, yet lp-held installed %v, lpheld exists %v", installed(), exists())
	}
}
