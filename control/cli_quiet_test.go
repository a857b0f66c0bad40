package control_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// logLine is a log record as slog's text handler writes one.
var logLine = regexp.MustCompile(`(?m)^time=\S+ level=`)

// A person's commands print their result on standard output and nothing
// on standard error — no log of how it went (a node revoked, the roster
// published) — unless -v asks for it; then the log is there. The commands
// run against a real serve, with a node enrolled as a machine enrols, so
// each does its whole work, logging included.
func TestClientCommandsAreQuietWithoutV(t *testing.T) {
	s, dir, ctx, cmd := servedCLI(t)
	enrolNode(t, s, "web1")
	decl := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(decl, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	arch := filepath.Join(t.TempDir(), "a.tar")
	os.WriteFile(arch, make([]byte, 1024), 0o644) // an empty tar: two zero blocks
	module := filepath.Join(t.TempDir(), "web.json")
	os.WriteFile(module, []byte(`{"resources": [{"module": "web", "id": "index", "type": "file", "path": "/srv/index.html", "content": "hi\n"}]}`), 0o644)
	for _, c := range []struct {
		args []string
		// out is what standard output says; stderr, standard error's
		// whole text when the command speaks to the person there.
		out, stderr string
	}{
		{[]string{"declare", "web1", decl}, "declared seq 1 to web1\n", ""},
		{[]string{"overlay", "set", "--network", "10.77.0.0/24"}, "overlay: network 10.77.0.0/24", ""},
		{[]string{"overlay", "show"}, "web1", ""},
		{[]string{"node", "endpoint", "web1", "192.0.2.1:51820"}, "node web1 is reached at 192.0.2.1:51820", ""},
		{[]string{"assign", "web1", module}, "web1\t", ""},
		{[]string{"publish"}, "web1\tpublished in seq", ""},
		{[]string{"nodes"}, "web1", ""},
		{[]string{"status"}, "web1", ""},
		{[]string{"reports", "web1"}, "no reports from web1", ""},
		{[]string{"node", "show", "web1"}, "web1", ""},
		{[]string{"archive", "put", arch}, "sha256: ", ""},
		{[]string{"node", "add", "web9", "--out", filepath.Join(t.TempDir(), "web9", "agent.json")}, "node web9 registered", ""},
		{[]string{"node", "revoke", "web9"}, "node web9 revoked", ""},
		{[]string{"token", "issue", "--node", "web9"}, "nmt1-", "\nThis token enrols node web9 again"},
		{[]string{"token", "list"}, "web9", ""},
		{[]string{"node", "delete", "web9"}, "node web9 deleted", ""},
	} {
		out, errs, code := cmd(c.args...)
		if code != 0 || !strings.Contains(out, c.out) {
			t.Errorf("%v: exit %d, standard output does not say %q:\n%s%s", c.args, code, c.out, out, errs)
		}
		if !strings.HasPrefix(errs, c.stderr) || (c.stderr == "" && errs != "") || logLine.MatchString(errs) {
			t.Errorf("%v: standard error is not what the command says to a person:\n%s", c.args, errs)
		}
	}
	// The log is a -v away: revoking logs that the node is revoked.
	cmd("node", "add", "web8", "--out", filepath.Join(t.TempDir(), "web8", "agent.json"))
	_, errs, code := cmd("node", "revoke", "web8", "-v")
	if code != 0 || !logLine.MatchString(errs) || !strings.Contains(errs, `msg="node revoked" node=web8`) {
		t.Errorf("node revoke -v: exit %d, no log of the revocation:\n%s", code, errs)
	}
	// broker-config without a broker still writes the configuration, and
	// says, as sentences, that its form shares one account among nodes
	// and that it lists no node.
	out, errs, code := run(t, ctx, "broker-config", "--dir", dir, "--nats", "tls://127.0.0.1:1")
	if code != 0 || !strings.Contains(out, "accounts") || !strings.HasPrefix(errs, "mesh-control broker-config: warning: this form keeps every node in one account") ||
		!strings.Contains(errs, "\nmesh-control broker-config: warning: no broker to read the registry from") || logLine.MatchString(errs) {
		t.Errorf("broker-config with no broker: exit %d\n%s%s", code, out, errs)
	}
}

// A declaration or module file the control side refuses for its text is
// named with the line and column of the fault, by each command that reads
// one — and once, not once per node, when declared to several.
func TestRefusedFilesArePlacedByEachCommand(t *testing.T) {
	s, _, _, cmd := servedCLI(t)
	enrolNode(t, s, "web1")
	enrolNode(t, s, "web2")
	tmp := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(tmp, name)
		os.WriteFile(p, []byte(text), 0o644)
		return p
	}
	comma := write("comma.json", `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi",}
 ]}`)
	mistyped := write("mistyped.json", `{"version": 1,
 "resources": [
  {"module": "base", "id": "motd", "type": "file", "path": "/etc/motd",
   "mode": 420}
 ]}`)
	module := write("module.json", `{"resources": [
  {"module": "web", "id": "index", "type": "file",
      "path": "/srv/index.html", "content": false}
]}`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"declare", "web1", comma}, "mesh-control declare: " + comma + ":3:89: invalid character '}'"},
		{[]string{"declare", "web1", mistyped}, "mesh-control declare: " + mistyped + ":4:4: refused before signing: shapes: resource base.motd (file) field mode: expected string, got JSON number"},
		{[]string{"declare", "web1,web2", mistyped}, "mesh-control declare: " + mistyped + ":4:4: "},
		{[]string{"plan", "web1", mistyped}, "mesh-control plan: " + mistyped + ":4:4: "},
		{[]string{"assign", "web1", module}, "mesh-control assign: " + module + ":3:34: shapes: resource web.index (file) field content: expected string, got JSON bool"},
		{[]string{"assign", "web1", module, "--plan"}, "mesh-control assign: " + module + ":3:34: "},
	} {
		out, errs, code := cmd(c.args...)
		if code != 1 || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 || strings.Contains(errs, " at line ") {
			t.Errorf("%v: exit %d, want one line beginning %q:\n%s%s", c.args, code, c.want, out, errs)
		}
	}
}
