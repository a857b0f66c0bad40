package engine

import (
	"context"
	"errors"
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

func (h *harness) applyPackages(f *fakePackages, doc string) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, packages: f})
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
