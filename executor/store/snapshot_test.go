package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fill sets every field reachable from v, recursively, to a value distinct
// from every other field's (from *n, counted up), so that a field the codec
// forgets, or two it swaps, shows in a round trip. A bool is true when bit
// of its number is set, or always when bit is negative: round trips over
// bits 0–6 give each bool a distinct pattern, so swapped flags show too.
// A kind fill does not know fails the test: teach it, and the codec.
func fill(t testing.TB, v reflect.Value, n *int, bit int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d-%s", *n, strings.Repeat("x", *n%5)))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Bool:
		v.SetBool(bit < 0 || *n>>bit&1 == 1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n, bit)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), n, bit)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), n, bit)
		}
	default:
		t.Fatalf("fill: a field of kind %s: teach the snapshot codec and this test about it", v.Kind())
	}
}

func roundTrip(t *testing.T, snap *snapshot) *snapshot {
	t.Helper()
	data := encodeSnapshot(snap)
	got, err := decodeSnapshot(data)
	if err != nil {
		t.Fatalf("decode what was encoded: %v", err)
	}
	if !reflect.DeepEqual(got, snap) {
		t.Fatalf("round trip changed the snapshot:\n got %s\nwant %s", dump(got), dump(snap))
	}
	if again := encodeSnapshot(got); !bytes.Equal(again, data) {
		t.Fatal("re-encoding a decoded snapshot gave other bytes")
	}
	return got
}

func dump(s *snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{Version:%d LastN:%d Order:%d", s.Version, s.LastN, s.Order)
	for _, e := range s.Entries {
		fmt.Fprintf(&b, "\n  %+v", *e)
		if e.Original != nil {
			fmt.Fprintf(&b, " original %+v", *e.Original)
		}
		if e.Pending != nil {
			fmt.Fprintf(&b, " pending %+v", *e.Pending)
			if e.Pending.Original != nil {
				fmt.Fprintf(&b, " original %+v", *e.Pending.Original)
			}
		}
	}
	return b.String() + "}"
}

// Every field of the snapshot, Entry, Claim, Original and Intent survives
// the codec of the newest format read, found by reflection: a field added
// later and forgotten in writeEntry or readEntry fails here. The format
// written (v2) carries every field but an intent's digest, which v3 adds.
func TestSnapshotRoundTripsEveryField(t *testing.T) {
	for _, version := range []int{snapshotVersion, snapshotNewest} {
		for bit := -1; bit < 7; bit++ {
			var snap snapshot
			n := 0
			fill(t, reflect.ValueOf(&snap).Elem(), &n, bit)
			snap.Version = version
			if version < 3 {
				for _, e := range snap.Entries {
					e.Pending.Digest = ""
				}
			}
			roundTrip(t, &snap)
		}
		roundTrip(t, &snapshot{Version: version})
		roundTrip(t, &snapshot{Version: version, LastN: 1 << 63, Order: 1<<64 - 1,
			Entries: []*Entry{{Target: "path:/a", Mode: 1<<32 - 1, UID: 1<<32 - 1, GID: 1<<32 - 1}}})
	}
}

// The format written is the one the release before reads (v2): an
// intent's digest is left out of it, and the rest of the entry is as in
// v3. A v3 file is read, by this release, whole.
func TestTheSnapshotWrittenIsTheOneTheReleaseBeforeReads(t *testing.T) {
	entry := func() *Entry {
		return &Entry{Target: "service:pf.service", Type: "service", Claims: []Claim{{Source: Link, Module: "web", ID: "pf"}},
			Pending: &Intent{Op: "change", Claim: Claim{Source: Link, Module: "web", ID: "pf"}, Type: "service", Digest: "state=running enabled=-"}}
	}
	data := encodeSnapshot(&snapshot{Version: snapshotVersion, LastN: 1, Order: 1, Entries: []*Entry{entry()}})
	if !bytes.HasPrefix(data, []byte("nox-mesh-host store snapshot v2\n")) {
		t.Fatalf("written as %q", data[:32])
	}
	got, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	want := entry()
	want.Pending.Digest = ""
	if !reflect.DeepEqual(got.Entries[0], want) {
		t.Fatalf("v2: %+v %+v, want %+v", got.Entries[0], got.Entries[0].Pending, want.Pending)
	}
	got = roundTrip(t, &snapshot{Version: 3, LastN: 1, Order: 1, Entries: []*Entry{entry()}})
	if got.Entries[0].Pending.Digest != "state=running enabled=-" {
		t.Fatalf("v3 lost the intent's digest: %+v", got.Entries[0].Pending)
	}
}

// A decoded entry's claims are its own: appending to one does not reach
// into the next, although they come from one array.
func TestSnapshotClaimsDoNotOverlap(t *testing.T) {
	got := roundTrip(t, benchSnapshot(3))
	got.Entries[0].Claims = append(got.Entries[0].Claims, Claim{Source: Local, Module: "m", ID: "x"})
	if got.Entries[1].Claims[0].ID != "file-0001" {
		t.Fatalf("appending to entry 0's claims changed entry 1's: %+v", got.Entries[1].Claims)
	}
}

// seal frames body as a v2 snapshot file with a valid checksum, so that
// tests reach the body's reader and not only the checksum.
func seal(body []byte) []byte { return sealAs(snapshotMagic, body) }

// sealAs frames body under magic.
func sealAs(magic string, body []byte) []byte {
	b := append([]byte(magic), body...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// body builds a snapshot body by hand: a uint64 is a uvarint, a string is
// length and bytes, a []byte is written as is.
func body(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch p := p.(type) {
		case int:
			b = binary.AppendUvarint(b, uint64(p))
		case uint64:
			b = binary.AppendUvarint(b, p)
		case string:
			b = appendString(b, p)
		case []byte:
			b = append(b, p...)
		default:
			panic(fmt.Sprintf("body: %T", p))
		}
	}
	return b
}

// entry is the parts of a minimal entry, with flags, original presence and
// pending presence as given.
func entry(flags, original, pending byte) []any {
	return []any{"path:/a", "file", 0, 1, []byte{flags, original}, "", 0, 0, 0, 0, []byte{pending}}
}

func header(count int) []any { return []any{snapshotVersion, 1, 1, count} }

func parts(ps ...[]any) []byte {
	var all []any
	for _, p := range ps {
		all = append(all, p...)
	}
	return body(all...)
}

// Damaged snapshots are refused, each with an error that says what is
// wrong, and none makes the decoder panic or allocate for counts the file
// cannot hold.
func TestSnapshotRefusesDamage(t *testing.T) {
	valid := encodeSnapshot(benchSnapshot(3))
	flipped := func(i int) []byte {
		b := bytes.Clone(valid)
		b[i] ^= 0x10
		return b
	}
	if _, err := decodeSnapshot(seal(parts(header(1), entry(0, 0, 0)))); err != nil {
		t.Fatalf("the minimal entry the table builds on is refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "damaged: cut short at 0 bytes"},
		{"cut in the magic", []byte(snapshotMagic[:10]), "damaged: cut short at 10 bytes"},
		{"no checksum", []byte(snapshotMagic + "ab"), "too short to hold its checksum"},
		{"flipped checksum", flipped(len(valid) - 1), "damaged: checksum"},
		{"flipped body", flipped(len(snapshotMagic) + 20), "damaged: checksum"},
		{"format v1", append([]byte(snapshotMagicV1), "gob gob gob"...), "format v1 (gob)"},
		{"format v4", []byte(snapshotStem + "4\n..."), "format v4, which this executor does not read (it reads v2 and v3)"},
		{"v3, cut short", []byte(snapshotMagicV3 + "ab"), "too short to hold its checksum"},
		{"v3, cut in the magic", []byte(snapshotMagicV3[:len(snapshotMagicV3)-3]), "damaged: cut short at"},
		{"a v2 body under the v3 magic", sealAs(snapshotMagicV3, body(snapshotVersion, 1, 1, 0)), "version 2 in a v3 file"},
		{"json", []byte(`{"version":1}`), "not a snapshot of this store"},
		{"a first line of garbage", []byte(snapshotStem + "\x00\x01\n..."), "not a snapshot of this store"},
		{"body version 3", seal(body(3, 1, 1, 0)), "version 3 in a v2 file"},
		{"entry count beyond the data", seal(body(snapshotVersion, 1, 1, 1<<40)), "1099511627776 entries in the 0 bytes left"},
		{"entry count beyond the data, some left", seal(parts(header(2), entry(0, 0, 0))), "2 entries in the 23 bytes left"},
		{"claim count beyond the data", seal(body(snapshotVersion, 1, 1, 1, "path:/a", "file", 1<<20, []byte("0123456789"))), "1048576 claims in the 10 bytes left"},
		{"path count beyond the data", seal(body(snapshotVersion, 1, 1, 1, "t", "file", 0, 1, []byte{0, 0}, "", 0, 0, 0, 1000, []byte{0})), "1000 paths in the 1 bytes left"},
		{"string beyond the data", seal(body(snapshotVersion, 1, 1, 1, 100, []byte(strings.Repeat("x", 20)))), "a string of 100 bytes with 20 left"},
		{"a number over 64 bits", seal(body(snapshotVersion, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02})), "larger than 64 bits"},
		{"a number not in its shortest form", seal(body(snapshotVersion, []byte{0x81, 0x00})), "not written in its shortest form"},
		{"a mode over 32 bits", seal(body(snapshotVersion, 1, 1, 1, "t", "file", 0, 1, []byte{0, 0}, "", uint64(1<<32), 0, 0, 0, []byte{0})), "mode 4294967296 does not fit 32 bits"},
		{"unknown entry flag", seal(parts(header(1), entry(0x10, 0, 0))), "unknown entry flags 0x10"},
		{"presence byte 2", seal(parts(header(1), entry(0, 2, 0))), "original presence byte is 2"},
		{"pending cut short", seal(parts(header(1), entry(0, 0, 1))), "cut short"},
		{"bytes after the last entry", seal(parts(header(1), entry(0, 0, 0), []any{[]byte("xyz")})), "3 bytes after the last entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := decodeSnapshot(tc.data)
			if err == nil {
				t.Fatalf("accepted: %s", dump(snap))
			}
			if !strings.HasPrefix(err.Error(), "store: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want one saying %q", err, tc.want)
			}
		})
	}
	// Cut short at every byte: as found (the checksum catches it) and
	// sealed again (the reader must).
	inner := valid[len(snapshotMagic) : len(valid)-4]
	for i := range len(valid) {
		if _, err := decodeSnapshot(valid[:i]); err == nil || !strings.Contains(err.Error(), "store: snapshot is damaged") {
			t.Fatalf("cut at %d: %v", i, err)
		}
	}
	for i := range len(inner) {
		if _, err := decodeSnapshot(seal(inner[:i])); err == nil || !strings.Contains(err.Error(), "store: snapshot is damaged: at byte") {
			t.Fatalf("body cut at %d and sealed again: %v", i, err)
		}
	}
}

// Open refuses a v1 snapshot by name and says what to do; it refuses a
// damaged one rather than starting from what it could read.
func TestOpenRefusesOldAndDamagedSnapshots(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}})
	if err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	s.Unlock()
	p := filepath.Join(dir, snapshotName)
	data, _ := os.ReadFile(p)
	r := open(t, dir)
	r.Unlock()
	if r.Get("path:/a") == nil {
		t.Fatalf("entries after compaction: %v", r.Entries())
	}

	os.WriteFile(p, append([]byte(snapshotMagicV1), "\x0f\xff\x81\x03\x01\x01"...), 0o600)
	_, err := Open(dir)
	if !errors.Is(err, errSnapshotV1) || !strings.Contains(err.Error(), "move "+dir+" aside") {
		t.Fatalf("a v1 snapshot: %v", err)
	}

	data[len(data)-10] ^= 1
	os.WriteFile(p, data, 0o600)
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "store: snapshot is damaged: checksum") {
		t.Fatalf("a damaged snapshot: %v", err)
	}
}

// FuzzSnapshot feeds the snapshot decoder arbitrary bytes: it never
// panics, and what it accepts re-encodes to the same bytes, which decode
// to the same value.
func FuzzSnapshot(f *testing.F) {
	var full snapshot
	n := 0
	fill(f, reflect.ValueOf(&full).Elem(), &n, -1)
	full.Version = snapshotNewest
	// The format written, every field but the intent's digest: a seed
	// whose pending intent is in the v2 form.
	written := full
	written.Version = snapshotVersion
	written.Entries = nil
	for _, e := range full.Entries {
		c := *e
		p := *e.Pending
		p.Digest = ""
		c.Pending = &p
		written.Entries = append(written.Entries, &c)
	}
	for _, s := range []*snapshot{{Version: snapshotVersion}, benchSnapshot(2), &full, &written} {
		data := encodeSnapshot(s)
		f.Add(data)
		f.Add(data[len(snapshotMagic) : len(data)-4]) // the body alone, sealed below
		f.Add(data[:len(data)/2])
	}
	f.Add(parts(header(1), entry(0, 0, 0)))
	f.Add(parts(header(1), entry(0x10, 2, 1)))
	f.Add([]byte(snapshotMagicV1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		// As found on disk, and sealed with a valid checksum, so the
		// fuzzer reaches the body and not only the checksum.
		for _, file := range [][]byte{data, seal(data), sealAs(snapshotMagicV3, data)} {
			snap, err := decodeSnapshot(file)
			if err != nil {
				if !strings.HasPrefix(err.Error(), "store: snapshot") {
					t.Fatalf("error without the store's prefix: %v", err)
				}
				continue
			}
			again := encodeSnapshot(snap)
			if !bytes.Equal(again, file) {
				t.Fatalf("accepted bytes that do not re-encode the same:\n%x\n%x", file, again)
			}
			snap2, err := decodeSnapshot(again)
			if err != nil {
				t.Fatalf("the re-encoding is refused: %v", err)
			}
			if !reflect.DeepEqual(snap, snap2) {
				t.Fatalf("round trip changed the snapshot:\n%s\n%s", dump(snap), dump(snap2))
			}
		}
	})
}

// benchSnapshot is n file entries as a typical apply leaves them.
func benchSnapshot(n int) *snapshot {
	snap := &snapshot{Version: snapshotVersion, LastN: uint64(3 * n), Order: uint64(n)}
	for i := range n {
		snap.Entries = append(snap.Entries, &Entry{
			Target: fmt.Sprintf("path:/srv/app/conf.d/file-%04d.conf", i), Type: "file",
			Claims: []Claim{{Source: Link, Module: "app", ID: fmt.Sprintf("file-%04d", i)}},
			Order:  uint64(i + 1), Created: true,
			Digest: strings.Repeat(fmt.Sprintf("%02x", i%256), 32), Mode: 0o644, UID: 1000, GID: 1000,
		})
	}
	return snap
}

func BenchmarkSnapshotDecode(b *testing.B) {
	data := encodeSnapshot(benchSnapshot(1000))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeSnapshot(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSnapshotEncode(b *testing.B) {
	snap := benchSnapshot(1000)
	b.ReportAllocs()
	for b.Loop() {
		encodeSnapshot(snap)
	}
}

// BenchmarkOpen is what an apply pays to read a state directory of 1000
// entries, compacted: read the snapshot, decode it, index it.
func BenchmarkOpen(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Lock(time.Second); err != nil {
		b.Fatal(err)
	}
	for _, e := range benchSnapshot(1000).Entries {
		e.Order = 0
		if err := s.Put(e); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Compact(); err != nil {
		b.Fatal(err)
	}
	s.Unlock()
	b.ReportAllocs()
	for b.Loop() {
		s, err := Open(dir)
		if err != nil || len(s.entries) != 1000 {
			b.Fatal(err, len(s.entries))
		}
	}
}
