package control

import (
	"fmt"
	"strings"
)

// nodeDelete removes a revoked node and says what went with it.
func (c *cli) nodeDelete(name string) error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	d, err := cl.DeleteNode(c.ctx, name)
	if err != nil {
		if d != nil && (len(d.Removed) > 0 || len(d.TokensRevoked) > 0 || len(d.Emptied) > 0) {
			// Cut short: what was done is said, and the record stands (it
			// goes last), so the same command finishes it.
			err = fmt.Errorf("%w (done before it stopped: %s; node %s stays, revoked: run node delete again)", err, deletedSoFar(d), name)
		}
		return err
	}
	if c.json {
		return c.printJSON(d)
	}
	fmt.Fprintf(c.stdout, "node %s deleted: the name is free (mesh-control token issue --new --name %s enrols a machine as it)\n", name, name)
	fmt.Fprintf(c.stdout, "removed from the registry: %s\n", strings.Join(d.Removed, ", "))
	fmt.Fprintf(c.stdout, "emptied: %s\n", strings.Join(d.Emptied, ", "))
	if len(d.TokensRevoked) > 0 {
		fmt.Fprintf(c.stdout, "revoked, as issued to enrol a machine as %s again: token %s\n", name, strings.Join(d.TokensRevoked, ", token "))
	}
	return nil
}

// deletedSoFar says what a delete cut short had done.
func deletedSoFar(d *NodeDeleted) string {
	var parts []string
	if len(d.TokensRevoked) > 0 {
		parts = append(parts, "revoked token "+strings.Join(d.TokensRevoked, ", "))
	}
	if len(d.Removed) > 0 {
		parts = append(parts, "removed "+strings.Join(d.Removed, ", "))
	}
	if len(d.Emptied) > 0 {
		parts = append(parts, "emptied "+strings.Join(d.Emptied, ", "))
	}
	return strings.Join(parts, "; ")
}
