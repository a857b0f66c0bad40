package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Salvaged content is kept SalvageKeep and no longer: it expires at the
// next apply after that (every apply locks the store), not only when
// something else is salvaged, which on most nodes is never. Content the
// store's entries or a younger salvaged entry still refer to stays.
func TestSalvagedExpiresOnTheNextApply(t *testing.T) {
	t0 := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	clock := t0
	saved := now
	now = func() time.Time { return clock }
	defer func() { now = saved }()

	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	old, shared, young := []byte("old edit\n"), []byte("edited the same way\n"), []byte("young edit\n")
	salvage := func(path string, data []byte, at time.Time) string {
		t.Helper()
		d := sha256Hex(data)
		if err := s.Salvage(Salvaged{Path: path, Digest: d, Written: "w", Removed: at, Module: "m", ID: "f"}, data); err != nil {
			t.Fatal(err)
		}
		return d
	}
	dOld := salvage("/etc/old", old, t0)
	dShared := salvage("/etc/shared-1", shared, t0)
	salvage("/etc/shared-2", shared, t0.Add(20*24*time.Hour))
	dYoung := salvage("/etc/young", young, t0.Add(20*24*time.Hour))
	// A kept original of an entry, salvaged too: the entry still needs it.
	dEntry := salvage("/etc/entry", []byte("original\n"), t0)
	s.Put(&Entry{Target: "path:/etc/motd", Type: "file", Claims: []Claim{claim}, Original: &Original{Kind: "file", Digest: dEntry}})
	s.Commit()
	s.Unlock()

	kept := func() (paths []string) {
		t.Helper()
		r, _, err := Peek(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range r.Salvaged() {
			paths = append(paths, x.Path)
		}
		return paths
	}
	have := func(d string) bool { _, err := os.Stat(filepath.Join(dir, "originals", d)); return err == nil }

	// Day 30: nothing is past its time yet.
	clock = t0.Add(SalvageKeep)
	open(t, dir).Unlock()
	if got := kept(); len(got) != 5 {
		t.Fatalf("day 30: %v", got)
	}

	// Day 31, an apply that salvages nothing: the old ones go, with the
	// content nothing else keeps.
	clock = t0.Add(SalvageKeep + 24*time.Hour)
	open(t, dir).Unlock()
	if got := kept(); len(got) != 2 || got[0] != "/etc/shared-2" || got[1] != "/etc/young" {
		t.Fatalf("day 31: still listed %v", got)
	}
	if have(dOld) || !have(dShared) || !have(dYoung) || !have(dEntry) {
		t.Fatalf("day 31: old %v shared %v young %v entry's %v; want only the old content gone", have(dOld), have(dShared), have(dYoung), have(dEntry))
	}

	// Day 51: all of it, and the list reads empty ([] on disk, not null).
	clock = t0.Add(SalvageKeep + 21*24*time.Hour)
	open(t, dir).Unlock()
	if got := kept(); len(got) != 0 || have(dShared) || have(dYoung) || !have(dEntry) {
		t.Fatalf("day 51: listed %v, shared %v young %v entry's %v", got, have(dShared), have(dYoung), have(dEntry))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, salvageName)); string(b) != "[]\n" {
		t.Fatalf("salvaged.json = %q", b)
	}

	// A read-only look (Peek, as `owned` does) changes nothing.
	st, err := os.Stat(filepath.Join(dir, salvageName))
	if err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(365 * 24 * time.Hour)
	kept()
	if st2, _ := os.Stat(filepath.Join(dir, salvageName)); !st2.ModTime().Equal(st.ModTime()) {
		t.Fatal("Peek wrote the salvaged list")
	}
}

// At most SalvageMax are listed: the oldest go first.
func TestSalvagedKeepsAtMostSalvageMax(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state"))
	defer s.Unlock()
	for i := range SalvageMax + 2 {
		data := []byte{byte(i), byte(i >> 8)}
		if err := s.Salvage(Salvaged{Path: "/f", Digest: sha256Hex(data), Removed: now()}, data); err != nil {
			t.Fatal(err)
		}
	}
	list := s.Salvaged()
	if len(list) != SalvageMax || list[0].Digest != sha256Hex([]byte{2, 0}) {
		t.Fatalf("%d listed, the first %s", len(list), list[0].Digest)
	}
	if _, err := os.Stat(s.OriginalPath(sha256Hex([]byte{0, 0}))); !os.IsNotExist(err) {
		t.Fatalf("the oldest's content is still kept: %v", err)
	}
}

// The same content of the same path kept again — a removal that did not
// end, tried at every apply — is one entry, dated by the last: the other
// edits kept are not pushed out by its tries.
func TestTheSameEditKeptAgainIsOneEntry(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state"))
	defer s.Unlock()
	other := []byte("another edit")
	if err := s.Salvage(Salvaged{Path: "/g", Digest: sha256Hex(other), Removed: now()}, other); err != nil {
		t.Fatal(err)
	}
	data := []byte("an edit")
	for range SalvageMax + 1 {
		if err := s.Salvage(Salvaged{Path: "/f", Digest: sha256Hex(data), Removed: now(), Module: "m", ID: "f"}, data); err != nil {
			t.Fatal(err)
		}
	}
	list := s.Salvaged()
	if len(list) != 2 || list[0].Path != "/g" || list[1].Path != "/f" {
		t.Fatalf("%+v", list)
	}
}
