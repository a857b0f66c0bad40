package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// statusNamesShown is how many names `status` prints in a group before
// "and N more" (its --json lists them all).
const statusNamesShown = 10

// nodeGroup is some of the nodes: how many, and their names, sorted.
type nodeGroup struct {
	Count int      `json:"count"`
	Names []string `json:"names"`
}

func (g *nodeGroup) add(name string) { g.Count++; g.Names = append(g.Names, name) }

// text is the group's names for a person: up to statusNamesShown of them,
// then "and N more".
func (g *nodeGroup) text() string {
	if g.Count == 0 {
		return ""
	}
	if len(g.Names) <= statusNamesShown {
		return strings.Join(g.Names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(g.Names[:statusNamesShown], ", "), len(g.Names)-statusNamesShown)
}

// stateGroup is the nodes in one state, as `nodes` shows it, and the one
// of them last heard longest ago.
type stateGroup struct {
	State string `json:"state"`
	nodeGroup
	// Episodic is how many of them are apps, linked only while they run.
	Episodic int `json:"episodic,omitempty"`
	// OldestHeard is the earliest last heard among them, and OldestNode
	// the node it is; absent when none of them was heard.
	OldestHeard time.Time `json:"oldest_heard,omitzero"`
	OldestNode  string    `json:"oldest_node,omitempty"`
}

// versionCount is how many nodes run one version and build.
type versionCount struct {
	Version string `json:"version"`
	Build   string `json:"build,omitempty"`
	Count   int    `json:"count"`
}

func (v versionCount) text() string {
	s := dash(v.Version)
	if v.Build != "" {
		s += " (" + v.Build + ")"
	}
	return fmt.Sprintf("%s: %d", s, v.Count)
}

// fleetStatus is `mesh-control status`: the fleet at a glance, from the
// view `nodes` prints (Client.Nodes), and the control side itself.
type fleetStatus struct {
	Broker struct {
		URL       string `json:"url,omitempty"`
		Reachable bool   `json:"reachable"`
		// Error is why this command did not reach it (Reachable false).
		Error string `json:"error,omitempty"`
		// OperatorMode: a broker of the operator's own in NATS operator
		// mode (broker-config --resolver), each node in an account of
		// its own that serve pushes to it.
		OperatorMode bool `json:"operator_mode,omitempty"`
	} `json:"broker"`
	// Store is the broker's JetStream store as serve says it: Answered
	// false when nobody answered (no serve, or a broker of the
	// operator's own, whose store is its own to watch).
	Store struct {
		Answered bool   `json:"answered"`
		DiskFull bool   `json:"disk_full"`
		Problem  string `json:"problem,omitempty"`
	} `json:"store"`
	Registry struct {
		Answered bool   `json:"answered"`
		Error    string `json:"error,omitempty"`
	} `json:"registry"`
	Total  int           `json:"total"`
	States []*stateGroup `json:"states"`
	// Failed and Held are the nodes whose last report has a failed (held)
	// line, or whose briefing has a failed (kept) one.
	Failed nodeGroup `json:"failed"`
	Held   nodeGroup `json:"held"`
	// ExecutorUnreachable are the nodes whose agent said, at its last
	// heartbeat, that it could not reach its executor (or the launcher
	// halted it): linked, and applying nothing.
	ExecutorUnreachable nodeGroup `json:"executor_unreachable"`
	// RotationPending are the nodes whose executor, at its last
	// heartbeat, held a control key other than the one signed with now.
	RotationPending nodeGroup `json:"rotation_pending"`
	// NothingDeclared are the nodes enrolled again whose newest
	// declaration went to the enrolment before (NothingDeclaredSince):
	// their executor holds nothing the link declared, a drift is left.
	NothingDeclared  nodeGroup      `json:"nothing_declared"`
	ExecutorVersions []versionCount `json:"executor_versions"`
	AgentVersions    []versionCount `json:"agent_versions"`
	Overlay          struct {
		Set       bool   `json:"set"`
		Network   string `json:"network,omitempty"`
		Interface string `json:"interface,omitempty"`
		Error     string `json:"error,omitempty"`
		// Addressed is how many nodes have an overlay address; Applied how
		// many last reported the overlay's line applied or unchanged.
		Addressed int `json:"addressed"`
		Applied   int `json:"applied"`
	} `json:"overlay"`
}

// statusStates are the states `status` always shows, 0 or not, in this
// order; any other a node says follows them.
var statusStates = []string{link.StateEnrolled, link.StateDisconnected, StateRevoked, StateNeverHeard}

// tally fills the node part of s from the view `nodes` prints: each node
// counted in the state it shows there.
func (s *fleetStatus) tally(ns []*NodeStatus) {
	byState := map[string]*stateGroup{}
	for _, st := range statusStates {
		byState[st] = &stateGroup{State: st, nodeGroup: nodeGroup{Names: []string{}}}
	}
	ex, ag := map[versionCount]int{}, map[versionCount]int{}
	ns = slices.Clone(ns)
	slices.SortFunc(ns, func(a, b *NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	s.Failed.Names, s.Held.Names, s.RotationPending.Names, s.NothingDeclared.Names = []string{}, []string{}, []string{}, []string{}
	s.ExecutorUnreachable.Names = []string{}
	for _, n := range ns {
		s.Total++
		g := byState[n.State]
		if g == nil {
			g = &stateGroup{State: n.State, nodeGroup: nodeGroup{Names: []string{}}}
			byState[n.State] = g
		}
		g.add(n.Name)
		if n.Presence == link.PresenceEpisodic {
			g.Episodic++
		}
		if !n.LastHeard.IsZero() && (g.OldestHeard.IsZero() || n.LastHeard.Before(g.OldestHeard)) {
			g.OldestHeard, g.OldestNode = n.LastHeard, n.Name
		}
		failed, held := linesOf(n)
		if failed {
			s.Failed.add(n.Name)
		}
		if held {
			s.Held.add(n.Name)
		}
		if (n.ExecutorError != "" || n.ExecutorHalted != "") && n.State != StateRevoked {
			s.ExecutorUnreachable.add(n.Name)
		}
		if n.RotationPending && n.State != StateRevoked {
			s.RotationPending.add(n.Name)
		}
		if n.NothingDeclaredSince > 0 {
			s.NothingDeclared.add(n.Name)
		}
		if n.Address != "" {
			s.Overlay.Addressed++
		}
		if overlayApplied(n.LastReport) {
			s.Overlay.Applied++
		}
		if n.State == StateRevoked {
			continue // it runs nothing the mesh reaches any more
		}
		if n.ExecutorVersion != "" || n.ExecutorBuild != "" {
			ex[versionCount{Version: n.ExecutorVersion, Build: n.ExecutorBuild}]++
		}
		if hb := n.Heartbeat; hb != nil && (hb.AgentVersion != "" || hb.AgentBuild != "") {
			ag[versionCount{Version: hb.AgentVersion, Build: hb.AgentBuild}]++
		}
	}
	for _, st := range statusStates {
		s.States = append(s.States, byState[st])
		delete(byState, st)
	}
	var others []*stateGroup
	for _, g := range byState {
		others = append(others, g)
	}
	slices.SortFunc(others, func(a, b *stateGroup) int { return strings.Compare(a.State, b.State) })
	s.States = append(s.States, others...)
	s.ExecutorVersions, s.AgentVersions = versionList(ex), versionList(ag)
}

// linesOf says whether the node's last report has a failed line (a held
// one), or its briefing a failed finding (a kept one).
func linesOf(n *NodeStatus) (failed, held bool) {
	if r := n.LastReport; r != nil {
		for _, l := range r.Lines {
			switch l.Outcome {
			case shapes.Failed:
				failed = true
			case shapes.Held, shapes.HeldChanged:
				held = true
			}
		}
	}
	if b := n.Briefing; b != nil {
		for _, f := range b.Findings {
			switch f.Mark {
			case shapes.MarkFailed:
				failed = true
			case shapes.MarkKept:
				held = true
			}
		}
	}
	return failed, held
}

// overlayApplied says whether a report's overlay line says the node holds
// the overlay (a plan's does not: it changed nothing).
func overlayApplied(r *link.Report) bool {
	if r == nil || r.Trigger == link.TriggerPlan {
		return false
	}
	for _, l := range r.Lines {
		if l.Module == OverlayModule && l.ID == OverlayID {
			return l.Outcome != shapes.Failed
		}
	}
	return false
}

// versionList is counts, the most used first.
func versionList(m map[versionCount]int) []versionCount {
	out := []versionCount{}
	for v, n := range m {
		v.Count = n
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b versionCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Version, b.Version), strings.Compare(a.Build, b.Build))
	})
	return out
}

// readFleet reads the fleet at a glance over cl: the broker, serve's
// word on its store, the registry's nodes tallied as `nodes` shows them,
// and the overlay. `status` prints it and the status page shows it, so
// that the two cannot say different things of one fleet; the nodes come
// back too, for the page's table. The error is the registry's alone
// (status fails on it, the page says it): what the nodes say, the store
// or the overlay are part of the status, not failures of reading it.
func readFleet(ctx context.Context, cl *Client) (*fleetStatus, []*NodeStatus, error) {
	s := &fleetStatus{}
	s.Broker.URL, s.Broker.Reachable = cl.NC.ConnectedUrlRedacted(), true
	s.Broker.OperatorMode = cl.Keys.Operator != nil
	s.Store.Answered, s.Store.Problem = askStore(ctx, cl.NC)
	// DiskFullError's own words, as serve answers them.
	s.Store.DiskFull = strings.Contains(s.Store.Problem, " is full (")
	ns, rerr := cl.Nodes(ctx)
	s.Registry.Answered = rerr == nil
	if rerr != nil {
		s.Registry.Error = rerr.Error()
		rerr = fmt.Errorf("the registry's nodes were not read: %w", rerr)
	}
	s.tally(ns)
	o, oerr := cl.Overlay(ctx)
	switch {
	case oerr == nil:
		s.Overlay.Set, s.Overlay.Network, s.Overlay.Interface = true, o.Network, o.Interface
	case !errors.Is(oerr, ErrNoOverlay):
		s.Overlay.Error = oerr.Error()
	}
	return s, ns, rerr
}

// status prints the fleet at a glance. The control side not read (no
// keys, no broker, the registry not listed) fails it; what the nodes say
// does not.
func (c *cli) status() error {
	cl, err := c.connect()
	if err != nil {
		if k, kerr := LoadKeys(c.dir); kerr == nil && c.json {
			// A control side whose broker this command does not reach:
			// said in the one value a script reads, reachable false.
			s := &fleetStatus{}
			s.Broker.URL, s.Broker.Error = cmp.Or(c.nats, k.BrokerURL), err.Error()
			s.Registry.Error = "not read: the broker was not reached"
			s.tally(nil)
			if jerr := c.printJSON(s); jerr != nil {
				return jerr
			}
		}
		return err
	}
	defer cl.Close()
	s, _, rerr := readFleet(c.ctx, cl)
	if c.json {
		if err := c.printJSON(s); err != nil {
			return err
		}
	} else {
		printParts(c.stdout, s.parts())
	}
	return rerr
}

// stateLabel is a state as status heads it: "enrolled" is what a linked
// agent says of itself.
func stateLabel(st string) string {
	if st == link.StateEnrolled {
		return "enrolled (linked at its last word)"
	}
	return st
}

// statusRow is one line of the status as a person reads it: what it is
// about and what it says. Class is "bad" for what wants a look now and
// "note" for what may (a held line, a store nobody answered for), as the
// page's style names them; the text says the same in words.
type statusRow struct {
	Head, Value, Class string
}

// statusPart is a group of rows under an optional title; Indent and Width
// are how the text lays out its heads (the page has a table for that).
type statusPart struct {
	Title  string
	Indent string
	Width  int
	Rows   []statusRow
}

// parts is the status in the words both `status` and the status page
// say it, one group of lines at a time. When the registry was not read it
// ends there: the rest would be counts of nothing.
func (s *fleetStatus) parts() []statusPart {
	broker := s.Broker.URL + ", reachable"
	if s.Broker.OperatorMode {
		broker += ", in NATS operator mode (an account per node)"
	}
	control := statusPart{Width: 10, Rows: []statusRow{{Head: "broker:", Value: broker}}}
	switch {
	case strings.Contains(s.Store.Problem, " was opened anew at "):
		// ReopenedError's own words: it takes writes again; a command in
		// the seconds after may have failed.
		control.Rows = append(control.Rows, statusRow{"store:", "takes writes again: " + s.Store.Problem, "note"})
	case s.Store.Problem != "":
		control.Rows = append(control.Rows, statusRow{"store:", "cannot write: " + s.Store.Problem, "bad"})
	case s.Store.Answered:
		control.Rows = append(control.Rows, statusRow{"store:", "takes writes", ""})
	default:
		control.Rows = append(control.Rows, statusRow{"store:", "no answer from serve (not running, or a broker of your own: its store is yours to watch)", "note"})
	}
	if !s.Registry.Answered {
		control.Rows = append(control.Rows, statusRow{"registry:", "not read: " + s.Registry.Error, "bad"})
		return []statusPart{control}
	}
	control.Rows = append(control.Rows, statusRow{"registry:", fmt.Sprintf("read, %d node(s)", s.Total), ""})

	states := statusPart{Title: "nodes by state (as mesh-control nodes shows them):", Indent: "  ", Width: 36}
	for _, g := range s.States {
		value := fmt.Sprint(g.Count)
		if g.Count > 0 {
			value += "  " + g.text()
		}
		if g.Episodic > 0 {
			value += fmt.Sprintf(" (%d episodic)", g.Episodic)
		}
		states.Rows = append(states.Rows, statusRow{Head: stateLabel(g.State), Value: value})
		if g.OldestNode != "" && g.State != StateRevoked {
			which := "last heard longest ago"
			if g.Count == 1 {
				which = "last heard"
			}
			states.Rows = append(states.Rows, statusRow{Value: fmt.Sprintf("%s: %s, %s (%s)", which, g.OldestNode, g.OldestHeard.Local().Format(time.RFC3339), ago(g.OldestHeard))})
		}
	}

	fleet := statusPart{Width: 42}
	for _, l := range []struct {
		head, class string
		g           *nodeGroup
	}{{"a failed line (last report or briefing)", "bad", &s.Failed}, {"a held line (last report or briefing)", "note", &s.Held},
		{"its executor unreachable by its agent", "bad", &s.ExecutorUnreachable},
		{"a control key rotation not taken yet", "note", &s.RotationPending},
		{"nothing declared to its enrolment (declare to it again)", "bad", &s.NothingDeclared}} {
		row := statusRow{Head: l.head + ":", Value: fmt.Sprint(l.g.Count)}
		if l.g.Count > 0 {
			row.Value += "  " + l.g.text()
			row.Class = l.class
		}
		fleet.Rows = append(fleet.Rows, row)
	}
	for _, v := range []struct {
		head string
		vs   []versionCount
	}{{"executor versions", s.ExecutorVersions}, {"agent versions", s.AgentVersions}} {
		var parts []string
		for _, x := range v.vs {
			parts = append(parts, x.text())
		}
		if len(parts) == 0 {
			parts = []string{"none reported"}
		}
		fleet.Rows = append(fleet.Rows, statusRow{Head: v.head + " (nodes not revoked):", Value: strings.Join(parts, ", ")})
	}
	overlay := statusRow{Head: "overlay:"}
	switch {
	case s.Overlay.Set:
		overlay.Value = fmt.Sprintf("%s on %s; %d node(s) addressed, %d last reported it applied", s.Overlay.Network, s.Overlay.Interface, s.Overlay.Addressed, s.Overlay.Applied)
	case s.Overlay.Error != "":
		overlay.Value, overlay.Class = "not read: "+s.Overlay.Error, "bad"
	default:
		overlay.Value = "not set (mesh-control overlay set)"
	}
	fleet.Rows = append(fleet.Rows, overlay)
	return []statusPart{control, states, fleet}
}

// printParts writes the status as text: each part after a blank line,
// its title, then its rows with their heads in a column.
func printParts(w io.Writer, parts []statusPart) {
	for i, p := range parts {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if p.Title != "" {
			fmt.Fprintln(w, p.Title)
		}
		for _, r := range p.Rows {
			fmt.Fprintf(w, "%s%-*s %s\n", p.Indent, p.Width, r.Head, r.Value)
		}
	}
}
