package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// fakeAccounts is the user databases as a transcript; the shadow tools
// themselves are driven in the lab.
type fakeAccounts struct {
	users  map[string]*account
	groups []string
	log    []string
}

func (f *fakeAccounts) lookup(_ context.Context, n string) (account, bool, error) {
	if a, ok := f.users[n]; ok {
		return *a, true, nil
	}
	return account{}, false, nil
}
func (f *fakeAccounts) groupExists(_ context.Context, g string) (bool, error) {
	return slices.Contains(f.groups, g), nil
}
func (f *fakeAccounts) create(_ context.Context, u *shapes.User) error {
	f.log = append(f.log, "useradd "+u.Name)
	f.users[u.Name] = &account{Shell: u.Shell, Home: u.Home, Groups: append([]string{u.Name}, u.Groups...)}
	return nil
}
func (f *fakeAccounts) modify(_ context.Context, n, shell, home string, add []string) error {
	f.log = append(f.log, fmt.Sprintf("usermod %s shell=%s home=%s append=%s", n, shell, home, strings.Join(add, ",")))
	a := f.users[n]
	if shell != "" {
		a.Shell = shell
	}
	if home != "" {
		a.Home = home
	}
	a.Groups = append(a.Groups, add...)
	return nil
}

func (h *harness) applyAccounts(f *fakeAccounts, doc string) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, accounts: f})
}

func TestUserGroupsAddedNeverPruned(t *testing.T) {
	h := newHarness(t)
	f := &fakeAccounts{users: map[string]*account{
		"alice": {Shell: "/bin/sh", Home: "/home/alice", Groups: []string{"alice", "audio", "video"}},
	}, groups: []string{"sudo", "audio", "video", "alice"}}
	doc := h.doc(`{"module":"people","id":"alice","type":"user","name":"alice","shell":"/bin/bash","groups":["sudo"]}`)
	rep := h.applyAccounts(f, doc)
	if rep.Outcome != shapes.Applied || strings.Join(f.log, "; ") != "usermod alice shell=/bin/bash home= append=sudo" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	if g := f.users["alice"].Groups; !slices.Contains(g, "audio") || !slices.Contains(g, "video") {
		t.Fatalf("groups pruned: %v", g)
	}
	f.log = nil
	if rep = h.applyAccounts(f, doc); rep.Outcome != shapes.Unchanged || len(f.log) != 0 {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	// Someone changes the shell back: repaired.
	f.users["alice"].Shell = "/bin/sh"
	if rep = h.applyAccounts(f, doc); rep.Outcome != shapes.Repaired {
		t.Fatalf("%+v", rep.Lines)
	}
	// Undeclared: forgotten, never deleted.
	f.log = nil
	rep = h.applyAccounts(f, h.doc())
	if rep.Outcome != shapes.Forgotten || len(f.log) != 0 || f.users["alice"] == nil {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
}

func TestUserCreatedAndUnknownGroupFails(t *testing.T) {
	h := newHarness(t)
	f := &fakeAccounts{users: map[string]*account{}, groups: []string{"sudo"}}
	rep := h.applyAccounts(f, h.doc(`{"module":"p","id":"bob","type":"user","name":"bob","home":"/home/bob","groups":["sudo"]}`))
	if rep.Outcome != shapes.Applied || rep.Lines[0].Detail != "created" || f.log[0] != "useradd bob" {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	rep = h.applyAccounts(f, h.doc(`{"module":"p","id":"bob","type":"user","name":"bob","groups":["wheel"]}`))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, `group "wheel" does not exist`) {
		t.Fatalf("%+v", rep.Lines)
	}
}

// A held user removed by something else is held-changed, and not made
// again before its module is taken (ADR 0100).
func TestHeldUserThatVanishesIsNotMadeAgain(t *testing.T) {
	h := newHarness(t)
	f := &fakeAccounts{users: map[string]*account{"bob": {Shell: "/bin/sh", Home: "/home/bob", Groups: []string{"bob"}}}, groups: []string{"bob"}}
	doc := strings.Replace(h.doc(`{"module":"people","id":"bob","type":"user","name":"bob"}`), `{"version":1,`, `{"version":1,"adopted":true,`, 1)
	if rep := h.applyAccounts(f, doc); rep.Outcome != shapes.Held {
		t.Fatalf("%+v", rep.Lines)
	}
	delete(f.users, "bob")
	rep := h.applyAccounts(f, doc)
	if rep.Outcome != shapes.HeldChanged || len(f.log) != 0 || f.users["bob"] != nil || !strings.Contains(rep.Lines[0].Detail, "removed by something else since it was found; not made again") {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
}
