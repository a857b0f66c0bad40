package selinux

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// What the test needs, each from the Debian package tests/install-deps.sh
// installs when it is missing.
const (
	develMakefile = "/usr/share/selinux/devel/Makefile" // selinux-policy-dev
	baseStore     = "/var/lib/selinux/default"          // selinux-policy-default
	baseEtc       = "/etc/selinux/default"              // selinux-policy-default
	semanageConf  = "/etc/selinux/semanage.conf"        // libsemanage-common
)

var modules = []string{"mesh_agent", "mesh_executor"}

func needTools(t *testing.T) {
	t.Helper()
	for _, c := range []string{"make", "checkmodule", "semodule_package", "semodule", "sesearch", "seinfo", "matchpathcon"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("selinux: %s is missing: run tests/install-deps.sh (make test does)", c)
		}
	}
	for _, p := range []string{develMakefile, baseStore, baseEtc, semanageConf} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("selinux: %v: run tests/install-deps.sh (make test does)", err)
		}
	}
}

func run(dir string, argv ...string) ([]byte, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("running %q failed: %w\n%s", argv, err, out)
	}
	return out, nil
}

// compile copies the policy sources into a temporary directory, lets edit
// change each file's text (nil: as checked in), and builds the .pp files
// with the reference policy's development Makefile.
func compile(t *testing.T, edit func(name, text string) string) string {
	t.Helper()
	dir := t.TempDir()
	for _, m := range modules {
		for _, ext := range []string{".te", ".fc", ".if"} {
			b, err := os.ReadFile(m + ext)
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			if edit != nil {
				text = edit(m+ext, text)
			}
			if err := os.WriteFile(filepath.Join(dir, m+ext), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := run(dir, "make", "-f", develMakefile); err != nil {
		t.Fatalf("selinux: the policy does not compile: %v", err)
	}
	for _, m := range modules {
		if fi, err := os.Stat(filepath.Join(dir, m+".pp")); err != nil || fi.Size() == 0 {
			t.Fatalf("selinux: %s.pp was not made: %v", m, err)
		}
	}
	return dir
}

// link installs the modules into a copy of Debian's default policy store
// under a root of the test's own (semodule -p), never the machine's: the
// machine's store and its SELinux state are untouched. The copied
// semanage.conf turns expand-check on, so every neverallow of every module
// is checked against every allow while the policy is built. It returns the
// root, semodule's output and its error.
func link(t *testing.T, ppDir string) (string, []byte, error) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/selinux", "etc/selinux"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := run("", "cp", "-a", baseStore, filepath.Join(root, "var/lib/selinux/")); err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "cp", "-a", baseEtc, filepath.Join(root, "etc/selinux/")); err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(semanageConf)
	if err != nil {
		t.Fatal(err)
	}
	conf = regexp.MustCompile(`(?m)^\s*expand-check\s*=.*$`).ReplaceAll(conf, nil)
	conf = append(conf, "\nexpand-check=1\n"...)
	if err := os.WriteFile(filepath.Join(root, "etc/selinux/semanage.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	argv := []string{"semodule", "-p", root, "-s", "default", "-n"}
	for _, m := range modules {
		argv = append(argv, "-i", filepath.Join(ppDir, m+".pp"))
	}
	out, err := run(ppDir, argv...)
	return root, out, err
}

func policyFile(root string) string {
	return filepath.Join(root, "etc/selinux/default/policy/policy.33")
}

// The policy compiles to a .pp per module, and each carries the file
// contexts of the names and paths in docs/operations.md.
func TestCompiles(t *testing.T) {
	needTools(t)
	dir := compile(t, nil)
	want := map[string][]string{
		"mesh_agent": {"/usr/bin/mesh-agent", "/var/lib/mesh-host/agent(/.*)?"},
		"mesh_executor": {"/usr/bin/mesh-executor", "/usr/bin/mesh-launch", "/var/lib/mesh-host",
			"/var/lib/mesh-host/executor(/.*)?", "/usr/lib/nox-mesh-host(/.*)?", "/run/mesh-host",
			`/run/mesh-host/executor\.sock`},
	}
	for m, paths := range want {
		if _, err := run(dir, "semodule_unpackage", m+".pp", m+".out.mod", m+".out.fc"); err != nil {
			t.Fatal(err)
		}
		fc, err := os.ReadFile(filepath.Join(dir, m+".out.fc"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p) + `\s`).Match(fc) {
				t.Errorf("%s.pp: no file context for %s", m, p)
			}
		}
	}
}

// The agent's domain, in the policy linked with Debian's
// selinux-policy-default: the neverallow rules hold (the link checks
// them), sesearch finds no allow rule for anything forbidden, and it finds
// every allow the agent needs (the positive control: a broken query, an
// empty policy or a wrong file cannot pass).
func TestAgentConfinedInLinkedPolicy(t *testing.T) {
	needTools(t)
	t.Parallel()
	root, _, err := link(t, compile(t, nil))
	if err != nil {
		t.Fatalf("selinux: the modules do not link with selinux-policy-default: %v", err)
	}
	q := newQuery(t, policyFile(root))
	for _, v := range q.forbidden() {
		t.Errorf("forbidden: %s", v)
	}
	for _, m := range q.missing() {
		t.Errorf("missing (positive control): %s", m)
	}
	// The labels the policy gives the paths, from the linked file contexts.
	fc := filepath.Join(root, "etc/selinux/default/contexts/files/file_contexts")
	for path, typ := range map[string]string{
		"/usr/bin/mesh-agent":                  "mesh_agent_exec_t",
		"/usr/bin/mesh-executor":               "mesh_executor_exec_t",
		"/usr/bin/mesh-launch":                 "mesh_executor_exec_t",
		"/var/lib/mesh-host":                   "mesh_host_var_lib_t",
		"/var/lib/mesh-host/agent/config.json": "mesh_agent_var_lib_t",
		"/var/lib/mesh-host/executor/store":    "mesh_executor_var_lib_t",
		"/usr/lib/nox-mesh-host/bundle.json":   "mesh_executor_bundle_t",
		"/run/mesh-host":                       "mesh_executor_runtime_t",
		"/run/mesh-host/executor.sock":         "mesh_executor_runtime_t",
		"/run/mesh-host/launcher.json":         "mesh_executor_notice_t",
	} {
		out, err := run("", "matchpathcon", "-f", fc, path)
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.Contains(string(out), ":"+typ+":") {
			t.Errorf("%s is labelled %s; want %s", path, strings.TrimSpace(string(out)), typ)
		}
	}
}

// A rollback by copying stages the known-good binary in /usr/bin (bin_t)
// and gives it the label of the binary it replaces (launcher
// CopyReinstall): the launcher's domain may relabel from bin_t to either
// exec type, and replace such a file, in the linked policy.
func TestRollbackMayCarryTheLabel(t *testing.T) {
	needTools(t)
	t.Parallel()
	root, _, err := link(t, compile(t, nil))
	if err != nil {
		t.Fatalf("selinux: the modules do not link with selinux-policy-default: %v", err)
	}
	for _, c := range []struct{ target, perms string }{
		{"bin_t", "relabelfrom"},
		{"mesh_executor_exec_t", "relabelto rename unlink"},
		{"mesh_agent_exec_t", "relabelto rename unlink"},
	} {
		for _, perm := range strings.Fields(c.perms) {
			out, err := run("", "sesearch", "-A", "-s", "mesh_executor_t", "-t", c.target, "-c", "file", "-p", perm, policyFile(root))
			if err != nil || !strings.Contains(string(out), "allow") {
				t.Errorf("mesh_executor_t may not %s %s files: %v %s", perm, c.target, err, out)
			}
		}
	}
	// The positive control's mirror: nothing of this lets the agent
	// relabel (its neverallow rules would not link).
	out, _ := run("", "sesearch", "-A", "-s", "mesh_agent_t", "-c", "file", "-p", "relabelto", policyFile(root))
	if strings.Contains(string(out), "allow") {
		t.Errorf("the agent may relabel a file:\n%s", out)
	}
}

// forbiddenAllows grants the agent one thing of each kind it must never
// have. Each line below breaks a different neverallow rule.
// The base policy itself forbids some of them (sys_module to all but the
// module loaders): those cannot link even without this module's rules.
var forbiddenAllows = []struct {
	rule, want string
	base       bool
}{
	{"allow mesh_agent_t etc_t:file write;", "etc_t:file", false},                                // write outside its state
	{"allow mesh_agent_t mesh_executor_var_lib_t:file read;", "mesh_executor_var_lib_t", false},  // read the executor's store
	{"allow mesh_agent_t mesh_executor_t:process ptrace;", "ptrace", false},                      // ptrace
	{"allow mesh_agent_t self:capability sys_module;", "sys_module", true},                       // load a module
	{"allow mesh_agent_t self:capability sys_ptrace;", "sys_ptrace", false},                      // ptrace anything
	{"allow mesh_agent_t kernel_t:system module_request;", "module_request", false},              // ask the kernel to load one
	{"allow mesh_agent_t initrc_t:unix_stream_socket connectto;", "initrc_t:unix_stream", false}, // a runtime's socket (Debian: served from initrc_t)
	{"allow mesh_agent_t var_run_t:sock_file write;", "var_run_t:sock_file", false},              // /run/docker.sock, /run/podman/podman.sock
	{"allow mesh_agent_t http_port_t:tcp_socket name_connect;", "http_port_t:tcp_socket", false}, // a connection off the machine not to the broker
}

const forbiddenRequire = "\ngen_require(`\n\ttype etc_t, kernel_t, initrc_t, var_run_t, http_port_t;\n')\n"

func withForbidden(name, text string) string { return addForbidden(name, text, true) }

func addForbidden(name, text string, base bool) string {
	if name != "mesh_agent.te" {
		return text
	}
	text += forbiddenRequire
	for _, f := range forbiddenAllows {
		if base || !f.base {
			text += f.rule + "\n"
		}
	}
	return text
}

// A module granting the agent anything forbidden does not link: each
// forbidden allow is named by a failed neverallow check.
func TestNeverallowRefusesForbiddenAllows(t *testing.T) {
	needTools(t)
	t.Parallel()
	_, out, err := link(t, compile(t, withForbidden))
	if err == nil {
		t.Fatalf("selinux: the policy linked with forbidden allows for the agent:\n%s", out)
	}
	for _, f := range forbiddenAllows {
		if !neverallowNames(out, f.rule) {
			t.Errorf("no neverallow failure names %q\n%s", f.rule, out)
		}
	}
}

// neverallowNames reports whether libsemanage's neverallow report quotes
// the allow rule, which it prints in CIL: allow a b (class (perm)).
func neverallowNames(out []byte, rule string) bool {
	m := regexp.MustCompile(`^allow (\S+) (\S+):(\S+) (\S+);$`).FindStringSubmatch(rule)
	if m == nil {
		return false
	}
	cil := fmt.Sprintf("(allow %s %s (%s (%s)))", m[1], m[2], m[3], m[4])
	return bytes.Contains(out, []byte("neverallow check failed")) && bytes.Contains(out, []byte(cil))
}

// Without the neverallow rules, the same forbidden allows link, and the
// sesearch assertions catch each of them: the assertions do not depend on
// the neverallow rules being there.
func TestAssertionsCatchForbiddenAllows(t *testing.T) {
	needTools(t)
	t.Parallel()
	nv := regexp.MustCompile(`(?m)^neverallow .*$`)
	dir := compile(t, func(name, text string) string {
		return addForbidden(name, nv.ReplaceAllString(text, ""), false)
	})
	root, out, err := link(t, dir)
	if err != nil {
		t.Fatalf("selinux: without its neverallow rules the policy should link: %v\n%s", err, out)
	}
	got := strings.Join(newQuery(t, policyFile(root)).forbidden(), "\n")
	for _, f := range forbiddenAllows {
		if f.base {
			continue
		}
		if !strings.Contains(got, f.want) {
			t.Errorf("the sesearch assertions miss %q (want a finding naming %q); found:\n%s", f.rule, f.want, got)
		}
	}
}

// query holds what sesearch and seinfo say about one binary policy: every
// allow rule whose source is the agent's domain or an attribute it has, and
// every attribute's types. Each tool call loads the whole policy (about a
// second), so each is asked once and the rest is filtered here.
type query struct {
	t      *testing.T
	policy string
	rules  []rule
	attrs  map[string][]string // attribute -> its types
}

// rule is one line of sesearch -A.
type rule struct {
	text, source, target, class string
	perms                       map[string]bool
}

var ruleRE = regexp.MustCompile(`^allow (\S+) (\S+):(\S+) (\{ [^}]+ \}|\S+);`)

func newQuery(t *testing.T, policy string) *query {
	t.Helper()
	q := &query{t: t, policy: policy, attrs: map[string][]string{}}
	out, err := run("", "seinfo", policy, "-a", "-x")
	if err != nil {
		t.Fatal(err)
	}
	cur := ""
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.Contains(l, ":"):
		case strings.HasPrefix(l, "attribute "):
			cur = strings.TrimSuffix(strings.TrimPrefix(l, "attribute "), ";")
			q.attrs[cur] = []string{}
		case cur != "":
			q.attrs[cur] = append(q.attrs[cur], l)
		}
	}
	if len(q.attrs) < 50 || len(q.attrs["file_type"]) < 100 {
		t.Fatalf("seinfo found %d attributes, %d file types in %s: not a whole policy", len(q.attrs), len(q.attrs["file_type"]), policy)
	}
	out, err = run("", "sesearch", "-A", "-s", agent, policy)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			continue
		}
		m := ruleRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("sesearch: cannot read %q", l)
		}
		r := rule{text: l, source: m[1], target: m[2], class: m[3], perms: map[string]bool{}}
		if r.target == "self" {
			r.target = agent
		}
		for _, p := range strings.Fields(strings.Trim(m[4], "{}")) {
			r.perms[p] = true
		}
		q.rules = append(q.rules, r)
	}
	if len(q.rules) < 20 {
		t.Fatalf("sesearch found %d rules for %s: not the agent's domain", len(q.rules), agent)
	}
	return q
}

// types expands a rule's target: an attribute to its types, a type to
// itself.
func (q *query) types(name string) []string {
	if ts, ok := q.attrs[name]; ok {
		return ts
	}
	return []string{name}
}

// allows returns the agent's rules on class ("": any) with any of perms
// (none: any) and, when target is not empty, whose target is that type or
// an attribute holding it.
func (q *query) allows(class string, perms []string, target string) []rule {
	var rs []rule
	for _, r := range q.rules {
		if class != "" && r.class != class {
			continue
		}
		hit := len(perms) == 0
		for _, p := range perms {
			hit = hit || r.perms[p]
		}
		if !hit {
			continue
		}
		if target != "" && !set(q.types(r.target)...)[target] {
			continue
		}
		rs = append(rs, r)
	}
	return rs
}

func set(xs ...string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

const agent = "mesh_agent_t"

// outside reports, for each rule the agent has on class with any of perms,
// the target types that are in within (nil: any type) and not in allowed.
func (q *query) outside(class string, perms []string, within, allowed map[string]bool, why string) []string {
	var found []string
	for _, r := range q.allows(class, perms, "") {
		for _, ty := range q.types(r.target) {
			if allowed[ty] || (within != nil && !within[ty]) {
				continue
			}
			found = append(found, fmt.Sprintf("%s: %s:%s (from %s)", why, ty, class, r.text))
		}
	}
	return found
}

// forbidden lists every allow rule that gives the agent what it must never
// have. Rules written to an attribute the agent belongs to (domain, …)
// count, and conditional rules count whatever their boolean's state.
func (q *query) forbidden() []string {
	fileTypes := set(q.types("file_type")...)
	var found []string
	own := set("mesh_agent_var_lib_t")

	// Write outside its own state.
	for class, perms := range map[string][]string{
		"file":      {"write", "append", "create", "unlink", "link", "rename", "setattr", "relabelfrom", "relabelto"},
		"lnk_file":  {"write", "append", "create", "unlink", "link", "rename", "setattr", "relabelfrom", "relabelto"},
		"dir":       {"write", "add_name", "remove_name", "create", "rmdir", "reparent", "rename", "setattr", "relabelfrom", "relabelto"},
		"fifo_file": {"create", "unlink", "link", "rename", "setattr", "relabelfrom", "relabelto"},
		"sock_file": {"create", "unlink", "link", "rename", "setattr", "relabelfrom", "relabelto"},
	} {
		found = append(found, q.outside(class, perms, fileTypes, own, "writes outside its state")...)
	}

	// Read the executor's store or the bundle: no rule at all.
	for _, ty := range []string{"mesh_executor_var_lib_t", "mesh_executor_bundle_t"} {
		for _, r := range q.allows("", nil, ty) {
			found = append(found, fmt.Sprintf("reaches the executor's state %s (from %s)", ty, r.text))
		}
	}

	// ptrace, and capabilities beyond the three the privilege drop uses
	// (sys_ptrace, sys_module among them).
	found = append(found, q.outside("process", []string{"ptrace"}, nil, nil, "ptrace")...)
	for _, r := range q.allows("capability", nil, "") {
		for p := range r.perms {
			if !set("setuid", "setgid", "setpcap")[p] {
				found = append(found, fmt.Sprintf("capability %s (from %s)", p, r.text))
			}
		}
	}
	for _, c := range []string{"capability2", "cap_userns", "cap2_userns"} {
		for _, r := range q.allows(c, nil, "") {
			found = append(found, fmt.Sprintf("%s (from %s)", c, r.text))
		}
	}

	// Load kernel modules.
	found = append(found, q.outside("system", []string{"module_load", "module_request"}, nil, nil, "loads kernel modules: module_load/module_request")...)

	// The container runtime's socket. Debian 12's policy has no container
	// module: /run/docker.sock, /run/podman/podman.sock and
	// /run/containerd/containerd.sock take var_run_t (or their creator's
	// type) and the engines run in the init's domains. So the agent may
	// connect to no domain but the executor's (and mcstransd's, which the
	// base policy gives every domain) and write no socket file but the
	// executor's.
	found = append(found, q.outside("unix_stream_socket", []string{"connectto"}, nil,
		set("mesh_executor_t", "setrans_t"), "connects to a unix socket not the executor's")...)
	found = append(found, q.outside("sock_file", []string{"write", "append"}, fileTypes,
		set("mesh_executor_runtime_t", "setrans_runtime_t"), "writes a socket file not the executor's")...)
	found = append(found, q.outside("unix_dgram_socket", []string{"sendto"}, nil, nil, "sends datagrams to a local socket")...)

	// The network: out to the broker and DNS only, nothing listening.
	found = append(found, q.outside("tcp_socket", []string{"name_connect"}, nil,
		set("mesh_agent_broker_port_t", "dns_port_t"), "connects to a port not the broker's or DNS")...)
	found = append(found, q.outside("tcp_socket", []string{"name_bind", "listen", "accept"}, nil, nil, "listens on TCP")...)
	found = append(found, q.outside("udp_socket", []string{"name_bind"}, nil, nil, "binds a UDP port")...)
	sort.Strings(found)
	return found
}

// missing lists what the agent needs and the policy does not give it.
func (q *query) missing() []string {
	var miss []string
	has := func(tgt, class string, perms ...string) {
		for _, r := range q.allows(class, perms, tgt) {
			ok := true
			for _, p := range perms {
				ok = ok && r.perms[p]
			}
			if ok {
				return
			}
		}
		miss = append(miss, fmt.Sprintf("allow %s %s:%s { %s }", agent, tgt, class, strings.Join(perms, " ")))
	}
	has("mesh_executor_t", "unix_stream_socket", "connectto")
	has("mesh_executor_runtime_t", "sock_file", "write")
	has("mesh_executor_runtime_t", "dir", "search")
	has("mesh_executor_notice_t", "file", "read", "open")
	has("mesh_host_var_lib_t", "dir", "search")
	has("mesh_agent_var_lib_t", "file", "create", "write", "rename", "unlink")
	has("mesh_agent_var_lib_t", "dir", "add_name", "remove_name", "write")
	has("mesh_agent_broker_port_t", "tcp_socket", "name_connect")
	has("dns_port_t", "tcp_socket", "name_connect")
	has("net_conf_t", "file", "read")
	// The init runs the agent in its domain.
	out, err := run("", "sesearch", "-T", "-s", "init_t", "-t", "mesh_agent_exec_t", "-c", "process", q.policy)
	if err != nil || !strings.Contains(string(out), "mesh_agent_t") {
		miss = append(miss, fmt.Sprintf("type_transition init_t mesh_agent_exec_t:process mesh_agent_t (%v: %s)", err, out))
	}
	return miss
}
