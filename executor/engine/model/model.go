// Package model is ADR 0118 (what undeclaring gives back) and adoption's
// hold (ADR 0100), for services, packages, regions, keys, files,
// directories and an archive across modules,
// written as a small pure function to be read beside the ADR: a machine's
// found state, the declarations one source sends over time and the
// operator's changes in between go in; what each apply must ask of the
// init and the package manager, each resource's report line, and the
// machine after, come out.
//
// It is kept apart from the engine on purpose: it shares no code with it,
// and is written from the design (ADR 0118, what undeclaring gives back;
// ADR 0100, a node in use is adopted before it is converged;
// docs/declaration.md), so that a test can hold the engine to it
// (executor/engine's TestTheEngineFollowsTheModel) and a disagreement is
// a question for the ADR, not a difference of implementation. It knows
// nothing of paths, transcripts of real inits or the store's format, and
// touches nothing; a region's file is its blocks by name (file.go gives
// the tests its text, as a person writes and reads it).
//
// The rules, each with where it is written:
//
//   - A service never installs a unit; one whose unit the init does not
//     know refuses the declaration whole, unless a package declared before
//     it may bring it; if none did, its line fails and the apply stops
//     (docs/declaration.md, the engine).
//   - The state a unit is first found in is recorded once, the first time
//     the host applies the service: running or not, and its enablement
//     the first time a declaration sets it. A unit whose package the host
//     installed (its package's record says it was not found installed) is
//     found absent (ADR 0118, Decision).
//   - On an adopted node, what is found for a module not taken is held:
//     nothing changed, the line held, or held-changed when something else
//     changed it since it was first held; undeclared, forgotten (ADR 0100).
//     A package not found is installed all the same: finding nothing is
//     not finding something.
//   - A package is installed when absent, never upgraded without a version,
//     and forgotten, never uninstalled, when undeclared.
//   - Undeclared, a unit gets back the state it was found in, only what
//     the host changed: one the host started is stopped again, one it
//     enabled disabled again, nothing is started or enabled on the way out
//     (ADR 0118, Decision) — as the last declaration that set a state or
//     an enablement said: one that set none after it does not make the
//     host's change anyone else's, and one that kept the unit disabled
//     (or stopped) leaves it to whoever enabled (or started) it since.
//   - A unit found absent is stopped and disabled — the mesh gave, the mesh
//     takes back — only once nothing that brought it is declared: while any
//     declaration still names its package it is forgotten (the lockout ADR
//     0118 exists to prevent: unassigning sshd while base still installs
//     openssh-server). Declared with no state, it is never stopped, and
//     disabled only where enabled was declared (ADR 0118: a service with no
//     state says the mesh must not start it).
//   - A resource renamed (another id, another module) manages the same
//     unit: the found state is the unit's, and the old name is released.
//   - A region is a block of lines, named "module.id", in a file the host
//     does not own (ADR 0102). A block of its name already in the file the
//     first time the host applies it is found content, recorded once; the
//     block is then written as declared. Undeclared, found content is put
//     back as found (restored, even when the block is as found already);
//     a block the host added is taken out (removed); a block gone, or one
//     held, is forgotten. A region renamed is another block: the old one
//     goes, the new one comes. On an adopted node a region of a module not
//     taken is held: nothing written (docs/declaration.md, region).
//   - A block edited by hand while declared is drift: written back
//     (repaired) at the next apply of the same declaration.
//   - Keys set values in a file the host does not own (KeysFile), a key
//     to one resource of a declaration. What a key held the first time the
//     host sets it — its value, or its absence — is found, recorded once;
//     the key is then written as declared (a hand edit of it is repaired).
//     The found value is the key's, not the resource's: a key whose
//     resource is renamed or moved to another module, or that goes from
//     one resource's set to another's in one declaration, is handed over —
//     its found value kept, nothing given back in between. A key no longer
//     set by any resource is given back: taken out if it was found absent,
//     its found value put back otherwise — only while it holds what the
//     host set (a person's value since is theirs, left), and nothing when
//     it holds its found value already. A key two records hold (an apply
//     stopped before it removed the name the key was handed over from) is
//     given back once, by the newest: undeclaring runs newest first. A
//     keys resource whose keys all
//     changed nothing is unchanged; one undeclared that gave nothing back
//     is forgotten, restored otherwise. On an adopted node a keys resource
//     of a module not taken is held: nothing set, nothing recorded, and
//     nothing handed over to it (docs/declaration.md, keys).
//   - The keys file, or the shared file, may be declared whole (a file
//     resource) instead: its
//     content as found is recorded once, at the first apply, held or not;
//     it is then written as declared (a hand edit repaired); undeclared,
//     the found content is put back (restored) — on an adopted node, a
//     module not taken, held (held-changed once it differs from what was
//     found), and forgotten when undeclared. A file changing shape — whole
//     in one declaration, keys in the next, or the other way — is undone
//     in its old shape before anything of the declaration is applied, so
//     the new one starts from the file as the person had it
//     (docs/declaration.md, region and keys). Undeclared together — the
//     old shape's removal waited while a source above held the file in
//     the other — regions, keys and the file whole are undone newest
//     first, by when each was first recorded.
//   - Files, directories and an archive under a root of their own: tree.go
//     says their rules.
//   - Two sources: a rescue file's (the local source) above the link's
//     (docs/declaration.md; docs/operations.md, rescue). What a rescue file
//     declares is the rescue's until it no longer declares it: the link's
//     step for the same thing is held — its claim recorded, nothing changed
//     — and what the rescue set stays. Undeclaring by one source only
//     releases (forgotten) what the other still declares, and undoes what
//     no source declares; a unit found absent stays while either source
//     still declares its package. What was found is the thing's, recorded
//     by whichever source applied it first. A file in two shapes is one
//     thing: the keys file or the shared file a rescue declares whole holds
//     the link's keys and regions in it — held, changing nothing — and
//     their removals wait (held), to give back once the rescue lets the
//     file go, and so does the link's file declared whole under a rescue's
//     keys or region in it; a directory where the rescue has a file (or
//     the other way) is held too, but not claimed: not the same thing.
//     Keys are held key by key: a key the rescue's keys set is left as
//     the rescue has it by the link's, which sets its others (held when
//     it has none other) and keeps what it set of that key before; a key
//     one source stops setting while the other still sets it is released
//     — left as it is, not given back — until the other's next apply sets
//     its own (docs/declaration.md).
package model

import (
	"maps"
	"slices"
	"sort"
	"strings"
)

// World is a machine before the mesh: its units, and the packages its
// package manager can install, each bringing at most one unit, which its
// scripts start and enable as it is installed (as Debian's do).
type World struct {
	Units    map[string]Unit
	Packages map[string]Package
	// Blocks are the blocks of the shared file (SharedFile), by name:
	// those a person wrote before the mesh, in a world; the file's blocks
	// after the events, in the machine Run ends with.
	Blocks map[string]string
	// Keys are the keys of the keys file (KeysFile) and their values: those
	// a person wrote before the mesh, in a world; the file's after the
	// events, in the machine Run ends with.
	Keys map[string]string
	// Tree is the tree's paths (under TreeRoot, which is always a
	// directory): those a person made before the mesh, in a world; the
	// tree after the events, in the machine Run ends with.
	Tree map[string]Node
}

// KeysFile is the name of the one file keys resources set keys in (the
// sshd_config format: "Key value"; a test names it where its machine has
// it, as SharedFile).
const KeysFile = "sshd_config"

// SharedFile is the name of the one file regions write into: a test
// names it where its machine has it (Declaration.Renamed).
const SharedFile = "hosts"

// Unit is a unit's state on the machine.
type Unit struct{ Running, Enabled bool }

// Package is a package of the world: installed before the mesh or not, and
// the unit it brings ("" for none).
type Package struct {
	Installed bool
	Brings    string
}

// Resource is one declared resource: a package (Name is the package's), a
// service (Name is the unit; State "running", "stopped" or "" for none;
// Enabled nil where the declaration does not set it), a region (Name is
// the file, SharedFile; Content the block's lines, each ending in a
// newline) or keys (Name is the file, KeysFile; Set each key's value).
type Resource struct {
	// Kind "file" is the keys file (Name KeysFile: Set its keys) or the
	// shared file (Name SharedFile: Set its blocks) declared whole, Content
	// its text.
	//
	// In the tree (Name under TreeRoot): Kind "file" is a file, Content
	// its text; "directory" a directory; "archive" the archive unpacked
	// into the directory Name, Content its version (ArchiveEntries) and URL
	// its tar (ArchiveURL).
	Kind       string // "package", "service", "region", "keys", "file", "directory" or "archive"
	Module, ID string
	Name       string
	State      string
	Enabled    *bool
	Content    string
	Set        map[string]string
	URL        string
}

// Key is the resource's "module.id", as a report line names it.
func (r Resource) Key() string { return r.Module + "." + r.ID }

// Declaration is what one source declares at once, in stated order.
type Declaration struct {
	Adopted   bool
	Taken     map[string]bool
	Resources []Resource
	// Rescue: a rescue file's declaration (the local source, above the
	// link's), not the link's.
	Rescue bool
}

// Event is one thing that happens: an apply of a declaration, or the
// operator flipping a unit's running state or enablement by hand.
type Event struct {
	Apply *Declaration
	// The operator's change, when Apply is nil: a unit flipped, and a
	// block of the shared file rewritten by hand (EditedByHand), when the
	// file has it.
	Unit                     string
	FlipRunning, FlipEnabled bool
	Block                    string
	// Key: a key of the keys file the operator sets to KeyByHand, or takes
	// out (KeyOut).
	Key    string
	KeyOut bool
	// TreePath: a file of the tree the operator writes TreeText into (where
	// its parent is a directory and it is none), or takes out (TreeOut).
	TreePath string
	TreeText string
	TreeOut  bool
}

// EditedByHand is what the operator writes into a block; KeyByHand what
// the operator sets a key to.
const (
	EditedByHand = "edited by hand\n"
	KeyByHand    = "by-hand"
)

// Result is what an apply must do and say.
type Result struct {
	Refused bool
	// Lines: each line's outcome by "module.id" (a removal's line goes by
	// the name it was last declared under).
	Lines map[string]string
	// Init is what the init is asked, "verb unit", sorted; Installs the
	// packages installed, sorted.
	Init, Installs []string
	// Blocks: the shared file's blocks after the apply; Keys: the keys
	// file's keys.
	Blocks, Keys map[string]string
	// Tree: the tree after the apply.
	Tree map[string]Node
}

// Run is the model: the world, then the events, in order; one result per
// event (an operator's change has an empty one), and the machine at the end.
func Run(w World, events []Event) ([]Result, World) {
	h := newHost(w)
	var out []Result
	for _, e := range events {
		if e.Apply == nil {
			h.operator(e.Unit, e.FlipRunning, e.FlipEnabled)
			if _, ok := h.blocks[e.Block]; ok {
				h.blocks[e.Block] = EditedByHand
			}
			switch {
			case e.Key == "":
			case e.KeyOut:
				delete(h.keys, e.Key)
			default:
				h.keys[e.Key] = KeyByHand
			}
			h.treeOp(e)
			out = append(out, Result{})
			continue
		}
		r := h.apply(*e.Apply)
		r.Blocks, r.Keys, r.Tree = maps.Clone(h.blocks), maps.Clone(h.keys), maps.Clone(h.tree)
		out = append(out, r)
	}
	return out, h.machine()
}

// found is the state a unit was first found in (ADR 0118).
type found struct {
	absent       bool
	running      bool
	enabledKnown bool // recorded: a declaration set enabled
	enabled      bool
}

// unitRecord is what the host keeps of a unit it applied.
type unitRecord struct {
	claims []string // module.id, in the order they were first applied
	found  found
	held   bool
	// what the last declaration that applied it (not held) set; digest:
	// that declaration, for repaired (drift) against applied. was: the
	// last state a declaration set, kept through declarations that set
	// none — what the host did under it is its change still; wasEnabled
	// the same of its enablement ("true", "false", "" for none yet).
	state      string
	enabledSet bool
	digest     string
	was        string
	wasEnabled string
}

type pkgRecord struct {
	claims  []string
	created bool // the host installed it
	held    bool
}

// regionRecord is what the host keeps of a region it applied: what it
// found between the markers of its name (nil: nothing), whether it is
// held, and the content it last wrote, for repaired against applied.
type regionRecord struct {
	found   *string
	held    bool
	written string
	src     string // the source that applied it
	order   int    // when first recorded: undeclaring runs newest first
}

// keyRecord is what the host keeps of a key it set: what it found (nil:
// absent), the key's whichever source set it first.
type keyRecord struct {
	found *string
}

// wholeRecord is what the host keeps of a file declared whole: who claims
// it, what the file held at its first apply (keys, or blocks), whether it
// is held, and what it last wrote (nil: nothing yet).
type wholeRecord struct {
	claims         []string
	found, written map[string]string
	held           bool
	order          int // when first recorded: undeclaring runs newest first
}

// keysRecord is what the host keeps of a keys resource: held, or the set
// it last applied (set: as declared, for repaired against applied) and
// what of it the host set and holds (wrote: a key a source above sets is
// left to it, and keeps what this one set before, if anything), by the
// source that applied it.
//
// order is when it was first recorded: a key two records hold (an apply
// that stopped before it removed the name the key was handed over from)
// is given back once, by the newest, as undeclaring runs newest first.
type keysRecord struct {
	held       bool
	set, wrote map[string]string
	order      int
	src        string
}

type host struct {
	units     map[string]*Unit
	installed map[string]bool
	brings    map[string]string
	unitRec   map[string]*unitRecord
	pkgRec    map[string]*pkgRecord
	blocks    map[string]string
	regionRec map[string]*regionRecord
	keys      map[string]string
	keyRec    map[string]*keyRecord  // by key
	keysRec   map[string]*keysRecord // by the resource's "module.id"
	// setBy is, during an apply, the resource of the declaration that sets
	// each key and is not held.
	setBy map[string]string
	whole map[string]*wholeRecord // by file
	// The tree, and what the host keeps of its paths and its archive;
	// order counts the records as they are first made.
	tree    map[string]Node
	pathRec map[string]*pathRecord
	archRec map[string]*archiveRecord // by destination
	order   int
	// src is the source of the apply running: "" for the link's,
	// rescuePrefix for a rescue file's. A claim is the source and the
	// resource's "module.id".
	src string
}

// rescuePrefix begins a rescue file's claims.
const rescuePrefix = "rescue:"

// claim is r's claim in the apply running.
func (h *host) claim(r Resource) string { return h.src + r.Key() }

// ofThis says whether claim c is of the source of the apply running.
func (h *host) ofThis(c string) bool {
	return strings.HasPrefix(c, rescuePrefix) == (h.src == rescuePrefix)
}

// above says whether claims hold a claim of a source above the apply's:
// the rescue file's, when the link applies. Its step is then held: its
// claim recorded, nothing changed, until the rescue no longer declares it.
func (h *host) above(claims []string) bool {
	return h.src == "" && slices.ContainsFunc(claims, func(c string) bool { return strings.HasPrefix(c, rescuePrefix) })
}

// split parts claims into those of the apply's source that the
// declaration no longer declares (mine: undone, or released) and the rest
// (another source's, or declared still): the one rule of who lets a
// thing go, for every kind.
func (h *host) split(claims []string, declared func(claim string) bool) (mine, rest []string) {
	for _, c := range claims {
		if !h.ofThis(c) || declared(c) {
			rest = append(rest, c)
		} else {
			mine = append(mine, c)
		}
	}
	return mine, rest
}

// otherClaims says whether claims hold one of another source than the
// apply's: what is undone first (a file changing shape) is undone only
// where this source alone claims it.
func (h *host) otherClaims(claims []string) bool {
	return slices.ContainsFunc(claims, func(c string) bool { return !h.ofThis(c) })
}

// lineOf is the report line's name of a claim: its "module.id".
func lineOf(c string) string { return strings.TrimPrefix(c, rescuePrefix) }

// yield makes r's line held, its claim added to claims, when a source
// above the apply's holds them; a file where a directory is held, or the
// other way (same is false), is not claimed: not the same thing.
func (h *host) yield(r Resource, claims *[]string, same bool, res *Result) bool {
	if !h.above(*claims) {
		return false
	}
	res.Lines[r.Key()] = "held"
	if same {
		*claims = addClaim(*claims, h.claim(r))
	}
	return true
}

func newHost(w World) *host {
	h := &host{units: map[string]*Unit{}, installed: map[string]bool{}, brings: map[string]string{},
		unitRec: map[string]*unitRecord{}, pkgRec: map[string]*pkgRecord{},
		blocks: maps.Clone(w.Blocks), regionRec: map[string]*regionRecord{},
		keys: maps.Clone(w.Keys), keyRec: map[string]*keyRecord{}, keysRec: map[string]*keysRecord{}, whole: map[string]*wholeRecord{},
		tree: maps.Clone(w.Tree), pathRec: map[string]*pathRecord{}, archRec: map[string]*archiveRecord{}}
	if h.tree == nil {
		h.tree = map[string]Node{}
	}
	if h.blocks == nil {
		h.blocks = map[string]string{}
	}
	if h.keys == nil {
		h.keys = map[string]string{}
	}
	for n, u := range w.Units {
		u := u
		h.units[n] = &u
	}
	for n, p := range w.Packages {
		h.installed[n] = p.Installed
		h.brings[n] = p.Brings
	}
	return h
}

func (h *host) machine() World {
	w := World{Units: map[string]Unit{}, Packages: map[string]Package{}, Blocks: maps.Clone(h.blocks), Keys: maps.Clone(h.keys), Tree: maps.Clone(h.tree)}
	for n, u := range h.units {
		w.Units[n] = *u
	}
	for n := range h.brings {
		w.Packages[n] = Package{Installed: h.installed[n], Brings: h.brings[n]}
	}
	return w
}

func (h *host) operator(unit string, running, enabled bool) {
	u := h.units[unit]
	if u == nil {
		return
	}
	u.Running = u.Running != running
	u.Enabled = u.Enabled != enabled
}

// bringer is the package that brings unit ("" for a unit no package does).
func (h *host) bringer(unit string) string {
	for p, u := range h.brings {
		if u == unit {
			return p
		}
	}
	return ""
}

func (h *host) apply(d Declaration) Result {
	res := Result{Lines: map[string]string{}}
	h.src = ""
	if d.Rescue {
		h.src = rescuePrefix
	}
	// Refused whole, touching nothing: a service whose unit is unknown with
	// no package before it, or two services of one unit.
	pkgBefore := false
	seenUnit := map[string]bool{}
	for _, r := range d.Resources {
		if r.Kind == "region" || r.Kind == "keys" || r.Kind == "file" || r.Kind == "directory" || r.Kind == "archive" {
			continue
		}
		if r.Kind == "package" {
			pkgBefore = true
			continue
		}
		if h.units[r.Name] == nil && !pkgBefore {
			return Result{Refused: true}
		}
		if seenUnit[r.Name] {
			return Result{Refused: true}
		}
		seenUnit[r.Name] = true
	}
	if h.parentMissing(d) {
		return Result{Refused: true}
	}
	declared := map[string]bool{} // "kind:name module.id"
	declaredTarget := map[string]bool{}
	for _, r := range d.Resources {
		declared[r.Kind+":"+r.Name+" "+h.claim(r)] = true
		declaredTarget[r.Kind+":"+r.Name] = true
	}
	held := func(r Resource) bool { return d.Adopted && !d.Taken[r.Module] }
	// Who sets each key, read before anything is applied: a key handed
	// over goes to a resource that is not held.
	h.setBy = map[string]string{}
	for _, r := range d.Resources {
		if rec := h.keysRec[r.Key()]; r.Kind == "keys" && !(held(r) && (rec == nil || rec.held)) {
			for k := range r.Set {
				h.setBy[k] = r.Key()
			}
		}
	}
	// A file changing shape is undone in its old shape first.
	whole, edited := map[string]bool{}, map[string]bool{}
	tree := h.newTreeRun(d, held)
	h.reshapeFirst(tree, &res)
	for _, r := range d.Resources {
		switch {
		case InTree(r.Name):
		case r.Kind == "file":
			whole[r.Name] = true
		case r.Kind == "keys" || r.Kind == "region":
			edited[r.Name] = true
		}
	}
	if whole[KeysFile] {
		for _, name := range h.keysNewestFirst() {
			h.removeKeys(name, &res)
		}
	}
	if whole[SharedFile] {
		for _, name := range h.regionsOfThis() {
			h.removeRegion(name, &res)
		}
	}
	for f := range edited {
		if rec := h.whole[f]; rec != nil && !h.otherClaims(rec.claims) {
			h.removeWhole(f, func(string) bool { return false }, &res)
		}
	}
	stop := func() Result {
		// A failed step stops the apply: nothing is removed.
		sort.Strings(res.Init)
		sort.Strings(res.Installs)
		return res
	}
	for _, r := range d.Resources {
		if InTree(r.Name) {
			ok := false
			switch r.Kind {
			case "file":
				ok = h.applyTreeFile(r, tree, &res)
			case "directory":
				ok = h.applyDirectory(r, tree, &res)
			case "archive":
				ok = h.applyArchive(r, tree, &res)
			}
			if !ok {
				return stop()
			}
			continue
		}
		switch r.Kind {
		case "package":
			h.applyPackage(r, held(r), &res)
			continue
		case "file":
			h.applyWhole(r, held(r), &res)
			continue
		case "region":
			h.applyRegion(r, held(r), &res)
			continue
		case "keys":
			h.applyKeys(r, held(r), &res)
			continue
		}
		if !h.applyService(r, held(r), &res) {
			return stop()
		}
	}
	h.remove(declared, declaredTarget, &res)
	h.removeTree(tree, &res)
	sort.Strings(res.Init)
	sort.Strings(res.Installs)
	return res
}

func addClaim(claims []string, c string) []string {
	if slices.Contains(claims, c) {
		return claims
	}
	return append(slices.Clone(claims), c)
}

func (h *host) applyPackage(r Resource, hold bool, res *Result) {
	rec := h.pkgRec[r.Name]
	if rec != nil && h.yield(r, &rec.claims, true, res) {
		return
	}
	if h.installed[r.Name] && hold && (rec == nil || rec.held) {
		res.Lines[r.Key()] = "held"
		if rec == nil {
			rec = &pkgRecord{held: true}
			h.pkgRec[r.Name] = rec
		}
		rec.claims = addClaim(rec.claims, h.claim(r))
		return
	}
	if rec == nil {
		rec = &pkgRecord{}
		h.pkgRec[r.Name] = rec
	}
	rec.claims, rec.held = addClaim(rec.claims, h.claim(r)), false
	if h.installed[r.Name] {
		res.Lines[r.Key()] = "unchanged"
		return
	}
	res.Lines[r.Key()] = "applied"
	res.Installs = append(res.Installs, r.Name)
	h.installed[r.Name], rec.created = true, true
	if u := h.brings[r.Name]; u != "" && h.units[u] == nil {
		h.units[u] = &Unit{Running: true, Enabled: true}
	}
}

// applyRegion writes a region's block, its name the resource's key.
func (h *host) applyRegion(r Resource, hold bool, res *Result) {
	name := r.Key()
	if h.wholeAbove(SharedFile) {
		res.Lines[name] = "held"
		return
	}
	rec := h.regionRec[name]
	cur, present := h.blocks[name]
	if hold && (rec == nil || rec.held) {
		res.Lines[name] = "held"
		h.regionRec[name] = &regionRecord{held: true, src: h.src, order: h.regionOrder(rec)}
		return
	}
	if rec == nil || rec.held {
		rec = &regionRecord{src: h.src, order: h.regionOrder(rec)}
		if present {
			f := cur
			rec.found = &f
		}
		h.regionRec[name] = rec
	}
	switch {
	case present && cur == r.Content:
		res.Lines[name] = "unchanged"
	case rec.written == r.Content:
		res.Lines[name] = "repaired"
	default:
		res.Lines[name] = "applied"
	}
	h.blocks[name] = r.Content
	rec.written = r.Content
}

// applyKeys sets a keys resource's keys, and gives back those it set
// before and no other resource of the declaration sets now. A key a
// source above sets is left as that source has it, key by key.
func (h *host) applyKeys(r Resource, hold bool, res *Result) {
	name := r.Key()
	if h.wholeAbove(KeysFile) {
		res.Lines[name] = "held"
		return
	}
	prev := h.keysRec[name]
	if hold && (prev == nil || prev.held) {
		res.Lines[name] = "held"
		h.keysRec[name] = &keysRecord{held: true, order: h.keysOrder(prev), src: h.src}
		return
	}
	changed, above := false, 0
	wrote := map[string]string{}
	for k, want := range r.Set {
		if h.keyAbove(k) {
			above++
			if v, had := prev.wroteKey(k); had {
				wrote[k] = v
			}
			continue
		}
		cur, present := h.keys[k]
		if h.keyRec[k] == nil {
			kr := &keyRecord{}
			if present {
				kr.found = &cur
			}
			h.keyRec[k] = kr
		}
		wrote[k] = want
		if !present || cur != want {
			h.keys[k] = want
			changed = true
		}
	}
	if prev != nil {
		for k, v := range prev.wrote {
			if _, still := wrote[k]; !still && h.giveBackKey(k, name, v) {
				changed = true
			}
		}
	}
	switch {
	case !changed && above == len(r.Set):
		res.Lines[name] = "held"
	case !changed:
		res.Lines[name] = "unchanged"
	case prev != nil && !prev.held && maps.Equal(prev.set, r.Set):
		res.Lines[name] = "repaired"
	default:
		res.Lines[name] = "applied"
	}
	h.keysRec[name] = &keysRecord{set: maps.Clone(r.Set), wrote: wrote, order: h.keysOrder(prev), src: h.src}
}

// wroteKey is what the record set of key k, if it holds it.
func (rec *keysRecord) wroteKey(k string) (string, bool) {
	if rec == nil {
		return "", false
	}
	v, ok := rec.wrote[k]
	return v, ok
}

// keyAbove says whether a source above the apply's sets key k.
func (h *host) keyAbove(k string) bool {
	return h.src == "" && h.keySetBy(k, rescuePrefix)
}

// keySetBy says whether a keys record of source src, not held, sets k.
func (h *host) keySetBy(k, src string) bool {
	for _, rec := range h.keysRec {
		if _, ok := rec.wrote[k]; ok && rec.src == src && !rec.held {
			return true
		}
	}
	return false
}

// otherSource is the source that is not the apply's.
func (h *host) otherSource() string {
	if h.src == "" {
		return rescuePrefix
	}
	return ""
}

// regionOrder is the order of a region's record: its own once it has one.
func (h *host) regionOrder(prev *regionRecord) int {
	if prev != nil {
		return prev.order
	}
	return h.nextOrder()
}

// keysOrder is the order of a keys record: its own once it has one.
func (h *host) keysOrder(prev *keysRecord) int {
	if prev != nil {
		return prev.order
	}
	return h.nextOrder()
}

// keysNewestFirst is the keys resources the apply's source recorded, the
// last first recorded first.
func (h *host) keysNewestFirst() []string {
	var names []string
	for name, rec := range h.keysRec {
		if rec.src == h.src {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(a, b int) bool { return h.keysRec[names[a]].order > h.keysRec[names[b]].order })
	return names
}

// giveBackKey gives back a key the resource self no longer sets, which
// it set to set, unless another resource of the declaration sets it now
// (handed over) or the other source does (released: left as it is, for
// that source's next apply); it reports whether the file changed.
func (h *host) giveBackKey(k, self, set string) bool {
	if by := h.setBy[k]; by != "" && by != self {
		return false
	}
	if h.keySetBy(k, h.otherSource()) {
		return false
	}
	kr := h.keyRec[k]
	delete(h.keyRec, k)
	cur, present := h.keys[k]
	switch {
	case kr == nil || !present || cur != set:
		return false
	case kr.found == nil:
		delete(h.keys, k)
	case *kr.found == cur:
		return false
	default:
		h.keys[k] = *kr.found
	}
	return true
}

// content is what a file holds, as the model reads it: the keys file's
// keys, the shared file's blocks.
func (h *host) content(file string) *map[string]string {
	if file == KeysFile {
		return &h.keys
	}
	return &h.blocks
}

// applyWhole writes a file whole.
func (h *host) applyWhole(r Resource, hold bool, res *Result) {
	cur := h.content(r.Name)
	rec := h.whole[r.Name]
	if rec != nil && h.yield(r, &rec.claims, true, res) {
		return
	}
	if h.editsAbove(r.Name) {
		res.Lines[r.Key()] = "held"
		if rec != nil {
			rec.claims = addClaim(rec.claims, h.claim(r))
		}
		return
	}
	if rec == nil {
		rec = &wholeRecord{found: maps.Clone(*cur), held: hold, order: h.nextOrder()}
		h.whole[r.Name] = rec
	}
	rec.claims = addClaim(rec.claims, h.claim(r))
	if hold && rec.held {
		res.Lines[r.Key()] = "held"
		if !maps.Equal(*cur, rec.found) {
			res.Lines[r.Key()] = "held-changed"
		}
		return
	}
	rec.held = false
	switch {
	case maps.Equal(*cur, r.Set):
		res.Lines[r.Key()] = "unchanged"
	case rec.written != nil && maps.Equal(rec.written, r.Set):
		res.Lines[r.Key()] = "repaired"
	default:
		res.Lines[r.Key()] = "applied"
	}
	*cur, rec.written = maps.Clone(r.Set), maps.Clone(r.Set)
}

// removeWhole undeclares a file declared whole, for the claims of this
// source not declared now: released where another claim stays, its found
// content put back otherwise.
func (h *host) removeWhole(file string, declared func(claim string) bool, res *Result) {
	rec := h.whole[file]
	mine, rest := h.split(rec.claims, declared)
	switch {
	case len(mine) == 0:
		return
	case len(rest) > 0:
		res.Lines[lineOf(mine[0])] = "forgotten"
		rec.claims = rest
		return
	case h.editsAbove(file) && !rec.held:
		res.Lines[lineOf(mine[0])] = "held" // put back once the source above lets it go
		return
	}
	delete(h.whole, file)
	if rec.held {
		res.Lines[lineOf(mine[0])] = "forgotten"
		return
	}
	*h.content(file) = maps.Clone(rec.found)
	res.Lines[lineOf(mine[0])] = "restored"
}

// regionsOfThis is the regions the apply's source recorded, by name.
func (h *host) regionsOfThis() []string {
	var names []string
	for name, rec := range h.regionRec {
		if rec.src == h.src {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// editsAbove says whether a source above the apply's sets keys (the keys
// file) or a region (the shared file) in file: the link's file declared
// whole is then held, as its keys and regions are under a rescue's whole
// file (wholeAbove).
func (h *host) editsAbove(file string) bool {
	if h.src != "" {
		return false
	}
	if file == KeysFile {
		return slices.ContainsFunc(slices.Collect(maps.Values(h.keysRec)), func(rec *keysRecord) bool { return rec.src == rescuePrefix })
	}
	return slices.ContainsFunc(slices.Collect(maps.Values(h.regionRec)), func(rec *regionRecord) bool { return rec.src == rescuePrefix })
}

// wholeAbove says whether a source above the apply's declares file whole:
// the link's keys or regions in it are then held, changing nothing, and
// their removals wait (one file in two shapes is one thing).
func (h *host) wholeAbove(file string) bool {
	rec := h.whole[file]
	return rec != nil && h.above(rec.claims)
}

// removeRegion undeclares a region: a found block put back, the host's
// taken out.
func (h *host) removeRegion(name string, res *Result) {
	rec := h.regionRec[name]
	if h.wholeAbove(SharedFile) && !rec.held {
		res.Lines[name] = "held" // given back once the file is let go
		return
	}
	delete(h.regionRec, name)
	_, present := h.blocks[name]
	switch {
	case rec.held:
		res.Lines[name] = "forgotten"
	case rec.found != nil:
		res.Lines[name] = "restored"
		h.blocks[name] = *rec.found
	case present:
		res.Lines[name] = "removed"
		delete(h.blocks, name)
	default:
		res.Lines[name] = "forgotten"
	}
}

// removeKeys undeclares a keys resource: each key it set given back.
func (h *host) removeKeys(name string, res *Result) {
	rec := h.keysRec[name]
	if h.wholeAbove(KeysFile) && !rec.held {
		res.Lines[name] = "held" // given back once the file is let go
		return
	}
	delete(h.keysRec, name)
	changed := false
	for k, v := range rec.wrote {
		if h.giveBackKey(k, "", v) {
			changed = true
		}
	}
	res.Lines[name] = "forgotten"
	if changed {
		res.Lines[name] = "restored"
	}
}

// applyService reports false when its line failed (the apply stops).
func (h *host) applyService(r Resource, hold bool, res *Result) bool {
	if rec := h.unitRec[r.Name]; rec != nil && h.yield(r, &rec.claims, true, res) {
		return true
	}
	cur := h.units[r.Name]
	if cur == nil {
		res.Lines[r.Key()] = "failed"
		return false
	}
	desired := r.State + "/" + enabledWord(r.Enabled)
	rec := h.unitRec[r.Name]
	isNew := rec == nil
	if isNew {
		rec = &unitRecord{}
		p := h.pkgRec[h.bringer(r.Name)]
		rec.found.absent = p != nil && p.created && !p.held
		rec.found.running = cur.Running // as first looked at, absent or not
		h.unitRec[r.Name] = rec
	}
	if r.Enabled != nil && !rec.found.enabledKnown {
		rec.found.enabledKnown, rec.found.enabled = true, cur.Enabled
	}
	rec.claims = addClaim(rec.claims, h.claim(r))
	if hold && (isNew || rec.held) {
		// Changed by something else since it was found: in what the host
		// recorded of it — whether it ran, and its enablement once a
		// declaration set it.
		f := rec.found
		res.Lines[r.Key()] = "held"
		if !isNew && (f.running != cur.Running || f.enabledKnown && f.enabled != cur.Enabled) {
			res.Lines[r.Key()] = "held-changed"
		}
		rec.held = true
		return true
	}
	rec.held = false
	start := r.State == "running" && !cur.Running
	stop := r.State == "stopped" && cur.Running
	setEnabled := r.Enabled != nil && *r.Enabled != cur.Enabled
	outcome := "unchanged"
	switch {
	case start || stop || setEnabled:
		outcome = "applied"
		if rec.digest == desired {
			outcome = "repaired"
		}
	case isNew && rec.found.absent:
		outcome = "applied" // nothing to do, but the mesh brought it
	}
	if setEnabled {
		verb := "disable"
		if *r.Enabled {
			verb = "enable"
		}
		res.Init = append(res.Init, verb+" "+r.Name)
		cur.Enabled = *r.Enabled
	}
	if start {
		res.Init = append(res.Init, "start "+r.Name)
		cur.Running = true
	}
	if stop {
		res.Init = append(res.Init, "stop "+r.Name)
		cur.Running = false
	}
	res.Lines[r.Key()] = outcome
	rec.state, rec.enabledSet, rec.digest = r.State, r.Enabled != nil, desired
	if r.State != "" {
		rec.was = r.State
	}
	if r.Enabled != nil {
		rec.wasEnabled = enabledWord(r.Enabled)
	}
	return true
}

// stillBrought says whether what brought a unit found absent is declared
// still once the apply is done: its package, by this declaration or by
// another source.
func (h *host) stillBrought(unit string, declaredTarget map[string]bool) bool {
	p := h.bringer(unit)
	rec := h.pkgRec[p]
	return declaredTarget["package:"+p] || rec != nil && h.otherClaims(rec.claims)
}

func enabledWord(e *bool) string {
	switch {
	case e == nil:
		return "-"
	case *e:
		return "true"
	}
	return "false"
}

// remove undoes what the declaration no longer declares: a name no longer
// declared is released where the thing is still declared under another;
// otherwise a package is forgotten, and a unit given back.
func (h *host) remove(declared, declaredTarget map[string]bool, res *Result) {
	release := func(kind, name string, claims []string) (mine, rest []string) {
		return h.split(claims, func(c string) bool { return declared[kind+":"+name+" "+c] })
	}
	for name, rec := range h.pkgRec {
		mine, rest := release("package", name, rec.claims)
		if len(mine) == 0 {
			continue
		}
		res.Lines[lineOf(mine[0])] = "forgotten"
		if len(rest) > 0 {
			rec.claims = rest
			continue
		}
		delete(h.pkgRec, name)
	}
	// Undeclaring runs newest first, by when each was first recorded: a
	// region or keys in a file declared whole, and the file (one's
	// removal waited while a source above held the other), are undone in
	// the order they came, backwards.
	type undo struct {
		order int
		do    func()
	}
	var undos []undo
	for _, name := range h.regionsOfThis() {
		if !declared["region:"+SharedFile+" "+h.src+name] {
			undos = append(undos, undo{h.regionRec[name].order, func() { h.removeRegion(name, res) }})
		}
	}
	for _, name := range h.keysNewestFirst() {
		if !declared["keys:"+KeysFile+" "+h.src+name] {
			undos = append(undos, undo{h.keysRec[name].order, func() { h.removeKeys(name, res) }})
		}
	}
	for f, rec := range h.whole {
		undos = append(undos, undo{rec.order, func() { h.removeWhole(f, func(c string) bool { return declared["file:"+f+" "+c] }, res) }})
	}
	sort.SliceStable(undos, func(a, b int) bool { return undos[a].order > undos[b].order })
	for _, u := range undos {
		u.do()
	}
	h.removeUnits(release, declaredTarget, res)
}

// removeUnits gives back, or releases, the units no longer declared.
func (h *host) removeUnits(release func(kind, name string, claims []string) (mine, rest []string), declaredTarget map[string]bool, res *Result) {
	for name, rec := range h.unitRec {
		mine, rest := release("service", name, rec.claims)
		if len(mine) == 0 {
			continue
		}
		if len(rest) > 0 {
			res.Lines[lineOf(mine[0])] = "forgotten"
			rec.claims = rest
			continue
		}
		delete(h.unitRec, name)
		res.Lines[lineOf(mine[0])] = h.giveBack(name, rec, declaredTarget, res)
	}
}

// giveBack returns a unit to the state it was found in (ADR 0118) and
// says how: restored, or forgotten.
func (h *host) giveBack(name string, rec *unitRecord, declaredTarget map[string]bool, res *Result) string {
	cur := h.units[name]
	if rec.held || cur == nil {
		return "forgotten"
	}
	// What a declaration set, the last that did: a declaration that set
	// none after it leaves what the host did the host's change.
	state, enabledSet := rec.was, rec.enabledSet || rec.found.enabledKnown
	var stop, disable bool
	switch f := rec.found; {
	case f.absent && h.stillBrought(name, declaredTarget):
		// what brought it is still declared: the unit is left
	case f.absent:
		stop = state != "" && cur.Running
		disable = (state != "" || enabledSet) && cur.Enabled
	default:
		stop = state == "running" && !f.running && cur.Running
		// only one the host enabled: the last enablement declared was on
		disable = rec.wasEnabled == "true" && f.enabledKnown && !f.enabled && cur.Enabled
	}
	if !stop && !disable {
		return "forgotten"
	}
	if disable {
		res.Init = append(res.Init, "disable "+name)
		cur.Enabled = false
	}
	if stop {
		res.Init = append(res.Init, "stop "+name)
		cur.Running = false
	}
	return "restored"
}
