package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A boot empties the firewall and takes the overlay's interface; the
// daemon's start puts them back. When the start's apply stops at a step
// before them (here a file whose directory a person replaced with a file;
// on a machine, a full disk), what the store records is put back all the
// same — the opening still declared, the one whose removal the stop
// skipped, the overlay — each said by a line, and nothing written to the
// store. An opening the declaration adds and no apply has made waits for
// an apply that gets past the failure, which then removes the old one.
func TestAStartThatStopsStillPutsBackWhatTheBootTook(t *testing.T) {
	h := newHarness(t)
	fw := newFakeFirewall("input", "INPUT")
	withFirewall(t, fw, nil)
	wg := withFakeWG(t)
	peer, _ := wgtypes.GeneratePrivateKey()
	wg0 := overlayDoc("wg0", peerDoc(peer.PublicKey(), "10.233.0.2/32"))
	ssh := `{"module":"web","id":"ssh","type":"opening","port":22,"protocol":"tcp","path":"incoming"}`
	moved := strings.Replace(web, "8080", "8081", 1)
	file := `{"module":"m","id":"f","type":"file","path":"{root}/d/f","content":"x\n"}`

	h.expect(h.apply(h.doc(wg0, ssh, web)), shapes.Applied, "mesh.wg=applied web.ssh=applied web.http=applied")
	// The next declaration stops at its file, before the openings: the
	// old opening stays recorded, its removal skipped.
	if err := os.WriteFile(h.p("d"), []byte("a person's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	next := h.doc(file, wg0, ssh, moved)
	if rep := h.apply(next); outcomes(rep) != "m.f=failed" {
		t.Fatalf("%s\n%+v", outcomes(rep), rep.Lines)
	}
	held := map[string]*store.Entry{}
	st, _ := store.Open(h.state)
	for _, e := range st.Entries() {
		held[e.Target] = e
	}
	journal, _ := os.ReadFile(filepath.Join(h.state, "journal"))

	// The boot.
	for _, c := range fw.chains {
		clear(fw.rules[c])
	}
	clear(wg.ifs)
	fw.log, wg.log = nil, nil

	// A drift reconcile that stops puts nothing back: an opening's or an
	// overlay's repair waits for its step.
	if rep := h.run(store.Local, next, false); outcomes(rep) != "m.f=failed" || len(fw.log) != 0 || len(wg.log) != 0 {
		t.Fatalf("%s %q %q", outcomes(rep), fw.log, wg.log)
	}

	h.restore = true
	rep := h.run(store.Local, next, false)
	h.expect(rep, shapes.Failed, "m.f=failed mesh.wg=repaired web.ssh=repaired web.http=repaired")
	if !strings.Contains(rep.Lines[2].Detail, "declared still, and the apply stopped before its step") ||
		!strings.Contains(rep.Lines[3].Detail, "tcp 8080 from 10.231.1.0/24 (incoming)") ||
		!strings.Contains(rep.Lines[3].Detail, "no longer declared, and its removal waits for an apply that gets past the failure") {
		t.Fatalf("%+v", rep.Lines)
	}
	for _, spec := range []string{"tcp 22 from anywhere (incoming)", "tcp 8080 from 10.231.1.0/24 (incoming)"} {
		for _, c := range fw.chains {
			if fw.rules[c][spec] == "" {
				t.Fatalf("%s: no rule for %s after the start: %v", c.Name, spec, fw.rules)
			}
		}
	}
	if len(fw.rules[fw.chains[0]]) != 2 {
		t.Fatalf("the opening no apply has made was made: %v", fw.rules)
	}
	if got, _ := wg.Observe(t.Context(), "wg0"); !got.Up || len(got.Device.Peers) != 1 || got.Device.ListenPort != 51820 {
		t.Fatalf("the overlay is not back as declared: %+v", got)
	}
	// What the start wrote to the journal is what any apply writes of
	// itself (that it began, what it said, that it ended): no intent, no
	// record of a thing.
	after, _ := os.ReadFile(filepath.Join(h.state, "journal"))
	for _, rec := range strings.Split(strings.TrimSpace(strings.TrimPrefix(string(after), string(journal))), "\n") {
		var r struct{ Op string }
		if _, js, _ := strings.Cut(rec, " "); json.Unmarshal([]byte(js), &r) != nil || r.Op != "begin" && r.Op != "said" && r.Op != "end" {
			t.Fatalf("the start wrote to the store: %s", rec)
		}
	}
	st, _ = store.Open(h.state)
	for _, e := range st.Entries() {
		if !reflect.DeepEqual(e, held[e.Target]) {
			t.Fatalf("the record of %s changed: %+v, was %+v", e.Target, e, held[e.Target])
		}
	}

	// A start of a daemon that restarted (the machine did not boot) finds
	// them all there and says nothing of them.
	fw.log, wg.log = nil, nil
	if rep := h.run(store.Local, next, false); outcomes(rep) != "m.f=failed" || len(fw.log) != 0 || len(wg.log) != 0 {
		t.Fatalf("%s %q %q", outcomes(rep), fw.log, wg.log)
	}

	// Past the failure: the new opening made, the old one removed.
	if err := os.Remove(h.p("d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h.p("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.expect(h.run(store.Local, next, false), shapes.Applied, "m.f=applied mesh.wg=unchanged web.ssh=unchanged web.http=applied web.http=removed")
	if _, ok := fw.rules[fw.chains[0]]["tcp 8080 from 10.231.1.0/24 (incoming)"]; ok || len(fw.rules[fw.chains[0]]) != 2 {
		t.Fatalf("%v", fw.rules)
	}
}

// The opening moved by a step that ran before the failure: the new rule
// is made by its step, and the old one, whose removal the stop skipped, is
// put back all the same, under the same name — the machine holds both
// until an apply gets past the failure.
func TestAStartPutsBackTheOpeningAStepMovedAway(t *testing.T) {
	h := newHarness(t)
	fw := newFakeFirewall("input")
	withFirewall(t, fw, nil)
	moved := strings.Replace(web, "8080", "8081", 1)
	file := `{"module":"m","id":"f","type":"file","path":"{root}/d/f","content":"x\n"}`
	h.expect(h.apply(h.doc(web)), shapes.Applied, "web.http=applied")
	if err := os.WriteFile(h.p("d"), []byte("a person's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	next := h.doc(moved, file)
	clear(fw.rules[fw.chains[0]]) // the boot
	h.restore = true
	rep := h.run(store.Local, next, false)
	h.expect(rep, shapes.Failed, "web.http=applied m.f=failed web.http=repaired")
	if !strings.Contains(rep.Lines[2].Detail, "tcp 8080 from 10.231.1.0/24 (incoming)") {
		t.Fatalf("%+v", rep.Lines[2])
	}
	if len(fw.rules[fw.chains[0]]) != 2 {
		t.Fatalf("the old rule and the new one are not both there: %v", fw.rules)
	}
}

// An overlay the declaration changes (a peer added) is not put back when
// the start stops before its step: neither the old one (the declaration
// no longer says it) nor the new (past the failure), and nothing is
// written to the store; the line says why it stays down.
func TestAStartDoesNotBringAChangedOverlayPastTheFailure(t *testing.T) {
	h := newHarness(t)
	wg := withFakeWG(t)
	peer, _ := wgtypes.GeneratePrivateKey()
	other, _ := wgtypes.GeneratePrivateKey()
	file := `{"module":"m","id":"f","type":"file","path":"{root}/d/f","content":"x\n"}`
	h.expect(h.apply(h.doc(overlayDoc("wg0", peerDoc(peer.PublicKey(), "10.233.0.2/32")))), shapes.Applied, "mesh.wg=applied")
	if err := os.WriteFile(h.p("d"), []byte("a person's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	next := h.doc(file, overlayDoc("wg0", peerDoc(peer.PublicKey(), "10.233.0.2/32"), peerDoc(other.PublicKey(), "10.233.0.3/32")))
	if rep := h.apply(next); outcomes(rep) != "m.f=failed" {
		t.Fatalf("%s\n%+v", outcomes(rep), rep.Lines)
	}
	journal, _ := os.ReadFile(filepath.Join(h.state, "journal"))
	clear(wg.ifs) // the boot
	wg.log = nil
	h.restore = true
	rep := h.run(store.Local, next, false)
	h.expect(rep, shapes.Failed, "m.f=failed mesh.wg=failed")
	if !strings.Contains(rep.Lines[1].Detail, "not put back") || len(wg.log) != 0 {
		t.Fatalf("%+v %q", rep.Lines, wg.log)
	}
	after, _ := os.ReadFile(filepath.Join(h.state, "journal"))
	for _, rec := range strings.Split(strings.TrimSpace(strings.TrimPrefix(string(after), string(journal))), "\n") {
		var r struct{ Op string }
		if _, js, _ := strings.Cut(rec, " "); json.Unmarshal([]byte(js), &r) != nil || r.Op != "begin" && r.Op != "said" && r.Op != "end" {
			t.Fatalf("the start wrote to the store: %s", rec)
		}
	}
}
