package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func keys(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestEnvelope(t *testing.T) {
	pub, priv := keys(t)
	otherPub, otherPriv := keys(t)
	payload := []byte(`{"version":1,"node":"n","seq":7,"resources":[],"owns_nothing":true}`)
	env, err := Seal(priv, PurposeDeclaration, payload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Open(pub, PurposeDeclaration, env)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Another key: refused by key id before the signature is checked.
	if _, err := Open(otherPub, PurposeDeclaration, env); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("other pinned key: %v", err)
	}
	forged, _ := Seal(otherPriv, PurposeDeclaration, payload)
	if _, err := Open(pub, PurposeDeclaration, forged); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("signed by another key: %v", err)
	}
	// The right key id, a signature by another key: refused by the signature.
	tampered := bytes.Replace(env, []byte(`"seq":7`), []byte(`"seq":9`), 1)
	if _, err := Open(pub, PurposeDeclaration, tampered); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered payload: %v", err)
	}
	// A grant passed off as a declaration.
	grant, _ := Seal(priv, PurposeGrant, payload)
	if _, err := Open(pub, PurposeDeclaration, grant); !errors.Is(err, ErrWrongPurpose) {
		t.Fatalf("grant as declaration: %v", err)
	}
	for _, bad := range [][]byte{nil, []byte("garbage"), env[:len(env)/2], bytes.Repeat([]byte{0xff}, 100)} {
		if _, err := Open(pub, PurposeDeclaration, bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Open(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func pipe() (agent, executor *Conn) {
	a, e := net.Pipe()
	return NewConn(a, ExecutorToAgent), NewConn(e, AgentToExecutor)
}

// fed is the reading end of a pipe whose other end writes b in two parts,
// split at cut, then closes.
func fed(b []byte, cut int) net.Conn {
	a, e := net.Pipe()
	go func() {
		a.Write(b[:cut])
		a.Write(b[cut:])
		a.Close()
	}()
	return e
}

// Every message of the table survives the codec, each way it may go.
func TestEveryKindRoundTrips(t *testing.T) { everyKindRoundTrips(t, pipe) }

// everyKindRoundTrips sends every message of the table, each way it may
// go, over connections pair makes: the conformance a transport passes.
func everyKindRoundTrips(t *testing.T, pair func() (agent, executor *Conn)) {
	t.Helper()
	samples := map[Kind]any{
		KindHello:       &Hello{Protocol: 1, Version: "v", Build: "b"},
		KindHelloReply:  &HelloReply{Protocol: 1, Version: "v", Build: "b", Node: "n", State: "enrolled"},
		KindDeclaration: &Declaration{Envelope: []byte{1, 2, 3}},
		KindReportLine:  &shapes.Line{Module: "m", ID: "i", Type: "file", Outcome: shapes.Applied, Detail: "d"},
		KindReconnected: &Reconnected{After: new(uint64(1 << 40))},
		KindVerdict: &Verdict{Seq: 3, Outcome: shapes.Refused, Code: CodeReplay, Reason: "r", Duplicate: true,
			Briefing: &shapes.Briefing{Outcome: shapes.MarkKept, Node: "n", Seq: 3, At: time.Unix(1700000000, 0),
				Findings: []shapes.Finding{{Mark: shapes.MarkKept, Module: "m", ID: "i", Type: "file", Detail: "d"}}, LookAt: []string{"l"}}},
		KindStatus:      &Status{},
		KindStatusReply: &StatusReply{Version: "v", Build: "b", State: "s", Node: "n", Seq: 9, Outcome: shapes.Held, WireGuardKey: "k"},
		KindError:       &Error{Code: CodeBusy, Message: "m"},
		KindArchive:     &Archive{SHA256: strings.Repeat("ab", 32), Offset: 1 << 20, Chunk: bytes.Repeat([]byte{7}, MaxArchiveChunk), Last: true},
		KindArchiveAck:  &ArchiveAck{SHA256: strings.Repeat("cd", 32), Stored: false, Reason: "r"},
		KindEnrol:       &Enrol{AgentNKey: "U" + strings.Repeat("A", 55)},
		KindEnrolOffer: &EnrolOffer{Pending: true, Token: "00", Expires: 9, BrokerURL: "tls://x:1", Fingerprint: "ff", ControlKey: []byte{1},
			Credential: []byte{2}, Keys: EnrolKeys{Identity: "a", Sealing: "b", WireGuard: "c", AgentNKey: "d"}, Proof: []byte{3},
			Hostname: "h", Profile: []byte("{}"), Inventory: []byte("[]")},
		KindGrant:        &GrantHandover{Envelope: []byte{4}, RefusedBy: "control", Reason: "r", Final: true},
		KindGrantReply:   &GrantReply{Enrolled: true, Node: "n", Enrolment: "e", Reason: "r", Recovered: 3},
		KindProfile:      &Profile{},
		KindProfileReply: &ProfileReply{Profile: []byte("{}"), Inventory: []byte("{}"), Digest: "d"},
		KindPlan:         &Plan{Envelope: []byte{5, 6}},
		KindPlanReply: &PlanReply{Outcome: shapes.Applied, Lines: []shapes.Line{{Module: "m", ID: "i", Type: "file", Outcome: shapes.Applied}},
			Diffs: map[string]string{"m.i": "-a\n+b\n"}, Code: CodeInvalid, Refused: "r"},
		KindRoster:           &Roster{Envelope: []byte{5}},
		KindKeyRotation:      &KeyRotations{Envelopes: [][]byte{{7}, {8, 9}}},
		KindKeyRotationReply: &KeyRotationReply{ControlKey: []byte{1, 2}, Taken: 2, Refused: "r"},
		KindRekey:            &Rekey{Envelope: []byte{3, 4}},
		KindRekeyReply:       &RekeyReply{Begun: true, Token: "t", Refused: "r"},
		KindActivity:         &Activity{After: 1 << 40},
		KindLastApplied:      &LastApplied{After: 1<<64 - 1},
		KindActivityReply: &ActivityReply{Last: 9, Lost: 2, Acts: []shapes.Activity{{At: time.Unix(1700000000, 0), Source: "link", Trigger: "drift",
			Outcome: shapes.Repaired, Changed: 1, Lines: []shapes.Line{{Module: "m", ID: "i", Type: "file", Outcome: shapes.Repaired, Detail: "d"}}}}},
	}
	if len(samples) != len(Table) {
		t.Fatalf("%d samples for %d kinds", len(samples), len(Table))
	}
	for _, s := range Table {
		sample, ok := samples[s.Kind]
		if !ok {
			t.Fatalf("no sample for %s", s.Kind)
		}
		if reflect.TypeOf(sample).Elem() != bodyType(s.Kind) {
			t.Fatalf("%s: sample %T, table body %v", s.Kind, sample, bodyType(s.Kind))
		}
		agent, exec := pair()
		w, r := agent, exec
		if s.Dir == ExecutorToAgent {
			w, r = exec, agent
		}
		go w.Write(s.Kind, sample)
		k, body, err := r.Read()
		if err != nil || k != s.Kind || !reflect.DeepEqual(body, sample) {
			t.Errorf("%s: read %v %+v %v", s.Kind, k, body, err)
		}
		agent.Close()
		exec.Close()
	}
}

// rawFrame writes a frame by hand: a compromised agent does not use Write.
func rawFrame(k Kind, body []byte) []byte {
	f := make([]byte, headerSize)
	binary.BigEndian.PutUint16(f, uint16(k))
	binary.BigEndian.PutUint32(f[2:], uint32(len(body)))
	return append(f, body...)
}

func readRaw(t *testing.T, frame []byte) (Kind, any, error) {
	t.Helper()
	a, e := net.Pipe()
	defer a.Close()
	go func() { a.Write(frame); a.Close() }()
	return NewConn(e, AgentToExecutor).Read()
}

func TestReadRefuses(t *testing.T) {
	hello, _ := Encode(&Hello{Protocol: 1})
	cases := []struct {
		name  string
		frame []byte
		code  Code
		want  string
	}{
		{"unknown kind", rawFrame(200, nil), CodeProtocol, "unknown message kind 200"},
		{"a reply sent as a request", rawFrame(KindVerdict, []byte{0xa0}), CodeProtocol, "verdict may not be sent in this direction"},
		// Only the header is sent: a 4 GiB claim is refused before anything is allocated or read.
		{"over the limit", rawFrame(KindHello, nil)[:2:2], 0, ""},
		{"garbage body", rawFrame(KindHello, []byte{0xff, 0x00, 0x13}), CodeMalformed, "hello body"},
		{"unknown field", rawFrame(KindHello, mustEncode(map[int]any{1: 1, 99: "x"})), CodeMalformed, "hello body"},
		{"duplicate key", rawFrame(KindHello, []byte{0xa2, 0x01, 0x01, 0x01, 0x02}), CodeMalformed, "duplicate"},
		{"wrong type", rawFrame(KindHello, mustEncode(map[int]any{1: "one"})), CodeMalformed, "hello body"},
		{"trailing bytes", rawFrame(KindHello, append(hello, 0x00)), CodeMalformed, "hello body"},
	}
	// The over-the-limit frame, built properly.
	big := make([]byte, headerSize)
	binary.BigEndian.PutUint16(big, uint16(KindDeclaration))
	binary.BigEndian.PutUint32(big[2:], 0xffffffff)
	cases[2].frame, cases[2].code, cases[2].want = big, CodeTooLarge, "declaration of 4294967295 bytes, over its limit"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := readRaw(t, c.frame)
			var r *Refusal
			if !errors.As(err, &r) || r.Code != c.code || !strings.Contains(r.Reason, c.want) {
				t.Fatalf("err = %v, want %s containing %q", err, c.code, c.want)
			}
		})
	}
}

func mustEncode(v any) []byte {
	b, err := Encode(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Frames split at every point still read whole.
func TestSplitFrames(t *testing.T) {
	b := rawFrame(KindDeclaration, mustEncode(&Declaration{Envelope: bytes.Repeat([]byte("x"), 300)}))
	for cut := 1; cut < len(b); cut += 7 {
		k, body, err := NewConn(fed(b, cut), AgentToExecutor).Read()
		if err != nil || k != KindDeclaration || len(body.(*Declaration).Envelope) != 300 {
			t.Fatalf("cut at %d: %v %v", cut, k, err)
		}
	}
}

func TestCodesRegistry(t *testing.T) {
	seen := map[string]Code{}
	for c, r := range registry {
		if prev, dup := seen[r.name]; dup {
			t.Errorf("codes %d and %d share the name %s", prev, c, r.name)
		}
		seen[r.name] = c
		if r.sentinel == nil {
			t.Errorf("code %d has no sentinel", c)
		}
		e := &Error{Code: c, Message: "x"}
		if !errors.Is(e, r.sentinel) {
			t.Errorf("Error{%s} does not unwrap to its sentinel", c)
		}
		if CodeOf(&Refusal{Code: c}) != c {
			t.Errorf("CodeOf(Refusal{%s})", c)
		}
	}
	if CodeOf(io.EOF) != CodeInternal {
		t.Error("an unknown error is internal")
	}
}

// FuzzOpen: hostile bytes as an envelope never verify and never panic.
func FuzzOpen(f *testing.F) {
	pub, priv := keys(f)
	env, _ := Seal(priv, PurposeDeclaration, []byte(`{"version":1}`))
	f.Add(env)
	f.Add([]byte{0xd2, 0x84})
	f.Fuzz(func(t *testing.T, b []byte) {
		payload, err := Open(pub, PurposeDeclaration, b)
		if err == nil && !bytes.Equal(b, env) {
			// Only a real signature verifies; the fuzzer cannot forge one.
			if _, err := Open(pub, PurposeDeclaration, env); err != nil || !bytes.Contains(b, payload) {
				t.Fatalf("verified bytes that are not the sealed envelope: %x", b)
			}
		}
	})
}

// FuzzFrame feeds a stream of hostile bytes, split at an arbitrary point,
// to the executor's reader: it refuses or reads, and never panics or
// allocates past a kind's limit.
func FuzzFrame(f *testing.F) {
	f.Add(rawFrame(KindHello, mustEncode(&Hello{Protocol: 1})), uint16(3))
	f.Add(rawFrame(KindDeclaration, mustEncode(&Declaration{Envelope: []byte("e")})), uint16(1))
	f.Add(rawFrame(KindStatus, []byte{0xa0}), uint16(7))
	f.Add(rawFrame(KindActivity, mustEncode(&Activity{After: 7})), uint16(2))
	f.Add(rawFrame(KindLastApplied, mustEncode(&LastApplied{After: 7})), uint16(2))
	f.Add(rawFrame(KindReconnected, mustEncode(&Reconnected{After: new(uint64(3))})), uint16(4))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		conn := NewConn(fed(b, int(cut)%(len(b)+1)), AgentToExecutor)
		for {
			k, body, err := conn.Read()
			if err != nil {
				return
			}
			s, _ := Lookup(k)
			if s.Dir != AgentToExecutor || reflect.TypeOf(body).Elem() != bodyType(k) {
				t.Fatalf("read %s going the wrong way or with the wrong body %T", k, body)
			}
		}
	})
}

// An archive chunk is bounded: one over MaxArchiveChunk is not written, and
// a frame claiming more is refused before it is read. While a stream is in
// flight, nothing but its next chunk is allowed.
func TestArchiveChunkBoundsAndState(t *testing.T) {
	agent, exec := pipe()
	defer agent.Close()
	defer exec.Close()
	over := &Archive{SHA256: strings.Repeat("ab", 32), Chunk: make([]byte, MaxArchiveChunk+300)}
	if err := agent.Write(KindArchive, over); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a chunk over the limit was written: %v", err)
	}
	big := make([]byte, headerSize)
	binary.BigEndian.PutUint16(big, uint16(KindArchive))
	binary.BigEndian.PutUint32(big[2:], MaxArchiveChunk+257)
	_, _, err := readRaw(t, big)
	var r *Refusal
	if !errors.As(err, &r) || r.Code != CodeTooLarge {
		t.Fatalf("a frame claiming more than a chunk: %v", err)
	}
	for _, s := range Table {
		if s.Dir != AgentToExecutor {
			continue
		}
		if got, want := Allowed(s.Kind, StateArchiving), s.Kind == KindArchive; got != want {
			t.Errorf("%s allowed while archiving: %v", s.Kind, got)
		}
	}
	if Allowed(KindArchive, StateNew) {
		t.Error("an archive before hello")
	}
}

// A verdict that owns nothing says so ([]), distinct from one that does
// not carry the list (a refusal): the control side's copy follows the
// first and ignores the second.
func TestOwnedEmptyIsNotAbsent(t *testing.T) {
	a, e := pipe()
	for _, v := range []*Verdict{{Seq: 1, Outcome: shapes.Applied, Owned: []OwnedEntry{}}, {Seq: 2, Outcome: shapes.Refused}} {
		go e.Write(KindVerdict, v)
		_, b, err := a.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got := b.(*Verdict).Owned; (got == nil) != (v.Owned == nil) {
			t.Fatalf("seq %d: owned %v crossed as %v", v.Seq, v.Owned, got)
		}
	}
}

// readGrowing reads exactly n bytes however they arrive, says a short
// stream is short, and holds at most what arrived (doubled), not what the
// header announced.
func TestReadGrowing(t *testing.T) {
	data := make([]byte, 300<<10)
	rand.Read(data)
	for _, tc := range []struct {
		name  string
		n     int
		r     func(io.Reader) io.Reader
		short bool
	}{
		{"empty", 0, func(r io.Reader) io.Reader { return r }, false},
		{"one byte", 1, func(r io.Reader) io.Reader { return r }, false},
		{"the first allocation exactly", 64 << 10, func(r io.Reader) io.Reader { return r }, false},
		{"one past it", 64<<10 + 1, func(r io.Reader) io.Reader { return r }, false},
		{"large, a byte at a time", 200 << 10, iotestOneByte, false},
		{"large, in halves", 300 << 10, iotestHalf, false},
		{"short by one", 1000, func(r io.Reader) io.Reader { return io.LimitReader(r, 999) }, true},
		{"short, large", 200 << 10, func(r io.Reader) io.Reader { return io.LimitReader(r, 100<<10) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readGrowing(tc.r(bytes.NewReader(data)), tc.n)
			if tc.short {
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("a short stream: got %v, want io.ErrUnexpectedEOF", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[:tc.n]) {
				t.Fatalf("read %d bytes, not the %d sent", len(got), tc.n)
			}
			if cap(got) > 2*tc.n+(64<<10) {
				t.Fatalf("%d bytes held %d of memory", tc.n, cap(got))
			}
		})
	}
	// A peer that announces 64 MiB and sends ten bytes pins no more than
	// the first allocation.
	r := &countingReader{r: bytes.NewReader(data[:10])}
	if _, err := readGrowing(r, 64<<20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v", err)
	}
	if r.maxBuf > 64<<10 {
		t.Fatalf("a 10-byte trickle was read into %d bytes", r.maxBuf)
	}
}

type countingReader struct {
	r      io.Reader
	maxBuf int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.maxBuf = max(c.maxBuf, cap(p))
	return c.r.Read(p)
}

func iotestOneByte(r io.Reader) io.Reader { return iotest.OneByteReader(r) }
func iotestHalf(r io.Reader) io.Reader    { return iotest.HalfReader(r) }

// A mode reads in a report as a declaration writes it, "0750"; a number
// (what releases before wrote) still reads.
func TestModeJSON(t *testing.T) {
	b, _ := json.Marshal(OwnedEntry{Target: "path:/x", Mode: 0o750})
	if !strings.Contains(string(b), `"mode":"0750"`) {
		t.Fatalf("%s", b)
	}
	var e OwnedEntry
	for in, want := range map[string]Mode{`{"mode":"0750"}`: 0o750, `{"mode":488}`: 0o750, `{"mode":"4755"}`: 0o4755} {
		if err := json.Unmarshal([]byte(in), &e); err != nil || e.Mode != want {
			t.Errorf("%s: %o %v", in, e.Mode, err)
		}
	}
	if err := json.Unmarshal([]byte(`{"mode":"0999"}`), &e); err == nil {
		t.Error("a mode of 9s read")
	}
}

// Every request names the reply that ends it, and no reply belongs to a
// request it does not answer: a plan's answer is never taken for a
// declaration's verdict, nor a declaration's lines for a plan's answer.
func TestEveryReplyBelongsToItsRequest(t *testing.T) {
	want := map[Kind][]Kind{
		KindHello:       {KindHelloReply},
		KindDeclaration: {KindVerdict, KindReportLine},
		KindReconnected: {KindVerdict, KindReportLine},
		KindRoster:      {KindVerdict, KindReportLine},
		KindStatus:      {KindStatusReply},
		KindArchive:     {KindArchiveAck},
		KindEnrol:       {KindEnrolOffer},
		KindGrant:       {KindGrantReply},
		KindProfile:     {KindProfileReply},
		KindPlan:        {KindPlanReply},
		KindKeyRotation: {KindKeyRotationReply},
		KindRekey:       {KindRekeyReply},
		KindActivity:    {KindActivityReply},
		KindLastApplied: {KindVerdict, KindReportLine},
	}
	for _, req := range Table {
		for _, reply := range Table {
			belongs, ends := Answers(req.Kind, reply.Kind)
			wanted := reply.Kind == KindError || slices.Contains(want[req.Kind], reply.Kind)
			if req.Dir != AgentToExecutor {
				wanted = false
			}
			if belongs != wanted {
				t.Errorf("%s answered by %s: %v, want %v", req.Name, reply.Name, belongs, wanted)
			}
			if belongs && ends != (reply.Kind != KindReportLine) {
				t.Errorf("%s answered by %s ends it: %v", req.Name, reply.Name, ends)
			}
		}
		if req.Dir == AgentToExecutor && want[req.Kind] == nil {
			t.Errorf("%s: a request this test does not know the answer of", req.Name)
		}
	}
}

// The executor's answers grow with what the node holds: a verdict naming
// 20,000 owned things, a plan of 5,000 lines and 1,000 diffs, each within
// its kind's byte limit, reach the agent whole. What the agent sends the
// executor stays bounded to 4,096 elements a collection and 256 pairs a
// map: decoded, a collection takes more memory than its bytes.
func TestAnswersGrowWithWhatTheNodeHolds(t *testing.T) {
	v := &Verdict{Seq: 9, Outcome: shapes.Applied}
	for i := range 20000 {
		v.Owned = append(v.Owned, OwnedEntry{Target: fmt.Sprintf("path:/srv/f%d", i), Type: "file", Module: "m", ID: fmt.Sprint("f", i)})
	}
	p := &PlanReply{Outcome: shapes.Applied, Diffs: map[string]string{}}
	for i := range 5000 {
		p.Lines = append(p.Lines, shapes.Line{Module: "m", ID: fmt.Sprint("f", i), Type: "file", Outcome: shapes.Applied})
		if i < 1000 {
			p.Diffs[fmt.Sprint("m.f", i)] = "-a\n+b\n"
		}
	}
	for _, tc := range []struct {
		kind Kind
		body any
	}{{KindVerdict, v}, {KindPlanReply, p}} {
		agent, executor := pipe()
		go executor.Write(tc.kind, tc.body)
		k, got, err := agent.Read()
		if err != nil || k != tc.kind {
			t.Fatalf("%s: %v %v", tc.kind, k, err)
		}
		if !reflect.DeepEqual(got, tc.body) {
			t.Fatalf("%s: not the same after the trip", tc.kind)
		}
		agent.Close()
		executor.Close()
	}

	agent, executor := pipe()
	defer agent.Close()
	defer executor.Close()
	chain := &KeyRotations{}
	for range 4097 {
		chain.Envelopes = append(chain.Envelopes, []byte{1})
	}
	go agent.Write(KindKeyRotation, chain)
	if _, _, err := executor.Read(); err == nil || !strings.Contains(err.Error(), "exceeded max number of elements") {
		t.Fatalf("a request of 4,097 elements: %v", err)
	}
}

// An error the executor sends says once that the executor refused, whether
// its message names it already (as the executor's do) or not.
func TestAnErrorSaysTheExecutorOnce(t *testing.T) {
	for _, m := range []string{"executor: archive cache full", "archive cache full"} {
		if got := (&Error{Code: CodeTooLarge, Message: m}).Error(); got != "executor: archive cache full (too-large)" {
			t.Errorf("%q: %q", m, got)
		}
	}
}

// FuzzReadRequest is FuzzFrame through the executor's own reader: each
// frame over 64 KiB admitted by the frame budget, which every read gives
// back whole.
func FuzzReadRequest(f *testing.F) {
	f.Add(rawFrame(KindHello, mustEncode(&Hello{Protocol: 1})), uint16(3))
	f.Add(rawFrame(KindDeclaration, mustEncode(&Declaration{Envelope: bytes.Repeat([]byte("e"), 70<<10)})), uint16(9))
	f.Add(rawFrame(KindArchive, mustEncode(&Archive{SHA256: strings.Repeat("ab", 32), Chunk: make([]byte, 100<<10)})), uint16(5))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		budget := NewBudget(FrameBudget)
		conn := NewConn(fed(b, int(cut)%(len(b)+1)), AgentToExecutor)
		for {
			k, body, err := conn.ReadRequest(time.Second, budget)
			if err != nil {
				break
			}
			if s, _ := Lookup(k); s.Dir != AgentToExecutor || reflect.TypeOf(body).Elem() != bodyType(k) {
				t.Fatalf("read %s going the wrong way or with the wrong body %T", k, body)
			}
		}
		conn.Release()
		if !budget.sem.TryAcquire(FrameBudget) {
			t.Fatal("the frame budget was not given back whole")
		}
	})
}

// FuzzReadAnswer is FuzzFrame for the agent's reader of the executor's
// answers, whose collections are bounded by their bytes alone.
func FuzzReadAnswer(f *testing.F) {
	f.Add(rawFrame(KindVerdict, mustEncode(&Verdict{Seq: 1, Owned: []OwnedEntry{{Target: "path:/x"}}})), uint16(3))
	f.Add(rawFrame(KindPlanReply, mustEncode(&PlanReply{Diffs: map[string]string{"m.f": "d"}})), uint16(2))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		conn := NewConn(fed(b, int(cut)%(len(b)+1)), ExecutorToAgent)
		for {
			k, body, err := conn.Read()
			if err != nil {
				return
			}
			if s, _ := Lookup(k); s.Dir != ExecutorToAgent || reflect.TypeOf(body).Elem() != bodyType(k) {
				t.Fatalf("read %s going the wrong way or with the wrong body %T", k, body)
			}
		}
	})
}

// FuzzLinkErrorText: whatever the agent says, what is kept is text a
// terminal shows as text, bounded.
func FuzzLinkErrorText(f *testing.F) {
	f.Add("dial tcp: connection refused")
	f.Add("\x1b]0;x\a\x1b[2J\xff\xfe")
	f.Fuzz(func(t *testing.T, s string) {
		out := LinkErrorText(s)
		if len(out) > MaxLinkError || !utf8.ValidString(out) {
			t.Fatalf("%q: %d bytes, valid %v", out, len(out), utf8.ValidString(out))
		}
		for _, r := range out {
			if unicode.IsControl(r) {
				t.Fatalf("%q keeps a control character %U", out, r)
			}
		}
	})
}
