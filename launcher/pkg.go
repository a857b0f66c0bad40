package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// HostPackage is the host's own package, which a rollback reinstalls at
// the known-good version through the machine's package manager.
const HostPackage = "nox-mesh-host"

// The launcher's own few words with the package manager. They are not the
// engine's (executor/engine) on purpose: the launcher is what must work on
// a machine where nothing else does, so it links nothing of the executor,
// and asks only "which version is installed" and "install this one".

// PackageVersion asks the machine's package manager which version of the
// host's package is installed: "" when none is, or when the machine has no
// package manager the launcher knows (dpkg, pacman).
func PackageVersion(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := exec.LookPath("dpkg-query"); err == nil {
		out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "--", HostPackage).Output()
		if st, v, ok := strings.Cut(strings.TrimSpace(string(out)), " "); err == nil && ok && st == "installed" {
			return v
		}
		return ""
	}
	if _, err := exec.LookPath("pacman"); err == nil {
		out, err := exec.CommandContext(ctx, "pacman", "-Q", HostPackage).Output()
		if f := strings.Fields(string(out)); err == nil && len(f) == 2 {
			return f[1]
		}
	}
	return ""
}

// packageReinstall installs the host's package at version through the
// package manager: apt from its sources (a downgrade allowed), pacman from
// its package cache.
func packageReinstall(ctx context.Context, version string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	run := func(argv ...string) error {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err == nil {
		return run("apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades",
			"-o", "DPkg::Lock::Timeout=60", "-o", "Dpkg::Options::=--force-confold", "--", HostPackage+"="+version)
	}
	if _, err := exec.LookPath("pacman"); err == nil {
		m, _ := filepath.Glob("/var/cache/pacman/pkg/" + HostPackage + "-" + version + "-*.pkg.tar.*")
		if len(m) == 0 {
			return fmt.Errorf("pacman: %s %s is not in the package cache", HostPackage, version)
		}
		return run("pacman", "-U", "--noconfirm", m[0])
	}
	return errors.New("no package manager the launcher knows (apt, pacman)")
}

// reinstall puts the known-good release back: through the package manager
// when the known-good copy names the package version it came from (so the
// package database says what is installed), checked against the known-good
// binaries' digests; else, or when that fails, by copying the known-good
// binaries back (CopyReinstall).
func (l *launcher) reinstall(ctx context.Context, s State) error {
	if l.cfg.Reinstall != nil {
		return l.cfg.Reinstall(ctx, l.cfg.KnownGood, l.cfg.Installed)
	}
	if l.cfg.Packages && s.KnownGood != nil && s.KnownGood.Package != "" {
		err := packageReinstall(ctx, s.KnownGood.Package)
		if err == nil {
			err = sameBinaries(l.cfg.Installed, s.KnownGood.Binaries)
		}
		if err == nil {
			l.log.Warn("launcher: reinstalled the known-good release through the package manager", "package", HostPackage, "version", s.KnownGood.Package)
			return nil
		}
		l.log.Error("launcher: the package manager could not reinstall the known-good release; copying the known-good binaries back instead", "version", s.KnownGood.Package, "err", err)
	}
	return CopyReinstall(ctx, l.cfg.KnownGood, l.cfg.Installed)
}

// sameBinaries checks the installed binaries against the known-good digests.
func sameBinaries(installed, sums map[string]string) error {
	for name, want := range sums {
		p, ok := installed[name]
		if !ok {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		got, err := digest(f)
		f.Close()
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s is not the known-good binary after the reinstall (sha256 %s, known-good %s)", p, got, want)
		}
	}
	return nil
}
