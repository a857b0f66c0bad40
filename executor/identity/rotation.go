package identity

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// KeysFile is what rotations have made of the control key this node
// pinned at enrolment: the key in force, the recovery key, and each
// rotation taken. identity.json keeps the key enrolment pinned, as the
// releases before rotation read it; this file, which they do not read,
// says which key is in force since.
const KeysFile = "control-keys.json"

// keysFormat is KeysFile's format; a later one is refused: misreading
// which key is in force would let in what must be refused.
const keysFormat = 1

// ControlKeys is KeysFile: the control key in force for one enrolment.
type ControlKeys struct {
	Node, Enrolment string
	Key             ed25519.PublicKey
	// Recovery is the offline recovery key (nil: none held): only a
	// rotation it signs may undo one signed by a stolen control key, or
	// name another recovery key.
	Recovery ed25519.PublicKey
	// Seq is the sequence of the last rotation taken; RecoverySeq that of
	// the last taken from the recovery key.
	Seq, RecoverySeq uint64
	// Taken is every rotation taken, oldest first.
	Taken []Rotated
}

// Rotated is one rotation taken.
type Rotated struct {
	Seq  uint64    `json:"seq"`
	By   string    `json:"by"`
	From string    `json:"from"` // key ids
	To   string    `json:"to"`
	At   time.Time `json:"at"`
}

type keysFile struct {
	Format      int       `json:"format"`
	Node        string    `json:"node"`
	Enrolment   string    `json:"enrolment"`
	Key         string    `json:"control_key"`
	Recovery    string    `json:"recovery_key,omitempty"`
	Seq         uint64    `json:"seq,omitempty"`
	RecoverySeq uint64    `json:"recovery_seq,omitempty"`
	Taken       []Rotated `json:"taken,omitempty"`
}

// LoadControlKeys reads KeysFile from dir (nil, nil when absent): root's
// alone, as identity.json, decoded strictly.
func LoadControlKeys(dir string) (*ControlKeys, error) {
	p := filepath.Join(dir, KeysFile)
	f, err := openRoots(p)
	if f == nil || err != nil {
		return nil, err
	}
	defer f.Close()
	var raw keysFile
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("identity: %s: %w", p, err)
	}
	if raw.Format > keysFormat {
		return nil, fmt.Errorf("identity: %s is in format v%d, written by a later release; this executor reads formats up to v%d", p, raw.Format, keysFormat)
	}
	ck := &ControlKeys{Node: raw.Node, Enrolment: raw.Enrolment, Seq: raw.Seq, RecoverySeq: raw.RecoverySeq, Taken: raw.Taken}
	if ck.Key, err = decodePublic(raw.Key); err != nil || raw.Node == "" || raw.Enrolment == "" {
		return nil, fmt.Errorf("identity: %s: node, enrolment and a base64 Ed25519 control_key are required", p)
	}
	if raw.Recovery != "" {
		if ck.Recovery, err = decodePublic(raw.Recovery); err != nil {
			return nil, fmt.Errorf("identity: %s: recovery_key is not a base64 Ed25519 public key", p)
		}
	}
	return ck, nil
}

func decodePublic(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("not a base64 Ed25519 public key")
	}
	return ed25519.PublicKey(b), nil
}

// SaveControlKeys writes KeysFile durably: a crash leaves the key in
// force before the rotation, or after it.
func SaveControlKeys(dir string, ck *ControlKeys) error {
	raw := keysFile{Format: keysFormat, Node: ck.Node, Enrolment: ck.Enrolment, Key: base64.StdEncoding.EncodeToString(ck.Key),
		Seq: ck.Seq, RecoverySeq: ck.RecoverySeq, Taken: ck.Taken}
	if ck.Recovery != nil {
		raw.Recovery = base64.StdEncoding.EncodeToString(ck.Recovery)
	}
	b, err := json.MarshalIndent(&raw, "", "  ")
	if err != nil {
		return err
	}
	return writeDurably(dir, KeysFile, append(b, '\n'))
}

// ErrNotKept is TakeRotations' error for a rotation it would take and
// could not keep (its file not written: a full disk): no verdict on the
// rotation, which is taken when it is offered again and can be kept.
var ErrNotKept = errors.New("identity: a rotation to take could not be kept")

// TakeRotations judges a chain of rotation statements, oldest first,
// against id (Load's) and keeps each it takes, durably, before the next
// is judged: the new key in force, and from then on the only one whose
// declarations are taken. A statement the node has taken already, or
// that retires a key other than the one in force (an earlier link of the
// chain), is passed over; one signed by the key in force or the recovery
// key that is wrongly addressed, or not newer than the last taken, is
// refused, and so is the rest of the chain. It returns those taken, and
// the first refusal — or ErrNotKept, the one to take not kept.
func TakeRotations(dir string, id *Identity, chain [][]byte, now time.Time) (taken []*wire.KeyRotation, err error) {
	ck := &ControlKeys{Node: id.Node, Enrolment: id.Enrolment, Key: id.ControlKey}
	if id.Keys != nil {
		c := *id.Keys
		c.Taken = slices.Clone(c.Taken)
		ck = &c
	}
	for i, env := range chain {
		r, err := wire.OpenRotation(ck.Key, ck.Recovery, env)
		if errors.Is(err, wire.ErrWrongKey) {
			continue // another link of the chain: one taken, or not reached yet
		}
		if err != nil {
			return taken, fmt.Errorf("rotation %d of %d: %w", i+1, len(chain), err)
		}
		if r.Node != id.Node || r.Enrolment != id.Enrolment {
			return taken, fmt.Errorf("rotation %d of %d: addressed to node %q enrolment %q; this is node %q enrolment %q", i+1, len(chain), r.Node, r.Enrolment, id.Node, id.Enrolment)
		}
		next, _ := r.NewKey()
		recovery, _ := r.RecoveryKey()
		switch r.By {
		case wire.ByKey:
			if r.Seq <= ck.Seq {
				return taken, fmt.Errorf("rotation %d of %d: sequence %d, not newer than the last taken (%d)", i+1, len(chain), r.Seq, ck.Seq)
			}
			if recovery != nil && ck.Recovery != nil && !bytes.Equal(recovery, ck.Recovery) {
				return taken, fmt.Errorf("rotation %d of %d: signed by the control key, it names another recovery key (%s, held %s); only the recovery key names another", i+1, len(chain), wire.KeyID(recovery), wire.KeyID(ck.Recovery))
			}
		case wire.ByRecovery:
			if r.Seq <= ck.RecoverySeq {
				return taken, fmt.Errorf("rotation %d of %d: a recovery of sequence %d, not newer than the last recovery taken (%d)", i+1, len(chain), r.Seq, ck.RecoverySeq)
			}
			// A recovery starts the count again from its own: the
			// stolen key may have signed rotations numbered past it.
			ck.RecoverySeq = r.Seq
		}
		from := wire.KeyID(ck.Key)
		ck.Key, ck.Seq = next, r.Seq
		if recovery != nil {
			ck.Recovery = recovery
		}
		ck.Taken = append(ck.Taken, Rotated{Seq: r.Seq, By: r.By, From: from, To: wire.KeyID(next), At: now.UTC()})
		if err := SaveControlKeys(dir, ck); err != nil {
			return taken, fmt.Errorf("rotation %d of %d: %w: %w", i+1, len(chain), ErrNotKept, err)
		}
		id.Keys, id.ControlKey = ck, ck.Key
		taken = append(taken, r)
	}
	return taken, nil
}
