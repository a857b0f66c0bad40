package shapes

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestExampleDecodesEveryShape(t *testing.T) {
	data, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	seen := map[string]bool{}
	for _, r := range d.Resources {
		seen[r.Head().Type] = true
	}
	for _, n := range TypeNames() {
		if n == TypeAction {
			continue // the link may not carry one; ParseTrusted is tested below
		}
		if !seen[n] {
			t.Errorf("example has no %s", n)
		}
	}
	if d.Node != "workstation" || d.Seq != 42 || d.Enrolment != "e-7f3a" || len(d.Taken) != 1 {
		t.Errorf("header decoded wrong: %+v", d)
	}
	svc := d.Resources[4].(*Service)
	if svc.Enabled == nil || !*svc.Enabled || svc.RestartOn[0] != "base.motd" {
		t.Errorf("service decoded wrong: %+v", svc)
	}
}

// The vocabulary's size is a decision: every shape widens what a
// compromised control plane can express.
func TestVocabularyIsFourteen(t *testing.T) {
	if len(shapeTable) != 14 || len(TypeNames()) != 14 {
		t.Fatalf("the vocabulary has %d shapes; a change is a decision, update DESIGN and this test", len(shapeTable))
	}
	for _, n := range TypeNames() {
		if _, ok := shapeTable[n]; !ok {
			t.Errorf("TypeNames lists %s, the table lacks it", n)
		}
	}
}

const action = `{"module":"fix","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/true"],"timeout":5}`

func TestActionOnlyTrusted(t *testing.T) {
	doc := `{"version":1,"resources":[` + action + `]}`
	_, err := Parse([]byte(doc))
	if err == nil || !strings.Contains(err.Error(), "fix.a (action) field type: an action may only come from a local file named by root") || !errors.Is(err, ErrAction) {
		t.Fatalf("Parse(action) = %v", err)
	}
	d, err := ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatalf("ParseTrusted(action) = %v", err)
	}
	if a := d.Resources[0].(*Action); a.Timeout != 5 || a.Verify[0] != "/bin/true" {
		t.Fatalf("action decoded wrong: %+v", a)
	}
}

func res(s string) string { return `{"version":1,"resources":[` + s + `]}` }

// Every refusal names the resource and the field, and says why.
func TestRefusals(t *testing.T) {
	f := func(extra string) string {
		return `{"module":"m","id":"f","type":"file","path":"/srv/x","content":"x"` + extra + `}`
	}
	cases := []struct {
		name, doc, want string
	}{
		{"unknown version", `{"version":2,"resources":[],"owns_nothing":true,"newfield":1}`, "declaration field version: unknown version 2; this host knows version 1"},
		{"missing version", `{"resources":[],"owns_nothing":true}`, "declaration field version: missing"},
		{"unknown top field", `{"version":1,"resources":[],"owns_nothing":true,"colour":"red"}`, "declaration field colour: unknown field (refused, never skipped)"},
		{"trailing data", `{"version":1,"resources":[],"owns_nothing":true} {}`, "trailing data"},
		{"not json", `{"version":1,`, "unexpected EOF"},
		{"missing resources", `{"version":1}`, "declaration field resources: missing"},
		{"empty without owns_nothing", `{"version":1,"resources":[]}`, "declaration field resources: empty without \"owns_nothing\": true"},
		{"owns_nothing with resources", `{"version":1,"owns_nothing":true,"resources":[` + f("") + `]}`, "declaration field owns_nothing: set on a declaration that holds 1 resources"},
		{"retire without owns_nothing", `{"version":1,"retire":true,"resources":[` + f("") + `]}`, "declaration field retire: only with \"owns_nothing\": true"},
		{"unknown type", res(`{"module":"m","id":"x","type":"kernel-module","name":"wg"}`), `resource m.x field type: unknown type "kernel-module"; known types: file, directory`},
		{"missing type", res(`{"module":"m","id":"x","path":"/a"}`), "resource m.x field type: missing type"},
		{"unknown field", res(f(`,"colour":"red"`)), "resource m.f (file) field colour: unknown field (refused, never skipped)"},
		{"field of another shape", res(f(`,"unit":"x"`)), "resource m.f (file) field unit: unknown field"},
		{"wrong json type", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":7}`), "resource m.f (file) field content: expected string, got JSON number"},
		{"no content", res(`{"module":"m","id":"f","type":"file","path":"/srv/x"}`), "resource m.f (file) field content: a file says what is in it exactly once: one of content, bytes or sealed (found 0)"},
		{"two contents", res(f(`,"bytes":"AA=="`)), "(found 2)"},
		{"bad base64", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","bytes":"!!"}`), "resource m.f (file) field bytes: not standard base64"},
		{"relative path", res(`{"module":"m","id":"f","type":"file","path":"srv/x","content":""}`), `field path: "srv/x" is not absolute`},
		{"unclean path", res(`{"module":"m","id":"f","type":"file","path":"/srv/../etc/x","content":""}`), `field path: "/srv/../etc/x" is not clean (it would be "/etc/x")`},
		{"trailing slash", res(`{"module":"m","id":"f","type":"file","path":"/srv/x/","content":""}`), `is not clean`},
		{"root path", res(`{"module":"m","id":"d","type":"directory","path":"/"}`), "the root directory is not a resource"},
		{"bad mode", res(f(`,"mode":"644x"`)), `resource m.f (file) field mode: "644x" is not an octal mode`},
		{"decimal mode", res(f(`,"mode":"0999"`)), `field mode: "0999" is not an octal mode`},
		{"bad owner", res(f(`,"owner":"a b"`)), `field owner: "a b" is not "user", "user:group" or numeric ids`},
		{"duplicate identity", res(f("") + "," + f("")), "resource m.f (file) field id: declared twice"},
		{"same path twice", res(f("") + `,{"module":"n","id":"g","type":"file","path":"/srv/x","content":"y"}`), "path:/srv/x is also declared by m.f"},
		{"bad module", res(`{"module":"a.b","id":"f","type":"file","path":"/srv/x","content":""}`), `field module: "a.b" is not a module name`},
		{"restart_on dangling", res(`{"module":"m","id":"s","type":"service","unit":"nginx","restart_on":["conf"]}`), `resource m.s (service) field restart_on: "conf" names no file, region or keys in this declaration`},
		{"restart_on other module dangling", res(f("") + `,{"module":"n","id":"s","type":"service","unit":"nginx","restart_on":["f"]}`), `"f" names no file, region or keys`},
		{"bad state", res(`{"module":"m","id":"s","type":"service","unit":"nginx","state":"started"}`), `field state: "started" is not one of running, stopped`},
		{"a JSON syntax error names its line and column", "{\"version\":1,\n \"resources\":[\n  {\"module\":\"m\" \"id\":\"x\"}]}", `after object key:value pair at line 3, column 17`},
		{"a wrong JSON type names its line and column", "{\"version\":\"1\",\"resources\":[]}", `field version: expected int, got JSON string at line 1, column 14`},
		{"region without content", res(`{"module":"m","id":"r","type":"region","path":"/etc/hosts"}`), `resource m.r (region) field content: missing`},
		{"region holding a marker", res(`{"module":"m","id":"r","type":"region","path":"/etc/hosts","content":"a\n# END mesh m.r\n"}`), `field content: line 2 is a region's marker (m.r)`},
		{"region holding another's marker", res(`{"module":"m","id":"r","type":"region","path":"/etc/hosts","content":"// BEGIN mesh x.y"}`), `line 1 is a region's marker (x.y)`},
		{"region comment with a blank", res(`{"module":"m","id":"r","type":"region","path":"/etc/hosts","content":"","comment":"# #"}`), `field comment: "# #" is not a comment leader`},
		{"region in a file declared whole", res(f("") + `,{"module":"m","id":"r","type":"region","path":"/srv/x","content":""}`), `field path: /srv/x is declared whole by m.f`},
		{"region and keys in one file", res(`{"module":"m","id":"r","type":"region","path":"/etc/x","content":""},{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"equals","set":{"a":"1"}}`), `field path: /etc/x is edited as a region by m.r too`},
		{"keys without format", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","set":{"a":"1"}}`), `field format: "" is not one of equals`},
		{"keys setting Match", res(`{"module":"m","id":"k","type":"keys","path":"/etc/ssh/sshd_config","format":"space","set":{"match":"all"}}`), `field set: match starts a conditional block, not a key`},
		{"keys setting nothing", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"equals","set":{}}`), `field set: 0 keys`},
		{"keys bad key", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"equals","set":{"a b":"1"}}`), `field set: "a b" is not a key`},
		{"keys value of two lines", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"equals","set":{"a":"1\n2"}}`), `field set: the value of a is not one line`},
		{"keys empty value, space format", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"Port":""}}`), `the value of Port is not one line`},
		{"keys one key twice without case", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"Port":"22","port":"23"}}`), `Port and port are one key in the space format`},
		{"keys one key by two", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"Port":"22"}},{"module":"n","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"PORT":"23"}}`), `field set: PORT in /etc/x is set by m.k too`},
		{"process name with a dot", res(`{"module":"m","id":"p","type":"process","name":"app.service","exec":["/opt/app"],"user":"app"}`), `field name: "app.service" is not a process's name`},
		{"process relative program", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["app"],"user":"app"}`), `field exec: "app": the program is an absolute, clean path`},
		{"process word with a blank", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["/opt/app","a b"],"user":"app"}`), `field exec: "a b" holds a character`},
		{"process word with a dollar", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["/opt/app","$HOME"],"user":"app"}`), `"$HOME" holds a character`},
		{"process as root", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["/opt/app"],"user":"root"}`), `field user: a process the mesh runs is never root`},
		{"process env value with a quote", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["/opt/app"],"user":"app","env":{"A":"x'y"}}`), `field env: the value of A holds a character`},
		{"process and a service of its unit", res(`{"module":"m","id":"p","type":"process","name":"app","exec":["/opt/app"],"user":"app"},{"module":"m","id":"s","type":"service","unit":"app.service"}`), `service:app.service is also declared by m.p`},
		{"keys in two formats", res(`{"module":"m","id":"k","type":"keys","path":"/etc/x","format":"space","set":{"Port":"22"}},{"module":"n","id":"k","type":"keys","path":"/etc/x","format":"equals","set":{"a":"1"}}`), `field format: /etc/x is read in the space format by m.k`},
		{"action without verify", `{"version":1,"resources":[{"module":"m","id":"a","type":"action","run":["/bin/true"]}]}`, "resource m.a (action) field verify: missing"},
		{"image not pinned", res(`{"module":"m","id":"c","type":"container","name":"app","image":"nginx:latest"}`), `field image: "nginx:latest" is not pinned by digest`},
		{"bad port", res(`{"module":"m","id":"c","type":"container","name":"app","image":"x@sha256:` + strings.Repeat("a", 64) + `","ports":["80"]}`), `field ports: "80" is not`},
		{"bad archive digest", res(`{"module":"m","id":"a","type":"archive","url":"obj://x","sha256":"ABC","destination":"/srv/t"}`), `field sha256: "ABC" is not 64 lower-case hex digits`},
		{"bad overlay key", res(`{"module":"m","id":"o","type":"overlay","interface":"wg0","address":"10.0.0.1/24","peers":[{"public_key":"eA==","allowed_ips":["10.0.0.2/32"]}]}`), "field peers[0].public_key: not a base64 WireGuard public key"},
		{"bad opening path", res(`{"module":"m","id":"o","type":"opening","port":22,"protocol":"tcp","path":"outgoing"}`), `field path: "outgoing" is not one of incoming, forwarded`},
		{"bad opening port", res(`{"module":"m","id":"o","type":"opening","port":0,"protocol":"tcp","path":"incoming"}`), `field port: 0 is out of range`},
		{"bad package", res(`{"module":"m","id":"p","type":"package","name":"-rf"}`), `field name: "-rf" is not a package name`},
		{"not an object", res(`[1]`), "resource #0: not a resource object"},
		{"duplicate key", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","path":"/etc/shadow","content":"x"}`), `resource m.f field path: given twice in one object`},
		{"case-folded duplicate", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","PATH":"/etc/shadow","content":"x"}`), `resource m.f field PATH: unknown field (field names are exact`},
		{"escaped duplicate", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","path":"/etc/shadow","content":"x"}`), `field path: given twice`},
		{"invalid utf-8", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"` + "\xff" + `"}`), "not valid UTF-8"},
		{"lone surrogate", res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"\ud800"}`), `\ud800 escapes half of a UTF-16 surrogate pair`},
		{"duplicate top-level", `{"version":1,"node":"a","node":"b","resources":[],"owns_nothing":true}`, `declaration field node: given twice`},
		{"duplicate env key", res(`{"module":"m","id":"c","type":"container","name":"c","image":"x@sha256:` + strings.Repeat("a", 64) + `","env":{"A":"1","A":"2"}}`), `field A: given twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := ParseTrusted([]byte(c.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", d)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\n does not contain %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "shapes: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestAccepted(t *testing.T) {
	for _, doc := range []string{
		`{"version":1,"resources":[],"owns_nothing":true}`,
		`{"version":1,"resources":[],"owns_nothing":true,"retire":true}`,
		res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":""}`),
		res(`{"module":"m","id":"f","type":"file","path":"/srv/x","content":"a","mode":"644","owner":"1000:1000"}`),
		res(`{"module":"m","id":"s","type":"service","unit":"getty@tty1"}`),
		res(`{"module":"m","id":"d","type":"directory","path":"/etc/systemd/system/nginx.service.d"}`),
		res(`{"module":"m","id":"d","type":"directory","path":"/etc/systemd/system/ngx-.service.d"}`),
		res(`{"module":"m","id":"d","type":"file","path":"/etc/systemd/system/nginx.service.d/override.conf","content":""}`),
		res(`{"module":"m","id":"c","type":"container","name":"c","image":"x@sha256:` + strings.Repeat("a", 64) + `","env":{"A":"1","a":"2","PATH":"/bin"}}`),
	} {
		if _, err := Parse([]byte(doc)); err != nil {
			t.Errorf("Parse(%s) = %v", doc, err)
		}
	}
}

// The protected set is refused through every shape, after names are
// normalised and paths resolved.
func TestProtectedSet(t *testing.T) {
	cases := []struct{ name, resource, want string }{
		{"agent unit bare", `{"module":"m","id":"s","type":"service","unit":"mesh-agent","state":"stopped"}`, "mesh-agent is the host's own unit"},
		{"agent unit suffixed", `{"module":"m","id":"s","type":"service","unit":"mesh-agent.service"}`, "the host's own unit"},
		{"executor unit template", `{"module":"m","id":"s","type":"service","unit":"mesh-executor@x.service"}`, "the host's own unit"},
		{"unit file", `{"module":"m","id":"f","type":"file","path":"/etc/systemd/system/mesh-executor.service","content":""}`, "host's own unit or service entry (mesh-executor.service)"},
		{"drop-in directory", `{"module":"m","id":"d","type":"directory","path":"/etc/systemd/system/mesh-agent.service.d"}`, "(mesh-agent.service.d)"},
		{"drop-in file", `{"module":"m","id":"f","type":"file","path":"/etc/systemd/system/mesh-agent.service.d/override.conf","content":"[Service]\nUser=root\n"}`, "(mesh-agent.service.d)"},
		{"vendor unit", `{"module":"m","id":"f","type":"file","path":"/lib/systemd/system/mesh-executor.service","content":""}`, "host's own unit"},
		{"prefix drop-in", `{"module":"m","id":"f","type":"file","path":"/etc/systemd/system/mesh-.service.d/zz.conf","content":"[Service]\nExecStart=/bin/true\n"}`, `the drop-in directory of every service whose name starts with "mesh-"`},
		{"prefix drop-in dir", `{"module":"m","id":"d","type":"directory","path":"/run/systemd/system/nox-.service.d"}`, `starts with "nox-"`},
		{"type drop-in", `{"module":"m","id":"f","type":"file","path":"/etc/systemd/system/service.d/zz.conf","content":""}`, "the drop-in directory of every service"},
		{"wants link", `{"module":"m","id":"f","type":"file","path":"/etc/systemd/system/multi-user.target.wants/mesh-agent.service","content":""}`, "host's own unit"},
		{"wants directory", `{"module":"m","id":"d","type":"directory","path":"/etc/systemd/system/multi-user.target.wants","mode":"0777"}`, "a directory of the init's own"},
		{"openrc script", `{"module":"m","id":"f","type":"file","path":"/etc/init.d/mesh-executor","content":""}`, "host's own unit"},
		{"runit service", `{"module":"m","id":"f","type":"file","path":"/etc/sv/mesh-agent/run","content":""}`, "host's own unit"},
		{"s6 service", `{"module":"m","id":"d","type":"directory","path":"/etc/s6/sv/mesh-executor"}`, "host's own unit"},
		{"init.rc", `{"module":"m","id":"f","type":"file","path":"/system/etc/init/mesh-executor.rc","content":""}`, "host's own unit"},
		{"binary", `{"module":"m","id":"f","type":"file","path":"/usr/bin/mesh-executor","content":""}`, "the host's binary /usr/bin/mesh-executor"},
		{"bin dir", `{"module":"m","id":"d","type":"directory","path":"/usr/local/bin","mode":"0777"}`, "contains the host's binary"},
		{"bundle", `{"module":"m","id":"f","type":"file","path":"/usr/lib/nox-mesh-host/launch","content":""}`, "inside the host's /usr/lib/nox-mesh-host"},
		{"state", `{"module":"m","id":"f","type":"file","path":"/var/lib/mesh-host/executor/pinned.key","content":""}`, "inside the host's /var/lib/mesh-host"},
		{"socket dir", `{"module":"m","id":"d","type":"directory","path":"/run/mesh-host"}`, "inside the host's /run/mesh-host"},
		{"ancestor of state", `{"module":"m","id":"d","type":"directory","path":"/var/lib","mode":"0777"}`, "contains the host's /var/lib/mesh-host"},
		{"archive over etc", `{"module":"m","id":"a","type":"archive","url":"obj://` + strings.Repeat("a", 64) + `","sha256":"` + strings.Repeat("a", 64) + `","destination":"/etc"}`, "/etc contains the host's /etc/mesh-host"},
		{"archive into state", `{"module":"m","id":"a","type":"archive","url":"obj://` + strings.Repeat("a", 64) + `","sha256":"` + strings.Repeat("a", 64) + `","destination":"/var/lib/mesh-host/agent"}`, "inside the host's"},
		{"container mount", `{"module":"m","id":"c","type":"container","name":"c","image":"x@sha256:` + strings.Repeat("a", 64) + `","mounts":["/var/lib/mesh-host:/x"]}`, "inside the host's /var/lib/mesh-host"},
		{"container mount root", `{"module":"m","id":"c","type":"container","name":"c","image":"x@sha256:` + strings.Repeat("a", 64) + `","mounts":["/:/host"]}`, "the root directory"},
		{"container mount var", `{"module":"m","id":"c","type":"container","name":"c","image":"x@sha256:` + strings.Repeat("a", 64) + `","mounts":["/var:/host"]}`, "contains the host's /var/lib/mesh-host"},
		{"region in the agent's unit", `{"module":"m","id":"r","type":"region","path":"/usr/lib/systemd/system/mesh-agent.service","content":"User=root\n"}`, "host's own unit"},
		{"region in the bundle", `{"module":"m","id":"r","type":"region","path":"/usr/lib/nox-mesh-host/foundation.lock","content":""}`, "inside the host's /usr/lib/nox-mesh-host"},
		{"keys in the executor's unit", `{"module":"m","id":"k","type":"keys","path":"/etc/systemd/system/mesh-executor.service.d/x.conf","format":"equals","set":{"ExecStart":"/bin/sh"}}`, "(mesh-executor.service.d)"},
		{"keys in the agent's config", `{"module":"m","id":"k","type":"keys","path":"/var/lib/mesh-host/agent/config.json","format":"equals","set":{"a":"b"}}`, "inside the host's /var/lib/mesh-host"},
		{"process as the agent's unit", `{"module":"m","id":"p","type":"process","name":"mesh-agent","exec":["/bin/sleep","1"],"user":"app"}`, "mesh-agent is the host's own unit"},
		{"process as the agent's user", `{"module":"m","id":"p","type":"process","name":"app","exec":["/bin/sleep","1"],"user":"mesh-agent"}`, "mesh-agent is the host's agent account"},
		{"agent user", `{"module":"m","id":"u","type":"user","name":"mesh-agent","shell":"/bin/sh"}`, "mesh-agent is the host's agent account"},
		{"agent group", `{"module":"m","id":"u","type":"user","name":"mallory","groups":["mesh-agent"]}`, "mesh-agent is the host's agent account"},
		{"home in state", `{"module":"m","id":"u","type":"user","name":"mallory","home":"/var/lib/mesh-host/agent"}`, "inside the host's"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTrusted([]byte(res(c.resource)))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\n does not contain %q", err, c.want)
			}
			if !errors.As(err, new(*Error)) || strings.Contains(err.Error(), "protected set") != errors.Is(err, ErrProtected) {
				t.Errorf("not a *shapes.Error wrapping ErrProtected: %T %v", err, err)
			}
		})
	}
}

// A path that is harmless as written but leads through a symlink into the
// host's state is refused by CheckProtected with the machine's resolver.
func TestProtectedThroughResolver(t *testing.T) {
	links := map[string]string{"/srv/innocent": "/var/lib/mesh-host/executor", "/data": "/data"}
	resolve := func(p string) (string, error) {
		for from, to := range links {
			if within(p, from) {
				return to + strings.TrimPrefix(p, from), nil
			}
		}
		return p, nil
	}
	d, err := Parse([]byte(res(`{"module":"m","id":"f","type":"file","path":"/srv/innocent/pinned.key","content":""}`)))
	if err != nil {
		t.Fatalf("lexically fine, yet refused: %v", err)
	}
	err = CheckProtected(d, resolve)
	if err == nil || !strings.Contains(err.Error(), "/var/lib/mesh-host/executor/pinned.key is inside the host's /var/lib/mesh-host") {
		t.Fatalf("CheckProtected = %v", err)
	}
	// The host's own directory moved by a link: /var/lib -> /data/var/lib.
	links = map[string]string{"/var/lib": "/data/var/lib"}
	d, _ = Parse([]byte(res(`{"module":"m","id":"f","type":"file","path":"/data/var/lib/mesh-host/x","content":""}`)))
	if err := CheckProtected(d, resolve); err == nil || !strings.Contains(err.Error(), "(at /data/var/lib/mesh-host)") {
		t.Fatalf("CheckProtected through a moved state directory = %v", err)
	}
}

func TestDerive(t *testing.T) {
	cases := []struct {
		lines []Outcome
		want  Outcome
	}{
		{nil, Unchanged},
		{[]Outcome{Unchanged, Applied, Removed}, Applied},
		{[]Outcome{Restored, Forgotten}, Restored},
		{[]Outcome{Applied, Repaired}, Repaired},
		{[]Outcome{Applied, Held, Kept}, Held},
		{[]Outcome{Held, HeldChanged}, HeldChanged},
		{[]Outcome{Unchanged, Failed, Applied}, Failed},
	}
	for _, c := range cases {
		var lines []Line
		for _, o := range c.lines {
			lines = append(lines, Line{Outcome: o})
		}
		if got := Derive(lines); got != c.want {
			t.Errorf("Derive(%v) = %s, want %s", c.lines, got, c.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]int64{"0644": 0o644, "644": 0o644, "4755": 0o4755, "7777": 0o7777, "0000": 0, "08": -1, "": -1, "12345": -1, "0o644": -1} {
		m, ok := ParseMode(s)
		if (want < 0) == ok || (ok && int64(m) != want) {
			t.Errorf("ParseMode(%q) = %o, %v", s, m, ok)
		}
	}
}

// anyResource, the one-pass decoding of every shape, must carry each
// shape's fields under the same name and Go type, and nothing else.
func TestUnionMatchesShapes(t *testing.T) {
	union := map[string]reflect.Type{}
	ut := reflect.TypeOf(anyResource{})
	for i := 0; i < ut.NumField(); i++ {
		f := ut.Field(i)
		if f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		union[name] = f.Type
	}
	used := map[string]bool{}
	for typ, mk := range shapeTable {
		st := reflect.TypeOf(mk()).Elem()
		for i := 0; i < st.NumField(); i++ {
			f := st.Field(i)
			if f.Anonymous {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			used[name] = true
			if union[name] != f.Type {
				t.Errorf("%s.%s is %v in the shape, %v in anyResource", typ, name, f.Type, union[name])
			}
		}
		// Every field survives the copy into the shape.
		u := anyResource{Base: Base{Type: typ}}
		uv := reflect.ValueOf(&u).Elem()
		for i := 0; i < uv.NumField(); i++ {
			if f := uv.Field(i); f.Kind() == reflect.String && ut.Field(i).Name != "Base" {
				f.SetString("x-" + ut.Field(i).Name)
			}
		}
		r, ok := u.shape()
		if !ok {
			t.Fatalf("no shape for %s", typ)
		}
		rv := reflect.ValueOf(r).Elem()
		for i := 0; i < rv.NumField(); i++ {
			if f := rv.Field(i); f.Kind() == reflect.String && rv.Type().Field(i).Name != "Base" && f.String() != "x-"+rv.Type().Field(i).Name {
				t.Errorf("%s.%s not copied from anyResource (got %q)", typ, rv.Type().Field(i).Name, f.String())
			}
		}
	}
	for name := range union {
		if !used[name] {
			t.Errorf("anyResource has %q, which no shape has", name)
		}
	}
}

func TestCharsets(t *testing.T) {
	cases := []struct {
		c    *charset
		s    string
		want bool
	}{
		{nameRe, "alice", true}, {nameRe, "_svc.x-1", true}, {nameRe, "-x", false}, {nameRe, ".x", false}, {nameRe, "", false}, {nameRe, strings.Repeat("a", 65), false}, {nameRe, "a b", false},
		{unitRe, `getty@tty1.service`, true}, {unitRe, `dev-disk-by\x2dlabel.mount`, true}, {unitRe, "a/b", false}, {unitRe, "a b", false},
		{packageRe, "libc6", true}, {packageRe, "g++", true}, {packageRe, "-rf", false},
		{versionRe, "1:2.36-9+deb12u4", true}, {versionRe, "1.0~rc1", true}, {versionRe, "1 0", false},
		{ifaceRe, "wg-mesh", true}, {ifaceRe, "a23456789012345", true}, {ifaceRe, "a234567890123456", false},
		{envKeyRe, "PATH", true}, {envKeyRe, "_X1", true}, {envKeyRe, "1X", false}, {envKeyRe, "A-B", false},
	}
	for _, c := range cases {
		if got := c.c.MatchString(c.s); got != c.want {
			t.Errorf("%q: %v, want %v", c.s, got, c.want)
		}
	}
	if !pinnedImage("r/app@sha256:"+strings.Repeat("a", 64)) || pinnedImage("r/app@sha256:"+strings.Repeat("A", 64)) || pinnedImage("r/app:latest") {
		t.Error("pinnedImage")
	}
}

func TestDeriveMark(t *testing.T) {
	cases := []struct {
		marks []Mark
		want  Mark
	}{
		{nil, MarkOK},
		{[]Mark{MarkOK, MarkKept}, MarkKept},
		{[]Mark{MarkKept, MarkUnknown, MarkOK}, MarkUnknown},
		{[]Mark{MarkOK, MarkFailed, MarkKept}, MarkFailed},
	}
	for _, c := range cases {
		var fs []Finding
		for _, m := range c.marks {
			fs = append(fs, Finding{Mark: m})
		}
		if got := DeriveMark(fs); got != c.want {
			t.Errorf("DeriveMark(%v) = %s, want %s", c.marks, got, c.want)
		}
	}
}

// An archive's URL is obj://<its sha256> or file:///CLEAN-PATH: refused
// otherwise by the archive step and, before signing, the control side —
// not by the parse, which reads targets an earlier release saved.
func TestAnArchiveURLIsOneAnArchiveComesBy(t *testing.T) {
	sum := strings.Repeat("a", 64)
	for url, say := range map[string]string{
		"obj://" + sum:                     "",
		"file:///srv/a.tgz":                "",
		"obj://themes/t1":                  `url "obj://themes/t1" is not obj:// and the archive's sha256`,
		"obj://" + strings.Repeat("b", 64): "is not obj:// and the archive's sha256",
		"file://tmp/a.tgz":                 `url "file://tmp/a.tgz" is not file:// and a clean absolute path`,
		"file://localhost/tmp/a.tgz":       "is not file:// and a clean absolute path",
		"file:///srv/../tmp/a.tgz":         "is not file:// and a clean absolute path",
		"https://example.com/a.tgz":        `url "https://example.com/a.tgz" is neither obj://<sha256>`,
	} {
		a := &Archive{Base: Base{Module: "m", ID: "a", Type: TypeArchive}, URL: url, SHA256: sum, Destination: "/srv/t"}
		err := a.CheckURL()
		if say == "" && err != nil || say != "" && (err == nil || !strings.Contains(err.Error(), say)) {
			t.Errorf("%s: %v", url, err)
		}
		// Over the link, obj:// alone: a file:// one is a file on the
		// machine, which only root's local file or bundle names.
		if strings.HasPrefix(url, "file://") && say == "" {
			say = "a file:// archive may come from a local file or the bundle, not over the link"
		}
		if err := a.CheckLinkURL(); say == "" && err != nil || say != "" && (err == nil || !strings.Contains(err.Error(), say)) {
			t.Errorf("over the link, %s: %v", url, err)
		}
	}
}
