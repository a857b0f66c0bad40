package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
)

// The sequences the engine is held to the model on. They live here, beside
// the model, and not in a test of the engine, because two tests draw the
// same ones: the engine's against a transcript init
// (executor/engine TestTheEngineFollowsTheModel) and the lab's on real
// systemd, OpenRC, runit and s6 (tests/machines TestModelSampleOn*). One
// generator means a seed names one sequence wherever it is run.

// Sequence is a generated sequence: a world, a catalogue of modules that
// changes, and the steps taken, all drawn from Seed.
type Sequence struct {
	Seed    uint64
	World   World
	Adopted bool
	Steps   []Step
}

// Step is the operator's change (Decl nil, Op says what), or a declaration
// applied after What says what changed.
type Step struct {
	What string
	Decl *Declaration
	Op   Event
}

// Events is the sequence as Run takes it.
func (s Sequence) Events() []Event {
	var events []Event
	for _, st := range s.Steps {
		if st.Decl == nil {
			events = append(events, st.Op)
		} else {
			events = append(events, Event{Apply: st.Decl})
		}
	}
	return events
}

// String is the sequence as a failure prints it: the world, then each step
// and what it applies.
func (s Sequence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "world (adopted=%v):\n", s.Adopted)
	for _, n := range slices.Sorted(maps.Keys(s.World.Units)) {
		u := s.World.Units[n]
		fmt.Fprintf(&b, "  unit %s running=%v enabled=%v\n", n, u.Running, u.Enabled)
	}
	for _, n := range slices.Sorted(maps.Keys(s.World.Packages)) {
		p := s.World.Packages[n]
		fmt.Fprintf(&b, "  package %s installed=%v brings=%s\n", n, p.Installed, p.Brings)
	}
	for _, n := range slices.Sorted(maps.Keys(s.World.Blocks)) {
		fmt.Fprintf(&b, "  block %s found holding %q\n", n, s.World.Blocks[n])
	}
	for _, n := range slices.Sorted(maps.Keys(s.World.Keys)) {
		fmt.Fprintf(&b, "  key %s found holding %q\n", n, s.World.Keys[n])
	}
	for _, p := range slices.Sorted(maps.Keys(s.World.Tree)) {
		if n := s.World.Tree[p]; n.Dir {
			fmt.Fprintf(&b, "  directory %s found\n", p)
		} else {
			fmt.Fprintf(&b, "  file %s found holding %q\n", p, n.Text)
		}
	}
	for i, st := range s.Steps {
		fmt.Fprintf(&b, "%2d. %s\n", i+1, st.What)
		switch {
		case st.Decl != nil && st.Decl.Rescue:
			fmt.Fprintf(&b, "    apply as a rescue file (above the link) %s\n", describeDecl(*st.Decl))
		case st.Decl != nil:
			fmt.Fprintf(&b, "    apply %s\n", describeDecl(*st.Decl))
		}
	}
	return b.String()
}

func describeDecl(d Declaration) string {
	var parts []string
	for _, r := range d.Resources {
		s := r.Key() + "=" + r.Kind + ":" + r.Name
		switch r.Kind {
		case "service":
			s += "(" + r.State + "," + enabledWord(r.Enabled) + ")"
		case "region":
			s += fmt.Sprintf("(%q)", r.Content)
		case "file", "archive":
			if InTree(r.Name) {
				s += fmt.Sprintf("(%q)", r.Content)
				break
			}
			fallthrough
		case "keys":
			var kv []string
			for _, k := range slices.Sorted(maps.Keys(r.Set)) {
				kv = append(kv, k+"="+r.Set[k])
			}
			s += "(" + strings.Join(kv, ",") + ")"
		}
		parts = append(parts, s)
	}
	taken := slices.Sorted(maps.Keys(d.Taken))
	return fmt.Sprintf("[%s] taken=%v", strings.Join(parts, " "), taken)
}

// Generate draws a sequence from seed: two units found on the machine
// (mu0, mu1), three packages (mp0..mp2) each bringing a unit (mpu0..mpu2;
// one found installed, at times), four modules (ma..md) sharing them out —
// a unit's service and a package each in at most one module, a package
// often in another than its unit's — and eight to fourteen steps: modules
// assigned and unassigned, resources renamed, moved and declared anew,
// modules taken on an adopted node, the operator flipping a unit.
//
// Regions are drawn from a stream of the seed's own (ADR 0102's number),
// so that the units and packages of a seed are what they were before
// regions were drawn: modules hold none, one or two (ids ra, rb), some of
// whose names the shared file holds already, as a person wrote them; at a
// declaration's step a region may be declared with new content, renamed
// (ra, rar) or moved to another module, and at an operator's step a block
// of the file may be edited by hand.
//
// Keys are drawn from a third stream, so that a seed's units, packages and
// regions stay what they were before keys: four keys (Ka..Kd), some found
// in the keys file, each set by at most one resource (ids ka, kb; renamed,
// kar, kbr) of one module; at a declaration's step a key may get a new
// value, a resource be renamed or moved to another module, or a key go
// from one resource to another (of its module or another's), or the keys
// file be declared whole by one module (its keys resources left out of a
// declaration while its module is assigned), or no longer; and at an
// operator's step a key may be set by hand or taken out.
//
// The shared file may be declared whole by one module too (its regions
// left out of a declaration while it is), drawn from a fourth stream.
//
// The tree is drawn from a fifth (treeCatalogue): a directory, a file in
// it and one beside it, an archive unpacked into it in one of two
// versions, a path declared a directory or a file, each in one module, some
// found on the machine; at a declaration's step one may get new content,
// the archive its other version, a resource be renamed or moved, the path
// change shape; at an operator's step a file may be written, edited or
// taken out by hand, an empty directory taken out.
func Generate(seed uint64) Sequence {
	rnd := rand.New(rand.NewPCG(seed, 0x0118))
	rg := rand.New(rand.NewPCG(seed, 0x0102))
	rk := rand.New(rand.NewPCG(seed, 0x4b45))
	rw := rand.New(rand.NewPCG(seed, 0x5748))
	rt := rand.New(rand.NewPCG(seed, 0x5452))
	s := Sequence{Seed: seed, Adopted: rnd.IntN(2) == 0,
		World: World{Units: map[string]Unit{}, Packages: map[string]Package{}, Blocks: map[string]string{}, Keys: map[string]string{}, Tree: map[string]Node{}}}
	bit := func() bool { return rnd.IntN(2) == 0 }
	for _, u := range []string{"mu0", "mu1"} {
		s.World.Units[u] = Unit{Running: bit(), Enabled: bit()}
	}
	for i := range 3 {
		p, u := fmt.Sprintf("mp%d", i), fmt.Sprintf("mpu%d", i)
		pk := Package{Brings: u, Installed: rnd.IntN(4) == 0}
		if pk.Installed {
			s.World.Units[u] = Unit{Running: bit(), Enabled: bit()}
		}
		s.World.Packages[p] = pk
	}
	modules := []string{"ma", "mb", "mc", "md"}
	// The catalogue: each module's resources, packages then services.
	catalogue := map[string][]Resource{}
	state := func() string { return []string{"running", "stopped", ""}[rnd.IntN(3)] }
	enabled := func() *bool {
		switch rnd.IntN(3) {
		case 0:
			return nil
		case 1:
			v := true
			return &v
		}
		v := false
		return &v
	}
	// One thing on the machine has one declaration: a package is in one
	// module at most, as a unit's service is.
	for _, p := range slices.Sorted(maps.Keys(s.World.Packages)) {
		if rnd.IntN(4) > 0 {
			m := modules[rnd.IntN(len(modules))]
			catalogue[m] = append(catalogue[m], Resource{Kind: "package", Module: m, ID: p, Name: p})
		}
	}
	for _, u := range []string{"mu0", "mu1", "mpu0", "mpu1", "mpu2"} {
		if rnd.IntN(5) == 0 {
			continue
		}
		m := modules[rnd.IntN(len(modules))]
		catalogue[m] = append(catalogue[m], Resource{Kind: "service", Module: m, ID: u, Name: u, State: state(), Enabled: enabled()})
	}
	// The regions, two a module at most (ra, rb; renamed, rar, rbr), so
	// that a module unassigned takes two blocks out of the file at once;
	// and the blocks a person wrote.
	regions := map[string][]*Resource{}
	version := 0
	content := func() string { version++; return fmt.Sprintf("v%d\n", version) }
	var blockNames []string
	for _, m := range modules {
		for _, id := range []string{"ra", "rb"} {
			if rg.IntN(3) == 0 {
				regions[m] = append(regions[m], &Resource{Kind: "region", Module: m, ID: id, Name: SharedFile, Content: content()})
			}
		}
		for _, id := range []string{"ra", "rb", "rar", "rbr"} {
			blockNames = append(blockNames, m+"."+id)
			if rg.IntN(4) == 0 {
				s.World.Blocks[m+"."+id] = "a person's " + m + "." + id + "\n"
			}
		}
	}
	// regionStep may change the regions' catalogue as a declaration's step
	// is taken, and says how ("" for not).
	regionStep := func() string {
		if rg.IntN(3) > 0 {
			return ""
		}
		var have []*Resource
		for _, m := range modules {
			have = append(have, regions[m]...)
		}
		if len(have) == 0 {
			return ""
		}
		r := have[rg.IntN(len(have))]
		switch rg.IntN(3) {
		case 0:
			r.Content = content()
			return fmt.Sprintf("; a new catalogue declares %s with %q", r.Key(), r.Content)
		case 1:
			id := r.ID + "r"
			if strings.HasSuffix(r.ID, "r") {
				id = strings.TrimSuffix(r.ID, "r")
			}
			if slices.ContainsFunc(regions[r.Module], func(x *Resource) bool { return x.ID == id }) {
				return ""
			}
			old := r.Key()
			r.ID = id
			return "; rename " + old + " to " + r.Key()
		}
		to := modules[rg.IntN(len(modules))]
		if slices.ContainsFunc(regions[to], func(x *Resource) bool { return x.ID == r.ID }) {
			return ""
		}
		from := r.Module
		regions[from] = slices.DeleteFunc(regions[from], func(x *Resource) bool { return x == r })
		old := r.Key()
		r.Module = to
		regions[to] = append(regions[to], r)
		return "; move " + old + " to module " + to
	}
	// The keys: which resource ("module.id") sets each, and its value.
	keyNames := []string{"Ka", "Kb", "Kc", "Kd"}
	value := func() string { return []string{"yes", "no"}[rk.IntN(2)] }
	keyBy, keyValue := map[string]string{}, map[string]string{}
	for _, k := range keyNames {
		if rk.IntN(2) == 0 {
			s.World.Keys[k] = value()
		}
		if rk.IntN(4) > 0 {
			keyBy[k], keyValue[k] = modules[rk.IntN(len(modules))]+"."+[]string{"ka", "kb"}[rk.IntN(2)], value()
		}
	}
	// The keys file declared whole, by wholeBy's module, when wholeOn.
	wholeBy, wholeOn := modules[rk.IntN(len(modules))], false
	wholeSet := map[string]string{}
	// keysStep may change the keys' catalogue as a declaration's step is
	// taken, and says how ("" for not).
	keysStep := func() string {
		if rk.IntN(3) > 0 {
			return ""
		}
		if rk.IntN(4) == 0 {
			wholeOn = !wholeOn
			if !wholeOn {
				return "; the keys file no longer declared whole by " + wholeBy
			}
			wholeSet = map[string]string{}
			for _, k := range keyNames {
				if rk.IntN(2) == 0 {
					wholeSet[k] = value()
				}
			}
			return fmt.Sprintf("; %s declares the keys file whole, holding %v", wholeBy, wholeSet)
		}
		var set []string
		for _, k := range keyNames {
			if keyBy[k] != "" {
				set = append(set, k)
			}
		}
		if len(set) == 0 {
			return ""
		}
		k := set[rk.IntN(len(set))]
		from := keyBy[k]
		m, id, _ := strings.Cut(from, ".")
		switch rk.IntN(4) {
		case 0:
			keyValue[k] = map[string]string{"yes": "no", "no": "yes"}[keyValue[k]]
			return fmt.Sprintf("; a new catalogue sets %s %s in %s", k, keyValue[k], from)
		case 1, 2:
			// The whole resource renamed, or moved to another module.
			to := m + "." + id + "r"
			if strings.HasSuffix(id, "r") {
				to = m + "." + strings.TrimSuffix(id, "r")
			}
			what := "rename"
			if rk.IntN(2) == 0 {
				to, what = modules[rk.IntN(len(modules))]+"."+id, "move"
			}
			if to == from || slices.Contains(slices.Collect(maps.Values(keyBy)), to) {
				return ""
			}
			for _, x := range keyNames {
				if keyBy[x] == from {
					keyBy[x] = to
				}
			}
			return fmt.Sprintf("; %s the keys %s to %s", what, from, to)
		}
		// One key to another resource, one there or a new one.
		to := modules[rk.IntN(len(modules))] + "." + []string{"ka", "kb", "kar", "kbr"}[rk.IntN(4)]
		if to == from {
			return ""
		}
		keyBy[k] = to
		return fmt.Sprintf("; the key %s goes from %s to %s", k, from, to)
	}
	// The shared file declared whole, by sharedBy's module, when sharedOn:
	// one block of its own, never a region's name.
	sharedBy, sharedOn, sharedContent := modules[rw.IntN(len(modules))], false, ""
	sharedStep := func() string {
		if rw.IntN(6) > 0 {
			return ""
		}
		if sharedOn = !sharedOn; !sharedOn {
			return "; the shared file no longer declared whole by " + sharedBy
		}
		sharedContent = content()
		return fmt.Sprintf("; %s declares the shared file whole, one block holding %q", sharedBy, sharedContent)
	}
	tree := newTreeCatalogue(rt, modules, &s.World)
	assigned, taken := map[string]bool{}, map[string]bool{}
	compose := func() *Declaration {
		d := &Declaration{Adopted: s.Adopted, Taken: map[string]bool{}}
		for m := range taken {
			d.Taken[m] = true
		}
		for _, kind := range []string{"package", "service"} {
			for _, m := range modules {
				if !assigned[m] {
					continue
				}
				for _, r := range catalogue[m] {
					if r.Kind == kind {
						d.Resources = append(d.Resources, r)
					}
				}
			}
		}
		if sharedOn && assigned[sharedBy] {
			// One file is declared whole or edited, not both.
			d.Resources = append(d.Resources, Resource{Kind: "file", Module: sharedBy, ID: "sw", Name: SharedFile,
				Set: map[string]string{"whole.sw": sharedContent}, Content: FileText(map[string]string{"whole.sw": sharedContent})})
		} else {
			for _, m := range modules {
				for _, r := range regions[m] {
					if assigned[m] {
						d.Resources = append(d.Resources, *r)
					}
				}
			}
		}
		byRes := map[string]map[string]string{}
		for _, k := range keyNames {
			if by := keyBy[k]; by != "" {
				if byRes[by] == nil {
					byRes[by] = map[string]string{}
				}
				byRes[by][k] = keyValue[k]
			}
		}
		if wholeOn && assigned[wholeBy] {
			// One file is declared whole or edited, not both.
			d.Resources = append(d.Resources, Resource{Kind: "file", Module: wholeBy, ID: "kw", Name: KeysFile, Set: maps.Clone(wholeSet), Content: KeysText(wholeSet)})
		} else {
			for _, key := range slices.Sorted(maps.Keys(byRes)) {
				m, id, _ := strings.Cut(key, ".")
				if assigned[m] {
					d.Resources = append(d.Resources, Resource{Kind: "keys", Module: m, ID: id, Name: KeysFile, Set: byRes[key]})
				}
			}
		}
		for _, r := range tree.declared() {
			if assigned[r.Module] {
				d.Resources = append(d.Resources, r)
			}
		}
		return d
	}
	// The first step assigns a module; later ones are drawn.
	first := modules[rnd.IntN(len(modules))]
	assigned[first] = true
	s.Steps = append(s.Steps, Step{What: "assign " + first, Decl: compose()})
	steps := 8 + rnd.IntN(7)
	for len(s.Steps) < steps {
		m := modules[rnd.IntN(len(modules))]
		var what string
		switch k := rnd.IntN(10); {
		case k < 3:
			if assigned[m] {
				what = "unassign " + m
			} else {
				what = "assign " + m
			}
			assigned[m] = !assigned[m]
		case k < 5:
			units := slices.Sorted(maps.Keys(s.World.Units))
			for _, p := range slices.Sorted(maps.Keys(s.World.Packages)) {
				units = append(units, s.World.Packages[p].Brings)
			}
			u := units[rnd.IntN(len(units))]
			ev := Event{Unit: u, FlipRunning: bit()}
			ev.FlipEnabled = !ev.FlipRunning || bit()
			what := fmt.Sprintf("the operator flips %s (running %v, enabled %v)", u, ev.FlipRunning, ev.FlipEnabled)
			if rg.IntN(2) == 0 {
				ev.Block = blockNames[rg.IntN(len(blockNames))]
				what += " and edits the block " + ev.Block + " by hand, if the file has it"
			}
			if rk.IntN(2) == 0 {
				ev.Key, ev.KeyOut = keyNames[rk.IntN(len(keyNames))], rk.IntN(3) == 0
				if ev.KeyOut {
					what += " and takes the key " + ev.Key + " out of the keys file, if it is there"
				} else {
					what += " and sets the key " + ev.Key + " to " + KeyByHand
				}
			}
			what += tree.operator(&ev)
			s.Steps = append(s.Steps, Step{What: what, Op: ev})
			continue
		case k < 6 && len(catalogue[m]) > 0:
			i := rnd.IntN(len(catalogue[m]))
			r := &catalogue[m][i]
			old := r.Key()
			if strings.HasSuffix(r.ID, "r") {
				r.ID = strings.TrimSuffix(r.ID, "r")
			} else {
				r.ID += "r"
			}
			what = "rename " + old + " to " + r.Key()
		case k < 7 && len(catalogue[m]) > 0:
			i := rnd.IntN(len(catalogue[m]))
			r := catalogue[m][i]
			to := modules[rnd.IntN(len(modules))]
			if to == m || slices.ContainsFunc(catalogue[to], func(x Resource) bool { return x.Name == r.Name }) {
				continue
			}
			catalogue[m] = slices.Delete(catalogue[m], i, i+1)
			r.Module = to
			catalogue[to] = append(catalogue[to], r)
			sort.SliceStable(catalogue[to], func(a, b int) bool {
				return catalogue[to][a].Kind == "package" && catalogue[to][b].Kind != "package"
			})
			what = "move " + m + "." + r.ID + " to module " + to
		case k < 8:
			var svcs []int
			for i, r := range catalogue[m] {
				if r.Kind == "service" {
					svcs = append(svcs, i)
				}
			}
			if len(svcs) == 0 {
				continue
			}
			r := &catalogue[m][svcs[rnd.IntN(len(svcs))]]
			r.State, r.Enabled = state(), enabled()
			what = fmt.Sprintf("a new catalogue declares %s (%s, %s)", r.Key(), r.State, enabledWord(r.Enabled))
		case k < 9 && s.Adopted:
			if taken[m] {
				continue
			}
			taken[m] = true
			what = "take " + m
		default:
			what = "apply again"
		}
		what += regionStep()
		what += keysStep()
		what += sharedStep()
		what += tree.step()
		s.Steps = append(s.Steps, Step{What: what, Decl: compose()})
	}
	return s
}

// EngineDoc is the declaration as the engine reads it (the JSON of
// docs/declaration.md): each resource with its module and id, a package by
// name, a service by unit with its state and enablement where set.
func EngineDoc(d Declaration) string {
	taken, _ := json.Marshal(append([]string{}, slices.Sorted(maps.Keys(d.Taken))...))
	if len(d.Resources) == 0 {
		return fmt.Sprintf(`{"version":1,"adopted":%v,"taken":%s,"resources":[],"owns_nothing":true}`, d.Adopted, taken)
	}
	var res []string
	for _, r := range d.Resources {
		m := map[string]any{"module": r.Module, "id": r.ID, "type": r.Kind}
		switch r.Kind {
		case "package":
			m["name"] = r.Name
		case "region":
			m["path"], m["content"] = r.Name, r.Content
		case "keys":
			m["path"], m["format"], m["set"] = r.Name, "space", r.Set
		case "file":
			m["path"], m["content"] = r.Name, r.Content
		case "directory":
			m["path"] = r.Name
		case "archive":
			sum := sha256.Sum256(ArchiveTar(r.Content))
			url := r.URL
			if !strings.Contains(url, "://") {
				url = "file://" + url
			}
			m["url"], m["sha256"], m["destination"] = url, hex.EncodeToString(sum[:]), r.Name
		default:
			m["unit"] = r.Name
			if r.State != "" {
				m["state"] = r.State
			}
			if r.Enabled != nil {
				m["enabled"] = *r.Enabled
			}
		}
		b, _ := json.Marshal(m)
		res = append(res, string(b))
	}
	return fmt.Sprintf(`{"version":1,"adopted":%v,"taken":%s,"resources":[%s]}`, d.Adopted, taken, strings.Join(res, ","))
}

// Renamed is the declaration with every resource's Name (the package or
// unit it manages, the file or directory) and URL (an archive's tar)
// passed through name; ids and modules stay, so a report
// line's "module.id" is the model's. The lab runs several sequences on one
// machine, each on packages and units of its own.
func (d Declaration) Renamed(name func(string) string) Declaration {
	c := Declaration{Adopted: d.Adopted, Taken: d.Taken, Resources: slices.Clone(d.Resources), Rescue: d.Rescue}
	for i := range c.Resources {
		c.Resources[i].Name = name(c.Resources[i].Name)
		if c.Resources[i].URL != "" {
			c.Resources[i].URL = name(c.Resources[i].URL)
		}
	}
	return c
}
