package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// The snapshot is a small hand-written binary format, not JSON like the
// journal and no longer gob: it is read on every apply, by a process that
// starts for that apply, and gob cost ~0.9 ms and ~10k allocations to
// decode a thousand entries plus ~0.15 ms of package init at every start.
// It is written whole, fsync'd and renamed, so it is never torn; the
// checksum is there for the disk, not for crashes. `owned --json` is the way
// to read it as text.
//
// Layout (format v2, and v3):
//
//	magic     "nox-mesh-host store snapshot v2\n" (or v3)
//	body      version LastN Order count Entry*count
//	checksum  CRC-32 (IEEE) of magic+body, 4 bytes big-endian
//
// Format v3 adds one string at the end of an entry's intent, its digest
// (Intent.Digest). This release reads v3 and writes v2, which the release
// before reads (docs/operations.md, the rule between releases): an intent
// compacted into a v2 snapshot loses its digest, and its change a kill
// cut reads as one that set nothing known, as it did before the field.
// The release after writes v3.
//
// In the body an integer is a uvarint (minimal: the encoding is canonical,
// so what decodes re-encodes to the same bytes), a string is a uvarint
// length and its bytes, a pointer is a presence byte (0 or 1) and then the
// value, a slice is a uvarint count and its elements (an empty slice reads
// back as nil), and the bools of a struct are one flags byte. Fields are
// written in the order of writeEntry; adding a field to Entry, Claim,
// Original or Intent means adding it there and in readEntry, and
// TestSnapshotRoundTripsEveryField fails until both are done. A change
// that old files cannot be read with is a new magic, not a guess.
const (
	snapshotName = "snapshot"
	// snapshotVersion is the format written; snapshotNewest the newest
	// read. Their magics are as long as each other.
	snapshotVersion = 2
	snapshotNewest  = 3
	snapshotMagic   = "nox-mesh-host store snapshot v2\n"
	snapshotMagicV3 = "nox-mesh-host store snapshot v3\n"
	// snapshotStem is what every version's magic begins with.
	snapshotStem = "nox-mesh-host store snapshot v"
	// snapshotMagicV1 is the gob format of development builds. No release
	// wrote it, so it is refused by name rather than converted.
	snapshotMagicV1 = "nox-mesh-host store snapshot v1\n"
)

// The fewest bytes each element can take in the body. A count is checked
// against them and the bytes left before anything is allocated for it, so
// a damaged or hostile file cannot make the decoder allocate more than a
// small multiple of its own size.
const (
	minEntrySize = 12 // target type claims order flags original digest mode uid gid paths pending
	minClaimSize = 3  // source module id
	minPathSize  = 1  // length
)

// Flags bytes. A bit not listed here is refused: the file was written by
// something else, or damaged in a way the checksum missed.
const (
	flagCreated   = 1 << 0
	flagHeld      = 1 << 1
	flagRecovered = 1 << 2
	flagStub      = 1 << 3
	entryFlags    = flagCreated | flagHeld | flagRecovered | flagStub

	flagRunning    = 1 << 0 // Original
	flagEnabledSet = 1 << 1
	flagAbsent     = 1 << 2
	originalFlags  = flagRunning | flagEnabledSet | flagAbsent

	flagIntentCreated = 1 << 0 // Intent
	intentFlags       = flagIntentCreated
)

// snapshot is what the file holds. Version repeats the magic's version in
// the body; the decoder accepts v2 and v3, the encoder writes Version's.
type snapshot struct {
	Version int      `json:"version"`
	LastN   uint64   `json:"last_n"`
	Order   uint64   `json:"order"`
	Entries []*Entry `json:"entries"`
}

// errSnapshotV1 is returned for a snapshot in the gob format of
// development builds; load says what to do about it.
var errSnapshotV1 = errors.New("store: snapshot is in format v1 (gob), which only development builds wrote and this executor does not read")

// encodeSnapshot returns the snapshot file: magic, body, checksum. Every
// entry must be non-nil (the store holds no nil entries).
func encodeSnapshot(snap *snapshot) []byte {
	b := make([]byte, 0, len(snapshotMagic)+32+len(snap.Entries)*160)
	b = append(b, magicOf(snap.Version)...)
	b = binary.AppendUvarint(b, uint64(snap.Version))
	b = binary.AppendUvarint(b, snap.LastN)
	b = binary.AppendUvarint(b, snap.Order)
	b = binary.AppendUvarint(b, uint64(len(snap.Entries)))
	for _, e := range snap.Entries {
		b = writeEntry(b, e, snap.Version)
	}
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// magicOf is the first line of a snapshot of format v (2 or 3).
func magicOf(v int) string {
	if v == 3 {
		return snapshotMagicV3
	}
	return snapshotMagic
}

func writeEntry(b []byte, e *Entry, version int) []byte {
	b = appendString(b, e.Target)
	b = appendString(b, e.Type)
	b = binary.AppendUvarint(b, uint64(len(e.Claims)))
	for _, c := range e.Claims {
		b = appendClaim(b, c)
	}
	b = binary.AppendUvarint(b, e.Order)
	b = append(b, flag(e.Created, flagCreated)|flag(e.Held, flagHeld)|flag(e.Recovered, flagRecovered)|flag(e.Stub, flagStub))
	b = appendOriginal(b, e.Original)
	b = appendString(b, e.Digest)
	b = binary.AppendUvarint(b, uint64(e.Mode))
	b = binary.AppendUvarint(b, uint64(e.UID))
	b = binary.AppendUvarint(b, uint64(e.GID))
	b = appendStrings(b, e.Paths)
	if e.Pending == nil {
		return append(b, 0)
	}
	in := e.Pending
	b = append(b, 1)
	b = appendString(b, in.Op)
	b = append(b, flag(in.Created, flagIntentCreated))
	b = appendOriginal(b, in.Original)
	b = appendClaim(b, in.Claim)
	b = appendString(b, in.Type)
	b = appendStrings(b, in.Paths)
	if version >= 3 {
		b = appendString(b, in.Digest)
	}
	return b
}

func appendClaim(b []byte, c Claim) []byte {
	b = appendString(b, string(c.Source))
	b = appendString(b, c.Module)
	return appendString(b, c.ID)
}

func appendOriginal(b []byte, o *Original) []byte {
	if o == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = appendString(b, o.Kind)
	b = appendString(b, o.Digest)
	b = binary.AppendUvarint(b, uint64(o.Mode))
	b = binary.AppendUvarint(b, uint64(o.UID))
	b = binary.AppendUvarint(b, uint64(o.GID))
	b = append(b, flag(o.Running, flagRunning)|flag(o.EnabledSet, flagEnabledSet)|flag(o.Absent, flagAbsent))
	return appendString(b, o.Enabled)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

func flag(v bool, bit byte) byte {
	if v {
		return bit
	}
	return 0
}

// decodeSnapshot reads a snapshot file. It checks the magic and the
// checksum before it reads the body, and refuses anything it cannot read
// exactly: it never guesses at a damaged store.
//
// It is the hot path of every apply, so it allocates little: the body is
// converted to one string and every decoded string is a substring of it,
// the entries live in one backing array, and most claims in another. The
// price is that a decoded entry keeps the whole body alive, which is the
// size of the file.
func decodeSnapshot(data []byte) (*snapshot, error) {
	version := snapshotVersion
	if bytes.HasPrefix(data, []byte(snapshotMagicV3)) {
		version = 3
	} else if !bytes.HasPrefix(data, []byte(snapshotMagic)) {
		return nil, snapshotHeaderError(data)
	}
	if len(data) < len(snapshotMagic)+4 {
		return nil, fmt.Errorf("store: snapshot is damaged: %d bytes, too short to hold its checksum", len(data))
	}
	end := len(data) - 4
	if got, want := crc32.ChecksumIEEE(data[:end]), binary.BigEndian.Uint32(data[end:]); got != want {
		return nil, fmt.Errorf("store: snapshot is damaged: checksum %08x, the file says %08x", got, want)
	}
	r := snapReader{s: string(data[len(snapshotMagic):end]), version: version}
	snap := &snapshot{}
	if v := r.uvarint(); v != uint64(version) && r.err == nil {
		r.fail("version %d in a v%d file", v, version)
	}
	snap.Version = version
	snap.LastN = r.uvarint()
	snap.Order = r.uvarint()
	n := r.count(minEntrySize, "entries")
	if r.err != nil {
		return nil, r.damaged()
	}
	if n > 0 {
		backing := make([]Entry, n)
		snap.Entries = make([]*Entry, n)
		// Most entries have one claim: take them from one array, each
		// entry's slice capped at its length so an append by its holder
		// copies rather than running into its neighbour's.
		claims := make([]Claim, n)
		for i := range backing {
			e := &backing[i]
			snap.Entries[i] = e
			r.readEntry(e, &claims, n-i)
			if r.err != nil {
				return nil, r.damaged()
			}
		}
	}
	if r.off != len(r.s) {
		r.fail("%d bytes after the last entry", len(r.s)-r.off)
		return nil, r.damaged()
	}
	return snap, nil
}

// snapshotHeaderError says why data begins with neither magic it reads.
func snapshotHeaderError(data []byte) error {
	switch {
	case bytes.HasPrefix(data, []byte(snapshotMagicV1)):
		return errSnapshotV1
	case len(data) < len(snapshotMagic) && (bytes.HasPrefix([]byte(snapshotMagic), data) || bytes.HasPrefix([]byte(snapshotMagicV3), data)):
		return fmt.Errorf("store: snapshot is damaged: cut short at %d bytes, within its first line", len(data))
	case bytes.HasPrefix(data, []byte(snapshotStem)):
		line := data[len(snapshotStem):]
		if i := bytes.IndexByte(line, '\n'); i > 0 && i <= 9 && isDigits(line[:i]) {
			return fmt.Errorf("store: snapshot is in format v%s, which this executor does not read (it reads v%d and v%d)", line[:i], snapshotVersion, snapshotNewest)
		}
	}
	return errors.New("store: snapshot is not a snapshot of this store (its first line is not the snapshot's)")
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// snapReader reads the body. The first error sticks and ends the input, so
// the readers can be called in a row and checked once, and nothing is
// allocated for a count read after it.
type snapReader struct {
	s       string // the body: decoded strings are substrings of it
	off     int
	err     error
	version int // the file's format: v3 adds an intent's digest
}

func (r *snapReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("at byte %d: %s", len(snapshotMagic)+r.off, fmt.Sprintf(format, args...))
	}
	r.off = len(r.s)
}

func (r *snapReader) damaged() error {
	return fmt.Errorf("store: snapshot is damaged: %w", r.err)
}

// uvarint reads a minimal uvarint. Most numbers in a snapshot are one
// byte, so that case is tried first.
func (r *snapReader) uvarint() uint64 {
	if i := r.off; i < len(r.s) {
		if c := r.s[i]; c < 0x80 {
			r.off = i + 1
			return uint64(c)
		}
	}
	return r.uvarintLong()
}

func (r *snapReader) uvarintLong() uint64 {
	// Two bytes (a mode, an id, an order below 16384) are the next most
	// common.
	if i := r.off; i+1 < len(r.s) {
		if c0, c1 := r.s[i], r.s[i+1]; c1 < 0x80 && c1 != 0 {
			r.off = i + 2
			return uint64(c0&0x7f) | uint64(c1)<<7
		}
	}
	var x uint64
	for i, shift := 0, uint(0); ; i, shift = i+1, shift+7 {
		if r.off >= len(r.s) {
			r.fail("cut short in a number")
			return 0
		}
		c := r.s[r.off]
		r.off++
		if i == 9 && c > 1 {
			r.fail("a number larger than 64 bits")
			return 0
		}
		if c < 0x80 {
			if c == 0 {
				r.fail("a number not written in its shortest form")
				return 0
			}
			return x | uint64(c)<<shift
		}
		x |= uint64(c&0x7f) << shift
	}
}

func (r *snapReader) u32(what string) uint32 {
	v := r.uvarint()
	if v > math.MaxUint32 {
		r.fail("%s %d does not fit 32 bits", what, v)
		return 0
	}
	return uint32(v)
}

// str reads a string, a substring of the body. A string shorter than 128
// bytes, which is nearly every one, is read here without a further call.
func (r *snapReader) str() string {
	if i := r.off; i < len(r.s) {
		if n := int(r.s[i]); n < 0x80 && n < len(r.s)-i {
			r.off = i + 1 + n
			return r.s[i+1 : i+1+n]
		}
	}
	return r.strLong()
}

func (r *snapReader) strLong() string {
	n := r.uvarint()
	if left := uint64(len(r.s) - r.off); n > left {
		r.fail("a string of %d bytes with %d left", n, left)
		return ""
	}
	s := r.s[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}

// count reads a slice length and refuses one that the bytes left cannot
// hold at size bytes an element.
func (r *snapReader) count(size int, what string) int {
	n := r.uvarint()
	if n == 0 {
		return 0
	}
	// No division: this runs several times an entry.
	if left := len(r.s) - r.off; n > uint64(left) || int(n)*size > left {
		r.fail("%d %s in the %d bytes left", n, what, left)
		return 0
	}
	return int(n)
}

func (r *snapReader) readByte() byte {
	if r.off >= len(r.s) {
		r.fail("cut short")
		return 0
	}
	r.off++
	return r.s[r.off-1]
}

func (r *snapReader) flags(mask byte, what string) byte {
	f := r.readByte()
	if f&^mask != 0 {
		r.fail("unknown %s flags %#02x", what, f&^mask)
		return 0
	}
	return f
}

func (r *snapReader) present(what string) bool {
	switch r.readByte() {
	case 0:
		return false
	case 1:
		return true
	}
	r.off--
	r.fail("%s presence byte is %d, not 0 or 1", what, r.s[r.off])
	return false
}

// readEntry reads one entry into e, taking its claims from *pool. When the
// pool runs out it is refilled with room for one claim for each of the
// rest entries still to read (this one included).
func (r *snapReader) readEntry(e *Entry, pool *[]Claim, rest int) {
	e.Target = r.str()
	e.Type = r.str()
	if k := r.count(minClaimSize, "claims"); k > 0 {
		if len(*pool) < k {
			*pool = make([]Claim, max(k, rest))
		}
		cs := (*pool)[:k:k]
		*pool = (*pool)[k:]
		for j := range cs {
			r.claim(&cs[j])
		}
		e.Claims = cs
	}
	e.Order = r.uvarint()
	f := r.flags(entryFlags, "entry")
	e.Created, e.Held, e.Recovered, e.Stub = f&flagCreated != 0, f&flagHeld != 0, f&flagRecovered != 0, f&flagStub != 0
	e.Original = r.original()
	e.Digest = r.str()
	e.Mode = r.u32("mode")
	e.UID = r.u32("uid")
	e.GID = r.u32("gid")
	e.Paths = r.stringList()
	if !r.present("pending") {
		return
	}
	in := &Intent{}
	in.Op = r.str()
	in.Created = r.flags(intentFlags, "intent")&flagIntentCreated != 0
	in.Original = r.original()
	r.claim(&in.Claim)
	in.Type = r.str()
	in.Paths = r.stringList()
	if r.version >= 3 {
		in.Digest = r.str()
	}
	e.Pending = in
}

func (r *snapReader) claim(c *Claim) {
	c.Source = Source(r.str())
	c.Module = r.str()
	c.ID = r.str()
}

func (r *snapReader) original() *Original {
	if !r.present("original") {
		return nil
	}
	o := &Original{}
	o.Kind = r.str()
	o.Digest = r.str()
	o.Mode = r.u32("mode")
	o.UID = r.u32("uid")
	o.GID = r.u32("gid")
	f := r.flags(originalFlags, "original")
	o.Running, o.EnabledSet, o.Absent = f&flagRunning != 0, f&flagEnabledSet != 0, f&flagAbsent != 0
	o.Enabled = r.str()
	return o
}

func (r *snapReader) stringList() []string {
	k := r.count(minPathSize, "paths")
	if k == 0 {
		return nil
	}
	ss := make([]string, k)
	for i := range ss {
		ss[i] = r.str()
	}
	return ss
}
