package store

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// The store as each release left it (golden.Releases; README.md beside
// the goldens says how they were made).

// goldenEntries is what every golden's store holds, by its hand-written
// encoding (which TestRecordJSONIsEncodingJSONs keeps encoding/json's),
// the journal replayed over the snapshot. Releases from ad58737 on also
// hold the unit the declaration brought, and the enablement recorded.
var (
	goldenEntries = []string{
		`{"target":"path:/etc/hosts","type":"file","claims":[{"source":"link","module":"net","id":"hosts"}],"order":0,"pending":{"op":"change","original":{"kind":"file","digest":"ff66","mode":420,"uid":0,"gid":0},"claim":{"source":"link","module":"net","id":"hosts"},"type":"file"},"stub":true}`,
		`{"target":"path:/etc/pending","type":"file","claims":[{"source":"link","module":"base","id":"pending"}],"order":0,"pending":{"op":"create","created":true,"claim":{"source":"link","module":"base","id":"pending"},"type":"file"},"stub":true}`,
		`{"target":"path:/etc/ssh/sshd_config","type":"file","claims":[{"source":"link","module":"ssh","id":"config"},{"source":"bundle","module":"ssh","id":"config"}],"order":2,"original":{"kind":"file","digest":"bb22","mode":384,"uid":0,"gid":0},"digest":"cc33","mode":384}`,
		`{"target":"unit:nginx.service","type":"service","claims":[{"source":"bundle","module":"web","id":"nginx"}],"order":3,"original":{"kind":"service","mode":0,"uid":0,"gid":0,"running":true,"enabled":"enabled"}}`,
		`{"target":"path:/opt/app","type":"archive","claims":[{"source":"link","module":"app","id":"bundle"}],"order":4,"recovered":true,"mode":493,"uid":1000,"gid":1000,"paths":["/opt/app/bin","/opt/app/lib"]}`,
		`{"target":"path:/etc/issue","type":"file","claims":[{"source":"local","module":"base","id":"issue"}],"order":5,"created":true,"digest":"dd44","mode":420}`,
	}
	goldenEntriesGiveBack = []string{
		goldenEntries[0], goldenEntries[1], goldenEntries[2],
		`{"target":"unit:app.service","type":"service","claims":[{"source":"link","module":"app","id":"unit"}],"order":3,"created":true,"original":{"kind":"service","mode":0,"uid":0,"gid":0,"enabled":"disabled","enabled_set":true,"absent":true}}`,
		`{"target":"unit:nginx.service","type":"service","claims":[{"source":"bundle","module":"web","id":"nginx"}],"order":4,"original":{"kind":"service","mode":0,"uid":0,"gid":0,"running":true,"enabled":"enabled","enabled_set":true}}`,
		`{"target":"path:/opt/app","type":"archive","claims":[{"source":"link","module":"app","id":"bundle"}],"order":5,"recovered":true,"mode":493,"uid":1000,"gid":1000,"paths":["/opt/app/bin","/opt/app/lib"]}`,
		`{"target":"path:/etc/issue","type":"file","claims":[{"source":"local","module":"base","id":"issue"}],"order":6,"created":true,"digest":"dd44","mode":420}`,
	}
	goldenSalvaged = Salvaged{Path: "/etc/old.conf", Digest: sha256Hex([]byte("edited by hand\n")), Written: "ee55",
		Removed: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), Module: "base", ID: "old"}
	goldenHistory = []shapes.Activity{
		{At: time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC), Source: "link", Trigger: "declaration", Seq: 42, Outcome: shapes.Applied, Changed: 3},
		{At: time.Date(2026, 12, 2, 8, 10, 0, 0, time.UTC), Source: "local", Trigger: "rescue", Outcome: shapes.Failed, Changed: 1, Failed: 2},
	}
)

// goldens says what each golden holds: which files its release wrote
// (salvage from 46ba576, history from a61a636) and which entries.
var goldens = []struct {
	dir               string
	entries           []string
	salvage, history  bool
	formatField       bool // the release wrote the format fields
	owed              bool // restarts owed, from 050dae3
	cut               bool // a cut apply's changes kept by source, from da7998a
	lastN, lastOrders uint64
}{
	{dir: "b2b1bf2", entries: goldenEntries, lastN: 8, lastOrders: 5},
	{dir: "46ba576", entries: goldenEntries, salvage: true, lastN: 8, lastOrders: 5},
	{dir: "a61a636", entries: goldenEntries, salvage: true, history: true, lastN: 8, lastOrders: 5},
	{dir: "9d97354", entries: goldenEntriesGiveBack, salvage: true, history: true, lastN: 9, lastOrders: 6},
	{dir: "5d5c15c", entries: goldenEntriesGiveBack, salvage: true, history: true, formatField: true, lastN: 9, lastOrders: 6},
	{dir: "050dae3", entries: goldenEntriesGiveBack, salvage: true, history: true, formatField: true, owed: true, lastN: 9, lastOrders: 6},
	{dir: "da7998a", entries: goldenEntriesGiveBack, salvage: true, history: true, formatField: true, owed: true, cut: true, lastN: 9, lastOrders: 6},
}

func TestEveryStoreFormatThatShippedIsRead(t *testing.T) {
	var named []string
	for _, g := range goldens {
		named = append(named, g.dir)
	}
	golden.Releases(t, named...)
	for _, g := range goldens {
		t.Run(g.dir, func(t *testing.T) {
			dir := copyGolden(t, g.dir)
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range s.Entries() {
				got = append(got, string(jsonEntry(nil, e)))
			}
			if strings.Join(got, "\n") != strings.Join(g.entries, "\n") {
				t.Errorf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(g.entries, "\n"))
			}
			if s.n != g.lastN || s.order != g.lastOrders {
				t.Errorf("last record %d, last order %d; want %d, %d", s.n, s.order, g.lastN, g.lastOrders)
			}
			salvaged := s.Salvaged()
			switch {
			case !g.salvage && len(salvaged) != 0:
				t.Errorf("salvaged %+v, in a release before salvage", salvaged)
			case g.salvage && (len(salvaged) != 1 || !sameSalvaged(salvaged[0], goldenSalvaged)):
				t.Errorf("salvaged %+v; want %+v", salvaged, goldenSalvaged)
			case g.salvage:
				if b, err := s.Original(goldenSalvaged.Digest); err != nil || string(b) != "edited by hand\n" {
					t.Errorf("salvaged content %q, %v", b, err)
				}
				if want := map[bool]int{true: salvageFormat}[g.formatField]; salvaged[0].Format != want {
					t.Errorf("salvaged in format %d; want %d", salvaged[0].Format, want)
				}
			}
			acts, more, err := History(dir, time.Time{}, time.Now().Add(time.Hour), 10)
			if err != nil || more != 0 {
				t.Fatalf("history: %v (%d more)", err, more)
			}
			if want := goldenHistory[:0]; g.history {
				want = goldenHistory
				if !sameActivities(acts, want) {
					t.Errorf("history %+v; want %+v", acts, want)
				}
			} else if len(acts) != 0 {
				t.Errorf("history %+v, in a release before history", acts)
			}
			local, link := s.RestartsOwed(Local), s.RestartsOwed(Link)
			switch {
			case !g.owed && (local != nil || link != nil):
				t.Errorf("restarts owed %v %v, in a release before them", local, link)
			case g.owed && (!reflect.DeepEqual(local, map[string][]string{"nginx.service": {"base.conf"}}) || !reflect.DeepEqual(link, map[string][]string{"app.service": {"app.conf", "app.env"}})):
				t.Errorf("restarts owed %v %v", local, link)
			}
			if cut, want := s.CutChanged(Link, false), map[bool]map[string]bool{true: {"app.conf": true, "web.site": true}, false: {}}[g.cut]; !reflect.DeepEqual(cut, want) {
				t.Errorf("a cut apply's changes %v; want %v", cut, want)
			}
			// And it goes on from there: locked, written, read again.
			if err := s.Lock(time.Second); err != nil {
				t.Fatal(err)
			}
			if err := s.Drop("path:/etc/issue"); err != nil {
				t.Fatal(err)
			}
			if err := s.Compact(); err != nil {
				t.Fatal(err)
			}
			s.Unlock()
			again, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(again.Entries()); n != len(g.entries)-1 {
				t.Errorf("%d entries after a drop and a compaction; want %d", n, len(g.entries)-1)
			}
		})
	}
}

func sameSalvaged(a, b Salvaged) bool {
	return a.Path == b.Path && a.Digest == b.Digest && a.Written == b.Written && a.Removed.Equal(b.Removed) && a.Module == b.Module && a.ID == b.ID
}

func sameActivities(a, b []shapes.Activity) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !x.At.Equal(y.At) {
			return false
		}
		x.At = y.At
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// copyGolden copies a golden store into a directory of the test's own:
// reading a store may write it (Lock cuts a torn tail, expires salvage).
func copyGolden(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join(golden.Dir, name)
	dst := filepath.Join(t.TempDir(), "state")
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// A file of a later format than this release writes is refused, or left
// out, with both formats named; it is never taken for damage and cut, nor
// written over.
func TestALaterStoreFormatIsRefused(t *testing.T) {
	const later = `format v2, written by a later release; this executor reads formats up to v1`
	for _, c := range []struct{ name, record string }{
		{"journal", `{"n":10,"op":"drop","target":"path:/etc/issue","format":2}`},
		// One this release cannot even decode: its fields changed.
		{"journal, its fields changed", `{"n":10,"op":"put","target":"path:/etc/issue","entry":"a later shape","format":2}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := copyGolden(t, "9d97354")
			appendFile(t, filepath.Join(dir, "journal"), fmt.Sprintf("%08x %s\n", crc32.ChecksumIEEE([]byte(c.record)), c.record))
			before, _ := os.ReadFile(filepath.Join(dir, "journal"))
			_, err := Open(dir)
			if err == nil || !strings.Contains(err.Error(), "journal record 10 is in "+later) {
				t.Fatalf("open: %v", err)
			}
			if after, _ := os.ReadFile(filepath.Join(dir, "journal")); string(after) != string(before) {
				t.Error("the journal changed")
			}
		})
	}
	t.Run("snapshot", func(t *testing.T) {
		dir := copyGolden(t, "9d97354")
		data, _ := os.ReadFile(filepath.Join(dir, snapshotName))
		data = append([]byte("nox-mesh-host store snapshot v4\n"), data[len(snapshotMagic):]...)
		os.WriteFile(filepath.Join(dir, snapshotName), data, 0o600)
		_, err := Open(dir)
		if err == nil || !strings.Contains(err.Error(), "snapshot is in format v4, which this executor does not read (it reads v2 and v3)") {
			t.Fatalf("open: %v", err)
		}
	})
	t.Run("salvage", func(t *testing.T) {
		dir := copyGolden(t, "9d97354")
		p := filepath.Join(dir, salvageName)
		list := `[{"path":"/etc/later.conf","digest":"` + goldenSalvaged.Digest + `","written":"x","removed":"2026-12-01T09:00:00Z","format":2}]`
		os.WriteFile(p, []byte(list), 0o600)
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Lock(time.Second); err != nil {
			t.Fatal(err)
		}
		defer s.Unlock()
		err = s.Salvage(Salvaged{Path: "/etc/new.conf", Digest: sha256Hex([]byte("x")), Removed: now()}, []byte("x"))
		if err == nil || !strings.Contains(err.Error(), "lists /etc/later.conf in "+later) {
			t.Fatalf("salvage: %v", err)
		}
		if b, _ := os.ReadFile(p); string(b) != list {
			t.Errorf("the list was written over: %s", b)
		}
		if got := s.Salvaged(); len(got) != 1 || got[0].Path != "/etc/later.conf" {
			t.Errorf("listed %+v", got)
		}
	})
	t.Run("history", func(t *testing.T) {
		dir := copyGolden(t, "9d97354")
		appendFile(t, filepath.Join(dir, historyFile), `{"format":2,"at":"2026-12-02T09:00:00Z","source":"link","outcome":"applied","changed":1}`+"\n")
		acts, _, err := History(dir, time.Time{}, time.Now().Add(time.Hour), 10)
		if err == nil || !strings.Contains(err.Error(), "holds lines in format v2, written by a later release (1), left out; this executor reads formats up to v1") {
			t.Fatalf("history: %v", err)
		}
		if !sameActivities(acts, goldenHistory) {
			t.Errorf("history %+v; want the lines it reads", acts)
		}
	})
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
