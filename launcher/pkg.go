package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// HostPackage is the host's own package, which a rollback reinstalls at
// the known-good version through the machine's package manager.
const HostPackage = "nox-mesh-host"

// The launcher's own few words with the package manager. They are not the
// engine's (executor/engine) on purpose: the launcher is what must work on
// a machine where nothing else does, so it links nothing of the executor
// but the leaf that says how root runs a program (executor/command), and
// asks only "which version is installed" and "install this one".

// PackageVersion asks the machine's package manager which version of the
// host's package is installed: "" when none is, or when the machine has no
// package manager the launcher knows (dpkg, pacman, apk). Its programs run as
// every program root runs (executor/command): from the fixed search path,
// with an environment of their own.
func PackageVersion(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := command.LookPath("dpkg-query"); err == nil {
		res, err := command.Run(ctx, []string{"dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "--", HostPackage}, command.Options{})
		if st, v, ok := strings.Cut(res.Stdout, " "); err == nil && res.Code == 0 && ok && st == "installed" {
			return v
		}
		return ""
	}
	if _, err := command.LookPath("pacman"); err == nil {
		res, err := command.Run(ctx, []string{"pacman", "-Q", HostPackage}, command.Options{})
		if f := strings.Fields(res.Stdout); err == nil && res.Code == 0 && len(f) == 2 {
			return f[1]
		}
		return ""
	}
	if _, err := command.LookPath("apk"); err == nil {
		return apkInstalled(ctx)
	}
	return ""
}

// apkInstalled asks apk which version of the host's package is
// installed, as the engine's apk applier asks: `apk info -e -v -v NAME`
// prints "NAME-VERSION - DESCRIPTION" (e.g. nox-mesh-host-0.9.2-r1 - …),
// or nothing and exit 1 when it is not installed (apk-tools 2 and 3
// alike; TestAlpineRollbackThroughAPK runs 3). The second -v keeps the
// version printed where apk-tools 3's /etc/apk/config says quiet (then
// the line is "NAME-VERSION"); a version not read leaves the known-good
// copy without its package version, and a rollback would copy the
// binaries back behind apk's back.
func apkInstalled(ctx context.Context) string {
	res, err := command.Run(ctx, []string{"apk", "info", "-e", "-v", "-v", "--", HostPackage}, command.Options{})
	if err != nil || res.Code != 0 {
		return ""
	}
	return apkVersion(res.Stdout)
}

// apkVersion is the version in the first field of apk's line
// "NAME-VERSION[ - DESCRIPTION]".
func apkVersion(out string) string {
	f := strings.Fields(out)
	if len(f) == 0 || len(f) > 1 && f[1] != "-" {
		return ""
	}
	if v, ok := strings.CutPrefix(f[0], HostPackage+"-"); ok && v != "" && v[0] >= '0' && v[0] <= '9' {
		return v
	}
	return ""
}

// packageReinstall installs the host's package at version through the
// package manager: apt from its sources (a downgrade allowed), pacman from
// its package cache.
func packageReinstall(ctx context.Context, version string) error {
	run := func(argv ...string) error {
		res, err := command.Run(ctx, argv, command.Options{Timeout: 30 * time.Minute, Env: []string{"DEBIAN_FRONTEND=noninteractive"}, Gentle: true})
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit status %d", res.Code)
		}
		if err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(res.Stdout+"\n"+res.Stderr))
		}
		return nil
	}
	if _, err := command.LookPath("apt-get"); err == nil {
		return run("apt-get", "install", "-y", "--no-install-recommends", "--allow-downgrades",
			"-o", "DPkg::Lock::Timeout=60", "-o", "Dpkg::Options::=--force-confold", "--", HostPackage+"="+version)
	}
	if _, err := command.LookPath("pacman"); err == nil {
		m, _ := filepath.Glob("/var/cache/pacman/pkg/" + HostPackage + "-" + version + "-*.pkg.tar.*")
		if len(m) == 0 {
			return fmt.Errorf("pacman: %s %s is not in the package cache", HostPackage, version)
		}
		return run("pacman", "-U", "--noconfirm", m[0])
	}
	if _, err := command.LookPath("apk"); err == nil {
		// apk installs the version pinned from its repositories, or from
		// its cache (/etc/apk/cache) when the machine keeps one: apk add
		// NAME=VERSION allows a downgrade, and leaves that pin in
		// /etc/apk/world until a declaration names another version. The
		// repository must still offer the known-good version (Alpine's
		// keep one version of a package; a machine that must roll back
		// from them keeps a cache).
		return run("apk", "add", "--", HostPackage+"="+version)
	}
	return errors.New("no package manager the launcher knows (apt, pacman, apk)")
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
