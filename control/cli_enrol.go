package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

func (c *cli) tokenIssue(isNew bool, node, name string, ttl time.Duration, brokerURL string) error {
	switch {
	case isNew && node != "":
		return usageError("--new and --node are two kinds of token: give one, --new (a machine the mesh has not seen) or --node NAME (this machine is that node again)")
	case !isNew && node == "":
		return usageError("say which: --new (a machine the mesh has not seen) or --node NAME (this machine is that node again)")
	case node != "" && name != "":
		return usageError("--name goes with --new; a --node token keeps the node's name")
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	if node != "" {
		name = node
	}
	text, rec, err := cl.IssueToken(c.ctx, name, isNew, ttl, brokerURL)
	if err != nil {
		return err
	}
	if c.json {
		superseded := rec.Superseded
		if superseded == nil {
			superseded = []string{}
		}
		return c.printJSON(map[string]any{"token": text, "id": rec.ID, "node": rec.Node, "new": rec.New, "expires": rec.Expires, "superseded": superseded})
	}
	fmt.Fprintln(c.stdout, text)
	what := "a new node"
	if rec.Node != "" && rec.New {
		what = "a new node, named " + rec.Node
	} else if !rec.New {
		what = "node " + rec.Node + " again (its previous identity is revoked now)"
	}
	fmt.Fprintf(c.stderr, "\nThis token enrols %s, once, until %s (it is not shown again).\n"+
		"Carry it by hand to the machine and run there, as root:\n    mesh-executor enrol    # then paste it\n",
		what, rec.Expires.Local().Format(time.RFC3339))
	if n := len(rec.Superseded); n > 0 {
		// A token mailed earlier and forgotten enrols no one now: said, so
		// the person who carries it learns why it is refused.
		fmt.Fprintf(c.stderr, "It replaces %d earlier token(s) for %s, unused and revoked now: %s.\n", n, rec.Node, strings.Join(rec.Superseded, ", "))
	}
	return nil
}

func (c *cli) nodeRevoke(name string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	rec, already, err := cl.Revoke(c.ctx, name, "mesh-control node revoke")
	if err != nil {
		return err
	}
	// Revoking a revoked node exits 0, saying that nothing was done and
	// since when it is revoked: what was asked for holds, as with
	// `kubectl cordon` of a cordoned node ("already cordoned", exit 0).
	// A runbook for a lost machine, run again or by a second person,
	// then goes on to its next step rather than stopping on an error,
	// and the person reads that someone (or a token issued --node)
	// revoked it before. An unknown node is an error (exit 1).
	if c.json {
		return c.printJSON(map[string]any{"node": name, "revoked": rec.Revoked, "already": already})
	}
	if already {
		when := "at an unrecorded time"
		if !rec.Revoked.IsZero() {
			when = "at " + rec.Revoked.Local().Format(time.RFC3339) + " (" + ago(rec.Revoked) + ")"
		}
		fmt.Fprintf(c.stdout, "node %s was already revoked %s: nothing done; `token issue --node %s` enrols a machine as it again\n", name, when, name)
		return nil
	}
	fmt.Fprintf(c.stdout, "node %s revoked: the broker refuses its credential from now on; `token issue --node %s` enrols a machine as it again\n", name, name)
	return nil
}

// NodeView is `mesh-control node show`.
type NodeView struct {
	Record *NodeRecord `json:"record"`
	Status *NodeStatus `json:"status,omitempty"`
	// Profile and Inventory as the node last reported them; ProfileAt
	// zero means never reported (distinct from an empty report).
	ProfileAt time.Time       `json:"profile_at,omitzero"`
	Profile   json.RawMessage `json:"profile,omitempty"`
	Inventory json.RawMessage `json:"inventory,omitempty"`
	// Owned is the control side's copy of what the node last reported
	// it owns (handed back after a lost store).
	Owned *ownedCopy `json:"owned,omitempty"`
}

// ShowNode gathers a node's record, status, profile and inventory.
func (cl *Client) ShowNode(ctx context.Context, name string) (*NodeView, error) {
	rec, _, err := cl.Node(ctx, name)
	if err != nil {
		return nil, err
	}
	v := &NodeView{Record: rec}
	if all, err := cl.Nodes(ctx); err == nil {
		for _, s := range all {
			if s.Name == name {
				v.Status = s
			}
		}
	}
	v.Owned = cl.lastOwned(ctx, name)
	var kp keptProfile
	if cl.getJSON(ctx, "profile."+name, &kp) {
		v.ProfileAt, v.Profile, v.Inventory = kp.At, kp.Profile, kp.Inventory
	}
	return v, nil
}

func (c *cli) nodeShow(name string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	v, err := cl.ShowNode(c.ctx, name)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(v)
	}
	r := v.Record
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "node\t%s\n", r.Name)
	switch {
	case !r.Revoked.IsZero():
		fmt.Fprintf(w, "identity\trevoked %s (%s)\n", r.Revoked.Local().Format(time.RFC3339), ago(r.Revoked))
	case !r.Enrolled.IsZero():
		fmt.Fprintf(w, "identity\tenrolment %s, granted %s by token %s\n", r.Enrolment, r.Enrolled.Local().Format(time.RFC3339), r.Token)
	default:
		fmt.Fprintf(w, "identity\tenrolment %s, registered by hand %s\n", r.Enrolment, r.Created.Local().Format(time.RFC3339))
	}
	if r.NKey != "" {
		fmt.Fprintf(w, "agent nkey\t%s\n", r.NKey)
	}
	if r.Keys != nil {
		fmt.Fprintf(w, "executor keys\tidentity %s, sealing %s, wireguard %s\n", wire.KeyIDOf(r.Keys.Identity), wire.KeyIDOf(r.Keys.Sealing), r.Keys.WireGuard)
	}
	if v.Owned != nil {
		fmt.Fprintf(w, "owns\t%d thing(s), as reported at seq %d (%s); handed back on re-enrolment after a lost store\n", len(v.Owned.Entries), v.Owned.Seq, ago(v.Owned.Reported))
	}
	if s := v.Status; s != nil {
		fmt.Fprintf(w, "state\t%s, last heard %s\n", s.State, ago(s.LastHeard))
		if s.ClockSkewMS != 0 {
			fmt.Fprintf(w, "clock\t%s (at its last heartbeat)\n", SkewText(s.ClockSkewMS))
		}
		ex := executorSaid(s)
		if s.ExecutorError != "" && s.ExecutorVersion == "" && s.ExecutorHalted == "" {
			ex += " by its agent, at its last heartbeat: " + s.ExecutorError + " (mesh-executor doctor there says why)"
		}
		fmt.Fprintf(w, "executor\t%s\n", ex)
		if s.Heartbeat != nil && s.Heartbeat.AgentVersion != "" {
			fmt.Fprintf(w, "agent\t%s (%s)\n", s.Heartbeat.AgentVersion, dash(s.Heartbeat.AgentBuild))
		}
		fmt.Fprintf(w, "sequences\tdeclared %d, applied %d; last outcome %s\n", s.Declared, s.Applied, outcomeSaid(s))
		if s.Address != "" || s.Assignments != "" {
			fmt.Fprintf(w, "overlay\taddress %s; assignments %s\n", dash(s.Address), dash(s.Assignments))
		}
		if t := s.TwoAgents; t != nil {
			fmt.Fprintf(w, "two agents\tlinked as this node, found %s: their heartbeats alternate between the links of %s and %s — a machine copied with its state, or a second agent started with its identity; both apply and report, and share its overlay key. Find the copy (its inventory below is whichever spoke last), stop its agent and executor, move their state directories aside and enrol it with a token of its own (docs/operations.md, \"A copied machine\")\n",
				ago(t.Seen), t.Links[0], t.Links[1])
		}
	}
	w.Flush()
	if v.ProfileAt.IsZero() {
		fmt.Fprintln(c.stdout, "\nprofile: never reported")
		return nil
	}
	var prof struct {
		Capabilities []struct {
			Name    string `json:"name"`
			Present bool   `json:"present"`
			Detail  string `json:"detail"`
			Reason  string `json:"reason"`
		} `json:"capabilities"`
	}
	json.Unmarshal(v.Profile, &prof)
	fmt.Fprintf(c.stdout, "\nprofile (reported %s):\n", ago(v.ProfileAt))
	if len(prof.Capabilities) == 0 {
		fmt.Fprintln(c.stdout, "  (reported, and empty: the node found no capability)")
	}
	w = tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	for _, cp := range prof.Capabilities {
		if cp.Present {
			fmt.Fprintf(w, "  %s\tpresent\t%s\n", cp.Name, cp.Detail)
		} else {
			fmt.Fprintf(w, "  %s\tabsent\t%s\n", cp.Name, cp.Reason)
		}
	}
	w.Flush()
	var inv map[string]any
	dec := json.NewDecoder(bytes.NewReader(v.Inventory))
	dec.UseNumber() // memory_bytes as 25275990016, not 2.5275990016e+10
	if dec.Decode(&inv) == nil && len(inv) > 0 {
		fmt.Fprintln(c.stdout, "\ninventory:")
		for _, k := range []string{"hostname", "machine_id", "arch", "kernel", "os_release", "memory_bytes", "cpus", "host_version", "holds"} {
			if x, ok := inv[k]; ok {
				fmt.Fprintf(c.stdout, "  %-13s %v\n", k+":", strings.TrimSpace(fmt.Sprint(x)))
			}
		}
	}
	return nil
}
