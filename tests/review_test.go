package tests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// beforeVerification is the code of this repository that the root
// process runs on bytes from a peer it trusts for nothing — the agent, or
// whoever reaches the socket — before a signature under the pinned key has
// been verified: the peer's credentials, the frame's header and body, the
// protocol's states, the COSE envelope up to its verification, and the
// handlers of the messages that carry no signature (hello, status,
// reconnected, enrol, grant before its envelope is opened, archive
// chunks, activity). docs/review.md
// lists the same functions, in the order to read them. Code moved into or
// out of this path changes this list and docs/review.md together.
var beforeVerification = []struct{ file, fn string }{
	{"wire/unix.go", "PeerOf"},
	{"wire/vsock.go", "VsockCID"},
	{"wire/vsock.go", "CheckVsockPeer"},
	{"wire/vsock.go", "CheckSecret"},
	{"executor/serve/conn.go", "(*Server).admit"},
	{"executor/serve/conn.go", "(*Server).handle"},
	{"wire/frame.go", "(*Conn).ReadRequest"},
	{"wire/frame.go", "(*Conn).read"},
	{"wire/frame.go", "readGrowing"},
	{"wire/protocol.go", "Allowed"},
	{"wire/protocol.go", "Next"},
	{"wire/protocol.go", "Wait"},
	{"wire/envelope.go", "Open"},
	{"executor/serve/serve.go", "(*Server).hello"},
	{"executor/serve/serve.go", "(*Server).status"},
	{"executor/serve/serve.go", "(*Server).reconnected"},
	{"executor/serve/linkstate.go", "(*Server).noteLink"},
	{"executor/serve/serve.go", "(*Server).enrol"},
	{"executor/enrol/enrol.go", "Offer"},
	{"wire/enrol.go", "ValidUserNKey"},
	{"executor/serve/serve.go", "(*Server).grant"},
	{"executor/enrol/enrol.go", "Refused"},
	{"executor/serve/serve.go", "(*Server).archiveChunk"},
	{"executor/serve/serve.go", "(*Server).cacheFull"},
	{"executor/serve/rekey.go", "(*Server).rekey"},
	{"executor/enrol/rekey.go", "TakeRekey"},
	{"executor/serve/activity.go", "(*Server).activity"},
}

// beforeVerificationBound is how many lines those functions may hold,
// declarations and comments inside them included. Growing past it is a
// decision: raise it here and in docs/review.md, in a commit that says
// why the root process must do more before it knows who signed.
// 620: a rekey's status (the request it signs, asked by the agent's
// status) and the handler of its answer, read up to its verification.
// 624: the reconnect's interval runs on to its own reconcile, so that a
// start's reconcile the agent linked before the end of is said to the
// control side (it reads the executor's own history; nothing the agent
// sends is taken for more than the interval's start and end).
//
// 648: the executor's history read by a count the agent names (the
// activity request, and the reconnect's count), so that what the executor
// does on its own while linked — a drift repaired — reaches the control
// side; the count says only where its own history is read from.
//
// 649: the agent's word on an enrolment with no grant made text (no
// terminal's control sequence reaches root's) and its refuser one of the
// three it speaks for; an archive chunk held to the room the state's disk
// keeps; the request rate shared over a peer's connections.
//
// 655: an archive stored is kept for the declaration its connection hands
// over next (the cache pruned by an apply running meanwhile on another
// connection removed it, though the stream was told stored).
//
// 660: the reconnect names again a reconnect's or a roster's activity
// past the agent's count (its report lost with the agent), read apart
// from what its own reconcile did; the count still says only where the
// executor's own history is read from.
//
// 673: the archive cache's bound counts what the cache keeps (cacheFull):
// an archive streamed again is not counted twice, what nothing names any
// more is dropped first (the executor's own targets read, under the apply
// lock if it is free), and the code says whether the refusal is the
// declaration's or of the moment; the agent's part is the digest it names.
//
// 679: a stop waits for the connections admitted before it (each counted
// as its handler's task, admit and handle) and admits none once stopping,
// so that the daemon does not exit in the middle of a request it took.
//
// 687: the archive cache's too-large refusal counts apart the archives
// kept only for what undeclared archives' removals left (read from the
// store), which declaring fewer does not free.
//
// 695: hello and status refuse, saying why, when the identity does not
// read or the state moved away, rather than answer "hosted" (a host never
// enrolled), which the agent takes for its node retired.
const beforeVerificationBound = 695

func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return fmt.Sprintf("(%s%s).%s", star, id.Name, d.Name.Name)
	}
	return d.Name.Name
}

func TestCodeBeforeVerificationStaysSmall(t *testing.T) {
	fset := token.NewFileSet()
	parsed := map[string]*ast.File{}
	total := 0
	var counts []string
	for _, e := range beforeVerification {
		f, ok := parsed[e.file]
		if !ok {
			var err error
			if f, err = parser.ParseFile(fset, filepath.Join("..", e.file), nil, 0); err != nil {
				t.Fatal(err)
			}
			parsed[e.file] = f
		}
		n := 0
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && funcName(fd) == e.fn {
				n = fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			}
		}
		if n == 0 {
			t.Errorf("%s: no function %s: the code before verification moved; change this list and docs/review.md together", e.file, e.fn)
			continue
		}
		total += n
		counts = append(counts, fmt.Sprintf("%s %s: %d", e.file, e.fn, n))
	}
	if total > beforeVerificationBound {
		t.Errorf("the root process's code before a signature is verified is %d lines, past its bound of %d:\n%s\nGrowing it is a decision: raise the bound here and in docs/review.md, saying why.",
			total, beforeVerificationBound, strings.Join(counts, "\n"))
	}
	t.Logf("%d lines of %d:\n%s", total, beforeVerificationBound, strings.Join(counts, "\n"))

	doc, err := os.ReadFile("../docs/review.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range beforeVerification {
		if !strings.Contains(string(doc), e.fn) {
			t.Errorf("docs/review.md does not name %s (%s)", e.fn, e.file)
		}
	}
	if want := fmt.Sprintf("%d lines", beforeVerificationBound); !strings.Contains(string(doc), want) {
		t.Errorf("docs/review.md does not state the bound, %q", want)
	}
}
