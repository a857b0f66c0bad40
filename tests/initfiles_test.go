package tests

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
	"github.com/nox-mesh/nox-mesh-host/launcher"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// initCommand is how one init file starts the executor: the launcher's
// arguments, and serve's after "--".
type initCommand struct {
	file          string
	launch, serve []string
}

// properties are what Android's init puts in place of ${...}: a test
// value for each, of the kind the module sets.
var properties = map[string]string{
	"${vendor.mesh_host.agent_uid}":   "10123",
	"${vendor.mesh_host.agent_state}": "/data/data/org.example.mesh/files/agent",
}

// startLine finds, in text, the command that runs mesh-launch with serve
// after "--", its continuation lines joined, and splits it.
func startLine(t *testing.T, file, text string) initCommand {
	t.Helper()
	text = strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.Join(strings.Fields(line), " ")
		i := strings.Index(line, " -- serve ")
		if i < 0 {
			continue
		}
		head := line[:i]
		switch {
		case strings.Contains(head, "mesh-launch "):
			head = head[strings.Index(head, "mesh-launch ")+len("mesh-launch "):]
		case strings.Contains(head, `command_args="`): // OpenRC
			head = head[strings.Index(head, `command_args="`)+len(`command_args="`):]
		default:
			continue
		}
		tail := strings.TrimRight(strings.TrimSpace(line[i+len(" -- "):]), `"`)
		serve := strings.Fields(tail)[1:] // after "serve"
		for j, a := range serve {
			if v, ok := properties[a]; ok {
				serve[j] = v
			}
		}
		return initCommand{file: file, launch: strings.Fields(head), serve: serve}
	}
	t.Fatalf("%s: no line starts mesh-launch … -- serve …", file)
	return initCommand{}
}

// parsed parses args with fs and returns what they set, by flag name, as
// written; a flag the binary does not have, or an argument left over,
// fails the test.
func parsed(t *testing.T, what string, fs *flag.FlagSet, args []string) map[string]string {
	t.Helper()
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if fs.NArg() > 0 {
		t.Fatalf("%s: %q left over after the flags", what, fs.Args())
	}
	// The values as written (a flag.Func's Value says nothing of its own).
	set := map[string]string{}
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if b, ok := fs.Lookup(name).Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && !hasValue {
			value, hasValue = "true", true
		}
		if !hasValue {
			i++
			value = args[i]
		}
		set[name] = value
	}
	return set
}

// Every init file starts the launcher and serve with flags the binaries
// have, each executor with the same state directory as its launcher; the
// Linux inits with the package's paths and user, Android's with its own.
// The launcher's notice is beside the executor's socket under the name
// the agent reads and the executor's socket directory may hold.
func TestTheLaunchersNoticeIsBesideTheSocket(t *testing.T) {
	if want := filepath.Join(wire.SocketDir, wire.LauncherNotice); launcher.NoticeFile != want || filepath.Dir(wire.SocketPath) != wire.SocketDir {
		t.Fatalf("launcher.NoticeFile %s, want %s", launcher.NoticeFile, want)
	}
}

func TestInitFilesStartTheBinariesWithTheirFlags(t *testing.T) {
	files := map[string]bool{ // true: Android
		"../init/systemd/mesh-executor.service": false,
		"../init/openrc/mesh-executor":          false,
		"../init/runit/mesh-executor/run":       false,
		"../init/s6/mesh-executor/run":          false,
		"../init/android/mesh-host.rc":          true,
	}
	for file, android := range files {
		t.Run(strings.TrimPrefix(file, "../init/"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			c := startLine(t, file, string(data))
			l := parsed(t, "mesh-launch", launcher.Flags(io.Discard), c.launch)
			s := parsed(t, "mesh-executor serve", cli.ServeFlags(io.Discard), c.serve)
			if l["state"] == "" || l["state"] != s["state"] {
				t.Errorf("the launcher's state %q, serve's %q: one directory", l["state"], s["state"])
			}
			if !android {
				want := map[string]string{"state": "/var/lib/mesh-host/executor", "socket": "/run/mesh-host/executor.sock", "agent-user": "mesh-agent"}
				for k, v := range want {
					if s[k] != v {
						t.Errorf("serve --%s %q, want %q", k, s[k], v)
					}
				}
				return
			}
			// Android: a partial host, the app's numeric uid, the agent's
			// state kept out of declarations' reach, no user made, the
			// launcher's notice beside the socket (the agent reads it there).
			if s["partial"] != "true" || s["agent-uid"] == "" || s["agent-state"] == "" {
				t.Errorf("serve on Android: %v", s)
			}
			if v, ok := l["agent-user"]; !ok || v != "" {
				t.Errorf("mesh-launch on Android makes a user: --agent-user %q (set: %v)", v, ok)
			}
			// Named as the agent reads it, and as the executor takes the
			// socket's directory holding it (wire.LauncherNotice).
			if filepath.Dir(l["notice"]) != filepath.Dir(s["socket"]) || filepath.Base(l["notice"]) != wire.LauncherNotice {
				t.Errorf("the launcher's notice %q is not beside the socket %q, named %s", l["notice"], s["socket"], wire.LauncherNotice)
			}
			if l["executor"] != "/system/bin/mesh-executor" || l["agent"] != "/system/bin/mesh-agent" {
				t.Errorf("mesh-launch on Android: %v", l)
			}
		})
	}
}

// Android's init file and docs/android.md give the root helper the same
// command: the same flags with the same values (init takes the uid and
// the app's directory from properties; the page shows examples).
func TestAndroidInitFileMatchesItsDocs(t *testing.T) {
	rc, err := os.ReadFile("../init/android/mesh-host.rc")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../docs/android.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sh\n# the root helper.*?```").Find(page)
	if block == nil {
		t.Fatal("docs/android.md: no sh block for the root helper")
	}
	fromRC := startLine(t, "mesh-host.rc", string(rc))
	fromDoc := startLine(t, "docs/android.md", string(block))
	for _, side := range []struct {
		name     string
		fs       func() *flag.FlagSet
		rc, docs []string
	}{
		{"mesh-launch", func() *flag.FlagSet { return launcher.Flags(io.Discard) }, fromRC.launch, fromDoc.launch},
		{"mesh-executor serve", func() *flag.FlagSet { return cli.ServeFlags(io.Discard) }, fromRC.serve, fromDoc.serve},
	} {
		r := parsed(t, side.name+" in mesh-host.rc", side.fs(), side.rc)
		d := parsed(t, side.name+" in docs/android.md", side.fs(), side.docs)
		for k, v := range r {
			dv, ok := d[k]
			switch {
			case !ok:
				t.Errorf("%s: mesh-host.rc gives --%s, docs/android.md does not", side.name, k)
			case (k == "agent-uid" || k == "agent-state") && dv == "":
				t.Errorf("%s: docs/android.md gives --%s no value", side.name, k)
			case k != "agent-uid" && k != "agent-state" && dv != v:
				t.Errorf("%s --%s: mesh-host.rc %q, docs/android.md %q", side.name, k, v, dv)
			}
		}
		for k := range d {
			if _, ok := r[k]; !ok {
				t.Errorf("%s: docs/android.md gives --%s, mesh-host.rc does not", side.name, k)
			}
		}
	}
}

// Every init that starts the agent has mesh-launch count each start as
// root first, with the executor's launch state: the agent of an upgrade
// that crash-loops is rolled back only if its starts are counted. systemd
// runs it as ExecStartPre=+ (root, outside the agent's sandbox); the
// others exec the agent through it, so every respawn passes there too.
func TestAgentStartsAreCounted(t *testing.T) {
	for _, file := range []string{
		"../init/systemd/mesh-agent.service",
		"../init/openrc/mesh-agent",
		"../init/runit/mesh-agent/run",
		"../init/s6/mesh-agent/run",
	} {
		t.Run(strings.TrimPrefix(file, "../init/"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var args []string
			for _, line := range strings.Split(string(data), "\n") {
				line = strings.TrimRight(strings.TrimSpace(line), `"`)
				if strings.HasPrefix(line, "#") {
					continue
				}
				if i := strings.Index(line, "mesh-launch agent-start "); i >= 0 {
					args = strings.Fields(line[i+len("mesh-launch agent-start "):])
				} else if i := strings.Index(line, `command_args="agent-start `); i >= 0 {
					args = strings.Fields(line[i+len(`command_args="agent-start `):])
				}
			}
			if args == nil {
				t.Fatal("no mesh-launch agent-start: the agent's starts are not counted")
			}
			var agent []string
			if i := slices.Index(args, "--"); i >= 0 {
				args, agent = args[:i], args[i+1:]
			}
			l := parsed(t, "mesh-launch agent-start", launcher.AgentStartFlags(io.Discard), args)
			if l["state"] != "/var/lib/mesh-host/executor" {
				t.Errorf("agent-start --state %q: the executor's launch state is /var/lib/mesh-host/executor", l["state"])
			}
			switch {
			case strings.HasSuffix(file, ".service"):
				if !strings.Contains(string(data), "ExecStartPre=+/usr/bin/mesh-launch agent-start ") || !strings.Contains(string(data), "StartLimitIntervalSec=0") {
					t.Error("systemd: agent-start is not run as root before each start, or the init gives up restarting on its own")
				}
				if agent != nil {
					t.Errorf("systemd: agent-start execs %v; the unit starts the agent itself, confined", agent)
				}
			case len(agent) == 0 || agent[0] != "/usr/bin/mesh-agent" || !slices.Contains(agent, "--user"):
				t.Errorf("agent-start is followed by %v, not the agent dropping to its user", agent)
			}
		})
	}
}

// The unit files, the init scripts and SECURITY.md cite only documents in
// the repository: a unit's Documentation= names a document the packages
// install from the repository (file:/usr/share/doc/nox-mesh-host/…), and
// every *.md named in them is a file here.
func TestCitedDocumentsAreInTheRepository(t *testing.T) {
	nfpm, err := os.ReadFile("../packaging/nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../init/*/*")
	more, _ := filepath.Glob("../init/*/*/*")
	files = append(append(files, more...), "../SECURITY.md")
	mdRe := regexp.MustCompile("[A-Za-z0-9_./-]+\\.md\\b")
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.IsDir() {
			continue
		}
		data, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(data), "\n") {
			if doc, ok := strings.CutPrefix(line, "Documentation="); ok {
				for _, uri := range strings.Fields(doc) {
					p, ok := strings.CutPrefix(uri, "file:/usr/share/doc/nox-mesh-host/")
					if !ok {
						t.Errorf("%s: Documentation=%s is not a document the packages install", f, uri)
						continue
					}
					if !strings.Contains(string(nfpm), "dst: /usr/share/doc/nox-mesh-host/"+p) {
						t.Errorf("%s cites %s, which the packages do not install", f, uri)
					}
				}
			}
			if strings.Contains(line, "http://") || strings.Contains(line, "https://") {
				t.Errorf("%s cites the web: %s", f, strings.TrimSpace(line))
			}
		}
		for _, m := range mdRe.FindAllString(string(data), -1) {
			m = strings.TrimPrefix(m, "/usr/share/doc/nox-mesh-host/") // installed from the repository: checked above
			found := false
			for _, base := range []string{"..", "../docs", filepath.Dir(f)} {
				if _, err := os.Stat(filepath.Join(base, m)); err == nil {
					found = true
				}
			}
			if !found {
				t.Errorf("%s cites %s, which is not in the repository", f, m)
			}
		}
	}
}
