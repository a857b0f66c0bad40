package engine

import (
	"bytes"
	"context"
	"crypto/hpke"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// sealedHarness is the harness with a node's sealing key: declarations
// carry content sealed to it, and the engine opens it through an Unsealer
// bound as the daemon binds it (the real wire.OpenSealed, a real key).
type sealedHarness struct {
	*harness
	key       hpke.PrivateKey
	digestKey []byte
	log       bytes.Buffer
}

const secret = "db-password: s3cret-4815162342\n"

func newSealedHarness(t *testing.T) *sealedHarness {
	k, err := wire.SealedKEM().GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	dk := make([]byte, 32)
	rand.Read(dk)
	return &sealedHarness{harness: newHarness(t), key: k, digestKey: dk}
}

// sealed is a file resource whose content is sealed for node n1, seq and
// module.id s.<id>.
func (h *sealedHarness) sealed(id string, seq uint64, content string) string {
	h.t.Helper()
	s, err := wire.SealContent(h.key.PublicKey().Bytes(), "n1", seq, "s", id, []byte(content))
	if err != nil {
		h.t.Fatal(err)
	}
	return fmt.Sprintf(`{"module":"s","id":%q,"type":"file","path":"{root}/%s","sealed":%q,"mode":"0600"}`, id, id, s)
}

func (h *sealedHarness) doc(seq uint64, resources ...string) string {
	return strings.ReplaceAll(fmt.Sprintf(`{"version":1,"node":"n1","seq":%d,"resources":[%s]}`, seq, strings.Join(resources, ",")), "{root}", h.root)
}

// run applies doc (or plans it) with the key bound to doc's node and seq;
// withKey false is a host that has no sealing key.
func (h *sealedHarness) run(doc string, plan, withKey bool) *shapes.Report {
	h.t.Helper()
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		h.t.Fatalf("parse: %v", err)
	}
	st := mustStore(h.t, h.state)
	if !plan {
		if err := st.Lock(time.Second); err != nil {
			h.t.Fatal(err)
		}
		defer st.Unlock()
	}
	opt := Options{Source: store.Local, Plan: plan, NodeID: "n1",
		Log: slog.New(slog.NewTextHandler(&h.log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if withKey {
		opt.Unseal = &Unsealer{DigestKey: h.digestKey, Open: func(module, id, sealed string) ([]byte, error) {
			return wire.OpenSealed(h.key, d.Node, d.Seq, module, id, sealed)
		}}
	}
	return Apply(context.Background(), st, d, []byte(doc), opt)
}

// leaks fails the test if the plaintext, its base64 or its plain SHA-256
// appears in s.
func leaks(t *testing.T, where, s string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	for _, bad := range []string{strings.TrimSpace(secret), "s3cret", base64.StdEncoding.EncodeToString([]byte(secret)), hex.EncodeToString(sum[:])} {
		if strings.Contains(s, bad) {
			t.Fatalf("%s carries the sealed content (%q):\n%s", where, bad, s)
		}
	}
}

// stateFiles is every file of the state directory, for leaks.
func stateFiles(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "== %s\n%s\n", p, data)
		}
		return nil
	})
	return b.String()
}

// A sealed file is written with its plaintext; the plan, the report, the
// log and the store never carry the plaintext or its plain SHA-256; it
// converges, is repaired and is removed like any file.
func TestSealedFileWrittenAndNeverReported(t *testing.T) {
	h := newSealedHarness(t)
	doc := h.doc(3, h.sealed("token", 3, secret))

	plan := h.run(doc, true, true)
	h.expect(plan, shapes.Applied, "s.token=applied")
	h.absent("token")
	leaks(t, "the plan", fmt.Sprintf("%+v", plan))
	if !strings.Contains(plan.Lines[0].Detail, "sealed, ") {
		t.Errorf("the plan does not say the content is sealed: %q", plan.Lines[0].Detail)
	}

	rep := h.run(doc, false, true)
	h.expect(rep, shapes.Applied, "s.token=applied")
	if h.read("token") != secret || h.mode("token") != 0o600 {
		t.Fatalf("written %q mode %v", h.read("token"), h.mode("token"))
	}
	leaks(t, "the report", fmt.Sprintf("%+v", rep))
	if want := fmt.Sprintf("created (sealed, %d bytes, 0600 0:0)", len(secret)); rep.Lines[0].Detail != want {
		t.Errorf("detail %q, want %q", rep.Lines[0].Detail, want)
	}
	e := mustStore(t, h.state).Get("path:" + h.p("token"))
	if e == nil || !strings.HasPrefix(e.Digest, "hmac-sha256:") {
		t.Fatalf("store entry %+v: its digest is not keyed", e)
	}

	// Converged: the same declaration changes nothing; drift is repaired
	// (the keyed digest is the same from one apply to the next).
	h.expect(h.run(doc, false, true), shapes.Unchanged, "s.token=unchanged")
	os.WriteFile(h.p("token"), []byte("vandal\n"), 0o600)
	h.expect(h.run(doc, false, true), shapes.Repaired, "s.token=repaired")
	if h.read("token") != secret {
		t.Fatal("drift not repaired")
	}
	// The same content sealed afresh for the next declaration: unchanged.
	h.expect(h.run(h.doc(4, h.sealed("token", 4, secret)), false, true), shapes.Unchanged, "s.token=unchanged")

	leaks(t, "the log", h.log.String())
	leaks(t, "the store", stateFiles(t, h.state))

	h.expect(h.run(h.doc(5, `{"module":"s","id":"other","type":"file","path":"{root}/other","content":"x"}`), false, true),
		shapes.Applied, "s.other=applied s.token=removed")
	h.absent("token")
}

// A sealed file undeclared when it holds other content than the host
// wrote — edited by hand, or written under a sealing key the host holds no
// more (enrolled anew: the keyed digest is another) — is removed, or its
// original put back, as any file the host wrote, but none of its content
// is kept (sealed content is written to its file alone) and the line names
// no plain digest of it (a line goes up the link): it says the host cannot
// tell which, rather than claim an edit.
func TestASealedFileUndeclaredKeepsNoCopyAndNamesNoDigest(t *testing.T) {
	for _, c := range []struct {
		name  string
		found string // the file before the sealed content ("": none)
		after func(h *sealedHarness)
		want  shapes.Outcome
	}{
		{"created, key changed", "", func(h *sealedHarness) { rand.Read(h.digestKey) }, shapes.Removed},
		{"created, edited", "", func(h *sealedHarness) { os.WriteFile(h.p("token"), []byte(secret+"and more\n"), 0o600) }, shapes.Removed},
		{"found, key changed", "the machine's own\n", func(h *sealedHarness) { rand.Read(h.digestKey) }, shapes.Restored},
		{"found, edited", "the machine's own\n", func(h *sealedHarness) { os.WriteFile(h.p("token"), []byte(secret+"and more\n"), 0o600) }, shapes.Restored},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newSealedHarness(t)
			if c.found != "" {
				os.WriteFile(h.p("token"), []byte(c.found), 0o644)
			}
			h.expect(h.run(h.doc(1, h.sealed("token", 1, secret)), false, true), shapes.Applied, "s.token=applied")
			c.after(h)
			edited, _ := os.ReadFile(h.p("token"))
			sum := sha256.Sum256(edited)
			other := h.doc(2, `{"module":"s","id":"other","type":"file","path":"{root}/other","content":"x"}`)
			plan := h.run(other, true, true)
			rep := h.run(other, false, true)
			for _, r := range []*shapes.Report{plan, rep} {
				var l shapes.Line
				for _, x := range r.Lines {
					if x.ID == "token" {
						l = x
					}
				}
				if l.Outcome != c.want || !strings.Contains(l.Detail, "sealed content is never copied, so none of it is kept") ||
					strings.Contains(l.Detail, "sha256:") || strings.Contains(l.Detail, hex.EncodeToString(sum[:])[:12]) {
					t.Fatalf("the line: %+v", r.Lines)
				}
			}
			if got := mustStore(t, h.state).Salvaged(); len(got) != 0 {
				t.Fatalf("salvaged %+v", got)
			}
			if c.found == "" {
				h.absent("token")
			} else if h.read("token") != c.found {
				t.Fatalf("the original is not back: %q", h.read("token"))
			}
			leaks(t, "the store", stateFiles(t, h.state))
			if bytes.Contains([]byte(stateFiles(t, h.state)), []byte("and more")) {
				t.Fatal("the store keeps the edited content")
			}
		})
	}
}

// A sealed file undeclared on a host that cannot key its digest now (its
// sealing key unreadable) is removed as the host's, claiming nothing of
// its content, and none of it is kept.
func TestASealedFileUndeclaredWithoutTheKeyClaimsNothing(t *testing.T) {
	h := newSealedHarness(t)
	h.expect(h.run(h.doc(1, h.sealed("token", 1, secret)), false, true), shapes.Applied, "s.token=applied")
	rep := h.run(h.doc(2, `{"module":"s","id":"other","type":"file","path":"{root}/other","content":"x"}`), false, false)
	said := false
	for _, l := range rep.Lines {
		if l.ID == "token" {
			said = true
			if l.Outcome != shapes.Removed || strings.Contains(l.Detail, "other content") || strings.Contains(l.Detail, "sha256") {
				t.Fatalf("the line: %+v", l)
			}
		}
	}
	if !said {
		t.Fatalf("no line for the sealed file: %+v", rep.Lines)
	}
	if got := mustStore(t, h.state).Salvaged(); len(got) != 0 {
		t.Fatalf("salvaged %+v", got)
	}
	h.absent("token")
}

// A sealed file found already holding its content is held from then on;
// what the report and the store's entry say of it is no plain digest.
func TestSealedFileFoundAsDeclared(t *testing.T) {
	h := newSealedHarness(t)
	os.WriteFile(h.p("token"), []byte(secret), 0o600)
	rep := h.run(h.doc(1, h.sealed("token", 1, secret)), false, true)
	h.expect(rep, shapes.Unchanged, "s.token=unchanged")
	leaks(t, "the report", fmt.Sprintf("%+v", rep))
	e := mustStore(t, h.state).Get("path:" + h.p("token"))
	if e == nil || !strings.HasPrefix(e.Digest, "hmac-sha256:") {
		t.Fatalf("store entry %+v: its digest is not keyed", e)
	}
}

// Sealed content that cannot be opened refuses the whole declaration
// before anything is touched, even when it comes after a file that could
// be written: no half-apply. The refusal says which resource and why, and
// carries no content.
func TestSealedContentThatDoesNotOpenRefusesWhole(t *testing.T) {
	h := newSealedHarness(t)
	plain := `{"module":"s","id":"first","type":"file","path":"{root}/first","content":"first\n"}`
	cases := []struct {
		name    string
		doc     string
		withKey bool
		want    string
	}{
		{"no key on this host", h.doc(2, plain, h.sealed("token", 2, secret)), false,
			"sealed content for s.token could not be opened: this host has no sealing key"},
		{"sealed for another sequence", h.doc(2, plain, h.sealed("token", 1, secret)), true,
			"sealed content for s.token could not be opened: wire: sealed content does not open"},
		{"sealed for another file", h.doc(2, plain, strings.Replace(h.sealed("other", 2, secret), `"id":"other"`, `"id":"token"`, 1)), true,
			"sealed content for s.token could not be opened: wire: sealed content does not open"},
		{"truncated", h.doc(2, plain, `{"module":"s","id":"token","type":"file","path":"{root}/token","sealed":"AAAA"}`), true,
			"sealed content for s.token could not be opened: wire: not well-formed sealed content"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, plan := range []bool{true, false} {
				before := h.tree()
				rep := h.run(c.doc, plan, c.withKey)
				if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, c.want) || len(rep.Lines) != 0 {
					t.Fatalf("plan %v: report %+v\nwant a refusal containing %q", plan, rep, c.want)
				}
				leaks(t, "the refusal", rep.Refused)
				if h.tree() != before {
					t.Fatalf("a refusal changed the machine:\n%s", h.tree())
				}
				if n := len(mustStore(t, h.state).Entries()); n != 0 {
					t.Fatalf("a refusal changed the store: %d entries", n)
				}
			}
		})
	}
}
