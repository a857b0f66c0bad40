package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
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

// heartbeatAs publishes a heartbeat signed by the node's NKey, as its
// agent does, saying it is enrolled; say, when given, makes it say more.
func heartbeatAs(t *testing.T, id *agent.Identity, say ...func(*link.Heartbeat)) {
	t.Helper()
	nc, err := agent.Dial(id, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	beatOver(t, nc, id, time.Time{}, say...)
}

// beatOver publishes, over nc, a heartbeat of id's node whose link came
// up at since (zero: says none), signed as its agent signs it.
func beatOver(t *testing.T, nc *nats.Conn, id *agent.Identity, since time.Time, say ...func(*link.Heartbeat)) {
	t.Helper()
	hb := &link.Heartbeat{Node: id.Node, Enrolment: id.Enrolment, At: time.Now().UTC(), Interval: 30,
		State: link.StateEnrolled, Presence: link.PresenceResident, LinkedSince: since.UTC()}
	for _, f := range say {
		f(hb)
	}
	data, _ := json.Marshal(hb)
	sig, err := id.Sign(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// Revocation says the truth, through the commands a person types: a
// revoked node is shown revoked (not the "enrolled" its last heartbeat
// said), in the table and in --json; declare, assign and publish to it
// are refused, exit 1, saying it is revoked and how it comes back, and
// take no sequence; revoking it again says it already is, since when, and
// does nothing (exit 0: see nodeRevoke); a token issued for it is named
// as the way back.
func TestRevocationSaysTheTruth(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, lost := enrolNode(t, s, "lost")
	enrolNode(t, s, "kept")
	heartbeatAs(t, lost)
	eventually(t, "lost heard from as enrolled", func() bool { return status(t, s, "lost").State == link.StateEnrolled })
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
	}
	decl := filepath.Join(dir, "decl.json")
	os.WriteFile(decl, []byte(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"hi\n"}]}`), 0o600)
	if out, errs, code := cli("declare", "lost", decl); code != 0 {
		t.Fatalf("declare before the revocation: %d %s%s", code, out, errs)
	}

	out, errs, code := cli("node", "revoke", "lost")
	if code != 0 || !strings.Contains(out, "node lost revoked: the broker refuses its credential") {
		t.Fatalf("node revoke: exit %d\n%s%s", code, out, errs)
	}
	rec, _, err := s.client.Node(ctx, "lost")
	if err != nil || rec.Revoked.IsZero() || rec.NKey != "" {
		t.Fatalf("the record after node revoke: %+v %v", rec, err)
	}

	// nodes, both ways.
	out, errs, code = cli("nodes", "--json")
	var ns []control.NodeStatus
	if code != 0 || json.Unmarshal([]byte(out), &ns) != nil {
		t.Fatalf("nodes --json: %d %s%s", code, out, errs)
	}
	states := map[string]control.NodeStatus{}
	for _, n := range ns {
		states[n.Name] = n
	}
	if n := states["lost"]; n.State != control.StateRevoked || !n.Revoked.Equal(rec.Revoked) {
		t.Fatalf("nodes --json shows the revoked node as %q (revoked %v), want %q at %v", n.State, n.Revoked, control.StateRevoked, rec.Revoked)
	}
	if n := states["kept"]; n.State == control.StateRevoked || !n.Revoked.IsZero() {
		t.Fatalf("nodes --json shows the bystander revoked: %+v", n)
	}
	out, _, _ = cli("nodes")
	var lostLine string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "lost ") {
			lostLine = l
		}
	}
	if f := strings.Fields(lostLine); len(f) < 2 || f[1] != control.StateRevoked {
		t.Fatalf("nodes: the revoked node's line %q, want STATE revoked:\n%s", lostLine, out)
	}

	// Sending to it: refused, saying why and what brings it back, and no
	// sequence taken.
	mod := filepath.Join(dir, "web.json")
	os.WriteFile(mod, []byte(webModule), 0o600)
	refusedTo := func(args ...string) {
		t.Helper()
		out, errs, code := cli(args...)
		if code != 1 || !strings.Contains(errs, "node lost is revoked (since ") || !strings.Contains(errs, "mesh-control token issue --node lost") {
			t.Fatalf("%v to a revoked node: exit %d, want 1 saying it is revoked and how to enrol it again:\n%s%s", args, code, out, errs)
		}
	}
	before := rec.NextSeq
	refusedTo("declare", "lost", decl)
	var re *control.RevokedError
	if _, err := s.client.Declare(ctx, "lost", []byte(`{"version":1,"owns_nothing":true,"resources":[]}`)); !errors.As(err, &re) || re.Node != "lost" {
		t.Fatalf("Declare to a revoked node: %v, want a *RevokedError", err)
	}
	if _, _, code := cli("overlay", "set"); code != 0 {
		t.Fatal("overlay set failed")
	}
	refusedTo("declare", "lost", decl) // not "the file declares no overlay"
	refusedTo("assign", "lost", mod)
	refusedTo("publish", "lost")
	if a, err := s.client.Assignments(ctx, "lost"); err != nil || len(a) != 0 {
		t.Fatalf("a revoked node was assigned %v (%v)", a, err)
	}
	if after, _, _ := s.client.Node(ctx, "lost"); after.NextSeq != before {
		t.Fatalf("refusals took sequences: next %d, was %d", after.NextSeq, before)
	}

	// Twice: said, with when; nothing changed.
	out, errs, code = cli("node", "revoke", "lost")
	when := rec.Revoked.Local().Format(time.RFC3339)
	if code != 0 || !strings.Contains(out, "node lost was already revoked at "+when) || !strings.Contains(out, "nothing done") {
		t.Fatalf("node revoke, again: exit %d, want 0 saying it was already revoked at %s:\n%s%s", code, when, out, errs)
	}
	out, _, code = cli("node", "revoke", "lost", "--json")
	var j struct {
		Already bool      `json:"already"`
		Revoked time.Time `json:"revoked"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || !j.Already || !j.Revoked.Equal(rec.Revoked) {
		t.Fatalf("node revoke --json, again: %d %s", code, out)
	}
	if again, _, _ := s.client.Node(ctx, "lost"); !again.Revoked.Equal(rec.Revoked) {
		t.Fatalf("a second revocation changed the record: revoked %v, was %v", again.Revoked, rec.Revoked)
	}
	if _, errs, code := cli("node", "revoke", "nosuch"); code != 1 || !strings.Contains(errs, `no node "nosuch"`) {
		t.Fatalf("node revoke of an unknown node: %d %s", code, errs)
	}

	// A re-enrolment token issued: the refusal names it.
	_, tok, err := s.client.IssueToken(ctx, "lost", false, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := cli("declare", "lost", decl); code != 1 || !strings.Contains(errs, "token "+tok.ID+", issued for it, enrols a machine as lost again") {
		t.Fatalf("declare to a revoked node with a token pending: %d %s", code, errs)
	}
}

// A node revoked keeps what it reported: reports reads each report under
// the NKey of the enrolment it names, the live one's or a past one's the
// record keeps, so the reports of a revoked node (what it did meanwhile
// is what an operator reads then) and of its enrolments before the one
// now live are shown; a report signed by another key is not.
func TestReportsOfARevokedOrReEnrolledNodeAreShown(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, first := enrolNode(t, s, "n1")
	reportAs(t, first, 1, shapes.Applied, nil, nil)
	eventually(t, "the first report recorded", func() bool { return status(t, s, "n1").LastReport != nil })
	time.Sleep(1100 * time.Millisecond)
	beat := time.Now()
	heartbeatAs(t, first)
	eventually(t, "the heartbeat heard", func() bool { return !status(t, s, "n1").LastHeard.Before(beat.Add(-time.Second)) })
	if _, _, err := s.client.Revoke(ctx, "n1", "test"); err != nil {
		t.Fatal(err)
	}
	// Last heard when its heartbeat came, not back at its last report.
	if n := status(t, s, "n1"); n.State != control.StateRevoked || n.LastHeard.Before(beat.Add(-time.Second)) {
		t.Fatalf("the revoked node: %s, last heard %v (its heartbeat came at %v)", n.State, n.LastHeard, beat)
	}
	seqs := func() []uint64 {
		t.Helper()
		rs, _, err := s.client.Reports(ctx, "n1", 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, r := range rs {
			out = append(out, r.Seq)
		}
		return out
	}
	if got := seqs(); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("the revoked node's reports: %v", got)
	}
	// Enrolled again: its reports, the earlier enrolment's with them.
	text, _, err := s.client.IssueToken(ctx, "n1", false, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	_, second := enrolByToken(t, s, "n1", text, link.LayoutByNode)
	reportAs(t, second, 2, shapes.Applied, nil, nil)
	eventually(t, "both enrolments' reports", func() bool { return slices.Equal(seqs(), []uint64{1, 2}) })
	// Signed by another key, naming the past enrolment, put on the
	// node's subject (by the control side's own connection, which may):
	// not the node's.
	_, other := enrolNode(t, s, "n2")
	data, _ := json.Marshal(link.Report{Node: "n1", Enrolment: first.Enrolment, Seq: 3, Outcome: shapes.Applied, At: time.Now().UTC()})
	sig, _ := other.Sign(data)
	if err := s.client.NC.PublishMsg(&nats.Msg{Subject: first.Subjects.Report, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil || s.client.NC.Flush() != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := seqs(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("a report another key signed is shown: %v", got)
	}
}
