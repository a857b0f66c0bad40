package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

var claim = Claim{Source: Local, Module: "m", ID: "f"}

func TestIntentPutDropSurviveReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Intend("path:/a", Intent{Op: "create", Created: true, Claim: claim, Type: "file"})
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d1"})
	s.Intend("path:/b", Intent{Op: "create", Created: true, Claim: claim, Type: "file"})
	s.Put(&Entry{Target: "path:/b", Type: "file", Claims: []Claim{claim}, Created: true})
	s.Intend("path:/b", Intent{Op: "remove", Claim: claim, Type: "file"})
	s.Drop("path:/b")
	// An intent whose outcome was never written: the process "died".
	s.Intend("path:/c", Intent{Op: "create", Created: true, Claim: claim, Type: "file"})
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	s.Unlock()

	r := open(t, dir)
	defer r.Unlock()
	if e := r.Get("path:/a"); e == nil || e.Digest != "d1" || !e.Created || e.Pending != nil || e.Order != 1 {
		t.Fatalf("a = %+v", e)
	}
	if r.Get("path:/b") != nil {
		t.Fatal("dropped entry came back")
	}
	c := r.Get("path:/c")
	if c == nil || c.Pending == nil || !c.Stub || !c.Pending.Created {
		t.Fatalf("interrupted intent not kept as pending: %+v", c)
	}
	// Abandoning the stub forgets it.
	r.Abandon("path:/c")
	if r.Get("path:/c") != nil {
		t.Fatal("abandoned stub kept")
	}
}

// An intent written over one that never settled on a stub keeps what the
// first knew of the target before the host touched it: absent (the host
// makes whatever is there), or what was found. The second look, after a
// change that failed half way, would take the host's own half for found.
func TestAnIntentOverAStubKeepsWhatTheFirstKnew(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state"))
	defer s.Unlock()
	s.Intend("path:/made", Intent{Op: "create", Created: true, Claim: claim, Type: "directory"})
	s.Intend("path:/made", Intent{Op: "change", Claim: claim, Type: "directory"})
	if e := s.Get("path:/made"); e == nil || !e.Stub || e.Pending.Op != "change" || !e.Pending.Created {
		t.Fatalf("made: %+v %+v", e, e.Pending)
	}
	found := &Original{Digest: "found"}
	s.Intend("path:/found", Intent{Op: "change", Original: found, Claim: claim, Type: "file"})
	s.Intend("path:/found", Intent{Op: "change", Original: &Original{Digest: "half-written"}, Claim: claim, Type: "file"})
	if e := s.Get("path:/found"); e == nil || e.Pending.Created || e.Pending.Original == nil || e.Pending.Original.Digest != "found" {
		t.Fatalf("found: %+v %+v", e, e.Pending)
	}
	// Over a recorded entry, an intent is as written: the entry knows.
	s.Put(&Entry{Target: "path:/found", Type: "file", Claims: []Claim{claim}, Original: found})
	s.Intend("path:/found", Intent{Op: "change", Claim: claim, Type: "file"})
	if e := s.Get("path:/found"); e.Pending.Original != nil || e.Pending.Created {
		t.Fatalf("over an entry: %+v", e.Pending)
	}
}

// An intent over one a kill cut, with the entry as settled after that cut
// (IntendOver), is one record: read again, the entry is the settled one
// with the new intent pending — in memory, from the journal, and from the
// snapshot a compaction writes — and a stub settled gets its order.
func TestAnIntentOverACutOneKeepsTheSettledEntry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	svc := Claim{Source: Local, Module: "m", ID: "u"}
	s.Put(&Entry{Target: "service:u", Type: "service", Claims: []Claim{svc}, Digest: "state=stopped"})
	s.Intend("service:u", Intent{Op: "change", Claim: svc, Type: "service", Digest: "state=running"})
	s.Intend("path:/new", Intent{Op: "create", Created: true, Claim: claim, Type: "file"})
	settled := &Entry{Target: "service:u", Type: "service", Claims: []Claim{svc}, Order: 1, Digest: "was=running"}
	if err := s.IntendOver("service:u", settled, Intent{Op: "change", Claim: svc, Type: "service", Digest: "state=stopped"}); err != nil {
		t.Fatal(err)
	}
	if err := s.IntendOver("path:/new", &Entry{Target: "path:/new", Type: "file", Claims: []Claim{claim}, Created: true}, Intent{Op: "change", Claim: claim, Type: "file"}); err != nil {
		t.Fatal(err)
	}
	// The snapshot this release writes (v2) carries no intent's digest.
	check := func(how string, r *Store) {
		t.Helper()
		want := "state=stopped"
		if how == "from the snapshot" {
			want = ""
		}
		if e := r.Get("service:u"); e == nil || e.Digest != "was=running" || e.Pending == nil || e.Pending.Digest != want || e.Order != 1 {
			t.Errorf("%s: the unit %+v", how, e)
		}
		if e := r.Get("path:/new"); e == nil || e.Stub || !e.Created || e.Pending == nil || e.Pending.Op != "change" || e.Order != 2 {
			t.Errorf("%s: the file %+v", how, e)
		}
	}
	check("in memory", s)
	s.Unlock()
	r := open(t, dir)
	check("from the journal", r)
	if err := r.Compact(); err != nil {
		t.Fatal(err)
	}
	r.Unlock()
	r = open(t, dir)
	defer r.Unlock()
	check("from the snapshot", r)
}

// A record cut short by a crash mid-write is dropped, never guessed at, and
// the next record follows a whole one.
func TestTornTail(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Put(&Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}})
	s.Put(&Entry{Target: "path:/b", Type: "file", Claims: []Claim{claim}})
	s.Commit()
	s.Unlock()
	j := filepath.Join(dir, "journal")
	data, _ := os.ReadFile(j)
	os.WriteFile(j, data[:len(data)-7], 0o600) // tear the last record
	r := open(t, dir)
	if r.Get("path:/a") == nil || r.Get("path:/b") != nil {
		t.Fatalf("torn tail read wrongly: %v", r.Entries())
	}
	r.Put(&Entry{Target: "path:/c", Type: "file", Claims: []Claim{claim}})
	r.Commit()
	r.Unlock()
	q := open(t, dir)
	if q.Get("path:/c") == nil || q.Get("path:/a") == nil {
		t.Fatalf("record after a torn tail lost: %v", q.Entries())
	}
	q.Unlock()
	// What a power cut leaves of the records written since the last sync:
	// blocks never written read as zeros, with a record written after
	// them maybe on disk: a tear, cut there.
	data, _ = os.ReadFile(j)
	first := bytes.IndexByte(data, '\n') + 1
	zeroed := slices.Clone(data)
	for i := first; i < first+20; i++ {
		zeroed[i] = 0
	}
	os.WriteFile(j, zeroed, 0o600)
	z := open(t, dir)
	if z.Get("path:/a") == nil || len(z.Entries()) != 1 {
		t.Fatalf("a tear with a record after it read wrongly: %v", z.Entries())
	}
	z.Unlock()
	// A flipped bit is caught by the checksum; with whole records after
	// it, it is no tear: refused, and the journal left as it is, its
	// records not cut.
	data[12] ^= 1
	os.WriteFile(j, data, 0o600)
	if q2, err := Open(dir); err == nil || !strings.Contains(err.Error(), "the journal is damaged at byte 0") {
		t.Fatalf("damaged first record: %v %v", q2, err)
	}
	if after, _ := os.ReadFile(j); !bytes.Equal(after, data) {
		t.Fatal("the damaged journal was changed")
	}
	// The last record damaged, nothing whole after it: a tear.
	data[12] ^= 1
	data[len(data)-5] ^= 1
	os.WriteFile(j, data, 0o600)
	if q3, err := Open(dir); err != nil || q3.Get("path:/c") != nil {
		t.Fatalf("a damaged last record: %v", err)
	}
}

// Compaction writes the snapshot, then empties the journal; a crash between
// the two replays nothing twice.
func TestCompactionIsIdempotent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	for _, tg := range []string{"path:/a", "path:/b", "path:/c"} {
		s.Put(&Entry{Target: tg, Type: "file", Claims: []Claim{claim}})
	}
	s.Drop("path:/b")
	s.Commit()
	journal, _ := os.ReadFile(filepath.Join(dir, "journal"))
	if err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	s.Unlock()
	// Simulate the crash: the old journal is still there beside the snapshot.
	os.WriteFile(filepath.Join(dir, "journal"), journal, 0o600)
	r := open(t, dir)
	defer r.Unlock()
	got := r.Entries()
	if len(got) != 2 || got[0].Target != "path:/a" || got[1].Target != "path:/c" {
		t.Fatalf("entries after snapshot + stale journal: %v", got)
	}
	r.Put(&Entry{Target: "path:/d", Type: "file", Claims: []Claim{claim}})
	if e := r.Get("path:/d"); e.Order != 4 {
		t.Fatalf("order after compaction = %d, want 4", e.Order)
	}
}

func TestRefusesAnUnsafeStateDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	os.Mkdir(dir, 0o755)
	if _, err := Open(dir); err == nil {
		t.Fatal("opened a state directory others can read")
	}
	os.Remove(dir)
	os.Symlink(t.TempDir(), dir)
	if _, err := Open(dir); err == nil {
		t.Fatal("opened a state directory reached through a link")
	}
}

func TestOneApplierAtATime(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	a := open(t, dir)
	defer a.Unlock()
	b, _ := Open(dir)
	if err := b.Lock(100 * time.Millisecond); err != ErrBusy {
		t.Fatalf("second lock = %v, want ErrBusy", err)
	}
	a.Unlock()
	if err := b.Lock(100 * time.Millisecond); err != nil {
		t.Fatalf("lock after the first applier let go: %v", err)
	}
	b.Unlock()
	if _, err := os.Lstat(filepath.Join(dir, "lock")); !os.IsNotExist(err) {
		t.Fatalf("a lock file was made (%v); the directory itself is the lock", err)
	}
}

// A build that locks a "lock" file in the directory instead: while one
// holds it, this build waits too (an upgrade may run the two side by side
// for a moment).
func TestTheEarlierBuildsLockFileIsHonoured(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := s.Lock(100 * time.Millisecond); err != ErrBusy {
		t.Fatalf("lock while an earlier build holds its lock file = %v, want ErrBusy", err)
	}
	f.Close()
	if err := s.Lock(100 * time.Millisecond); err != nil {
		t.Fatalf("lock once the earlier build let go: %v", err)
	}
	s.Unlock()
}

func TestTargetSavedOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	defer s.Unlock()
	s.SaveTarget(Local, []byte("one"))
	fi1, _ := os.Stat(filepath.Join(dir, "target-local.json"))
	time.Sleep(10 * time.Millisecond)
	s.SaveTarget(Local, []byte("one"))
	fi2, _ := os.Stat(filepath.Join(dir, "target-local.json"))
	if !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Fatal("the same target was written again")
	}
	got, _ := s.Target(Local)
	if !bytes.Equal(got, []byte("one")) {
		t.Fatalf("target = %q", got)
	}
	// Another target of the same size, one longer than the compare's
	// piece, and one differing only in its last byte: each is written.
	big := bytes.Repeat([]byte("x"), 100<<10)
	for _, next := range [][]byte{[]byte("two"), big, append(bytes.Clone(big[:len(big)-1]), 'y'), []byte("")} {
		if err := s.SaveTarget(Local, next); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Target(Local); !bytes.Equal(got, next) {
			t.Fatalf("target of %d bytes not saved (have %d bytes)", len(next), len(got))
		}
	}
}

// FuzzJournal feeds the journal reader arbitrary bytes: it never panics,
// and what it accepts is exactly the whole, checksummed records.
func FuzzJournal(f *testing.F) {
	var b bytes.Buffer
	encodeRecord(&b, &record{N: 1, Op: "put", Target: "path:/a", Entry: &Entry{Target: "path:/a", Type: "file", Claims: []Claim{claim}}})
	encodeRecord(&b, &record{N: 2, Op: "intent", Target: "path:/b", Intent: &Intent{Op: "create", Claim: claim}})
	encodeRecord(&b, &record{N: 3, Op: "drop", Target: "path:/a"})
	encodeRecord(&b, &record{N: 4, Op: "begin", Began: &Began{Source: Link, Seq: 7}})
	encodeRecord(&b, &record{N: 5, Op: "said", Lines: []shapes.Line{{Module: "m", ID: "a", Type: "file", Outcome: shapes.Applied, Detail: "created"}}})
	encodeRecord(&b, &record{N: 6, Op: "end"})
	f.Add(b.Bytes())
	f.Add([]byte("00000000 {}\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		// As found on disk, and with every line framed with a valid
		// checksum, so the fuzzer reaches the replay and not only the CRC.
		var framed bytes.Buffer
		for _, line := range bytes.Split(data, []byte("\n")) {
			var crc [8]byte
			hex.Encode(crc[:], binaryBE(crc32.ChecksumIEEE(line)))
			framed.Write(crc[:])
			framed.WriteByte(' ')
			framed.Write(line)
			framed.WriteByte('\n')
		}
		for _, journal := range [][]byte{data, framed.Bytes()} {
			s := &Store{entries: map[string]*Entry{}}
			good, _ := s.replayJournal(journal)
			if good > len(journal) || (good > 0 && journal[good-1] != '\n') {
				t.Fatalf("accepted %d bytes that do not end a record", good)
			}
			for _, e := range s.Entries() {
				if e == nil {
					t.Fatal("nil entry")
				}
			}
		}
	})
}

// Another process holding the applier's lock (the daemon mid-apply, a
// rescue command) is named by its pid, as the kernel lists the lock.
func TestTheLockHolderIsNamed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	s.Unlock()
	holder := exec.Command("flock", "--exclusive", dir, "sleep", "30")
	if err := holder.Start(); err != nil {
		t.Fatalf("util-linux flock (tests/install-deps.sh installs it): %v", err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	// flock runs sleep once it holds the lock: wait for that.
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = s.Lock(0); err != nil {
			break
		}
		s.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d holds %s", holder.Process.Pid, dir)) {
		t.Fatalf("lock while pid %d holds it: %v", holder.Process.Pid, err)
	}
}

// A reader without the lock (Peek: the rescue command's owned and status,
// a plan) never sees the store go back while the writer compacts: the
// writer only adds here, so what a reader counts never falls. Read
// snapshot-first, a compaction between the two reads left an old snapshot
// and an emptied journal: a store that had lost the last apply.
func TestAReaderNeverSeesACompactionHalfWay(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := open(t, dir)
	defer s.Unlock()
	stop := make(chan struct{})
	fell := make(chan string, 1)
	go func() {
		last := 0
		for {
			select {
			case <-stop:
				close(fell)
				return
			default:
			}
			r, _, err := Peek(dir)
			if err != nil {
				continue
			}
			n := len(r.Entries())
			if n < last {
				fell <- fmt.Sprintf("a reader saw %d entries after %d", n, last)
				close(fell)
				return
			}
			last = n
		}
	}()
	for i := range 2000 {
		target := fmt.Sprintf("path:/f%d", i)
		s.Intend(target, Intent{Op: "create", Created: true, Claim: claim, Type: "file"})
		s.Put(&Entry{Target: target, Type: "file", Claims: []Claim{claim}, Created: true, Digest: "d"})
		if i%5 == 0 {
			if err := s.Compact(); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	if msg, ok := <-fell; ok {
		t.Fatal(msg)
	}
}

// A full state disk: the report summary, which status names the last
// apply by, is written over the last in place, not left naming an older
// apply until the next one.
func TestAReportSummaryIsKeptOnAFullDisk(t *testing.T) {
	dir := smallDisk(t)
	s := open(t, dir)
	defer s.Unlock()
	if err := s.SaveReport(Link, "declaration", &shapes.Report{Source: "link", Seq: 3, Outcome: shapes.Applied}); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, dir)
	if err := s.SaveReport(Link, "declaration", &shapes.Report{Source: "link", Seq: 4, Outcome: shapes.Applied, Lines: []shapes.Line{{Outcome: shapes.Applied}}}); err != nil {
		t.Fatalf("on the full disk: %v", err)
	}
	data, _ := s.Report(Link)
	var sum ReportSummary
	if err := json.Unmarshal(data, &sum); err != nil || sum.Seq != 4 {
		t.Fatalf("the summary after a save on the full disk: %q %v", data, err)
	}
}

// smallDisk is a state directory on a tmpfs of its own, 64 KiB, to fill.
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Fatalf("a tmpfs to fill (make test runs as root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fillDisk takes the room left in dir's filesystem, a block at a time, with
// dir/filler.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 4096); ; {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
}

// An original larger than the room left is not kept at all: a copy cut
// short by the full disk is never named after the digest of what it was
// to hold, and the keeping fails, so the change that needed it does not
// run.
func TestAnOriginalCutShortByAFullDiskIsNotKept(t *testing.T) {
	dir := smallDisk(t)
	s := open(t, dir)
	defer s.Unlock()
	data := bytes.Repeat([]byte("a person's file\n"), 8<<10) // 128 KiB: more than the disk
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	if err := s.KeepOriginal(digest, data); err == nil {
		t.Fatal("an original larger than the disk was said kept")
	}
	if _, err := os.Lstat(filepath.Join(dir, "originals", digest)); !os.IsNotExist(err) {
		t.Fatalf("a copy cut short is named after the digest: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "originals", digest+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("the copy cut short is left taking the room: %v", err)
	}
}

// A restarts-owed.json that does not read is moved aside, its bytes kept
// for a person, and written anew: left in place it would keep every later
// write from keeping anything (what it owed is lost to the host either
// way, and the write says so).
func TestRestartsOwedThatDoNotReadAreMovedAside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "restarts-owed.json")
	os.WriteFile(p, []byte(`{"format":1,"owed":{"link":`), 0o600)
	if got := s.RestartsOwed(Link); got != nil {
		t.Fatalf("read %v", got)
	}
	if err := s.SetRestartsOwed(Local, map[string][]string{"a.service": {"m.f"}}); !errors.Is(err, ErrOwedAside) {
		t.Fatalf("not said: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, OwedAside)); string(b) != `{"format":1,"owed":{"link":` {
		t.Fatalf("not kept aside: %s", b)
	}
	if got := s.RestartsOwed(Local); !slices.Equal(got["a.service"], []string{"m.f"}) {
		t.Fatalf("not written anew: %v", got)
	}
	if err := s.SetRestartsOwed(Local, nil); err != nil {
		t.Fatal(err)
	}
}
