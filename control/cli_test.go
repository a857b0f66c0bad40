package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func run(t *testing.T, ctx context.Context, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := control.Main(ctx, args, &out, &errb)
	return out.String(), errb.String(), code
}

// The commands as an operator types them: init, serve, node add (the two
// files, their modes and formats), declare (prints the sequence), nodes
// and reports (--json), all through the broker.
func TestCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := "tls://127.0.0.1:" + strconv.Itoa(port)
	dir := filepath.Join(t.TempDir(), "keys")

	out, errs, code := run(t, ctx, "init", "--dir", dir, "--host", "mesh.example.org", "--url", url)
	if code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	k, err := control.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, k.KeyID()) || !strings.Contains(out, k.Fingerprint) {
		t.Fatalf("init does not print the key id and fingerprint:\n%s", out)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("key directory mode %v", fi.Mode())
	}
	for _, f := range []string{control.FileControlKey, control.FileBrokerKey, control.FileNKey} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if _, _, code := run(t, ctx, "init", "--dir", dir); code == 0 {
		t.Fatal("a second init overwrote the keys")
	}

	sctx, stop := context.WithCancel(ctx)
	served := make(chan int, 1)
	ml, _ := net.Listen("tcp", "127.0.0.1:0")
	metricsAddr := ml.Addr().String()
	ml.Close()
	go func() { _, _, c := run(t, sctx, "serve", "--dir", dir, "--metrics", metricsAddr); served <- c }()
	defer func() { stop(); <-served }()
	// A client command as soon as the broker answers.
	out2 := filepath.Join(t.TempDir(), "web1", "agent.json")
	for {
		_, errs, code = run(t, ctx, "node", "add", "web1", "--dir", dir, "--out", out2)
		if code == 0 {
			break
		}
		if ctx.Err() != nil || !strings.Contains(errs, "broker") {
			t.Fatalf("node add: %s", errs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fi, err := os.Stat(out2)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent config: %v %v", fi, err)
	}
	id, err := agent.LoadConfig(out2)
	if err != nil {
		t.Fatal(err)
	}
	if id.Node != "web1" || id.Pin != k.Fingerprint || id.BrokerURL != url || !bytes.Equal(id.ControlKey, k.ControlPublic()) {
		t.Fatalf("agent config: %+v", id)
	}
	var ex map[string]string
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(out2), "executor-identity.json"))
	if err := json.Unmarshal(b, &ex); err != nil || len(ex) != 3 || ex["node"] != "web1" || ex["enrolment"] != id.Enrolment || ex["control_key"] != k.ControlPublicBase64() {
		t.Fatalf("executor-identity.json: %s %v", b, err)
	}

	declFile := filepath.Join(t.TempDir(), "decl.json")
	os.WriteFile(declFile, []byte(decl), 0o644)
	for want := 1; want <= 2; want++ {
		out, errs, code = run(t, ctx, "declare", "web1", declFile, "--dir", dir)
		if code != 0 || out != "declared seq "+strconv.Itoa(want)+" to web1\n" {
			t.Fatalf("declare: %q %s", out, errs)
		}
	}
	out, errs, code = run(t, ctx, "nodes", "--dir", dir, "--json")
	var ns []control.NodeStatus
	if code != 0 || json.Unmarshal([]byte(out), &ns) != nil || len(ns) != 1 || ns[0].Name != "web1" || ns[0].Declared != 2 || ns[0].State != control.StateNeverHeard {
		t.Fatalf("nodes --json: %d %s %s", code, out, errs)
	}
	out, errs, code = run(t, ctx, "reports", "web1", "--dir", dir, "--json")
	if code != 0 || !strings.Contains(out, `"reports": []`) {
		t.Fatalf("reports --json: %d %s %s", code, out, errs)
	}

	// The node speaks, by hand, as its agent would: a signed report and
	// heartbeat, and one report nobody signed. The broker learns of a node
	// added a moment after the registry has it, as an agent finds (it
	// tries again).
	var nc *nats.Conn
	eventually(t, "the broker lets the added node in", func() bool {
		nc, err = agent.Dial(id)
		return err == nil
	})
	defer nc.Close()
	send := func(subj string, v any, signed bool) {
		data, _ := json.Marshal(v)
		m := nats.NewMsg(subj)
		m.Data = data
		if signed {
			sig, _ := id.Sign(data)
			m.Header.Set(link.SignatureHeader, sig)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	send(id.Subjects.Report, link.Report{Node: "web1", Enrolment: id.Enrolment, Seq: 2, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied,
		Lines: []shapes.Line{{Module: "base", ID: "motd", Type: "file", Outcome: shapes.Applied}}, At: now, ApplyMS: 250}, true)
	send(id.Subjects.Report, link.Report{Node: "web1", Enrolment: id.Enrolment, Seq: 9, Outcome: shapes.Failed, At: now}, false)
	send(id.Subjects.Heartbeat, link.Heartbeat{Node: "web1", Enrolment: id.Enrolment, At: now, Interval: 30, State: link.StateEnrolled,
		Presence: "resident", Executor: &link.ExecutorStatus{Version: "1.2.3", Build: "abc", Seq: 2, Outcome: shapes.Applied}, LastApplied: 2}, true)
	nc.Flush()
	for {
		out, _, code = run(t, ctx, "nodes", "--dir", dir, "--json")
		ns = nil
		json.Unmarshal([]byte(out), &ns)
		if code == 0 && len(ns) == 1 && ns[0].Applied == 2 && ns[0].ExecutorVersion == "1.2.3" && ns[0].LastOutcome == shapes.Applied && ns[0].State == link.StateEnrolled {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("nodes never showed what web1 said: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The fleet at a glance, for Prometheus: what the registry says of
	// each node, and what this serve recorded.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation) // the strictest names
	families, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("/metrics is not Prometheus' text format: %v", err)
	}
	metric := func(name string, labels ...string) float64 {
		t.Helper()
		f := families[name]
		if f == nil {
			t.Fatalf("/metrics has no %s", name)
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
		t.Fatalf("/metrics has no %s%v", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"mesh_nodes", []string{"state", "enrolled"}, 1},
		{"mesh_node_applied_sequence", []string{"node", "web1"}, 2},
		{"mesh_node_declared_sequence", []string{"node", "web1"}, 2},
		{"mesh_node_last_outcome", []string{"node", "web1", "outcome", "applied"}, 1},
		{"mesh_node_link_error", []string{"node", "web1"}, 0},
		{"mesh_reports_total", []string{"outcome", "applied", "trigger", "declaration"}, 1},
		{"mesh_apply_duration_seconds", nil, 1},
		{"mesh_registry_up", nil, 1},
	} {
		if got := metric(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if age := metric("mesh_node_last_heard_seconds", "node", "web1"); age < 0 || age > 60 {
		t.Errorf("web1 last heard %v s ago", age)
	}

	// Every JSON output keeps one form (snake_case, no null, integers).
	if err := jsonform.Check([]byte(out)); err != nil {
		t.Errorf("nodes --json: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"reports", "web1"}, {"node", "show", "web1"}} {
		js, errs, code := run(t, ctx, append(args, "--dir", dir, "--json")...)
		if err := jsonform.Check([]byte(js)); code != 0 || err != nil {
			t.Errorf("%v --json: exit %d, %v\n%s%s", args, code, err, js, errs)
		}
	}
	out, _, code = run(t, ctx, "nodes", "--dir", dir)
	if code != 0 || !strings.Contains(out, "1.2.3 (abc)") || !strings.Contains(out, "applied (seq 2)") {
		t.Fatalf("nodes:\n%s", out)
	}
	out, _, code = run(t, ctx, "reports", "web1", "--dir", dir)
	if code != 0 || !strings.Contains(out, "seq 2  applied") || !strings.Contains(out, "base.motd  file  applied") || !strings.Contains(out, "1 message(s)") || strings.Contains(out, "seq 9") {
		t.Fatalf("reports:\n%s", out)
	}
	t.Logf("nodes and reports:\n%s", out)
	if _, errs, code = run(t, ctx, "declare", "nosuch", declFile, "--dir", dir); code == 0 || !strings.Contains(errs, "nosuch") {
		t.Fatalf("declare to an unknown node: %d %s", code, errs)
	}
	out, _, code = run(t, ctx, "broker-config", "--dir", dir)
	if code != 0 || !strings.Contains(out, id.NKeyPublic()) || !strings.Contains(out, "accounts") {
		t.Fatalf("broker-config: %s", out)
	}

	// The commands that change something say what they did in the same
	// JSON form; the last revokes web1.
	for _, args := range [][]string{
		{"declare", "web1", declFile},
		{"node", "endpoint", "web1", "none"}, // no overlay yet: no roster published
		{"overlay", "set", "--network", "10.55.0.0/24"}, {"overlay", "show"}, {"node", "endpoint", "web1", "192.0.2.1:51820"},
		{"token", "issue", "--new", "--name", "web2"}, {"node", "add", "web3", "--out", filepath.Join(t.TempDir(), "web3.json")},
		{"node", "revoke", "web1"},
	} {
		js, errs, code := run(t, ctx, append(args, "--dir", dir, "--json")...)
		if err := jsonform.Check([]byte(js)); code != 0 || err != nil {
			t.Errorf("%v --json: exit %d, %v\n%s%s", args, code, err, js, errs)
		}
	}
}

// The key directory of a control side installed as a service is the
// default, $MESH_CONTROL_DIR another; init warns when the broker
// certificate would name loopback alone, and not when --host names more.
func TestDirDefaultAndTheLoopbackWarning(t *testing.T) {
	ctx := context.Background()
	t.Setenv(control.DirEnv, "")
	if got := control.DefaultDir(); got != "/var/lib/mesh-control" {
		t.Fatalf("the default key directory is %q", got)
	}
	dir := filepath.Join(t.TempDir(), "keys")
	t.Setenv(control.DirEnv, dir)
	_, errs, code := run(t, ctx, "init")
	if code != 0 || !strings.Contains(errs, "warning: the broker certificate names only 127.0.0.1, ::1 and localhost") || !strings.Contains(errs, "give --host NAME") {
		t.Fatalf("init with $%s and no --host: exit %d\n%s", control.DirEnv, code, errs)
	}
	if _, err := control.LoadKeys(dir); err != nil {
		t.Fatalf("init did not use $%s: %v", control.DirEnv, err)
	}
	_, errs, code = run(t, ctx, "init", "--dir", filepath.Join(t.TempDir(), "k2"), "--host", "127.0.0.1,mesh.example.org")
	if code != 0 || strings.Contains(errs, "warning") {
		t.Fatalf("init --host naming more than loopback: exit %d\n%s", code, errs)
	}
}

// A value no overlay could take is refused before the command asks the
// broker for anything: with none listening, the answer is about the
// value, not about the broker.
func TestOverlaySetRefusesABadValueBeforeItConnects(t *testing.T) {
	ctx := context.Background()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	url := "tls://" + l.Addr().String()
	l.Close() // nothing listens there
	dir := filepath.Join(t.TempDir(), "keys")
	if _, errs, code := run(t, ctx, "init", "--dir", dir, "--url", url); code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	for _, c := range []struct{ flag, value, say string }{
		{"--network", "10.300.0.0/16", "10.300.0.0/16"},
		{"--port", "70000", "out of range"},
		{"--keepalive", "-1", "out of range"},
		{"--interface", "wg 0", `overlay interface "wg 0" is not an interface name`},
		{"--interface", "eth0", `overlay interface "eth0" is a name a machine's own links take (eth…)`},
		{"--interface", "enp3s0", "(en…)"},
		{"--interface", "lo", "(lo…)"},
		{"--interface", "docker0", "(docker…)"},
	} {
		_, errs, code := run(t, ctx, "overlay", "set", c.flag, c.value, "--dir", dir)
		if code == 0 || !strings.Contains(errs, c.say) || strings.Contains(errs, "broker") {
			t.Errorf("overlay set %s %s: exit %d, %q", c.flag, c.value, code, errs)
		}
	}
	// A good value goes on to the broker, which is not there.
	if _, errs, code := run(t, ctx, "overlay", "set", "--network", "10.55.0.0/24", "--dir", dir); code == 0 || !strings.Contains(errs, "broker") {
		t.Errorf("overlay set with no broker: exit %d, %q", code, errs)
	}
}

// init refuses a directory of other files (it would make it private and
// mix the keys among them) and a broker address no node could use, and
// changes nothing for either; the values a token or a node's files carry
// are held to the same rule.
func TestInitAndTokensRefuseWhatNoNodeCouldUse(t *testing.T) {
	ctx := context.Background()
	other := t.TempDir()
	os.Chmod(other, 0o755)
	if err := os.WriteFile(filepath.Join(other, "readme"), []byte("someone's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := run(t, ctx, "init", "--dir", other); code == 0 || !strings.Contains(errs, "readme") {
		t.Fatalf("init in a directory of other files: exit %d: %s", code, errs)
	}
	if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o755 {
		t.Fatalf("init refused made the directory %v", fi.Mode().Perm())
	}
	for _, url := range []string{"abc", "tls://127.0.0.1:abc", "http://127.0.0.1:4222", "tls://127.0.0.1:70000"} {
		dir := filepath.Join(t.TempDir(), "keys")
		if _, errs, code := run(t, ctx, "init", "--dir", dir, "--url", url); code != 2 || !strings.Contains(errs, "--url") {
			t.Fatalf("init --url %s: exit %d: %s", url, code, errs)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("init --url %s, refused, made %s", url, dir)
		}
	}
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"token", "issue", "--new", "--ttl", "-1h"}, "--ttl -1h0m0s: a token lives a while"},
		{[]string{"token", "issue", "--new", "--ttl", "0"}, "--ttl 0s: a token lives a while"},
		{[]string{"reports", "web1", "--last", "0"}, "--last 0: how many"},
		{[]string{"reports", "web1", "--last", "-1"}, "--last -1: how many"},
		{[]string{"token", "issue", "--new", "--broker-url", "banana"}, "--broker-url"},
		{[]string{"node", "add", "web1", "--broker-url", "http://127.0.0.1:4222", "--out", filepath.Join(t.TempDir(), "w", "agent.json")}, "--broker-url"},
		{[]string{"overlay", "set", "--network", "bogus"}, "bogus"},
	} {
		// A flag's value of a form the command does not take: the command
		// line's fault, exit 2, as the flag parser's.
		if _, errs, code := run(t, ctx, append(c.args, "--dir", dir, "--nats", s.url)...); code != 2 || !strings.Contains(errs, c.say) {
			t.Errorf("%v: exit %d: %s", c.args, code, errs)
		}
	}
}

// serve on an address another process holds says why it did not start:
// the broker's own reason, not only that it did not.
func TestServeOnATakenAddressSaysWhy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := filepath.Join(t.TempDir(), "keys")
	if _, errs, code := run(t, context.Background(), "init", "--dir", dir, "--url", "tls://"+l.Addr().String()); code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, errs, code := run(t, ctx, "serve", "--dir", dir)
	_, last, _ := strings.Cut(errs, "mesh-control serve: ")
	if code == 0 || !strings.Contains(last, "address already in use") {
		t.Fatalf("serve on a taken address: exit %d: %s", code, errs)
	}
}

// A key directory named by $MESH_CONTROL_DIR, not by --dir, is said to be
// the variable's where a command cannot use it.
func TestADirectoryFromTheEnvironmentIsSaidSo(t *testing.T) {
	typo := filepath.Join(t.TempDir(), "typo")
	t.Setenv(control.DirEnv, typo)
	_, errs, code := run(t, context.Background(), "nodes")
	if code == 0 || !strings.Contains(errs, typo) || !strings.Contains(errs, "$"+control.DirEnv) {
		t.Fatalf("nodes with $%s=%s: exit %d: %s", control.DirEnv, typo, code, errs)
	}
	if _, errs, _ = run(t, context.Background(), "nodes", "--dir", typo); strings.Contains(errs, "$"+control.DirEnv) {
		t.Fatalf("nodes --dir %s blames the variable: %s", typo, errs)
	}
}

// A command's own checks of its command line (which flags go together, a
// flag's form) exit 2, as the flag parser's do: a script tells a command
// line it wrote wrong from a command that failed.
func TestACommandLineACommandRefusesExitsTwo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if _, errs, code := run(t, context.Background(), "init", "--dir", dir); code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	decl := filepath.Join(t.TempDir(), "f.json")
	if err := os.WriteFile(decl, []byte(`{"version":1,"resources":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"token", "issue"},
		{"token", "issue", "--new", "--node", "n1"},
		{"token", "issue", "--node", "n1", "--name", "x"},
		{"serve", "--replicas", "3"},
		{"declare", "n1", decl, "--seal", "garbage"},
	} {
		if _, errs, code := run(t, context.Background(), append(args, "--dir", dir)...); code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, errs)
		}
	}
}

// node add writes the executor's identity beside --out: a second node
// given the same directory is refused before it is registered, saying so
// rather than only that a file exists.
func TestNodeAddIntoAnotherNodesDirectory(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx := context.Background()
	files := t.TempDir()
	if _, errs, code := run(t, ctx, "node", "add", "a1", "--out", filepath.Join(files, "a1.json"), "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("node add a1: exit %d %s", code, errs)
	}
	_, errs, code := run(t, ctx, "node", "add", "b1", "--out", filepath.Join(files, "b1.json"), "--dir", dir, "--nats", s.url)
	if code != 1 || !strings.Contains(errs, "executor-identity.json exists; not overwriting it (another node's, perhaps") {
		t.Fatalf("node add b1 beside a1: exit %d %s", code, errs)
	}
	if _, _, err := s.client.Node(ctx, "b1"); err == nil {
		t.Fatal("b1 registered though refused")
	}
}
