package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A package is present; with a version, exactly that version. Without one
// it is never upgraded, and it is never uninstalled: the host cannot know
// what else needs it, so an undeclared package is forgotten. It is read
// back from the package manager's own database.

// packageManager is the executor's seam to the machine's package manager.
type packageManager interface {
	name() string
	// installed returns the installed version, or ok=false.
	installed(ctx context.Context, pkg string) (version string, ok bool, err error)
	// install installs pkg, at version when it is not "".
	install(ctx context.Context, pkg, version string) error
	// owners returns the packages whose files, by the package manager's
	// own database, include any of paths (absolute and exact): a path no
	// package owns, or that does not exist, adds none and is no error.
	owners(ctx context.Context, paths []string) ([]string, error)
	// known says whether the package index, as of its last refresh,
	// offers pkg at version (at any version when it is "").
	known(ctx context.Context, pkg, version string) (bool, error)
	// refresh brings the package index up to the repositories'.
	refresh(ctx context.Context) error
}

// repositoryPaths are where a machine's package managers read which
// repositories to use and which keys to trust: a file of a declaration
// changed under one of them makes the index stale for the packages
// declared after it.
var repositoryPaths = []string{
	"/etc/apt/sources.list", "/etc/apt/sources.list.d/", "/etc/apt/trusted.gpg", "/etc/apt/trusted.gpg.d/", "/etc/apt/keyrings/",
	"/etc/pacman.conf", "/etc/pacman.d/",
	"/etc/apk/repositories", "/etc/apk/keys/",
}

// repositoryFile says whether path configures a package manager's
// repositories (repositoryPaths; the tests' own, under their scratch tree).
func (r *run) repositoryFile(path string) bool {
	paths := repositoryPaths
	if r.opt.repositoryPaths != nil {
		paths = r.opt.repositoryPaths
	}
	return slices.ContainsFunc(paths, func(p string) bool {
		return path == p || strings.HasSuffix(p, "/") && strings.HasPrefix(path, p)
	})
}

// refreshFor refreshes the package index once per apply, and only when
// it is needed for p: a repository file of this declaration changed since
// the index was last refreshed, or the index does not offer p at its
// declared version and has not been refreshed in this apply. ("a file
// writes the repository's configuration, a package names the version"
// failed for every release published after the node's last refresh: no
// applier refreshed.)
func (r *run) refreshFor(mgr packageManager, p *shapes.Package) error {
	need := r.repoDirty
	why := "a repository file of this declaration changed"
	if !need && !r.refreshed {
		ok, err := mgr.known(r.ctx, p.Name, p.Version)
		if err != nil {
			return fmt.Errorf("asking the package index for %s: %w", p.Name, err)
		}
		need = !ok
		why = fmt.Sprintf("the index does not offer %s %s", p.Name, cmp.Or(p.Version, "at any version"))
	}
	if !need {
		return nil
	}
	start := clock.Now()
	if err := mgr.refresh(r.ctx); err != nil {
		return fmt.Errorf("refreshing the package index (%s): %w", why, err)
	}
	r.refreshed, r.repoDirty = true, false
	r.log.Info("engine: package index refreshed", "why", why, "took", clock.Since(start).Round(time.Millisecond))
	return nil
}

// detectPackages finds the machine's package manager by asking each one
// found whether its own database knows itself, the way the profile does:
// dpkg's tools on an Arch machine, say, do not make it a dpkg machine.
func detectPackages() (packageManager, error) {
	self := map[string]string{"dpkg-query": "dpkg", "pacman": "pacman", "apk": "apk-tools"}
	var tried []string
	for _, m := range []packageManager{apt{}, pacman{}, apk{}} {
		if _, err := command.LookPath(m.name()); err != nil {
			continue
		}
		tried = append(tried, m.name())
		if _, ok, err := m.installed(context.Background(), self[m.name()]); err == nil && ok {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no package manager this host can drive (dpkg/apt, pacman, apk): none of %v knows itself in its own database", tried)
}

// lockedMessage makes a locked database a clear failure.
func lockedMessage(mgr string, err error) error {
	s := err.Error()
	for _, w := range []string{"Could not get lock", "Unable to acquire the dpkg", "unable to lock database", "Unable to lock database", "database is locked"} {
		if strings.Contains(s, w) {
			return fmt.Errorf("the %s package database is locked by another process; nothing was installed: %w", mgr, err)
		}
	}
	return err
}

// runOwners runs a package manager's who-owns query over several paths at
// once, for its standard output. The query exits non-zero when a path has
// no owner; that is an answer, not a failure, when every line of its
// standard error says only that (it contains one of notOwned).
func runOwners(ctx context.Context, notOwned []string, argv ...string) (string, error) {
	res, err := command.Run(ctx, argv, command.Options{Timeout: toolTimeout})
	if err != nil {
		return "", err
	}
	if res.Code != 0 {
		for _, l := range strings.Split(res.Stderr, "\n") {
			if l = strings.TrimSpace(l); l != "" && !slices.ContainsFunc(notOwned, func(s string) bool { return strings.Contains(l, s) }) {
				return "", fmt.Errorf("running %q failed: exit status %d\n%s", argv, res.Code, res.Stderr)
			}
		}
		if res.Stderr == "" {
			return "", fmt.Errorf("running %q failed: exit status %d", argv, res.Code)
		}
	}
	return res.Stdout, nil
}

// ownerQuery keeps the paths a who-owns query can be asked about as they
// are: dpkg-query -S reads its arguments as glob patterns, and a unit name
// with a pattern's characters in it is no file any package ships.
func ownerQuery(paths []string) []string {
	var out []string
	for _, p := range paths {
		if strings.HasPrefix(p, "/") && !strings.ContainsAny(p, "*?[]\\") {
			out = append(out, p)
		}
	}
	return out
}

type apt struct{}

func (apt) name() string { return "dpkg-query" }

func (apt) installed(ctx context.Context, pkg string) (string, bool, error) {
	out, code, err := runTool(ctx, "dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "--", pkg)
	if code == 1 {
		return "", false, nil // dpkg knows no such package
	}
	if err != nil {
		return "", false, err
	}
	status, version, _ := strings.Cut(strings.TrimSpace(out), " ")
	return version, status == "installed", nil
}

func (apt) install(ctx context.Context, pkg, version string) error {
	target := pkg
	argv := []string{"apt-get", "install", "-y", "--no-install-recommends",
		"-o", "DPkg::Lock::Timeout=10", "-o", "Dpkg::Options::=--force-confold"}
	if version != "" {
		target += "=" + version
		argv = append(argv, "--allow-downgrades")
	}
	_, _, err := runInstall(ctx, []string{"DEBIAN_FRONTEND=noninteractive"}, append(argv, "--", target)...)
	if err != nil {
		return lockedMessage("dpkg", err)
	}
	return nil
}

// known asks apt-cache madison, which prints "pkg | version | source" for
// each version the index offers (nothing for a package it does not know).
func (apt) known(ctx context.Context, pkg, version string) (bool, error) {
	out, _, err := runTool(ctx, "apt-cache", "madison", "--", pkg)
	if err != nil {
		return false, err
	}
	return madisonOffers(out, pkg, version), nil
}

// madisonOffers reads apt-cache madison's lines for pkg at version (any
// version when "").
func madisonOffers(out, pkg, version string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "|")
		if len(f) < 3 || strings.TrimSpace(f[0]) != pkg {
			continue
		}
		if version == "" || strings.TrimSpace(f[1]) == version {
			return true
		}
	}
	return false
}

func (apt) refresh(ctx context.Context) error {
	_, _, err := runInstall(ctx, []string{"DEBIAN_FRONTEND=noninteractive"}, "apt-get", "update", "-o", "DPkg::Lock::Timeout=10")
	if err != nil {
		return lockedMessage("dpkg", err)
	}
	return nil
}

// owners asks dpkg-query -S, which prints "pkg[:arch][, pkg…]: path" for
// each path a package ships, with the diversions' lines beside them.
func (apt) owners(ctx context.Context, paths []string) ([]string, error) {
	paths = ownerQuery(paths)
	if len(paths) == 0 {
		return nil, nil
	}
	out, err := runOwners(ctx, []string{"no path found matching pattern"}, append([]string{"dpkg-query", "-S", "--"}, paths...)...)
	if err != nil {
		return nil, err
	}
	return dpkgOwners(out, paths), nil
}

// dpkgOwners reads dpkg-query -S's answer about the paths asked: the
// packages named on a line for one of them (several on a path they share,
// an architecture qualifier dropped). A diversion's lines name the
// diverting package for another path than the one shipped, and a pattern
// dpkg matched beyond what was asked is not the unit's file: neither
// counts.
func dpkgOwners(out string, asked []string) []string {
	ask := map[string]bool{}
	for _, p := range asked {
		ask[p] = true
	}
	var owners []string
	for _, l := range strings.Split(out, "\n") {
		pkgs, path, ok := strings.Cut(strings.TrimSpace(l), ": ")
		if !ok || !ask[path] || strings.HasPrefix(pkgs, "diversion by ") || strings.HasPrefix(pkgs, "local diversion") {
			continue
		}
		for _, p := range strings.Split(pkgs, ", ") {
			name, _, _ := strings.Cut(p, ":")
			owners = append(owners, name)
		}
	}
	return owners
}

type pacman struct{}

func (pacman) name() string { return "pacman" }

func (pacman) installed(ctx context.Context, pkg string) (string, bool, error) {
	out, code, err := runTool(ctx, "pacman", "-Q", "--", pkg)
	if code == 1 {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	f := strings.Fields(out)
	if len(f) < 2 {
		return "", false, fmt.Errorf("pacman -Q %s gave %q", pkg, out)
	}
	return f[1], true, nil
}

func (pacman) install(ctx context.Context, pkg, version string) error {
	// An exact pin is asked of pacman as name=version: a repository without
	// that version installs nothing, rather than another one.
	target := pkg
	if version != "" {
		target += "=" + version
	}
	_, _, err := runInstall(ctx, nil, "pacman", "-S", "--noconfirm", "--needed", "--", target)
	if err != nil {
		return lockedMessage("pacman", err)
	}
	return nil
}

// known asks pacman -Si, which prints the sync databases' one version of
// pkg ("Version : 1.2-1") and exits 1 when none has it.
func (pacman) known(ctx context.Context, pkg, version string) (bool, error) {
	out, code, err := runTool(ctx, "pacman", "-Si", "--", pkg)
	if code == 1 {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if version == "" {
		return true, nil
	}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "Version" && strings.TrimSpace(v) == version {
			return true, nil
		}
	}
	return false, nil
}

func (pacman) refresh(ctx context.Context) error {
	_, _, err := runInstall(ctx, nil, "pacman", "-Sy", "--noconfirm")
	if err != nil {
		return lockedMessage("pacman", err)
	}
	return nil
}

// owners asks pacman -Qqo, which prints the owner's bare name for each
// path a package owns.
func (pacman) owners(ctx context.Context, paths []string) ([]string, error) {
	paths = ownerQuery(paths)
	if len(paths) == 0 {
		return nil, nil
	}
	out, err := runOwners(ctx, []string{"No package owns", "failed to read file", "cannot determine ownership", "failed to find"}, append([]string{"pacman", "-Qqo", "--"}, paths...)...)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// apk drives Alpine's apk. The commands it runs are the same in apk-tools
// 2 and 3 (current Alpine ships 3; the tests run 3.0.6, built from its
// source), and their answers differ in these ways, each handled where it
// is read:
//   - search: 3 exits 1 when nothing matches, where 2 exits 0 with no
//     output (known);
//   - a failed add: both print the solver's reasons ("unable to select
//     packages: … (no such package)", "breaks: world[NAME=VERSION]") as
//     errors (install keeps them); a locked database both say as
//     "Unable to lock database" (lockedMessage);
//   - info: 3 keeps 2's output for -e and for --who-owns (bare names
//     with -q, "PATH is owned by NAME-VERSION" without), its query
//     format being opt-in; who-owns exits with the number of paths no
//     package owns;
//   - configuration: 3 reads global options from /etc/apk/config (or
//     $APK_CONFIG) before the command line's, 2 has no such file. Its
//     quiet and verbose shift what info and search print — "NAME" or
//     "NAME-VERSION" or "NAME-VERSION - DESCRIPTION" — so the applier asks
//     for more than it needs (info -e -v -v, search -v: a quiet there
//     still leaves the version) and reads each line's first field
//     (apkVersionOf), and reads who-owns in either of its forms
//     (apkOwners); what it cannot read (a query format set there: json)
//     fails, saying what apk printed, rather than being taken for an
//     answer;
//   - questions: 2 asks before a change with /etc/apk/interactive only
//     on a terminal, 3 also where its configuration says interactive,
//     and then goes on at the end of its input; the applier's apk has no
//     terminal and reads nothing (command.Run), so neither asks;
//   - the index: 3's add refreshes on its own a remote repository's index
//     older than four hours (--cache-max-age), 2's only with -U or apk
//     update; the applier asks apk update itself when the index it has
//     does not offer the declared version (refreshFor), so with either an
//     index fresher than that is refreshed once;
//   - trust: both need the repository's index signed by a key in
//     /etc/apk/keys; 2 matches a signature to its key by the key's file
//     name, 3 does so for v2 packages and indexes and by the key itself
//     for v3 ones.
//
// Both record an exact pin (add NAME=VERSION) in /etc/apk/world, where it
// stays when the package is forgotten: a person's apk upgrade keeps that
// version until someone changes the pin.
type apk struct{}

func (apk) name() string { return "apk" }

func (apk) installed(ctx context.Context, pkg string) (string, bool, error) {
	argv := []string{"apk", "info", "-e", "-v", "-v", "--", pkg}
	out, code, err := runTool(ctx, argv...)
	if code == 1 || (err == nil && strings.TrimSpace(out) == "") {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	v, ok := apkVersionOf(pkg, out)
	if !ok {
		return "", false, fmt.Errorf("running %q printed %q, not %s-VERSION: an /etc/apk/config that changes what apk info prints?", argv, strings.TrimSpace(out), pkg)
	}
	return v, true, nil
}

// apkVersionOf reads pkg's version from the first field of apk's line
// "NAME-VERSION[ - DESCRIPTION]" (info -e, search), e.g. "1.2.3-r0" from
// "name-1.2.3-r0 - a description".
func apkVersionOf(pkg, line string) (string, bool) {
	f := strings.Fields(line)
	if len(f) == 0 || len(f) > 1 && f[1] != "-" {
		return "", false
	}
	v, ok := strings.CutPrefix(f[0], pkg+"-")
	if !ok || v == "" || v[0] < '0' || v[0] > '9' {
		return "", false
	}
	return v, true
}

func (apk) install(ctx context.Context, pkg, version string) error {
	target := pkg
	if version != "" {
		target += "=" + version
	}
	_, _, err := runInstall(ctx, nil, "apk", "add", "--", target)
	if err != nil {
		return lockedMessage("apk", err)
	}
	return nil
}

// known asks apk search --exact, which prints "pkg-version" (and, more
// verbose, " - description") on a line for each version the indexes
// offer. apk-tools 3 exits 1 when none does and says nothing more; a query
// that fails says why on standard error.
func (apk) known(ctx context.Context, pkg, version string) (bool, error) {
	argv := []string{"apk", "search", "-v", "--exact", "--all", "--", pkg}
	res, err := command.Run(ctx, argv, command.Options{Timeout: toolTimeout})
	if err != nil {
		return false, err
	}
	out := res.Stdout
	if res.Code == 1 && strings.TrimSpace(out) == "" && strings.TrimSpace(res.Stderr) == "" {
		return false, nil
	}
	if res.Code != 0 {
		return false, fmt.Errorf("running %q failed: exit status %d\n%s", argv, res.Code, res.Stderr)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := apkVersionOf(pkg, line); ok && (version == "" || v == version) {
			return true, nil
		}
	}
	return false, nil
}

func (apk) refresh(ctx context.Context) error {
	_, _, err := runInstall(ctx, nil, "apk", "update")
	if err != nil {
		return lockedMessage("apk", err)
	}
	return nil
}

// owners asks apk info -q --who-owns, which prints the owners' bare
// names for the paths a package owns (apkOwners).
func (apk) owners(ctx context.Context, paths []string) ([]string, error) {
	paths = ownerQuery(paths)
	if len(paths) == 0 {
		return nil, nil
	}
	argv := append([]string{"apk", "info", "-q", "--who-owns", "--"}, paths...)
	out, err := runOwners(ctx, []string{"Could not find owner package"}, argv...)
	if err != nil {
		return nil, err
	}
	names, err := apkOwners(out)
	if err != nil {
		return nil, fmt.Errorf("running %q: %w", argv, err)
	}
	return names, nil
}

// apkOwners reads apk info --who-owns's answer: a bare name a line (-q),
// or, where a verbose in apk-tools 3's /etc/apk/config outweighs the -q,
// "PATH [symlink target ]is owned by NAME-VERSION", whose name is what
// precedes the version ("-1.2.3-r0": an apk version holds one '-', before
// its release). Anything else is refused, saying what apk printed.
func apkOwners(out string) ([]string, error) {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if _, nv, ok := strings.Cut(line, " is owned by "); ok {
			name, ok := "", false
			if r := strings.LastIndex(nv, "-r"); r > 0 {
				if i := strings.LastIndexByte(nv[:r], '-'); i > 0 {
					name, ok = nv[:i], true
				}
			}
			if !ok || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("apk printed %q, which names no package-version", line)
			}
			names = append(names, name)
			continue
		}
		if !apkName(line) {
			return nil, fmt.Errorf("apk printed %q, which is not a package's name: an /etc/apk/config that sets a query format?", line)
		}
		names = append(names, line)
	}
	return names, nil
}

// apkName reports whether s can be an apk package's name.
func apkName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._+-", c)) {
			return false
		}
	}
	return true
}

func (r *run) packages() (packageManager, error) {
	if r.opt.packages != nil {
		return r.opt.packages, nil
	}
	return detectPackages()
}

// pkg observes a package and installs it when it is absent, or not the
// pinned version.
func (r *run) pkg(st *step, rest int) {
	p := st.res.(*shapes.Package)
	mgr, err := r.packages()
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	have, ok, err := mgr.installed(r.ctx, p.Name)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if p.Name == HostPackage && p.Version != "" && p.Version == r.opt.FailedHostRelease {
		why := ""
		if r.opt.FailedHostReason != "" {
			why = " (" + r.opt.FailedHostReason + ")"
		}
		r.fail(st, fmt.Errorf("%s %s crash-looped at start and the launcher rolled it back%s; it is not installed again until a declaration names another version (or a person runs mesh-launch clear); the running host (%s) carries on", p.Name, p.Version, why, r.opt.HostVersion), rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypePackage, Claims: withClaim(e, st.claim), Digest: "version=" + p.Version}
	if e != nil {
		n.Order, n.Created = e.Order, e.Created
	}
	if !ok && r.heldGone(st, e, p.Module, p.Key(), "removed") {
		r.recordAndEmit(st, rest)
		return
	}
	if ok && r.holds(p.Module, e) {
		r.heldOK[p.Key()] = p.Version == "" || p.Version == have
		n.Held, n.Digest = true, ""
		st.line.Outcome, st.line.Detail = shapes.Held, fmt.Sprintf("found %s on an adopted node; held as found until module %s is taken", have, p.Module)
		if !r.opt.Plan && (e == nil || !e.Claimed(st.claim)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	if ok && (p.Version == "" || p.Version == have) {
		if p.Name == HostPackage && !r.opt.Plan {
			// Installed before, perhaps by an apply cut off before the
			// restart: the running host may still be the old one.
			if err := r.checkHostUpgrade(p, have); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		st.line.Outcome, st.line.Detail = shapes.Unchanged, have+" installed"
		if p.Version == "" && e == nil {
			st.line.Detail += "; never upgraded without a declared version"
		}
		r.asDeclared(st, e, n, e != nil && e.Held, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	want := p.Version
	if want == "" {
		want = "the repository's version"
	}
	if ok {
		st.line.Detail = fmt.Sprintf("%s → %s", have, want)
	} else {
		st.line.Detail = "installed " + want
		n.Created = true
	}
	if r.opt.Plan {
		r.planBrings = true // what it installs may bring a file a later step edits
		r.emit(st.line)
		return
	}
	if err := r.refreshFor(mgr, p); err != nil {
		r.fail(st, err, rest)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypePackage, Created: !ok}, rest) {
		return
	}
	if err := mgr.install(r.ctx, p.Name, p.Version); err != nil {
		r.fail(st, err, rest)
		return
	}
	got, ok, err := mgr.installed(r.ctx, p.Name)
	switch {
	case err != nil:
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	case !ok:
		r.fail(st, fmt.Errorf("read back: %s is not installed after the install said it was", p.Name), rest)
		return
	case p.Version != "" && got != p.Version:
		r.fail(st, fmt.Errorf("read back: %s %s is installed, not the declared %s", p.Name, got, p.Version), rest)
		return
	}
	st.line.Detail = strings.Replace(st.line.Detail, "the repository's version", got, 1)
	if p.Name == HostPackage {
		if err := r.checkHostUpgrade(p, got); err != nil {
			r.fail(st, err, rest)
			return
		}
		if r.upgradedTo != "" {
			st.line.Detail += fmt.Sprintf("; the new host runs (version %s): this host finishes, reports and restarts onto it", r.upgradedTo)
		}
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

func init() {
	registerAlone(shapes.TypePackage, (*run).pkg, func(r *run, st *step) {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "a package is never uninstalled: the host cannot know what else needs it"
	})
}
