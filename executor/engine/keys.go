package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/edit"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Keys set the values of keys in a configuration file the mesh does not
// own (executor/edit: comments and other lines untouched; a key found
// twice refused by name). What each key held when the mesh first set it —
// its value, or its absence — is recorded once, like a unit's found state,
// and given back when the key is undeclared (dropped from "set", or the
// whole resource): its found value put back, or its line taken out if the
// mesh added it — but only while the key still holds what the mesh set;
// a value a person changed since is theirs, and is left. The file is
// rewritten like a region's: atomically, owner, mode and label kept.
//
// The record (keysRecord) is kept as a kept original, named by its
// digest in the entry (Original{Kind: "keys"}), written before the file
// changes: a kill between leaves a record that says at worst what the
// mesh was about to set, and the found values, which is what a give back
// needs.

func init() {
	registerAlone(shapes.TypeKeys, (*run).keys, (*run).removeKeys)
}

// keysRecord is what the host keeps of a keys resource, by key as the
// format compares it.
type keysRecord struct {
	// Format is the file's, as declared ("equals", "space").
	Format string `json:"format"`
	// Names is each key as declared.
	Names map[string]string `json:"names"`
	// Found is each key's value when the mesh first set it; null: absent.
	Found map[string]*string `json:"found"`
	// Set is what the mesh set.
	Set map[string]string `json:"set"`
	// Under is the version (sha256) of the archive that wrote the file
	// when Found was taken, "" for none: a later version writes the file
	// anew, and what it holds then is what is found (archiveAt). Absent
	// (nil) in a record of a release before it, which is taken as of the
	// archive there now.
	Under *string `json:"under,omitempty"`
}

// archiveAt is the version of the archive the store records as holding
// the file at p, "" for none.
func (r *run) archiveAt(p string) string {
	for _, e := range r.st.Entries() {
		if e.Type == shapes.TypeArchive && slices.Contains(e.Paths, p) {
			return e.Digest
		}
	}
	return ""
}

func fold(f edit.Format, key string) string {
	if f == edit.Space {
		return strings.ToLower(key)
	}
	return key
}

// keysOriginal reads the record an entry names; a missing one is empty.
func (r *run) keysOriginal(e *store.Entry) (keysRecord, error) {
	rec := keysRecord{Names: map[string]string{}, Found: map[string]*string{}, Set: map[string]string{}}
	if e == nil || e.Original == nil || e.Original.Kind != "keys" || e.Original.Digest == "" {
		return rec, nil
	}
	data, err := r.st.Original(e.Original.Digest)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("the record of %s does not parse: %w", e.Target, err)
	}
	return rec, nil
}

// keyAt is a key of a file, as the file's format compares it (fold).
type keyAt struct{ path, key string }

// keysHere is what a run knows of the keys of the files it edits, read
// once, at its first keys step, before any record of this run changes it.
//
// A key is the file's, not the resource's: when it moves to another
// resource — the resource renamed, moved to another module, or the key
// dropped from one resource's set and put in another's — it keeps the
// value it was first found holding, as a unit keeps its found state
// (ADR 0118), and it is handed over, never given back in between. Given
// back in between, the apply would put the found value back (an sshd
// setting the mesh turned off turned on again) behind a line that says
// the declaration holds, and the new resource would record the mesh's
// own value as found, so that undeclared it could never give back the
// person's.
type keysHere struct {
	// found is each key's found value (nil: absent), from the record of
	// whichever resource set it last.
	found map[keyAt]*string
	// setBy is the resource of this declaration ("module.id") that sets
	// the key and is not held: the one it is handed over to.
	setBy map[keyAt]string
	// above is, for each key a source above this one sets (a rescue
	// file's keys over the link's), its claims: the key is that source's
	// until it no longer sets it, as a whole target is (yields), however
	// its resources are named. Set by both, each apply and reconcile would
	// put back the other's — a rescue's PasswordAuthentication yes turned
	// back to no at the link's next drift look.
	above map[keyAt]string
	// givenBack is, for each key a removal of this run gives back, the
	// resource that does ("module.id"): a key two records hold (an apply
	// that stopped before it removed the name a key was handed over from)
	// is given back once, and the second says so rather than claim the
	// same change.
	givenBack map[keyAt]string
	// otherSource is, for each key a resource of another source sets (not
	// held), its claims: this source undeclaring the key releases it to
	// that one, as a thing two sources declare is released by one and
	// kept for the other. Given back, the person's value would hold until
	// the other's next apply set its own again.
	otherSource map[keyAt]string
}

// keysHere reads, the first time a run needs it, what every keys record
// says and which resource of the declaration sets each key.
func (r *run) keysHere() *keysHere {
	if r.keysAt != nil {
		return r.keysAt
	}
	k := &keysHere{found: map[keyAt]*string{}, setBy: map[keyAt]string{}, above: map[keyAt]string{}, givenBack: map[keyAt]string{}, otherSource: map[keyAt]string{}}
	for _, e := range r.st.Entries() {
		_, path, _, ok := shapes.EditTarget(e.Target)
		if e.Type != shapes.TypeKeys || !ok {
			continue
		}
		if e.Original == nil && e.Pending != nil && e.Pending.Original != nil {
			// Cut before its record (a kill after the file's write): the
			// found values are the intent's, as settling it takes them.
			c := *e
			c.Original = e.Pending.Original
			e = &c
		}
		// A record that cannot be read is its own step's failure; here it
		// only has no key to hand over.
		rec, err := r.keysOriginal(e)
		if err != nil {
			continue
		}
		var higher, other []store.Claim
		for _, c := range e.Claims {
			if precedence[c.Source] > precedence[r.opt.Source] {
				higher = append(higher, c)
			}
			if c.Source != r.opt.Source {
				other = append(other, c)
			}
		}
		for fk := range rec.Set {
			if len(other) > 0 && !e.Held {
				k.otherSource[keyAt{path, fk}] = joinClaims(other)
			}
			if _, dup := k.found[keyAt{path, fk}]; !dup {
				k.found[keyAt{path, fk}] = rec.Found[fk]
			}
			if len(higher) > 0 {
				k.above[keyAt{path, fk}] = joinClaims(higher)
			}
		}
	}
	for _, res := range r.d.Resources {
		x, ok := res.(*shapes.Keys)
		if !ok || r.holds(x.Module, r.st.Get(targetOf(r.claimOf(x), x))) {
			continue
		}
		format, _ := edit.ParseFormat(x.Format)
		for name := range x.Set {
			k.setBy[keyAt{x.Path, fold(format, name)}] = x.Key()
		}
	}
	r.keysAt = k
	return k
}

// handedOver says, for a key a resource no longer sets, whether another
// resource of this declaration sets it now, and the line's words.
func (r *run) handedOver(path, self string, rec keysRecord, fk string) (string, bool) {
	by := r.keysHere().setBy[keyAt{path, fk}]
	if by == "" || by == self {
		return "", false
	}
	return fmt.Sprintf("%s handed over to %s", rec.Names[fk], by), true
}

// giveBack is the change that gives key back, and what the line says of
// it; no change when there is nothing to give back.
func giveBack(kf *edit.Keys, rec keysRecord, fk string) (*edit.Change, string, error) {
	name := rec.Names[fk]
	cur, present, err := kf.Get(name)
	found := rec.Found[fk]
	switch {
	case err != nil:
		return nil, "", err
	case !present:
		return nil, name + " is gone already", nil
	case cur != rec.Set[fk]:
		return nil, fmt.Sprintf("%s holds %q, not what the mesh set: left as it is", name, cur), nil
	case found == nil:
		return &edit.Change{Key: name, Remove: true}, name + " taken out (the mesh added it)", nil
	case *found == cur:
		return nil, fmt.Sprintf("%s holds %q, as found", name, cur), nil
	}
	return &edit.Change{Key: name, Value: *found}, fmt.Sprintf("%s given back %q", name, *found), nil
}

func (r *run) keys(st *step, rest int) {
	k := st.res.(*shapes.Keys)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	format, _ := edit.ParseFormat(k.Format)
	data, info, label, err := r.editedFile(k.Path, "keys")
	if errors.Is(err, errFileComing) {
		r.fileComing(st, k.Path, "its keys set as declared", r.holds(k.Module, e), k.Module)
		return
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if r.holds(k.Module, e) {
		// A found file on an adopted node: held like a found file is, its
		// keys not set until the module is taken.
		kf, as := edit.ParseKeys(data, format), true
		for name, want := range k.Set {
			v, present, err := kf.Get(name)
			as = as && err == nil && present && v == want
		}
		r.holdEdited(st, e, k.Key(), as, fmt.Sprintf("%s found on an adopted node; held as found, no key set, until module %s is taken", k.Path, k.Module), rest)
		return
	}
	old, err := r.keysOriginal(e)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	kf := edit.ParseKeys(data, format)
	under := r.archiveAt(k.Path)
	// A new version of the archive that brings the file wrote it anew:
	// in this run (archiveWrote, a plan's too), or in one that stopped
	// before these keys were set again (the version recorded differs).
	rewrote := r.archiveWrote[k.Path] || old.Under != nil && *old.Under != under
	rec := keysRecord{Format: k.Format, Names: map[string]string{}, Found: map[string]*string{}, Set: map[string]string{}, Under: &under}
	var changes []edit.Change
	var set, back, above []string
	for _, name := range slices.Sorted(maps.Keys(k.Set)) {
		want := k.Set[name]
		cur, present, err := kf.Get(name)
		if err != nil {
			r.fail(st, fmt.Errorf("%s: %w", k.Path, err), rest)
			return
		}
		fk := fold(format, name)
		if by := r.keysHere().above[keyAt{k.Path, fk}]; by != "" {
			// A source above this one sets it: left as it has it. What
			// this resource set before stays in its record, with what it
			// found, for when that source no longer sets it.
			if prev, had := old.Set[fk]; had {
				rec.Names[fk], rec.Found[fk], rec.Set[fk] = old.Names[fk], old.Found[fk], prev
			}
			above = append(above, fmt.Sprintf("%s declared also by %s, which takes precedence: left as that source has it", name, by))
			continue
		}
		found, known := old.Found[fk]
		if !known {
			found, known = r.keysHere().found[keyAt{k.Path, fk}]
		}
		if !known || rewrote {
			// The first time the mesh sets this key, or the file as a
			// new version of the archive that brings it wrote it just
			// now: what it holds is what is found, to give back.
			found = nil
			if present {
				v := cur
				found = &v
			}
		}
		rec.Names[fk], rec.Found[fk], rec.Set[fk] = name, found, want
		if !present || cur != want {
			changes = append(changes, edit.Change{Key: name, Value: want})
			set = append(set, name)
		}
	}
	for _, fk := range slices.Sorted(maps.Keys(old.Set)) {
		if _, still := rec.Set[fk]; still {
			continue
		}
		if said, ok := r.handedOver(k.Path, k.Key(), old, fk); ok {
			back = append(back, said)
			continue
		}
		if by := r.keysHere().otherSource[keyAt{k.Path, fk}]; by != "" {
			back = append(back, old.Names[fk]+" released: still set by "+by)
			continue
		}
		c, said, err := giveBack(kf, old, fk)
		if err != nil {
			r.fail(st, fmt.Errorf("%s: %w", k.Path, err), rest)
			return
		}
		if c != nil {
			changes = append(changes, *c)
		}
		back = append(back, said)
	}
	blob, _ := json.Marshal(rec)
	orig := &store.Original{Kind: "keys", Digest: digest(blob)}
	var declared strings.Builder
	for _, name := range slices.Sorted(maps.Keys(k.Set)) {
		fmt.Fprintf(&declared, "%s\x00%s\n", name, k.Set[name])
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeKeys, Claims: withClaim(e, st.claim), Digest: digest([]byte(k.Format + "\n" + declared.String())), Original: orig}
	if e != nil {
		n.Order = e.Order
	}
	stale := e == nil || e.Original == nil || e.Original.Digest != orig.Digest
	back = append(back, above...)
	if len(changes) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("%s in %s as declared", countWord(len(k.Set)-len(above), "key", "keys"), k.Path)
		if len(above) == len(k.Set) {
			st.line.Outcome, st.line.Detail = shapes.Held, "every key of it in "+k.Path+" is held by a source above this one"
		}
		if len(back) > 0 {
			st.line.Detail += "; " + strings.Join(back, "; ")
		}
		if stale && !r.opt.Plan {
			if err := r.st.KeepOriginal(orig.Digest, blob); err != nil {
				r.fail(st, err, rest)
				return
			}
			r.forgetOld(e, orig)
		}
		r.asDeclared(st, e, n, stale, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	var parts []string
	if len(set) > 0 {
		parts = append(parts, "set "+strings.Join(set, ", "))
	}
	parts = append(parts, back...)
	st.line.Detail = fmt.Sprintf("%s in %s; other lines untouched", strings.Join(parts, "; "), k.Path)
	out, err := kf.Apply(changes)
	if err == nil {
		err = edit.Check(out, format, changes)
	}
	if err != nil {
		r.fail(st, fmt.Errorf("%s: %w; nothing written", k.Path, err), rest)
		return
	}
	if r.opt.Plan {
		st.line.Detail = "would be: " + st.line.Detail
		if r.opt.OnDiff != nil {
			r.opt.OnDiff(k.Module, k.ID, r.editedDiff(k.Path, data, out))
		}
		r.emit(st.line)
		return
	}
	// The record first, then the intent that names it, then the file.
	if err := r.st.KeepOriginal(orig.Digest, blob); err != nil {
		r.fail(st, err, rest)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeKeys, Original: orig}, rest) {
		return
	}
	if err := rewrite(k.Path, out, info, label); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := readBackKeys(k.Path, format, changes); err != nil {
		r.fail(st, fmt.Errorf("read back %s: %w", k.Path, err), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.forgetOld(e, orig)
	r.emit(st.line)
}

// forgetOld lets the record e named go, once another replaces it.
func (r *run) forgetOld(e *store.Entry, now *store.Original) {
	if e != nil && e.Original != nil && e.Original.Kind == "keys" && e.Original.Digest != "" && e.Original.Digest != now.Digest {
		r.forget = append(r.forget, e.Original.Digest)
	}
}

// readBackKeys reads the file again and checks every change took.
func readBackKeys(path string, f edit.Format, changes []edit.Change) error {
	data, _, err := fsx.ReadRegular(path, maxEdited)
	if err != nil {
		return err
	}
	return edit.Check(data, f, changes)
}

// removeKeys gives back every key of an undeclared keys resource.
func (r *run) removeKeys(st *step) {
	e := st.entry
	path, _, data, ok := r.editedForRemoval(st)
	if !ok {
		return
	}
	rec, err := r.keysOriginal(e)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	if len(rec.Set) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "no record of what the mesh set in "+path+"; nothing given back"
		return
	}
	format, ok := edit.ParseFormat(rec.Format)
	if !ok {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("the record of %s names no format (%q); nothing given back", e.Target, rec.Format), false
		return
	}
	kf := edit.ParseKeys(data, format)
	var changes []edit.Change
	var said, gives []string
	givenBack := r.keysHere().givenBack
	for _, fk := range slices.Sorted(maps.Keys(rec.Set)) {
		if s, ok := r.handedOver(path, "", rec, fk); ok {
			said = append(said, s)
			continue
		}
		if by := givenBack[keyAt{path, fk}]; by != "" {
			said = append(said, rec.Names[fk]+" given back by "+by+" already")
			continue
		}
		if by := r.keysHere().otherSource[keyAt{path, fk}]; by != "" {
			said = append(said, rec.Names[fk]+" released: still set by "+by)
			continue
		}
		c, s, err := giveBack(kf, rec, fk)
		if err != nil {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s: %v", path, err), false
			return
		}
		if c != nil {
			changes = append(changes, *c)
			gives = append(gives, fk)
		}
		said = append(said, s)
	}
	if len(changes) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "nothing to give back in "+path+": "+strings.Join(said, "; ")
		return
	}
	giveBackIn := func(data []byte) ([]byte, error) {
		out, err := edit.ParseKeys(data, format).Apply(changes)
		if err == nil {
			err = edit.Check(out, format, changes)
		}
		return out, err
	}
	if _, err := giveBackIn(data); err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, fmt.Sprintf("%s: %v; nothing written", path, err), false
		return
	}
	c := firstClaim(e)
	for _, fk := range gives {
		givenBack[keyAt{path, fk}] = c.Module + "." + c.ID
	}
	st.line.Outcome, st.line.Detail = shapes.Restored, strings.Join(said, "; ")+" in "+path
	if r.opt.Plan {
		st.line.Detail = "would be: " + st.line.Detail
	}
	st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e)}
	st.rewrites = giveBackIn
	st.change = func() error { return rewriteNow(path, st.rewrites) }
	st.readback = func() (*store.Entry, error) { return nil, readBackKeys(path, format, changes) }
}
