package control

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
)

// overlayChangeFrom is what `overlay set` was told: only the flags given
// change anything.
func overlayChangeFrom(fs *flag.FlagSet) OverlayChange {
	var ch OverlayChange
	fs.Visit(func(f *flag.Flag) {
		v := f.Value.(flag.Getter).Get()
		switch f.Name {
		case "network":
			s := v.(string)
			ch.Network = &s
		case "interface":
			s := v.(string)
			ch.Interface = &s
		case "port":
			n := v.(int)
			ch.ListenPort = &n
		case "keepalive":
			n := v.(int)
			ch.Keepalive = &n
		}
	})
	return ch
}

// printPublished says, a line a node, what publishing did.
func (c *cli) printPublished(ps []*Published, out []*OutOfOverlayError) {
	for _, p := range ps {
		what := fmt.Sprintf("published in seq %d", p.Seq)
		switch {
		case !p.Sent && p.Seq != 0:
			what = fmt.Sprintf("unchanged since seq %d", p.Seq)
		case !p.Sent:
			what = "unchanged, being published"
		}
		mods := strings.Join(p.Modules, ", ")
		if p.Held != "" {
			mods = "assignments " + p.Held
		} else if mods == "" {
			mods = "no modules"
		}
		fmt.Fprintf(c.stdout, "%s\t%s: overlay %s, its peers the roster's; %s\n", p.Node, what, p.Address, mods)
	}
	for _, o := range out {
		fmt.Fprintf(c.stdout, "%s\tnot composed: %s\n", o.Node, o.Why)
	}
}

func (c *cli) publishedJSON(ps []*Published, out []*OutOfOverlayError) error {
	return c.printJSON(publishedValue(ps, out, nil))
}

// publishedWithReport is a Published in --json, with its node's report
// on its sequence when --wait saw one.
type publishedWithReport struct {
	*Published
	Report *SignedReport `json:"report,omitempty"`
}

// publishedValue is what was published (and not) in --json, with the
// reports --wait saw.
func publishedValue(ps []*Published, out []*OutOfOverlayError, w waited) map[string]any {
	left := map[string]string{}
	for _, o := range out {
		left[o.Node] = o.Why
	}
	with := []publishedWithReport{}
	for _, p := range ps {
		with = append(with, publishedWithReport{p, w.of(p.Node, p.Seq)})
	}
	return map[string]any{"published": with, "out_of_overlay": left}
}

// fanningOut has cl say, on a terminal only (progress), how far a fan-out
// is — "WHAT: N of M done"; a fleet's worth takes a while — and returns
// what clears the line once it is done.
func (c *cli) fanningOut(cl *Client, what string) func() {
	var last time.Time
	cl.Progress = func(done, of int) {
		if done < of && time.Since(last) < 100*time.Millisecond {
			return // a line a tenth of a second is enough to see it move
		}
		last = time.Now()
		c.progress("%s: %d of %d done", what, done, of)
	}
	return func() {
		cl.Progress = nil
		c.progress("")
	}
}

func (c *cli) overlaySet(ch OverlayChange) error {
	if err := ch.Check(); err != nil {
		return usageError("%v", err) // a flag's value: the command line's, exit 2
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	return c.overlaySetOn(cl, ch)
}

func (c *cli) overlaySetOn(cl *Client, ch OverlayChange) error {
	s, err := cl.SetOverlay(c.ctx, ch)
	if err != nil {
		return err
	}
	end := c.fanningOut(cl, "publishing to the nodes")
	ps, out, err := cl.PublishAll(c.ctx, false)
	end()
	if err != nil {
		// The settings are kept: a failure to publish them (a full disk)
		// must not read as a change refused. Serve publishes them to every
		// node once it can write (KeepComposed watches the settings).
		err = fmt.Errorf("the overlay is set (%s on %s), and was not published to every node: %w; serve publishes it once it can write, or run mesh-control publish", s.Interface, s.Network, err)
	}
	if c.json {
		if jerr := c.publishedJSON(ps, out); jerr != nil {
			return jerr
		}
		return err
	}
	fmt.Fprintf(c.stdout, "overlay: network %s, interface %s, listen port %d, keepalive %d s\n", s.Network, s.Interface, s.ListenPort, s.Keepalive)
	if r, rerr := cl.LastRoster(c.ctx); rerr == nil && r != nil {
		fmt.Fprintf(c.stdout, "roster\tseq %d: %d node(s)\n", r.Seq, len(r.Nodes))
	}
	c.printPublished(ps, out)
	return err
}

// OverlayNode is one line of `overlay show`.
type OverlayNode struct {
	Node      string `json:"node"`
	Address   string `json:"address,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	WireGuard string `json:"wireguard_key,omitempty"`
	Out       string `json:"out_of_overlay,omitempty"`
}

func (c *cli) overlayShow() error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	s, err := cl.Overlay(c.ctx)
	if err != nil {
		return err
	}
	recs, err := cl.records(c.ctx)
	if err != nil {
		return err
	}
	var nodes []OverlayNode
	for _, r := range recs {
		n := OverlayNode{Node: r.Name, Endpoint: cl.endpoint(c.ctx, r.Name)}
		n.WireGuard, n.Out = overlayKey(r)
		if a, _, ok := cl.address(c.ctx, r.Name); ok {
			n.Address = a.String()
		}
		nodes = append(nodes, n)
	}
	if c.json {
		if nodes == nil {
			nodes = []OverlayNode{}
		}
		return c.printJSON(map[string]any{"settings": s, "nodes": nodes})
	}
	fmt.Fprintf(c.stdout, "network %s, interface %s, listen port %d, keepalive %d s (set %s)\n", s.Network, s.Interface, s.ListenPort, s.Keepalive, s.Changed.Local().Format(time.RFC3339))
	if r, err := cl.LastRoster(c.ctx); err != nil {
		fmt.Fprintf(c.stdout, "roster: %v\n", err)
	} else if r != nil {
		fmt.Fprintf(c.stdout, "roster: seq %d, %d node(s), the peers every node's overlay takes\n", r.Seq, len(r.Nodes))
	} else {
		fmt.Fprintf(c.stdout, "roster: none published yet\n")
	}
	fmt.Fprintln(c.stdout)
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tADDRESS\tENDPOINT\tWIREGUARD KEY")
	for _, n := range nodes {
		key := n.WireGuard
		if n.Out != "" {
			key = "out: " + n.Out
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", n.Node, dash(n.Address), dash(n.Endpoint), key)
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *cli) nodeEndpoint(node, endpoint string) error {
	if endpoint == "none" {
		endpoint = ""
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.SetEndpoint(c.ctx, node, endpoint); err != nil {
		return err
	}
	// The endpoint is in the roster: every other node's peers.
	rp, err := cl.PublishRoster(c.ctx)
	if errors.Is(err, ErrNoOverlay) {
		err = nil
	}
	if c.json {
		// Absent rather than null or "": no endpoint (none), no roster
		// published (no overlay set).
		v := map[string]any{"node": node}
		if endpoint != "" {
			v["endpoint"] = endpoint
		}
		if rp != nil {
			v["roster"] = rp
		}
		if jerr := c.printJSON(v); jerr != nil {
			return jerr
		}
		return err
	}
	if endpoint == "" {
		fmt.Fprintf(c.stdout, "node %s has no endpoint: its peers wait for it to reach them\n", node)
	} else {
		fmt.Fprintf(c.stdout, "node %s is reached at %s\n", node, endpoint)
	}
	c.printRoster(rp)
	return err
}

// printRoster says what publishing the roster did.
func (c *cli) printRoster(rp *RosterPublished) {
	switch {
	case rp == nil:
	case rp.Sent:
		fmt.Fprintf(c.stdout, "roster\tpublished in seq %d: %d node(s), %d bytes\n", rp.Seq, rp.Nodes, rp.Bytes)
	default:
		fmt.Fprintf(c.stdout, "roster\tunchanged since seq %d: %d node(s)\n", rp.Seq, rp.Nodes)
	}
}

func (c *cli) assign(node, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := checkModuleFile(file, data); err != nil {
		return err
	}
	var seq, from uint64
	err = c.changeOne(func(cl *Client) (*Published, error) {
		p, err := cl.Assign(c.ctx, node, data, file)
		if p != nil {
			seq, from = p.Seq, p.from
		}
		return p, inFile(file, data, err)
	})
	var ee *exitError
	if c.wait > 0 && seq != 0 && errors.As(err, &ee) && ee.code == ExitRefused {
		// Refused by the node: the assignment is given back now, by
		// this command, as serve does on hearing the report.
		if back := c.giveBack(node, seq); back != "" {
			return &exitError{ExitRefused, ee.msg + "; " + back}
		}
	}
	if c.wait > 0 && err == nil && from != 0 {
		// Serve publishes a node's composition when its assignments
		// change, as this command does: the node may have refused serve's
		// (a sequence before this one's), serve given the module back,
		// and this command's composition carry the module as it was —
		// applied, while the assignment was not kept.
		if module, _, merr := ReadModule(data); merr == nil {
			if back := c.givenBackSince(node, module, from); back != "" {
				return &exitError{ExitRefused, back}
			}
		}
	}
	return err
}

// givenBackSince says, when node's assignment of module was given back
// for a refusal at or past sequence from, so ("" when it was not).
func (c *cli) givenBackSince(node, module string, from uint64) string {
	back := c.givenBack(node, nil, func(g GivenBack) bool { return g.Module == module && g.Seq >= from })
	if len(back) == 0 {
		return ""
	}
	g := back[0]
	return fmt.Sprintf("the node refused module %s: its assignment is given back (as it was before), not kept (refused at seq %d: %s)", module, g.Seq, g.Reason)
}

// giveBack takes in node's report of seq for its assignments awaiting it
// (serve may have done so already), and says what was given back ("" when
// nothing was).
func (c *cli) giveBack(node string, seq uint64) string {
	settle := func(cl *Client) {
		rs, _, err := cl.Reports(c.ctx, node, 50)
		if err != nil {
			return
		}
		for _, r := range rs {
			if r.Trigger == link.TriggerDeclaration && r.Seq == seq {
				cl.settleAssignments(c.ctx, node, &r.Report)
			}
		}
	}
	var modules []string
	for _, g := range c.givenBack(node, settle, func(g GivenBack) bool { return g.Seq == seq }) {
		modules = append(modules, g.Module)
	}
	if len(modules) == 0 {
		return ""
	}
	return fmt.Sprintf("the node refused module %s: its assignment is given back (as it was before), not kept", strings.Join(modules, ", "))
}

// givenBack is what of node's given-back assignments match says, read
// after settle (when set) has run on the same connection; none when the
// registry could not be read.
func (c *cli) givenBack(node string, settle func(*Client), match func(GivenBack) bool) []GivenBack {
	cl, err := c.connect()
	if err != nil {
		return nil
	}
	defer cl.Close()
	if settle != nil {
		settle(cl)
	}
	a, _, err := cl.assignments(c.ctx, node)
	if err != nil {
		return nil
	}
	var out []GivenBack
	for _, g := range a.GivenBack {
		if match(g) {
			out = append(out, g)
		}
	}
	return out
}

// assignPlan asks node for a plan of its composition with the module in
// file assigned, and keeps nothing: the assignments and the sequence are
// as they were.
func (c *cli) assignPlan(node, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := checkModuleFile(file, data); err != nil {
		return err
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	decl, err := cl.ComposeWith(c.ctx, node, data)
	if err != nil {
		return inFile(file, data, err)
	}
	return c.planOf(cl, node, decl, c.wait)
}

func (c *cli) unassign(node, module string) error {
	return c.changeOne(func(cl *Client) (*Published, error) { return cl.Unassign(c.ctx, node, module) })
}

// changeOne changes one node's assignments with change, and says what was
// published.
func (c *cli) changeOne(change func(*Client) (*Published, error)) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.DespiteBriefing = c.despiteBriefing
	p, err := change(cl)
	if err != nil {
		return err
	}
	if !c.json {
		c.printPublished([]*Published{p}, nil)
	}
	return c.await(cl, []nodeSeq{{p.Node, p.Seq}}, func(w waited) any {
		return publishedWithReport{p, w.of(p.Node, p.Seq)}
	})
}

// publish sends node's composition (every node's, without one) with a new
// sequence, whether or not it changed: what a person asks for explicitly.
func (c *cli) publish(nodes []string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.DespiteBriefing = c.despiteBriefing
	var ps []*Published
	var out []*OutOfOverlayError
	if len(nodes) == 0 {
		end := c.fanningOut(cl, "publishing to the nodes")
		ps, out, err = cl.PublishAll(c.ctx, true)
		end()
	} else {
		// One node named: a revoked one is refused saying how it comes
		// back, not as merely out of the overlay.
		if err := cl.refuseRevoked(c.ctx, nodes[0]); err != nil {
			return err
		}
		var p *Published
		if p, err = cl.Publish(c.ctx, nodes[0], true); err == nil {
			ps = append(ps, p)
		}
	}
	if err != nil {
		if c.json && ps != nil {
			if jerr := c.publishedJSON(ps, out); jerr != nil {
				return jerr
			}
		} else if !c.json {
			c.printPublished(ps, out)
		}
		return err
	}
	if !c.json {
		c.printPublished(ps, out)
	}
	var want []nodeSeq
	for _, p := range ps {
		if p.Sent {
			want = append(want, nodeSeq{p.Node, p.Seq})
		}
	}
	return c.await(cl, want, func(w waited) any { return publishedValue(ps, out, w) })
}
