package edit

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func TestRegion(t *testing.T) {
	g := Region{Comment: "#", Name: "m.hosts"}
	other := Region{Comment: "#", Name: "m.other"}
	for _, tc := range []struct {
		name, file, content, want string
		added                     bool
	}{
		{"appended", "127.0.0.1 localhost\n", "10.0.0.5 db", "127.0.0.1 localhost\n# BEGIN mesh m.hosts\n10.0.0.5 db\n# END mesh m.hosts\n", false},
		{"no final newline", "127.0.0.1 localhost", "10.0.0.5 db\n", "127.0.0.1 localhost\n# BEGIN mesh m.hosts\n10.0.0.5 db\n# END mesh m.hosts\n", true},
		{"empty file", "", "x\n", "# BEGIN mesh m.hosts\nx\n# END mesh m.hosts\n", false},
		{"replaced in place", "a\n# BEGIN mesh m.hosts\nold\n# END mesh m.hosts\nb\n", "new\n", "a\n# BEGIN mesh m.hosts\nnew\n# END mesh m.hosts\nb\n", false},
		{"another leader found", "a\n// BEGIN mesh m.hosts  \nold\n;; END mesh m.hosts\nb", "new\n", "a\n# BEGIN mesh m.hosts\nnew\n# END mesh m.hosts\nb", false},
		{"another's block untouched", "# BEGIN mesh m.other\nx\n# END mesh m.other\n", "y\n", "# BEGIN mesh m.other\nx\n# END mesh m.other\n# BEGIN mesh m.hosts\ny\n# END mesh m.hosts\n", false},
		{"empty content", "a\n", "", "a\n# BEGIN mesh m.hosts\n# END mesh m.hosts\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, added, err := g.Set([]byte(tc.file), tc.content)
			if err != nil || string(out) != tc.want || added != tc.added {
				t.Fatalf("Set = %q, %v, %v; want %q, %v", out, added, err, tc.want, tc.added)
			}
			if c, found, err := g.Current(out); err != nil || !found || c != Normalise(tc.content) {
				t.Errorf("Current = %q %v %v", c, found, err)
			}
			if _, found, _ := other.Current(out); found != strings.Contains(tc.file, "m.other") {
				t.Error("another region's markers matched")
			}
			back, removed, err := g.Remove(out, added)
			if err != nil || !removed {
				t.Fatalf("Remove: %v %v", removed, err)
			}
			if !strings.Contains(tc.file, "BEGIN mesh m.hosts") && string(back) != tc.file {
				t.Errorf("Remove gave back %q, the file was %q", back, tc.file)
			}
		})
	}
	for _, broken := range []string{
		"# BEGIN mesh m.hosts\nx\n",
		"x\n# END mesh m.hosts\n",
		"# END mesh m.hosts\n# BEGIN mesh m.hosts\n",
		"# BEGIN mesh m.hosts\n# BEGIN mesh m.hosts\n# END mesh m.hosts\n",
	} {
		if _, _, err := g.Set([]byte(broken), "y"); err == nil || !strings.Contains(err.Error(), "markers of m.hosts are broken") {
			t.Errorf("%q: %v", broken, err)
		}
		if out, _, err := g.Remove([]byte(broken), false); err == nil || string(out) != broken {
			t.Errorf("Remove of %q: %v", broken, err)
		}
	}
	for text, want := range map[string]bool{
		"# BEGIN mesh a.b": true, "// END mesh a.b \r": true, "#BEGIN mesh a.b": false, "# BEGIN mesh": false,
		"# BEGIN mesh a b": false, "too-long-leader BEGIN mesh a.b": false, "x": false,
	} {
		if _, _, ok := shapes.ParseRegionMarker([]byte(text)); ok != want {
			t.Errorf("ParseRegionMarker(%q) = %v", text, !want)
		}
	}
}

func TestKeys(t *testing.T) {
	sshd := "# sshd\nPort 22\npasswordauthentication  yes  # keep\n\nMatch User backup\n  PasswordAuthentication no\n"
	k := ParseKeys([]byte(sshd), Space)
	if v, ok, err := k.Get("PasswordAuthentication"); err != nil || !ok || v != "yes  # keep" {
		t.Fatalf("Get = %q %v %v", v, ok, err)
	}
	out, err := k.Apply([]Change{{Key: "PasswordAuthentication", Value: "no"}, {Key: "PermitRootLogin", Value: "no"}, {Key: "Port", Remove: true}})
	want := "# sshd\npasswordauthentication  no\n\nPermitRootLogin no\nMatch User backup\n  PasswordAuthentication no\n"
	if err != nil || string(out) != want {
		t.Fatalf("Apply =\n%s\nwant\n%s(%v)", out, want, err)
	}

	sysctl := "net.ipv4.ip_forward=0\n; old\nvm.swappiness = 60"
	k = ParseKeys([]byte(sysctl), Equals)
	out, err = k.Apply([]Change{{Key: "vm.swappiness", Value: "10"}, {Key: "kernel.panic", Value: "5"}})
	// A key added is set apart as the file's first key line is.
	if want := "net.ipv4.ip_forward=0\n; old\nvm.swappiness = 10\nkernel.panic=5\n"; err != nil || string(out) != want {
		t.Fatalf("Apply = %q, want %q (%v)", out, want, err)
	}
	for _, c := range []struct {
		f                Format
		file, key, value string
		want             string
	}{
		{Equals, "A=1\nB=2\n", "C", "3", "A=1\nB=2\nC=3\n"}, // a shell-sourced environment file stays one
		{Equals, "# none yet\n", "a", "1", "# none yet\na = 1\n"},
		{Equals, "a= 1\n", "b", "2", "a= 1\nb= 2\n"},
		{Space, "Port\t22\n", "PermitRootLogin", "no", "Port\t22\nPermitRootLogin\tno\n"},
		{Space, "", "Port", "22", "Port 22\n"},
	} {
		out, err := ParseKeys([]byte(c.file), c.f).Apply([]Change{{Key: c.key, Value: c.value}})
		if err != nil || string(out) != c.want {
			t.Errorf("%s: %q plus %s: %q, want %q (%v)", c.f, c.file, c.key, out, c.want, err)
		}
	}
	if _, ok, _ := ParseKeys([]byte("export X=1\n"), Equals).Get("X"); ok {
		t.Error("\"export X=1\" read as a key")
	}
	if _, ok, _ := ParseKeys([]byte("x=1\n"), Equals).Get("X"); ok {
		t.Error("an equals key compared without case")
	}

	// INI sections: the global part ends at the first one; a key in a
	// section is that section's, and a key added goes before it.
	ini := "top = 1\n\n[server]\nport = 80\n"
	k = ParseKeys([]byte(ini), Equals)
	if _, ok, _ := k.Get("port"); ok {
		t.Error("a section's key read as the file's")
	}
	out, err = k.Apply([]Change{{Key: "port", Value: "8080"}, {Key: "top", Value: "2"}})
	if want := "top = 2\n\nport = 8080\n[server]\nport = 80\n"; err != nil || string(out) != want {
		t.Fatalf("Apply in an INI file = %q, want %q (%v)", out, want, err)
	}
	if err := Check(out, Equals, []Change{{Key: "port", Value: "8080"}, {Key: "top", Value: "2"}}); err != nil {
		t.Fatalf("Check after Apply: %v", err)
	}
	// What could never be read back is caught before a byte is written.
	if err := Check([]byte("Port 22\nMatch all\n"), Space, []Change{{Key: "Match", Value: "all"}}); err == nil {
		t.Error("Check took a Match line for a key")
	}

	twice := ParseKeys([]byte("a = 1\nb = 2\na = 3\n"), Equals)
	if _, err := twice.Apply([]Change{{Key: "a", Value: "9"}}); err == nil || !strings.Contains(err.Error(), "a is set 2 times (lines 1 and 3)") {
		t.Errorf("a key twice: %v", err)
	}
	if out, err := twice.Apply([]Change{{Key: "b", Value: "9"}}); err != nil || string(out) != "a = 1\nb = 9\na = 3\n" {
		t.Errorf("another key of a file with a key twice: %q %v", out, err)
	}
}

// FuzzRegion: whatever the file, Set then Remove gives it back byte for
// byte when it held no block of its own, Set is idempotent, and nothing
// but the block changes.
func FuzzRegion(f *testing.F) {
	f.Add([]byte("127.0.0.1 localhost\n"), "10.0.0.5 db\n")
	f.Add([]byte("a"), "")
	f.Add([]byte("# BEGIN mesh m.x\n# END mesh m.x\n"), "y")
	f.Add([]byte("# BEGIN mesh m.other\n\n"), "# not a marker")
	f.Fuzz(func(t *testing.T, file []byte, content string) {
		g := Region{Comment: "#", Name: "m.x"}
		for _, l := range strings.Split(content, "\n") {
			if _, _, ok := shapes.ParseRegionMarker([]byte(l)); ok {
				return // refused by validation
			}
		}
		_, had, ferr := g.Find(file)
		out, added, err := g.Set(file, content)
		if ferr != nil {
			if err == nil {
				t.Fatal("Set wrote into a file whose markers are broken")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if c, found, err := g.Current(out); err != nil || !found || c != Normalise(content) {
			t.Fatalf("Current after Set = %q %v %v", c, found, err)
		}
		again, _, err := g.Set(out, content)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("Set twice differs: %q then %q (%v)", out, again, err)
		}
		back, removed, err := g.Remove(out, added)
		if err != nil || !removed {
			t.Fatalf("Remove: %v %v", removed, err)
		}
		if !had && !bytes.Equal(back, file) {
			t.Fatalf("given back %q, was %q", back, file)
		}
	})
}

// FuzzKeys: whatever the file, parsing never fails; a key set reads back
// its value; setting it again changes nothing; lines of other keys are
// kept.
func FuzzKeys(f *testing.F) {
	f.Add([]byte("Port 22\nMatch all\n"), "PasswordAuthentication", "no", true)
	f.Add([]byte("a=1\nb = 2"), "b", "3", false)
	f.Add([]byte(""), "k", "", false)
	f.Add([]byte("a=1\n[s]\nb=2\n"), "b", "3", false)
	f.Fuzz(func(t *testing.T, file []byte, key, value string, space bool) {
		fm := Equals
		if space {
			fm = Space
		}
		if !shapes.ValidKeyName(key) || !shapes.ValidKeyValue(value, space) || space && strings.EqualFold(key, "Match") {
			return // refused by validation
		}
		k := ParseKeys(file, fm)
		out, err := k.Apply([]Change{{Key: key, Value: value}})
		if err != nil {
			if _, _, gerr := k.Get(key); gerr == nil {
				t.Fatalf("Apply refused what Get reads: %v", err)
			}
			return
		}
		k2 := ParseKeys(out, fm)
		if v, ok, err := k2.Get(key); err != nil || !ok || v != strings.Trim(value, " \t\r") {
			t.Fatalf("after setting %q=%q in %q: %q %v %v (%q)", key, value, file, v, ok, err, out)
		}
		again, err := k2.Apply([]Change{{Key: key, Value: strings.Trim(value, " \t\r")}})
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("setting it again changed the file: %q then %q", out, again)
		}
	})
}
