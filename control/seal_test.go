package control_test

import (
	"context"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// enrolSealing enrols a node named name through a token, with a real
// sealing key (the test plays the executor), and returns its private half.
func enrolSealing(t *testing.T, s *served, name string) hpke.PrivateKey {
	t.Helper()
	k, _, _ := enrolSealingWith(t, s, name, nil)
	return k
}

// enrolSealingWith is enrolSealing with headers beside the request (an
// agent's capability; nil: none), returning the machine and its grant too.
func enrolSealingWith(t *testing.T, s *served, name string, h nats.Header) (hpke.PrivateKey, *machine, *wire.Grant) {
	t.Helper()
	text, _, err := s.client.IssueToken(context.Background(), name, true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	k, err := wire.SealedKEM().GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	m.keys.Sealing = base64.StdEncoding.EncodeToString(k.PublicKey().Bytes())
	g := grantOf(t, s, must(requestWith(t, s, text, m.keys, nil, h)))
	if g.Node != name {
		t.Fatalf("enrolled as %q", g.Node)
	}
	return k, m, g
}

// lastEnvelope is the newest declaration on node's subject: the bytes the
// broker stores and the agent is handed, exactly as published.
func lastEnvelope(t *testing.T, s *served, node string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, link.SubjectsOf(node).Decl)
	if err != nil {
		t.Fatal(err)
	}
	return m.Data
}

const sealedDecl = `{"version":1,"resources":[
	{"module":"app","id":"dir","type":"directory","path":"/srv/app"},
	{"module":"app","id":"token","type":"file","path":"/srv/app/token","mode":"0600"},
	{"module":"app","id":"motd","type":"file","path":"/srv/app/motd","content":"hi\n"}]}`

// Declare with Seals: what the broker stores and the agent is handed holds
// the content only sealed — not in plain, not in base64, not its SHA-256 —
// and it opens only with the node's key, for this node, this sequence and
// this module.id. This is the claim "the agent and the broker cannot read
// sealed content" (SECURITY.md).
func TestSealedContentIsOpaqueToAgentAndBroker(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := enrolSealing(t, s, "vault1")
	secret := []byte("postgres://app:hunter2-s3cret@db/app\n")

	cl, err := connect(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cl.Seals = map[string][]byte{"app.token": secret}
	seq, err := cl.Declare(ctx, "vault1", []byte(sealedDecl))
	if err != nil {
		t.Fatal(err)
	}

	env := lastEnvelope(t, s, "vault1")
	sum := sha256.Sum256(secret)
	for _, bad := range []string{"hunter2", base64.StdEncoding.EncodeToString(secret)[:16], hex.EncodeToString(sum[:])} {
		if strings.Contains(string(env), bad) {
			t.Fatalf("the envelope on the broker carries the content (%q)", bad)
		}
	}
	payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeDeclaration, env)
	if err != nil {
		t.Fatal(err)
	}
	d, err := shapes.Parse(payload)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, _ := s.client.Node(ctx, "vault1")
	if d.Seq != seq || d.Node != "vault1" || d.Enrolment != rec.Enrolment {
		t.Fatalf("declaration %q %q %d, declared seq %d", d.Node, d.Enrolment, d.Seq, seq)
	}
	f := d.Resources[1].(*shapes.File)
	if f.Sealed == nil || f.Content != nil || f.Bytes != nil {
		t.Fatalf("app.token: %+v", f)
	}
	if other := d.Resources[2].(*shapes.File); other.Content == nil || *other.Content != "hi\n" {
		t.Fatalf("an unsealed file was changed: %+v", other)
	}
	got, err := wire.OpenSealed(key, "vault1", seq, "app", "token", *f.Sealed)
	if err != nil || string(got) != string(secret) {
		t.Fatalf("the node's key does not open it: %q %v", got, err)
	}
	for _, b := range []struct {
		node       string
		seq        uint64
		module, id string
	}{{"vault2", seq, "app", "token"}, {"vault1", seq + 1, "app", "token"}, {"vault1", seq, "app", "motd"}} {
		if _, err := wire.OpenSealed(key, b.node, b.seq, b.module, b.id, *f.Sealed); !errors.Is(err, wire.ErrSealedOpen) {
			t.Fatalf("opened for %+v: %v", b, err)
		}
	}
	other, _ := wire.SealedKEM().GenerateKey()
	if _, err := wire.OpenSealed(other, "vault1", seq, "app", "token", *f.Sealed); !errors.Is(err, wire.ErrSealedOpen) {
		t.Fatalf("another key opened it: %v", err)
	}
}

// What cannot be sealed is refused before a sequence is taken, saying why.
func TestSealRefusedBeforeASequenceIsTaken(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enrolSealing(t, s, "vault1")
	if _, _, err := s.client.AddNode(ctx, "byhand", ""); err != nil {
		t.Fatal(err)
	}
	enrolSealing(t, s, "stolen")
	if err := s.client.RevokeNode(ctx, "stolen", "test"); err != nil {
		t.Fatal(err)
	}
	secret := []byte("s3cret")
	cases := []struct {
		name, node, decl string
		seals            map[string][]byte
		want             string
	}{
		{"a node registered by hand", "byhand", sealedDecl, map[string][]byte{"app.token": secret}, "node byhand has no sealing key (registered by hand"},
		{"a revoked node", "stolen", sealedDecl, map[string][]byte{"app.token": secret}, "node stolen is revoked"},
		{"no such resource", "vault1", sealedDecl, map[string][]byte{"app.nope": secret, "app.token": secret}, "seal app.nope: the declaration has no resource of that name"},
		{"not a file", "vault1", sealedDecl, map[string][]byte{"app.dir": secret}, `seal app.dir: it is a "directory", not a file`},
		{"a file with content", "vault1", sealedDecl, map[string][]byte{"app.motd": secret}, `seal app.motd: the file says its content in "content" too`},
		{"too large once sealed", "vault1", sealedDecl, map[string][]byte{"app.token": make([]byte, shapes.MaxDeclarationSize*3/4)}, "refused before signing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, _, err := s.client.Node(ctx, c.node)
			if err != nil {
				t.Fatal(err)
			}
			cl, err := connect(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			cl.Seals = c.seals
			if _, err := cl.Declare(ctx, c.node, []byte(c.decl)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Declare: %v\nwant an error containing %q", err, c.want)
			}
			if after, _, _ := s.client.Node(ctx, c.node); after.NextSeq != before.NextSeq {
				t.Fatalf("a refused seal took a sequence: next %d, was %d", after.NextSeq, before.NextSeq)
			}
		})
	}
	// Without seals, a file with no content is refused as shapes refuses it.
	if _, err := s.client.Declare(ctx, "vault1", []byte(sealedDecl)); err == nil || !strings.Contains(err.Error(), "one of content, bytes or sealed") {
		t.Fatalf("unsealed: %v", err)
	}
	// Nothing of this was published to the node.
	stream, _ := s.client.JS.Stream(ctx, link.DeclStream)
	if _, err := stream.GetLastMsgForSubject(ctx, link.SubjectsOf("vault1").Decl); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("something was published: %v", err)
	}
}

// `mesh-control declare NODE FILE --seal MODULE.ID=PATH` reads PATH and
// seals it; a spec that is not MODULE.ID=PATH, or names a key twice, is
// refused before anything is read from the broker.
func TestReadSeals(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "token")
	os.WriteFile(p, []byte("s3cret\n"), 0o600)
	got, err := control.ReadSeals([]string{"app.token=" + p})
	if err != nil || string(got["app.token"]) != "s3cret\n" || len(got) != 1 {
		t.Fatalf("%q %v", got, err)
	}
	for spec, want := range map[string]string{
		"app.token":            "write it MODULE.ID=PATH",
		"token=" + p:           "write it MODULE.ID=PATH",
		"app.token=":           "write it MODULE.ID=PATH",
		"app.token=" + dir:     "is not a regular file",
		"app.token=" + p + "x": "no such file",
	} {
		if _, err := control.ReadSeals([]string{spec}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadSeals(%q) = %v, want %q", spec, err, want)
		}
	}
	if _, err := control.ReadSeals([]string{"app.token=" + p, "app.token=" + p}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("twice: %v", err)
	}
}
