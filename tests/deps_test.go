package tests

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The import rules of the folders. This is a statement of policy: each rule
// says why. DO NOT CHANGE THIS DATA TO FIX BUILDS; change it when the design
// changes, in a commit that says so.
const module = "github.com/nox-mesh/nox-mesh-host"

type rule struct {
	pkg    string // a package, or a prefix ending in "/..."
	banned string // an import path, or a prefix ending in "/..."
	why    string
	// direct: only the package's own imports count. The standard library
	// itself imports os and syscall (fmt does), so "never touches the
	// machine" is a rule about what the package's own code calls.
	direct bool
}

// except lists, per rule (by its pkg and banned), imports it lets through
// although banned matches them.
var except = map[[2]string][]string{
	{"launcher/...", module + "/executor/..."}: {module + "/executor/command"},
}

var rules = []rule{
	// clock is how a node reads the time: a leaf, so every part can.
	{"clock", module + "/...", "clock imports nothing of ours: the agent, the executor, the launcher and wire all read the time through it", false},
	// statedir holds and writes a state directory for the agent and the
	// control side alike: neither side's.
	{"statedir", module + "/agent/...", "statedir is how both sides hold a state directory: it imports neither", false},
	{"statedir", module + "/control/...", "statedir is how both sides hold a state directory: it imports neither", false},
	{"statedir", module + "/executor/...", "statedir is how both sides hold a state directory: it imports neither", false},
	// shapes is the vocabulary: pure data.
	{"shapes/...", module + "/...", "shapes imports nothing of ours: everything else depends on it", false},
	{"shapes/...", "os", "shapes never touches the machine", true},
	{"shapes/...", "os/exec", "shapes never runs anything", true},
	{"shapes/...", "syscall", "shapes makes no system calls", true},
	{"shapes/...", "golang.org/x/sys/...", "shapes makes no system calls", false},
	{"shapes/...", "net", "shapes opens no connection", true},
	// wire carries bytes across boundaries and decides nothing.
	{"wire/...", module + "/executor/...", "wire imports only shapes and clock of ours", false},
	{"wire/...", module + "/agent/...", "wire imports only shapes and clock of ours", false},
	{"wire/...", module + "/control/...", "wire imports only shapes and clock of ours", false},
	// link is the contract of the NATS link (subjects, streams, isolation,
	// messages, signatures, the pinned TLS) that the agent and the control
	// side both import, so they cannot drift apart: it imports neither, and
	// connects nowhere.
	{"link/...", module + "/agent/...", "link is the contract both sides import: it imports neither", false},
	{"link/...", module + "/control/...", "link is the contract both sides import: it imports neither", false},
	{"link/...", module + "/executor/...", "link is the agent's and the control side's, never root's", false},
	{"link/...", "github.com/nats-io/nats.go/...", "link names the link; the agent and the control side hold the clients", false},
	{"link/...", "os", "link touches no file", true},
	{"link/...", "net", "link opens no connection", true},
	{"executor/...", module + "/link/...", "the executor has no part in the NATS link", false},
	{"cmd/mesh-executor", module + "/link/...", "the executor has no part in the NATS link", false},
	// The split: no root process links the agent's code, and the reverse.
	{"agent/...", module + "/executor/...", "the agent is trusted for nothing and holds no root-only code", false},
	{"executor/...", module + "/agent/...", "no root process links the agent's code", false},
	{"executor/...", module + "/control/...", "the control side is never needed on a node", false},
	{"cmd/mesh-executor", module + "/agent/...", "no root process links the agent's code", false},
	{"cmd/mesh-executor", module + "/control/...", "the control side is never needed on a node", false},
	{"launcher/...", module + "/agent/...", "the launcher starts, counts and rolls back; nothing else", false},
	{"launcher/...", module + "/executor/...", "the launcher must work where the executor does not: it links nothing of it but executor/command, the leaf that says how root runs a program (see except)", false},
	// The small privileged core opens no connection off the machine.
	{"executor/...", "github.com/nats-io/...", "the executor links no broker client", false},
	{"executor/...", "database/sql", "the executor links no database client", false},
	{"executor/...", "net/http", "the executor opens no connection off the machine (no HTTP client)", false},
	{"executor/...", "crypto/tls", "the executor opens no connection off the machine (no TLS client)", false},
	{"executor/...", "net/rpc", "the executor opens no connection off the machine", false},
	{"executor/...", "net/smtp", "the executor opens no connection off the machine", false},
	{"cmd/mesh-executor", "github.com/nats-io/...", "the executor binary links no broker client", false},
	{"cmd/mesh-executor", "net/http", "the executor binary opens no connection off the machine", false},
	{"cmd/mesh-executor", "crypto/tls", "the executor binary opens no connection off the machine", false},
	// One place says how root runs a program.
	{"executor/command", module + "/...", "command is how root runs a program: it imports nothing of ours, so every part of the executor can use it", false},
	// Tests stay in tests.
	{"...", "testing", "no production package imports testing", false},
}

// onlyIn lists imports that, within pkg, only the packages named may make
// directly: the rest go through them.
var onlyIn = []struct {
	pkg, imp string
	allowed  []string
	why      string
}{
	{"executor/...", "os/exec", []string{"executor/command"},
		"root runs a program through executor/command (a fixed search path, never the inherited PATH; an environment of its own; its process group killed whole), a declared action too (command.Action, by the rules for actions in docs/declaration.md)"},
}

func match(pattern, path string) bool {
	if pattern == "..." {
		return true
	}
	if strings.HasSuffix(pattern, "/...") {
		p := strings.TrimSuffix(pattern, "/...")
		return path == p || strings.HasPrefix(path, p+"/")
	}
	return path == pattern
}

// listDeps maps each package of the module to its transitive imports.
func listDeps(t *testing.T, withTests, direct bool) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", `{{.ImportPath}} {{join .Deps " "}}`}
	if direct {
		args = []string{"list", "-f", `{{.ImportPath}} {{join .Imports " "}}`}
	}
	if withTests {
		args = append(args, "-test")
	}
	args = append(args, module+"/...")
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			m[f[0]] = f[1:]
		}
	}
	return m
}

func TestImportRules(t *testing.T) {
	deps, imports := listDeps(t, false, false), listDeps(t, false, true)
	if len(deps) < 5 {
		t.Fatalf("go list found only %d packages", len(deps))
	}
	for pkg := range deps {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		if strings.HasPrefix(rel, "tests") {
			continue
		}
		for _, r := range rules {
			if !match(r.pkg, rel) {
				continue
			}
			ds := deps[pkg]
			if r.direct {
				ds = imports[pkg]
			}
			for _, d := range ds {
				if match(r.banned, d) && !(strings.HasSuffix(r.banned, "/...") && d == pkg) && !slices.Contains(except[[2]string{r.pkg, r.banned}], d) {
					t.Errorf("%s imports %s: %s", rel, d, r.why)
				}
			}
		}
		for _, o := range onlyIn {
			if match(o.pkg, rel) && !slices.Contains(o.allowed, rel) && slices.Contains(imports[pkg], o.imp) {
				t.Errorf("%s imports %s: %s", rel, o.imp, o.why)
			}
		}
	}
}

// Each binary's dependency list is checked in, so a new dependency shows
// up in review. `make deps` writes them.
func TestBinaryDepsCheckedIn(t *testing.T) {
	bins, _ := filepath.Glob("../cmd/*")
	if len(bins) == 0 {
		t.Fatal("no binaries under cmd/")
	}
	for _, dir := range bins {
		name := filepath.Base(dir)
		want, err := os.ReadFile(filepath.Join(dir, "deps.txt"))
		if err != nil {
			t.Errorf("cmd/%s/deps.txt: %v (run make deps)", name, err)
			continue
		}
		cmd := exec.Command("go", "list", "-deps", "./cmd/"+name)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		got, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./cmd/%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("cmd/%s depends on something new or dropped something; review the difference, then run make deps:\n%s", name, diff(string(want), string(got)))
		}
	}
}

func diff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l := range mb {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	for l := range ma {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	return strings.Join(out, "\n")
}

// Every module a binary links is explained in docs/dependencies.md.
func TestEveryModuleExplained(t *testing.T) {
	doc, err := os.ReadFile("../docs/dependencies.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"mesh-executor", "mesh-agent", "mesh-launch", "mesh-control"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}}{{end}}{{end}}", "../cmd/"+c).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range strings.Fields(string(out)) {
			if !strings.Contains(string(doc), "`"+m+"`") {
				t.Errorf("%s links %s, which docs/dependencies.md does not explain", c, m)
			}
		}
	}
}
