package shapes

import (
	"fmt"
	"path"
	"strings"
	"sync"
	"sync/atomic"
)

// The protected set: the installation owns the host, the host owns everything
// else. A declaration that touches any of it through any shape is refused
// whole. The lists below are policy; a change to them is a security decision.
var (
	// ProtectedNames are the host's own units, scripts and service
	// directories under every init, compared after normalising (unit
	// suffixes, drop-in ".d", templates, ".rc").
	// "mesh-host" is Android's init file, mesh-host.rc.
	ProtectedNames = []string{"mesh-executor", "mesh-agent", "mesh-launch", "nox-mesh-host", "mesh-host"}

	// ProtectedAccounts are the agent's user and group: a declaration may
	// neither manage that user nor add anyone to that group (its members
	// may speak to the executor's socket).
	ProtectedAccounts = []string{"mesh-agent"}

	// protectedPaths are refused, with everything under them; the last is
	// Android's (init/android/mesh-host.rc and docs/android.md: the
	// executor's state and the socket directory).
	protectedPaths = []string{
		"/usr/lib/nox-mesh-host",
		"/var/lib/mesh-host",
		"/run/mesh-host",
		"/etc/mesh-host",
		"/data/adb/mesh-host",
	}

	// binDirs hold the host's binaries.
	binDirs = []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin", "/system/bin", "/system/xbin"}

	// initRoots are where inits look for units and service directories:
	// systemd, OpenRC, runit, s6 and Android's init.rc.
	initRoots = []string{
		"/etc/systemd", "/run/systemd", "/lib/systemd", "/usr/lib/systemd", "/usr/local/lib/systemd",
		"/etc/init.d", "/etc/conf.d", "/etc/runlevels", "/etc/rc.d",
		"/etc/sv", "/etc/service", "/var/service", "/etc/runit",
		"/etc/s6", "/etc/s6-rc", "/run/service", "/etc/s6-linux-init",
		"/etc/init", "/system/etc/init", "/vendor/etc/init", "/odm/etc/init",
	}
)

// The running instance's own paths: where this executor actually runs
// from — its state, its socket's directory, the binary it was started
// from, the agent's state, the launcher's binary and known-good copies —
// which need not be where the lists above say (a --state elsewhere, a
// binary in /opt, a test's scratch directory). The executor adds them at
// start (ProtectRunning), as given and as the machine resolves them; from
// then on they are refused like the rest of the protected set, with
// everything under them, and so is anything that holds them.
var (
	running   atomic.Pointer[runningSet]
	runningMu sync.Mutex // serialises ProtectRunning's copy-on-write
)

type runningSet struct {
	paths []runningPath
	// first holds the first component of each path ("/srv" for
	// "/srv/mesh/state"): a path can be within one, or hold one, only if
	// it shares it (or is "/").
	first map[string]bool
}

type runningPath struct{ path, what string }

// ProtectRunning adds paths (absolute; cleaned here, resolved by the
// caller, which passes both forms) to the protected set of this process,
// as what the running host uses them for ("state directory", "binary").
// A relative or empty path, or "/", is ignored: the caller makes them
// absolute, and the root is never the host's own.
func ProtectRunning(what string, paths ...string) {
	runningMu.Lock()
	defer runningMu.Unlock()
	next := &runningSet{first: map[string]bool{}}
	if cur := running.Load(); cur != nil {
		next.paths = append(next.paths, cur.paths...)
		for k := range cur.first {
			next.first[k] = true
		}
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") {
			continue
		}
		p = path.Clean(p)
		if p == "/" {
			continue
		}
		dup := false
		for _, q := range next.paths {
			dup = dup || q.path == p
		}
		if dup {
			continue
		}
		next.paths = append(next.paths, runningPath{p, what})
		one, _ := prefixes(p)
		next.first[one] = true
	}
	running.Store(next)
}

// Running lists the running instance's paths added so far, for status and
// tests: "what: path".
func Running() []string {
	var out []string
	if rs := running.Load(); rs != nil {
		for _, q := range rs.paths {
			out = append(out, q.what+": "+q.path)
		}
	}
	return out
}

// runningReason is pathReason against the running instance's paths.
func runningReason(p string, container bool) string {
	rs := running.Load()
	if rs == nil {
		return ""
	}
	if one, _ := prefixes(p); one != "" && !rs.first[one] {
		return ""
	}
	for _, q := range rs.paths {
		if within(p, q.path) {
			return fmt.Sprintf("%s is inside the running host's %s %s", p, q.what, q.path)
		}
		if container && within(q.path, p) {
			return fmt.Sprintf("%s contains the running host's %s %s", p, q.what, q.path)
		}
	}
	return ""
}

// binPaths are the host's binaries in every bin directory.
var binPaths = func() []string {
	var out []string
	for _, dir := range binDirs {
		for _, n := range ProtectedNames {
			out = append(out, dir+"/"+n)
		}
	}
	return out
}()

// Resolver resolves an absolute path through the machine's symlinks: the
// longest existing prefix is resolved and the rest appended. The executor
// passes one that reads the machine; Parse uses none (lexical only).
type Resolver func(path string) (string, error)

// CheckProtected checks every resource of d against the protected set again,
// this time through resolve, so a symlink planted on the machine cannot lead
// a declared path into the host's own files. d comes from Parse or
// ParseTrusted, which checked each path as written.
func CheckProtected(d *Declaration, resolve Resolver) error {
	v := &validator{d: d}
	m := &machine{resolve: resolve}
	// The protected paths as this machine resolves them, where that
	// differs from how they are written: asked once, not once per path.
	for _, q := range protectedPaths {
		if rq, err := resolve(q); err == nil && rq != q {
			m.moved = append(m.moved, [2]string{q, rq})
		}
	}
	for _, r := range d.Resources {
		v.r = r
		checkProtected(v, r, m)
		if v.err != nil {
			return v.err
		}
	}
	return nil
}

// machine is what CheckProtected knows of the machine's symlinks.
type machine struct {
	resolve Resolver
	moved   [][2]string // protected path, and where it really is
}

// ProtectedPath reports why p (already resolved by the caller, if it wants
// that) is inside the protected set, or "" if it is not. Appliers that write
// beneath a declared path (an archive's entries) check each path with it.
func ProtectedPath(p string) string {
	return pathReason(p, false)
}

// ProtectedUnit reports whether a unit name — as declared, or as the init
// resolved an alias of it — is one of the host's own.
func ProtectedUnit(unit string) bool { return isProtectedName(NormaliseUnit(unit)) }

// NormaliseUnit gives a unit name its full form: a name without a suffix is
// a ".service".
func NormaliseUnit(u string) string {
	for _, s := range unitSuffixes {
		if strings.HasSuffix(u, s) {
			return u
		}
	}
	return u + ".service"
}

var unitSuffixes = []string{".service", ".socket", ".timer", ".target", ".path", ".mount",
	".automount", ".swap", ".slice", ".scope", ".device"}

// stem reduces a unit, script or service-directory name to what
// ProtectedNames lists: "mesh-agent@x.service.d" → "mesh-agent".
func stem(name string) string {
	name = strings.TrimSuffix(name, ".d")
	for _, s := range append(unitSuffixes, ".rc", ".conf", ".sh") {
		name = strings.TrimSuffix(name, s)
	}
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	return name
}

// dropInFor recognises systemd's drop-in directories that apply to more
// than one unit: "service.d" (every service) and prefix drop-ins such as
// "mesh-.service.d" (every service whose name starts with "mesh-"). Each
// would reach the host's own units, so each is refused.
func dropInFor(c string) string {
	base, ok := strings.CutSuffix(c, ".d")
	if !ok {
		return ""
	}
	for _, suf := range unitSuffixes {
		typ := strings.TrimPrefix(suf, ".")
		if base == typ {
			return fmt.Sprintf("the drop-in directory of every %s", typ)
		}
		prefix, ok := strings.CutSuffix(base, suf)
		if !ok || !strings.HasSuffix(prefix, "-") {
			continue
		}
		for _, n := range ProtectedNames {
			if strings.HasPrefix(n, prefix) {
				return fmt.Sprintf("the drop-in directory of every %s whose name starts with %q", typ, prefix)
			}
		}
	}
	return ""
}

func isProtectedName(name string) bool {
	s := stem(name)
	for _, p := range ProtectedNames {
		if s == p {
			return true
		}
	}
	return false
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}

// pathReason is the protected-set check of one path. container is true for
// a path that holds other things (a directory, an archive's destination, a
// container's mount source): such a path may not be an ancestor of anything
// protected either, since changing it changes what is inside.
func pathReason(p string, container bool) string {
	if why := runningReason(p, container); why != "" {
		return why
	}
	if !mayTouchProtected(p) {
		return ""
	}
	return pathReasonScan(p, container)
}

// rootPrefixes holds the first one and the first two components of every
// protected path, binary and init root ("/var", "/var/lib"): each of them
// has at least two. A path can be within one of them, or (a container)
// hold one, only if it shares them; most declared paths (under /srv, /opt,
// /var/www) share none, and are passed without comparing them with each.
var rootPrefixes = func() map[string]bool {
	m := map[string]bool{}
	for _, list := range [][]string{protectedPaths, binPaths, initRoots} {
		for _, q := range list {
			one, two := prefixes(q)
			if one == "" || two == "" {
				panic("shapes: a protected root of fewer than two components: " + q)
			}
			m[one], m[two] = true, true
		}
	}
	return m
}()

// prefixes returns the first component of p and its first two ("/var",
// "/var/lib" for "/var/lib/x"); two is "" when p has only one.
func prefixes(p string) (one, two string) {
	if len(p) < 2 || p[0] != '/' {
		return "", ""
	}
	i := strings.IndexByte(p[1:], '/')
	if i < 0 {
		return p, ""
	}
	one = p[:1+i]
	j := strings.IndexByte(p[2+i:], '/')
	if j < 0 {
		return one, p
	}
	return one, p[:2+i+j]
}

// mayTouchProtected is pathReason's quick answer: false when p can neither
// be inside nor contain anything it checks. Anything unusual (not absolute,
// the root) gets the full comparison.
func mayTouchProtected(p string) bool {
	one, two := prefixes(p)
	switch {
	case one == "":
		return true
	case two == "":
		// One component: it may contain a root (a directory "/etc").
		return rootPrefixes[one]
	}
	return rootPrefixes[two]
}

// pathReasonScan compares p with every protected path, binary and init root.
func pathReasonScan(p string, container bool) string {
	for _, q := range protectedPaths {
		if within(p, q) {
			return fmt.Sprintf("%s is inside the host's %s", p, q)
		}
		if container && within(q, p) {
			return fmt.Sprintf("%s contains the host's %s", p, q)
		}
	}
	for _, q := range binPaths {
		if within(p, q) {
			return fmt.Sprintf("%s is the host's binary %s", p, q)
		}
		if container && within(q, p) {
			return fmt.Sprintf("%s contains the host's binary %s", p, q)
		}
	}
	for _, root := range initRoots {
		if container && within(root, p) {
			return fmt.Sprintf("%s contains %s, where the init finds the host's own units", p, root)
		}
		if !within(p, root) {
			continue
		}
		rest := strings.Split(strings.TrimPrefix(p, root), "/")
		for _, c := range rest {
			if c != "" && isProtectedName(c) {
				return fmt.Sprintf("%s is the host's own unit or service entry (%s)", p, c)
			}
			if why := dropInFor(c); why != "" {
				return fmt.Sprintf("%s is %s, which the host's own units read too", p, why)
			}
		}
		// Inside an init's tree, something that holds other things may only
		// be a drop-in directory of another unit: anything else (a
		// *.wants directory, a runlevel) could hold or hide the host's own.
		if container {
			last := rest[len(rest)-1]
			if !strings.HasSuffix(last, ".d") || last == ".d" {
				return fmt.Sprintf("%s is a directory of the init's own (only another unit's drop-in directory may be declared there)", p)
			}
		}
	}
	return ""
}

// checkProtected refuses r if it touches the protected set. With resolve
// set, each path is checked as written and as the machine resolves it, and
// each protected path as the machine resolves it too.
func checkProtected(v *validator, r Resource, m *machine) {
	checkPath := func(field, p string, container bool) {
		candidates := []string{p}
		if m != nil {
			rp, err := m.resolve(p)
			if err != nil {
				v.fail(field, "cannot resolve %s to check it against the protected set: %v", p, err)
				return
			}
			// The path as written was checked when the declaration was
			// parsed; through the machine, only what differs is new —
			// and the running host's own paths, which may have been
			// added since (a rescue command parses its file before its
			// store, and so its state directory, is known).
			if why := runningReason(p, container); why != "" {
				v.failAs(ErrProtected, field, "%s: %v", why, ErrProtected)
				return
			}
			candidates = candidates[:0]
			if rp != p {
				candidates = append(candidates, rp)
			}
			if len(m.moved) > 0 {
				candidates = append(candidates, p)
			}
		}
		for _, c := range candidates {
			if why := pathReason(c, container); why != "" {
				v.failAs(ErrProtected, field, "%s: %v", why, ErrProtected)
				return
			}
			if m != nil {
				if why := m.movedReason(c, container); why != "" {
					v.failAs(ErrProtected, field, "%s: %v", why, ErrProtected)
					return
				}
			}
		}
	}
	checkAccount := func(field, name string) {
		for _, a := range ProtectedAccounts {
			if name == a {
				v.failAs(ErrProtected, field, "%s is the host's agent account: %v", name, ErrProtected)
			}
		}
	}
	switch r := r.(type) {
	case *File:
		checkPath("path", r.Path, false)
	case *Directory:
		checkPath("path", r.Path, true)
	case *Archive:
		checkPath("destination", r.Destination, true)
	case *Process:
		if isProtectedName(NormaliseUnit(r.Name)) {
			v.failAs(ErrProtected, "name", "%s is the host's own unit: %v", r.Name, ErrProtected)
		}
		checkAccount("user", r.User)
	case *Region:
		checkPath("path", r.Path, false)
	case *Keys:
		checkPath("path", r.Path, false)
	case *Container:
		for _, m := range r.Mounts {
			if src, _, _, ok := ParseMount(m); ok && strings.HasPrefix(src, "/") {
				checkPath("mounts", src, true)
			}
		}
	case *Service:
		if isProtectedName(NormaliseUnit(r.Unit)) {
			v.failAs(ErrProtected, "unit", "%s is the host's own unit: %v", r.Unit, ErrProtected)
		}
	case *User:
		checkAccount("name", r.Name)
		for _, g := range r.Groups {
			checkAccount("groups", g)
		}
		if r.Home != "" {
			checkPath("home", r.Home, false)
		}
	}
}

// movedReason compares p against the protected paths as the machine
// resolves them: if /var/lib is a link to /data/var/lib, the host's state is
// at /data/var/lib/mesh-host, and a declared path there is refused too.
func (m *machine) movedReason(p string, container bool) string {
	for _, qr := range m.moved {
		q, rq := qr[0], qr[1]
		if within(p, rq) {
			return fmt.Sprintf("%s is inside the host's %s (at %s)", p, q, rq)
		}
		if container && within(rq, p) {
			return fmt.Sprintf("%s contains the host's %s (at %s)", p, q, rq)
		}
	}
	return ""
}
