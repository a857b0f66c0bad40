package control_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// addNode registers name and waits until the broker lets it in.
func addNode(t *testing.T, s *served, name string) (*agent.Config, *agent.Identity) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, _, err := s.client.AddNode(ctx, name, s.url)
	if err != nil {
		t.Fatal(err)
	}
	id, err := cfg.Identity()
	if err != nil {
		t.Fatal(err)
	}
	for {
		nc, err := agent.Dial(id)
		if err == nil {
			nc.Close()
			return cfg, id
		}
		if ctx.Err() != nil {
			t.Fatalf("node %s never let in: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logCapture is a broker logger that keeps every line.
type logCapture struct {
	mu    sync.Mutex
	lines []string
}

func (l *logCapture) add(f string, v ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(f, v...))
	l.mu.Unlock()
}
func (l *logCapture) Noticef(f string, v ...any) { l.add(f, v...) }
func (l *logCapture) Warnf(f string, v ...any)   { l.add(f, v...) }
func (l *logCapture) Fatalf(f string, v ...any)  { l.add(f, v...) }
func (l *logCapture) Errorf(f string, v ...any)  { l.add(f, v...) }
func (l *logCapture) Debugf(f string, v ...any)  { l.add(f, v...) }
func (l *logCapture) Tracef(f string, v ...any)  { l.add(f, v...) }
func (l *logCapture) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// The pin: an agent whose pinned fingerprint is not the broker
// certificate's fails inside the TLS handshake, with an error naming both
// fingerprints, and the broker never receives a CONNECT — it saw a TLS
// handshake fail and nothing else (its trace log, its closed connections).
func TestPinFailsBeforeConnect(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	goodCfg, good := addNode(t, s, "pinned")
	other, err := control.Init(t.TempDir(), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := *goodCfg
	cfg.BrokerFingerprint = other.Fingerprint
	bad, err := cfg.Identity()
	if err != nil {
		t.Fatal(err)
	}

	ns := s.srv.NATS()
	logs := &logCapture{}
	ns.SetLoggerV2(logs, true, true, false)
	before, _ := ns.Varz(nil)

	_, err = agent.Dial(bad)
	var le *agent.LinkError
	if !errors.As(err, &le) || le.Reason != agent.LinkFingerprint {
		t.Fatalf("dial with the wrong pin: %v, want a fingerprint LinkError", err)
	}
	if !strings.Contains(err.Error(), s.keys.Fingerprint) || !strings.Contains(err.Error(), other.Fingerprint) {
		t.Fatalf("the error does not name both fingerprints (got %s, pinned %s): %v", s.keys.Fingerprint, other.Fingerprint, err)
	}
	t.Logf("agent: %v", err)

	// The broker's side.
	deadline := time.Now().Add(5 * time.Second)
	var closed *server.ConnInfo
	for closed == nil && time.Now().Before(deadline) {
		cz, _ := ns.Connz(&server.ConnzOptions{State: server.ConnClosed})
		for _, c := range cz.Conns {
			if c.Start.After(before.Now) || c.Start.Equal(before.Now) {
				closed = c
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if closed == nil {
		t.Fatal("the broker has no closed connection for the attempt")
	}
	if closed.Reason != "TLS Handshake Failure" || closed.AuthorizedUser != "" || closed.Name != "" || closed.InMsgs != 0 {
		t.Fatalf("the broker's record of the attempt: reason %q, user %q, name %q, msgs %d; want a TLS failure and nothing else",
			closed.Reason, closed.AuthorizedUser, closed.Name, closed.InMsgs)
	}
	if logs.has("CONNECT") {
		t.Fatalf("the broker received a CONNECT: %q", logs.lines)
	}
	if !logs.has("TLS handshake error") {
		t.Fatalf("the broker did not log a TLS handshake error: %q", logs.lines)
	}
	after, _ := ns.Varz(nil)
	if after.Connections != before.Connections {
		t.Fatalf("client connections went from %d to %d", before.Connections, after.Connections)
	}
	// The detector works: the right pin does send a CONNECT.
	nc, err := agent.Dial(good)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if !logs.has("CONNECT") {
		t.Fatal("a good connection's CONNECT was not seen; the assertion above proves nothing")
	}
}

// Node isolation: node A's NKey can read the newest declaration on its own
// subject and hear its own notices, and cannot subscribe to, read or
// publish on node B's subjects, nor reach the stream by any other door;
// the broker refuses each, and B's subjects are untouched.
func TestNodeIsolation(t *testing.T) {
	for _, l := range []link.Layout{link.LayoutByNode, link.LayoutByKind} {
		t.Run(map[link.Layout]string{link.LayoutByNode: "by node", link.LayoutByKind: "by kind (an earlier agent)"}[l], func(t *testing.T) {
			nodeIsolation(t, l)
		})
	}
}

// inLayout is id as an agent of layout l has it.
func inLayout(id *agent.Identity, l link.Layout) *agent.Identity {
	c := *id
	c.Layout, c.Subjects = l, link.NodeSubjects(id.Node, l)
	return &c
}

// nodeIsolation is TestNodeIsolation with node alpha's agent of layout l:
// whichever it asks for, it reaches its own subjects through its own
// layout's doors, and nothing of beta's through either's.
func nodeIsolation(t *testing.T, l link.Layout) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	_, a := enrolNode(t, s, "alpha")
	a = inLayout(a, l)
	_, b := enrolNode(t, s, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Beta has a newest heartbeat a get could read.
	bc, err := agent.Dial(b, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bc.Request(b.Subjects.Heartbeat, []byte(`{"node":"beta"}`), 5*time.Second); err != nil {
		t.Fatalf("beta's heartbeat: %v", err)
	}
	bc.Close()
	nc, refused := dialWatched(t, a)
	notices, err := nc.SubscribeSync(a.Subjects.Notice)
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	for _, n := range []string{"beta", "alpha"} {
		if _, err := s.client.Declare(ctx, n, []byte(decl)); err != nil {
			t.Fatal(err)
		}
	}
	// Its own: the notice (alpha's only: beta's came first and was not
	// heard), carrying it, and the direct get of the newest.
	n, err := notices.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("alpha heard no notice of its declaration: %v", err)
	}
	m, err := nc.Request(a.Subjects.DeclGet, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("alpha cannot read its own newest declaration: %v", err)
	}
	if got := m.Header.Get(link.HeaderSubject); got != "mesh.decl.alpha" || m.Header.Get("Status") != "" || len(m.Data) == 0 {
		t.Fatalf("alpha read %q (status %q, %d bytes)", got, m.Header.Get("Status"), len(m.Data))
	}
	// Its own newest heartbeat, read back.
	if _, err := nc.Request(a.Subjects.Heartbeat, []byte(`{"node":"alpha"}`), 5*time.Second); err != nil {
		t.Fatalf("alpha's heartbeat: %v", err)
	}
	if hb, err := nc.Request(a.Subjects.HeartbeatGet, nil, 5*time.Second); err != nil || hb.Header.Get(link.HeaderSubject) != "mesh.heartbeat.alpha" || hb.Header.Get("Status") != "" {
		t.Fatalf("alpha cannot read back its own newest heartbeat: %v", err)
	}
	// The notice carries what the direct get reads: the envelope, and
	// its stream sequence.
	if n.Header.Get(link.HeaderSequence) != m.Header.Get(link.HeaderSequence) || !bytes.Equal(n.Data, m.Data) {
		t.Fatalf("the notice carries stream sequence %q and %d bytes, the message is %q and %d bytes",
			n.Header.Get(link.HeaderSequence), len(n.Data), m.Header.Get(link.HeaderSequence), len(m.Data))
	}
	if extra, err := notices.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("alpha heard a second notice: %s %q", extra.Subject, extra.Data)
	}

	// Subscribing to B's declarations or notices, or anything wider than
	// its inbox and its own notices.
	for _, subj := range []string{"mesh.decl.beta", "mesh.decl.*", "mesh.notice.beta", "mesh.notice.*", "mesh.>", ">", "_INBOX.beta.>", "_INBOX.>",
		"$JS.API.DIRECT.GET.>", "mesh.enrol.*", "_INBOX.enrol-0011223344556677.>", "mesh.plan.beta", "mesh.plan.*",
		// B's by node, and its own by the layout it did not ask for.
		"mesh.notice.beta.>", "mesh.notice.beta.plan", "mesh.notice.beta.inbox.>", "mesh.notice.*.>", "mesh.notice.>",
		link.NodeSubjects("alpha", 1-l).Plan, link.NodeSubjects("alpha", 1-l).Inbox + ".>"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		refused("subscribe", subj)
	}
	// Reading B's subject by any door, making a consumer, or reading the
	// stream otherwise.
	for _, subj := range []string{
		"mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.beta",
		"mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.*",
		"mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.>",
		"mesh.api.DIRECT.GET.MESH_DECL", // the form with the subject in its body
		"mesh.api.CONSUMER.CREATE.MESH_DECL.sneak.mesh.decl.beta",
		"mesh.api.CONSUMER.CREATE.MESH_DECL.sneak.mesh.decl.alpha",
		"mesh.api.CONSUMER.MSG.NEXT.MESH_DECL.node-beta",
		"mesh.api.STREAM.MSG.GET.MESH_DECL",
		"$JS.API.DIRECT.GET.MESH_DECL.mesh.decl.beta",
		"$JS.API.DIRECT.GET.MESH_DECL",
		"$JS.API.CONSUMER.CREATE.MESH_DECL.sneak.mesh.decl.beta",
		"$JS.API.CONSUMER.DURABLE.CREATE.MESH_DECL.sneak",
		"$JS.API.STREAM.MSG.GET.MESH_DECL",
		"$JS.API.STREAM.PURGE.MESH_DECL",
		"$KV.mesh_nodes.node.beta",
		"$JS.API.STREAM.INFO.MESH_DECL",
		// The enrolment subjects: a node cannot ask for another grant.
		"mesh.enrol.0011223344556677",
		"mesh.enrol.*",
		// B's by the other layout, and its own by the layout it did not
		// ask for.
		link.UpPrefix + ".beta.decl",
		link.UpPrefix + ".*.decl",
		link.UpPrefix + ".>",
		link.NodeSubjects("alpha", 1-l).DeclGet,
		// B's heartbeats, by either layout's read of one's own.
		link.SubjectsOf("beta").HeartbeatGet,
		"mesh.api.DIRECT.GET.MESH_HEARTBEAT.mesh.heartbeat.*",
		"mesh.api.DIRECT.GET.MESH_HEARTBEAT",
		"$JS.API.DIRECT.GET.MESH_HEARTBEAT.mesh.heartbeat.beta",
		link.UpPrefix + ".beta.heartbeat-get",
		link.NodeSubjects("alpha", 1-l).HeartbeatGet,
	} {
		if err := nc.PublishRequest(subj, a.Subjects.Inbox+".x", []byte(`{"last_by_subj":"mesh.decl.beta"}`)); err != nil {
			t.Fatal(err)
		}
		refused("publish", subj)
	}
	// Publishing as B, as the control side, or a notice.
	for _, subj := range []string{"mesh.report.beta", "mesh.heartbeat.beta", "mesh.decl.beta", "mesh.decl.alpha", "mesh.notice.beta", "mesh.notice.alpha", "mesh.plan.beta", "mesh.plan.alpha",
		link.UpPrefix + ".beta.report", link.UpPrefix + ".beta.heartbeat", link.NodeSubjects("alpha", 1-l).Report, link.NodeSubjects("alpha", 1-l).Heartbeat,
		"mesh.notice.beta.plan", "mesh.notice.alpha.plan", "mesh.notice.alpha.x"} {
		if err := nc.Publish(subj, []byte(`{"node":"beta","outcome":"applied"}`)); err != nil {
			t.Fatal(err)
		}
		refused("publish", subj)
	}
	// Its own get with a body (a subject of its choosing inside): the
	// broker answers a bad request, never B's message.
	for get, body := range map[string]string{
		a.Subjects.DeclGet:      `{"last_by_subj":"mesh.decl.beta"}`,
		a.Subjects.HeartbeatGet: `{"last_by_subj":"mesh.heartbeat.beta"}`,
	} {
		if m, err := nc.Request(get, []byte(body), 5*time.Second); err == nil && m.Header.Get("Status") == "" {
			t.Fatalf("alpha's get %s with a body was answered with a message of %s", get, m.Header.Get(link.HeaderSubject))
		}
	}

	// Naming B's subjects as the reply: the broker answers A's requests
	// (the positive control shows it does), but the answers stay in the
	// asking node's own account and never reach B's streams.
	inbox := a.Subjects.Inbox + ".probe"
	probe, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(a.Subjects.DeclGet, inbox, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := probe.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("the positive control: alpha's direct get is not answered: %v", err)
	}
	for _, get := range []string{a.Subjects.RosterGet, a.Subjects.ArchiveGet} {
		if err := nc.PublishRequest(get, inbox, []byte(`{"last_by_subj":"$O.`+link.ArchiveBucket+`.M.none"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := probe.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("the positive control: alpha's %s is not answered: %v", get, err)
		}
	}
	for _, reply := range []string{"mesh.decl.beta", "mesh.report.beta", "mesh.heartbeat.beta", "mesh.notice.beta",
		link.UpPrefix + ".beta.report", link.UpPrefix + ".beta.heartbeat", link.UpPrefix + ".beta.decl"} {
		for _, req := range nodeRequests(a) {
			if err := nc.PublishRequest(req.subj, reply, req.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	nc.Flush()
	time.Sleep(300 * time.Millisecond)

	// B's subjects empty but for its one declaration and the heartbeat it
	// sent, which is still its own; nothing per node on the broker.
	if str, err := s.client.JS.Stream(ctx, link.HeartbeatStream); err != nil {
		t.Fatal(err)
	} else if m, err := str.GetLastMsgForSubject(ctx, "mesh.heartbeat.beta"); err != nil || string(m.Data) != `{"node":"beta"}` {
		t.Fatalf("beta's newest heartbeat is not the one it sent: %v", err)
	}
	for _, st := range []struct {
		stream, subj string
		want         uint64
	}{{link.ReportStream, "mesh.report.beta", 0}, {link.NodeReportPartition("beta").Stream, link.NodeReportPartition("beta").Subject, 0},
		{link.HeartbeatStream, "mesh.heartbeat.beta", 1}, {link.DeclStream, "mesh.decl.beta", 1}} {
		str, _ := s.client.JS.Stream(ctx, st.stream)
		si, err := str.Info(ctx, jetstream.WithSubjectFilter(st.subj))
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Subjects[st.subj] != st.want {
			t.Fatalf("%s holds %d messages, not %d: alpha got something in", st.subj, si.State.Subjects[st.subj], st.want)
		}
		if st.stream == link.DeclStream && si.State.Consumers != 0 {
			t.Fatalf("%s has %d consumers: nothing per node is kept on the broker", st.stream, si.State.Consumers)
		}
	}
}

// Archives: a node reads the archive store through the one direct get it
// is given, and cannot put, delete, purge, inspect or consume it, nor steer
// the store's answers into it.
func TestNodeArchiveAccess(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	_, a := addNode(t, s, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A tar of a few chunks.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	body := bytes.Repeat([]byte("archive bytes "), 20000)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	content := tb.Bytes()
	path := filepath.Join(t.TempDir(), "a.tar")
	os.WriteFile(path, content, 0o600)
	sum, size, err := s.client.PutArchive(ctx, path)
	if want := sha256.Sum256(content); err != nil || sum != hex.EncodeToString(want[:]) || size != int64(len(content)) {
		t.Fatalf("put: %s %d %v", sum, size, err)
	}
	// Again: already there, nothing stored twice.
	if again, _, err := s.client.PutArchive(ctx, path); err != nil || again != sum {
		t.Fatalf("put again: %s %v", again, err)
	}
	str, _ := s.client.JS.Stream(ctx, link.ArchiveStream)
	before, _ := str.Info(ctx)

	nc, refused := dialWatched(t, a)
	get := func(req string) *nats.Msg {
		t.Helper()
		m, err := nc.Request(a.Subjects.ArchiveGet, []byte(req), 5*time.Second)
		if err != nil {
			t.Fatalf("direct get %s: %v", req, err)
		}
		return m
	}
	// It reads: the object's record, then its chunks in order.
	metaSubj := "$O." + link.ArchiveBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(sum))
	var info struct {
		NUID   string `json:"nuid"`
		Chunks int    `json:"chunks"`
	}
	if err := json.Unmarshal(get(`{"last_by_subj":"`+metaSubj+`"}`).Data, &info); err != nil || info.NUID == "" || info.Chunks < 2 {
		t.Fatalf("alpha cannot read the archive's record: %+v %v", info, err)
	}
	var got []byte
	seq := uint64(0)
	for i := 0; i < info.Chunks; i++ {
		m := get(fmt.Sprintf(`{"seq":%d,"next_by_subj":"$O.%s.C.%s"}`, seq, link.ArchiveBucket, info.NUID))
		got = append(got, m.Data...)
		n, _ := strconv.ParseUint(m.Header.Get(nats.JSSequence), 10, 64)
		seq = n + 1
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("alpha read %d bytes, not the archive's %d", len(got), len(content))
	}

	chunkSubj := "$O." + link.ArchiveBucket + ".C." + info.NUID
	for _, subj := range []string{
		chunkSubj, metaSubj, "$O." + link.ArchiveBucket + ".C.new", // put
		"mesh.api.STREAM.MSG.DELETE." + link.ArchiveStream, // delete
		"mesh.api.STREAM.PURGE." + link.ArchiveStream,
		"mesh.api.STREAM.DELETE." + link.ArchiveStream,
		"mesh.api.STREAM.UPDATE." + link.ArchiveStream,
		"mesh.api.STREAM.INFO." + link.ArchiveStream,
		"mesh.api.STREAM.MSG.GET." + link.ArchiveStream,
		"mesh.api.CONSUMER.CREATE." + link.ArchiveStream,
		"mesh.api.DIRECT.GET.KV_" + control.Bucket, // the registry by the same door
		"mesh.api.DIRECT.GET." + link.DeclStream,
		"$JS.API.DIRECT.GET." + link.ArchiveStream,
		"$JS.API.STREAM.MSG.DELETE." + link.ArchiveStream,
		"$JS.API.STREAM.PURGE." + link.ArchiveStream,
		"$JS.API.CONSUMER.CREATE." + link.ArchiveStream,
	} {
		if err := nc.PublishRequest(subj, a.Subjects.Inbox+".x", []byte(`{"seq":1}`)); err != nil {
			t.Fatal(err)
		}
		refused("publish", subj)
	}
	for _, subj := range []string{chunkSubj, "$O.>", "$JS.API.DIRECT.GET.>"} {
		nc.SubscribeSync(subj)
		refused("subscribe", subj)
	}
	// The store's answers, steered at its own subjects, stay in the nodes'
	// account: nothing is added to the store.
	for _, reply := range []string{chunkSubj, metaSubj, "$O." + link.ArchiveBucket + ".M.bmV3"} {
		nc.PublishRequest(a.Subjects.ArchiveGet, reply, []byte(`{"last_by_subj":"`+metaSubj+`"}`))
	}
	nc.Flush()
	time.Sleep(300 * time.Millisecond)
	after, _ := str.Info(ctx)
	if after.State.Msgs != before.State.Msgs || after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("the archive store changed: %d messages (last %d), was %d (last %d)", after.State.Msgs, after.State.LastSeq, before.State.Msgs, before.State.LastSeq)
	}
	if b, err := s.client.Archives.GetBytes(ctx, sum); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("the archive is not intact: %v", err)
	}
}

// permissionRefused returns a check that the broker refused what was just
// sent on nc (a subscribe or publish on subject), as the permission
// violation errs receives from nc's error handler.
// dialWatched dials as the node id, as its agent does, and returns the
// connection (closed when the test ends) and permissionRefused's check on
// the errors the broker sends it.
func dialWatched(t *testing.T, id *agent.Identity) (*nats.Conn, func(what, subject string)) {
	t.Helper()
	errs := make(chan error, 64)
	nc, err := agent.Dial(id, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, permissionRefused(t, nc, errs)
}

func permissionRefused(t *testing.T, nc *nats.Conn, errs <-chan error) func(what, subject string) {
	return func(what, subject string) {
		t.Helper()
		nc.Flush()
		timeout := time.After(3 * time.Second)
		for {
			select {
			case err := <-errs:
				if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
					return
				}
			case <-timeout:
				t.Fatalf("%s %s: the broker did not refuse it", what, subject)
			}
		}
	}
}

// The roster: every node reads the newest by its one direct get and hears
// its notice; none may publish one, a notice of one, or read the roster
// stream any other way, nor steer the broker's answers into it.
func TestNodeRosterAccess(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	_, a := enrolNode(t, s, "alpha")
	nc, refused := dialWatched(t, a)
	notices, err := nc.SubscribeSync(a.Subjects.RosterNotice)
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	enrolNode(t, s, "beta")
	var rp *control.RosterPublished
	eventually(t, "a roster naming alpha and beta", func() bool {
		r, err := s.client.LastRoster(ctx)
		return err == nil && r != nil && len(r.Nodes) == 2
	})
	if _, err := notices.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("alpha heard no roster notice: %v", err)
	}
	m, err := nc.Request(a.Subjects.RosterGet, nil, 5*time.Second)
	if err != nil || m.Header.Get("Status") != "" || m.Header.Get(link.HeaderSubject) != link.RosterSubject {
		t.Fatalf("alpha cannot read the roster: %v %+v", err, m)
	}
	payload, err := wire.Open(s.client.Keys.ControlPublic(), wire.PurposeRoster, m.Data)
	if err != nil {
		t.Fatalf("the roster alpha read does not open: %v", err)
	}
	r, err := shapes.ParseRoster(payload)
	if err != nil || len(r.Nodes) != 2 || r.Nodes[0].Node != "alpha" || r.Nodes[1].Node != "beta" {
		t.Fatalf("the roster alpha read: %+v %v", r, err)
	}
	// Published again unchanged: nothing sent.
	if rp, err = s.client.PublishRoster(ctx); err != nil || rp.Sent || rp.Seq != r.Seq {
		t.Fatalf("the same roster again: %+v %v", rp, err)
	}

	for _, subj := range []string{link.RosterSubject, link.RosterNotice, "mesh.roster.x",
		"$JS.API.DIRECT.GET.MESH_ROSTER.mesh.roster", "$JS.API.DIRECT.GET.MESH_ROSTER",
		"mesh.api.DIRECT.GET.MESH_ROSTER", // the form with a body
		"mesh.api.STREAM.MSG.GET.MESH_ROSTER", "mesh.api.STREAM.PURGE.MESH_ROSTER",
		"mesh.api.CONSUMER.CREATE.MESH_ROSTER.sneak.mesh.roster",
		"$JS.API.STREAM.PURGE.MESH_ROSTER", "$JS.API.STREAM.DELETE.MESH_ROSTER"} {
		if err := nc.PublishRequest(subj, a.Subjects.Inbox+".x", []byte(`{"version":1}`)); err != nil {
			t.Fatal(err)
		}
		refused("publish", subj)
	}
	for _, subj := range []string{"mesh.roster", "mesh.roster.>", "mesh.roster-*"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		refused("subscribe", subj)
	}
	// Its own requests answered into the roster's subject: the answers
	// stay in the nodes' account.
	for _, req := range []string{a.Subjects.RosterGet, a.Subjects.DeclGet, a.Subjects.Report} {
		if err := nc.PublishRequest(req, link.RosterSubject, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	time.Sleep(300 * time.Millisecond)
	str, _ := s.client.JS.Stream(ctx, link.RosterStream)
	si, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.client.LastRoster(ctx)
	if err != nil || last == nil || last.Seq != r.Seq || si.State.Consumers != 0 {
		t.Fatalf("the roster stream after alpha's attempts: last %+v (%v), %d consumers", last, err, si.State.Consumers)
	}
}

// A node's request through one of its own doors names its reply subject,
// and nats-server passes a JetStream acknowledgement subject
// ($JS.ACK.<stream>.<consumer>.…) through a service import as it is, where
// it rewrites any other reply: an answer aimed there would land in the
// control side's account, and an empty one (a read of nothing, 404) would
// acknowledge that consumer's message — the recorder's, say, a report it
// was handed and has not recorded yet. The broker refuses the publish: a
// client's reply may not be one of its reserved forms ($JS.ACK.…, a
// service import's reply, a gateway's), whatever the permissions
// (nats-server's isReservedReply); this test holds the pinned version to
// it. Tried through every door with the acknowledgement subject of a
// message really pending; the message is still pending after, and its
// subject does acknowledge it (the positive control).
func TestANodeCannotAcknowledgeForTheControlSide(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	_, a := enrolNode(t, s, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, refused := dialWatched(t, a)

	part := link.NodeReportPartition("alpha") // where the broker puts what is published on mesh.report.alpha
	probe, err := s.client.JS.CreateOrUpdateConsumer(ctx, part.Stream, jetstream.ConsumerConfig{
		Durable: "known", FilterSubject: part.Subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.JS.Publish(ctx, "mesh.report.alpha", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	batch, err := probe.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var delivered jetstream.Msg
	for m := range batch.Messages() {
		delivered = m
	}
	if delivered == nil || !strings.HasPrefix(delivered.Reply(), "$JS.ACK.") {
		t.Fatalf("no message delivered to the probe (%v)", batch.Error())
	}
	pending := func() int {
		info, err := probe.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}
	if p := pending(); p != 1 {
		t.Fatalf("%d messages pending, want 1", p)
	}
	for _, door := range []struct {
		subj string
		data []byte
	}{
		{a.Subjects.DeclGet, nil}, // nothing declared yet: an empty 404
		{a.Subjects.Report, nil},
		{a.Subjects.Heartbeat, nil},
		{a.Subjects.ArchiveGet, []byte(`{"last_by_subj":"$O.` + link.ArchiveBucket + `.M.none"}`)},
		{a.Subjects.RosterGet, nil},
	} {
		if err := nc.PublishRequest(door.subj, delivered.Reply(), door.data); err != nil {
			t.Fatal(err)
		}
		refused("publish with the reply", delivered.Reply())
	}
	time.Sleep(200 * time.Millisecond)
	if p := pending(); p != 1 {
		t.Fatalf("%d messages pending after the node's tries, want 1: it acknowledged the control side's message", p)
	}
	if err := delivered.DoubleAck(ctx); err != nil {
		t.Fatalf("the positive control: the acknowledgement subject does not acknowledge: %v", err)
	}
	if p := pending(); p != 0 {
		t.Fatalf("the positive control: %d pending after the control side's own ack", p)
	}
}

// No node reaches another through the broker's answers: alpha names each
// subject beta hears (in either layout) as the reply of each request it
// may make, and beta, listening on all of them, hears none of it — while
// the same requests with alpha's own inbox as the reply are answered (the
// positive control), and beta's subscriptions do hear what the control
// side sends it (the other positive control: the silence is not a dead
// subscription).
func TestNoNodeReachesAnotherThroughReplies(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	_, alpha := enrolNode(t, s, "alpha")
	_, beta := enrolNode(t, s, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.client.Declare(ctx, "alpha", []byte(decl)); err != nil {
		t.Fatal(err)
	}

	// Beta, in both layouts at once, hears everything it may.
	heard := make(chan *nats.Msg, 256)
	var betaReplies []string
	for _, l := range []link.Layout{link.LayoutByNode, link.LayoutByKind} {
		b := inLayout(beta, l)
		nc, err := agent.Dial(b)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		_, subs := link.NodePermissions("beta", l)
		for _, subj := range subs {
			if _, err := nc.ChanSubscribe(subj, heard); err != nil {
				t.Fatal(err)
			}
		}
		nc.Flush()
		// A subject under each of its subscriptions, as a reply names one.
		for _, subj := range subs {
			betaReplies = append(betaReplies, strings.ReplaceAll(strings.ReplaceAll(subj, ".>", ".probe"), ".*", ".probe"))
		}
	}

	for _, l := range []link.Layout{link.LayoutByNode, link.LayoutByKind} {
		a := inLayout(alpha, l)
		nc, err := agent.Dial(a)
		if err != nil {
			t.Fatal(err)
		}
		requests := nodeRequests(a)
		// The positive control: each is answered on alpha's own inbox.
		own := a.Subjects.Inbox + ".own"
		answers, err := nc.SubscribeSync(own)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range requests {
			if err := nc.PublishRequest(r.subj, own, r.data); err != nil {
				t.Fatal(err)
			}
			if _, err := answers.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("layout %d: alpha's %s is not answered on its own inbox: %v", l, r.subj, err)
			}
		}
		probes := 0
		for _, reply := range betaReplies {
			if reply == link.RosterNotice {
				continue // the mesh's one roster notice is alpha's too: it lands in alpha's own account
			}
			for _, r := range requests {
				if err := nc.PublishRequest(r.subj, reply, r.data); err != nil {
					t.Fatal(err)
				}
				probes++
			}
		}
		nc.Flush()
		if probes < 24 {
			t.Fatalf("only %d probes", probes)
		}
		select {
		case m := <-heard:
			t.Fatalf("layout %d: beta heard %s (%d bytes, headers %v): alpha reached it through an answer", l, m.Subject, len(m.Data), m.Header)
		case <-time.After(time.Second):
		}
		nc.Close()
	}

	// Beta's subscriptions are live: its own declaration's notice arrives.
	if _, err := s.client.Declare(ctx, "beta", []byte(decl)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-heard:
		if !strings.HasPrefix(m.Subject, "mesh.notice.beta") {
			t.Fatalf("beta heard %s, not its notice", m.Subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("beta heard no notice of its own declaration: the subscriptions above proved nothing")
	}
}

// nodeRequest is one request a node may make of the broker.
type nodeRequest struct {
	subj string
	data []byte
}

// nodeRequests are every request id may make: its declaration's direct
// get, a report, a heartbeat, and the shared reads (an archive's, a 404
// for a missing one, and the roster's), each answered.
func nodeRequests(id *agent.Identity) []nodeRequest {
	return []nodeRequest{
		{id.Subjects.DeclGet, nil},
		{id.Subjects.Report, []byte(`{}`)},
		{id.Subjects.Heartbeat, []byte(`{}`)},
		{id.Subjects.ArchiveGet, []byte(`{"last_by_subj":"$O.` + link.ArchiveBucket + `.M.none"}`)},
		{id.Subjects.RosterGet, nil},
	}
}

// A node's account imports only what its agents' layouts use: an earlier
// agent's link makes it with the earlier layout's imports, and the
// node's agent of today, linking after, has its own added — while the
// first link still reads, reports and hears its notices as before.
func TestAnAccountGainsALayoutWhenAnAgentOfItLinks(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	if n := s.srv.NodeServiceImports("alpha"); n != -1 {
		t.Fatalf("alpha's account has %d service imports before any link", n)
	}
	_, id := enrolNodeLinking(t, s, "alpha", link.LayoutByKind)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.client.Declare(ctx, "alpha", []byte(decl)); err != nil {
		t.Fatal(err)
	}
	type linked struct {
		id      *agent.Identity
		nc      *nats.Conn
		notices *nats.Subscription
	}
	link1 := func(l link.Layout) *linked {
		lid := inLayout(id, l)
		nc, err := agent.Dial(lid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		sub, err := nc.SubscribeSync(lid.Subjects.Notice)
		if err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		return &linked{lid, nc, sub}
	}
	answered := func(what string, k *linked) {
		t.Helper()
		for _, r := range nodeRequests(k.id) {
			if _, err := k.nc.Request(r.subj, r.data, 5*time.Second); err != nil {
				t.Fatalf("%s: %s not answered: %v", what, r.subj, err)
			}
		}
	}
	earlier := link1(link.LayoutByKind)
	answered("the earlier agent", earlier)
	byKind := s.srv.NodeServiceImports("alpha")

	today := link1(link.LayoutByNode)
	answered("today's agent", today)
	both := s.srv.NodeServiceImports("alpha")
	services, _ := link.NodeImportsOf("alpha", link.LayoutByNode)
	if both-byKind != len(services) {
		t.Errorf("today's agent's link added %d service imports to alpha's account, want its layout's %d", both-byKind, len(services))
	}
	answered("the earlier agent, after today's linked", earlier)

	// A declaration's notice reaches both links: the first link's
	// subscriptions were not lost to the imports added after them.
	if _, err := s.client.Declare(ctx, "alpha", []byte(decl)); err != nil {
		t.Fatal(err)
	}
	for what, k := range map[string]*linked{"the earlier agent": earlier, "today's agent": today} {
		if _, err := k.notices.NextMsg(10 * time.Second); err != nil {
			t.Errorf("%s heard no notice of the declaration: %v", what, err)
		}
	}
	// Linking again in a layout it has adds nothing.
	link1(link.LayoutByNode)
	if n := s.srv.NodeServiceImports("alpha"); n != both {
		t.Errorf("a second link of today's layout took alpha's account from %d service imports to %d", both, n)
	}
}
