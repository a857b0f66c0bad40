package serve

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// While the link is down the executor goes on (here, it restarts and
// repairs a drift); when the agent says the link is back and names the
// interval, the verdict says what was done in it, from the executor's own
// history — and nothing from before it, nor what changed nothing.
func TestReconnectSaysWhatWasDoneMeanwhile(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	from := time.Now()
	e.stop()
	motd := filepath.Join(e.root, "motd")
	os.WriteFile(motd, []byte("drift\n"), 0o644)
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
	e.afterStart() // which repairs it
	if b, _ := os.ReadFile(motd); string(b) != "hello\n" {
		t.Fatalf("the start reconcile did not repair the file: %q", b)
	}
	to := time.Now()

	c = e.dial()
	_, v := send(t, c, wire.KindReconnected, &wire.Reconnected{From: from, To: to})
	if len(v.Meanwhile) != 1 {
		t.Fatalf("meanwhile: %+v, want the one repair", v.Meanwhile)
	}
	if a := v.Meanwhile[0]; a.Trigger != "start" || a.Source != "link" || a.Outcome != shapes.Repaired || a.Changed != 1 || a.Seq != 1 ||
		len(a.Lines) != 1 || a.Lines[0].Module != "m" || a.Lines[0].ID != "motd" || a.Lines[0].Outcome != shapes.Repaired {
		t.Errorf("meanwhile: %+v (what it changed named: %+v)", a, a.Lines)
	}
	// The agent linked again before the start's reconcile ended (the two
	// start together at a boot): the repair was done unlinked all the
	// same, and is said.
	_, v = send(t, c, wire.KindReconnected, &wire.Reconnected{From: from, To: from.Add(time.Millisecond)})
	if len(v.Meanwhile) != 1 || v.Meanwhile[0].Trigger != "start" {
		t.Errorf("meanwhile, the link back before the start ended: %+v", v.Meanwhile)
	}
	// Without an interval (an agent that never linked before), nothing.
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
	c = e.dial()
	if _, v := send(t, c, wire.KindReconnected, &wire.Reconnected{}); len(v.Meanwhile) != 0 {
		t.Errorf("meanwhile with no interval: %+v", v.Meanwhile)
	}
}

// The agent says its link with every status; the daemon keeps it for
// `mesh-executor status`, a process of its own.
func TestStatusKeepsWhatTheAgentSaysOfItsLink(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	ask := func(l *wire.AgentLink) {
		t.Helper()
		if err := c.Write(wire.KindStatus, &wire.Status{Link: l}); err != nil {
			t.Fatal(err)
		}
		if k, _, err := c.Read(); err != nil || k != wire.KindStatusReply {
			t.Fatalf("status: %v %v", k, err)
		}
	}
	since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	ask(&wire.AgentLink{Up: false, Since: since})
	l, err := ReadLinkState(e.state)
	if err != nil || l == nil || l.Up || !l.Since.Equal(since) || time.Since(l.SaidAt) > time.Minute {
		t.Fatalf("kept: %+v %v", l, err)
	}
	ask(nil) // says nothing: nothing changes
	// Refused by the broker: revoked, kept with when the agent first saw
	// it, and the same said again writes nothing new.
	revoked := since.Add(30 * time.Minute)
	ask(&wire.AgentLink{Since: since, Revoked: revoked})
	l, err = ReadLinkState(e.state)
	if err != nil || l == nil || l.Up || !l.Since.Equal(since) || !l.Revoked.Equal(revoked) {
		t.Fatalf("kept after a revocation: %+v %v", l, err)
	}
	ask(&wire.AgentLink{Up: true, Since: since.Add(time.Hour)})
	if l, _ := ReadLinkState(e.state); l == nil || !l.Up || !l.Since.Equal(since.Add(time.Hour)) || !l.Revoked.IsZero() {
		t.Fatalf("kept after the link came back: %+v", l)
	}
	// Down, with why and the clock's measure: the reason kept printable
	// (an escape sequence is not passed to root's terminal) and short,
	// whatever the agent sends.
	at := since.Add(90 * time.Minute)
	ask(&wire.AgentLink{Since: at, Error: "broker unreachable at tls://10.0.0.1:4222: connection refused\x1b[2J", ClockSkew: -3 * time.Hour, ClockAt: at})
	l, err = ReadLinkState(e.state)
	if err != nil || l == nil || l.Up || l.LastError != "broker unreachable at tls://10.0.0.1:4222: connection refused\uFFFD[2J" ||
		l.ClockSkewMS != (-3*time.Hour).Milliseconds() || !l.ClockAt.Equal(at) {
		t.Fatalf("kept with an error and a measure: %+v %v", l, err)
	}
	ask(&wire.AgentLink{Since: at, Error: strings.Repeat("é", wire.MaxLinkError/2+14)}) // past what is kept, within the frame
	if l, _ := ReadLinkState(e.state); l == nil || len(l.LastError) != wire.MaxLinkError || l.LastError != strings.Repeat("é", wire.MaxLinkError/2) {
		t.Fatalf("a long error kept as %d bytes: %+v", len(l.LastError), l)
	}
}

// The link file is read by the release that wrote it and by the one
// before or after (a rollback, an upgrade): a file without this
// release's fields reads with them empty, one with fields it does not
// know reads all the same.
func TestLinkStateIsReadByEitherRelease(t *testing.T) {
	for _, c := range []struct{ name, file string }{
		{"an earlier release's", `{"up":false,"since":"2026-12-03T10:00:00Z","said_at":"2026-12-03T11:00:00Z"}`},
		{"a later release's", `{"up":false,"since":"2026-12-03T10:00:00Z","said_at":"2026-12-03T11:00:00Z","last_error":"refused","clock_skew_ms":-5000,"clock_at":"2026-12-03T10:59:00Z","a_later_field":{"x":1}}`},
		{"a later format's", `{"format":2,"up":false,"since":"2026-12-03T10:00:00Z","said_at":"2026-12-03T11:00:00Z","a_later_field":{"x":1}}`},
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, LinkFile), []byte(c.file), 0o600)
		l, err := ReadLinkState(dir)
		if err != nil || l == nil || l.Up || l.Since.IsZero() || l.SaidAt.IsZero() {
			t.Errorf("%s: %+v %v", c.name, l, err)
		}
	}
}

// --metrics-file: after each apply, the executor's metrics in Prometheus'
// text format (node_exporter's textfile collector): applies by source and
// outcome, the last apply of each source, what it holds, whether the
// agent says it is linked.
func TestMetricsFile(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	prom := filepath.Join(e.base, "mesh-executor.prom")
	e.start(Config{StateDir: e.state, Version: "1.2.3", Build: "b1", AgentUID: nobody, MetricsFile: prom})
	c := e.dial()
	if err := c.Write(wire.KindStatus, &wire.Status{Link: &wire.AgentLink{Up: true, Since: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	c.Read()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	b, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not Prometheus' text format: %v\n%s", err, b)
	}
	for _, want := range []string{
		`mesh_executor_info{version="1.2.3",build="b1"} 1`,
		`mesh_executor_applies_total{source="link",outcome="applied"} 1`,
		`mesh_executor_last_apply_failed{source="link"} 0`,
		`mesh_executor_link_sequence 1`,
		`mesh_executor_holds 1`,
		`mesh_executor_agent_linked 1`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("the metrics file lacks %s:\n%s", want, b)
		}
	}
	if f := families["mesh_executor_last_apply_duration_seconds"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("no apply duration: %v", f)
	}
}

// What the executor does on its own while linked (a drift repaired: a
// hand edit of a file the mesh holds put back) is counted, said by the
// status, and read by count — each once: a declaration's apply, which its
// own report carries, is passed over; the reconnect's verdict carries
// what was done since the count the agent names, whenever it was, and
// not its own reconcile (its lines are the verdict's).
func TestWhatTheExecutorDoesOnItsOwnIsReadByCount(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	status := func() uint64 {
		t.Helper()
		if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
			t.Fatal(err)
		}
		k, b, err := c.Read()
		if err != nil || k != wire.KindStatusReply {
			t.Fatalf("status: %v %v", k, err)
		}
		return b.(*wire.StatusReply).Activity
	}
	ask := func(after uint64) *wire.ActivityReply {
		t.Helper()
		if err := c.Write(wire.KindActivity, &wire.Activity{After: after}); err != nil {
			t.Fatal(err)
		}
		k, b, err := c.Read()
		if err != nil || k != wire.KindActivityReply {
			t.Fatalf("activity: %v %v", k, err)
		}
		return b.(*wire.ActivityReply)
	}
	if n := status(); n != 0 {
		t.Fatalf("a new executor counts %d activities", n)
	}
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	n := status()
	if r := ask(0); n != 1 || len(r.Acts) != 0 || r.Last != 1 {
		t.Fatalf("after a declaration: count %d, read %+v; want 1, none said (its report says it), reached 1", n, r)
	}
	motd := filepath.Join(e.root, "motd")
	os.WriteFile(motd, []byte("edited by hand\n"), 0o644)
	e.srv.Reconcile(t.Context(), "drift", nil)
	n = status()
	r := ask(1)
	if n != 2 || len(r.Acts) != 1 || r.Last != 2 {
		t.Fatalf("after a drift repaired: count %d, read %+v", n, r)
	}
	if a := r.Acts[0]; a.Trigger != "drift" || a.Outcome != shapes.Repaired || len(a.Lines) != 1 || a.Lines[0].ID != "motd" {
		t.Errorf("the repair as read: %+v", a)
	}
	if r := ask(2); len(r.Acts) != 0 || r.Last != 2 {
		t.Errorf("read again after it: %+v", r)
	}

	// Reconnected naming the count the agent reported: the repair it had
	// not reported, not the reconcile's own repair (a second hand edit).
	os.WriteFile(motd, []byte("edited again\n"), 0o644)
	after := uint64(1)
	lines, v := send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after})
	if len(v.Meanwhile) != 1 || v.Meanwhile[0].Trigger != "drift" || v.Activity != 3 {
		t.Fatalf("reconnect after count 1: meanwhile %+v, count %d; want the drift alone, 3", v.Meanwhile, v.Activity)
	}
	if len(lines) != 1 || lines[0].Outcome != shapes.Repaired {
		t.Errorf("the reconnect's own repair, in its lines: %+v", lines)
	}
	// Within the reconnect's bound (no reconcile): nothing new.
	after = 3
	if _, v := send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after}); len(v.Meanwhile) != 0 || v.Activity != 3 {
		t.Errorf("reconnect after count 3: meanwhile %+v, count %d", v.Meanwhile, v.Activity)
	}
	// The history lost (a store made again): counted from its start, and
	// an agent's count past it reads it all.
	os.Remove(filepath.Join(e.state, "history.jsonl"))
	os.WriteFile(motd, []byte("edited a third time\n"), 0o644)
	e.srv.Reconcile(t.Context(), "drift", nil)
	if n, r := status(), ask(3); n != 1 || len(r.Acts) != 1 || r.Last != 1 {
		t.Errorf("a history made anew: count %d, read after 3 %+v", n, r)
	}
}

// A reconnect's repairs whose report never went out (the agent killed
// between the verdict and the broker's confirmation, so its count stayed
// where it was) are said by the next reconnect, as what was done since
// that count: once the agent's count is past them, not again; and never
// the reconnect's own repairs, which its lines say.
func TestAReconnectsRepairsItsReportLostAreSaidByTheNext(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	motd := filepath.Join(e.root, "motd")
	os.WriteFile(motd, []byte("edited by hand\n"), 0o644)
	after := uint64(1) // the declaration's count: its own report said it
	lines, v := send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after})
	if len(lines) != 1 || lines[0].Outcome != shapes.Repaired || len(v.Meanwhile) != 0 || v.Activity != 2 {
		t.Fatalf("the first reconnect: lines %+v, meanwhile %+v, count %d", lines, v.Meanwhile, v.Activity)
	}
	said := func(v *wire.Verdict) bool {
		return len(v.Meanwhile) == 1 && v.Meanwhile[0].Trigger == triggerReconnect && v.Meanwhile[0].Outcome == shapes.Repaired &&
			len(v.Meanwhile[0].Lines) == 1 && v.Meanwhile[0].Lines[0].ID == "motd"
	}
	// Its report lost: the agent names count 1 again, at once (no
	// reconcile: within the reconnect's bound) and later (a reconcile,
	// which repairs a second hand edit and says it in its own lines).
	if _, v := send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after}); !said(v) || v.Activity != 2 {
		t.Fatalf("reconnect after count 1 again: meanwhile %+v, count %d; want the first reconnect's repair", v.Meanwhile, v.Activity)
	}
	os.WriteFile(motd, []byte("edited again\n"), 0o644)
	e.srv.lastMu.Lock()
	e.srv.lastReconnect = time.Time{}
	e.srv.lastMu.Unlock()
	lines, v = send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after})
	if !said(v) || v.Activity != 3 || len(lines) != 1 || lines[0].Outcome != shapes.Repaired {
		t.Fatalf("reconnect after count 1, reconciling: lines %+v, meanwhile %+v, count %d; want its own repair in its lines, the first's in meanwhile", lines, v.Meanwhile, v.Activity)
	}
	// Reported through 3: nothing said again.
	after = 3
	if _, v := send(t, c, wire.KindReconnected, &wire.Reconnected{After: &after}); len(v.Meanwhile) != 0 {
		t.Fatalf("reconnect after count 3: meanwhile %+v", v.Meanwhile)
	}
}

// The link state the agent says is kept whole: several connections saying
// it at once never leave the file torn or an older state last, and a time
// no JSON can hold (a year past 9999, which the agent may send) does not
// write the file empty.
func TestTheLinkStateIsKeptWholeUnderConcurrentSayers(t *testing.T) {
	e := newEnv(t, nobody, true)
	base := time.Now().UTC().Truncate(time.Second)
	var wg sync.WaitGroup
	for i := range 3 {
		c := e.dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 40 {
				since := base.Add(time.Duration(i*1000+j) * time.Second)
				if c.Write(wire.KindStatus, &wire.Status{Link: &wire.AgentLink{Up: j%2 == 0, Since: since}}) != nil {
					return
				}
				if _, _, err := c.Read(); err != nil {
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		if _, err := ReadLinkState(e.state); err != nil {
			t.Fatalf("the link state read while it is said: %v", err)
		}
	}
	c := e.dial()
	if err := c.Write(wire.KindStatus, &wire.Status{Link: &wire.AgentLink{Up: true, Since: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}); err != nil {
		t.Fatal(err)
	}
	c.Read()
	if l, err := ReadLinkState(e.state); err != nil || l == nil {
		t.Fatalf("after a time past year 9999: %+v %v", l, err)
	}
}
