package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/ports"
)

// bin holds the three binaries, built once, stamped with one build id as a
// release would be.
var bin string

func TestMain(m *testing.M) {
	if sock := os.Getenv("E2E_DIAL"); sock != "" {
		// A child standing in for another local user: can it speak to the
		// executor? Exit 0 only if the executor answered its hello.
		os.Exit(dialProbe(sock))
	}
	dir, err := os.MkdirTemp("", "e2e-bin-")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755) // the agent, as nobody, runs from here
	bin = dir
	for _, c := range []string{"mesh-executor", "mesh-agent", "mesh-control"} {
		b := exec.Command("go", "build", "-ldflags", "-X main.version=e2e -X main.build=e2e", "-o", filepath.Join(dir, c), "./cmd/"+c)
		b.Dir = "../.."
		b.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := b.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// mesh is a control side with its embedded broker, an executor as root and
// an agent as an unprivileged user, all real processes on loopback.
type mesh struct {
	t     *testing.T
	base  string
	ctl   string
	state string
	tree  string
	sock  string
	port  int
	procs []*exec.Cmd
	// from, when it names a binary, is the directory it runs from instead
	// of bin: a previous release's (skew_test.go).
	from map[string]string
}

// binary is the path the mesh runs name from.
func (m *mesh) binary(name string) string {
	if d := m.from[name]; d != "" {
		return filepath.Join(d, name)
	}
	return filepath.Join(bin, name)
}

// freePort is a loopback port for a server the test starts.
func freePort(t *testing.T) int {
	p, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (m *mesh) run(name string, args ...string) string {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.binary(name), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		m.t.Fatalf("%s %v: %v\n%s%s", name, args, err, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String())
}

// start runs a daemon for the test's lifetime, its output in the log.
func (m *mesh) start(name string, cred *syscall.Credential, args ...string) *exec.Cmd {
	m.t.Helper()
	cmd := startLogged(m, name, m.binary(name), cred, args...)
	m.procs = append(m.procs, cmd)
	return cmd
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newMesh is a mesh with node n1 registered by hand (mesh-control node
// add, identity files installed as a person would): the link's tests.
// Enrolment's tests start from newBareMesh and enrol.
func newMesh(t *testing.T) *mesh {
	m := newBareMesh(t)
	agentConf := m.addNode()
	m.startExecutor()
	m.startAgent("--config", agentConf)
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	return m
}

// addNode registers n1 by hand (mesh-control node add) and installs the
// executor's identity as a person would; it returns the agent's config.
func (m *mesh) addNode() string {
	m.t.Helper()
	agentConf := filepath.Join(m.base, "agent.json")
	m.run("mesh-control", "node", "add", "n1", "--dir", m.ctl, "--out", agentConf)
	// The executor pins what the control side printed for it: root's file.
	id, err := os.ReadFile(filepath.Join(m.base, "executor-identity.json"))
	if err != nil {
		m.t.Fatal(err)
	}
	os.WriteFile(filepath.Join(m.state, "identity.json"), id, 0o600)
	return agentConf
}

// newBareMesh is the control side serving, and the directories of one
// machine; nothing runs on the machine yet.
func newBareMesh(t *testing.T) *mesh {
	m := newMeshDirs(t)
	m.startControl()
	return m
}

// newMeshDirs is the directories of a control side (initialised for a
// broker on a free port of loopback) and of one machine; nothing runs.
func newMeshDirs(t *testing.T) *mesh {
	if os.Geteuid() != 0 {
		t.Fatal("the end-to-end tests run as root: the executor is root")
	}
	base, _ := os.MkdirTemp("", "e2e-")
	os.Chmod(base, 0o755)
	t.Cleanup(func() { os.RemoveAll(base) })
	m := &mesh{t: t, base: base, ctl: filepath.Join(base, "control"), state: filepath.Join(base, "executor"),
		tree: filepath.Join(base, "tree"), sock: filepath.Join(base, "run", "executor.sock")}
	os.Mkdir(m.tree, 0o755)
	os.MkdirAll(m.state, 0o700)
	port := freePort(t)
	m.port = port
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	m.run("mesh-control", "init", "--dir", m.ctl, "--url", url)
	return m
}

// startControl runs mesh-control serve on the mesh's port.
func (m *mesh) startControl() *exec.Cmd {
	cmd := m.start("mesh-control", nil, "serve", "--dir", m.ctl, "--listen", fmt.Sprintf("127.0.0.1:%d", m.port))
	eventually(m.t, "the control side serves", func() bool {
		return exec.Command(filepath.Join(bin, "mesh-control"), "nodes", "--dir", m.ctl).Run() == nil
	})
	return cmd
}

func (m *mesh) startExecutor(extra ...string) *exec.Cmd {
	cmd := m.start("mesh-executor", nil, append([]string{"serve", "--state", m.state, "--socket", m.sock, "--agent-user", "nobody", "--drift", "0", "--build", "e2e"}, extra...)...)
	eventually(m.t, "the executor's socket", func() bool { _, err := os.Stat(m.sock); return err == nil })
	return cmd
}

// agentState is the agent's state directory.
func (m *mesh) agentState() string { return filepath.Join(m.base, "agent-state") }

func (m *mesh) startAgent(extra ...string) *exec.Cmd {
	return m.start("mesh-agent", nil, append([]string{"--socket", m.sock, "--user", "nobody",
		"--state", m.agentState(), "--heartbeat", "1s", "--enrol-poll", "200ms"}, extra...)...)
}

// node is n1 as mesh-control nodes --json shows it.
func (m *mesh) node() map[string]any { return m.nodeNamed("n1") }

type report struct {
	Seq          uint64         `json:"seq"`
	Outcome      shapes.Outcome `json:"outcome"`
	Lines        []shapes.Line  `json:"lines"`
	Refused      string         `json:"refused"`
	Code         string         `json:"code"`
	RefusedBy    string         `json:"refused_by"`
	SupersededBy uint64         `json:"superseded_by"`
	// SupersededFrom to Seq are the sequences a superseded report covers.
	SupersededFrom uint64 `json:"superseded_from"`
	Trigger        string `json:"trigger"`
}

func (m *mesh) reports(last int) []report {
	out, err := exec.Command(filepath.Join(bin, "mesh-control"), "reports", "n1", "--dir", m.ctl, "--json", "--last", strconv.Itoa(last)).Output()
	if err != nil {
		return nil
	}
	var rs struct {
		Reports []report `json:"reports"`
	}
	json.Unmarshal(out, &rs)
	return rs.Reports
}

func (m *mesh) declare(doc string) uint64 {
	m.t.Helper()
	f := filepath.Join(m.base, "decl.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(doc, "{root}", m.tree)), 0o600)
	return declaredSeq(m.t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--json"))
}

// declaredSeq is the sequence declare --json says it declared.
func declaredSeq(t *testing.T, out string) uint64 {
	t.Helper()
	var d struct {
		Seq uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.Seq == 0 {
		t.Fatalf("declare --json: %v\n%s", err, out)
	}
	return d.Seq
}

// plan runs mesh-control plan n1 on doc ({root} its tree): what it
// printed, and its exit code.
func (m *mesh) plan(doc string) (string, int) {
	m.t.Helper()
	f := filepath.Join(m.base, "plan.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(doc, "{root}", m.tree)), 0o600)
	cmd := exec.Command(filepath.Join(bin, "mesh-control"), "plan", "n1", f, "--dir", m.ctl, "--wait=30s")
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}

func (m *mesh) reportFor(seq uint64) report {
	m.t.Helper()
	var found report
	eventually(m.t, fmt.Sprintf("a report for seq %d", seq), func() bool {
		for _, r := range m.reports(50) {
			if r.Seq == seq && r.Trigger == "declaration" {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// The whole loop: declared on the control side, signed, published, drained
// by the agent, verified again by the executor, applied, read back, and the
// report seen on the control side.
func TestDeclareAppliedReported(t *testing.T) {
	m := newMesh(t)
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"over the link\n"}]}`)
	r := m.reportFor(seq)
	if r.Outcome != shapes.Applied || len(r.Lines) != 1 || r.Lines[0].Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "over the link\n" {
		t.Fatalf("the machine: %q", b)
	}
	eventually(t, "nodes shows it applied", func() bool {
		n := m.node()
		return n["applied"] == float64(seq) && n["declared"] == float64(seq)
	})
	// The node reported its profile with its heartbeat; a node registered
	// and never run never did, and is shown so, not as an empty profile.
	eventually(t, "n1's profile reported", func() bool {
		return strings.Contains(m.run("mesh-control", "node", "show", "n1", "--dir", m.ctl), "package-manager")
	})
	m.run("mesh-control", "node", "add", "n2", "--dir", m.ctl, "--out", filepath.Join(m.base, "n2", "agent.json"))
	if out := m.run("mesh-control", "node", "show", "n2", "--dir", m.ctl); !strings.Contains(out, "profile: never reported") {
		t.Fatalf("node show of a node that never reported:\n%s", out)
	}
	// The control side refuses to sign an action at all; one forged by hand
	// is tested below the socket (executor/serve) and in the agent's drain.
	f := filepath.Join(m.base, "bad.json")
	os.WriteFile(f, []byte(`{"version":1,"resources":[{"module":"m","id":"a","type":"action","run":["/bin/true"],"verify":["/bin/true"]}]}`), 0o600)
	if out, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl).CombinedOutput(); err == nil || !strings.Contains(string(out), "action") {
		t.Fatalf("the control side signed an action: %s", out)
	}
}

// holdStoreLock has a rescue apply (the real `mesh-executor apply`) hold
// the store's lock, the executor's applies waiting behind it, until
// release, which waits for it to end.
func (m *mesh) holdStoreLock() (release func()) {
	m.t.Helper()
	flag := filepath.Join(m.base, "release")
	rescue := filepath.Join(m.base, "rescue.json")
	os.WriteFile(rescue, []byte(fmt.Sprintf(`{"version":1,"node":"n1","resources":[{"module":"hold","id":"lock","type":"action","run":["/bin/sh","-c","touch %s.held; while [ ! -e %s ]; do sleep 0.05; done; touch %s.done"],"verify":["/usr/bin/test","-e","%s.done"],"timeout":120}]}`, flag, flag, flag, flag)), 0o600)
	holder := exec.Command(filepath.Join(bin, "mesh-executor"), "apply", "--state", m.state, rescue)
	if err := holder.Start(); err != nil {
		m.t.Fatal(err)
	}
	eventually(m.t, "the rescue apply holds the lock (its action runs)", func() bool {
		_, err := os.Stat(flag + ".held")
		return err == nil
	})
	return func() {
		m.t.Helper()
		os.WriteFile(flag, nil, 0o644)
		if err := holder.Wait(); err != nil {
			m.t.Fatalf("the rescue apply: %v", err)
		}
	}
}

// A flurry while the engine is busy: the machine becomes the last thing it
// was told, not each in turn.
func TestFlurryConvergesOnTheNewest(t *testing.T) {
	m := newMesh(t)
	release := m.holdStoreLock()
	const n = 500
	var last uint64
	for i := 1; i <= n; i++ {
		last = m.declare(fmt.Sprintf(`{"version":1,"resources":[{"module":"base","id":"gen","type":"file","path":"{root}/generation","content":"%d\n"}]}`, i))
	}
	release()
	r := m.reportFor(last)
	if r.Outcome != shapes.Applied {
		t.Fatalf("the newest: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "generation")); string(b) != fmt.Sprintf("%d\n", n) {
		t.Fatalf("the machine holds generation %q, not the newest", b)
	}
	var applied, superseded int
	eventually(t, "every declaration accounted for", func() bool {
		applied, superseded = 0, 0
		for _, r := range m.reports(n + 20) {
			if r.Trigger != "declaration" || r.Seq <= last-uint64(n) {
				continue
			}
			switch {
			case r.SupersededBy != 0:
				from := r.SupersededFrom
				if from == 0 {
					from = r.Seq
				}
				superseded += int(r.Seq - from + 1)
			case r.Outcome == shapes.Applied || r.Outcome == shapes.Unchanged:
				applied++
			}
		}
		return applied+superseded == n
	})
	// The one the agent forwarded before the lock was released, and the
	// newest: never each in turn.
	if applied > 2 {
		t.Fatalf("%d declarations applied in turn, %d superseded", applied, superseded)
	}
}

// An archive over the link: put into the control side's archive store,
// named by obj:// in a declaration, read by the agent from the store,
// streamed into the executor's private cache, unpacked from there. An
// archive resource whose pinned digest is not the stored object's is
// refused by the agent, and nothing reaches the executor.
func TestArchiveOverTheLink(t *testing.T) {
	m := newMesh(t)
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "site/", Typeflag: tar.TypeDir, Mode: 0o755})
	big := bytes.Repeat([]byte("0123456789abcdef"), 200000) // 3.2 MB: several chunks each way
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(big), func(i, j int) { big[i], big[j] = big[j], big[i] })
	for name, body := range map[string][]byte{"site/index.html": []byte("<h1>over the link</h1>\n"), "site/big.bin": big} {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
	}
	tw.Close()
	gz.Close()
	tgz := filepath.Join(m.base, "site.tgz")
	os.WriteFile(tgz, buf.Bytes(), 0o600)
	var put struct {
		SHA256 string `json:"sha256"`
		URL    string `json:"url"`
	}
	if err := json.Unmarshal([]byte(m.run("mesh-control", "archive", "put", tgz, "--dir", m.ctl, "--json")), &put); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(buf.Bytes())
	if put.SHA256 != hex.EncodeToString(want[:]) || put.URL != "obj://"+put.SHA256 {
		t.Fatalf("archive put: %+v", put)
	}
	doc := `{"version":1,"resources":[
		{"module":"web","id":"root","type":"directory","path":"{root}/www"},
		{"module":"web","id":"site","type":"archive","url":%q,"sha256":%q,"destination":"{root}/www"}]}`
	// A plan first: the archive is looked up in the store, not streamed;
	// the executor, which has not got its bytes, plans it as one it would
	// unpack once streamed. Nothing on the machine changes. One the store
	// does not hold is refused as its declaration would be.
	out, code := m.plan(fmt.Sprintf(doc, put.URL, put.SHA256))
	if code != 0 || !strings.Contains(out, "web.site  archive  would apply  sha256 "+put.SHA256[:12]+"… to be unpacked once the agent streams it") {
		t.Fatalf("a plan of an archive over the link: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(m.tree, "www")); !os.IsNotExist(err) {
		t.Fatalf("the plan changed the machine: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m.state, "archives", put.SHA256)); !os.IsNotExist(err) {
		t.Fatalf("the plan streamed the archive: %v", err)
	}
	missing := strings.Repeat("cd", 32)
	if out, code := m.plan(fmt.Sprintf(doc, "obj://"+missing, missing)); code != 2 || !strings.Contains(out, "is not in the archive store") {
		t.Fatalf("a plan of an archive the store does not hold: exit %d\n%s", code, out)
	}
	seq := m.declare(fmt.Sprintf(doc, put.URL, put.SHA256))
	r := m.reportFor(seq)
	if r.Outcome != shapes.Applied || len(r.Lines) != 2 || r.Lines[1].Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "www/site/index.html")); string(b) != "<h1>over the link</h1>\n" {
		t.Fatalf("the machine: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "www/site/big.bin")); !bytes.Equal(b, big) {
		t.Fatalf("big.bin: %d bytes, not the archive's %d", len(b), len(big))
	}
	if fi, err := os.Stat(filepath.Join(m.state, "archives", put.SHA256)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the executor's cache: %v %v", fi, err)
	}
	// Cached now: planned from its bytes.
	if out, code := m.plan(fmt.Sprintf(doc, put.URL, put.SHA256)); code != 0 || !strings.Contains(out, "web.site  archive  would change nothing  3 entries as unpacked") {
		t.Fatalf("a plan of an archive applied: exit %d\n%s", code, out)
	}

	// The stored object under another pin: the control side refuses it
	// before it signs (the store keeps an archive under its digest).
	other := strings.Repeat("ab", 32)
	f := filepath.Join(m.base, "other.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(fmt.Sprintf(doc, put.URL, other), "{root}", m.tree)), 0o600)
	if out, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl).CombinedOutput(); err == nil || !strings.Contains(string(out), "refused before signing") {
		t.Fatalf("an archive pinned under another digest than its name: %v\n%s", err, out)
	}
	// A store that holds other bytes under an archive's name (written
	// around archive put: a tampered store, a hostile broker): the agent
	// refuses the declaration, and nothing reaches the executor's cache.
	k, err := control.LoadKeys(m.ctl)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := control.Connect(ctx, k, fmt.Sprintf("tls://127.0.0.1:%d", m.port), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Archives.PutBytes(ctx, other, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	seq = m.declare(fmt.Sprintf(doc, "obj://"+other, other))
	r = m.reportFor(seq)
	if r.Outcome != shapes.Refused || r.RefusedBy != "agent" || r.Code != "archive" || !strings.Contains(r.Refused, "the declaration pins "+other) {
		t.Fatalf("a mismatched archive: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(m.state, "archives", other)); !os.IsNotExist(err) {
		t.Fatal("the mismatched archive reached the executor's cache")
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "www/site/index.html")); string(b) != "<h1>over the link</h1>\n" {
		t.Fatal("the refused declaration changed the machine")
	}
	// Not in the store at all: refused, saying so.
	seq = m.declare(fmt.Sprintf(doc, "obj://"+missing, missing))
	if r = m.reportFor(seq); r.Outcome != shapes.Refused || !strings.Contains(r.Refused, "is not in the archive store") {
		t.Fatalf("a missing archive: %+v", r)
	}
}

// An adopted node's briefing goes upward with its report; a failed line
// holds the node's assignments until the fix is pushed on purpose.
func TestBriefingUpwardHoldsAssignments(t *testing.T) {
	m := newMesh(t)
	os.WriteFile(filepath.Join(m.tree, "motd"), []byte("the machine's own\n"), 0o644)
	os.Mkdir(filepath.Join(m.tree, "adir"), 0o755) // a directory where a file is declared: the line fails
	seq := m.declare(`{"version":1,"adopted":true,"resources":[` +
		`{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"mesh\n"},` +
		`{"module":"base","id":"broken","type":"file","path":"{root}/adir","content":"x"}]}`)
	r := m.reportFor(seq)
	if r.Outcome != shapes.Failed {
		t.Fatalf("%+v", r)
	}
	eventually(t, "the briefing kept on the control side", func() bool {
		b, _ := m.node()["briefing"].(map[string]any)
		return b != nil && b["outcome"] == "failed"
	})
	f := filepath.Join(m.base, "next.json")
	os.WriteFile(f, []byte(strings.ReplaceAll(`{"version":1,"adopted":true,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"mesh\n"}]}`, "{root}", m.tree)), 0o600)
	out, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "has a failed briefing line (base.broken") {
		t.Fatalf("a node with a failed briefing line was assigned more: %s", out)
	}
	fixSeq := declaredSeq(t, m.run("mesh-control", "declare", "n1", f, "--dir", m.ctl, "--despite-briefing", "--json"))
	if r := m.reportFor(fixSeq); r.Outcome != shapes.Held {
		t.Fatalf("the fix: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "the machine's own\n" {
		t.Fatal("a held file was changed")
	}
	eventually(t, "the briefing resolved", func() bool {
		b, _ := m.node()["briefing"].(map[string]any)
		return b != nil && b["outcome"] == "kept"
	})
}

// declare --wait: the node's report printed, and the exit status its
// outcome: 0 applied, 1 failed, 2 refused by the node, 3 no report in
// time (the agent stopped).
func TestDeclareWaitsForTheReport(t *testing.T) {
	m := newMesh(t)
	declare := func(doc string, wait string) (string, int) {
		t.Helper()
		f := filepath.Join(m.base, "w.json")
		os.WriteFile(f, []byte(strings.ReplaceAll(doc, "{root}", m.tree)), 0o600)
		cmd := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", f, "--dir", m.ctl, wait)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := declare(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"{root}/waited","content":"x\n"}]}`, "--wait")
	if code != 0 || !strings.Contains(out, "applied") || !strings.Contains(out, "m.f  file  applied") {
		t.Fatalf("applied: exit %d\n%s", code, out)
	}
	// --json prints the report in the form every JSON output keeps.
	js, err := exec.Command(filepath.Join(bin, "mesh-control"), "declare", "n1", filepath.Join(m.base, "w.json"), "--dir", m.ctl, "--wait", "--json").Output()
	if err := errors.Join(err, jsonform.Check(js)); err != nil || !strings.Contains(string(js), `"outcome": "unchanged"`) {
		t.Fatalf("declare --wait --json: %v\n%s", err, js)
	}
	os.Mkdir(filepath.Join(m.tree, "adir"), 0o755)
	out, code = declare(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"{root}/adir","content":"x\n"}]}`, "--wait=1m")
	if code != 1 || !strings.Contains(out, "m.f  file  failed") {
		t.Fatalf("failed: exit %d\n%s", code, out)
	}
	out, code = declare(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"{root}/nowhere/f","content":"x\n"}]}`, "--wait")
	if code != 2 || !strings.Contains(out, "refused by the executor") || !strings.Contains(out, "is not there, and no directory resource before it declares it") {
		t.Fatalf("refused: exit %d\n%s", code, out)
	}
	agent := m.procs[len(m.procs)-1]
	agent.Process.Signal(syscall.SIGTERM)
	agent.Wait()
	out, code = declare(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"{root}/waited","content":"y\n"}]}`, "--wait=2s")
	if code != 3 || !strings.Contains(out, "no report within 2s from n1") {
		t.Fatalf("timed out: exit %d\n%s", code, out)
	}
}

// mesh-control plan NODE FILE: the node plans it on the path an apply
// takes and answers with the lines and the diffs, nothing changed on the
// machine nor in the registry; a diff is shown only for a file the mesh
// holds as it wrote it — never a found file's content, nor a drift's.
func TestPlanOverTheLink(t *testing.T) {
	m := newMesh(t)
	seq := m.declare(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"v1\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("%+v", r)
	}
	os.WriteFile(filepath.Join(m.tree, "found"), []byte("the machine's secret\n"), 0o600)
	plan := m.plan
	doc := `{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"{root}/motd","content":"v2\n"},
		{"module":"m","id":"new","type":"file","path":"{root}/new","content":"n\n"},
		{"module":"m","id":"found","type":"file","path":"{root}/found","content":"mine\n"}]}`
	out, code := plan(doc)
	if code != 0 || !strings.Contains(out, "plan on n1 (nothing was changed)") || !strings.Contains(out, "-v1") || !strings.Contains(out, "+v2") {
		t.Fatalf("plan: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "m.found:\n(not shown: a file the mesh does not hold; its content is the machine's)") || strings.Contains(out, "secret") {
		t.Errorf("a found file's content crossed the link:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(m.tree, "motd")); string(b) != "v1\n" {
		t.Fatalf("the plan changed the machine: motd %q", b)
	}
	if _, err := os.Stat(filepath.Join(m.tree, "new")); err == nil {
		t.Fatal("the plan made a file")
	}
	js, err := exec.Command(filepath.Join(bin, "mesh-control"), "plan", "n1", filepath.Join(m.base, "plan.json"), "--dir", m.ctl, "--json").Output()
	if err := errors.Join(err, jsonform.Check(js)); err != nil || !strings.Contains(string(js), `"resource": "m.motd"`) {
		t.Errorf("plan --json: %v\n%s", err, js)
	}
	if n := m.node(); n["last_seq"] != float64(seq) || n["applied"] != float64(seq) {
		t.Errorf("the plan moved the registry's view of n1: %v", n)
	}
	// A drift is the machine's: not shown either.
	os.WriteFile(filepath.Join(m.tree, "motd"), []byte("a drift with a secret\n"), 0o644)
	out, code = plan(doc)
	if code != 0 || !strings.Contains(out, "m.motd:\n(not shown: it differs from what the mesh wrote; its content is the machine's)") || strings.Contains(out, "secret") {
		t.Errorf("a drift's content crossed the link: exit %d\n%s", code, out)
	}
	// Refused by the executor: exit 2, nothing changed.
	out, code = plan(`{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"{root}/nowhere/f","content":"x"}]}`)
	if code != 2 || !strings.Contains(out, "is not there, and no directory resource before it declares it") {
		t.Errorf("a plan the executor refuses: exit %d\n%s", code, out)
	}
}
