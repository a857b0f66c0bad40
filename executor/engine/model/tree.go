package model

import (
	"archive/tar"
	"bytes"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
)

// The tree: files, directories and an archive under a root of the model's
// own, for ADR 0118's rule on paths — the host removes only what it made
// and gives back what it changed (docs/declaration.md, file, directory
// and archive):
//
//   - A file is written as declared. One the host did not find is its
//     creation: undeclared, removed, edited by hand since or not (a
//     person's edit is kept aside, not left). One it found is kept as
//     found, and undeclared the found text is put back (restored). Found
//     as declared, it is held by the host from then on, and given back the
//     same way. Its parent must be a directory when it is written: the
//     host never makes one on its own. A file edited or deleted by someone
//     while declared is written again (repaired).
//   - A directory is made when absent; one found is used as it is.
//     Undeclared, one the host made is removed when it will be empty once
//     what the same apply removes is gone — what the declaration still puts
//     in it counts — and kept otherwise, still tracked, removed by a later
//     apply once empty; one it found is given its owner and mode back
//     (restored), or forgotten when someone took it away since. One
//     removed by someone while declared is made again (repaired).
//   - An archive unpacks into an existing directory. It never overwrites a
//     path it did not write (unless that path holds its entry exactly: left
//     as it is, never its own); a path a file of the same declaration
//     declares is the file's, and the archive leaves it, in either order.
//     A file declared before at a path it writes or wrote, undeclared now,
//     is undone before the archive looks (its original, the archive's
//     entry, put back), so that it is never in its way and the archive
//     decides what becomes of it. A version of the archive that no longer
//     has an entry it wrote removes it — unless a file of the declaration
//     declares it: it stays the archive's, for when the file no longer
//     declares it. Undeclared while a file declares one of its paths, the
//     archive hands the path to the file: the host made it, and the file
//     undeclared removes it rather than put back an original nothing
//     accounts for any more.
//     Undeclared, what it wrote is removed (edited or not: the archive's
//     files are not kept aside), deepest first, and its directories when
//     that leaves them empty; one that holds what it did not write is kept,
//     with the archive's record, until a later apply finds it empty.
//   - An archive and a file of two sources at one path: the source above
//     has it. An archive leaves a file a source above declares, and
//     writes over one a source below declares, which is then held (its
//     claim kept, nothing written, nothing undone) while the archive holds
//     the path (what the host last wrote there being the archive's entry);
//     a version of the archive without the path gives it back to that
//     source as it is, for it to write. A file or directory found where another source's archive
//     wrote is the host's creation, not found: undeclared, it goes rather
//     than put back the archive's entry as an original. An archive
//     undeclared leaves a path another source's file or directory
//     declares.
//   - A path the host made a directory and a declaration now declares a
//     file, or the other way, is undone in its old shape before anything of
//     the declaration is applied: a directory that holds what the host did
//     not make is kept, and the file then fails on it; a found file's
//     original is put back, and the directory then fails on it.
//   - On an adopted node a file or directory found for a module not taken
//     is held: nothing changed, held-changed once it differs from what was
//     found (or is gone), forgotten when undeclared. One not found is made
//     all the same. An archive is never held.
//   - Undeclaring runs newest first: what was first recorded last is
//     undone first, so a directory is decided after what the host put in it.

// TreeRoot is the directory the tree's paths are under ("tree/d/f"): a test
// names it where its machine has it (Declaration.Renamed), as SharedFile.
const TreeRoot = "tree"

// Node is one path of the tree: a directory, or a regular file's text.
type Node struct {
	Dir  bool
	Text string
}

// ArchiveEntry is one entry of an archive's version: its path under the
// destination, a directory or a file's text.
type ArchiveEntry struct {
	Rel  string
	Dir  bool
	Text string
}

// ArchiveEntries is what each version of the tree's archive holds, parents
// before what they hold, as a tar lists them: v2 no longer has f, has g,
// and another e.
func ArchiveEntries(version string) []ArchiveEntry {
	switch version {
	case "v1":
		return []ArchiveEntry{{Rel: "f", Text: "the archive's f, v1\n"}, {Rel: "s", Dir: true}, {Rel: "s/e", Text: "the archive's e, v1\n"}}
	case "v2":
		return []ArchiveEntry{{Rel: "g", Text: "the archive's g, v2\n"}, {Rel: "s", Dir: true}, {Rel: "s/e", Text: "the archive's e, v2\n"}}
	}
	return nil
}

// ArchiveTar is a version's tar, as the engine reads it: directories 0755,
// files 0644, as a person's files in the tree are.
func ArchiveTar(version string) []byte {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, en := range ArchiveEntries(version) {
		h := &tar.Header{Name: en.Rel, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(en.Text))}
		if en.Dir {
			h = &tar.Header{Name: en.Rel + "/", Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := w.WriteHeader(h); err != nil {
			panic(err) // an in-memory tar of fixed entries
		}
		w.Write([]byte(en.Text))
	}
	w.Close()
	return b.Bytes()
}

// ArchiveURL is the name of a version's tar, as a declaration names it
// (Renamed makes it the machine's path, for EngineDoc to make a file://
// URL of, or a URL of its own: the link's obj://).
func ArchiveURL(version string) string { return "archive-" + version + ".tar" }

// InTree says whether a resource's Name is a path of the tree.
func InTree(name string) bool { return strings.HasPrefix(name, TreeRoot+"/") }

// pathRecord is what the host keeps of a file or directory it applied.
type pathRecord struct {
	kind    string // "file" or "directory"
	claims  []string
	order   int
	created bool
	// found: what the host found and keeps (a file's text; a directory's
	// owner and mode, which the model does not vary), nil when it made it.
	found *Node
	held  bool
	// written is what the host last wrote or found as declared (a
	// directory's "dir"), for repaired against applied; "" while held.
	written string
}

// archiveRecord is what the host keeps of the archive at a destination.
type archiveRecord struct {
	claims  []string
	order   int
	version string
	paths   map[string]bool // what it wrote, and holds
}

// treeRun is an apply's view of the tree: what it declares, and what its
// removals so far take away.
type treeRun struct {
	declared  map[string]bool // "path:P module.id" and "archive:P module.id"
	files     map[string]bool // the paths a file of the declaration declares
	kids      map[string][]string
	removing  map[string]bool
	early     map[string]bool // "path:P": undone before the apply
	hold      func(Resource) bool
	resources []Resource
}

func treeTarget(r Resource) string {
	if r.Kind == "archive" {
		return "archive:" + r.Name
	}
	return "path:" + r.Name
}

func (h *host) newTreeRun(d Declaration, hold func(Resource) bool) *treeRun {
	t := &treeRun{declared: map[string]bool{}, files: map[string]bool{}, kids: map[string][]string{},
		removing: map[string]bool{}, early: map[string]bool{}, hold: hold, resources: d.Resources}
	for _, r := range d.Resources {
		if !InTree(r.Name) {
			continue
		}
		t.declared[treeTarget(r)+" "+h.claim(r)] = true
		if r.Kind == "file" || r.Kind == "directory" {
			t.kids[path.Dir(r.Name)] = append(t.kids[path.Dir(r.Name)], r.Name)
		}
		if r.Kind == "file" {
			t.files[r.Name] = true
		}
	}
	return t
}

func (h *host) isDir(p string) bool {
	n, ok := h.tree[p]
	return p == TreeRoot || ok && n.Dir
}

func (h *host) nextOrder() int { h.order++; return h.order }

// parentMissing says whether the declaration is refused whole for a file
// or directory of the tree whose parent is not there and not declared a
// directory before it: the apply would fail half-way otherwise. After a
// package or an archive, which may bring the directory, the write is left
// to find out.
func (h *host) parentMissing(d Declaration) bool {
	declared, brings := map[string]bool{}, false
	for _, r := range d.Resources {
		switch {
		case r.Kind == "package" || r.Kind == "archive":
			brings = true
		case !InTree(r.Name) || r.Kind != "file" && r.Kind != "directory":
		case !brings && !declared[path.Dir(r.Name)] && !h.present(path.Dir(r.Name)):
			return true
		case r.Kind == "directory":
			declared[r.Name] = true
		}
	}
	return false
}

// present says whether anything, a directory or a file, is at p.
func (h *host) present(p string) bool {
	_, ok := h.tree[p]
	return p == TreeRoot || ok
}

// reshapeFirst undoes, before anything of the declaration is applied, a
// directory the host made where a file is declared now, and a file it
// recorded where a directory is.
func (h *host) reshapeFirst(t *treeRun, res *Result) {
	now := map[string]string{}
	for _, r := range t.resources {
		if InTree(r.Name) && r.Kind != "archive" {
			now[r.Name] = r.Kind
		}
	}
	for _, p := range h.newestFirst() {
		rec := h.pathRec[p]
		switch {
		case rec == nil || now[p] == "" || now[p] == rec.kind || h.otherClaims(rec.claims):
		case rec.kind == "file" || rec.created:
			t.early["path:"+p] = true
			h.removePath(p, rec, t, res)
		}
	}
}

// newestFirst is the paths recorded, the last first recorded first.
func (h *host) newestFirst() []string {
	ps := slices.Collect(maps.Keys(h.pathRec))
	sort.Slice(ps, func(a, b int) bool { return h.pathRec[ps[a]].order > h.pathRec[ps[b]].order })
	return ps
}

// pathStep is what a file's step and a directory's share before their
// own work, kind being the step's: a source above holding the path (held,
// yields; a file, an archive of a source above that wrote it too), something of the other kind in the way (failed), and on an
// adopted node, for a module not taken, what was found (held; held-changed
// once it differs or is gone). done says the step's line is decided; ok
// false that it failed.
func (h *host) pathStep(r Resource, kind string, t *treeRun, res *Result) (rec *pathRecord, cur Node, exists, done, ok bool) {
	p, key, claim := r.Name, r.Key(), h.claim(r)
	rec = h.pathRec[p]
	if rec != nil && h.yield(r, &rec.claims, rec.kind == kind, res) {
		return rec, cur, false, true, true
	}
	if kind == "file" && h.archivedBy(p, h.above) {
		// An archive of a source above holds the path: the same.
		res.Lines[key] = "held"
		if rec != nil {
			rec.claims = addClaim(rec.claims, claim)
		}
		return rec, cur, false, true, true
	}
	cur, exists = h.tree[p]
	if exists && cur.Dir != (kind == "directory") {
		res.Lines[key] = "failed"
		return rec, cur, exists, true, false
	}
	hold := t.hold(r)
	switch {
	case !exists && hold && rec != nil && rec.held:
		res.Lines[key] = "held-changed"
		rec.claims = addClaim(rec.claims, claim)
	case exists && hold && rec == nil:
		found := cur
		h.pathRec[p] = &pathRecord{kind: kind, claims: []string{claim}, order: h.nextOrder(), found: &found, held: true}
		res.Lines[key] = "held"
	case exists && hold && rec.held:
		rec.claims = addClaim(rec.claims, claim)
		res.Lines[key] = "held"
		if cur != *rec.found {
			res.Lines[key] = "held-changed"
		}
	default:
		return rec, cur, exists, false, true
	}
	return rec, cur, exists, true, true
}

// applyTreeFile writes a file of the tree; false when its line failed.
func (h *host) applyTreeFile(r Resource, t *treeRun, res *Result) bool {
	p, key, claim := r.Name, r.Key(), h.claim(r)
	rec, cur, exists, done, ok := h.pathStep(r, "file", t, res)
	if done {
		return ok
	}
	made := h.archivedBy(p, h.otherClaims)
	if exists && cur.Text == r.Content {
		res.Lines[key] = "unchanged"
		if rec == nil {
			found := cur
			h.pathRec[p] = &pathRecord{kind: "file", claims: []string{claim}, order: h.nextOrder(), found: &found, written: r.Content}
			if made {
				h.pathRec[p].created, h.pathRec[p].found = true, nil
			}
			return true
		}
		rec.claims, rec.held, rec.written = addClaim(rec.claims, claim), false, r.Content
		return true
	}
	if !exists && !h.isDir(path.Dir(p)) {
		res.Lines[key] = "failed"
		return false
	}
	res.Lines[key] = "applied"
	if rec == nil {
		rec = &pathRecord{kind: "file", order: h.nextOrder(), created: !exists || made}
		if exists && !made {
			found := cur
			rec.found = &found
		}
		h.pathRec[p] = rec
	} else if rec.written == r.Content {
		res.Lines[key] = "repaired"
	}
	h.tree[p] = Node{Text: r.Content}
	rec.claims, rec.held, rec.written = addClaim(rec.claims, claim), false, r.Content
	return true
}

// applyDirectory makes a directory of the tree; false when its line failed.
func (h *host) applyDirectory(r Resource, t *treeRun, res *Result) bool {
	p, key, claim := r.Name, r.Key(), h.claim(r)
	rec, _, exists, done, ok := h.pathStep(r, "directory", t, res)
	if done {
		return ok
	}
	switch {
	case exists:
		res.Lines[key] = "unchanged"
		if rec == nil {
			rec = &pathRecord{kind: "directory", order: h.nextOrder(), found: &Node{Dir: true}}
			if h.archivedBy(p, h.otherClaims) {
				rec.created, rec.found = true, nil
			}
			h.pathRec[p] = rec
		}
	case !h.isDir(path.Dir(p)):
		res.Lines[key] = "failed"
		return false
	default:
		res.Lines[key] = "applied"
		if rec == nil {
			rec = &pathRecord{kind: "directory", order: h.nextOrder(), created: true}
			h.pathRec[p] = rec
		} else if rec.written == "dir" {
			res.Lines[key] = "repaired"
		}
		h.tree[p] = Node{Dir: true}
	}
	rec.claims, rec.held, rec.written = addClaim(rec.claims, claim), false, "dir"
	return true
}

// applyArchive unpacks the archive; false when its line failed.
func (h *host) applyArchive(r Resource, t *treeRun, res *Result) bool {
	dest, key, claim := r.Name, r.Key(), h.claim(r)
	if rec := h.archRec[dest]; rec != nil && h.yield(r, &rec.claims, true, res) {
		return true
	}
	if !h.isDir(dest) {
		res.Lines[key] = "failed"
		return false
	}
	rec := h.archRec[dest]
	ours := map[string]bool{}
	if rec != nil {
		ours = rec.paths
	}
	entries := ArchiveEntries(r.Content)
	// A file declared before where it writes, or wrote, undeclared now:
	// undone first.
	var ways []string
	for _, en := range entries {
		if !en.Dir {
			ways = append(ways, path.Join(dest, en.Rel))
		}
	}
	for _, full := range append(ways, slices.Sorted(maps.Keys(ours))...) {
		pr := h.pathRec[full]
		if pr == nil || pr.kind != "file" || t.early["path:"+full] || t.files[full] {
			continue
		}
		if _, rest := h.split(pr.claims, func(c string) bool { return t.declared["path:"+full+" "+c] }); len(rest) > 0 {
			continue // another's, or declared still
		}
		t.early["path:"+full] = true
		h.removePath(full, pr, t, res)
	}
	var todo []ArchiveEntry
	left := map[string]bool{}
	for _, en := range entries {
		full := path.Join(dest, en.Rel)
		if !en.Dir && t.files[full] {
			left[full] = true
			continue
		}
		pr := h.pathRec[full]
		if !en.Dir && pr != nil && h.above(pr.claims) {
			left[full] = true
			continue
		}
		cur, ok := h.tree[full]
		switch {
		case !ok:
		case en.Dir && cur.Dir:
			continue
		case !en.Dir && !cur.Dir && cur.Text == en.Text:
			continue
		case !en.Dir && !cur.Dir && (ours[full] || pr != nil && h.otherClaims(pr.claims)):
		default:
			res.Lines[key] = "failed"
			return false
		}
		todo = append(todo, en)
	}
	wrote := map[string]bool{}
	for _, en := range entries {
		if full := path.Join(dest, en.Rel); ours[full] {
			wrote[full] = true
		}
	}
	for _, en := range todo {
		wrote[path.Join(dest, en.Rel)] = true
	}
	handed := map[string]bool{}
	for p := range ours {
		switch pr := h.pathRec[p]; {
		case t.files[p] || pr != nil && h.above(pr.claims):
			wrote[p] = true // the file's while it declares it, the archive's after
		case pr != nil && h.otherClaims(pr.claims) && !wrote[p]:
			handed[p] = true // a source below's again, as it is
		}
	}
	var stale []string
	for p := range ours {
		if !wrote[p] && !handed[p] {
			stale = append(stale, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(stale)))
	switch {
	case len(todo) == 0 && len(stale) == 0:
		res.Lines[key] = "unchanged"
	case rec != nil && rec.version == r.Content && len(todo) > 0:
		res.Lines[key] = "repaired"
	default:
		res.Lines[key] = "applied"
	}
	for _, en := range todo {
		full := path.Join(dest, en.Rel)
		h.tree[full] = Node{Dir: en.Dir, Text: en.Text}
		if pr := h.pathRec[full]; pr != nil && !en.Dir && h.otherClaims(pr.claims) {
			pr.written = en.Text // the host's last write there: the archive's
		}
	}
	for _, p := range stale {
		if !h.tree[p].Dir || len(h.children(p)) == 0 {
			delete(h.tree, p)
		}
	}
	if rec == nil {
		rec = &archiveRecord{order: h.nextOrder()}
		h.archRec[dest] = rec
	}
	rec.claims, rec.version, rec.paths = addClaim(rec.claims, claim), r.Content, wrote
	return true
}

// archivedBy says whether an archive whose claims match wrote p and holds
// it.
func (h *host) archivedBy(p string, match func(claims []string) bool) bool {
	for _, rec := range h.archRec {
		if rec.paths[p] && match(rec.claims) {
			return true
		}
	}
	return false
}

// children is what directory p holds, by path.
func (h *host) children(p string) []string {
	var out []string
	for q := range h.tree {
		if path.Dir(q) == p {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

// leftIn is what directory p will still hold once this apply's removals so
// far are done, counting what the declaration puts there.
func (h *host) leftIn(p string, t *treeRun) []string {
	var left []string
	for _, q := range append(h.children(p), t.kids[p]...) {
		if !t.removing[q] && !slices.Contains(left, q) {
			left = append(left, q)
		}
	}
	return left
}

// removePath undoes a file or directory nobody declares any more, its line
// under the name it was first recorded under; the record is dropped, or
// kept with a directory that is kept.
func (h *host) removePath(p string, rec *pathRecord, t *treeRun, res *Result) {
	name := lineOf(rec.claims[0])
	drop := true
	switch {
	case rec.held:
		res.Lines[name] = "forgotten"
	case rec.kind == "file" && rec.created:
		res.Lines[name] = "removed"
		t.removing[p] = true
		delete(h.tree, p)
	case rec.kind == "file":
		res.Lines[name] = "restored"
		h.tree[p] = *rec.found
	case rec.created && len(h.leftIn(p, t)) > 0:
		res.Lines[name] = "kept"
		drop = false
	case rec.created:
		res.Lines[name] = "removed"
		t.removing[p] = true
		delete(h.tree, p)
	case h.isDir(p):
		res.Lines[name] = "restored"
	default:
		// Found, and taken away by someone since: nothing to give back.
		res.Lines[name] = "forgotten"
	}
	if drop {
		delete(h.pathRec, p)
	}
}

// removeArchive undoes an archive nobody declares any more.
func (h *host) removeArchive(dest string, rec *archiveRecord, t *treeRun, res *Result) {
	paths := slices.Sorted(maps.Keys(rec.paths))
	slices.Reverse(paths)
	kept := map[string]bool{}
	for _, p := range paths {
		if t.files[p] {
			// The file's from now: what the host made, not what it
			// found, so that undeclared it goes.
			if pr := h.pathRec[p]; pr != nil && pr.kind == "file" && !pr.held {
				pr.created, pr.found = true, nil
			}
			continue
		}
		if pr := h.pathRec[p]; pr != nil && h.otherClaims(pr.claims) {
			continue // another source's, which took it as the host's creation
		}
		if h.isDir(p) && len(h.leftIn(p, t)) > 0 {
			kept[p] = true
			continue
		}
		t.removing[p] = true
		delete(h.tree, p)
	}
	if len(kept) > 0 {
		res.Lines[lineOf(rec.claims[0])] = "kept"
		rec.paths = kept
		return
	}
	res.Lines[lineOf(rec.claims[0])] = "removed"
	delete(h.archRec, dest)
}

// removeTree undoes, newest first, what the declaration no longer declares
// in the tree: a name no longer declared is released where the thing is
// declared under another; otherwise the thing is undone.
func (h *host) removeTree(t *treeRun, res *Result) {
	type item struct {
		target string
		order  int
	}
	var items []item
	for p, rec := range h.pathRec {
		items = append(items, item{"path:" + p, rec.order})
	}
	for p, rec := range h.archRec {
		items = append(items, item{"archive:" + p, rec.order})
	}
	sort.Slice(items, func(a, b int) bool { return items[a].order > items[b].order })
	for _, it := range items {
		if t.early[it.target] {
			continue
		}
		kind, p, _ := strings.Cut(it.target, ":")
		var claims *[]string
		if kind == "path" {
			claims = &h.pathRec[p].claims
		} else {
			claims = &h.archRec[p].claims
		}
		mine, rest := h.split(*claims, func(c string) bool { return t.declared[it.target+" "+c] })
		if len(mine) == 0 {
			continue
		}
		if len(rest) > 0 {
			res.Lines[lineOf(mine[0])] = "forgotten"
			*claims = rest
			continue
		}
		if kind == "path" && h.pathRec[p].kind == "file" && !h.pathRec[p].held && h.archivedBy(p, h.above) {
			// Given back now, it would take what an archive of a source
			// above holds: kept, and undone once that archive lets it go.
			res.Lines[lineOf(mine[0])] = "held"
			continue
		}
		if kind == "path" {
			h.removePath(p, h.pathRec[p], t, res)
		} else {
			h.removeArchive(p, h.archRec[p], t, res)
		}
	}
}

// treeOp is the operator's change to the tree: a file written (where its
// parent is a directory and it is no directory), or a file or an empty
// directory taken out.
func (h *host) treeOp(e Event) {
	if e.TreePath == "" {
		return
	}
	cur, ok := h.tree[e.TreePath]
	switch {
	case e.TreeOut:
		if ok && (!cur.Dir || len(h.children(e.TreePath)) == 0) {
			delete(h.tree, e.TreePath)
		}
	case h.isDir(path.Dir(e.TreePath)) && !(ok && cur.Dir):
		h.tree[e.TreePath] = Node{Text: e.TreeText}
	}
}
