package control

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// nodeArgs are the commands that take a node's name, and which of their
// positional arguments (from 0) it is: bash completes it with the names
// the control side has (nodes --names). A test holds it to the commands
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

// bashCompletion is mesh-control's bash completion: cmdline's, made from
// the commands table (commands, subcommands, each command's flags; files
// by readline's default), and over it the names of the mesh's nodes where
// a command takes one, asked of the control side the command line names
// (its --dir and --nats) — as kubectl completes a pod. A control side
// that does not answer (none here, no key directory readable) completes
// nothing, silently: completion never prints an error into the line.
func bashCompletion() string {
	var b strings.Builder
	b.WriteString(Program().Bash())
	var cases []string
	for name, i := range nodeArgs {
		cases = append(cases, fmt.Sprintf("\t%q) arg=%d ;;\n", name, i))
	}
	slices.Sort(cases)
	fmt.Fprintf(&b, `# The names of the mesh's nodes where a command takes one: asked of the
# control side that --dir and --nats on the line name (nodes --names). The
# line is read as typed, split at white space: COMP_WORDS splits a URL at
# its colons.
_mesh_control_nodes() {
	local line=${COMP_LINE:0:COMP_POINT} words n first=2 arg=-1 pos=0 i w dir= nats=
	read -ra words <<<"$line"
	if [[ $line == *[[:space:]] ]]; then words+=(""); fi
	n=${#words[@]}
	local cur=${words[n - 1]}
	case "${words[1]}" in
	%s) first=3 ;;
	esac
	case "${words[*]:1:first-1}" in
%s	esac
	# Which positional argument is being typed: flags and their values are
	# not counted.
	for ((i = first; i < n - 1; i++)); do
		w=${words[i]}
		case "$w" in
		-dir=* | --dir=*) dir=${w#*=} ;;
		-nats=* | --nats=*) nats=${w#*=} ;;
		-*=*) ;;
		%s) ;;
		-*)
			case "$w" in
			-dir | --dir) dir=${words[i + 1]} ;;
			-nats | --nats) nats=${words[i + 1]} ;;
			esac
			i=$((i + 1))
			;;
		*) pos=$((pos + 1)) ;;
		esac
	done
	if [ "$arg" -ne "$pos" ] || [[ $cur == -* ]]; then
		_mesh_control
		return
	fi
	# A node's place: names, never files.
	compopt +o default 2>/dev/null
	local prog=${words[0]} names prefix=
	prog=${prog/#\~/$HOME}
	names=$("$prog" nodes --names ${dir:+--dir "$dir"} ${nats:+--nats "$nats"} 2>/dev/null)
	# declare NODE,NODE,...: the names after the last comma.
	if [[ $cur == *,* ]]; then
		prefix=${cur%%,*},
		cur=${cur##*,}
	fi
	COMPREPLY=($(compgen -P "$prefix" -W "$names" -- "$cur"))
}
complete -o default -F _mesh_control_nodes mesh-control
`, strings.Join(groups(), " | "), strings.Join(cases, ""), strings.Join(boolFlags(), " | "))
	return b.String()
}

// groups are the first words of the commands of two ("node", "token").
func groups() []string {
	var gs []string
	for _, c := range commands {
		if g, _, two := strings.Cut(c.Name, " "); two && !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	return gs
}

// boolFlags are the flags, of any command, that take no value (-json,
// --wait: --wait=5m is one word), each as it may be typed: -name and
// --name.
func boolFlags() []string {
	seen := map[string]bool{}
	var out []string
	for i := range commands {
		flagSet(i, new(options), io.Discard).VisitAll(func(f *flag.Flag) {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && !seen[f.Name] {
				seen[f.Name] = true
				out = append(out, "-"+f.Name, "--"+f.Name)
			}
		})
	}
	slices.Sort(out)
	return out
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
