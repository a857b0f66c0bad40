package control

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Sealing a file's content for one node (Client.Seals): the plaintext is
// encrypted to the sealing key the node's executor made at enrolment
// (NodeRecord.Keys.Sealing), bound to the node, the declaration's sequence
// and the file's module.id (wire.SealContent), and carried in the file's
// `sealed` field. The agent and the broker carry it and cannot read it;
// the executor opens it only to write the file.
//
// Everything that can refuse is checked before a sequence is taken: the
// node has a sealing key and is not revoked, each named resource exists,
// is a file and says nothing else of its content, and the declaration with
// the sealed content in it is one every node would parse (its size
// included: the placeholder has the sealed content's exact length). The
// content is sealed only once the sequence is taken, because the sequence
// is bound into it.

// sealPlan is the seals of one Declare.
type sealPlan struct {
	resources []map[string]json.RawMessage
	at        map[string]int // "module.id" → its index in resources
	plain     map[string][]byte
}

// planSeals checks seals (module.id → plaintext) against decl's resources
// and rec, and returns the plan; nil when there is nothing to seal.
func planSeals(rec *NodeRecord, decl map[string]json.RawMessage, seals map[string][]byte) (*sealPlan, error) {
	if len(seals) == 0 {
		return nil, nil
	}
	if _, err := sealingKey(rec); err != nil {
		return nil, err
	}
	p := &sealPlan{at: map[string]int{}, plain: seals}
	if err := json.Unmarshal(decl["resources"], &p.resources); err != nil {
		return nil, fmt.Errorf("declaration: resources: %w", err)
	}
	for i, r := range p.resources {
		var module, id string
		json.Unmarshal(r["module"], &module)
		json.Unmarshal(r["id"], &id)
		key := module + "." + id
		if _, ok := seals[key]; !ok {
			continue
		}
		if _, dup := p.at[key]; dup {
			return nil, fmt.Errorf("seal %s: the declaration has two resources named %s", key, key)
		}
		var typ string
		json.Unmarshal(r["type"], &typ)
		if typ != shapes.TypeFile {
			return nil, fmt.Errorf("seal %s: it is a %q, not a file; only a file's content is sealed", key, typ)
		}
		for _, f := range []string{"content", "bytes"} {
			if _, ok := r[f]; ok {
				return nil, fmt.Errorf("seal %s: the file says its content in %q too; a sealed file says it only in sealed (leave content and bytes out)", key, f)
			}
		}
		p.at[key] = i
	}
	var missing []string
	for key := range seals {
		if _, ok := p.at[key]; !ok {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("seal %s: the declaration has no resource of that name", strings.Join(missing, ", "))
	}
	return p, nil
}

// placeholders fills each sealed field with zeros of the length the sealed
// content will have, so what is checked before a sequence is taken is the
// size of what is signed after.
func (p *sealPlan) placeholders(decl map[string]json.RawMessage) error {
	return p.fill(decl, func(key string, plain []byte) (string, error) {
		return base64.StdEncoding.EncodeToString(make([]byte, len(plain)+wire.SealedOverhead)), nil
	})
}

// seal seals each named file's content for rec's node and seq, into decl.
// rec is the record the sequence was taken from, so a node enrolled again
// meanwhile gets its new key.
func (p *sealPlan) seal(decl map[string]json.RawMessage, rec *NodeRecord, seq uint64) error {
	pub, err := sealingKey(rec)
	if err != nil {
		return err
	}
	return p.fill(decl, func(key string, plain []byte) (string, error) {
		module, id, _ := strings.Cut(key, ".")
		return wire.SealContent(pub, rec.Name, seq, module, id, plain)
	})
}

func (p *sealPlan) fill(decl map[string]json.RawMessage, sealed func(key string, plain []byte) (string, error)) error {
	for key, i := range p.at {
		s, err := sealed(key, p.plain[key])
		if err != nil {
			return err
		}
		p.resources[i]["sealed"], _ = json.Marshal(s)
	}
	b, err := json.Marshal(p.resources)
	if err != nil {
		return err
	}
	decl["resources"] = b
	return nil
}

// sealingKey is the node's sealing public key, or why content cannot be
// sealed for it.
func sealingKey(rec *NodeRecord) ([]byte, error) {
	switch {
	case !rec.Revoked.IsZero():
		return nil, fmt.Errorf("node %s is revoked: its sealing key may be in other hands (a lost machine), so nothing is sealed to it; enrol it again (mesh-control token issue --node %s)", rec.Name, rec.Name)
	case rec.Keys == nil || rec.Keys.Sealing == "":
		return nil, fmt.Errorf("node %s has no sealing key (registered by hand with node add, not enrolled with a token): it cannot receive sealed content; enrol it (mesh-control token issue --node %s)", rec.Name, rec.Name)
	}
	pub, err := base64.StdEncoding.DecodeString(rec.Keys.Sealing)
	if err == nil {
		_, err = wire.SealedKEM().NewPublicKey(pub)
	}
	if err != nil {
		return nil, fmt.Errorf("node %s: its recorded sealing key is not an ML-KEM-768+X25519 public key: %v", rec.Name, err)
	}
	return pub, nil
}

// ReadSeals reads the content each `--seal MODULE.ID=PATH` names, for
// Client.Seals. A PATH must be a regular file; each MODULE.ID is named once.
func ReadSeals(specs []string) (map[string][]byte, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := map[string][]byte{}
	for _, s := range specs {
		key, path, ok := strings.Cut(s, "=")
		module, id, dotted := strings.Cut(key, ".")
		if !ok || !dotted || module == "" || id == "" || path == "" {
			return nil, usageError("--seal %q: write it MODULE.ID=PATH", s)
		}
		if _, dup := out[key]; dup {
			return nil, usageError("--seal %s is given twice", key)
		}
		data, err := readSealFile(path)
		if err != nil {
			return nil, fmt.Errorf("--seal %s: %w", key, err)
		}
		out[key] = data
	}
	return out, nil
}

func readSealFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, shapes.MaxDeclarationSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > shapes.MaxDeclarationSize {
		return nil, fmt.Errorf("%s is over %d bytes, more than a declaration may hold", path, shapes.MaxDeclarationSize)
	}
	return data, nil
}
