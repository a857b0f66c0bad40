// Package identity is what the executor pins: this node's id, its
// enrolment, and the control plane's public key. It is root's own
// configuration (identity.json in the executor's state directory, root,
// 0600), written today by hand or by `mesh-control node add`'s
// executor-identity.json, and by enrolment when that lands. No message
// from the agent can set or change it.
package identity

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// FileName is the identity's file in the state directory.
const FileName = "identity.json"

// Identity is what the executor pins.
type Identity struct {
	Node       string            `json:"node"`
	Enrolment  string            `json:"enrolment"`
	ControlKey ed25519.PublicKey `json:"-"`
	// Keys, when not nil, is what rotations have made of the control key
	// since enrolment (KeysFile): ControlKey is then its Key, the key
	// in force, and no longer the one enrolment pinned.
	Keys *ControlKeys `json:"-"`
}

type file struct {
	Node       string `json:"node"`
	Enrolment  string `json:"enrolment"`
	ControlKey string `json:"control_key"` // base64 Ed25519 public key
	// Format is the file's format. It is read, but not yet written: the
	// file is decoded strictly, and the releases before the field refuse
	// it, so format 1 leaves it out and a release may write it only once
	// the release a rollback returns to reads it.
	Format int `json:"format,omitempty"`
}

// fileFormat is identity.json's format, and FloorFile's: a later one is
// refused, since misreading what the executor pins or its sequence floor
// would let in what it must refuse.
const fileFormat = 1

// laterFormat is the error for a file of a later format than fileFormat.
func laterFormat(p string, format int) error {
	return fmt.Errorf("identity: %s is in format v%d, written by a later release; this executor reads formats up to v%d", p, format, fileFormat)
}

// Load reads the identity from dir. A missing file is not an error: the
// host is hosted, and takes nothing from the link. A file that anyone but
// root could have written is refused.
func Load(dir string) (*Identity, error) {
	p := filepath.Join(dir, FileName)
	f, err := openRoots(p)
	if f == nil || err != nil {
		return nil, err
	}
	defer f.Close()
	var raw file
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("identity: %s: %w", p, err)
	}
	if raw.Format > fileFormat {
		return nil, laterFormat(p, raw.Format)
	}
	key, err := base64.StdEncoding.DecodeString(raw.ControlKey)
	if err != nil || len(key) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("identity: %s: control_key is not a base64 Ed25519 public key", p)
	}
	if raw.Node == "" || raw.Enrolment == "" {
		return nil, fmt.Errorf("identity: %s: node and enrolment are required", p)
	}
	id := &Identity{Node: raw.Node, Enrolment: raw.Enrolment, ControlKey: key}
	ck, err := LoadControlKeys(dir)
	if err != nil {
		return nil, err
	}
	// Kept for this enrolment only: one left by an earlier enrolment of
	// the machine says nothing of the key this one pinned.
	if ck != nil && ck.Node == id.Node && ck.Enrolment == id.Enrolment {
		id.Keys, id.ControlKey = ck, ck.Key
	}
	return id, nil
}

// openRoots opens p, which only root may have written: a regular file,
// root's, writable by nobody else, not through a symbolic link. Missing
// is nil, nil.
func openRoots(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("identity: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
		f.Close()
		return nil, fmt.Errorf("identity: %s must be a regular file owned by root and writable by nobody else (it is %v, uid %d)", p, fi.Mode(), st.Uid)
	}
	return f, nil
}

// Save writes the identity into dir, root-only, durably.
func Save(dir string, id *Identity) error {
	b, err := json.MarshalIndent(file{Node: id.Node, Enrolment: id.Enrolment, ControlKey: base64.StdEncoding.EncodeToString(id.ControlKey)}, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(dir, FileName, append(b, '\n'))
}

// Remove drops the identity, and what rotations made of its control key:
// the host is hosted again.
func Remove(dir string) error {
	for _, f := range []string{FileName, KeysFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("identity: %w", err)
		}
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	defer d.Close()
	return d.Sync()
}

// Floor is the newest link declaration accepted: its sequence and the
// digest of its envelope. The daemon writes it durably before that
// declaration is applied, so no crash can let an older one in; enrolment
// writes it from the grant's sequence floor.
type Floor struct {
	Seq    uint64 `json:"seq"`
	Digest string `json:"digest"`
	// Format is the file's format: fileFormat when written, absent (1)
	// in what releases before the field wrote, which read the file
	// loosely and pass it over.
	Format int `json:"format,omitempty"`
	// Prior is the floor this one replaced, when an accepted declaration
	// moved it (nil: written by an enrolment, or by a release before the
	// field): the declarations between the two never ran, which lets the
	// agent say which it may report superseded (wire.Verdict.Prior).
	Prior *uint64 `json:"prior,omitempty"`
	// Enrolment is the enrolment the floor is of ("": written by a
	// release before the field, taken as the identity's). An enrolment
	// writes its floor before its identity: a floor of an enrolment other
	// than the identity's is one cut short there (a crash, a full disk),
	// which may be lower than the identity's own — a node replaced by
	// another whose sequences start lower — and is no floor for it (Of).
	Enrolment string `json:"enrolment,omitempty"`
}

// Of says whether f is the floor of enrolment.
func (f Floor) Of(enrolment string) bool { return f.Enrolment == "" || f.Enrolment == enrolment }

// FloorFile is the floor's file in the state directory.
const FloorFile = "link-floor.json"

// ReadFloor reads the floor; none is the zero Floor.
func ReadFloor(dir string) (Floor, error) {
	var f Floor
	b, err := os.ReadFile(filepath.Join(dir, FloorFile))
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("identity: sequence floor: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("identity: sequence floor %s: %w", FloorFile, err)
	}
	if f.Format > fileFormat {
		return Floor{}, laterFormat(filepath.Join(dir, FloorFile), f.Format)
	}
	return f, nil
}

// WriteFloor writes the floor durably.
func WriteFloor(dir string, f Floor) error {
	f.Format = fileFormat
	b, _ := json.Marshal(f)
	return writeDurably(dir, FloorFile, b)
}

// WriteFile writes name in dir, root-only (0600), through a temporary file
// synced and renamed, and the directory synced: how the executor keeps
// its identity, floor and keys, so a crash leaves the old file or the new.
func WriteFile(dir, name string, data []byte) error { return writeDurably(dir, name, data) }

// writeDurably writes name in dir, root-only, through a temporary file
// synced and renamed, and the directory synced.
func writeDurably(dir, name string, data []byte) error {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	return syncDir(dir)
}

// RosterFile is the mesh's roster as last taken: the envelope exactly as
// the control plane published it, verified again whenever it is used.
const RosterFile = "roster.cose"

// ReadRoster reads the roster's envelope; none is nil.
func ReadRoster(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, RosterFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("identity: roster: %w", err)
	}
	return b, nil
}

// WriteRoster keeps the roster's envelope durably.
func WriteRoster(dir string, env []byte) error { return writeDurably(dir, RosterFile, env) }
