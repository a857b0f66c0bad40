package store

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// Salvaged is the content of a file someone had edited by hand when the
// host, as it was undeclared, removed it (the host created it) or put its
// found original back over it: removing what the host made and giving
// back what it changed is the rule (ADR 0118), but a person's edit is not
// thrown away without a word. The content is kept in originals/ under its digest for
// SalvageKeep, and `mesh-executor owned` says where.
type Salvaged struct {
	Path    string    `json:"path"`
	Digest  string    `json:"digest"` // sha256 of the content, the file in originals/
	Written string    `json:"written"`
	Removed time.Time `json:"removed"`
	Module  string    `json:"module,omitempty"`
	ID      string    `json:"id,omitempty"`
	// Format is the entry's format (salvageFormat when written; absent, in
	// what releases before the field wrote, it is 1). The list is a JSON
	// array, which has no place for a version of its own, and an entry's
	// field is passed over by the releases before it.
	Format int `json:"format,omitempty"`
}

// SalvageKeep is how long salvaged content is kept; SalvageMax bounds how
// many are listed (the oldest go first).
const (
	SalvageKeep = 30 * 24 * time.Hour
	SalvageMax  = 100
)

const salvageName = "salvaged.json"

// salvageFormat is the salvaged list's format: the newest an entry may
// carry.
const salvageFormat = 1

// Salvage keeps data, the content of a hand-edited file the host is about
// to remove, and lists it; it is durable before the removal is (Sync).
// Entries past SalvageKeep or SalvageMax are dropped, and their content
// with them unless something else keeps it. A list holding an entry of a
// later format is refused, not written over: its content would be
// forgotten with it.
func (s *Store) Salvage(v Salvaged, data []byte) error {
	list, err := s.readSalvaged()
	if err != nil {
		return err
	}
	if err := s.KeepOriginal(v.Digest, data); err != nil {
		return err
	}
	// The same content of the same path, kept already by a removal that
	// did not end (a kill, a path it failed on, tried again at every
	// apply): one entry, dated now, not one more at each try, which would
	// push out the other edits kept (SalvageMax) within a day.
	list = slices.DeleteFunc(list, func(x Salvaged) bool {
		return x.Path == v.Path && x.Digest == v.Digest && x.Module == v.Module && x.ID == v.ID
	})
	return s.keepSalvaged(append(list, v))
}

// now is the clock salvaged content expires by; tests move it.
var now = clock.Now

// expireSalvaged drops salvaged content kept past SalvageKeep. Lock runs
// it, so it happens on every apply (the daemon's, every ten minutes at
// least, and a rescue command's): were it left to the next Salvage, content
// "kept for 30 days" would be kept for as long as nothing else is ever
// salvaged. A list with nothing to drop is not written again.
func (s *Store) expireSalvaged() error {
	list, err := s.readSalvaged()
	if err != nil {
		return nil // a later release's list: left as it is (Salvage says why)
	}
	for _, x := range list {
		if now().Sub(x.Removed) > SalvageKeep {
			return s.keepSalvaged(list)
		}
	}
	return nil
}

// keepSalvaged writes list, oldest first, less what is past SalvageKeep or
// beyond SalvageMax, and forgets the content of what it drops unless an
// entry kept, or the store's, still refers to it.
func (s *Store) keepSalvaged(list []Salvaged) error {
	keep := []Salvaged{}
	var drop []string
	for i, x := range list {
		if now().Sub(x.Removed) > SalvageKeep || len(list)-i > SalvageMax {
			drop = append(drop, x.Digest)
			continue
		}
		x.Format = salvageFormat
		keep = append(keep, x)
	}
	b, err := json.MarshalIndent(keep, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(filepath.Join(s.dir, salvageName), append(b, '\n')); err != nil {
		return fmt.Errorf("store: salvage: %w", err)
	}
	// Forgotten only once the list that no longer names them is durable.
	for _, d := range drop {
		if !s.originalInUse(d, keep) {
			s.forgetOriginal(d, true)
		}
	}
	return nil
}

// originalInUse reports whether a salvaged entry kept holds digest too;
// ForgetOriginal looks after the store's entries.
func (s *Store) originalInUse(digest string, kept []Salvaged) bool {
	for _, x := range kept {
		if x.Digest == digest {
			return true
		}
	}
	return false
}

// Salvaged lists the salvaged contents still kept, oldest first; a later
// release's entries as far as this one reads them, for a person to see.
func (s *Store) Salvaged() []Salvaged {
	list, _ := s.readSalvaged()
	return list
}

// readSalvaged reads the list. One that does not parse lists nothing, as
// it always did; an entry of a later format is an error naming both
// formats, with the list as read.
func (s *Store) readSalvaged() ([]Salvaged, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, salvageName))
	if err != nil {
		return nil, nil
	}
	var list []Salvaged
	if json.Unmarshal(b, &list) != nil {
		return nil, nil
	}
	for _, x := range list {
		if x.Format > salvageFormat {
			return list, fmt.Errorf("store: %s lists %s in format v%d, written by a later release; this executor reads formats up to v%d and does not write the list over", salvageName, x.Path, x.Format, salvageFormat)
		}
	}
	return list, nil
}

// OriginalPath is where a kept original's content is, for a person to
// read back.
func (s *Store) OriginalPath(digest string) string {
	return filepath.Join(s.dir, "originals", digest)
}
