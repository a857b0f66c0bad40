package control_test

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The status page, in a real headless Chromium (Debian's
// chromium-headless-shell): it loads, shows every node with its state and
// versions, and a node's failed line with its detail, on the overview and
// on the node's own page with its timeline; it answers GET alone. The
// screenshot is kept in tests/artifacts/status-page.png.
func TestStatusPageInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium-headless-shell")
	if err != nil {
		t.Fatalf("chromium-headless-shell (Debian's package, installed by tests/install-deps.sh): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "keys")
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().String()
	l.Close()
	if _, errs, code := run(t, ctx, "init", "--dir", dir, "--url", "tls://"+port); code != 0 {
		t.Fatal(errs)
	}
	ul, _ := net.Listen("tcp", "127.0.0.1:0")
	ui := ul.Addr().String()
	ul.Close()
	sctx, stop := context.WithCancel(ctx)
	served := make(chan int, 1)
	go func() { _, _, c := run(t, sctx, "serve", "--dir", dir, "--listen", port, "--ui", ui); served <- c }()
	defer func() { stop(); <-served }()
	cfg := filepath.Join(t.TempDir(), "web1", "agent.json")
	for {
		_, errs, code := run(t, ctx, "node", "add", "web1", "--dir", dir, "--out", cfg)
		if code == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node add: %s", errs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	run(t, ctx, "node", "add", "db1", "--dir", dir, "--out", filepath.Join(t.TempDir(), "db1", "agent.json"))
	id, err := agent.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	for nc == nil {
		// The broker takes the node's user a moment after node add.
		if nc, err = agent.Dial(id); err != nil && ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer nc.Close()
	send := func(subj string, v any) {
		data, _ := json.Marshal(v)
		m := nats.NewMsg(subj)
		m.Data = data
		sig, _ := id.Sign(data)
		m.Header.Set(link.SignatureHeader, sig)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	send(id.Subjects.Report, link.Report{Node: "web1", Enrolment: id.Enrolment, Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, Lines: []shapes.Line{{Module: "site", ID: "conf", Type: "file", Outcome: shapes.Applied}}, At: now.Add(-time.Minute)})
	const detail = "the unit lp-site.service failed to start: exit status 3 <script>alert(1)</script>"
	send(id.Subjects.Report, link.Report{Node: "web1", Enrolment: id.Enrolment, Seq: 2, Trigger: link.TriggerDeclaration, Outcome: shapes.Failed,
		Lines: []shapes.Line{{Module: "site", ID: "conf", Type: "file", Outcome: shapes.Unchanged}, {Module: "site", ID: "svc", Type: "service", Outcome: shapes.Failed, Detail: detail}}, At: now})
	// What the executor did on its own (a drift repaired), its detail a
	// node's words too.
	send(id.Subjects.Report, link.Report{Node: "web1", Enrolment: id.Enrolment, Trigger: link.TriggerActivity, Outcome: shapes.Repaired, At: now,
		Meanwhile: []shapes.Activity{{At: now, Source: "link", Trigger: "drift", Seq: 2, Outcome: shapes.Repaired, Changed: 1,
			Lines: []shapes.Line{{Module: "ssh", ID: "banner", Type: "file", Outcome: shapes.Repaired, Detail: "content was changed <b>by something else</b>"}}}}})
	send(id.Subjects.Heartbeat, link.Heartbeat{Node: "web1", Enrolment: id.Enrolment, At: now, Interval: 30, State: link.StateEnrolled, Presence: link.PresenceResident,
		AgentVersion: "0.9.2", Executor: &link.ExecutorStatus{Version: "0.9.2", Build: "b2", Seq: 2, Outcome: shapes.Failed}, LastApplied: 2})
	nc.Flush()

	page := func(path string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, chromium, "--no-sandbox", "--disable-gpu", "--dump-dom", "http://"+ui+path).Output()
		if err != nil {
			t.Fatalf("chromium %s: %v", path, err)
		}
		return string(out)
	}
	var dom string
	for {
		dom = page("/")
		if strings.Contains(dom, "site.svc") || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{"web1", "db1", "never heard from", "0.9.2", ">failed<", "site.svc", "the unit lp-site.service failed to start: exit status 3 &lt;script&gt;alert(1)&lt;/script&gt;"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the overview in Chromium lacks %q:\n%s", want, dom)
		}
	}
	if strings.Contains(dom, "<script>alert(1)</script>") {
		t.Error("a node's words are put in the page unescaped")
	}
	node := page("/node/web1")
	if !strings.Contains(node, `class="tl bad"`) || !strings.Contains(node, `class="tl changed"`) || !strings.Contains(node, "seq 2") || !strings.Contains(node, "site.svc") {
		t.Errorf("web1's page lacks its timeline or its failed line:\n%s", node)
	}
	if !strings.Contains(node, "(activity)") || !strings.Contains(node, "on its own") || !strings.Contains(node, "ssh.banner") ||
		!strings.Contains(node, "content was changed &lt;b&gt;by something else&lt;/b&gt;") {
		t.Errorf("web1's page lacks what its executor did on its own, or shows it unescaped:\n%s", node)
	}
	// Kept for a person to look at.
	shot, _ := filepath.Abs("../tests/artifacts/status-page.png")
	os.MkdirAll(filepath.Dir(shot), 0o755)
	if out, err := exec.CommandContext(ctx, chromium, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,700", "--screenshot="+shot, "http://"+ui+"/").CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 2000 {
		t.Fatalf("the screenshot %s: %v", shot, err)
	}
	t.Logf("the status page, as Chromium drew it: %s", shot)

	// Read-only.
	resp, err := http.Post("http://"+ui+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST answered %d, want 405", resp.StatusCode)
	}
}

// The status page's overview says what `mesh-control status` says of the
// same fleet, line for line and in the same words (the two are made by
// one piece of code), with what wants a look marked for the eye, and
// counts a report's lines as reports does: read by
// a plain GET from a real serve --ui, beside the status command run
// against the same serve.
func TestStatusPageSaysWhatStatusSays(t *testing.T) {
	dir := t.TempDir()
	ul, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ui := ul.Addr().String()
	ul.Close()
	s := serveWith(t, dir, control.ServeOptions{Listen: "127.0.0.1:0", UI: ui})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	statusFleet(t, ctx, s, dir)

	resp, err := http.Get("http://" + ui + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d, %v\n%s", resp.StatusCode, err, body)
	}
	out, errs, code := run(t, ctx, "status", "--dir", dir, "--nats", s.url)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errs)
	}
	rows := statusRows(t, string(body))

	// Line for line: what status prints, its columns' spaces as one, is
	// what the page's status table says, in order. Only how long ago a
	// node was last heard may have moved on between the two reads.
	var said, shown []string
	for _, l := range strings.Split(out, "\n") {
		if l = flatAgo(l); l != "" {
			said = append(said, l)
		}
	}
	for _, r := range rows {
		shown = append(shown, flatAgo(r.head+" "+r.value))
	}
	if strings.Join(said, "\n") != strings.Join(shown, "\n") {
		t.Errorf("the page does not say what status says:\nstatus:\n%s\n\npage:\n%s", strings.Join(said, "\n"), strings.Join(shown, "\n"))
	}

	// Its last report counted as reports counts it, on the overview and
	// on the node's own page.
	const counted = "0 changed, 1 unchanged, 1 failed"
	if !strings.Contains(string(body), counted) {
		t.Errorf("the overview does not count web1's last report (%q):\n%s", counted, body)
	}
	if resp, err := http.Get("http://" + ui + "/node/web1"); err != nil {
		t.Error(err)
	} else {
		node, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(node), counted) {
			t.Errorf("web1's page does not count its report (%q):\n%s", counted, node)
		}
	}

	// What wants a look is marked so, and nothing else.
	for _, tc := range []struct {
		head, value, class string
	}{
		{"store:", "takes writes", ""},
		{"registry:", "read, 4 node(s)", ""},
		{"enrolled (linked at its last word)", "2 down1, web1", ""},
		{"revoked", "1 gone1", ""},
		{"never heard from", "1 quiet1", ""},
		{"a failed line (last report or briefing):", "1 web1", "bad"},
		{"a held line (last report or briefing):", "1 web1", "note"},
		{"its executor unreachable by its agent:", "1 down1", "bad"},
		{"nothing declared to its enrolment (declare to it again):", "0", ""},
		{"executor versions (nodes not revoked):", "0.9.2 (b2): 1", ""},
		{"agent versions (nodes not revoked):", "0.9.2 (a7): 1", ""},
		{"overlay:", "10.77.0.0/24 on mesh0; 3 node(s) addressed, 1 last reported it applied", ""},
	} {
		t.Run(tc.head, func(t *testing.T) {
			i := slices.IndexFunc(rows, func(r statusRowShown) bool { return r.head == tc.head })
			if i < 0 {
				t.Fatalf("no %q on the page", tc.head)
			}
			if got := rows[i]; flatAgo(got.value) != tc.value || got.class != tc.class {
				t.Errorf("%q: %q (class %q), want %q (class %q)", tc.head, got.value, got.class, tc.value, tc.class)
			}
		})
	}
}

// statusRowShown is a row of the page's status table: a title row has
// the title as its head and no value.
type statusRowShown struct{ head, value, class string }

// statusRows reads the page's status table (id="status"), its cells
// unescaped, in the page's order.
func statusRows(t *testing.T, page string) []statusRowShown {
	t.Helper()
	start := strings.Index(page, `<table class="status" id="status">`)
	end := strings.Index(page[max(start, 0):], "</table>")
	if start < 0 || end < 0 {
		t.Fatalf("the page has no status table:\n%s", page)
	}
	cell := regexp.MustCompile(`<th colspan="2">(.*?)</th>|<td class="head">(.*?)</td><td(?: class="(\w+)")?>(.*?)</td>`)
	var rows []statusRowShown
	for _, m := range cell.FindAllStringSubmatch(page[start:start+end], -1) {
		if m[1] != "" {
			rows = append(rows, statusRowShown{head: html.UnescapeString(m[1])})
			continue
		}
		rows = append(rows, statusRowShown{head: html.UnescapeString(m[2]), class: m[3], value: html.UnescapeString(m[4])})
	}
	if len(rows) == 0 {
		t.Fatalf("the page's status table has no rows:\n%s", page[start:start+end])
	}
	return rows
}

// flatAgo is s with its spaces as one and how long ago anything was
// ("12s ago") as "… ago".
func flatAgo(s string) string {
	s = regexp.MustCompile(`[0-9][0-9hms.µ]* ago`).ReplaceAllString(s, "… ago")
	return strings.Join(strings.Fields(s), " ")
}
