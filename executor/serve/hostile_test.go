package serve

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The hostile-agent suite: a compromised agent (root's or the agent's uid
// on the socket, speaking the protocol by hand) tries to freeze the
// executor, or to take its memory. Each attack runs while a genuine
// declaration is pushed on another connection, which must be applied
// while the attack is still in place — before any deadline of the
// connection rules has freed anything (wire.FrameWithin, wire.ReplyWithin
// from the attack's start). The time it took is logged; docs/benchmarks.md
// keeps the figures.

// rawDial connects as root and says hello, and returns the raw stream.
func (e *env) rawDial() net.Conn {
	e.t.Helper()
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	if _, err := c.Write(hello()); err != nil {
		e.t.Fatal(err)
	}
	k, _, err := wire.NewConn(c, wire.ExecutorToAgent).Read()
	if err != nil || k != wire.KindHelloReply {
		e.t.Fatalf("hello: %v %v", k, err)
	}
	return c
}

// genuine pushes a signed declaration on a new connection and returns how
// long it took until its verdict, failing the test if the apply did not
// end before the attack's deadlines could have freed anything (since).
func (e *env) genuine(seq int, content string, since time.Time) time.Duration {
	e.t.Helper()
	start := time.Now()
	done := make(chan *wire.Verdict, 1)
	go func() {
		c, err := wire.DialUnix(e.sock, 0)
		if err != nil {
			done <- &wire.Verdict{Reason: err.Error()}
			return
		}
		defer c.Close()
		c.NetConn().SetDeadline(time.Now().Add(time.Minute))
		if err := c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"}); err != nil {
			done <- &wire.Verdict{Reason: err.Error()}
			return
		}
		if k, b, err := c.Read(); err != nil || k != wire.KindHelloReply {
			done <- &wire.Verdict{Reason: fmt.Sprintf("hello: %v %+v %v", k, b, err)}
			return
		}
		if err := c.Write(wire.KindDeclaration, &wire.Declaration{Envelope: e.seal(e.decl("n1", "e-1", seq, file("motd", content)))}); err != nil {
			done <- &wire.Verdict{Reason: err.Error()}
			return
		}
		for {
			k, b, err := c.Read()
			if err != nil {
				done <- &wire.Verdict{Reason: err.Error()}
				return
			}
			if k == wire.KindVerdict {
				done <- b.(*wire.Verdict)
				return
			}
		}
	}()
	limit := since.Add(min(wire.FrameWithin, wire.ReplyWithin))
	select {
	case v := <-done:
		took := time.Since(start)
		if v.Outcome != shapes.Applied {
			e.t.Fatalf("the genuine declaration was not applied under attack: %+v", v)
		}
		if time.Now().After(limit) {
			e.t.Fatalf("the genuine declaration was applied only after %s, when the connection rules' deadlines had freed the attack's hold", took)
		}
		if b, _ := os.ReadFile(filepath.Join(e.root, "motd")); string(b) != content {
			e.t.Fatalf("motd = %q, want %q", b, content)
		}
		return took
	case <-time.After(time.Until(limit)):
		e.t.Fatalf("the genuine declaration was not applied while the attack held (waited %s)", time.Since(start))
	}
	return 0
}

// A peer that sends requests and never reads its answers fills the socket.
// No answer is written under the apply lock, so the apply, a rescue
// command's lock and the drift timer's reconcile all go on.
func TestAPeerThatNeverReadsFreezesNothing(t *testing.T) {
	e := newEnv(t, nobody, true)
	attacker := e.rawDial()
	// Grants that do not verify: each is answered under the enrolment
	// path; the answers pile up unread.
	junk, _ := wire.Encode(&wire.GrantHandover{Envelope: make([]byte, 60<<10)})
	started := time.Now()
	go func() {
		for i := 0; i < 4000; i++ {
			if _, err := attacker.Write(frame(wire.KindGrant, junk)); err != nil {
				return
			}
		}
	}()
	// Let the socket fill: the executor's answers stop being taken.
	time.Sleep(300 * time.Millisecond)
	took := e.genuine(1, "applied while a peer never read", started)
	t.Logf("a signed declaration applied in %s while a peer never read its answers", took)

	st, err := store.Open(e.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatalf("a rescue command could not take the lock while a peer never read: %v", err)
	}
	st.Unlock()
	if v := e.srv.Reconcile(t.Context(), "drift", nil); v.Outcome != shapes.Unchanged {
		t.Fatalf("the drift reconcile under attack: %+v", v)
	}
	// The peer that never reads is closed once an answer has waited
	// wire.ReplyWithin to be taken.
	attacker.SetReadDeadline(time.Now().Add(wire.ReplyWithin + 10*time.Second))
	buf := make([]byte, 1<<20)
	for {
		if _, err := attacker.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the executor kept a peer that never reads its answers")
			}
			break
		}
		// Reading now drains what was queued; it must end in a close.
	}
}

// Every slot holds a connection that began a frame and stalled (part of a
// header, part of a body). A genuine agent still gets in at once, and the
// stalled ones are closed after wire.FrameWithin, saying why.
func TestStalledPartialFramesOnEverySlot(t *testing.T) {
	e := newEnv(t, nobody, true)
	started := time.Now()
	var stalled []net.Conn
	for i := range 4 {
		c := e.rawDial()
		switch i % 2 {
		case 0: // three bytes of a header
			c.Write(frame(wire.KindStatus, nil)[:3])
		case 1: // a header announcing 1 MiB, and ten bytes of it
			h := frame(wire.KindDeclaration, make([]byte, 10))
			h[2], h[3], h[4], h[5] = 0, 0x10, 0, 0
			c.Write(h)
		}
		stalled = append(stalled, c)
	}
	time.Sleep(100 * time.Millisecond)
	took := e.genuine(1, "applied past four stalled connections", started)
	t.Logf("a signed declaration applied in %s with a stalled connection on every slot", took)

	// The ones not given up for the newcomer are closed at the deadline,
	// with an error that says so.
	closedBy := time.Now().Add(wire.FrameWithin + 5*time.Second)
	sawStall := false
	for _, c := range stalled {
		c.SetReadDeadline(closedBy)
		conn := wire.NewConn(c, wire.ExecutorToAgent)
		for {
			k, body, err := conn.Read()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("a stalled connection was kept past wire.FrameWithin")
				}
				break
			}
			if k == wire.KindError && strings.Contains(body.(*wire.Error).Message, "was not whole within") {
				sawStall = true
			}
		}
	}
	if !sawStall {
		t.Fatal("no stalled connection was told why it was closed")
	}
}

// Concurrent envelopes of the largest size with bad signatures are read
// within the frame budget, one at a time, not all at once. A child
// process (the agent's uid) sends three at once; the executor's heap is
// sampled meanwhile (this process holds nothing else of size), and a
// genuine declaration is applied while they are in flight.
func TestConcurrentLargeBadEnvelopes(t *testing.T) {
	e := newEnv(t, nobody, true)
	runtime.GC()
	base := heapObjects()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), heapObjects()))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	wait := e.startChild("large-bad-envelopes")
	// Wait until the first large frame is being read, then push.
	for heapObjects() < base+32<<20 {
		time.Sleep(time.Millisecond)
	}
	took := e.genuine(1, "applied beside large bad envelopes", time.Now())
	t.Logf("a signed declaration applied in %s beside three 64 MiB envelopes with bad signatures", took)
	obs := wait()
	close(stop)
	<-sampled
	if len(obs) != 3 {
		t.Fatalf("the child saw %+v", obs)
	}
	for _, o := range obs {
		if o.Reply != "verdict" || o.Outcome != "refused" || o.Code != "wrong-key" {
			t.Errorf("%s: %+v, want a verdict refused wrong-key", o.Attempt, o)
		}
	}
	grew := int64(peak.Load()) - int64(base)
	t.Logf("the executor's heap peaked %d MiB above its start for three 64 MiB envelopes at once", grew>>20)
	// One envelope costs about three times its size while it is read and
	// checked (the bytes read, the decoded envelope, the signed structure),
	// and the collector may let the last one's garbage stand beside the
	// next: within the budget, about 400 MiB. Read all at once, three
	// took more than 800 MiB.
	if limit := int64(7 * wire.MaxEnvelope); grew > limit {
		t.Fatalf("the heap grew by %d MiB for concurrent large envelopes, more than %d MiB: they were not read within the frame budget", grew>>20, limit>>20)
	}
}

// heapObjects is the bytes of heap objects now, garbage not yet swept
// included.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Streams on several connections share the archive cache's bound: each
// chunk is checked against what is in the cache now, other streams'
// partial files included, not against what was free when its stream
// started.
func TestArchiveCacheBoundHoldsAcrossStreams(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, ArchiveCacheMax: 3 << 20})
	chunk := make([]byte, 1<<20)
	sum := func(i int) string {
		h := sha256.Sum256([]byte{byte(i)})
		return hex.EncodeToString(h[:])
	}
	var conns []*wire.Conn
	for i := range 2 {
		c := e.dial()
		// Both streams start while the cache is empty: each would have
		// been promised all of it.
		if err := c.Write(wire.KindArchive, &wire.Archive{SHA256: sum(i), Offset: 0, Chunk: chunk}); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Each sends a second chunk: 4 MiB together, over the 3 MiB bound.
	refused := 0
	for i, c := range conns {
		c.Write(wire.KindArchive, &wire.Archive{SHA256: sum(i), Offset: 1 << 20, Chunk: chunk})
		c.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
		time.Sleep(200 * time.Millisecond) // the first's chunk is written before the second's
		if k, body, err := c.Read(); err == nil && k == wire.KindError {
			// Of the moment: the other stream ends (or goes), and this
			// one is streamed again later.
			if m := body.(*wire.Error); m.Code != wire.CodeInternal || !m.Code.Passing() || !strings.Contains(m.Message, "in flight") {
				t.Fatalf("stream %d: %+v", i, body)
			}
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d streams refused, want exactly 1: the cache bound was promised to both", refused)
	}
}

// The protected set covers the running instance where it really runs
// from: its state directory, its socket's directory and its own binary,
// however a declaration names them — through a symbolic link, or with
// "." and ".." on the way — and whatever holds them. Each is refused
// whole, and nothing changes.
func TestProtectedSetCoversTheRunningInstance(t *testing.T) {
	e := newEnv(t, nobody, true)
	// The daemon is started again with its state named the long way
	// round: the protected set holds where it really is.
	e.stop()
	// The launcher says where it runs from and keeps its known-good
	// copies (its state in the executor's), named the long way round too;
	// the agent's state is given through a link.
	for _, d := range []string{"opt/launch/bin", "opt/launch/known-good", "agent-real"} {
		os.MkdirAll(filepath.Join(e.base, d), 0o755)
	}
	os.Symlink(filepath.Join(e.base, "agent-real"), filepath.Join(e.base, "agent-link"))
	launch := fmt.Sprintf(`{"known_good_dir":%q,"launcher":%q}`, e.base+"/opt/./launch/known-good/", e.base+"/opt/launch/bin/../bin/mesh-launch")
	if err := os.WriteFile(filepath.Join(e.state, "launch.json"), []byte(launch), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start(Config{StateDir: e.base + "/tree/.././state/", Version: "test", Build: "b1", AgentUID: nobody, AgentState: e.base + "/agent-link/"})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(e.root, "to-base")
	os.Symlink(e.base, link)
	c := e.dial()
	before := e.snapshot()
	seq := 0
	for _, r := range []string{
		// The state, as it is, and through a link.
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.state, "identity.json")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(link, "state", "floor")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"directory","path":%q}`, filepath.Join(link, "state", "originals")),
		// The socket's directory, and a directory that holds it.
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.base, "run", "other.sock")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"directory","path":%q}`, filepath.Join(link, "run")),
		// The binary the daemon runs from, and an archive unpacked over
		// the directory that holds it.
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, self),
		fmt.Sprintf(`{"module":"m","id":"x","type":"directory","path":%q}`, filepath.Dir(self)),
		// The agent's state, as it really is and as it was given.
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.base, "agent-real", "agent.json")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.base, "agent-link", "nkey")),
		// The launcher's binary and its known-good copies.
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.base, "opt", "launch", "bin", "mesh-launch")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"file","path":%q,"content":"x"}`, filepath.Join(e.base, "opt", "launch", "known-good", "mesh-executor")),
		fmt.Sprintf(`{"module":"m","id":"x","type":"directory","path":%q}`, filepath.Join(link, "opt", "launch")),
		// A directory holding all of it.
		fmt.Sprintf(`{"module":"m","id":"x","type":"directory","path":%q}`, e.base),
	} {
		seq++
		_, v := e.push(c, e.seal(e.decl("n1", "e-1", seq, r)))
		if v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "running host's") {
			t.Errorf("%s: %+v, want refused as the running host's own", r, v)
		}
	}
	if e.snapshot() != before {
		t.Fatal("a declaration reached the running instance's own paths")
	}
	if _, err := os.Stat(filepath.Join(e.base, "run", "other.sock")); err == nil {
		t.Fatal("a file was written into the socket's directory")
	}
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", seq+1, file("motd", "still applies")))); v.Outcome != shapes.Applied {
		t.Fatalf("an ordinary declaration after the refusals: %+v", v)
	}
}

// An agent that streams and streams (junk under its own digests, never
// declared) cannot fill the state's disk: the cache stops short of the room
// the disk keeps for the store and root's rescue, however large its own
// bound.
func TestArchivesLeaveTheStateDiskItsRoom(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stateOnTmpfs("8m")
	c := e.dial()
	h := sha256.Sum256([]byte("junk"))
	sum := hex.EncodeToString(h[:])
	chunk := make([]byte, 1<<20)
	go func() {
		for i := range 16 { // 16 MiB into an 8 MiB disk
			if c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Offset: uint64(i) << 20, Chunk: chunk, Last: i == 15}) != nil {
				return
			}
		}
	}()
	k, body, err := c.Read()
	if err != nil || k != wire.KindError {
		t.Fatalf("%v %+v %v", k, body, err)
	}
	// The disk's room is of the moment: passing, streamed again later.
	if m := body.(*wire.Error); m.Code != wire.CodeInternal || !m.Code.Passing() || !strings.Contains(m.Message, "keeps") {
		t.Fatalf("%+v", m)
	}
	free, keep, err := stateRoom(e.state)
	if err != nil || free < keep {
		t.Fatalf("the state's disk has %d bytes free, keeps %d (%v)", free, keep, err)
	}
}

// The cache's bound counts what it keeps: an archive streamed again (a
// declaration that keeps the archives of the one before) is not counted
// twice, and an archive nothing names any more (its declaration refused,
// its connection gone) is dropped to make room, not taken for the
// declarations' own. Only the archives the declarations name and this one,
// past the bound, refuse it as the declaration's (too-large).
func TestTheArchiveCacheBoundCountsWhatItKeeps(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	// A stream a stop cut short: its temporary goes at the next start.
	stale := filepath.Join(e.state, "archives", strings.Repeat("e", 64)+".part")
	os.MkdirAll(filepath.Dir(stale), 0o700)
	if err := os.WriteFile(stale, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, ArchiveCacheMax: 3 << 20})
	for i := 0; ; i++ {
		if _, err := os.Stat(stale); os.IsNotExist(err) {
			break
		} else if i == 100 {
			t.Fatal("a stream's temporary a stop cut short is still in the cache after the start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	blob := func(i byte) ([]byte, string) {
		b := bytes.Repeat([]byte{i}, 2<<20)
		h := sha256.Sum256(b)
		return b, hex.EncodeToString(h[:])
	}
	// A declaration applied from the link: its target (a signed envelope)
	// names no archive, and is read as the reconcile reads it.
	if _, v := e.push(e.dial(), e.seal(e.decl("n1", "e-1", 1, file("motd", "hello\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	// The cache is looked at once in tidyEvery: each step below as if the
	// last look were that long ago.
	lookAgain := func() {
		e.srv.applyMu.Lock()
		e.srv.tidied = time.Time{}
		e.srv.applyMu.Unlock()
	}
	a, sumA := blob(1)
	c1 := e.dial()
	if ack := streamArchive(t, c1, sumA, a, 1<<20); !ack.Stored {
		t.Fatalf("the first stream: %+v", ack)
	}
	c2 := e.dial()
	if ack := streamArchive(t, c2, sumA, a, 1<<20); !ack.Stored {
		t.Fatalf("the same archive again, 2 MiB in a 3 MiB cache holding it: %+v", ack)
	}
	// Both connections gone, no declaration naming it, a rescue's fetch a
	// kill cut short, and a rescue file's target that no longer parses
	// (the reconcile skips it: it names nothing): room for another.
	if err := os.WriteFile(filepath.Join(e.state, "target-local.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.Close()
	if err := os.WriteFile(filepath.Join(e.state, "archives", strings.Repeat("f", 64)+".fetch"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	lookAgain()
	b, sumB := blob(2)
	cb := e.dial()
	if ack := streamArchive(t, cb, sumB, b, 1<<20); !ack.Stored {
		t.Fatalf("a second archive, the first named by nothing: %+v", ack)
	}
	cb.Close()
	time.Sleep(100 * time.Millisecond)
	// Named by no declaration either, but streamed by a connection for
	// its next one: kept, and a third does not fit beside it.
	lookAgain()
	c3 := e.dial()
	cc, sumC := blob(3)
	c3.Write(wire.KindArchive, &wire.Archive{SHA256: sumC, Offset: 0, Chunk: cc[:1<<20]})
	c3.Write(wire.KindArchive, &wire.Archive{SHA256: sumC, Offset: 1 << 20, Chunk: cc[1<<20:], Last: true})
	c3.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
	k, body, err := c3.Read()
	if err != nil || k != wire.KindArchiveAck || !body.(*wire.ArchiveAck).Stored {
		t.Fatalf("a third, the second's connection gone: %v %+v %v", k, body, err)
	}
	fourth := func() *wire.Error {
		d := e.dial()
		d.Write(wire.KindArchive, &wire.Archive{SHA256: sumA, Offset: 0, Chunk: a[:1<<20]})
		d.Write(wire.KindArchive, &wire.Archive{SHA256: sumA, Offset: 1 << 20, Chunk: a[1<<20:], Last: true})
		d.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
		k, body, err := d.Read()
		if err != nil || k != wire.KindError {
			t.Fatalf("a fourth beside one a live connection streamed: %v %+v %v; want refused", k, body, err)
		}
		d.Close()
		// Its stream let go by the daemon (as the refusal's connection
		// ends), so the next is not refused as one on another connection.
		waitFor(t, 10*time.Second, "the refused stream let go", func() bool {
			e.srv.streamMu.Lock()
			defer e.srv.streamMu.Unlock()
			return !e.srv.streaming[sumA]
		})
		return body.(*wire.Error)
	}
	lookAgain()
	if m := fourth(); m.Code != wire.CodeTooLarge {
		t.Fatalf("a fourth beside one a live connection streamed: %+v; want too-large", m)
	}
	// Again at once: the cache not looked at again so soon, the refusal
	// is of the moment (a compromised agent's chunks past the bound do
	// not make the daemon read its store under the apply lock each time).
	if m := fourth(); m.Code != wire.CodeInternal {
		t.Fatalf("a fourth again at once: %+v; want internal", m)
	}
}

// What the archive cache keeps only for the store's records — an archive
// no target names any more, whose removal left something on the machine
// — is counted apart: the too-large refusal says it, since declaring
// fewer archives does not free it. One a target names is not of them.
func TestArchivesKeptForRecordsAreToldApart(t *testing.T) {
	e := newEnv(t, nobody, false)
	e.stop()
	st := e.lockedStore()
	cache := engine.ArchiveCacheDir(e.state)
	os.MkdirAll(cache, 0o700)
	left, named := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, sum := range []string{left, named} {
		os.WriteFile(filepath.Join(cache, sum), make([]byte, 1000), 0o600)
		st.Put(&store.Entry{Target: "archive:/srv/" + sum[:1], Type: shapes.TypeArchive, Digest: sum, Claims: []store.Claim{{Source: store.Local, Module: "m", ID: sum[:1]}}})
	}
	doc := fmt.Sprintf(`{"version":1,"resources":[{"module":"m","id":"b","type":"archive","url":"obj://%s","sha256":%q,"destination":"/srv/b"}]}`, named, named)
	if err := st.SaveTarget(store.Local, []byte(doc)); err != nil {
		t.Fatal(err)
	}
	sums, n := KeptForRecords(e.state, st, nil)
	if len(sums) != 1 || sums[0] != left || n != 1000 {
		t.Fatalf("%v %d", sums, n)
	}
}
