package engine

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func region(id, content string) string {
	return `{"module":"m","id":"` + id + `","type":"region","path":"{root}/hosts","content":` + quote(content) + `}`
}

func quote(s string) string {
	b, _ := shapesJSON(s)
	return b
}

// A region: written into a file that is there, owner, mode and label
// kept; drift inside repaired, changes outside left; two regions in one
// file independent; undeclared, the file byte for byte as it would be
// without the block; a region never creates a file.
func TestRegion(t *testing.T) {
	h := newHarness(t)
	found := "127.0.0.1 localhost\n::1 localhost" // no final newline
	os.WriteFile(h.p("hosts"), []byte(found), 0o640)
	os.Chown(h.p("hosts"), 7, 8)
	const label = "system_u:object_r:net_conf_t:s0\x00"
	labelled := unix.Setxattr(h.p("hosts"), "security.selinux", []byte(label), 0) == nil
	if !labelled {
		t.Log("this file system keeps no SELinux label: its keeping is not checked here")
	}

	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Applied, "m.db=applied")
	want := found + "\n# BEGIN mesh m.db\n10.0.0.5 db\n# END mesh m.db\n"
	if got := h.read("hosts"); got != want {
		t.Fatalf("hosts:\n%q\nwant\n%q", got, want)
	}
	var st syscall.Stat_t
	syscall.Stat(h.p("hosts"), &st)
	if st.Mode&0o7777 != 0o640 || st.Uid != 7 || st.Gid != 8 {
		t.Errorf("owner and mode not kept: %o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if labelled {
		buf := make([]byte, 256)
		n, err := unix.Getxattr(h.p("hosts"), "security.selinux", buf)
		if err != nil || string(buf[:n]) != label {
			t.Errorf("the SELinux label was not kept: %q %v", buf[:n], err)
		}
	}
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Unchanged, "m.db=unchanged")

	// Changes outside the block are not drift; inside, they are.
	os.WriteFile(h.p("hosts"), []byte("# a person's line\n"+h.read("hosts")+"10.9.9.9 theirs\n"), 0o640)
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Unchanged, "m.db=unchanged")
	os.WriteFile(h.p("hosts"), []byte(strings.Replace(h.read("hosts"), "10.0.0.5 db", "10.0.0.6 db", 1)), 0o640)
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Repaired, "m.db=repaired")

	// A second region in the same file, independent of the first.
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"), region("web", "10.0.0.7 web\n10.0.0.8 web2\n"))), shapes.Applied, "m.db=unchanged m.web=applied")
	if got := h.read("hosts"); !strings.Contains(got, "# BEGIN mesh m.web\n10.0.0.7 web\n10.0.0.8 web2\n# END mesh m.web\n") || !strings.Contains(got, "10.9.9.9 theirs") {
		t.Fatalf("hosts:\n%s", got)
	}
	// Undeclared one at a time: the other block and the person's lines stay.
	h.expect(h.apply(h.doc(region("web", "10.0.0.7 web\n10.0.0.8 web2\n"))), shapes.Removed, "m.web=unchanged m.db=removed")
	if got, want := h.read("hosts"), "# a person's line\n"+found+"\n10.9.9.9 theirs\n# BEGIN mesh m.web\n10.0.0.7 web\n10.0.0.8 web2\n# END mesh m.web\n"; got != want {
		t.Fatalf("hosts after m.db went:\n%q\nwant\n%q", got, want)
	}
	h.expect(h.apply(h.doc()), shapes.Removed, "m.web=removed")
	if got, want := h.read("hosts"), "# a person's line\n"+found+"\n10.9.9.9 theirs\n"; got != want {
		t.Fatalf("hosts after both went:\n%q\nwant\n%q", got, want)
	}

	// Appended to a file with no final newline and given back: that file,
	// byte for byte.
	os.WriteFile(h.p("hosts"), []byte(found), 0o640)
	h.expect(h.apply(h.doc(region("db", "x"))), shapes.Applied, "m.db=applied")
	h.expect(h.apply(h.doc()), shapes.Removed, "m.db=removed")
	if got := h.read("hosts"); got != found {
		t.Fatalf("given back %q, found %q", got, found)
	}

	// Never created.
	h2 := newHarness(t)
	rep := h2.apply(h2.doc(region("db", "x")))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "does not exist; a region writes into a file that is there and never creates one") {
		t.Fatalf("%+v", rep)
	}
	h2.absent("hosts")
}

// Markers that do not pair up: the file is left to a person, the step
// fails saying which lines; and a hostile file (a link, a FIFO, a second
// name) is refused with nothing written.
func TestRegionRefusesWhatItCannotReadAsItsOwn(t *testing.T) {
	h := newHarness(t)
	broken := "a\n# BEGIN mesh m.db\nb\n"
	os.WriteFile(h.p("hosts"), []byte(broken), 0o644)
	rep := h.apply(h.doc(region("db", "x")))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "the markers of m.db are broken (BEGIN at line 2, END at no line)") || h.read("hosts") != broken {
		t.Fatalf("%+v\n%q", rep, h.read("hosts"))
	}
	os.WriteFile(h.p("target"), []byte("mine\n"), 0o600)
	for _, c := range []struct {
		name, want string
		plant      func(p string)
	}{
		{"symlink", "symbolic link", func(p string) { os.Symlink(h.p("target"), p) }},
		{"fifo", "not a regular file", func(p string) { syscall.Mkfifo(p, 0o644) }},
		{"hardlink", "hard", func(p string) { os.Link(h.p("target"), p) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(h.p("hosts"))
			c.plant(h.p("hosts"))
			rep := h.apply(h.doc(region("db", "x")))
			if rep.Outcome != shapes.Failed || !strings.Contains(strings.ToLower(rep.Lines[0].Detail), c.want) {
				t.Fatalf("%+v", rep)
			}
			if b, _ := os.ReadFile(h.p("target")); string(b) != "mine\n" {
				t.Fatalf("the file behind the %s was written: %q", c.name, b)
			}
		})
	}
}

// Keys set and given back, a whole file written and its original put
// back: the file keeps its ACL throughout (a service user's read access,
// which neither its owner nor its mode says).
func TestAnEditAndAGiveBackKeepTheFilesACL(t *testing.T) {
	h := newHarness(t)
	acl := []byte{2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 2, 0, 4, 0, 0xfe, 0xff, 0, 0, 4, 0, 4, 0, 255, 255, 255, 255, 0x10, 0, 4, 0, 255, 255, 255, 255, 0x20, 0, 0, 0, 255, 255, 255, 255}
	for _, f := range []string{"sshd_config", "whole.conf"} {
		os.WriteFile(h.p(f), []byte("PasswordAuthentication yes\n"), 0o640)
		if err := unix.Setxattr(h.p(f), "system.posix_acl_access", acl, 0); err != nil {
			t.Fatal(err)
		}
	}
	hasACL := func(when string) {
		t.Helper()
		for _, f := range []string{"sshd_config", "whole.conf"} {
			buf := make([]byte, 128)
			if n, err := unix.Getxattr(h.p(f), "system.posix_acl_access", buf); err != nil || !bytes.Equal(buf[:n], acl) {
				t.Fatalf("%s: %s's ACL %v %v", when, f, buf[:max(n, 0)], err)
			}
		}
	}
	whole := `{"module":"m","id":"whole","type":"file","path":"{root}/whole.conf","content":"mine\n","mode":"0640"}`
	h.expect(h.apply(h.doc(keys("ssh", "space", `{"PasswordAuthentication":"no"}`), whole)), shapes.Applied, "m.ssh=applied m.whole=applied")
	hasACL("applied")
	h.expect(h.apply(h.doc()), shapes.Restored, "m.whole=restored m.ssh=restored")
	hasACL("given back")
}

// A keys resource cut before its record (a kill after the file's write),
// then its key moved to another resource: the key keeps the value it was
// first found holding, taken from the cut apply's intent, and the whole
// undeclared gives the person's value back — not the mesh's, recorded as
// found by the resource it was handed to.
func TestAKeyMovedAfterACutKeepsItsFoundValue(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("kv.conf"), []byte("a = 1\nb = 2\n"), 0o644)
	kv := func(module, set string) string {
		return `{"module":"` + module + `","id":"k","type":"keys","path":"{root}/kv.conf","format":"equals","set":` + set + `}`
	}
	h.expect(h.apply(h.doc(kv("w", `{"a":"9","b":"8"}`))), shapes.Applied, "w.k=applied")
	cutJournal(t, h.state, func(op, target string) bool { return op == "put" && strings.Contains(target, "kv.conf") })
	rep := h.apply(h.doc(kv("c", `{"a":"9","z":"26"}`)))
	if rep.Outcome == shapes.Failed || !strings.Contains(fmt.Sprint(rep.Lines), "a handed over to c.k") {
		t.Fatalf("%+v", rep.Lines)
	}
	h.apply(h.doc())
	if got := h.read("kv.conf"); got != "a = 1\nb = 2\n" {
		t.Fatalf("given back:\n%s", got)
	}
}

func keys(id, format, set string) string {
	return `{"module":"m","id":"` + id + `","type":"keys","path":"{root}/sshd_config","format":"` + format + `","set":` + set + `}`
}

// Keys: each key's found value (or absence) recorded once at first apply;
// drift repaired; a key dropped from "set" given back at once; the whole
// resource undeclared gives back every key — found values restored, lines
// the mesh added taken out — but never a value a person changed since;
// comments and other lines untouched; a key found twice refused by name.
func TestKeys(t *testing.T) {
	h := newHarness(t)
	found := "# sshd\nPort 22\nPasswordAuthentication yes\nX11Forwarding yes\nMatch User backup\n  PasswordAuthentication yes\n"
	os.WriteFile(h.p("sshd_config"), []byte(found), 0o600)
	set := `{"PasswordAuthentication":"no","PermitRootLogin":"no","X11Forwarding":"no"}`
	h.expect(h.apply(h.doc(keys("ssh", "space", set))), shapes.Applied, "m.ssh=applied")
	want := "# sshd\nPort 22\nPasswordAuthentication no\nX11Forwarding no\nPermitRootLogin no\nMatch User backup\n  PasswordAuthentication yes\n"
	if got := h.read("sshd_config"); got != want {
		t.Fatalf("sshd_config:\n%s\nwant\n%s", got, want)
	}
	h.expect(h.apply(h.doc(keys("ssh", "space", set))), shapes.Unchanged, "m.ssh=unchanged")
	os.WriteFile(h.p("sshd_config"), []byte(strings.Replace(h.read("sshd_config"), "PermitRootLogin no", "PermitRootLogin yes", 1)+"# a person's comment\n"), 0o600)
	h.expect(h.apply(h.doc(keys("ssh", "space", set))), shapes.Repaired, "m.ssh=repaired")

	// X11Forwarding dropped from set: given back now (found "yes").
	set2 := `{"PasswordAuthentication":"no","PermitRootLogin":"no"}`
	rep := h.apply(h.doc(keys("ssh", "space", set2)))
	h.expect(rep, shapes.Applied, "m.ssh=applied")
	if got := h.read("sshd_config"); !strings.Contains(got, "X11Forwarding yes\n") || !strings.Contains(rep.Lines[0].Detail, `X11Forwarding given back "yes"`) {
		t.Fatalf("%s\n%+v", got, rep)
	}
	// A person sets PasswordAuthentication themselves, after the mesh:
	// undeclared, it is theirs and left; PermitRootLogin, which the mesh
	// added, is taken out.
	os.WriteFile(h.p("sshd_config"), []byte(strings.Replace(h.read("sshd_config"), "PasswordAuthentication no", "PasswordAuthentication without-password", 1)), 0o600)
	h.apply(h.doc(keys("ssh", "space", set2))) // repaired back to "no" while declared
	os.WriteFile(h.p("sshd_config"), []byte(strings.Replace(h.read("sshd_config"), "PasswordAuthentication no", "PasswordAuthentication keyboard", 1)), 0o600)
	rep = h.apply(h.doc())
	h.expect(rep, shapes.Restored, "m.ssh=restored")
	if !strings.Contains(rep.Lines[0].Detail, `PasswordAuthentication holds "keyboard", not what the mesh set: left as it is`) || !strings.Contains(rep.Lines[0].Detail, "PermitRootLogin taken out (the mesh added it)") {
		t.Errorf("%+v", rep.Lines[0])
	}
	if got, want := h.read("sshd_config"), "# sshd\nPort 22\nPasswordAuthentication keyboard\nX11Forwarding yes\nMatch User backup\n  PasswordAuthentication yes\n# a person's comment\n"; got != want {
		t.Fatalf("given back:\n%q\nwant\n%q", got, want)
	}

	// Set and undeclared with nobody else touching it: the file as found.
	os.WriteFile(h.p("sshd_config"), []byte(found), 0o600)
	h.expect(h.apply(h.doc(keys("ssh", "space", set))), shapes.Applied, "m.ssh=applied")
	h.expect(h.apply(h.doc()), shapes.Restored, "m.ssh=restored")
	if got := h.read("sshd_config"); got != found {
		t.Fatalf("given back:\n%q\nwant\n%q", got, found)
	}

	// A key twice: refused by name, nothing written.
	twice := "Port 22\nport 2222\n"
	os.WriteFile(h.p("sshd_config"), []byte(twice), 0o600)
	rep = h.apply(h.doc(keys("ssh", "space", `{"Port":"22"}`)))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "Port is set 2 times (lines 1 and 2)") || h.read("sshd_config") != twice {
		t.Fatalf("%+v", rep)
	}
}

// A key is the file's, not the resource's: renamed, moved to another
// module, or gone from one resource's set to another's in one declaration,
// it is handed over — the declaration's value stays in the file through
// the apply, and the value a person had before the mesh is what is given
// back at the end, however many resources held it in between. Handed to a
// resource held on an adopted node it is given back, as nothing of the
// mesh sets it. (Given back in between, an sshd setting the mesh turned
// off was turned on again behind a line saying the declaration holds.)
func TestAKeyMovedToAnotherResourceIsHandedOver(t *testing.T) {
	h := newHarness(t)
	found := "# sshd\nPort 22\nX11Forwarding yes\nPasswordAuthentication yes\n"
	os.WriteFile(h.p("sshd_config"), []byte(found), 0o600)
	k := func(module, id, set string) string {
		return `{"module":"` + module + `","id":"` + id + `","type":"keys","path":"{root}/sshd_config","format":"space","set":` + set + `}`
	}
	both := `{"PasswordAuthentication":"no","X11Forwarding":"no"}`
	hardened := "# sshd\nPort 22\nX11Forwarding no\nPasswordAuthentication no\n"
	for _, c := range []struct {
		name, doc string
		outcome   shapes.Outcome
		lines     string
	}{
		{"first set", h.doc(k("ssh", "a", both)), shapes.Applied, "ssh.a=applied"},
		{"renamed", h.doc(k("ssh", "b", both)), shapes.Forgotten, "ssh.b=unchanged ssh.a=forgotten"},
		{"moved to another module", h.doc(k("base", "b", both)), shapes.Forgotten, "base.b=unchanged ssh.b=forgotten"},
		{"one key to a resource after it", h.doc(k("base", "b", `{"PasswordAuthentication":"no"}`), k("x11", "c", `{"X11Forwarding":"no"}`)), shapes.Unchanged, "base.b=unchanged x11.c=unchanged"},
		{"back to a resource before it", h.doc(k("base", "b", both), k("x11", "c", `{"Port":"22"}`)), shapes.Unchanged, "base.b=unchanged x11.c=unchanged"},
	} {
		rep := h.apply(c.doc)
		h.expect(rep, c.outcome, c.lines)
		if got := h.read("sshd_config"); got != hardened {
			t.Fatalf("%s: sshd_config after the apply:\n%s\nwant\n%s\n%+v", c.name, got, hardened, rep.Lines)
		}
	}
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Restored, "x11.c=forgotten base.b=restored")
	if got := h.read("sshd_config"); got != found {
		t.Fatalf("given back as:\n%s\nwant what the person had:\n%s\n%+v", got, found, rep.Lines)
	}

	// Handed to a resource held on an adopted node: given back.
	adopted := func(res ...string) string {
		return strings.Replace(h.doc(res...), `{"version":1,`, `{"version":1,"adopted":true,"taken":["ssh"],`, 1)
	}
	h.apply(adopted(k("ssh", "a", both)))
	rep = h.apply(adopted(k("base", "a", both)))
	h.expect(rep, shapes.Held, "base.a=held ssh.a=restored")
	if got := h.read("sshd_config"); got != found {
		t.Fatalf("handed to a held resource, sshd_config:\n%s\nwant\n%s\n%+v", got, found, rep.Lines)
	}
}

// A file that changes shape between declarations — declared whole, then
// edited (keys, a region), or the other way — starts its new shape from
// the file as the person had it, and is given back as the person had it:
// the old shape is undone before the new one is applied. Undone after, as
// other removals are, a found file's original was put back over the keys
// just set (the line said applied; the file held the person's value), and
// a whole file took the mesh's own keys or block into its found content,
// to put them back one day as the person's. Each step is planned first,
// and the plan says what the apply does. Keys or a region in a file the
// mesh made whole for a resource no longer declared are refused, nothing
// touched: undeclared, that file is removed before they could edit it.
func TestAFileChangingShapeStartsFromThePersons(t *testing.T) {
	const person = "# the person's\nPort 22\n"
	file := `{"module":"m","id":"f","type":"file","path":"{root}/sshd_config","content":"Port 2222\nX11Forwarding yes\n"}`
	key := keys("k", "space", `{"X11Forwarding":"no"}`)
	region := `{"module":"m","id":"r","type":"region","path":"{root}/sshd_config","content":"Match User backup\n"}`
	for _, c := range []struct {
		name  string
		steps []string
		// want: the file after each step.
		want []string
	}{
		{"whole, then keys", []string{file, key, ""},
			[]string{"Port 2222\nX11Forwarding yes\n", person + "X11Forwarding no\n", person}},
		{"keys, then whole", []string{key, file, ""},
			[]string{person + "X11Forwarding no\n", "Port 2222\nX11Forwarding yes\n", person}},
		{"whole, then a region", []string{file, region, ""},
			[]string{"Port 2222\nX11Forwarding yes\n", person + "# BEGIN mesh m.r\nMatch User backup\n# END mesh m.r\n", person}},
		{"a region, then whole, then keys", []string{region, file, key, ""},
			[]string{person + "# BEGIN mesh m.r\nMatch User backup\n# END mesh m.r\n", "Port 2222\nX11Forwarding yes\n", person + "X11Forwarding no\n", person}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			os.WriteFile(h.p("sshd_config"), []byte(person), 0o600)
			for i, res := range c.steps {
				doc := h.doc()
				if res != "" {
					doc = h.doc(res)
				}
				plan := h.run("local", doc, true)
				rep := h.apply(doc)
				if rep.Outcome == shapes.Failed || rep.Refused != "" {
					t.Fatalf("step %d: %+v", i+1, rep)
				}
				if p, a := outcomes(plan), outcomes(rep); p != a {
					t.Fatalf("step %d: the plan says %s, the apply did %s", i+1, p, a)
				}
				if got := h.read("sshd_config"); got != c.want[i] {
					t.Fatalf("step %d (%s): sshd_config\n%q\nwant\n%q", i+1, outcomes(rep), got, c.want[i])
				}
			}
		})
	}
	t.Run("the plan's diff is of the file as the removal leaves it", func(t *testing.T) {
		h := newHarness(t)
		os.WriteFile(h.p("sshd_config"), []byte(person), 0o600)
		h.apply(h.doc(file))
		os.WriteFile(h.p("sshd_config"), []byte("an emergency fix\n"), 0o600)
		doc := h.doc(key)
		d, _ := shapes.ParseTrusted([]byte(strings.ReplaceAll(doc, "{root}", h.root)))
		st, _ := store.Open(h.state)
		diffs := map[string]string{}
		Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Plan: true,
			OnDiff: func(module, id, diff string) { diffs[module+"."+id] = diff }})
		if got := diffs["m.k"]; !strings.Contains(got, "sshd_config (as the removal before it leaves it)") || !strings.Contains(got, " # the person's\n") || !strings.Contains(got, "+X11Forwarding no") || strings.Contains(got, "emergency") {
			t.Fatalf("the plan's diff:\n%s", got)
		}
	})
	t.Run("keys in a file the mesh made whole", func(t *testing.T) {
		h := newHarness(t)
		h.expect(h.apply(h.doc(file)), shapes.Applied, "m.f=applied")
		for _, res := range []string{key, region} {
			rep := h.apply(h.doc(res))
			if rep.Refused == "" || !strings.Contains(rep.Refused, "was made whole by the mesh for local:m.f, which this declaration no longer declares") {
				t.Fatalf("%+v", rep)
			}
			if got := h.read("sshd_config"); got != "Port 2222\nX11Forwarding yes\n" {
				t.Fatalf("refused, and the file changed: %q", got)
			}
		}
	})
}

// The equals format, and a plan: nothing changes, the line says what
// would, and a plan's lines are the apply's.
func TestKeysEqualsAndPlan(t *testing.T) {
	h := newHarness(t)
	found := "net.ipv4.ip_forward=0\n; comment\nvm.swappiness = 60\n"
	os.WriteFile(h.p("sshd_config"), []byte(found), 0o644)
	doc := h.doc(keys("sysctl", "equals", `{"net.ipv4.ip_forward":"1","kernel.panic":"10"}`))
	plan := h.run("local", doc, true)
	if plan.Outcome != shapes.Applied || !strings.Contains(plan.Lines[0].Detail, "would be: set kernel.panic, net.ipv4.ip_forward") || h.read("sshd_config") != found {
		t.Fatalf("plan %+v", plan)
	}
	h.expect(h.apply(doc), shapes.Applied, "m.sysctl=applied")
	if got, want := h.read("sshd_config"), "net.ipv4.ip_forward=1\n; comment\nvm.swappiness = 60\nkernel.panic=10\n"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	h.expect(h.apply(h.doc()), shapes.Restored, "m.sysctl=restored")
	if got := h.read("sshd_config"); got != found {
		t.Fatalf("given back %q, found %q", got, found)
	}
}

// restart_on may name a region or keys: the unit is restarted after the
// apply when one of them changed what it reads, and not when none did.
func TestRestartOnARegionOrKeysChange(t *testing.T) {
	h := newHarness(t)
	f := newFakeInit()
	f.add("sshd.service", true, "enabled")
	writeFile(t, h.p("hosts"), "127.0.0.1 localhost\n")
	writeFile(t, h.p("sshd_config"), "Port 22\n")
	doc := func(block, value string) string {
		return h.doc(region("db", block), keys("ssh", "space", `{"PasswordAuthentication":"`+value+`"}`),
			svc("sshd", "sshd", "running", "", `,"restart_on":["m.db","m.ssh"]`))
	}
	h.applyWith(f, doc("10.0.0.5 db", "no"), false)
	if got := f.transcript(); got != "restart sshd.service" {
		t.Fatalf("the region and keys applied, and the unit: %q", got)
	}
	h.applyWith(f, doc("10.0.0.5 db", "no"), false)
	if got := f.transcript(); got != "" {
		t.Fatalf("nothing changed, and the unit: %q", got)
	}
	h.applyWith(f, doc("10.0.0.5 db", "yes"), false)
	if got := f.transcript(); got != "restart sshd.service" {
		t.Fatalf("a key changed, and the unit: %q", got)
	}
	h.applyWith(f, doc("10.0.0.6 db", "yes"), false)
	if got := f.transcript(); got != "restart sshd.service" {
		t.Fatalf("the block changed, and the unit: %q", got)
	}
	// The region in a plan: what would change, nothing changed.
	before := h.read("hosts")
	plan := h.run("local", h.doc(region("db", "10.0.0.7 db")), true)
	if plan.Lines[0].Outcome != shapes.Applied || !strings.Contains(plan.Lines[0].Detail, "the block would be rewritten") || h.read("hosts") != before {
		t.Fatalf("plan %+v", plan.Lines)
	}
}

// restart_on may name a region or keys, of this module or another.
func TestRestartOnNamesRegionsAndKeys(t *testing.T) {
	for _, doc := range []string{
		`{"version":1,"resources":[{"module":"m","id":"r","type":"region","path":"/etc/x","content":""},{"module":"m","id":"s","type":"service","unit":"x","restart_on":["r"]}]}`,
		`{"version":1,"resources":[{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"A":"b"}},{"module":"n","id":"s","type":"service","unit":"x","restart_on":["m.k"]}]}`,
	} {
		if _, err := shapes.Parse([]byte(doc)); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func shapesJSON(s string) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}

// Shared files and what was there before the mesh: a block between
// markers of the resource's name that a person wrote first is found
// content — kept, and given back byte for byte, never removed as the
// mesh's own; on an adopted node a region and keys are held like a found
// file until their module is taken, and then set; and a key the format
// can only place in a section (INI) reads back, set and given back.
func TestFoundBlocksAndAdoptionInSharedFiles(t *testing.T) {
	h := newHarness(t)
	person := "127.0.0.1 localhost\n; BEGIN mesh m.db\n10.0.0.1 theirs\n; END mesh m.db\n# after\n"
	os.WriteFile(h.p("hosts"), []byte(person), 0o644)
	rep := h.apply(h.doc(region("db", "10.0.0.5 db")))
	h.expect(rep, shapes.Applied, "m.db=applied")
	if !strings.Contains(rep.Lines[0].Detail, "found in") || !strings.Contains(h.read("hosts"), "10.0.0.5 db") || strings.Contains(h.read("hosts"), "theirs") {
		t.Fatalf("%+v\n%s", rep.Lines[0], h.read("hosts"))
	}
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Unchanged, "m.db=unchanged")
	h.expect(h.apply(h.doc()), shapes.Restored, "m.db=restored")
	if got := h.read("hosts"); got != person {
		t.Fatalf("given back:\n%q\nwant the person's block as found:\n%q", got, person)
	}

	adopted := func(taken string, res ...string) string {
		return strings.Replace(h.doc(res...), `{"version":1,`, `{"version":1,"adopted":true,"taken":[`+taken+`],`, 1)
	}
	sshd := "Port 22\nPasswordAuthentication yes\n"
	os.WriteFile(h.p("sshd_config"), []byte(sshd), 0o600)
	hosts := h.read("hosts")
	set := `{"PasswordAuthentication":"no"}`
	rep = h.apply(adopted("", region("db", "10.0.0.5 db"), keys("ssh", "space", set)))
	h.expect(rep, shapes.Held, "m.db=held m.ssh=held")
	if h.read("sshd_config") != sshd || h.read("hosts") != hosts {
		t.Fatalf("an adopted node's found files were edited before the module was taken:\n%s\n%s", h.read("sshd_config"), h.read("hosts"))
	}
	if rep.Briefing == nil || rep.Briefing.Outcome == "ok" {
		t.Errorf("the briefing says the held edits are as declared: %+v", rep.Briefing)
	}
	rep = h.apply(adopted(`"m"`, region("db", "10.0.0.5 db"), keys("ssh", "space", set)))
	h.expect(rep, shapes.Applied, "m.db=applied m.ssh=applied")
	if !strings.Contains(h.read("sshd_config"), "PasswordAuthentication no\n") || !strings.Contains(h.read("hosts"), "10.0.0.5 db") {
		t.Fatalf("taken, not set:\n%s\n%s", h.read("sshd_config"), h.read("hosts"))
	}
	h.expect(h.apply(h.doc()), shapes.Restored, "m.ssh=restored m.db=restored") // the person's block, found again
	if h.read("sshd_config") != sshd || h.read("hosts") != hosts {
		t.Fatalf("given back:\n%q\n%q", h.read("sshd_config"), h.read("hosts"))
	}

	ini := "top = 1\n\n[server]\nport = 80\n"
	os.WriteFile(h.p("sshd_config"), []byte(ini), 0o644)
	h.expect(h.apply(h.doc(keys("ini", "equals", `{"port":"8080"}`))), shapes.Applied, "m.ini=applied")
	h.expect(h.apply(h.doc(keys("ini", "equals", `{"port":"8080"}`))), shapes.Unchanged, "m.ini=unchanged")
	h.expect(h.apply(h.doc()), shapes.Restored, "m.ini=restored")
	if got := h.read("sshd_config"); got != ini {
		t.Fatalf("given back %q, found %q", got, ini)
	}
}

// Two edits of one shared file undeclared by the same apply: every
// removal is decided before the first runs, and each is made on the file
// as it is when it runs — not as the decision read it, where the second
// would put back what the first took out. Regions (one of them over a
// block a person wrote) and keys resources, each given back to the file
// as found, byte for byte.
func TestTwoEditsOfOneFileUndeclaredTogether(t *testing.T) {
	h := newHarness(t)
	found := "127.0.0.1 localhost\n# BEGIN mesh m.old\na person's block\n# END mesh m.old\n::1 localhost\n"
	os.WriteFile(h.p("hosts"), []byte(found), 0o640)
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"), region("old", "the mesh's now"), region("web", "10.0.0.7 web"))), shapes.Applied,
		"m.db=applied m.old=applied m.web=applied")
	h.expect(h.apply(h.doc()), shapes.Removed, "m.web=removed m.old=restored m.db=removed")
	if got := h.read("hosts"); got != found {
		t.Fatalf("hosts given back as:\n%q\nfound\n%q", got, found)
	}

	sshd := "# sshd\nPort 22\nX11Forwarding yes\n"
	os.WriteFile(h.p("sshd_config"), []byte(sshd), 0o600)
	h.expect(h.apply(h.doc(keys("login", "space", `{"PermitRootLogin":"no"}`), keys("x11", "space", `{"X11Forwarding":"no"}`))), shapes.Applied,
		"m.login=applied m.x11=applied")
	h.expect(h.apply(h.doc()), shapes.Restored, "m.x11=restored m.login=restored")
	if got := h.read("sshd_config"); got != sshd {
		t.Fatalf("sshd_config given back as:\n%q\nfound\n%q", got, sshd)
	}
}

// A key a rescue file sets is the rescue file's against the link, key by
// key, however their resources are named — as a whole target is (the
// higher source holds it). Set by both, the link's apply, and its
// reconcile at every drift look, put its value back over the rescue's: a
// PasswordAuthentication yes set at the console to get back in turned
// back to no. The link's line says held; once the rescue no longer sets
// it, the link's word applies again, and undeclared, the person's value
// from before the mesh comes back.
func TestAKeyARescueFileSetsIsHeldAgainstTheLink(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("sshd_config"), []byte("PasswordAuthentication yes\nPort 22\n"), 0o600)
	k := func(module, set string) string {
		return `{"module":"` + module + `","id":"k","type":"keys","path":"{root}/sshd_config","format":"space","set":` + set + `}`
	}
	link := h.doc(k("ssh", `{"PasswordAuthentication":"no","Port":"2222"}`))
	rescue := h.doc(k("rescue", `{"PasswordAuthentication":"yes"}`))
	for i, c := range []struct {
		src   store.Source
		doc   string
		lines string
		want  string
	}{
		{store.Link, link, "ssh.k=applied", "PasswordAuthentication no\nPort 2222\n"},
		{store.Local, rescue, "rescue.k=applied", "PasswordAuthentication yes\nPort 2222\n"},
		{store.Link, link, "ssh.k=unchanged", "PasswordAuthentication yes\nPort 2222\n"},
		{store.Link, link, "ssh.k=unchanged", "PasswordAuthentication yes\nPort 2222\n"},
		{store.Local, h.doc(), "rescue.k=forgotten", "PasswordAuthentication yes\nPort 2222\n"},
		{store.Link, link, "ssh.k=repaired", "PasswordAuthentication no\nPort 2222\n"},
		{store.Link, h.doc(), "ssh.k=restored", "PasswordAuthentication yes\nPort 22\n"},
	} {
		rep := h.run(c.src, c.doc, false)
		if outcomes(rep) != c.lines || h.read("sshd_config") != c.want {
			t.Fatalf("step %d (%s): [%s] %+v\n%q, want [%s]\n%q", i+1, c.src, outcomes(rep), rep.Lines, h.read("sshd_config"), c.lines, c.want)
		}
		if i == 2 && !strings.Contains(rep.Lines[0].Detail, "PasswordAuthentication declared also by local:rescue.k, which takes precedence") {
			t.Fatalf("the link's line: %q", rep.Lines[0].Detail)
		}
	}
	// Every key held: the line says held.
	h.run(store.Local, rescue, false)
	if rep := h.run(store.Link, h.doc(k("ssh", `{"PasswordAuthentication":"no"}`)), false); outcomes(rep) != "ssh.k=held" {
		t.Fatalf("%+v", rep.Lines)
	}
}

// A key the rescue file stops setting while the link still sets it is
// released to the link, as a thing two sources declare is released by one
// and kept for the other: the rescue's value stays until the link's next
// apply sets the link's. Given back, the person's value from before the
// mesh (neither source's) held until then. Undeclared by the link too, the
// person's value comes back.
func TestAKeyTheRescueLetsGoIsTheLinks(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("sshd_config"), []byte("PasswordAuthentication maybe\n"), 0o600)
	k := func(module, v string) string {
		return h.doc(`{"module":"` + module + `","id":"k","type":"keys","path":"{root}/sshd_config","format":"space","set":{"PasswordAuthentication":"` + v + `"}}`)
	}
	for i, c := range []struct {
		src         store.Source
		doc         string
		lines, want string
	}{
		{store.Link, k("ssh", "no"), "ssh.k=applied", "no"},
		{store.Local, k("rescue", "yes"), "rescue.k=applied", "yes"},
		{store.Local, h.doc(), "rescue.k=forgotten", "yes"},
		{store.Link, k("ssh", "no"), "ssh.k=repaired", "no"},
		{store.Link, h.doc(), "ssh.k=restored", "maybe"},
	} {
		plan := h.run(c.src, c.doc, true)
		rep := h.run(c.src, c.doc, false)
		if outcomes(rep) != c.lines || outcomes(plan) != c.lines || h.read("sshd_config") != "PasswordAuthentication "+c.want+"\n" {
			t.Fatalf("step %d (%s): plan [%s], apply [%s] %+v\n%q, want [%s] and %s", i+1, c.src, outcomes(plan), outcomes(rep), rep.Lines, h.read("sshd_config"), c.lines, c.want)
		}
		if i == 2 && !strings.Contains(rep.Lines[0].Detail, "PasswordAuthentication released: still set by link:ssh.k") {
			t.Fatalf("the rescue's line: %q", rep.Lines[0].Detail)
		}
	}
}

// A file changing shape changes before anything is applied: the old
// shape undone (removeReshaped) may rewrite the file the new one then
// leaves as it finds it — the whole file's found original put back, with
// the keys the new shape sets already in it. A service whose restart_on
// names the new shape's resource is restarted: its file did change.
func TestAFileChangingShapeRestartsWhatNamesIt(t *testing.T) {
	const person = "Port 22\nX11Forwarding no\n"
	h := newHarness(t)
	os.WriteFile(h.p("sshd_config"), []byte(person), 0o600)
	f := newFakeInit()
	f.add("sshd.service", true, "enabled")
	file := `{"module":"m","id":"f","type":"file","path":"{root}/sshd_config","content":"Port 2222\nX11Forwarding no\n"}`
	key := keys("k", "space", `{"X11Forwarding":"no"}`)
	service := func(on string) string {
		return svc("sshd", "sshd.service", "running", "", `,"restart_on":["m.`+on+`"]`)
	}
	h.applyWith(f, h.doc(file, service("f")), false)
	f.transcript()
	doc := h.doc(key, service("k"))
	plan := h.applyWith(f, doc, true)
	rep := h.applyWith(f, doc, false)
	if got := h.read("sshd_config"); got != person {
		t.Fatalf("sshd_config %q, want the person's %q", got, person)
	}
	if got := f.transcript(); got != "restart sshd.service" {
		t.Fatalf("the init was asked %q, want sshd.service restarted: %s", got, outcomes(rep))
	}
	if p, a := linesOf(plan), linesOf(rep); p != a {
		t.Fatalf("plan and apply differ\nplan:\n%s\napply:\n%s", p, a)
	}
}

// A count of one is said in the singular: one line, one key.
func TestOneIsSaidSingular(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("sshd_config"), []byte("Port 22\n"), 0o644)
	os.WriteFile(h.p("hosts"), []byte("127.0.0.1 localhost\n"), 0o644)
	doc := h.doc(region("block", "PermitRootLogin no\n"), keys("k", "space", `{"Port":"22"}`))
	rep := h.apply(doc)
	for _, l := range rep.Lines {
		if strings.Contains(l.Detail, "1 lines") || strings.Contains(l.Detail, "1 keys") {
			t.Errorf("%s.%s: %s", l.Module, l.ID, l.Detail)
		}
	}
	if !strings.Contains(rep.Lines[0].Detail, "(1 line)") || !strings.Contains(rep.Lines[1].Detail, "1 key in") {
		t.Fatalf("%+v", rep.Lines)
	}
}

// A region undeclared after a hand edit inside its block: the block goes
// (it is the host's), and what the person wrote in it is kept 30 days and
// said, in the plan as in the apply. Unedited, nothing is kept.
func TestARegionEditedByHandIsKeptWhenUndeclared(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.p("hosts"), []byte("127.0.0.1 localhost\n"), 0o644)
	h.expect(h.apply(h.doc(region("db", "10.0.0.5 db"))), shapes.Applied, "m.db=applied")
	os.WriteFile(h.p("hosts"), []byte(strings.Replace(h.read("hosts"), "10.0.0.5 db", "10.0.0.1 mesh-edited", 1)), 0o644)
	plan := h.run(store.Local, h.doc(), true)
	rep := h.apply(h.doc())
	h.expect(rep, shapes.Removed, "m.db=removed")
	const said = "the block was edited by hand since the host wrote it"
	if !strings.Contains(rep.Lines[0].Detail, said) || !strings.Contains(plan.Lines[0].Detail, said) {
		t.Fatalf("plan %q\napply %q", plan.Lines[0].Detail, rep.Lines[0].Detail)
	}
	if got := h.read("hosts"); got != "127.0.0.1 localhost\n" {
		t.Fatalf("hosts %q", got)
	}
	st := mustStore(t, h.state)
	sv := st.Salvaged()
	if len(sv) != 1 || sv[0].Path != h.p("hosts") {
		t.Fatalf("kept %+v", sv)
	}
	if b, err := os.ReadFile(st.OriginalPath(sv[0].Digest)); err != nil || string(b) != "10.0.0.1 mesh-edited\n" {
		t.Fatalf("kept %q %v", b, err)
	}
	h.expect(h.apply(h.doc(region("db", "x"))), shapes.Applied, "m.db=applied")
	if rep := h.apply(h.doc()); strings.Contains(rep.Lines[0].Detail, "edited by hand") || len(mustStore(t, h.state).Salvaged()) != 1 {
		t.Fatalf("unedited: %+v", rep.Lines)
	}
}

// A file edited as a region before and as keys now, or the other way:
// the old edit is undone first, so the new one reads the file as the
// person had it — not the same setting twice, the old one's on its way
// out — in the plan as in the apply.
func TestAnEditChangingShapeStartsFromThePersons(t *testing.T) {
	const found = "Port 22\n"
	regionOf := func(text string) string {
		return `{"module":"m","id":"r","type":"region","path":"{root}/sshd_config","content":` + quote(text) + `}`
	}
	keysOf := func(k, v string) string {
		return `{"module":"m","id":"k","type":"keys","path":"{root}/sshd_config","format":"space","set":{"` + k + `":"` + v + `"}}`
	}
	for _, tc := range []struct{ name, before, after, want string }{
		{"region, then keys", regionOf("PasswordAuthentication maybe\n"), keysOf("PasswordAuthentication", "no"), "Port 22\nPasswordAuthentication no\n"},
		{"keys, then region", keysOf("Banner", "/etc/issue"), regionOf("Banner /etc/issue.net\n"), "Port 22\n# BEGIN mesh m.r\nBanner /etc/issue.net\n# END mesh m.r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			os.WriteFile(h.p("sshd_config"), []byte(found), 0o600)
			if rep := h.apply(h.doc(tc.before)); rep.Outcome != shapes.Applied {
				t.Fatalf("%+v", rep)
			}
			plan := h.run(store.Local, h.doc(tc.after), true)
			rep := h.apply(h.doc(tc.after))
			if rep.Outcome == shapes.Failed || plan.Outcome != rep.Outcome {
				t.Fatalf("plan %+v\napply %+v", plan.Lines, rep.Lines)
			}
			if got := h.read("sshd_config"); got != tc.want {
				t.Fatalf("sshd_config %q, want %q", got, tc.want)
			}
			if strings.HasPrefix(tc.name, "region") {
				h.expect(h.apply(h.doc()), shapes.Restored, "m.k=restored")
			} else {
				h.expect(h.apply(h.doc()), shapes.Removed, "m.r=removed")
			}
			if got := h.read("sshd_config"); got != found {
				t.Fatalf("undeclared, sshd_config %q, want %q", got, found)
			}
		})
	}
}

// Keys in a file an archive brings: a new version of the archive writes
// the file anew, and what it holds then is what the keys found — given
// back when the keys go, not the first version's value; nor is the file
// then taken for edited by hand when the archive goes.
func TestKeysInAnArchivesFileFollowItsVersions(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("app"), 0o755)
	version := func(name, body string) string {
		p, sum := makeArchive(t, h.root, name, tarEntry{name: "conf", typ: tar.TypeReg, body: body, mode: 0o644})
		return archiveRes(p, sum, h.p("app"))
	}
	v1, v2 := version("v1.tgz", "a=1\nb=2\nc=4\n"), version("v2.tgz", "a=1\nb=3\nc=4\nz=5\n")
	keys := `{"module":"m","id":"k","type":"keys","path":"{root}/app/conf","format":"equals","set":{"b":"9","z":"0"}}`
	h.expect(h.apply(h.doc(v1, keys)), shapes.Applied, "ui.theme=applied m.k=applied")
	if rep := h.apply(h.doc(v2, keys)); rep.Outcome == shapes.Failed {
		t.Fatalf("%+v", rep.Lines)
	}
	if got := h.read("app/conf"); got != "a=1\nb=9\nc=4\nz=0\n" {
		t.Fatalf("conf with v2 and the keys: %q", got)
	}
	plan := h.run(store.Local, h.doc(v2), true)
	rep := h.apply(h.doc(v2))
	if got := h.read("app/conf"); got != "a=1\nb=3\nc=4\nz=5\n" {
		t.Fatalf("the keys undeclared: conf %q, want v2's (plan %+v, apply %+v)", got, plan.Lines, rep.Lines)
	}
	if rep := h.apply(h.doc()); strings.Contains(rep.Lines[0].Detail, "edited by hand") {
		t.Fatalf("the archive undeclared: %+v", rep.Lines)
	}
}

// The same when the apply that wrote the new version stopped before the
// keys were set again (a step between them failed): the next apply finds
// the file as that version wrote it, not the first version's values.
func TestKeysFindANewVersionAfterAnApplyThatStopped(t *testing.T) {
	h := newHarness(t)
	os.Mkdir(h.p("app"), 0o755)
	os.Mkdir(h.p("adir"), 0o755)
	version := func(name, body string) string {
		p, sum := makeArchive(t, h.root, name, tarEntry{name: "conf", typ: tar.TypeReg, body: body, mode: 0o644})
		return archiveRes(p, sum, h.p("app"))
	}
	v1, v2 := version("v1.tgz", "a=1\nb=2\n"), version("v2.tgz", "a=1\nb=3\n")
	keys := `{"module":"m","id":"k","type":"keys","path":"{root}/app/conf","format":"equals","set":{"b":"9"}}`
	failing := `{"module":"m","id":"f","type":"file","path":"{root}/adir","content":"x"}`
	h.expect(h.apply(h.doc(v1, keys)), shapes.Applied, "ui.theme=applied m.k=applied")
	if rep := h.apply(h.doc(v2, failing, keys)); rep.Outcome != shapes.Failed {
		t.Fatalf("%+v", rep.Lines)
	}
	if rep := h.apply(h.doc(v2, keys)); rep.Outcome == shapes.Failed {
		t.Fatalf("%+v", rep.Lines)
	}
	h.apply(h.doc(v2))
	if got := h.read("app/conf"); got != "a=1\nb=3\n" {
		t.Fatalf("the keys undeclared: conf %q, want v2's", got)
	}
}
