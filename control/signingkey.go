package control

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// signingKey is an account signing key of NATS operator mode, kept in the
// key directory as file (an account NKey seed, 0600), rotated as NATS'
// signing keys are (account-key rotate): the key announced to replace it
// waits beside it as file+".next" — the account lists both, and what it
// signs from then on it signs with the new one — until the switch renames
// it over the old, and the account lists it alone. Several serves may
// share one key directory: refresh reads the files again when they
// changed under it.
type signingKey struct {
	dir, file string
	// prefix is the kind of NKey: an account's, or (the operator's key,
	// rotated the same way) an operator's.
	prefix nkeys.PrefixByte
	mu     sync.RWMutex
	// cur is the key in force, next the one announced (nil: none); files
	// is how their files were when last read.
	cur, next nkeys.KeyPair
	files     string
	// checked is when issuerPublicFresh last refreshed (unix nanoseconds).
	checked atomic.Int64
}

// loadSigningKey reads the account signing key file of dir, and the one
// announced beside it; a missing file is made when make says so, else an
// error.
func loadSigningKey(dir, file string, make bool) (*signingKey, error) {
	return loadKeyPair(dir, file, nkeys.PrefixByteAccount, make)
}

// loadKeyPair is loadSigningKey for a key of the kind prefix names.
func loadKeyPair(dir, file string, prefix nkeys.PrefixByte, make bool) (*signingKey, error) {
	s := &signingKey{dir: dir, file: file, prefix: prefix}
	// Read again while the files change under the read: another serve's
	// switch between the two reads would give the old key alone.
	for range 5 {
		files := s.stat()
		cur, err := s.read(file, make)
		if err != nil {
			return nil, err
		}
		next, err := s.read(file+".next", false)
		if errors.Is(err, os.ErrNotExist) {
			next, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		s.cur, s.next, s.files = cur, next, files
		if s.stat() == files {
			break
		}
	}
	return s, nil
}

// read reads one of the key's files; a missing one is made when make says
// so, and is otherwise an error that wraps os.ErrNotExist.
func (s *signingKey) read(name string, make bool) (nkeys.KeyPair, error) {
	p := filepath.Join(s.dir, name)
	seed, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) && make {
		kp, cerr := nkeys.CreatePair(s.prefix)
		if cerr != nil {
			return nil, cerr
		}
		b, _ := kp.Seed()
		if werr := writeNew(s.dir, name, append(b, '\n'), 0o600); werr != nil && !errors.Is(werr, os.ErrExist) {
			return nil, werr
		}
		seed, err = os.ReadFile(p)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if err != nil {
		return nil, statedir.ExplainAccess("read", p, err, "")
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if pub, err := kp.PublicKey(); err != nil || nkeys.Prefix(pub) != s.prefix {
		return nil, fmt.Errorf("%s: not an NKey seed of the right kind", name)
	}
	return kp, nil
}

// stat says how the key's files are now: a change of either is seen by
// comparing it with the last.
func (s *signingKey) stat() string {
	var b strings.Builder
	for _, name := range []string{s.file, s.file + ".next"} {
		if fi, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
			fmt.Fprintf(&b, "%s %d %d;", name, fi.Size(), fi.ModTime().UnixNano())
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				fmt.Fprintf(&b, "%d;", st.Ino)
			}
		}
	}
	return b.String()
}

// refresh reads the files again when they changed since last read: the
// serve that carried out a step of the rotation changed them under the
// others, which would otherwise sign and list the keys as they were.
func (s *signingKey) refresh() error {
	now := s.stat()
	s.mu.RLock()
	same := now == s.files
	s.mu.RUnlock()
	if same {
		return nil
	}
	return s.reload()
}

// reload reads the files again, keeping how they were before the read
// (loadKeyPair stats first): a change that lands during the read is seen
// at the next refresh, never taken for the keys read.
func (s *signingKey) reload() error {
	fresh, err := loadKeyPair(s.dir, s.file, s.prefix, false)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur, s.next, s.files = fresh.cur, fresh.next, fresh.files
	return nil
}

// current is the key in force.
func (s *signingKey) current() nkeys.KeyPair {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

// announced is the key announced, nil when none.
func (s *signingKey) announced() nkeys.KeyPair {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.next
}

// issuer is the key that signs what must outlive the switch (a node's
// JWT, kept by its agent): the one announced while a rotation is under
// way, else the one in force.
func (s *signingKey) issuer() nkeys.KeyPair {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.next != nil {
		return s.next
	}
	return s.cur
}

// issuerFreshness is how long issuerPublicFresh trusts the files as last
// read: every heartbeat of the fleet asks, and two stats each would be
// 666 system calls a second for 10,000 nodes at a heartbeat every 30 s;
// another serve's announce is seen within it.
const issuerFreshness = time.Second

// issuerPublicFresh is issuerPublic, the files read again when they
// changed and were last looked at more than issuerFreshness ago.
func (s *signingKey) issuerPublicFresh() string {
	now := time.Now().UnixNano()
	if last := s.checked.Load(); now-last > int64(issuerFreshness) && s.checked.CompareAndSwap(last, now) {
		s.refresh() // an error keeps the keys as they were read last
	}
	return s.issuerPublic()
}

// issuerPublic is issuer's public half.
func (s *signingKey) issuerPublic() string {
	pub, _ := s.issuer().PublicKey()
	return pub
}

// accepted are the keys the account lists: the one in force, and the one
// announced.
func (s *signingKey) accepted() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	cur, _ := s.cur.PublicKey()
	keys := []string{cur}
	if s.next != nil {
		next, _ := s.next.PublicKey()
		keys = append(keys, next)
	}
	return keys
}

// announce makes the key that replaces this one, beside it, unless one is
// announced already, and signs with it from now on.
func (s *signingKey) announce() error {
	if _, err := s.read(s.file+".next", true); err != nil {
		return err
	}
	return s.reload()
}

// switchOver puts the key announced in force, renaming it over the old
// in one step: a crash leaves either both keys or the new one, never
// none.
func (s *signingKey) switchOver() error {
	if _, err := s.read(s.file+".next", false); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(s.dir, s.file+".next"), filepath.Join(s.dir, s.file)); err != nil {
		return err
	}
	if err := statedir.SyncDir(s.dir); err != nil {
		return err
	}
	return s.reload()
}
