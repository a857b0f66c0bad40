package model

import (
	"fmt"
	"math/rand/v2"
	"path"
	"strings"
)

// treeCatalogue is the tree's part of a generated sequence, drawn from a
// stream of the seed's own: a directory d (id dd), a file in it (d/f, ff)
// and one beside it (t, ft), the archive unpacked into d (ar; its f is the
// file ff's path), and a path x declared a directory (xd) or a file (xf),
// each in one module, or not in the catalogue at all.
type treeCatalogue struct {
	rnd                        *rand.Rand
	modules                    []string
	dir, file, top, archive, x *Resource
	archiveFirst               bool
	version                    int
	pathD, pathF, pathT, pathX string
	pathP, pathE, pathXP       string
}

// The texts a person writes into the tree.
const (
	personsText = "a person's file\n"
)

func newTreeCatalogue(rnd *rand.Rand, modules []string, w *World) *treeCatalogue {
	d := TreeRoot + "/d"
	c := &treeCatalogue{rnd: rnd, modules: modules, pathD: d, pathF: d + "/f", pathT: TreeRoot + "/t", pathX: TreeRoot + "/x",
		pathP: d + "/p", pathE: d + "/s/e", pathXP: TreeRoot + "/x/p"}
	// The world: d found or not, with a person's f and p in it at times;
	// t found at times; x found a file or a directory at times.
	if rnd.IntN(2) == 0 {
		w.Tree[d] = Node{Dir: true}
		if rnd.IntN(3) == 0 {
			w.Tree[c.pathF] = Node{Text: "a person's f\n"}
		}
		if rnd.IntN(3) == 0 {
			w.Tree[c.pathP] = Node{Text: personsText}
		}
	}
	if rnd.IntN(3) == 0 {
		w.Tree[c.pathT] = Node{Text: "a person's t\n"}
	}
	switch rnd.IntN(6) {
	case 0:
		w.Tree[c.pathX] = Node{Text: "a person's x\n"}
	case 1:
		w.Tree[c.pathX] = Node{Dir: true}
	}
	module := func() string { return modules[rnd.IntN(len(modules))] }
	if rnd.IntN(4) > 0 {
		c.dir = &Resource{Kind: "directory", Module: module(), ID: "dd", Name: d}
	}
	if rnd.IntN(4) > 0 {
		c.file = &Resource{Kind: "file", Module: module(), ID: "ff", Name: c.pathF, Content: c.text("f")}
	}
	if rnd.IntN(4) > 0 {
		c.top = &Resource{Kind: "file", Module: module(), ID: "ft", Name: c.pathT, Content: c.text("t")}
	}
	if rnd.IntN(4) > 0 {
		c.archive = &Resource{Kind: "archive", Module: module(), ID: "ar", Name: d, Content: "v1", URL: ArchiveURL("v1")}
	}
	if rnd.IntN(3) > 0 {
		c.x = &Resource{Kind: "directory", Module: module(), ID: "xd", Name: c.pathX}
		if rnd.IntN(2) == 0 {
			c.x.Kind, c.x.ID, c.x.Content = "file", "xf", c.text("x")
		}
	}
	c.archiveFirst = rnd.IntN(2) == 0
	return c
}

func (c *treeCatalogue) text(what string) string {
	c.version++
	return fmt.Sprintf("the mesh's %s, v%d\n", what, c.version)
}

// declared is the catalogue's resources in the order a declaration states
// them: the directory before what goes in it, the archive and the file in
// it in the sequence's order, then t and x.
func (c *treeCatalogue) declared() []Resource {
	var out []Resource
	add := func(r *Resource) {
		if r != nil {
			out = append(out, *r)
		}
	}
	add(c.dir)
	if c.archiveFirst {
		add(c.archive)
		add(c.file)
	} else {
		add(c.file)
		add(c.archive)
	}
	add(c.top)
	add(c.x)
	return out
}

// step may change the catalogue as a declaration's step is taken, and
// says how ("" for not): a file's new text, the archive's other version,
// a resource renamed or moved to another module, x declared in its other
// shape.
func (c *treeCatalogue) step() string {
	if c.rnd.IntN(3) > 0 {
		return ""
	}
	var have []*Resource
	for _, r := range []*Resource{c.dir, c.file, c.top, c.archive, c.x} {
		if r != nil {
			have = append(have, r)
		}
	}
	if len(have) == 0 {
		return ""
	}
	r := have[c.rnd.IntN(len(have))]
	switch c.rnd.IntN(4) {
	case 0:
		switch {
		case r.Kind == "archive":
			r.Content = map[string]string{"v1": "v2", "v2": "v1"}[r.Content]
			r.URL = ArchiveURL(r.Content)
			return fmt.Sprintf("; a new catalogue declares %s's %s", r.Key(), r.Content)
		case r.Kind == "file":
			r.Content = c.text(r.ID)
			return fmt.Sprintf("; a new catalogue declares %s holding %q", r.Key(), r.Content)
		}
		return ""
	case 1:
		old := r.Key()
		if strings.HasSuffix(r.ID, "r") {
			r.ID = strings.TrimSuffix(r.ID, "r")
		} else {
			r.ID += "r"
		}
		return "; rename " + old + " to " + r.Key()
	case 2:
		old := r.Key()
		r.Module = c.modules[c.rnd.IntN(len(c.modules))]
		if r.Key() == old {
			return ""
		}
		return "; move " + old + " to module " + r.Module
	}
	if r != c.x {
		return ""
	}
	old := r.Key()
	if r.Kind == "directory" {
		r.Kind, r.ID, r.Content = "file", strings.Replace(r.ID, "xd", "xf", 1), c.text("x")
	} else {
		r.Kind, r.ID, r.Content = "directory", strings.Replace(r.ID, "xf", "xd", 1), ""
	}
	return fmt.Sprintf("; %s is declared a %s, %s", old, r.Kind, r.Key())
}

// operator may add a change of the tree to an operator's step, and says
// which ("" for none): a person's file written into d, the archive's s
// or x, or taken out;
// a file edited by hand (or written where it was not); one taken out; a
// directory taken out where it is empty.
func (c *treeCatalogue) operator(ev *Event) string {
	if c.rnd.IntN(2) == 0 {
		return ""
	}
	switch k := c.rnd.IntN(13); k {
	case 12:
		ev.TreePath, ev.TreeText = path.Dir(c.pathE)+"/q", personsText
	case 9, 10, 11:
		ev.TreePath, ev.TreeOut = []string{c.pathD, c.pathX, path.Dir(c.pathE)}[k-9], true
	case 0:
		ev.TreePath, ev.TreeText = c.pathP, personsText
	case 1:
		ev.TreePath, ev.TreeOut = c.pathP, true
	case 2:
		ev.TreePath, ev.TreeText = c.pathXP, personsText
	case 3:
		ev.TreePath, ev.TreeOut = c.pathT, true
	case 4:
		ev.TreePath, ev.TreeOut = c.pathF, true
	default:
		ev.TreePath, ev.TreeText = []string{c.pathF, c.pathT, c.pathE, c.pathX}[k-5], EditedByHand
	}
	if ev.TreeOut {
		return " and takes " + ev.TreePath + " out, if it is a file or an empty directory"
	}
	return fmt.Sprintf(" and writes %q into %s, where it can", ev.TreeText, ev.TreePath)
}
