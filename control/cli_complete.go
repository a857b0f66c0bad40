package control

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// nodeArgs are the commands that take a node's name, and which of their
// positional arguments (from 0) it is: the shells complete it with the
// names the control side has (complete). A test holds it to the commands
// table, both ways, so a command that takes a node and is not here — or
// an entry whose command went — fails it.
var nodeArgs = map[string]int{
	"node revoke":   0,
	"node delete":   0,
	"node show":     0,
	"node endpoint": 0,
	"assign":        0,
	"unassign":      0,
	"publish":       0,
	"declare":       0,
	"plan":          0,
	"reports":       0,
}

// complete answers the shells' completions where only the control side
// knows (cmdline.AskCommand): at a node's place, the names of the mesh's
// nodes that begin with what is typed, asked of the control side the line
// names (its --dir, else $MESH_CONTROL_DIR, and --nats) — as kubectl
// completes a pod. declare's NODE,NODE,...: the names after the last
// comma, the ones before kept. Anywhere else it exits 1, and the shell
// offers what the definitions do (commands, flags, files). A control side
// that does not answer offers nothing, silently: completion never prints
// an error into the line.
func complete(ctx context.Context, words []string, stdout io.Writer) int {
	var o options
	i, _, arg, ok := table(&o).Place(words)
	if !ok {
		return 1
	}
	if at, takes := nodeArgs[commands[i].Name]; !takes || at != arg {
		return 1
	}
	prefix, cur := "", words[len(words)-1]
	if k := strings.LastIndexByte(cur, ','); k >= 0 {
		prefix, cur = cur[:k+1], cur[k+1:]
	}
	var names strings.Builder
	c := &cli{ctx: ctx, cmd: commands[i].Name, stdout: &names, stderr: io.Discard, dir: o.dir, nats: o.nats,
		log: commandLog(commands[i].Name, io.Discard, false)}
	if c.nodeNames() != nil {
		return 0 // a node's place all the same: no files
	}
	for _, n := range strings.Fields(names.String()) {
		if strings.HasPrefix(n, cur) {
			fmt.Fprintln(stdout, prefix+n)
		}
	}
	return 0
}

// nodeNames prints the registry's node names, a line each, and nothing
// else: what completion offers (nodes --names).
func (c *cli) nodeNames() error {
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	recs, err := cl.records(c.ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		fmt.Fprintln(c.stdout, r.Name)
	}
	return nil
}
