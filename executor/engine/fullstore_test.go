package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"golang.org/x/sys/unix"
)

// The store's disk fills in the middle of a batch of file steps, after
// their changes are made: every file the apply changed on the machine has
// a line that says so (failed: changed, not recorded), none is reported as
// untouched, and the next apply, with space again, reads each back and
// records it without writing it a second time.
func TestAFullStoreStillReportsEveryChange(t *testing.T) {
	h := newHarness(t)
	if err := os.MkdirAll(h.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.state, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(h.state, unix.MNT_DETACH) })

	const n = 200
	var rs []string
	for i := range n {
		rs = append(rs, fmt.Sprintf(`{"module":"m","id":"f%d","type":"file","path":"{root}/f%d","content":"%d\n"}`, i, i, i))
	}
	doc := h.doc(rs...)
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(h.state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(h.state, "filler")
	fill := func() {
		f, err := os.OpenFile(filler, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := f.Write(buf); err != nil {
				return // full
			}
		}
	}
	filled := false
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, OnLine: func(l shapes.Line) {
		if !filled && l.Outcome == shapes.Applied {
			filled = true
			fill() // the first record is written; the next cannot be
		}
	}})
	st.Unlock()
	if !filled {
		t.Fatalf("no line was applied: %+v", rep)
	}
	changed := 0
	for i := range n {
		if b, err := os.ReadFile(h.p(fmt.Sprint("f", i))); err == nil && string(b) == fmt.Sprintf("%d\n", i) {
			changed++
		}
	}
	said, notRecorded := 0, 0
	for _, l := range rep.Lines {
		if l.Type != shapes.TypeFile {
			continue
		}
		switch {
		case l.Outcome == shapes.Applied:
			said++
		case l.Outcome == shapes.Failed && strings.Contains(l.Detail, "changed on the machine (applied") && strings.Contains(l.Detail, "not recorded") && strings.Contains(l.Detail, "no space left"):
			said++
			notRecorded++
		}
	}
	if rep.Outcome != shapes.Failed || changed != n || said != n || notRecorded == 0 {
		t.Fatalf("%d files changed on the machine; the report says %d of them (%d not recorded), outcome %s\n%s", changed, said, notRecorded, rep.Outcome, outcomes(rep))
	}

	// Space again: the next apply settles each pending intent by looking,
	// and finds every file as declared.
	os.Remove(filler)
	again := h.apply(doc)
	if again.Outcome == shapes.Failed {
		t.Fatalf("with space again: %s\n%+v", again.Outcome, again.Lines)
	}
	for _, l := range again.Lines {
		if l.Outcome != shapes.Unchanged && l.Outcome != shapes.Applied {
			t.Fatalf("with space again: %+v", l)
		}
	}
	if third := h.apply(doc); third.Outcome != shapes.Unchanged {
		t.Fatalf("third apply: %s [%s]", third.Outcome, outcomes(third))
	}
}

// The disk the declared things live on is full: a directory's creation
// fails, and fails again at the next apply, each leaving its claim
// pending. With room again it is made; undeclared, it is the host's to
// take away — not taken for found because the failed attempts left no
// record of its absence but the first intent's. A file beside it, whose
// write failed the same way, goes too.
func TestWhatAFullDiskKeptFromBeingMadeIsStillTheHostsOnceMade(t *testing.T) {
	h := newHarness(t)
	if err := unix.Mount("tmpfs", h.root, "tmpfs", 0, "size=64k,nr_inodes=32,mode=0755"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(h.root, unix.MNT_DETACH) })
	filler := filepath.Join(h.root, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 4096); ; {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	// A tmpfs counts inodes too: take what is left of them.
	for i := 0; ; i++ {
		if err := os.Mkdir(filepath.Join(h.root, fmt.Sprint("fill-", i)), 0o755); err != nil {
			break
		}
	}
	doc := h.doc(`{"module":"m","id":"d","type":"directory","path":"{root}/d"}`,
		`{"module":"m","id":"f","type":"file","path":"{root}/d/f","content":"x\n"}`)
	for range 2 {
		if rep := h.apply(doc); rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "no space left on device") {
			t.Fatalf("an apply on the full disk: %s %+v", outcomes(rep), rep)
		}
		h.absent("d")
	}
	os.Remove(filler)
	entries, _ := filepath.Glob(filepath.Join(h.root, "fill-*"))
	for _, e := range entries {
		os.Remove(e)
	}
	h.expect(h.apply(doc), shapes.Applied, "m.d=applied m.f=applied")
	h.expect(h.apply(h.doc()), shapes.Removed, "m.f=removed m.d=removed")
	h.absent("d")
}

// A found file larger than the room the store's disk has left cannot be
// kept as its original: the step fails and the file is left as found —
// never replaced on the word of a copy cut short.
func TestAnOriginalTheStoreCannotKeepIsNotReplaced(t *testing.T) {
	h := newHarness(t)
	if err := os.MkdirAll(h.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.state, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(h.state, unix.MNT_DETACH) })
	found := bytes.Repeat([]byte("a person's line\n"), 32<<10) // 512 KiB
	if err := os.WriteFile(h.p("found.txt"), found, 0o644); err != nil {
		t.Fatal(err)
	}
	rep := h.apply(h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/found.txt","content":"declared\n"}`))
	h.expect(rep, shapes.Failed, "m.f=failed")
	if b, _ := os.ReadFile(h.p("found.txt")); !bytes.Equal(b, found) {
		t.Fatalf("the found file was replaced (%d bytes now) though its original could not be kept", len(b))
	}
	if e := mustStore(t, h.state).Get("path:" + h.p("found.txt")); e != nil && e.Original != nil {
		t.Fatalf("the store says an original is kept: %+v", e)
	}
}

// A step that meets a full disk says what to do, whichever step it is.
func TestAFullDiskIsSaidAsWhatToDo(t *testing.T) {
	h := newHarness(t)
	small := h.p("small")
	os.Mkdir(small, 0o755)
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64k,mode=0755"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	big := strings.Repeat("x", 256<<10)
	rep := h.apply(h.doc(`{"module":"m","id":"f","type":"file","path":"{root}/small/f","content":"` + big + `"}`))
	h.expect(rep, shapes.Failed, "m.f=failed")
	if !strings.HasSuffix(rep.Lines[0].Detail, "no space left on device (that disk is full: free room on it, and apply again)") {
		t.Fatalf("%q", rep.Lines[0].Detail)
	}
}
