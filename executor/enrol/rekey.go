package enrol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// RekeyFile is a rekey root asked for (mesh-executor rekey), until the
// control side's answer begins the enrolment that renews the node's keys
// (the steps: wire.RekeyRequest). It holds no key: only what the request
// names, and its nonce.
const RekeyFile = "rekey-pending.json"

// rekeyPending is RekeyFile.
type rekeyPending struct {
	Node      string    `json:"node"`
	Enrolment string    `json:"enrolment"`
	Nonce     string    `json:"nonce"`
	Begun     time.Time `json:"begun"`
	formatField
}

// RekeyView is a pending rekey as `mesh-executor status` and `rekey` show
// it.
type RekeyView struct {
	Node      string    `json:"node"`
	Enrolment string    `json:"enrolment"`
	Begun     time.Time `json:"begun"`
}

// BeginRekey asks for the node's keys to be renewed (root: mesh-executor
// rekey). Refused (a Refusal, nothing written) on a host that holds no
// identity, or whose identity key cannot sign, or with an enrolment
// pending. A rekey already pending for this enrolment is kept as it is:
// the control side may be answering it.
func BeginRekey(dir string) (*RekeyView, error) {
	// Refused before anything is made, then checked again under the lock.
	if _, _, err := rekeyIdentity(dir); err != nil {
		return nil, err
	}
	unlock, err := lock(dir, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id, _, err := rekeyIdentity(dir)
	if err != nil {
		return nil, err
	}
	if p, tok, err := loadPending(dir); err != nil || p != nil {
		if err != nil {
			return nil, err
		}
		return nil, Refusal(fmt.Sprintf("an enrolment is pending (token %s): it renews the keys already; let it finish, or end it (mesh-executor enrol --cancel) and rekey", tok.IDString()))
	}
	var r rekeyPending
	if ok, err := readJSON(dir, RekeyFile, &r); err != nil {
		return nil, err
	} else if ok && r.Node == id.Node && r.Enrolment == id.Enrolment {
		return &RekeyView{Node: r.Node, Enrolment: r.Enrolment, Begun: r.Begun}, nil
	}
	var nonce [wire.RekeyNonceSize]byte
	rand.Read(nonce[:])
	r = rekeyPending{Node: id.Node, Enrolment: id.Enrolment, Nonce: hex.EncodeToString(nonce[:]), Begun: clock.Now().UTC()}
	if err := writeJSON(dir, RekeyFile, &r); err != nil {
		return nil, err
	}
	return &RekeyView{Node: r.Node, Enrolment: r.Enrolment, Begun: r.Begun}, nil
}

// rekeyIdentity is the identity a rekey renews and its keys, or why this
// host cannot ask for one.
func rekeyIdentity(dir string) (*identity.Identity, *Keys, error) {
	id, err := identity.Load(dir)
	if err != nil {
		return nil, nil, Refusal(fmt.Sprintf("the identity this host holds does not read (%v): nothing can prove which node it is; enrol it with a token for the node (mesh-control token issue --node NAME)", err))
	}
	if id == nil {
		return nil, nil, Refusal("this host holds no identity (it is hosted): there are no keys to renew; enrol it")
	}
	k, why := identityKey(dir, id)
	if why != "" {
		return nil, nil, Refusal(fmt.Sprintf("this host is enrolled as %s, but the identity key of that enrolment (%s) cannot be used (%s): nothing can prove to the control side that this host is %s. Issue a token for it (mesh-control token issue --node %s) and enrol with it",
			(&wire.HeldIdentity{Node: id.Node, Enrolment: id.Enrolment}).Name(), filepath.Join(dir, KeysFile), why, id.Node, id.Node))
	}
	return id, k, nil
}

// CancelRekey ends a pending rekey on root's word; false when none was.
func CancelRekey(dir string) (bool, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return false, err
	}
	defer unlock()
	err = os.Remove(filepath.Join(dir, RekeyFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("enrol: %w", err)
	}
	return true, nil
}

// ReadRekey reads the pending rekey without changing anything; nil when
// none is, or when it was asked for an enrolment the host no longer holds.
func ReadRekey(dir string) (*RekeyView, error) {
	r, id, err := readRekey(dir)
	if err != nil || r == nil || id == nil || r.Node != id.Node || r.Enrolment != id.Enrolment {
		return nil, err
	}
	return &RekeyView{Node: r.Node, Enrolment: r.Enrolment, Begun: r.Begun}, nil
}

// RekeyState reads the pending rekey and how the last enrolment ended
// together, under the enrolment's lock: a rekey's answer ends the one and
// begins an enrolment that writes the other, and read apart, a look
// between the two saw the rekey gone and no enrolment begun — `rekey`
// said it had ended without one while it went on to finish.
func RekeyState(dir string) (*RekeyView, *Result, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	p, err := ReadRekey(dir)
	if err != nil {
		return nil, nil, err
	}
	r, err := ReadResult(dir)
	return p, r, err
}

func readRekey(dir string) (*rekeyPending, *identity.Identity, error) {
	var r rekeyPending
	ok, err := readJSON(dir, RekeyFile, &r)
	if !ok {
		return nil, nil, err
	}
	id, err := identity.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	return &r, id, nil
}

// RekeyRequest is the pending rekey's request, signed with the identity
// key, for the agent to carry to the control side; nil when none is
// pending (or it no longer answers the identity the host holds).
func RekeyRequest(dir string) (*wire.RekeyRequest, error) {
	r, id, err := readRekey(dir)
	if err != nil || r == nil || id == nil || r.Node != id.Node || r.Enrolment != id.Enrolment {
		return nil, err
	}
	// Without its key it asks nothing (BeginRekey refused such a host).
	k, _ := identityKey(dir, id)
	if k == nil {
		return nil, nil
	}
	return wire.SignRekey(k.Identity, r.Node, r.Enrolment, r.Nonce), nil
}

// TakeRekey takes the control side's answer to the pending rekey (what
// the agent handed over, trusted for nothing): signed by the control key
// in force, for this node, enrolment and nonce, its token sealed to this
// enrolment's sealing key and pinning the control key in force. Then it
// begins the enrolment with that token which replaces the identity the
// host holds, with new keys (the WireGuard key too), and the rekey is
// over. It returns the token's id. Nothing is written unless all of that
// holds.
func TakeRekey(dir string, envelope []byte) (string, error) {
	unlock, err := lock(dir, false)
	if err != nil {
		return "", err
	}
	defer unlock()
	r, id, err := readRekey(dir)
	if err != nil {
		return "", err
	}
	if r == nil || id == nil || r.Node != id.Node || r.Enrolment != id.Enrolment {
		return "", errors.New("no rekey is pending on this host (mesh-executor rekey asks for one); the answer is not taken")
	}
	payload, err := wire.Open(id.ControlKey, wire.PurposeRekey, envelope)
	if err != nil {
		return "", fmt.Errorf("the rekey answer does not verify under the control key in force (%s): %w", wire.KeyID(id.ControlKey), err)
	}
	return takeRekeyLocked(dir, r, id, payload)
}

// takeRekeyLocked is TakeRekey once the answer verified: the control
// side's word, which is still checked to answer this very rekey.
func takeRekeyLocked(dir string, r *rekeyPending, id *identity.Identity, payload []byte) (string, error) {
	a, err := wire.ParseRekeyAnswer(payload)
	if err != nil {
		return "", err
	}
	if a.Node != r.Node || a.Enrolment != r.Enrolment || a.Nonce != r.Nonce {
		return "", fmt.Errorf("the rekey answer is for %s, nonce %s; the rekey pending is %s's, nonce %s",
			(&wire.HeldIdentity{Node: a.Node, Enrolment: a.Enrolment}).Name(), a.Nonce, (&wire.HeldIdentity{Node: r.Node, Enrolment: r.Enrolment}).Name(), r.Nonce)
	}
	_, k, err := rekeyIdentity(dir)
	if err != nil {
		return "", err
	}
	text, err := wire.OpenRekeyToken(k.Sealing, a.Node, a.Nonce, a.Token)
	if err != nil {
		return "", fmt.Errorf("the rekey answer's token: %w", err)
	}
	tok, err := wire.ParseToken(text)
	if err != nil {
		return "", fmt.Errorf("the rekey answer's token: %w", err)
	}
	if !bytes.Equal(tok.ControlKey, id.ControlKey) {
		return "", fmt.Errorf("the rekey answer's token pins control key %s, not the one in force (%s)", wire.KeyID(ed25519.PublicKey(tok.ControlKey)), wire.KeyID(id.ControlKey))
	}
	if err := beginLocked(dir, tok, Options{Replace: true, NewWireGuard: true}); err != nil {
		return "", err
	}
	return tok.IDString(), nil
}
