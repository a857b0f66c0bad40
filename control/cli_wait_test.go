package control_test

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// terminal opens a pseudo-terminal, as a person's shell has one: the file
// a program writes to (a terminal, as isatty(3) sees it), and what was
// written to it, read from the other side, once the program is done with
// it (done closes it).
func terminal(t *testing.T) (tty *os.File, done func() string) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal: %v", err)
	}
	fd := int(ptmx.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	copied := make(chan struct{})
	go func() {
		io.Copy(&seen, ptmx) // ends with EIO once the terminal's side is closed
		close(copied)
	}()
	return tty, func() string {
		tty.Close()
		<-copied
		ptmx.Close()
		return seen.String()
	}
}

// refusal is a node's answer that refuses what was declared.
var refusal = []shapes.Line{{Outcome: shapes.Refused}}

// answering makes the enrolled nodes answer every declaration to them as
// their agents would, with a report signed by the node: lines says each
// node's lines (refusal: the executor refuses it); a node not in it stays
// silent.
func answering(t *testing.T, s *served, ids map[string]*agent.Identity, lines map[string][]shapes.Line) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for name, ls := range lines {
		id := ids[name]
		nc, err := agent.Dial(id)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer nc.Close()
			var answered uint64
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				rec, _, err := s.client.Node(t.Context(), name)
				if err != nil || rec.NextSeq <= answered+1 {
					continue
				}
				answered = rec.NextSeq - 1
				r := link.Report{Node: name, Enrolment: id.Enrolment, Seq: answered, Trigger: link.TriggerDeclaration,
					Outcome: shapes.Derive(ls), Lines: ls, At: time.Now().UTC()}
				if len(ls) == 1 && ls[0].Outcome == shapes.Refused {
					r.Outcome, r.Lines, r.Refused, r.Code, r.RefusedBy = shapes.Refused, nil, "executor: refused: /etc is the host's", "invalid", "executor"
				}
				data, _ := json.Marshal(r)
				m := nats.NewMsg(id.Subjects.Report)
				m.Data = data
				sig, _ := id.Sign(data)
				m.Header.Set(link.SignatureHeader, sig)
				nc.PublishMsg(m)
				nc.Flush()
			}
		}()
	}
}

var anySeq = regexp.MustCompile(`seq \d+`)

// reportHead is the start of a report as reports prints it: its time.
var reportHead = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT`)

// declare --wait ends with a summary in Puppet's manner, a line a node and
// the total, on a terminal or not; while it waits, a terminal is told how
// many nodes answered, and a pipe is not.
func TestWaitSaysProgressAndASummary(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	ids := map[string]*agent.Identity{}
	for _, n := range []string{"web1", "web2", "web3", "web4"} {
		_, ids[n] = enrolNode(t, s, n)
	}
	line := func(id string, o shapes.Outcome) shapes.Line {
		return shapes.Line{Module: "base", ID: id, Type: "file", Outcome: o}
	}
	answering(t, s, ids, map[string][]shapes.Line{
		"web1": {line("motd", shapes.Applied), line("issue", shapes.Applied), line("hosts", shapes.Unchanged)},
		"web2": {line("motd", shapes.Applied), line("issue", shapes.Failed), line("found", shapes.Held)},
		"web4": refusal,
		// web3 never answers.
	})
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)

	for _, c := range []struct {
		nodes, wait string
		tty         bool
		code        int
		// lines are the summary's, in order, and the total last.
		lines []string
		// progress is what a terminal is told while waiting ("": nothing).
		progress string
		// before is the line before the summary.
		before string
	}{
		{"web1", "--wait=20s", false, 0, []string{
			"web1  seq N  applied  2 changed, 1 unchanged, 0 failed",
			"1 node: 1 applied (2 changed, 1 unchanged, 0 failed), 0 no answer"}, "", ""},
		{"web1,web2", "--wait=20s", false, control.ExitFailed, []string{
			"web1  seq N  applied  2 changed, 1 unchanged, 0 failed",
			"web2  seq N  failed   1 changed, 0 unchanged, 1 failed, 1 held",
			"2 nodes: 1 applied, 1 failed (3 changed, 1 unchanged, 1 failed, 1 held), 0 no answer"}, "", ""},
		{"web1,web3", "--wait=2s", true, control.ExitTimedOut, []string{
			"web1  seq N  applied    2 changed, 1 unchanged, 0 failed",
			"web3  seq N  no answer  within 2s",
			"2 nodes: 1 applied (2 changed, 1 unchanged, 0 failed), 1 no answer"}, "waiting for the nodes' reports: 1 of 2 answered", ""},
		{"web4,web1", "--wait=20s", false, control.ExitRefused, []string{
			"web4  seq N  refused  by the executor",
			"web1  seq N  applied  2 changed, 1 unchanged, 0 failed",
			"2 nodes: 1 applied, 1 refused (2 changed, 1 unchanged, 0 failed), 0 no answer"}, "", ""},
		{"web3", "--wait=1s", false, control.ExitTimedOut, []string{
			"web3  seq N  no answer  within 1s",
			"1 node: 0 applied (0 changed, 0 unchanged, 0 failed), 1 no answer"}, "", "declared seq N to web3"},
		// A node not declared to: the others are waited for all the same,
		// and the command fails.
		{"web1,nosuch", "--wait=20s", false, 1, []string{
			"web1  seq N  applied  2 changed, 1 unchanged, 0 failed",
			"1 node: 1 applied (2 changed, 1 unchanged, 0 failed), 0 no answer"}, "", ""},
	} {
		t.Run(c.nodes, func(t *testing.T) {
			var stdout, stderr syncBuffer
			var errOut io.Writer = &stderr
			seen := func() string { return "" }
			if c.tty {
				tty, done := terminal(t)
				errOut, seen = tty, done
			}
			code := control.Main(ctx, []string{"declare", c.nodes, file, c.wait, "--dir", dir, "--nats", s.url}, &stdout, errOut)
			onTerminal := seen()
			out := stdout.String()
			t.Logf("standard output:\n%s", out)
			if code != c.code {
				t.Errorf("exit %d, want %d\n%s%s%s", code, c.code, out, stderr.String(), onTerminal)
			}
			// Each node's sequence is as many as were declared to it
			// before: said as N, so a case stands on its own.
			tail := strings.Split(strings.TrimRight(anySeq.ReplaceAllString(out, "seq N"), "\n"), "\n")
			// Apart from the reports by a blank line; with none, right
			// under what was declared.
			if len(tail) < len(c.lines)+1 || strings.Join(tail[len(tail)-len(c.lines)-1:], "\n") != strings.Join(append([]string{c.before}, c.lines...), "\n") {
				t.Errorf("the summary is not\n%s\nstandard output:\n%s", strings.Join(c.lines, "\n"), out)
			}
			progress := strings.Contains(out+stderr.String()+onTerminal, "waiting for")
			if c.progress == "" && progress || c.progress != "" && !strings.Contains(onTerminal, c.progress) {
				t.Errorf("progress said where it should not be, or not on the terminal:\nstandard output:\n%s\nstandard error:\n%s\nterminal:\n%q", out, stderr.String(), onTerminal)
			}
			// Cleared before what follows it: the terminal's line after
			// the last progress is the command's complaint alone (a
			// terminal ends its lines \r\n).
			if want := "\r\x1b[Kmesh-control declare: no report within 2s from web3 (seq N)\r\n"; c.tty && !strings.HasSuffix(anySeq.ReplaceAllString(onTerminal, "seq N"), want) {
				t.Errorf("the terminal does not end %q: %q", want, onTerminal)
			}
		})
	}
}

// declare --json prints one JSON value whether it waited or not: what it
// declared, with each report --wait saw under "report" (none for a node
// that did not answer in time), so a script reads one value of one shape.
func TestWaitInJSONIsOneValue(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	ids := map[string]*agent.Identity{}
	for _, n := range []string{"web1", "web3"} {
		_, ids[n] = enrolNode(t, s, n)
	}
	answering(t, s, ids, map[string][]shapes.Line{
		"web1": {{Module: "base", ID: "motd", Type: "file", Outcome: shapes.Applied}},
		// web3 never answers.
	})
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	type decl struct {
		Node   string `json:"node"`
		Seq    uint64 `json:"seq"`
		Report *struct {
			Outcome string `json:"outcome"`
		} `json:"report"`
	}
	// one decodes out as exactly one JSON value into v.
	one := func(t *testing.T, out string, v any) {
		t.Helper()
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(v); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if dec.More() {
			t.Fatalf("more than one JSON value:\n%s", out)
		}
	}
	for _, c := range []struct {
		nodes, wait string
		code        int
		// outcome is each node's report's outcome ("": no report).
		outcome map[string]string
	}{
		{"web1", "", 0, map[string]string{"web1": ""}},
		{"web1", "--wait=20s", 0, map[string]string{"web1": "applied"}},
		{"web3", "--wait=1s", control.ExitTimedOut, map[string]string{"web3": ""}},
		{"web1,web3", "--wait=2s", control.ExitTimedOut, map[string]string{"web1": "applied", "web3": ""}},
	} {
		t.Run(c.nodes+c.wait, func(t *testing.T) {
			var stdout, stderr syncBuffer
			args := []string{"declare", c.nodes, file, "--json", "--dir", dir, "--nats", s.url}
			if c.wait != "" {
				args = append(args, c.wait)
			}
			code := control.Main(ctx, args, &stdout, &stderr)
			out := stdout.String()
			if code != c.code {
				t.Errorf("exit %d, want %d\n%s%s", code, c.code, out, stderr.String())
			}
			var got []decl
			if strings.Contains(c.nodes, ",") {
				one(t, out, &got)
			} else {
				var d decl
				one(t, out, &d)
				got = []decl{d}
			}
			if len(got) != len(c.outcome) {
				t.Fatalf("%d nodes in\n%s", len(got), out)
			}
			for _, d := range got {
				want, ok := c.outcome[d.Node]
				switch {
				case !ok || d.Seq == 0:
					t.Errorf("node %q seq %d in\n%s", d.Node, d.Seq, out)
				case want == "" && d.Report != nil, want != "" && (d.Report == nil || d.Report.Outcome != want):
					t.Errorf("%s's report is not %q:\n%s", d.Node, want, out)
				}
			}
		})
	}
}

// reports ends with the summary --wait says, of the reports it printed: a
// row each (its sequence, outcome and lines counted; who refused it; a
// plan as a plan; an apply done before as nothing done now) and the total.
// Neither a plan nor a report of an earlier apply adds to the lines
// counted.
func TestReportsEndWithASummary(t *testing.T) {
	s, _, _, cli := servedCLI(t)
	line := func(id string, o shapes.Outcome) shapes.Line {
		return shapes.Line{Module: "base", ID: id, Type: "file", Outcome: o}
	}
	for _, c := range []struct {
		node    string
		reports []link.Report
		// summary is the lines after the blank line, spaces as one.
		summary []string
	}{
		{"applies", []link.Report{
			{Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, Lines: []shapes.Line{line("motd", shapes.Applied), line("issue", shapes.Applied), line("hosts", shapes.Unchanged)}},
			{Seq: 2, Trigger: link.TriggerReconnect, Outcome: shapes.Unchanged, Lines: []shapes.Line{line("motd", shapes.Unchanged), line("issue", shapes.Unchanged), line("hosts", shapes.Unchanged)}},
		}, []string{
			"seq 1 applied 2 changed, 1 unchanged, 0 failed",
			"seq 2 unchanged 0 changed, 3 unchanged, 0 failed",
			"2 reports: 2 applied (2 changed, 4 unchanged, 0 failed)",
		}},
		{"failed-refused", []link.Report{
			{Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Failed, Lines: []shapes.Line{line("motd", shapes.Applied), line("issue", shapes.Failed), line("found", shapes.Held)}},
			{Seq: 2, Trigger: link.TriggerDeclaration, Outcome: shapes.Refused, Refused: "executor: refused: /etc is the host's", Code: "invalid", RefusedBy: "executor"},
		}, []string{
			"seq 1 failed 1 changed, 0 unchanged, 1 failed, 1 held",
			"seq 2 refused by the executor",
			"2 reports: 0 applied, 1 failed, 1 refused (1 changed, 0 unchanged, 1 failed, 1 held)",
		}},
		{"plan-duplicate", []link.Report{
			{Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, Lines: []shapes.Line{line("motd", shapes.Applied)}},
			{Trigger: link.TriggerPlan, PlanID: "p1", Outcome: shapes.Applied, Lines: []shapes.Line{line("motd", shapes.Applied), line("issue", shapes.Failed)}},
			{Seq: 1, Trigger: link.TriggerDeclaration, Outcome: shapes.Applied, Duplicate: true, Lines: []shapes.Line{line("motd", shapes.Applied)}},
		}, []string{
			"seq 1 applied 1 changed, 0 unchanged, 0 failed",
			"plan p1 would apply 1 would change, 1 would fail (a plan: nothing changed)",
			"seq 1 applied already applied: nothing done now",
			"3 reports: 2 applied (1 changed, 0 unchanged, 0 failed), 1 plan(s)",
		}},
	} {
		t.Run(c.node, func(t *testing.T) {
			_, id := enrolNode(t, s, c.node)
			sendReports(t, id, c.reports...)
			var out string
			eventually(t, "the reports read", func() bool {
				o, errs, code := cli("reports", c.node)
				if code != 0 {
					t.Fatalf("reports: exit %d: %s", code, errs)
				}
				out = o
				return len(reportHead.FindAllString(o, -1)) == len(c.reports)
			})
			before, after, ok := strings.Cut(out, "\n\n")
			if !ok || !strings.Contains(before, "seq 1") {
				t.Fatalf("no summary apart from the reports:\n%s", out)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(after), "\n") {
				got = append(got, strings.Join(strings.Fields(l), " "))
			}
			if strings.Join(got, "\n") != strings.Join(c.summary, "\n") {
				t.Errorf("the summary is\n%s\nwant\n%s\nstandard output:\n%s", strings.Join(got, "\n"), strings.Join(c.summary, "\n"), out)
			}
		})
	}
}

// plan waits for the node's answer as declare --wait waits for reports,
// and says so alike on a terminal (and on a pipe, nothing): assign --plan
// asks through the same wait (planOf). The terminal's line is cleared
// before the command's complaint.
func TestPlanSaysProgressOnATerminal(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	_, id := enrolNode(t, s, "quiet") // enrolled, linked, and never answers
	var nc *nats.Conn
	eventually(t, "quiet let in", func() bool { c, err := agent.Dial(id); nc = c; return err == nil })
	defer nc.Close()
	if _, err := nc.Subscribe(id.Subjects.Plan, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	for _, onTTY := range []bool{true, false} {
		t.Run(map[bool]string{true: "terminal", false: "pipe"}[onTTY], func(t *testing.T) {
			var stdout syncBuffer
			errOut, seen := stderrOn(t, onTTY)
			code := control.Main(ctx, []string{"plan", "quiet", file, "--wait=2s", "--dir", dir, "--nats", s.url}, &stdout, errOut)
			said := seen()
			if code != control.ExitTimedOut {
				t.Errorf("exit %d, want %d\n%s%s", code, control.ExitTimedOut, stdout.String(), said)
			}
			const progress = "waiting for the node's plan: 0 of 1 answered ("
			if got := strings.Contains(said+stdout.String(), progress); got != onTTY {
				t.Errorf("progress said: %v, want %v\n%q", got, onTTY, said)
			}
			if want := "\r\x1b[Kmesh-control plan: no plan from quiet within 2s"; onTTY && !strings.Contains(said, want) {
				t.Errorf("the progress is not cleared before the complaint: %q", said)
			}
		})
	}
}

// A fan-out (declare to many nodes, publish, overlay set) says on a
// terminal how many nodes are done of how many, and clears the line
// after; a pipe gets none of it.
func TestFanOutsSayProgressOnATerminal(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	for _, n := range []string{"p1", "p2", "p3"} {
		enrolNode(t, s, n)
	}
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	const publishing, declaring = "\rpublishing to the nodes: 3 of 3 done\x1b[K\r\x1b[K", "\rdeclaring to the nodes: 3 of 3 done\x1b[K\r\x1b[K"
	for _, c := range []struct {
		args  []string
		onTTY bool
		says  string
	}{
		{[]string{"overlay", "set", "--network", "10.66.0.0/24"}, true, publishing},
		{[]string{"publish"}, true, publishing},
		{[]string{"publish"}, false, publishing},
		{[]string{"declare", "p1,p2,p3", file, "--without-overlay"}, true, declaring},
		{[]string{"declare", "p1,p2,p3", file, "--without-overlay"}, false, declaring},
	} {
		var stdout syncBuffer
		errOut, seen := stderrOn(t, c.onTTY)
		code := control.Main(ctx, append(c.args, "--dir", dir, "--nats", s.url), &stdout, errOut)
		said := seen()
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", c.args, code, stdout.String(), said)
		}
		if got := strings.Contains(said+stdout.String(), c.says); got != c.onTTY {
			t.Errorf("%v on a terminal %v: progress said and cleared %v\n%q", c.args, c.onTTY, got, said)
		}
	}
}

// stderrOn is a command's standard error in a test: a terminal (terminal)
// when onTTY, else a buffer; said reads what was written to it.
func stderrOn(t *testing.T, onTTY bool) (w io.Writer, said func() string) {
	t.Helper()
	if onTTY {
		return terminal(t)
	}
	b := new(syncBuffer)
	return b, b.String
}

// declare --wait reads the nodes' reports through one consumer of each
// report stream (link.ReportPlaces), whatever the number of nodes and
// however long it waits:
// it read each node's whole report subject anew four times a second, a
// consumer each time, which at a fleet's size is the broker's whole work.
// The consumers made are counted as the broker is asked for them.
func TestWaitReadsThroughOneConsumer(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	ids := map[string]*agent.Identity{}
	nodes := []string{"w1", "w2", "w3", "w4", "w5"}
	for _, n := range nodes {
		_, ids[n] = enrolNode(t, s, n)
	}
	answering(t, s, ids, map[string][]shapes.Line{"w1": {{Module: "base", ID: "motd", Type: "file", Outcome: shapes.Applied}}})
	// The others have reported before (a reconnect each), and say nothing
	// of what is declared now: there is something to read on every
	// subject, every time.
	for _, n := range nodes[1:] {
		nc, err := agent.Dial(ids[n])
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(link.Report{Node: n, Enrolment: ids[n].Enrolment, Trigger: link.TriggerReconnect, Outcome: shapes.Unchanged, At: time.Now().UTC()})
		sig, _ := ids[n].Sign(data)
		js, _ := jetstream.New(nc)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: ids[n].Subjects.Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
		nc.Close()
	}
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)

	count := map[string]int{}
	var mu sync.Mutex
	sub, err := s.client.NC.Subscribe("$JS.API.CONSUMER.CREATE.>", func(m *nats.Msg) {
		if stream := strings.Split(strings.TrimPrefix(m.Subject, "$JS.API.CONSUMER.CREATE."), ".")[0]; strings.HasPrefix(stream, link.ReportStream) {
			mu.Lock()
			count[stream]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	s.client.NC.Flush()
	var stdout, stderr syncBuffer
	code := control.Main(ctx, []string{"declare", strings.Join(nodes, ","), file, "--wait=3s", "--dir", dir, "--nats", s.url}, &stdout, &stderr)
	if code != control.ExitTimedOut || !strings.Contains(stdout.String(), "1 applied") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(count) == 0 {
		t.Fatal("the wait made no consumer of a report stream")
	}
	for stream, n := range count {
		if n != 1 {
			t.Fatalf("the wait made %d consumers of %s, want 1 (%v)", n, stream, count)
		}
	}
}

// A plan asked of a node no agent is linked for now is said so at once:
// a plan is not kept for a node away, and waiting its whole time for it
// says nothing more.
func TestAPlanOfANodeNotLinkedSaysSoAtOnce(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	if _, _, err := s.client.AddNode(ctx, "away", ""); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	var stdout, stderr syncBuffer
	code := control.Main(ctx, []string{"plan", "away", file, "--wait=1h", "--dir", dir, "--nats", s.url}, &stdout, &stderr)
	if code != control.ExitTimedOut || !strings.Contains(stderr.String(), "away is not linked now") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A plan the node's agent could not ask its executor for (the executor
// stopped) is no verdict: said so, with where to look, exit 3 as for no
// answer — not "would refuse it", which is a verdict on the declaration.
func TestAPlanWhoseExecutorIsDownIsNoRefusal(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	_, id := enrolNode(t, s, "down")
	var nc *nats.Conn
	eventually(t, "down let in", func() bool { c, err := agent.Dial(id); nc = c; return err == nil })
	defer nc.Close()
	// What the agent answers when its executor's socket does not answer
	// (agent/plan.go).
	if _, err := nc.Subscribe(id.Subjects.Plan, func(m *nats.Msg) {
		payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposePlan, m.Data)
		var req wire.PlanRequest
		if err != nil || json.Unmarshal(payload, &req) != nil {
			return
		}
		data, _ := json.Marshal(&link.Report{Node: id.Node, Enrolment: id.Enrolment, At: time.Now().UTC(), Trigger: link.TriggerPlan, PlanID: req.ID, Outcome: shapes.Refused, Lines: []shapes.Line{},
			Refused: "the executor could not be asked: dial unix /run/mesh-host/executor.sock: connect: no such file or directory", Code: wire.CodeInternal.String(), RefusedBy: "agent"})
		sig, _ := id.Sign(data)
		nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}})
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	var stdout, stderr syncBuffer
	code := control.Main(ctx, []string{"plan", "down", file, "--wait=20s", "--dir", dir, "--nats", s.url}, &stdout, &stderr)
	if code != control.ExitTimedOut || !strings.Contains(stderr.String(), "down made no plan: its agent could not ask its executor") || strings.Contains(stderr.String(), "would refuse") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A wait whose broker went away meanwhile says so beside the nodes that
// did not answer: their reports may be there, unread by this command.
func TestAWaitThatLostItsBrokerSaysSo(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	enrolNode(t, s, "web3") // never answers
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- control.Main(ctx, []string{"declare", "web3", file, "--wait=4s", "--dir", dir, "--nats", s.url}, &stdout, &stderr)
	}()
	for !strings.Contains(stdout.String(), "declared seq") {
		select {
		case code := <-done:
			t.Fatalf("declare ended first: exit %d\n%s%s", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.stop()
	code := <-done
	if code != control.ExitTimedOut || !strings.Contains(stderr.String(), "no report within 4s from web3 (seq 1); this command lost the broker") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A wait that ends without a node's report says why when the node's
// agent said so: its executor unreachable at its last heartbeat.
func TestAWaitSaysAnExecutorAway(t *testing.T) {
	s, dir, ctx, _ := servedCLI(t)
	_, id := enrolNode(t, s, "down1")
	heartbeatAs(t, id, func(hb *link.Heartbeat) {
		hb.ExecutorError = "dial unix /run/mesh-host/executor.sock: connect: connection refused"
	})
	file := filepath.Join(t.TempDir(), "site.json")
	os.WriteFile(file, []byte(`{"version": 1, "resources": [{"module": "base", "id": "motd", "type": "file", "path": "/etc/motd", "content": "hi\n"}]}`), 0o644)
	var stdout, stderr syncBuffer
	code := control.Main(ctx, []string{"declare", "down1", file, "--wait=1s", "--dir", dir, "--nats", s.url}, &stdout, &stderr)
	if code != control.ExitTimedOut || !strings.Contains(stderr.String(), "down1's agent cannot reach its executor (dial unix /run/mesh-host/executor.sock: connect: connection refused), at its last heartbeat") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}
