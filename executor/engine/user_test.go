package engine

import (
	"context"
	"fmt"
	"maps"
	"os"
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
	ids    map[string]int // each user's uid once the name service said it
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
	return h.runAccounts(f, doc, false)
}

func (h *harness) runAccounts(f *fakeAccounts, doc string, plan bool) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	if !plan {
		st.Lock(time.Second)
		defer st.Unlock()
	}
	return Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: plan, accounts: f, getent: f.getent})
}

// getent is the name service over the fake databases: a user's uid is
// 1500 and on, in the order the name service is first asked of it (those
// there from the start in their names' order), its primary group the same
// number; a uid never changes once said, as a real one does not when
// another user is made.
func (f *fakeAccounts) getent(db, key string) ([]string, error) {
	if _, ok := f.users[key]; !ok {
		return nil, fmt.Errorf("%s %q is not known to the name service", db, key)
	}
	if f.ids == nil {
		f.ids = map[string]int{}
		for _, n := range slices.Sorted(maps.Keys(f.users)) {
			f.ids[n] = 1500 + len(f.ids)
		}
	}
	if _, ok := f.ids[key]; !ok {
		f.ids[key] = 1500 + len(f.ids)
	}
	id := fmt.Sprint(f.ids[key])
	if db == "group" {
		return []string{key, "x", id}, nil
	}
	return []string{key, "x", id, id, "", f.users[key].Home, f.users[key].Shell}, nil
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
	// Undeclared: never deleted, its groups kept; the shell it was found
	// with is given back (TestAFoundUsersShellAndHomeAreGivenBack).
	f.log = nil
	rep = h.applyAccounts(f, h.doc())
	if rep.Outcome != shapes.Restored || strings.Join(f.log, "; ") != "usermod alice shell=/bin/sh home= append=" || f.users["alice"] == nil || !slices.Contains(f.users["alice"].Groups, "sudo") {
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

// A user the host found (it did not create it) keeps the shell and home it
// was found with, recorded once, the first time the host applies it; the
// host changes them as declared, and undeclaring gives back each one it
// changed — unless something else changed it since (then it is the
// operator's, and left). Groups are added, never pruned, and stay. A user
// the host created is forgotten, never deleted; one whose record is older
// than the host's keeping what it found is left as it is.
func TestAFoundUsersShellAndHomeAreGivenBack(t *testing.T) {
	const alice = `{"module":"people","id":"alice","type":"user","name":"alice","shell":"/bin/bash","home":"/srv/alice","groups":["sudo"]}`
	for _, c := range []struct {
		name string
		// first is applied before alice's declaration (found as she is).
		first string
		// then is applied after alice's declaration, before the undeclare.
		then string
		// operator changes alice after the apply.
		operator   func(a *account)
		unknown    bool
		undeclare  shapes.Outcome
		transcript string
		detail     string
	}{
		{name: "changed by the mesh: given back", undeclare: shapes.Restored,
			transcript: "usermod alice shell=/bin/sh home=/home/alice append=",
			detail:     "shell /bin/bash → /bin/sh, home /srv/alice → /home/alice (contents not moved): given back as the host found it; its groups stay"},
		{name: "found as declared first, changed by a later declaration: given back to the first found",
			first:      `{"module":"people","id":"alice","type":"user","name":"alice","shell":"/bin/sh"}`,
			undeclare:  shapes.Restored,
			transcript: "usermod alice shell=/bin/sh home=/home/alice append=",
			detail:     "given back as the host found it"},
		{name: "changed by the mesh, then declared with neither shell nor home: given back",
			then:       `{"module":"people","id":"alice","type":"user","name":"alice","groups":["sudo"]}`,
			undeclare:  shapes.Restored,
			transcript: "usermod alice shell=/bin/sh home=/home/alice append=",
			detail:     "shell /bin/bash → /bin/sh, home /srv/alice → /home/alice (contents not moved): given back as the host found it"},
		{name: "the shell changed since by the operator: left, the home given back",
			operator:   func(a *account) { a.Shell = "/bin/zsh" },
			undeclare:  shapes.Restored,
			transcript: "usermod alice shell= home=/home/alice append=",
			detail:     "home /srv/alice → /home/alice (contents not moved): given back as the host found it; the shell is /bin/zsh, not what the mesh set: left; its groups stay"},
		{name: "a record from before the host kept what it found", unknown: true, undeclare: shapes.Forgotten,
			detail: "the shell and home it was found with are unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			f := &fakeAccounts{users: map[string]*account{
				"alice": {Shell: "/bin/sh", Home: "/home/alice", Groups: []string{"alice"}},
			}, groups: []string{"sudo", "alice"}}
			if c.first != "" {
				if rep := h.applyAccounts(f, h.doc(c.first)); rep.Outcome != shapes.Unchanged {
					t.Fatalf("%+v", rep.Lines)
				}
			}
			rep := h.applyAccounts(f, h.doc(alice))
			if rep.Outcome != shapes.Applied || !strings.Contains(rep.Lines[0].Detail, "shell /bin/sh → /bin/bash") {
				t.Fatalf("%+v %q", rep.Lines, f.log)
			}
			if c.then != "" {
				if rep := h.applyAccounts(f, h.doc(c.then)); rep.Outcome != shapes.Unchanged {
					t.Fatalf("then: %+v %q", rep.Lines, f.log)
				}
			}
			if c.unknown {
				forgetFound(t, h, "user:alice")
			}
			if c.operator != nil {
				c.operator(f.users["alice"])
			}
			f.log = nil
			st, _ := store.Open(h.state)
			plan := Apply(context.Background(), st, mustParse(t, h.doc()), []byte(h.doc()), Options{Source: store.Local, Plan: true, accounts: f})
			if len(f.log) != 0 {
				t.Fatalf("the plan changed the user: %q", f.log)
			}
			rep = h.applyAccounts(f, h.doc())
			l := rep.Lines[0]
			if p := plan.Lines[0]; p.Outcome != l.Outcome || strings.TrimPrefix(p.Detail, "would be ") != l.Detail {
				t.Fatalf("the plan said %+v, the apply %+v", p, l)
			}
			if l.Outcome != c.undeclare || strings.Join(f.log, "; ") != c.transcript || !strings.Contains(l.Detail, c.detail) {
				t.Fatalf("undeclare: %+v, transcript %q; want %s saying %q, transcript %q", l, f.log, c.undeclare, c.detail, c.transcript)
			}
			if g := f.users["alice"].Groups; !slices.Contains(g, "sudo") {
				t.Fatalf("groups pruned: %v", g)
			}
			if st, _ := store.Open(h.state); st.Get("user:alice") != nil {
				t.Fatal("still recorded after the undeclare")
			}
		})
	}
	t.Run("created by the host: forgotten, never deleted", func(t *testing.T) {
		h := newHarness(t)
		f := &fakeAccounts{users: map[string]*account{}, groups: []string{"sudo"}}
		h.applyAccounts(f, h.doc(alice))
		f.log = nil
		rep := h.applyAccounts(f, h.doc())
		if l := rep.Lines[0]; l.Outcome != shapes.Forgotten || len(f.log) != 0 || f.users["alice"] == nil || !strings.Contains(l.Detail, "never deleted") {
			t.Fatalf("%+v %q", l, f.log)
		}
	})
}

func mustParse(t *testing.T, doc string) *shapes.Declaration {
	t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A user and what it owns, in one declaration (a service account and its
// directory and configuration): the owner is resolved when the file's or
// directory's step runs, after the user's — it was refused whole, the
// name service not knowing the user before anything was applied. A plan
// makes no user, and says so; an owner whose user is declared after it, or
// by nobody, is still refused.
func TestAUserAndWhatItOwnsInOneDeclaration(t *testing.T) {
	h := newHarness(t)
	f := &fakeAccounts{users: map[string]*account{}}
	user := `{"module":"app","id":"user","type":"user","name":"app","home":"/srv/app"}`
	dir := `{"module":"app","id":"dir","type":"directory","path":"{root}/srv","owner":"app","mode":"0750"}`
	conf := `{"module":"app","id":"conf","type":"file","path":"{root}/srv/app.conf","owner":"app:app","content":"x\n"}`
	doc := h.doc(user, dir, conf)
	plan := h.runAccounts(f, doc, true)
	if outcomes(plan) != "app.user=applied app.dir=applied app.conf=applied" || !strings.Contains(plan.Lines[1].Detail, "its owner app comes with this declaration's user") || len(f.log) != 0 {
		t.Fatalf("plan: %+v %q", plan.Lines, f.log)
	}
	h.absent("srv")
	rep := h.applyAccounts(f, doc)
	if outcomes(rep) != "app.user=applied app.dir=applied app.conf=applied" {
		t.Fatalf("%+v", rep.Lines)
	}
	for _, p := range []string{"srv", "srv/app.conf"} {
		if got := ownerOf(t, h.p(p)); got != "1500:1500" {
			t.Fatalf("%s owned by %s, want app's 1500:1500", p, got)
		}
	}
	if rep := h.applyAccounts(f, doc); rep.Outcome != shapes.Unchanged {
		t.Fatalf("again: %+v", rep.Lines)
	}
	// On an adopted node, a found file of a module not taken is held by
	// the apply, whose owner's user the declaration makes: so says the plan.
	h2 := newHarness(t)
	f2 := &fakeAccounts{users: map[string]*account{}}
	os.MkdirAll(h2.p("srv"), 0o755)
	os.WriteFile(h2.p("srv/app.conf"), []byte("the machine's\n"), 0o644)
	adopted := strings.Replace(h2.doc(strings.Replace(user, `"app"`, `"people"`, 1), conf), `{"version":1,`, `{"version":1,"adopted":true,"taken":["people"],`, 1)
	plan = h2.runAccounts(f2, adopted, true)
	if rep := h2.applyAccounts(f2, adopted); outcomes(plan) != "people.user=applied app.conf=held" || outcomes(rep) != outcomes(plan) {
		t.Fatalf("adopted: plan [%s] apply [%s]", outcomes(plan), outcomes(rep))
	}
	for _, c := range []struct{ name, doc string }{
		{"its user declared after it", h.doc(strings.ReplaceAll(dir, "app", "late"), strings.ReplaceAll(user, "app", "late"))},
		{"its user declared by nobody", h.doc(strings.ReplaceAll(dir, "app", "nobody-here"))},
	} {
		os.RemoveAll(h.p("srv"))
		rep := h.applyAccounts(f, c.doc)
		if rep.Refused == "" || !strings.Contains(rep.Refused, "field owner") {
			t.Fatalf("%s: %+v", c.name, rep)
		}
	}
}

// A shell change a kill cut between the host's usermod and its record
// counts as made: undeclared next, the user is given back the shell it
// was found with, though the declaration before set another (the intent
// carries what the change records).
func TestAShellAKillCutIsGivenBack(t *testing.T) {
	h := newHarness(t)
	f := &fakeAccounts{users: map[string]*account{
		"alice": {Shell: "/bin/bash", Home: "/home/alice", Groups: []string{"alice"}},
	}, groups: []string{"alice"}}
	user := func(shell string) string {
		return `{"module":"people","id":"alice","type":"user","name":"alice","shell":"` + shell + `"}`
	}
	h.applyAccounts(f, h.doc(user("/bin/sh")))
	if rep := h.applyAccounts(f, h.doc(user("/bin/zsh"))); rep.Outcome != shapes.Applied || f.users["alice"].Shell != "/bin/zsh" {
		t.Fatalf("changed: %s %+v %q", rep.Outcome, rep.Lines, f.log)
	}
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && target == "user:alice" })
	f.log = nil
	rep := h.applyAccounts(f, h.doc())
	if got := strings.Join(f.log, "; "); got != "usermod alice shell=/bin/bash home= append=" || rep.Outcome != shapes.Restored {
		t.Fatalf("undeclared after a cut: %s %+v, transcript %q", rep.Outcome, rep.Lines, got)
	}
}
