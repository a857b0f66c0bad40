package control

import (
	"fmt"
	"text/tabwriter"
	"time"
)

// tokenList prints every token the registry holds: whom it is for, new
// or re-enrolment, when issued and when it expires, and what it can
// still do.
func (c *cli) tokenList() error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	ts, err := cl.Tokens(c.ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	if c.json {
		vs := make([]TokenView, 0, len(ts))
		for _, t := range ts {
			vs = append(vs, t.View(now))
		}
		return c.printJSON(vs)
	}
	if len(ts) == 0 {
		fmt.Fprintln(c.stdout, "no tokens (a token's record goes a day after it expires; mesh-control token issue makes one)")
		return nil
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tFOR\tKIND\tISSUED\tEXPIRES\tSTATE")
	for _, t := range ts {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, tokenFor(t), tokenKind(t),
			t.Issued.Local().Format(time.RFC3339), t.Expires.Local().Format(time.RFC3339), tokenState(t, now))
	}
	return w.Flush()
}

// tokenFor is whom a token enrols, in a table's words.
func tokenFor(t *TokenRecord) string {
	if t.Node == "" {
		return "(its hostname)"
	}
	return t.Node
}

// tokenKind says whether a token enrols a new node or an existing one
// again.
func tokenKind(t *TokenRecord) string {
	if t.New {
		return "new"
	}
	return "re-enrolment"
}

// tokenState is what a token can still do, and since when.
func tokenState(t *TokenRecord, now time.Time) string {
	switch s := t.State(now); s {
	case TokenUsed:
		return fmt.Sprintf("used %s by %s", ago(t.Used), t.UsedBy)
	case TokenRevoked:
		return "revoked " + ago(t.Revoked)
	case TokenExpired:
		return "expired " + ago(t.Expires)
	default:
		return fmt.Sprintf("usable for %s", t.Expires.Sub(now).Round(time.Second))
	}
}

// tokenRevoke makes a token unusable now, or says why it is not.
func (c *cli) tokenRevoke(id string) error {
	id, err := TokenID(id)
	if err != nil {
		return err
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	t, already, err := cl.RevokeToken(c.ctx, id)
	if err != nil {
		return err
	}
	// Revoked already: what was asked for holds, as with node revoke —
	// exit 0, saying nothing was done and since when.
	if c.json {
		return c.printJSON(map[string]any{"id": t.ID, "revoked": t.Revoked, "already": already})
	}
	if already {
		fmt.Fprintf(c.stdout, "token %s was already revoked at %s (%s): nothing done\n", t.ID, t.Revoked.Local().Format(time.RFC3339), ago(t.Revoked))
		return nil
	}
	what := "a new node"
	switch {
	case !t.New:
		what = "node " + t.Node + " again"
	case t.Node != "":
		what = "a new node, named " + t.Node
	}
	fmt.Fprintf(c.stdout, "token %s revoked: it enrols no one, and the broker refuses its one-time credential from now on (it was for %s)\n", t.ID, what)
	if !t.New && t.Node != "" {
		fmt.Fprintf(c.stdout, "node %s stays revoked: mesh-control token issue --node %s makes another token, mesh-control node delete %s removes it\n", t.Node, t.Node, t.Node)
	}
	return nil
}
