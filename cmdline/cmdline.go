// Package cmdline turns a program's own command definitions — its
// subcommands and the flag.FlagSet each parses — into what an operator's
// shell and manual read: completions for bash, zsh and fish, and a man
// page. One definition, so the help a command prints, what the shell
// completes and what the manual says cannot drift apart.
//
// It is the standard library's flag package and nothing more: a command
// library (cobra, kong, urfave/cli) would bring this too, at the price of
// a dependency in the executor, whose list is kept short on purpose
// (docs/dependencies.md).
package cmdline

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Command is one subcommand of a program ("" for a program that has
// none): its words ("node add"), its positional arguments as the usage
// line writes them ("NAME FILE"), what it does, and the flags it parses.
type Command struct {
	Name    string
	Args    string
	Summary string
	Flags   *flag.FlagSet
}

// Program is a program's manual: its name, a one-line summary, a longer
// description, and its commands; then the sections a person turns to when
// the command did something unexpected — what its exit status meant, what
// in its environment it read, which files it used — and examples.
type Program struct {
	Name        string
	Section     int
	Summary     string
	Description string
	Commands    []Command
	// ExitStatus is each status the program exits with and what it
	// means, and Environment each variable it reads: each program's own
	// words, beside its commands.
	ExitStatus  []Entry
	Environment []Entry
	// Files are files the manual names beyond those the flags default to:
	// FILES lists every absolute path a flag defaults to, with the
	// flag's own words, so a flag's default and the manual cannot
	// differ; Files adds the rest (a key directory's contents, a
	// bundle).
	Files []Entry
	// Examples are command lines (Term) and what each does.
	Examples []Entry
	// Asks: the program itself knows some arguments' values, which no
	// definition can list (mesh-control: the mesh's node names, asked of
	// the control side), and answers `NAME __complete WORD...` (AskCommand)
	// with them. Each shell's completion asks it first, at every word.
	Asks bool
}

// AskCommand is the hidden command a program that Asks answers for its
// shells' completions, as cobra's programs answer theirs: its arguments
// are the words of the line after the program's name, up to the cursor,
// the last the word being typed ("" at a space). It prints the values
// that word may take, a line each, already matched to what is typed, and
// exits 0 — or exits 1 where it has nothing to say, and the completion
// offers what the definitions do (commands, flags, files).
const AskCommand = "__complete"

// Entry is one item of a manual's list section: a term — a status, a
// variable, a path, a command line — and what it is.
type Entry struct {
	Term, Text string
}

// flags lists a flag set's flags, in its own (sorted) order.
func flags(fs *flag.FlagSet) []*flag.Flag {
	var out []*flag.Flag
	if fs != nil {
		fs.VisitAll(func(f *flag.Flag) { out = append(out, f) })
	}
	return out
}

// Help writes a command's help: its usage line, what it does, and its
// flags — only its own.
func (p Program) Help(w io.Writer, c Command) {
	name := strings.TrimSpace(p.Name + " " + c.Name)
	fmt.Fprintf(w, "usage: %s", name)
	if c.Args != "" {
		fmt.Fprintf(w, " %s", c.Args)
	}
	if len(flags(c.Flags)) > 0 {
		fmt.Fprint(w, " [flags]")
	}
	fmt.Fprintf(w, "\n\n%s\n", indent(c.Summary, "  "))
	if fs := flags(c.Flags); len(fs) > 0 {
		fmt.Fprint(w, "\nflags:\n")
		c.Flags.SetOutput(w)
		c.Flags.PrintDefaults()
	}
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = by + strings.TrimSpace(l)
		}
	}
	return strings.Join(lines, "\n")
}

// word is the first word of a command, and the rest.
func word(name string) (string, string) {
	first, rest, _ := strings.Cut(name, " ")
	return first, rest
}

// tree groups the commands by first word, keeping their order.
func (p Program) tree() (firsts []string, seconds map[string][]string, byName map[string]Command) {
	seconds, byName = map[string][]string{}, map[string]Command{}
	for _, c := range p.Commands {
		f, s := word(c.Name)
		if f == "" && len(p.Commands) > 1 {
			byName[""] = c // the program run without a command: its flags come first
			continue
		}
		if !slices.Contains(firsts, f) {
			firsts = append(firsts, f)
		}
		if s != "" {
			seconds[f] = append(seconds[f], s)
		}
		byName[c.Name] = c
	}
	return firsts, seconds, byName
}

func flagWords(c Command) string {
	var ws []string
	for _, f := range flags(c.Flags) {
		ws = append(ws, "--"+f.Name)
	}
	return strings.Join(ws, " ")
}

// fileArgs are the words of a usage line that name a file or directory
// argument: where the completions offer files.
var fileArgs = []string{"FILE", "BUNDLE", "DIR"}

// takesFile says whether one of c's positional arguments is a file.
func takesFile(c Command) bool {
	for _, a := range strings.Fields(c.Args) {
		if slices.Contains(fileArgs, strings.Trim(a, "[].")) {
			return true
		}
	}
	return false
}

// Version prints a program's version and build, as every program's
// version command does: one line, or with asJSON an object with the
// program's name (a script that asks each of the four reads one form).
func Version(w io.Writer, program, version, build string, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(map[string]string{"program": program, "version": version, "build": build})
		w.Write(append(b, '\n'))
		return
	}
	fmt.Fprintf(w, "%s %s build %s\n", program, version, build)
}

// VersionCommand is a program's version command with its own flag set
// (the launcher's, the agent's): args after the word, parsed for --json.
func VersionCommand(stdout, stderr io.Writer, program, version, build string, args []string) int {
	fs := VersionFlags(program)
	if err := ParseAlone(fs, args, stderr); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintf(stdout, "usage: %s version [--json]\n\n  print the version and build\n", program)
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s version: takes no arguments, got %q\n", program, fs.Arg(0))
		return 2
	}
	Version(stdout, program, version, build, fs.Lookup("json").Value.(flag.Getter).Get().(bool))
	return 0
}

// VersionFlags is the version command's flags where a program parses it
// with a flag set of its own (VersionCommand), for its manual too.
func VersionFlags(program string) *flag.FlagSet {
	fs := flag.NewFlagSet(program+" version", flag.ContinueOnError)
	fs.Bool("json", false, "print JSON")
	return fs
}

// Given says whether the command line set the flag name (fs nil: none).
func Given(fs *flag.FlagSet, name string) bool {
	set := false
	if fs != nil {
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	}
	return set
}

// valueApart says, of a command line with arguments too many, which one
// is a value given apart from a flag that takes one only after '='
// (--wait 5s for --wait=5s): the flag stands alone, the value is read as
// an argument. It sets the flag to find out, on the way to exit 2.
func valueApart(fs *flag.FlagSet, args []string) string {
	for j := 0; j+1 < len(args); j++ {
		name := strings.TrimPrefix(strings.TrimPrefix(args[j], "-"), "-") // -wait or --wait
		if !strings.HasPrefix(args[j], "-") {
			continue
		}
		f := fs.Lookup(name)
		next := args[j+1]
		if name == "" || f == nil || !isBool(f) || strings.HasPrefix(next, "-") || next == "true" || next == "false" {
			continue
		}
		if g, ok := f.Value.(flag.Getter); ok {
			if _, plain := g.Get().(bool); plain {
				continue // a bool: no value it could have meant
			}
		}
		if f.Value.Set(next) == nil {
			return fmt.Sprintf(": %q after --%s is read as an argument; write --%s=%s", next, name, name, next)
		}
	}
	return ""
}

// isBool says whether f stands alone (--json, --wait), taking no value in
// the next word.
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// valueFlags are the flags of any of p's commands that take a value in
// the next word, each as it may be typed (-state and --state): after one,
// the completions offer files, as bash's default does.
func (p Program) valueFlags() []string {
	var out []string
	for _, c := range p.Commands {
		for _, f := range flags(c.Flags) {
			if !isBool(f) && !slices.Contains(out, "--"+f.Name) {
				out = append(out, "-"+f.Name, "--"+f.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

func funcName(prog string) string { return "_" + strings.NewReplacer("-", "_", ".", "_").Replace(prog) }

// Bash is the program's bash completion (complete -F).
func (p Program) Bash() string {
	firsts, seconds, byName := p.tree()
	var b strings.Builder
	fn := funcName(p.Name)
	fmt.Fprintf(&b, "# bash completion for %s, generated from its own command definitions.\n", p.Name)
	fmt.Fprintf(&b, "%s() {\n\tlocal cur=${COMP_WORDS[COMP_CWORD]} flags=\n", fn)
	if p.Asks {
		// The line as typed, split at white space: COMP_WORDS splits a
		// URL at its colons.
		fmt.Fprintf(&b, `	# What only the program knows (%s): asked first.
	if [ -n "${COMP_LINE-}" ]; then
		local line=${COMP_LINE:0:COMP_POINT} asked words
		read -ra words <<<"$line"
		if [[ $line == *[[:space:]] ]]; then words+=(""); fi
		if asked=$("${words[0]/#\~/$HOME}" %s "${words[@]:1}" 2>/dev/null); then
			compopt +o default 2>/dev/null
			COMPREPLY=($asked)
			return
		fi
	fi
`, AskCommand, AskCommand)
	}
	if len(firsts) == 1 && firsts[0] == "" {
		fmt.Fprintf(&b, "\tflags=%q\n", flagWords(byName[""]))
	} else {
		fmt.Fprintf(&b, "\tif [ \"$COMP_CWORD\" -eq 1 ]; then\n\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\treturn\n\tfi\n", strings.TrimSpace(strings.Join(firsts, " ")+" "+flagWords(byName[""])))
		b.WriteString("\tcase \"${COMP_WORDS[1]}\" in\n")
		for _, f := range firsts {
			fmt.Fprintf(&b, "\t%s)\n", f)
			if subs := seconds[f]; len(subs) > 0 {
				fmt.Fprintf(&b, "\t\tif [ \"$COMP_CWORD\" -eq 2 ]; then\n\t\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\t\treturn\n\t\tfi\n", strings.Join(subs, " "))
				b.WriteString("\t\tcase \"${COMP_WORDS[2]}\" in\n")
				for _, s := range subs {
					fmt.Fprintf(&b, "\t\t%s) flags=%q ;;\n", s, flagWords(byName[f+" "+s]))
				}
				b.WriteString("\t\tesac\n\t\t;;\n")
				continue
			}
			fmt.Fprintf(&b, "\t\tflags=%q\n\t\t;;\n", flagWords(byName[f]))
		}
		if bare, ok := byName[""]; ok {
			fmt.Fprintf(&b, "\t*)\n\t\tflags=%q\n\t\t;;\n", flagWords(bare))
		}
		b.WriteString("\tesac\n")
	}
	b.WriteString("\tCOMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n}\n")
	fmt.Fprintf(&b, "complete -o default -F %s %s\n", fn, p.Name)
	return b.String()
}

// Zsh is the program's zsh completion (a #compdef file): the commands,
// a command's own flags, and files where a file is taken — a file
// argument (FILE), a flag's value — as bash's default offers them; what
// the program answers first when it Asks.
func (p Program) Zsh() string {
	firsts, seconds, byName := p.tree()
	var b strings.Builder
	fn := funcName(p.Name)
	fmt.Fprintf(&b, "#compdef %s\n# zsh completion for %s, generated from its own command definitions.\n", p.Name, p.Name)
	fmt.Fprintf(&b, "%s() {\n\tlocal -a flags values\n\tlocal files=0 asked\n", fn)
	fmt.Fprintf(&b, "\tvalues=(%s)\n", strings.Join(p.valueFlags(), " "))
	if p.Asks {
		fmt.Fprintf(&b, `	# What only the program knows (%s): asked first.
	if asked=$("${words[1]/#\~/$HOME}" %s "${(@)words[2,CURRENT-1]}" "$PREFIX" 2>/dev/null); then
		compadd -- ${(f)asked}
		return
	fi
`, AskCommand, AskCommand)
	}
	set := func(indent string, c Command) {
		fmt.Fprintf(&b, "%sflags=(%s)", indent, flagWords(c))
		if takesFile(c) {
			b.WriteString("; files=1")
		}
	}
	if len(firsts) == 1 && firsts[0] == "" {
		set("\t", byName[""])
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "\tif (( CURRENT == 2 )) && [[ $PREFIX != -* ]]; then\n\t\tcompadd -- %s\n\t\treturn\n\tfi\n", strings.Join(firsts, " "))
		b.WriteString("\tcase \"${words[2]}\" in\n")
		for _, f := range firsts {
			fmt.Fprintf(&b, "\t%s)\n", f)
			if subs := seconds[f]; len(subs) > 0 {
				fmt.Fprintf(&b, "\t\tif (( CURRENT == 3 )); then\n\t\t\tcompadd -- %s\n\t\t\treturn\n\t\tfi\n", strings.Join(subs, " "))
				b.WriteString("\t\tcase \"${words[3]}\" in\n")
				for _, s := range subs {
					fmt.Fprintf(&b, "\t\t%s) ", s)
					set("", byName[f+" "+s])
					b.WriteString(" ;;\n")
				}
				b.WriteString("\t\tesac\n\t\t;;\n")
				continue
			}
			set("\t\t", byName[f])
			b.WriteString("\n\t\t;;\n")
		}
		// The program run without a command: its own flags.
		b.WriteString("\t*)\n")
		set("\t\t", byName[""])
		b.WriteString("\n\t\t;;\n\tesac\n")
	}
	b.WriteString(`	if [[ $PREFIX != -* ]] && (( ${values[(Ie)${words[CURRENT-1]}]} || files )); then
		_files
		return
	fi
	compadd -- $flags
}
`)
	fmt.Fprintf(&b, "%s \"$@\"\n", fn)
	return b.String()
}

// fishQuote quotes s for fish, in single quotes.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// Fish is the program's fish completion (complete -c lines): the
// commands, each command's flags, and files where a file is taken — a
// file argument (FILE), a flag's value — and nowhere else; what the
// program answers first when it Asks.
func (p Program) Fish() string {
	firsts, seconds, byName := p.tree()
	var b strings.Builder
	fmt.Fprintf(&b, "# fish completion for %s, generated from its own command definitions.\n", p.Name)
	fmt.Fprintf(&b, "complete -c %s -f\n", p.Name)
	// files is the condition under which a file may be typed: not where
	// the program answers (it said what may be).
	files := func(cond string) string { return cond }
	if p.Asks {
		ask := strings.TrimPrefix(funcName(p.Name), "_") + "_ask"
		// The program is asked once a line: each rule's condition runs
		// it, so the answer is kept for the line it was asked of.
		fmt.Fprintf(&b, `# What only the program knows (%s): asked first.
function __%s
	set -l line (commandline -cp)
	if test "$line" != "$__%s_line"
		set -g __%s_line $line
		set -l cur (commandline -ct)
		set -l words (commandline -opc) "$cur"
		set -l prog (string replace -r '^~' $HOME -- $words[1])
		set -g __%s_said ($prog %s $words[2..-1] 2>/dev/null)
		set -g __%s_status $status
	end
	return $__%s_status
end
complete -c %s -n __%s -a '$__%s_said'
`, AskCommand, ask, ask, ask, ask, AskCommand, ask, ask, p.Name, ask, ask)
		files = func(cond string) string {
			if cond == "" {
				return "not __" + ask
			}
			return cond + "; and not __" + ask
		}
	}
	rule := func(cond string) {
		fmt.Fprintf(&b, "complete -c %s", p.Name)
		if cond != "" {
			fmt.Fprintf(&b, " -n %s", fishQuote(cond))
		}
	}
	lines := func(cond string, c Command) {
		for _, f := range flags(c.Flags) {
			rule(cond)
			fmt.Fprintf(&b, " -l %s", f.Name)
			if !isBool(f) {
				b.WriteString(" -r -F") // its value: a file, or what is typed
			}
			fmt.Fprintf(&b, " -d %s\n", fishQuote(firstLine(f.Usage)))
		}
		if takesFile(c) {
			rule(files(cond))
			b.WriteString(" -F\n")
		}
	}
	if len(firsts) == 1 && firsts[0] == "" {
		lines("", byName[""])
		return b.String()
	}
	fmt.Fprintf(&b, "complete -c %s -n __fish_use_subcommand -a %s\n", p.Name, fishQuote(strings.Join(firsts, " ")))
	if bare, ok := byName[""]; ok {
		lines("__fish_use_subcommand", bare)
	}
	for _, f := range firsts {
		if subs := seconds[f]; len(subs) > 0 {
			fmt.Fprintf(&b, "complete -c %s -n %s -a %s\n", p.Name,
				fishQuote("__fish_seen_subcommand_from "+f+"; and not __fish_seen_subcommand_from "+strings.Join(subs, " ")), fishQuote(strings.Join(subs, " ")))
			for _, s := range subs {
				lines("__fish_seen_subcommand_from "+f+"; and __fish_seen_subcommand_from "+s, byName[f+" "+s])
			}
			continue
		}
		lines("__fish_seen_subcommand_from "+f, byName[f])
	}
	return b.String()
}

// roff escapes text for a man page.
func roff(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			l = `\&` + l
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// Man is the program's manual page (roff, man(7)), with the sections
// man-pages(7) gives and in its order: NAME, SYNOPSIS, DESCRIPTION,
// COMMANDS (OPTIONS for a program of no commands), EXIT STATUS,
// ENVIRONMENT, FILES, EXAMPLES, SEE ALSO.
func (p Program) Man(version string) string {
	var b strings.Builder
	fmt.Fprintf(&b, ".TH %s %d \"\" \"nox-mesh-host %s\" \"nox-mesh-host\"\n", strings.ToUpper(p.Name), p.Section, roff(version))
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", p.Name, roff(p.Summary))
	b.WriteString(".SH SYNOPSIS\n")
	for _, c := range p.Commands {
		fmt.Fprintf(&b, ".B %s\n", strings.TrimSpace(p.Name+" "+c.Name))
		if c.Args != "" {
			fmt.Fprintf(&b, ".I %s\n", roff(c.Args))
		}
		if len(flags(c.Flags)) > 0 {
			b.WriteString("[flags]\n")
		}
		b.WriteString(".br\n")
	}
	fmt.Fprintf(&b, ".SH DESCRIPTION\n%s\n", roff(p.Description))
	section := ".SH COMMANDS\n"
	if len(p.Commands) == 1 && p.Commands[0].Name == "" {
		section = ".SH OPTIONS\n"
	}
	b.WriteString(section)
	for _, c := range p.Commands {
		if c.Name != "" {
			fmt.Fprintf(&b, ".SS %s\n", strings.TrimSpace(c.Name+" "+c.Args))
		}
		fmt.Fprintf(&b, "%s\n", roff(c.Summary))
		for _, f := range flags(c.Flags) {
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(&b, ".TP\n.B \\-\\-%s", roff(f.Name))
			if name != "" {
				fmt.Fprintf(&b, " \\fI%s\\fR", roff(name))
			}
			b.WriteString("\n" + roff(usage))
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
				fmt.Fprintf(&b, " (default %s)", roff(f.DefValue))
			}
			b.WriteString("\n")
		}
	}
	entries(&b, "EXIT STATUS", p.ExitStatus, false)
	entries(&b, "ENVIRONMENT", p.Environment, false)
	entries(&b, "FILES", append(p.flagFiles(), p.Files...), false)
	entries(&b, "EXAMPLES", p.Examples, true)
	b.WriteString(".SH SEE ALSO\n")
	var others []string
	for _, h := range housePrograms {
		if h.name != p.Name {
			others = append(others, fmt.Sprintf(".BR %s (%d)", roff(h.name), h.section))
		}
	}
	b.WriteString(strings.Join(others, ",\n") + "\n.PP\n")
	b.WriteString("/usr/share/doc/nox-mesh-host/operations.md, /usr/share/doc/nox-mesh-host/declaration.md, /usr/share/doc/nox-mesh-host/SECURITY.md\n")
	return b.String()
}

// entries writes a list section, a tagged paragraph an entry (an entry
// of no term a plain paragraph); code sets the terms in bold as what is
// typed (an example's command line). No entries, no section.
func entries(b *strings.Builder, title string, es []Entry, code bool) {
	if len(es) == 0 {
		return
	}
	fmt.Fprintf(b, ".SH %s\n", title)
	for _, e := range es {
		if e.Term == "" { // a paragraph of its own: what the section has to say is not a list
			fmt.Fprintf(b, ".PP\n%s\n", roff(e.Text))
			continue
		}
		if code {
			fmt.Fprintf(b, ".TP\n.B %s\n%s\n", roff(e.Term), roff(e.Text))
			continue
		}
		fmt.Fprintf(b, ".TP\n%s\n%s\n", roff(e.Term), roff(e.Text))
	}
}

// flagFiles are the absolute paths the program's flags default to, each
// once (the first flag's words say what it is), sorted: the files and
// directories the program uses when told nothing else.
func (p Program) flagFiles() []Entry {
	seen := map[string]bool{}
	var out []Entry
	for _, c := range p.Commands {
		for _, f := range flags(c.Flags) {
			if !strings.HasPrefix(f.DefValue, "/") || seen[f.DefValue] {
				continue
			}
			seen[f.DefValue] = true
			_, usage := flag.UnquoteUsage(f)
			out = append(out, Entry{Term: f.DefValue, Text: fmt.Sprintf("%s (--%s)", usage, f.Name)})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Term, b.Term) })
	return out
}

// Find is the command whose words begin args, and the rest of args.
func (p Program) Find(args []string) (Command, []string, bool) {
	for _, n := range []int{2, 1} {
		if len(args) < n {
			continue
		}
		name := strings.Join(args[:n], " ")
		for _, c := range p.Commands {
			if c.Name == name {
				return c, args[n:], true
			}
		}
	}
	return Command{}, args, false
}

// Generate answers "completion bash|zsh|fish" and "man": the text, or an
// error naming what it takes (the caller says the program's name).
func (p Program) Generate(args []string, version string) (string, error) {
	switch {
	case len(args) == 1 && args[0] == "man":
		return p.Man(version), nil
	case len(args) == 2 && args[0] == "completion":
		switch args[1] {
		case "bash":
			return p.Bash(), nil
		case "zsh":
			return p.Zsh(), nil
		case "fish":
			return p.Fish(), nil
		}
		return "", fmt.Errorf("completion: no shell %q: bash, zsh or fish", args[1])
	}
	return "", fmt.Errorf("completion bash|zsh|fish, or man")
}

// Parse parses fs's flags wherever they stand among the positional
// arguments ("plan FILE --state D" as "plan --state D FILE"), and returns
// the positional ones; "--" ends the flags.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// flagError is what the flag package said of a command line, said again
// in the programs' words, after the command's name: an unknown flag and
// one missing its value by their names as the manual writes them (--x);
// of a flag that only stands alone like a boolean (--wait, or --wait=5m)
// not "invalid boolean value", the flag's own reason being the whole of
// it. Anything else is the flag package's, as it said it.
func flagError(fs *flag.FlagSet, said string) string {
	line := strings.TrimSuffix(said, "\n")
	if name, ok := strings.CutPrefix(line, "flag provided but not defined: "); ok {
		return fmt.Sprintf("%s: unknown flag -%s (%s --help lists its flags)\n", fs.Name(), name, fs.Name())
	}
	if name, ok := strings.CutPrefix(line, "flag needs an argument: "); ok {
		return fmt.Sprintf("%s: -%s needs a value\n", fs.Name(), name)
	}
	if rest, ok := strings.CutPrefix(line, "invalid value "); ok {
		// invalid value "abc" for flag -stop-timeout: parse error
		val, after, ok := strings.Cut(rest, " for flag -")
		name, reason, ok2 := strings.Cut(after, ": ")
		if ok && ok2 {
			if f := fs.Lookup(name); f != nil {
				if g, ok := f.Value.(flag.Getter); ok {
					switch g.Get().(type) {
					case time.Duration:
						reason = "not a time (such as 30s, 5m or 1h)"
					case int, int64, uint, uint64:
						reason = "not a whole number"
					}
				}
			}
			return fmt.Sprintf("%s: --%s %s: %s\n", fs.Name(), name, val, reason)
		}
	}
	const prefix = "invalid boolean value "
	if !strings.HasPrefix(said, prefix) {
		return said
	}
	_, rest, ok := strings.Cut(said, " for -")
	name, reason, ok2 := strings.Cut(rest, ": ")
	f := fs.Lookup(name)
	if !ok || !ok2 || f == nil {
		return said
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isBool := g.Get().(bool); isBool {
			return said // a true boolean: the flag package's words are right
		}
	}
	return fs.Name() + ": --" + name + ": " + reason
}

// ParseAlone parses args into fs, a command line a program parses with a
// flag set of its own rather than through its Table (a daemon's, the
// launcher's): what the flag package refuses is said on stderr as a
// Table's commands say it (flagError), and never with the flag package's
// dump of every flag. A request for help returns flag.ErrHelp unsaid, for
// the caller to answer with the command's help.
func ParseAlone(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	var said strings.Builder
	fs.SetOutput(&said)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if err != nil && err != flag.ErrHelp {
		sayRefused(stderr, fs, said.String())
	}
	return err
}

// sayRefused says what the flag package refused of fs's command line, in
// the programs' words (flagError), and where its flags are listed — but
// once: an unknown flag's words say it already.
func sayRefused(w io.Writer, fs *flag.FlagSet, said string) {
	io.WriteString(w, flagError(fs, said))
	if !strings.HasPrefix(said, "flag provided but not defined") {
		fmt.Fprintf(w, "(%s --help: its flags)\n", fs.Name())
	}
}

// Def is one row of a program's table of commands: its words, its
// positional arguments as the usage writes them and how many (Min to
// Max), the names of its flags, and what it does.
type Def struct {
	Name, Args string
	Min, Max   int
	Flags      []string
	Summary    string
	// Vet, when set, has the command's own word on its positional
	// arguments before they are counted: a refusal that says more than
	// "takes no arguments" (a secret given where any user can read it).
	Vet func(pos []string) error
}

// Table is a program's commands, each with the flag set it parses.
type Table struct {
	Program
	Defs []Def
	// FlagSet makes command i's flag set, its flags bound to fresh
	// values, writing its errors to out.
	FlagSet func(i int, out io.Writer) *flag.FlagSet
}

// NewTable makes a program's table: its manual's commands are the
// definitions, with the flag sets flagSet makes.
func NewTable(p Program, defs []Def, flagSet func(i int, out io.Writer) *flag.FlagSet) Table {
	p.Commands = nil
	for i, d := range defs {
		p.Commands = append(p.Commands, Command{Name: d.Name, Args: d.Args, Summary: d.Summary, Flags: flagSet(i, io.Discard)})
	}
	return Table{Program: p, Defs: defs, FlagSet: flagSet}
}

// usageWidth is the width the command listings are wrapped to: a
// terminal's customary 80 columns, so a line is never cut short or
// broken by the terminal in the middle of a word.
const usageWidth = 80

// Usage lists the commands, each with the first clause of what it does,
// wrapped rather than cut: a description that ends in "…" hides what an
// operator reads the listing for.
func (t Table) Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s COMMAND [ARGS] [flags]   (%s COMMAND --help: its own)\n\n", t.Name, t.Name)
	var rows [][2]string
	for _, d := range t.Defs {
		rows = append(rows, [2]string{d.Name, gist(d.Summary)})
	}
	listRows(w, rows)
}

// Subcommands are the second words of the commands whose first word is
// group ("node" → revoke, show, …), in the table's order; none when group
// is not a group of commands.
func (t Table) Subcommands(group string) []Def {
	var subs []Def
	for _, d := range t.Defs {
		if first, _, ok := strings.Cut(d.Name, " "); ok && first == group {
			subs = append(subs, d)
		}
	}
	return subs
}

// GroupUsage lists a group's subcommands ("mesh-control node --help"),
// each by name with the first clause of what it does: a line each, as
// the names leave the most room for it (each one's --help has its
// arguments and flags).
func (t Table) GroupUsage(w io.Writer, group string) {
	fmt.Fprintf(w, "usage: %s %s SUBCOMMAND [ARGS] [flags]\n\n", t.Name, group)
	var rows [][2]string
	for _, d := range t.Subcommands(group) {
		_, second, _ := strings.Cut(d.Name, " ")
		rows = append(rows, [2]string{second, gist(d.Summary)})
	}
	listRows(w, rows)
	fmt.Fprintf(w, "\n%s %s SUBCOMMAND --help: its arguments and flags\n", t.Name, group)
}

// listRows writes rows of a name and its description in two columns, the
// description wrapped to usageWidth under itself.
func listRows(w io.Writer, rows [][2]string) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		lines := wrap(r[1], max(usageWidth-4-width, 32))
		fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "  %*s  %s\n", width, "", l)
		}
	}
}

// wrap breaks s into lines of at most width characters at spaces; a word
// longer than width stands on a line of its own, whole.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len([]rune(line))+1+len([]rune(word)) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// gist is a summary's first clause: up to its first "; " or the end of
// its first sentence — what the command does, before how and when —
// never inside parentheses, whose clause would be left open.
func gist(summary string) string {
	s := strings.Join(strings.Fields(summary), " ")
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth = max(depth-1, 0)
		case ';':
			if depth == 0 && strings.HasPrefix(s[i:], "; ") {
				return s[:i]
			}
		case '.':
			// A sentence's end, not "e.g. x" or a version's dots.
			if depth == 0 && i+2 < len(s) && s[i+1] == ' ' && s[i+2] >= 'A' && s[i+2] <= 'Z' {
				return s[:i]
			}
		}
	}
	return strings.TrimSuffix(s, ".")
}

// Dispatch runs the parts of a command line every command shares: the
// usage (no command, help, --help), --version (as the command
// "version"), finding the command (of one word or two), its flags
// wherever they stand, its --help (on standard output, exit 0), the
// number of its arguments, and completion and man. done says it answered
// and code is the exit status; otherwise the command is Defs[i], its
// positional arguments pos, its parsed flag set fs.
func (t Table) Dispatch(args []string, version string, stdout, stderr io.Writer) (i int, pos []string, fs *flag.FlagSet, code int, done bool) {
	if len(args) == 0 {
		t.Usage(stderr)
		return 0, nil, nil, 2, true
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 {
			return t.Dispatch(append(slices.Clone(args[1:]), "--help"), version, stdout, stderr)
		}
		t.Usage(stdout)
		return 0, nil, nil, 0, true
	case "--version", "-version":
		args = append([]string{"version"}, args[1:]...) // --version --json as version --json
	}
	i = -1
	for n := min(2, len(args)); n >= 1 && i < 0; n-- {
		i = slices.IndexFunc(t.Defs, func(d Def) bool { return d.Name == strings.Join(args[:n], " ") })
		if i >= 0 {
			args = args[n:]
		}
	}
	if i < 0 {
		var subs []string
		for _, d := range t.Subcommands(args[0]) {
			_, second, _ := strings.Cut(d.Name, " ")
			subs = append(subs, second)
		}
		if len(subs) > 0 {
			// A group of commands ("node"): its --help lists them (exit
			// 0); anything else says which exist (exit 2).
			rest := args[1:]
			switch {
			case len(rest) > 0 && isHelp(rest[0]):
				t.GroupUsage(stdout, args[0])
				return 0, nil, nil, 0, true
			case len(rest) > 0 && !strings.HasPrefix(rest[0], "-"):
				fmt.Fprintf(stderr, "%s %s: no subcommand %q: the subcommand is one of %s (%s %s --help)\n", t.Name, args[0], rest[0], strings.Join(subs, ", "), t.Name, args[0])
			default:
				fmt.Fprintf(stderr, "%s %s: the subcommand is one of %s (%s %s --help)\n", t.Name, args[0], strings.Join(subs, ", "), t.Name, args[0])
			}
		} else if strings.HasPrefix(args[0], "-") {
			// Flags before the command: said so, with the line as it goes
			// when the command is among the words.
			try := t.Name + " COMMAND " + args[0] + " …"
			for j := 1; j < len(args); j++ {
				if slices.ContainsFunc(t.Defs, func(d Def) bool { first, _, _ := strings.Cut(d.Name, " "); return first == args[j] }) {
					try = t.Name + " " + strings.Join(append(slices.Clone(args[j:]), args[:j]...), " ")
					break
				}
			}
			fmt.Fprintf(stderr, "%s: %s before the command: flags go after it (%s)\n", t.Name, args[0], try)
		} else {
			fmt.Fprintf(stderr, "%s: unknown command %q (%s --help lists them)\n", t.Name, args[0], t.Name)
		}
		return 0, nil, nil, 2, true
	}
	d := t.Defs[i]
	var said strings.Builder // the flag package's words, said again in ours
	fs = t.FlagSet(i, &said)
	fs.Usage = func() {}
	pos, err := Parse(fs, args)
	fs.SetOutput(stderr)
	switch {
	case err == flag.ErrHelp:
		t.Help(stdout, t.Commands[i])
		return i, nil, fs, 0, true
	case err != nil:
		sayRefused(stderr, fs, said.String())
		return i, nil, fs, 2, true
	case d.Vet != nil && vet(d.Vet, pos, stderr, t.Name+" "+d.Name):
		return i, nil, fs, 2, true
	case len(pos) < d.Min || len(pos) > d.Max:
		what := d.Args
		if d.Max == 0 {
			what = "no arguments"
		}
		fmt.Fprintf(stderr, "%s %s: takes %s, got %d argument(s)%s (%s %s --help)\n", t.Name, d.Name, what, len(pos), valueApart(fs, args), t.Name, d.Name)
		return i, nil, fs, 2, true
	}
	if d.Name == "completion" || d.Name == "man" {
		text, err := t.Generate(append([]string{d.Name}, pos...), version)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", t.Name, err)
			return i, nil, fs, 2, true
		}
		fmt.Fprint(stdout, text)
		return i, nil, fs, 0, true
	}
	return i, pos, fs, 0, false
}

// IsHelp says whether arg asks for help, as the flag package takes it.
func IsHelp(arg string) bool { return isHelp(arg) }

func isHelp(arg string) bool {
	return arg == "-h" || arg == "--help" || arg == "-help" || arg == "help"
}

// vet says what f refuses of pos, as the program's name, and whether it did.
func vet(f func([]string) error, pos []string, stderr io.Writer, name string) bool {
	err := f(pos)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
	}
	return err != nil
}

// Vetted is d with Vet set.
func (d Def) Vetted(vet func(pos []string) error) Def { d.Vet = vet; return d }

// D is a Def, written in a table's row.
func D(name, args string, min, max int, flags []string, summary string) Def {
	return Def{Name: name, Args: args, Min: min, Max: max, Flags: flags, Summary: summary}
}

// Place says where the word being typed stands on a command line, for a
// program that Asks: words are the line's words after the program's name,
// up to the cursor, the last the one being typed. It finds the command
// (of two words or one, both typed whole), gives the words between to the
// command's flag set (fs: their values, --dir and the like, as the
// command would take them), and says which positional argument the last
// word is, from 0 — or -1 when it is a flag or a flag's value. ok is
// false when no command is typed yet.
func (t Table) Place(words []string) (i int, fs *flag.FlagSet, arg int, ok bool) {
	if len(words) < 2 {
		return 0, nil, 0, false
	}
	typed, cur := words[:len(words)-1], words[len(words)-1]
	n := 0
	for k := min(2, len(typed)); k >= 1 && n == 0; k-- {
		if j := slices.IndexFunc(t.Defs, func(d Def) bool { return d.Name == strings.Join(typed[:k], " ") }); j >= 0 {
			i, n = j, k
		}
	}
	if n == 0 {
		return 0, nil, 0, false
	}
	fs = t.FlagSet(i, io.Discard)
	for j := n; j < len(typed); j++ {
		w := typed[j]
		if w == "--" { // the rest are arguments, the word typed among them
			return i, fs, arg + len(typed) - j - 1, true
		}
		if len(w) < 2 || w[0] != '-' {
			arg++
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		f := fs.Lookup(name)
		switch {
		case f == nil:
		case hasValue:
			fs.Set(name, value)
		case isBool(f):
			fs.Set(name, "true")
		case j+1 < len(typed):
			j++
			fs.Set(name, typed[j])
		default:
			return i, fs, -1, true // the word typed is this flag's value
		}
	}
	if strings.HasPrefix(cur, "-") {
		return i, fs, -1, true
	}
	return i, fs, arg, true
}
