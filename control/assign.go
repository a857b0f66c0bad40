package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A node's declaration is composed, never written whole by a person: the
// overlay first (overlay.go), then the modules assigned to the node
// (`mesh-control assign NODE FILE`, KV assign.<n>) in the order they were
// assigned. Two things hold the assignments back, and while they are held
// a node is told nothing new — only its overlay is kept current, because
// the overlay is the way back in:
//
//   - the node has not yet reported its overlay applied, in this
//     enrolment (KV joined.<n>). So a new node's first declaration is the
//     overlay and nothing else: reachable first, useful after. A node
//     that was declared before (`declare`, before the mesh had an
//     overlay) keeps what it was last declared meanwhile.
//   - its adoption briefing has a failed line, until a later briefing
//     resolves it (or a person assigns --despite-briefing, to push the
//     fix).
//
// "Nothing new" is exact: a held node's composition is the last
// declaration on its subject for its enrolment, with its overlay replaced
// by the current one — so a held node is never stripped of what it runs.
//
// What was last published for a node is kept (KV composed.<n>) with the
// digest of its composition, so republishing is idempotent: the same
// composition is not sent twice however many processes notice a change,
// and a composition that changes is sent once more by whoever saw it.
// `mesh-control serve` notices (KeepComposed); the commands that change a
// composition publish it themselves too.

func assignKey(node string) string   { return "assign." + node }
func joinedKey(node string) string   { return "joined." + node }
func composedKey(node string) string { return "composed." + node }

// Assignment is one module assigned to a node.
type Assignment struct {
	Module string `json:"module"`
	// File is where the person assigned it from (for them; never read
	// again).
	File      string            `json:"file,omitempty"`
	Resources []json.RawMessage `json:"resources"`
	Assigned  time.Time         `json:"assigned"`
	// PendingFrom, while the node has not yet answered a composition
	// carrying this assignment, is the first sequence that can carry it:
	// a refusal by the node of such a composition, naming the module,
	// gives the assignment back (settleAssignments); the node's taking one
	// keeps it (PendingFrom cleared). Previous is the module as it was
	// assigned before, put back then (none: the module is taken off).
	PendingFrom uint64      `json:"pending_from,omitempty"`
	Previous    *Assignment `json:"previous,omitempty"`
}

type assignments struct {
	Modules []Assignment `json:"modules"`
	// GivenBack are the newest assignments the node refused and that were
	// given back (at most maxGivenBack): what `nodes` and `assign` say.
	GivenBack []GivenBack `json:"given_back,omitempty"`
}

// GivenBack is an assignment given back because the node refused it.
type GivenBack struct {
	Module string    `json:"module"`
	Seq    uint64    `json:"seq"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

const maxGivenBack = 5

// pending says whether any assignment awaits the node's answer.
func (a *assignments) pending() bool {
	for _, m := range a.Modules {
		if m.PendingFrom != 0 {
			return true
		}
	}
	return false
}

// joinedRecord says the node reported its overlay applied in an enrolment
// (KV joined.<n>): from then on, its assignments go out.
type joinedRecord struct {
	Enrolment string    `json:"enrolment"`
	Seq       uint64    `json:"seq"`
	At        time.Time `json:"at"`
}

// composedRecord is what was last published for a node (KV composed.<n>).
// Seq 0 is a claim being published.
type composedRecord struct {
	Enrolment string    `json:"enrolment"`
	Digest    string    `json:"digest"`
	Seq       uint64    `json:"seq,omitempty"`
	Claimed   time.Time `json:"claimed"`
	Modules   []string  `json:"modules,omitempty"`
	Held      string    `json:"held,omitempty"`
	// Carried is each module the composition carries, with the digest of
	// its resources (moduleDigest): a node's taking this sequence keeps
	// an assignment awaiting its answer only if the assignment is what
	// was carried (settleAssignments).
	Carried map[string]string `json:"carried,omitempty"`
}

// carried says whether the composition recorded carried assignment m as
// it is now. A record written before compositions said what each module
// carried (no Carried) answers by the module's name.
func (p *composedRecord) carried(m Assignment) bool {
	switch {
	case p.Seq == 0:
		return false
	case p.Carried == nil:
		return slices.Contains(p.Modules, m.Module)
	}
	return p.Carried[m.Module] == moduleDigest(m.Resources)
}

// moduleDigest identifies a module's resources as assigned, so that what
// a composition carried can be told from what is assigned now.
func moduleDigest(resources []json.RawMessage) string {
	b, _ := json.Marshal(resources)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// ModuleFileError is ReadModule's refusal of a module file. Resource
// ("#N", the Nth from 0, or "module.id"; "" for the file itself) and
// Field name what in the file is refused, so the refusal can be placed in
// it (mesh-control says FILE:LINE:COLUMN).
type ModuleFileError struct {
	Resource, Field string
	Reason          string
}

func (e *ModuleFileError) Error() string { return "module file: " + e.Reason }

// ReadModule reads a module file: a declaration body whose resources all
// name one module, which is the module's name. Only "version" (1) and
// "resources" may be set: node, enrolment and sequence are set when it is
// composed, and adoption, owns_nothing and retire are the node's, not a
// module's. Sealed content is refused: it is bound to one sequence, and a
// module goes out again at every composition (seal with `declare --seal`).
func ReadModule(data []byte) (string, []json.RawMessage, error) {
	if len(data) > shapes.MaxDeclarationSize {
		return "", nil, fmt.Errorf("over %d bytes", shapes.MaxDeclarationSize)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return "", nil, fmt.Errorf("module file: %w", err)
	}
	for k, v := range top {
		switch k {
		case "version":
			if string(bytes.TrimSpace(v)) != "1" {
				return "", nil, &ModuleFileError{Field: k, Reason: fmt.Sprintf("version %s; this control side composes version 1", v)}
			}
		case "resources":
		default:
			return "", nil, &ModuleFileError{Field: k, Reason: fmt.Sprintf("field %q: a module is its resources (node, enrolment and seq are set when it is composed; adopted, taken, owns_nothing and retire are the node's)", k)}
		}
	}
	var resources []json.RawMessage
	if err := json.Unmarshal(top["resources"], &resources); err != nil || len(resources) == 0 {
		return "", nil, &ModuleFileError{Field: "resources", Reason: "no resources"}
	}
	module := ""
	for i, r := range resources {
		var head shapes.Base
		json.Unmarshal(r, &head)
		switch {
		case i == 0:
			module = head.Module
		case head.Module != module:
			return "", nil, &ModuleFileError{Resource: fmt.Sprintf("#%d", i), Field: "module", Reason: fmt.Sprintf("resource %d is of module %q, the first of %q; a file is one module", i, head.Module, module)}
		}
	}
	if module == OverlayModule {
		return "", nil, &ModuleFileError{Resource: "#0", Field: "module", Reason: fmt.Sprintf("module %q is the overlay's, composed by the control side", OverlayModule)}
	}
	probe, _ := json.Marshal(map[string]any{"version": 1, "node": "probe", "enrolment": "probe", "seq": 1, "resources": resources})
	d, err := shapes.Parse(probe)
	if err != nil {
		return "", nil, err
	}
	for _, r := range d.Resources {
		if f, ok := r.(*shapes.File); ok && f.Sealed != nil {
			return "", nil, &ModuleFileError{Resource: f.Key(), Field: "sealed", Reason: fmt.Sprintf("%s has sealed content, which is bound to one sequence; a module goes out at every composition (declare --seal)", f.Key())}
		}
	}
	return module, resources, nil
}

// AssignedModules is, of nodes, those with modules assigned, and the
// modules' names in order: one read of the registry for any number of
// nodes (one key for one node).
func (c *Client) AssignedModules(ctx context.Context, nodes []string) (map[string][]string, error) {
	out := map[string][]string{}
	add := func(n string, a *assignments) {
		for _, m := range a.Modules {
			out[n] = append(out[n], m.Module)
		}
	}
	if len(nodes) == 1 {
		// One node's key, not the fleet's listing.
		a, _, err := c.assignments(ctx, nodes[0])
		if err != nil {
			return nil, err
		}
		add(nodes[0], a)
		return out, nil
	}
	vals, err := c.values(ctx, "assign.*")
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		var a assignments
		if v, ok := vals[assignKey(n)]; ok && json.Unmarshal(v, &a) == nil {
			add(n, &a)
		}
	}
	return out, nil
}

// Assignments lists the modules assigned to node, in order.
func (c *Client) Assignments(ctx context.Context, node string) ([]Assignment, error) {
	a, _, err := c.assignments(ctx, node)
	return a.Modules, err
}

func (c *Client) assignments(ctx context.Context, node string) (*assignments, uint64, error) {
	e, err := c.KV.Get(ctx, assignKey(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &assignments{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("registry: assignments of %s: %w", node, err)
	}
	var a assignments
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return nil, 0, fmt.Errorf("registry: assignments of %s: %w", node, err)
	}
	return &a, e.Revision(), nil
}

// changeAssignments applies change to node's assignments with
// compare-and-set. The result, composed after the overlay, must parse as a
// link declaration (two modules managing one path are refused here, not
// by the node).
func (c *Client) changeAssignments(ctx context.Context, node string, change func(*assignments) error) error {
	s, err := c.Overlay(ctx)
	if err != nil {
		return fmt.Errorf("%w: a node's first declaration is the overlay, so nothing is assigned before there is one", err)
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return err
	}
	ov, err := c.overlayOf(ctx, s, rec)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 100; attempt++ {
		a, rev, err := c.assignments(ctx, node)
		if err != nil {
			return err
		}
		if err := change(a); err != nil {
			return err
		}
		raw, _ := json.Marshal(ov)
		all := []json.RawMessage{raw}
		for _, m := range a.Modules {
			all = append(all, m.Resources...)
		}
		if err := checkResources(all); err != nil {
			return fmt.Errorf("composed with the overlay and the other modules: %w", err)
		}
		data, _ := json.Marshal(a)
		if rev == 0 {
			_, err = c.KV.Create(ctx, assignKey(node), data)
		} else {
			_, err = c.KV.Update(ctx, assignKey(node), data, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("registry: assignments of %s: %w", node, err)
		}
	}
	return fmt.Errorf("registry: the assignments of %s kept changing", node)
}

// Assign assigns the module in data (a module file, ReadModule) to node —
// in place if the module is assigned already, otherwise after the others —
// and publishes the node's composition. While the node's assignments are
// held (Published.Held says why), it is recorded and goes out once the
// hold ends; with DespiteBriefing a failed briefing does not hold it. A
// revoked node is assigned nothing (a *RevokedError).
func (c *Client) Assign(ctx context.Context, node string, data []byte, file string) (*Published, error) {
	module, resources, err := ReadModule(data)
	if err != nil {
		return nil, err
	}
	if err := c.refuseRevoked(ctx, node); err != nil {
		return nil, err
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return nil, err
	}
	if err := c.checkProfile(ctx, node, module, resources); err != nil {
		return nil, err
	}
	from := max(rec.NextSeq, 1)
	if err := c.recordAssignment(ctx, node, module, resources, file, from); err != nil {
		return nil, err
	}
	p, err := c.Publish(ctx, node, false)
	if p != nil {
		p.from = from
	}
	return p, err
}

// recordAssignment assigns module to node (in place, or after the
// others), awaiting the node's answer from sequence from on.
func (c *Client) recordAssignment(ctx context.Context, node, module string, resources []json.RawMessage, file string, from uint64) error {
	return c.changeAssignments(ctx, node, func(a *assignments) error {
		m := Assignment{Module: module, File: file, Resources: resources, Assigned: time.Now().UTC(), PendingFrom: from}
		for i := range a.Modules {
			if a.Modules[i].Module == module {
				prev := a.Modules[i]
				if moduleDigest(prev.Resources) == moduleDigest(resources) {
					// The same resources again: nothing new for the
					// node to answer (no composition changes), so it
					// awaits what it awaited.
					m.PendingFrom, m.Previous = prev.PendingFrom, prev.Previous
					a.Modules[i] = m
					return nil
				}
				if prev.PendingFrom != 0 && prev.Previous != nil {
					prev = *prev.Previous // still unanswered: what the node last took
				}
				if prev.PendingFrom == 0 {
					prev.Previous = nil
					m.Previous = &prev
				}
				a.Modules[i] = m
				return nil
			}
		}
		a.Modules = append(a.Modules, m)
		return nil
	})
}

// Unassign takes module off node and publishes the node's composition
// (where the node runs it, the next composition undeclares it).
func (c *Client) Unassign(ctx context.Context, node, module string) (*Published, error) {
	if err := c.changeAssignments(ctx, node, func(a *assignments) error {
		for i := range a.Modules {
			if a.Modules[i].Module == module {
				a.Modules = append(a.Modules[:i], a.Modules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("module %q is not assigned to %s", module, node)
	}); err != nil {
		return nil, err
	}
	return c.Publish(ctx, node, false)
}

// Composition is a node's declaration as composed now.
type Composition struct {
	Node      string
	Enrolment string
	// Decl is the declaration without node, enrolment and seq (Declare
	// sets them).
	Decl map[string]json.RawMessage
	// Overlay is the overlay resource, first of the resources.
	Overlay *shapes.Overlay
	// Modules are the assigned modules it carries; none while Held.
	Modules []string
	// Carried is each of Modules with the digest of its resources.
	Carried map[string]string
	// Held says why the assignments are held ("" when they are not).
	Held   string
	Digest string
}

// failedBriefing returns the first failed line of node's briefing
// ("module.id: detail"), or "" when its briefing has none.
func (c *Client) failedBriefing(ctx context.Context, node string) string {
	b := c.Briefing(ctx, node)
	if b == nil || b.Outcome != shapes.MarkFailed {
		return ""
	}
	for _, f := range b.Findings {
		if f.Mark == shapes.MarkFailed {
			return fmt.Sprintf("%s.%s: %s", f.Module, f.ID, f.Detail)
		}
	}
	return "a line marked failed"
}

// holdOf says why rec's assignments are held now, "" when they are not.
// despite lets a failed briefing through (not a missing overlay: that is
// the first thing a node needs).
func (c *Client) holdOf(ctx context.Context, rec *NodeRecord, despite bool) string {
	var j joinedRecord
	if !c.getJSON(ctx, joinedKey(rec.Name), &j) || j.Enrolment != rec.Enrolment {
		var p composedRecord
		if c.getJSON(ctx, composedKey(rec.Name), &p) && p.Enrolment == rec.Enrolment && p.Seq != 0 {
			return fmt.Sprintf("held until the node reports its overlay applied (published in seq %d)", p.Seq)
		}
		return "held until the node reports its overlay applied"
	}
	if why := c.failedBriefing(ctx, rec.Name); why != "" && !despite {
		return "held: briefing failed (" + why + ")"
	}
	return ""
}

// Compose composes node's declaration now: its overlay, then its
// assignments — or, while they are held, what it was last declared.
func (c *Client) Compose(ctx context.Context, node string) (*Composition, error) {
	s, err := c.Overlay(ctx)
	if err != nil {
		return nil, err
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return nil, err
	}
	ov, err := c.overlayOf(ctx, s, rec)
	if err != nil {
		return nil, err
	}
	comp := &Composition{Node: node, Enrolment: rec.Enrolment, Overlay: ov, Decl: map[string]json.RawMessage{}}
	raw, _ := json.Marshal(ov)
	resources := []json.RawMessage{raw}
	comp.Held = c.holdOf(ctx, rec, c.DespiteBriefing)
	if comp.Held == "" {
		a, _, err := c.assignments(ctx, node)
		if err != nil {
			return nil, err
		}
		comp.Carried = map[string]string{}
		for _, m := range a.Modules {
			resources = append(resources, m.Resources...)
			comp.Modules = append(comp.Modules, m.Module)
			comp.Carried[m.Module] = moduleDigest(m.Resources)
		}
	} else {
		last, err := c.lastDeclared(ctx, rec)
		if err != nil {
			return nil, err
		}
		for k, v := range last {
			comp.Decl[k] = v
		}
		var kept []json.RawMessage
		json.Unmarshal(last["resources"], &kept)
		resources = append(resources, kept...)
	}
	comp.Decl["version"] = json.RawMessage("1")
	comp.Decl["resources"], _ = json.Marshal(resources)
	body, _ := json.Marshal(comp.Decl)
	sum := sha256.Sum256(body)
	comp.Digest = hex.EncodeToString(sum[:])
	// The roster's floor is left out of the digest: it follows every
	// roster published, and a node joining or leaving is one roster
	// published, not a declaration to every node. A composition sent for
	// another reason carries the floor of its moment.
	if floor := c.rosterFloor(ctx); floor != 0 && c.nodeAccepts(ctx, node, shapes.AcceptsRosterMin) {
		floored := *ov
		floored.RosterMin = floor
		comp.Overlay = &floored
		resources[0], _ = json.Marshal(&floored)
		comp.Decl["resources"], _ = json.Marshal(resources)
	}
	return comp, nil
}

// nodeAccepts says whether node's executor reads field (shapes.Accepts),
// as its profile last said (at enrolment, and whenever it changes, as on
// an upgrade). A node that said nothing reads only what every release
// reads.
func (c *Client) nodeAccepts(ctx context.Context, node, field string) bool {
	var kp keptProfile
	if !c.getJSON(ctx, "profile."+node, &kp) || len(kp.Profile) == 0 {
		return false
	}
	var prof struct {
		Accepts []string `json:"accepts"`
	}
	return json.Unmarshal(kp.Profile, &prof) == nil && slices.Contains(prof.Accepts, field)
}

// ComposeWith is node's composition as it would be with the module in data
// assigned (in place, or after the others), as a declaration body for a
// plan: nothing is kept. A hold is not applied: the plan shows what the
// node would be told once it ends.
func (c *Client) ComposeWith(ctx context.Context, node string, data []byte) ([]byte, error) {
	module, resources, err := ReadModule(data)
	if err != nil {
		return nil, err
	}
	if err := c.checkProfile(ctx, node, module, resources); err != nil {
		return nil, err
	}
	s, err := c.Overlay(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: a node's first declaration is the overlay, so nothing is assigned before there is one", err)
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil {
		return nil, err
	}
	ov, err := c.overlayOf(ctx, s, rec)
	if err != nil {
		return nil, err
	}
	a, _, err := c.assignments(ctx, node)
	if err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(ov)
	all, placed := []json.RawMessage{raw}, false
	for _, m := range a.Modules {
		if m.Module == module {
			all, placed = append(all, resources...), true
			continue
		}
		all = append(all, m.Resources...)
	}
	if !placed {
		all = append(all, resources...)
	}
	if err := checkResources(all); err != nil {
		return nil, fmt.Errorf("composed with the overlay and the other modules: %w", err)
	}
	body, _ := json.Marshal(map[string]any{"version": 1, "resources": all})
	return body, nil
}

// lastDeclared is the last declaration on rec's subject for its current
// enrolment, as top-level fields, without node, enrolment, seq, its
// overlay resource, owns_nothing and retire — what a held node keeps. It
// is empty for a node never declared to in this enrolment (a new one).
func (c *Client) lastDeclared(ctx context.Context, rec *NodeRecord) (map[string]json.RawMessage, error) {
	last, err := c.lastOnSubject(ctx, rec.Name)
	if last == nil || err != nil {
		return nil, err
	}
	var enrolment string
	json.Unmarshal(last["enrolment"], &enrolment)
	if enrolment != rec.Enrolment {
		return nil, nil
	}
	var resources, kept []json.RawMessage
	json.Unmarshal(last["resources"], &resources)
	for _, r := range resources {
		var head shapes.Base
		if json.Unmarshal(r, &head) == nil && head.Module == OverlayModule && head.ID == OverlayID {
			continue
		}
		kept = append(kept, r)
	}
	for _, k := range []string{"node", "enrolment", "seq", "owns_nothing", "retire", "version"} {
		delete(last, k)
	}
	last["resources"], _ = json.Marshal(kept)
	return last, nil
}

// lastOnSubject is the newest declaration on node's subject, whatever
// enrolment it was addressed to, as top-level fields (nil: none).
func (c *Client) lastOnSubject(ctx context.Context, node string) (map[string]json.RawMessage, error) {
	stream, err := c.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		return nil, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, link.SubjectsOf(node).Decl)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the last declaration of %s: %w", node, err)
	}
	payload, err := wire.Open(c.Keys.ControlPublic(), wire.PurposeDeclaration, m.Data)
	if err != nil {
		return nil, fmt.Errorf("the last declaration of %s does not open: %w", node, err)
	}
	var last map[string]json.RawMessage
	if err := json.Unmarshal(payload, &last); err != nil {
		return nil, fmt.Errorf("the last declaration of %s: %w", node, err)
	}
	return last, nil
}

// Published says what Publish did for a node.
type Published struct {
	Node string `json:"node"`
	// Seq is the sequence that carries the composition; Sent says this
	// call published it (otherwise the node was sent exactly this
	// composition before, and Seq is 0 while another process is still
	// publishing it).
	Seq     uint64   `json:"seq,omitempty"`
	Sent    bool     `json:"sent"`
	Modules []string `json:"modules"`
	Held    string   `json:"held,omitempty"`
	Address string   `json:"address"`
	// from, for an assignment, is the first sequence that may carry it
	// (its PendingFrom): a refusal at or past it gives it back, whichever
	// process published the composition refused.
	from uint64
}

// claimStale is how long a claim to publish (a composedRecord with Seq 0)
// keeps others from publishing the same composition: a process that died
// between claiming and publishing holds nothing after it.
const claimStale = time.Minute

// claimWait is how long Publish waits for another process's claim on the
// same composition to land (a declare: milliseconds) before it says the
// composition is being published, with no sequence.
const claimWait = 10 * time.Second

// Publish composes node's declaration and publishes it, unless force is
// false and node was last sent exactly this composition (for its current
// enrolment). Several processes may publish at once: each claims with
// compare-and-set before it publishes, and one that finds it was overtaken
// while publishing publishes the current composition again, so the newest
// sequence always carries the newest composition.
func (c *Client) Publish(ctx context.Context, node string, force bool) (*Published, error) {
	// Another process publishing exactly this composition (serve's
	// publisher, told of the same assignment) is waited for, a few
	// seconds at most, so that the sequence it lands in is the one said
	// and waited on (assign --wait): without it the loser of the claim
	// said "being published" with no sequence, and waited for none.
	waitClaim := time.Now().Add(claimWait)
	for attempt := 0; attempt < 10; attempt++ {
		comp, err := c.Compose(ctx, node)
		if err != nil {
			return nil, err
		}
		out := &Published{Node: node, Modules: comp.Modules, Held: comp.Held, Address: comp.Overlay.Address}
		if out.Modules == nil {
			out.Modules = []string{}
		}
		var prev composedRecord
		e, err := c.KV.Get(ctx, composedKey(node))
		var rev uint64
		if err == nil {
			rev = e.Revision()
			json.Unmarshal(e.Value(), &prev)
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("registry: %w", err)
		}
		if !force && prev.Enrolment == comp.Enrolment && prev.Digest == comp.Digest &&
			(prev.Seq != 0 || time.Since(prev.Claimed) < claimStale) {
			if prev.Seq == 0 && time.Now().Before(waitClaim) {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
				attempt-- // a wait, not an attempt
				continue
			}
			out.Seq = prev.Seq
			return out, nil
		}
		claim := composedRecord{Enrolment: comp.Enrolment, Digest: comp.Digest, Claimed: time.Now().UTC(), Modules: comp.Modules, Held: comp.Held, Carried: comp.Carried}
		data, _ := json.Marshal(&claim)
		var claimRev uint64
		if rev == 0 {
			claimRev, err = c.KV.Create(ctx, composedKey(node), data)
		} else {
			claimRev, err = c.KV.Update(ctx, composedKey(node), data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // another publisher: compose again
		}
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		body, _ := json.Marshal(comp.Decl)
		// The composition has applied the briefing's hold already; sealed
		// content is never composed.
		signer := *c
		signer.DespiteBriefing, signer.Seals = true, nil
		seq, err := signer.Declare(ctx, node, body)
		if err != nil {
			// Let the next attempt, by anyone, publish it.
			c.KV.Delete(context.Background(), composedKey(node), jetstream.LastRevision(claimRev))
			return nil, fmt.Errorf("publishing the composition of %s: %w", node, err)
		}
		out.Seq, out.Sent, claim.Seq = seq, true, seq
		data, _ = json.Marshal(&claim)
		if _, err := c.KV.Update(ctx, composedKey(node), data, claimRev); err == nil {
			return out, nil
		}
		// Overtaken while publishing: if the other publisher's sequence is
		// older than ours, ours may carry an older view; send the current
		// one again.
		var now composedRecord
		if c.getJSON(ctx, composedKey(node), &now) && now.Seq > seq {
			return out, nil
		}
		force = true
	}
	return nil, fmt.Errorf("publishing the composition of %s: it kept changing", node)
}

// PublishAll's window of nodes published at once (flight): each publish
// is a handful of registry round trips and one broker publish, so with
// one at a time a fleet's worth takes N times their latency. It starts at
// 16 and opens or closes with the broker's answers.
const (
	publishFirst = 16
	publishLeast = 4
	publishMost  = 256
)

// PublishAll publishes the mesh's roster, then every node's composition
// (force as in Publish), many at a time (flight). Nodes out of the
// overlay are left out and named in out.
func (c *Client) PublishAll(ctx context.Context, force bool) (done []*Published, out []*OutOfOverlayError, err error) {
	if _, err := c.PublishRoster(ctx); err != nil {
		return nil, nil, err
	}
	recs, err := c.records(ctx)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.Name
	}
	return c.publishNodes(ctx, names, force)
}

// publishNodes publishes each of nodes (Publish), many at a time
// (flight), and gives back what it did in nodes' order.
func (c *Client) publishNodes(ctx context.Context, nodes []string, force bool) (published []*Published, out []*OutOfOverlayError, err error) {
	type result struct {
		p   *Published
		err error
	}
	res := make([]result, len(nodes))
	for i, err := range newFlight(publishFirst, publishLeast, publishMost).fly(ctx, len(nodes), func(i int) (err error) {
		res[i].p, err = c.Publish(ctx, nodes[i], force)
		return err
	}, c.Progress) {
		res[i].err = err
	}
	var errs []error
	for _, r := range res {
		var oe *OutOfOverlayError
		switch {
		case errors.As(r.err, &oe):
			out = append(out, oe)
		case r.err != nil:
			errs = append(errs, r.err)
		default:
			published = append(published, r.p)
		}
	}
	return published, out, errors.Join(errs...)
}

// noteReport takes in a node's last report (KV report.<n>, written by the
// recorder only for a report signed by the node for its current
// enrolment): the first time in an enrolment that its overlay line is
// applied, unchanged or repaired, the node has joined and its assignments
// may go out. It reports whether the node joined now.
func (c *Client) noteReport(ctx context.Context, node string, data []byte) bool {
	var r link.Report
	if json.Unmarshal(data, &r) != nil || r.Node != node {
		return false
	}
	ok := false
	for _, l := range r.Lines {
		if l.Module == OverlayModule && l.ID == OverlayID && l.Type == shapes.TypeOverlay {
			ok = l.Outcome == shapes.Applied || l.Outcome == shapes.Unchanged || l.Outcome == shapes.Repaired
		}
	}
	if !ok {
		return false
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil || rec.Enrolment != r.Enrolment {
		return false
	}
	var j joinedRecord
	e, err := c.KV.Get(ctx, joinedKey(node))
	if err == nil && json.Unmarshal(e.Value(), &j) == nil && j.Enrolment == r.Enrolment {
		return false
	}
	data, _ = json.Marshal(&joinedRecord{Enrolment: r.Enrolment, Seq: r.Seq, At: time.Now().UTC()})
	if err == nil {
		_, err = c.KV.Update(ctx, joinedKey(node), data, e.Revision())
	} else {
		_, err = c.KV.Create(ctx, joinedKey(node), data)
	}
	if err != nil {
		return false // another process took it in
	}
	c.log.Info("the node reported its overlay applied: its assignments go out", "node", node, "seq", r.Seq)
	return true
}

// errNoChange ends a changeAssignments that finds nothing to change.
var errNoChange = errors.New("nothing to change")

// settleAssignments takes in a node's report for the assignments that
// await its answer: a composition it took (any outcome but refused or
// superseded) that carried an assignment as it is now keeps the
// assignment; one it refused at or past an assignment's PendingFrom,
// naming an awaiting module's resource, gives that assignment back — the
// module as it was before, or none — and says so (GivenBack, the log).
// Without it, a module the node refuses (a path in its protected set)
// stays assigned, and every later composition is refused until someone
// unassigns it by hand. It returns the modules given back.
//
// What a sequence carried is what the publisher recorded with it
// (composed.<node>): a sequence number alone does not say it, as another
// process (serve, told of the previous change) may publish a composition
// without the assignment after the assignment chose its PendingFrom, and
// the node's taking that one is no answer to it. A report of a sequence
// other than the one recorded decides nothing; the one recorded is
// reported, or is recorded after its report came (KeepComposed settles
// then).
func (c *Client) settleAssignments(ctx context.Context, node string, r *link.Report) []string {
	if r.Outcome == shapes.Superseded || r.Node != node {
		return nil
	}
	var pub composedRecord
	if !c.getJSON(ctx, composedKey(node), &pub) || pub.Seq != r.Seq {
		pub = composedRecord{}
	}
	var back []string
	err := c.changeAssignments(ctx, node, func(a *assignments) error {
		back = nil
		changed := false
		kept := a.Modules[:0:0]
		for _, m := range a.Modules {
			switch {
			case m.PendingFrom == 0 || r.Seq < m.PendingFrom:
			case r.Outcome != shapes.Refused:
				if !pub.carried(m) {
					break // not an answer to this assignment
				}
				m.PendingFrom, m.Previous, changed = 0, nil, true
			case strings.Contains(r.Refused, "resource "+m.Module+"."):
				back, changed = append(back, m.Module), true
				a.GivenBack = append(a.GivenBack, GivenBack{Module: m.Module, Seq: r.Seq, Reason: r.Refused, At: time.Now().UTC()})
				if m.Previous == nil {
					continue
				}
				m = *m.Previous
			}
			kept = append(kept, m)
		}
		if !changed {
			return errNoChange
		}
		if n := len(a.GivenBack); n > maxGivenBack {
			a.GivenBack = a.GivenBack[n-maxGivenBack:]
		}
		a.Modules = kept
		return nil
	})
	if err != nil {
		if !errors.Is(err, errNoChange) && ctx.Err() == nil {
			c.log.Error("the node's answer to its assignments was not taken in", "node", node, "seq", r.Seq, "err", err)
		}
		return nil
	}
	for _, m := range back {
		c.log.Warn("the node refused a module; its assignment is given back", "node", node, "module", m, "seq", r.Seq, "reason", r.Refused)
	}
	return back
}

// afterEnrol publishes, once enrolment has made node's queue, the roster
// (the node's key is new in it) and then its first composition — again if
// the one published for it (by the composer, which watches the node's
// record) went before the queue was emptied, and not twice if it landed
// in the new queue. No other node's declaration changes: their peers are
// the roster's.
// It runs apart, so the grant is not kept waiting.
//
// A mesh with no overlay composes nothing: a node re-enrolled there (a
// rekey, a machine enrolled again with its store) is declared instead
// what it was last declared (carried, read before its queue was emptied),
// addressed to its new enrolment. Its executor reconciles only a
// declaration addressed to the enrolment it holds (the trust rule), so
// without it the machine would be held to nothing — a drift left as it
// is — until someone declared to it again.
func (c *Client) afterEnrol(ctx context.Context, node string, carried *carriedDecl) {
	go func() {
		if _, err := c.PublishRoster(ctx); err != nil && !errors.Is(err, ErrNoOverlay) && ctx.Err() == nil {
			c.log.Error("the roster after an enrolment was not published", "node", node, "err", err)
		}
		_, err := c.publishFirst(ctx, node)
		switch {
		case errors.Is(err, ErrNoOverlay):
			c.declareCarried(ctx, node, carried)
		case err != nil && ctx.Err() == nil:
			c.log.Error("the first composition of a new node was not published", "node", node, "err", err)
		}
	}()
}

// publishFirst publishes node's composition into the queue its enrolment
// made afresh: not again when the composition is there already, again
// when the one published went with the old queue.
func (c *Client) publishFirst(ctx context.Context, node string) (*Published, error) {
	p, err := c.Publish(ctx, node, false)
	if err == nil && !p.Sent && !c.inQueue(ctx, node, p.Seq) {
		p, err = c.Publish(ctx, node, true)
	}
	return p, err
}

// inQueue says whether node's queue holds the declaration of sequence seq
// or a later one (0: none was published).
func (c *Client) inQueue(ctx context.Context, node string, seq uint64) bool {
	last, err := c.lastOnSubject(ctx, node)
	if err != nil || last == nil || seq == 0 {
		return false
	}
	var at uint64
	return json.Unmarshal(last["seq"], &at) == nil && at >= seq
}

// carriedDecl is what a node being enrolled again was last declared, as
// read before enrolment empties its queue: the declaration's fields but
// node, enrolment and seq, or why it is not declared again (why).
type carriedDecl struct {
	fields    map[string]json.RawMessage
	seq       uint64
	enrolment string
	why       string
}

// carryDeclaration reads node's last declaration before its queue is
// emptied. One that retires the node is not carried (the machine is
// enrolled again to be used), nor one holding sealed content: it is
// sealed to the keys the enrolment replaces, and the control side keeps
// no plaintext to seal again — the operator declares it again.
func (c *Client) carryDeclaration(ctx context.Context, node string) *carriedDecl {
	last, err := c.lastOnSubject(ctx, node)
	if err != nil {
		return &carriedDecl{why: err.Error()}
	}
	if last == nil {
		return nil
	}
	cd := &carriedDecl{fields: last}
	json.Unmarshal(last["seq"], &cd.seq)
	json.Unmarshal(last["enrolment"], &cd.enrolment)
	var head struct {
		Retire    bool `json:"retire"`
		Resources []struct {
			Module string           `json:"module"`
			ID     string           `json:"id"`
			Sealed *json.RawMessage `json:"sealed"`
		} `json:"resources"`
	}
	json.Unmarshal(last["retire"], &head.Retire)
	json.Unmarshal(last["resources"], &head.Resources)
	if head.Retire {
		return nil
	}
	for _, r := range head.Resources {
		if r.Sealed != nil {
			cd.fields, cd.why = nil, fmt.Sprintf("it holds sealed content (%s.%s), sealed to the keys this enrolment replaced", r.Module, r.ID)
			return cd
		}
	}
	for _, k := range []string{"node", "enrolment", "seq"} {
		delete(cd.fields, k)
	}
	return cd
}

// declareCarried declares to node, enrolled again, what it was last
// declared (carryDeclaration), or says why it is not.
func (c *Client) declareCarried(ctx context.Context, node string, cd *carriedDecl) {
	if cd == nil {
		return
	}
	if cd.fields == nil {
		c.log.Warn("a node enrolled again was not declared its last declaration; until it is declared to again (mesh-control declare NODE FILE), its executor holds nothing it was declared",
			"node", node, "seq", cd.seq, "enrolment", cd.enrolment, "why", cd.why)
		return
	}
	// Someone declared to the new enrolment already (its queue was
	// emptied at enrolment): theirs is the newer word.
	if last, err := c.lastOnSubject(ctx, node); err == nil && last != nil {
		c.log.Info("a node enrolled again was declared to before its last declaration could be carried; not carried", "node", node, "from_seq", cd.seq)
		return
	}
	if beforeCarry != nil {
		beforeCarry(node)
	}
	// Published only on a subject still empty: a declare landing between
	// the look above and the publish took a sequence first or after, and
	// either way is the newer word (the broker checks: emptyOnly).
	rec, rev, err := c.Node(ctx, node)
	var seq uint64
	if err == nil {
		var b *shapes.Briefing
		if b, err = c.briefing(ctx, node); err == nil {
			m := maps.Clone(cd.fields)
			seq, err = c.declare(ctx, rec, rev, b, m, &lastOnSubject{emptyOnly: true}, false)
		}
	}
	if errors.Is(err, errNotCarried) {
		c.log.Info("a node enrolled again was declared to before its last declaration could be carried; not carried", "node", node, "from_seq", cd.seq)
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("a node enrolled again was not declared its last declaration; declare to it again (mesh-control declare NODE FILE)",
				"node", node, "seq", cd.seq, "err", err)
		}
		return
	}
	c.log.Info("a node enrolled again was declared its last declaration, addressed to its new enrolment", "node", node, "seq", seq, "from_seq", cd.seq, "from_enrolment", cd.enrolment)
}

// beforeCarry, when set (by a test), runs between declareCarried's look
// at the node's subject and its declare: where another's declare lands.
var beforeCarry func(node string)

// overlayFace is what of a node record its peers' compositions depend on.
func overlayFace(r *NodeRecord) string {
	key, out := overlayKey(r)
	return r.Enrolment + "|" + key + "|" + out
}

// KeepComposed keeps the roster and every node's published composition
// equal to what they compose now, until ctx ends: it watches the registry
// and publishes (only what changed, see Publish and PublishRoster) the
// roster when a node's enrolment, key or revocation or an endpoint
// changes; every node when the overlay's settings change; a node when its
// own record, assignments or briefing change or when it reports its
// overlay applied for the first time. A node joining or leaving is one
// roster published, not N declarations. At start it publishes what
// changed while no one watched. A node being enrolled may be published to
// here before enrolment has made its queue afresh, and that declaration
// emptied with the old queue: afterEnrol, which runs once the queue is
// made, publishes to it again whatever this one did.
func (c *Client) KeepComposed(ctx context.Context) error {
	w, err := c.KV.WatchFiltered(ctx, []string{"node.*", overlaySettingsKey, "endpoint.*", "report.*", "briefing.*", "assign.*", "composed.*"})
	if err != nil {
		return fmt.Errorf("watching the registry: %w", err)
	}
	defer w.Stop()
	faces := map[string]string{}
	// pending: the nodes with an assignment awaiting their answer, from
	// the watch itself, so a report costs a read more only for them.
	pending := map[string]bool{}
	all, roster, dirty := false, false, map[string]bool{}
	mark := func(e jetstream.KeyValueEntry) {
		kind, node, _ := strings.Cut(e.Key(), ".")
		put := e.Operation() == jetstream.KeyValuePut
		switch kind {
		case "node":
			var r NodeRecord
			if !put || json.Unmarshal(e.Value(), &r) != nil {
				delete(faces, node)
				roster = true
				return
			}
			if face := overlayFace(&r); faces[node] != face {
				faces[node], roster, dirty[node] = face, true, true
			}
		case "overlay":
			all, roster = true, true
		case "endpoint":
			roster = true
		case "report":
			if put && c.noteReport(ctx, node, e.Value()) {
				dirty[node] = true
			}
			var r link.Report
			if put && pending[node] && json.Unmarshal(e.Value(), &r) == nil {
				c.settleAssignments(ctx, node, &r) // its change comes back through the watch
			}
		case "assign":
			var a assignments
			pending[node] = put && json.Unmarshal(e.Value(), &a) == nil && a.pending()
			dirty[node] = true
		case "briefing":
			dirty[node] = true
		case "composed":
			// A sequence recorded after the node reported it: the
			// report is an answer now (settleAssignments).
			var p composedRecord
			var r link.Report
			if put && pending[node] && json.Unmarshal(e.Value(), &p) == nil && p.Seq != 0 &&
				c.getJSON(ctx, "report."+node, &r) && r.Seq == p.Seq {
				c.settleAssignments(ctx, node, &r)
			}
		}
	}
	flush := func() {
		defer func() { all, roster, dirty = false, false, map[string]bool{} }()
		if _, err := c.Overlay(ctx); err != nil {
			return
		}
		if roster {
			if _, err := c.PublishRoster(ctx); err != nil && ctx.Err() == nil {
				c.log.Error("the roster was not published", "err", err)
			}
		}
		if all {
			for n := range faces {
				dirty[n] = true
			}
		}
		nodes := make([]string, 0, len(dirty))
		for n := range dirty {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		if _, _, err := c.publishNodes(ctx, nodes, false); err != nil && ctx.Err() == nil {
			c.log.Error("compositions were not published", "err", err)
		}
	}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the registry watch ended")
			}
			if e == nil {
				initial, all, roster = false, true, true
				flush()
				continue
			}
			mark(e)
			if initial {
				continue
			}
			coalesce(w, 50*time.Millisecond, mark)
			flush()
		}
	}
}

// coalesce takes in, with fold, what else a watch delivers within window:
// changes that arrive together are acted on as one.
func coalesce(w jetstream.KeyWatcher, window time.Duration, fold func(jetstream.KeyValueEntry)) {
	deadline := time.After(window)
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok || e == nil {
				return
			}
			fold(e)
		case <-deadline:
			return
		}
	}
}

// AssignmentState is what `nodes` says of a node's assignments: its
// modules, or why it is assigned nothing.
func (c *Client) AssignmentState(ctx context.Context, rec *NodeRecord) (address, state string) {
	a, _, err := c.assignments(ctx, rec.Name)
	if err != nil {
		return "", err.Error()
	}
	var names []string
	for _, m := range a.Modules {
		names = append(names, m.Module)
	}
	if _, err := c.Overlay(ctx); err != nil {
		if len(names) > 0 {
			return "", "held: no overlay set"
		}
		return "", ""
	}
	if _, out := overlayKey(rec); out != "" {
		return "", "out of the overlay: " + out
	}
	if addr, _, ok := c.address(ctx, rec.Name); ok {
		address = addr.String()
	}
	if held := c.holdOf(ctx, rec, false); held != "" {
		return address, held
	}
	state = strings.Join(names, ", ")
	if len(names) == 0 {
		state = "none"
	}
	if n := len(a.GivenBack); n > 0 {
		// Said until the next assignment.
		g, since := a.GivenBack[n-1], true
		for _, m := range a.Modules {
			since = since && m.Assigned.Before(g.At)
		}
		if since {
			state += fmt.Sprintf("; %s given back (refused at seq %d)", g.Module, g.Seq)
		}
	}
	return address, state
}
