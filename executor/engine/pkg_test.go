package engine

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

type fakePackages struct {
	have   map[string]string
	repo   map[string]string // what an install without a version gets
	locked bool
	log    []string
	// onInstall runs after a package is installed: what its maintainer
	// scripts do (bring a unit, start it).
	onInstall func(name string)
	// files is which package owns each file (path → package), as the
	// package manager's database says; onInstall adds to it with brings.
	files map[string]string
	// ownersErr is what asking who owns a file fails with, if it does.
	ownersErr error
	// index is what the package index offers (package → versions) as of
	// its last refresh, upstream what the repositories offer now (a
	// refresh copies it over); a nil index offers everything.
	index, upstream map[string][]string
	refreshes       int
}

func (f *fakePackages) known(_ context.Context, p, v string) (bool, error) {
	if f.index == nil {
		return true, nil
	}
	vs, ok := f.index[p]
	return ok && (v == "" || slices.Contains(vs, v)), nil
}

func (f *fakePackages) refresh(context.Context) error {
	f.refreshes++
	f.log = append(f.log, "refresh")
	f.index = maps.Clone(f.upstream)
	return nil
}

// brings makes pkg the owner of a unit's file: unit's definition on
// systemd when it is a .service, OpenRC's script when it is bare.
func (f *fakePackages) brings(pkg, unit string) {
	if f.files == nil {
		f.files = map[string]string{}
	}
	p := "/etc/init.d/" + unit
	if strings.HasSuffix(unit, ".service") {
		p = "/lib/systemd/system/" + unit
	}
	f.files[p] = pkg
}

func (f *fakePackages) name() string { return "fake" }
func (f *fakePackages) installed(_ context.Context, p string) (string, bool, error) {
	v, ok := f.have[p]
	return v, ok, nil
}
func (f *fakePackages) owners(_ context.Context, paths []string) ([]string, error) {
	if f.ownersErr != nil {
		return nil, f.ownersErr
	}
	var out []string
	for _, p := range paths {
		if o, ok := f.files[p]; ok {
			out = append(out, o)
		}
	}
	return out, nil
}
func (f *fakePackages) install(_ context.Context, p, v string) error {
	f.log = append(f.log, "install "+p+"="+v)
	if f.locked {
		return lockedMessage("dpkg", errors.New("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)"))
	}
	if v == "" {
		v = f.repo[p]
	}
	f.have[p] = v
	if f.onInstall != nil {
		f.onInstall(p)
	}
	return nil
}

// applyPackages applies doc with f as the package manager; with repos,
// those are the repository paths (repositoryPaths) instead of the
// machine's.
func (h *harness) applyPackages(f *fakePackages, doc string, repos ...string) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: f, repositoryPaths: repos})
}

// A file and its directory the host made, then a package installed after
// them that ships both (its maintainer scripts wrote over the file): the
// file and the directory undeclared are the package's now, and left to it
// — a conffile removed is one dpkg never brings back. Plan and apply say
// so alike; a path no package ships is removed as ever.
func TestWhatAPackageShipsNowIsLeftToIt(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{}, repo: map[string]string{"lib": "1.0"}}
	dir := `{"module":"a","id":"dir","type":"directory","path":"{root}/etc/lib"}`
	conf := `{"module":"a","id":"conf","type":"file","path":"{root}/etc/lib/main.conf","content":"mine\n"}`
	other := `{"module":"a","id":"other","type":"file","path":"{root}/etc/lib/other.conf","content":"x\n"}`
	pkg := `{"module":"b","id":"lib","type":"package","name":"lib"}`
	f.onInstall = func(string) {
		f.files = map[string]string{h.p("etc/lib"): "lib", h.p("etc/lib/main.conf"): "lib"}
		os.WriteFile(h.p("etc/lib/main.conf"), []byte("the package's\n"), 0o644)
	}
	os.Mkdir(h.p("etc"), 0o755)
	if rep := h.applyPackages(f, h.doc(dir, conf, other, pkg)); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep.Lines)
	}
	plan := h.plan(f, h.doc(pkg))
	rep := h.applyPackages(f, h.doc(pkg))
	if outcomes(plan) != outcomes(rep) || outcomes(rep) != "a.other=removed a.conf=forgotten a.dir=forgotten b.lib=unchanged" && outcomes(rep) != "b.lib=unchanged a.other=removed a.conf=forgotten a.dir=forgotten" {
		t.Fatalf("plan [%s]\napply [%s] %+v", outcomes(plan), outcomes(rep), rep.Lines)
	}
	if !strings.Contains(lineOf(rep, "a", "conf").Detail, "package lib ships it now") {
		t.Fatalf("%+v", lineOf(rep, "a", "conf"))
	}
	if b, err := os.ReadFile(h.p("etc/lib/main.conf")); err != nil || string(b) != "the package's\n" {
		t.Fatalf("the package's file: %q %v", b, err)
	}
	if _, err := os.Lstat(h.p("etc/lib/other.conf")); !os.IsNotExist(err) {
		t.Fatalf("a file no package ships, undeclared, is left: %v", err)
	}
}

// The same, the package installed by the very apply that undeclares the
// file: asked after the install, the file is the package's.
func TestWhatAPackageInstalledNowShipsIsLeftToIt(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{"base": "1"}, repo: map[string]string{"lib": "1.0"}}
	os.Mkdir(h.p("etc"), 0o755)
	conf := `{"module":"a","id":"conf","type":"file","path":"{root}/etc/main.conf","content":"mine\n"}`
	// A package the host installed before (a host that installs).
	if rep := h.applyPackages(f, h.doc(conf, `{"module":"b","id":"base","type":"package","name":"base","version":"2"}`)); rep.Outcome != shapes.Applied {
		t.Fatalf("%+v", rep.Lines)
	}
	f.onInstall = func(p string) {
		if p == "lib" {
			f.files = map[string]string{h.p("etc/main.conf"): "lib"}
			os.WriteFile(h.p("etc/main.conf"), []byte("the package's\n"), 0o644)
		}
	}
	rep := h.applyPackages(f, h.doc(`{"module":"b","id":"base","type":"package","name":"base","version":"2"}`, `{"module":"b","id":"lib","type":"package","name":"lib"}`))
	if l := lineOf(rep, "a", "conf"); l == nil || l.Outcome != shapes.Forgotten {
		t.Fatalf("%+v", rep.Lines)
	}
	if b, _ := os.ReadFile(h.p("etc/main.conf")); string(b) != "the package's\n" {
		t.Fatalf("%q", b)
	}
}

// plan is applyPackages's plan.
func (h *harness) plan(f *fakePackages, doc string) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: true, packages: f})
}

func TestPackagePresentPinnedNeverUpgradedNeverRemoved(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{"curl": "7.88"}, repo: map[string]string{"curl": "8.0", "jq": "1.6"}}
	doc := h.doc(`{"module":"m","id":"curl","type":"package","name":"curl"}`, `{"module":"m","id":"jq","type":"package","name":"jq"}`)
	rep := h.applyPackages(f, doc)
	if rep.Outcome != shapes.Applied || strings.Join(f.log, ";") != "install jq=" || f.have["curl"] != "7.88" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	// Pinned: exactly that version.
	f.log = nil
	rep = h.applyPackages(f, h.doc(`{"module":"m","id":"curl","type":"package","name":"curl","version":"8.1"}`))
	if strings.Join(f.log, ";") != "install curl=8.1" || f.have["curl"] != "8.1" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	// Undeclared: forgotten, never uninstalled.
	f.log = nil
	rep = h.applyPackages(f, h.doc())
	if rep.Outcome != shapes.Forgotten || len(f.log) != 0 || f.have["curl"] == "" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
}

// The package index is refreshed once per apply, and only when needed: a
// declared version it does not offer (a release published after the
// node's last refresh), or a repository file of the same declaration
// changed before the package. Never for what is installed as declared,
// never twice for two unknown packages, never in a plan.
func TestPackageIndexRefreshedOnlyWhenNeeded(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{"curl": "7.88"},
		index:    map[string][]string{"curl": {"7.88"}, "jq": {"1.6"}},
		upstream: map[string][]string{"curl": {"7.88", "8.0"}, "jq": {"1.6", "1.7"}, "new": {"1.0"}}}
	for i, c := range []struct {
		name      string
		resources []string
		plan      bool
		want      string // the package manager's calls
		refreshes int
	}{
		{"what the index offers: no refresh", []string{`{"module":"m","id":"jq","type":"package","name":"jq","version":"1.6"}`}, false, "install jq=1.6", 0},
		{"installed as declared: no refresh", []string{`{"module":"m","id":"jq","type":"package","name":"jq","version":"1.6"}`}, false, "", 0},
		{"a plan never refreshes", []string{`{"module":"m","id":"curl","type":"package","name":"curl","version":"8.0"}`}, true, "", 0},
		{"a release after the last refresh: once, for both", []string{
			`{"module":"m","id":"curl","type":"package","name":"curl","version":"8.0"}`,
			`{"module":"m","id":"new","type":"package","name":"new"}`}, false, "refresh;install curl=8.0;install new=", 1},
		{"unknown even after it: refreshed once, then apt's own failure", []string{
			`{"module":"m","id":"jq","type":"package","name":"jq","version":"9.9"}`}, false, "refresh;install jq=9.9", 1},
	} {
		f.log = nil
		f.refreshes = 0
		if i == 4 {
			f.upstream = map[string][]string{"jq": {"1.6"}}
		}
		doc := h.doc(c.resources...)
		var rep *shapes.Report
		if c.plan {
			d, _ := shapes.ParseTrusted([]byte(doc))
			st, _ := store.Open(h.state)
			rep = Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: f, Plan: true})
		} else {
			rep = h.applyPackages(f, doc)
		}
		if got := strings.Join(f.log, ";"); got != c.want || f.refreshes != c.refreshes {
			t.Fatalf("%s: calls %q (%d refreshes), want %q (%d): %+v", c.name, got, f.refreshes, c.want, c.refreshes, rep.Lines)
		}
	}
	// A repository file written by the same declaration, before the
	// package: refreshed even though the index offers some version.
	f = &fakePackages{have: map[string]string{}, index: map[string][]string{"tool": {"1.0"}}, upstream: map[string][]string{"tool": {"1.0", "2.0"}},
		repo: map[string]string{"tool": "2.0"}}
	os.MkdirAll(h.p("etc/apt/sources.list.d"), 0o755)
	withRepo := h.doc(
		`{"module":"m","id":"repo","type":"file","path":"{root}/etc/apt/sources.list.d/extra.list","content":"deb [trusted=yes] file:/srv/extra ./\\n"}`,
		`{"module":"m","id":"tool","type":"package","name":"tool"}`)
	apply := func() *shapes.Report { return h.applyPackages(f, withRepo, h.p("etc/apt/sources.list.d")+"/") }
	rep := apply()
	if got := strings.Join(f.log, ";"); got != "refresh;install tool=" || f.have["tool"] != "2.0" {
		t.Fatalf("a repository file changed before the package: calls %q: %+v", got, rep.Lines)
	}
	// The same again: the file unchanged, the package installed: nothing.
	f.log = nil
	if rep = apply(); len(f.log) != 0 {
		t.Fatalf("nothing changed, yet: %q: %+v", f.log, rep.Lines)
	}
}

func TestPackageLockedDatabaseIsAClearFailure(t *testing.T) {
	h := newHarness(t)
	f := &fakePackages{have: map[string]string{}, locked: true}
	rep := h.applyPackages(f, h.doc(`{"module":"m","id":"jq","type":"package","name":"jq"}`))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "package database is locked by another process; nothing was installed") {
		t.Fatalf("%+v", rep.Lines)
	}
}

// What dpkg-query -S says about a unit's candidate files, read as the
// packages that own them (the lines as dpkg 1.21 prints them).
func TestDpkgOwners(t *testing.T) {
	asked := []string{"/lib/systemd/system/u.service", "/etc/init.d/u", "/bin/sh"}
	for _, c := range []struct {
		name, out string
		want      []string
	}{
		{"none owned", "", nil},
		{"one", "u: /lib/systemd/system/u.service", []string{"u"}},
		{"an architecture qualifier", "u-common:amd64: /lib/systemd/system/u.service", []string{"u-common"}},
		{"a path two packages share", "u, u-extra:arm64: /etc/init.d/u", []string{"u", "u-extra"}},
		{"a diversion's lines are not an owner", "diversion by dash from: /bin/sh\ndiversion by dash to: /bin/sh.distrib\ndash: /bin/sh", []string{"dash"}},
		{"a path not asked about", "u: /lib/systemd/system/u.service.d\nv: /etc/init.d/v", nil},
		{"several", "u: /lib/systemd/system/u.service\nu: /etc/init.d/u\n", []string{"u", "u"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := dpkgOwners(c.out, asked); strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("%q: %q, want %q", c.out, got, c.want)
			}
		})
	}
}

// apt-cache madison's lines (as apt 2.6 prints them) read as the
// versions the index offers.
func TestMadisonOffers(t *testing.T) {
	out := "  lp-hello |        2.0 | file:/srv/repo ./ Packages\n  lp-hello |        1.0 | file:/srv/repo ./ Packages\nlp-hello-extra | 3.0 | file:/srv/repo ./ Packages\n"
	for _, c := range []struct {
		pkg, version string
		want         bool
	}{
		{"lp-hello", "", true}, {"lp-hello", "1.0", true}, {"lp-hello", "2.0", true},
		{"lp-hello", "3.0", false}, {"lp-hell", "", false}, {"lp-other", "", false},
	} {
		if got := madisonOffers(out, c.pkg, c.version); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.pkg, c.version, got, c.want)
		}
	}
	if madisonOffers("", "lp-hello", "") {
		t.Error("nothing offered, yet found")
	}
}

// apk's answers in each form apk-tools 2 and 3 give them, the forms an
// /etc/apk/config's quiet or verbose makes included (3 reads global
// options there): the version and the owners read the same, and what is
// neither (a query format's JSON) is refused rather than taken for one.
func TestAPKAnswersInEveryVerbosity(t *testing.T) {
	for line, want := range map[string]string{
		"lp-hello-1.0-r0":                  "1.0-r0",
		"lp-hello-1.0-r0 - test package\n": "1.0-r0",
		"lp-hello-2.0_rc1-r3 - a - b":      "2.0_rc1-r3",
		"lp-hello":                         "",
		"lp-hello-extra-1.0-r0":            "",
		"lp-hello-1.0-r0 x86_64":           "",
		`[{"name":"lp-hello"}]`:            "",
		"":                                 "",
	} {
		if got, ok := apkVersionOf("lp-hello", line); got != want || ok != (want != "") {
			t.Errorf("apkVersionOf(%q) = %q %v, want %q", line, got, ok, want)
		}
	}
	for out, want := range map[string]string{
		"lp-late\nlp-had\n": "lp-late lp-had",
		"/etc/init.d/lp-late is owned by lp-late-1.0-r0\n/usr/bin/x symlink target is owned by lp-rust-r-2.1_p3-r12\n": "lp-late lp-rust-r",
		"": "",
	} {
		got, err := apkOwners(out)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("apkOwners(%q) = %q, %v; want %q", out, got, err, want)
		}
	}
	for _, out := range []string{`[{"query":"/etc/init.d/lp-late","name":"lp-late"}]`, "/x is owned by nothing", "lp late"} {
		if got, err := apkOwners(out); err == nil {
			t.Errorf("apkOwners(%q) = %q, want it refused", out, got)
		}
	}
}

// A region or keys in a file a package declared before them brings
// (openssh-server, then sshd_config hardened): the plan, which installs
// nothing, found no file and said failed — "declare … the package that
// brings it, before it", which the declaration did — where the apply
// succeeds. It says now that the file may come with the package, and the
// outcome the apply gives; with no package or archive before them, failed
// as the apply is. On an adopted node, its module not taken: held, as
// the apply holds it.
func TestAPlanOfEditsInAFileAPackageBrings(t *testing.T) {
	for _, c := range []struct {
		name, doc, outcomes string
	}{
		{"keys and a region after the package", `{"version":1,"resources":[` + pkgRes + `,` + keysRes + `,` + regionRes + `]}`, "m.p=applied m.k=applied m.r=applied"},
		{"on an adopted node, the module not taken", `{"version":1,"adopted":true,"taken":["base"],"resources":[` + strings.Replace(pkgRes, `"m"`, `"base"`, 1) + `,` + keysRes + `]}`, "base.p=applied m.k=held"},
		{"no package before them", `{"version":1,"resources":[` + keysRes + `,` + pkgRes + `]}`, "m.k=failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := &fakePackages{have: map[string]string{}, repo: map[string]string{"openssh-server": "1"}, files: map[string]string{}}
			f.onInstall = func(string) {
				os.WriteFile(h.p("sshd_config"), []byte("Port 22\nX11Forwarding yes\n"), 0o644)
				os.WriteFile(h.p("issue.net"), []byte("Debian\n"), 0o644)
			}
			doc := strings.ReplaceAll(c.doc, "{root}", h.root)
			d, err := shapes.ParseTrusted([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			st, _ := store.Open(h.state)
			plan := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: true, packages: f})
			if len(f.log) != 0 {
				t.Fatalf("the plan installed: %q", f.log)
			}
			h.absent("sshd_config")
			rep := h.applyPackages(f, doc)
			if outcomes(plan) != c.outcomes || outcomes(rep) != c.outcomes {
				t.Fatalf("plan [%s], apply [%s], want [%s]\n%+v\n%+v", outcomes(plan), outcomes(rep), c.outcomes, plan.Lines, rep.Lines)
			}
		})
	}
}

const (
	pkgRes    = `{"module":"m","id":"p","type":"package","name":"openssh-server"}`
	keysRes   = `{"module":"m","id":"k","type":"keys","path":"{root}/sshd_config","format":"space","set":{"X11Forwarding":"no"}}`
	regionRes = `{"module":"m","id":"r","type":"region","path":"{root}/issue.net","content":"authorised use only\n"}`
)
