package cmdline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/cmdline"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/executor/cli"
	"github.com/nox-mesh/nox-mesh-host/launcher"
)

// programs are every binary's definitions.
func programs() []cmdline.Program {
	return []cmdline.Program{control.Program(), cli.Program(), launcher.Program(), agent.Program()}
}

// Each shell reads each binary's completion without a syntax error, and
// it offers every command and every flag the definitions have.
func TestCompletionsReadByEachShell(t *testing.T) {
	dir := t.TempDir()
	for _, p := range programs() {
		for shell, script := range map[string]string{"bash": p.Bash(), "zsh": p.Zsh(), "fish": p.Fish()} {
			f := filepath.Join(dir, p.Name+"."+shell)
			if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			check := map[string][]string{"bash": {"bash", "-n", f}, "zsh": {"zsh", "-n", f}, "fish": {"fish", "--no-execute", f}}[shell]
			if out, err := exec.Command(check[0], check[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%s does not read %s's completion: %v\n%s\n%s", shell, p.Name, err, out, script)
			}
			for _, c := range p.Commands {
				for _, w := range strings.Fields(c.Name) {
					if !strings.Contains(script, w) {
						t.Errorf("%s's %s completion does not offer %q", p.Name, shell, w)
					}
				}
				visit(c.Flags, func(fl *flagT) {
					if !strings.Contains(script, fl.Name) {
						t.Errorf("%s's %s completion does not offer --%s of %q", p.Name, shell, fl.Name, c.Name)
					}
				})
			}
		}
	}
}

// bash completes what a person types: the commands, the words after the
// first, and a command's own flags — not another's.
func TestBashCompletesWhatIsTyped(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.bash")
	os.WriteFile(f, []byte(control.Program().Bash()), 0o644)
	complete := func(line string) string {
		t.Helper()
		words := strings.Fields(line)
		if strings.HasSuffix(line, " ") {
			words = append(words, "")
		}
		script := "source " + f + "\nCOMP_WORDS=(" + quoteAll(words) + ")\nCOMP_CWORD=" + itoa(len(words)-1) + "\n_mesh_control\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := complete("mesh-control no"); got != "node nodes" {
		t.Errorf("mesh-control no<TAB>: %q", got)
	}
	if got := complete("mesh-control node "); got != "revoke delete show add endpoint" {
		t.Errorf("mesh-control node <TAB>: %q", got)
	}
	if got := complete("mesh-control declare n1 f.json --s"); got != "--seal" {
		t.Errorf("declare --s<TAB>: %q", got)
	}
	if got := complete("mesh-control nodes --s"); got != "" {
		t.Errorf("nodes --s<TAB> offers another command's flag: %q", got)
	}
}

func quoteAll(ws []string) string {
	var q []string
	for _, w := range ws {
		q = append(q, "'"+w+"'")
	}
	return strings.Join(q, " ")
}

func itoa(n int) string { return strconv.Itoa(n) }

type flagT = flag.Flag

// Each binary's manual page renders (groff, as man does), with a section
// for every command and every flag.
func TestManPagesRender(t *testing.T) {
	for _, p := range programs() {
		text, ok := render(t, p)
		if !ok {
			continue
		}
		for _, c := range p.Commands {
			if c.Name != "" && !strings.Contains(text, c.Name) {
				t.Errorf("%s's manual has no %q", p.Name, c.Name)
			}
			visit(c.Flags, func(fl *flagT) {
				if !strings.Contains(text, "--"+fl.Name) && !strings.Contains(text, "‐‐"+fl.Name) {
					t.Errorf("%s's manual has no --%s", p.Name, fl.Name)
				}
			})
		}
		if !strings.Contains(text, "1.2.3") {
			t.Errorf("%s's manual does not say its version", p.Name)
		}
	}
}

// render is p's manual page as man shows it (groff -man, its overstrikes
// removed); ok is false, and the test failed, when groff complained.
func render(t *testing.T, p cmdline.Program) (text string, ok bool) {
	t.Helper()
	cmd := exec.Command("groff", "-man", "-Tutf8", "-ww")
	cmd.Stdin = strings.NewReader(p.Man("1.2.3"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || errb.Len() > 0 {
		t.Errorf("%s: groff: %v\n%s", p.Name, err, errb.String())
		return "", false
	}
	return regexp.MustCompile(".\b").ReplaceAllString(out.String(), ""), true
}

// Each binary's manual has the sections a person looks for, in
// man-pages(7)'s order, each with something to say: FILES has every path
// a flag defaults to, SEE ALSO names the other three programs.
func TestManPagesHaveTheirSections(t *testing.T) {
	progs := map[string]cmdline.Program{}
	for _, p := range programs() {
		progs[p.Name] = p
	}
	for _, c := range []struct {
		name string
		// commands is the heading of the commands' section.
		commands string
		// says is what the sections say, section by section.
		says map[string][]string
	}{
		{"mesh-control", "COMMANDS", map[string][]string{
			"EXIT STATUS": {"0", "1", "2", "3", "a command line it does not take", "did not report within the time"},
			"ENVIRONMENT": {"MESH_CONTROL_DIR"},
			"FILES":       {"/var/lib/mesh-control", "DIR/control.key", "DIR/broker.crt", "DIR/control.json"},
			"EXAMPLES":    {"mesh-control init", "mesh-control serve", "mesh-control status"},
		}},
		{"mesh-executor", "COMMANDS", map[string][]string{
			"EXIT STATUS": {"0", "1", "2", "refused whole, nothing touched"},
			"ENVIRONMENT": {"reads no environment variable"},
			"FILES":       {"/var/lib/mesh-host/executor", "/run/mesh-host/executor.sock", "/usr/lib/nox-mesh-host/foundation.lock"},
			"EXAMPLES":    {"mesh-executor doctor", "mesh-executor apply rescue.json"},
		}},
		{"mesh-launch", "COMMANDS", map[string][]string{
			"EXIT STATUS": {"0", "1", "2", "another mesh-launch holds the state directory"},
			"ENVIRONMENT": {"reads no environment variable"},
			"FILES":       {"/var/lib/mesh-host/executor", "/run/mesh-host/launcher.json"},
			"EXAMPLES":    {"mesh-launch status", "mesh-launch clear"},
		}},
		{"mesh-agent", "COMMANDS", map[string][]string{
			"EXIT STATUS": {"0", "1", "2", "its state directory held by another agent"},
			"ENVIRONMENT": {"reads no environment variable"},
			"FILES":       {"/var/lib/mesh-host/agent/config.json", "/var/lib/mesh-host/agent", "/run/mesh-host/executor.sock"},
			"EXAMPLES":    {"mesh-agent --config"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ok := progs[c.name]
			if !ok {
				t.Fatalf("no program %s among the binaries' definitions", c.name)
			}
			text, ok := render(t, p)
			if !ok {
				return
			}
			sections := manSections(text)
			var heads []string
			for _, s := range sections {
				heads = append(heads, s.head)
			}
			want := []string{"NAME", "SYNOPSIS", "DESCRIPTION", c.commands, "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"}
			if strings.Join(heads, ", ") != strings.Join(want, ", ") {
				t.Fatalf("sections %s, want %s", strings.Join(heads, ", "), strings.Join(want, ", "))
			}
			body := map[string]string{}
			for _, s := range sections {
				body[s.head] = s.body
				if strings.TrimSpace(s.body) == "" {
					t.Errorf("%s says nothing", s.head)
				}
			}
			for head, says := range c.says {
				for _, w := range says {
					if !strings.Contains(body[head], w) {
						t.Errorf("%s does not say %q:\n%s", head, w, body[head])
					}
				}
			}
			// Every path a flag defaults to, and the other programs.
			for _, cmd := range p.Commands {
				visit(cmd.Flags, func(f *flagT) {
					if strings.HasPrefix(f.DefValue, "/") && !strings.Contains(body["FILES"], f.DefValue) {
						t.Errorf("FILES lacks %s (--%s's default)", f.DefValue, f.Name)
					}
				})
			}
			for other, q := range progs {
				if ref := fmt.Sprintf("%s(%d)", other, q.Section); other != c.name && !strings.Contains(body["SEE ALSO"], ref) {
					t.Errorf("SEE ALSO does not name %s:\n%s", ref, body["SEE ALSO"])
				}
			}
		})
	}
}

// manSection is a section of a rendered manual page: its heading and
// what is under it, its lines joined as one.
type manSection struct{ head, body string }

// manSections splits a rendered page at its headings (a line in capitals
// at the margin), its header and footer lines left out; a body's lines
// are joined with their spaces as one, as groff breaks them where it
// likes (a word hyphenated at a line's end is whole again).
func manSections(text string) []manSection {
	heading := regexp.MustCompile(`^[A-Z][A-Z ]+$`)
	var out []manSection
	for _, l := range strings.Split(text, "\n") {
		switch {
		case heading.MatchString(l):
			out = append(out, manSection{head: l})
		case len(out) > 0:
			out[len(out)-1].body += " " + strings.TrimSpace(l)
		}
	}
	for i := range out {
		b := strings.ReplaceAll(out[i].body, "‐ ", "") // groff's hyphen at a break
		b = strings.ReplaceAll(b, "‐", "-")
		out[i].body = strings.Join(strings.Fields(b), " ")
	}
	if n := len(out); n > 0 {
		// The footer ("nox-mesh-host 1.2.3 … MESH-CONTROL(1)") follows the last section.
		last := &out[n-1]
		if i := strings.LastIndex(last.body, "nox-mesh-host 1.2.3"); i >= 0 {
			last.body = last.body[:i]
		}
	}
	return out
}

func visit(fs *flag.FlagSet, fn func(*flag.Flag)) {
	if fs != nil {
		fs.VisitAll(fn)
	}
}

// mains runs each program's command line, by its name.
var mains = map[string]func(args []string, out, errw *bytes.Buffer) int{
	"mesh-control":  func(a []string, o, e *bytes.Buffer) int { return control.Main(context.Background(), a, o, e) },
	"mesh-executor": func(a []string, o, e *bytes.Buffer) int { return cli.Main("1.2.3", a, o, e) },
	"mesh-launch":   func(a []string, o, e *bytes.Buffer) int { return launcher.Main(a, o, e) },
	"mesh-agent": func(a []string, o, e *bytes.Buffer) int {
		return agent.Main(context.Background(), "1.2.3", "b", a, o, e)
	},
}

// An unknown flag, or one without its value, is said alike by every
// command of every binary — those parsed through their program's table
// and those with a flag set of their own (a daemon's, the launcher's, the
// agent's) —, one line naming the command, exit 2, and never the flag
// package's dump of every flag. Nothing is done first: the flags are read
// before anything else.
func TestEveryCommandSaysAnUnknownFlagAlike(t *testing.T) {
	for _, p := range programs() {
		for _, c := range p.Commands {
			if c.Name == "version" || c.Name == "completion" || c.Name == "man" {
				continue
			}
			name := strings.TrimSpace(p.Name + " " + c.Name)
			var out, errw bytes.Buffer
			code := mains[p.Name](append(strings.Fields(c.Name), "--frobnicate"), &out, &errw)
			if want := name + ": unknown flag --frobnicate (" + name + " --help lists its flags)\n"; code != 2 || errw.String() != want || out.Len() > 0 {
				t.Errorf("%s --frobnicate: exit %d, said %q (and %q); want exit 2 and %q", name, code, errw.String(), out.String(), want)
			}
			var last string
			visit(c.Flags, func(f *flag.Flag) {
				if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !isBool {
					last = f.Name
				}
			})
			if last == "" {
				continue
			}
			out.Reset()
			errw.Reset()
			code = mains[p.Name](append(strings.Fields(c.Name), "--"+last), &out, &errw)
			if want := name + ": --" + last + " needs a value\n"; code != 2 || !strings.HasPrefix(errw.String(), want) || strings.Count(errw.String(), "\n") > 2 {
				t.Errorf("%s --%s: exit %d, said %q; want exit 2 and %q", name, last, code, errw.String(), want)
			}
		}
	}
}

// A flag's description in a command's help is that command's: it names
// no command ("serve: …", "node add: …, broker-config: …") as a flag
// shared by several would, whose help then listed every meaning.
func TestAFlagSaysWhatItDoesForItsCommand(t *testing.T) {
	for _, p := range programs() {
		for _, c := range p.Commands {
			visit(c.Flags, func(f *flag.Flag) {
				for _, other := range p.Commands {
					if other.Name != "" && strings.Contains(f.Usage, other.Name+": ") {
						t.Errorf("%s %s --%s: %q speaks of %s", p.Name, c.Name, f.Name, f.Usage, other.Name)
					}
				}
			})
		}
	}
}

// Every command of every binary answers --help on standard output, exit
// 0, listing its own flags and no other command's; and --version says
// the version.
func TestEveryCommandsHelpIsItsOwn(t *testing.T) {
	for _, p := range programs() {
		run := mains[p.Name]
		all := map[string]bool{}
		for _, c := range p.Commands {
			visit(c.Flags, func(f *flag.Flag) { all[f.Name] = true })
		}
		for _, c := range p.Commands {
			if c.Name == "version" || c.Name == "completion" || c.Name == "man" {
				continue
			}
			var out, errw bytes.Buffer
			args := append(strings.Fields(c.Name), "--help")
			if code := run(args, &out, &errw); code != 0 {
				t.Errorf("%s %s --help: exit %d\n%s", p.Name, c.Name, code, errw.String())
				continue
			}
			own := map[string]bool{}
			visit(c.Flags, func(f *flag.Flag) { own[f.Name] = true })
			// A flag's row is "  -name" (one dash, as package flag prints
			// it); a summary's line that starts with "--name" is prose.
			listed := regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(out.String(), -1)
			got := map[string]bool{}
			for _, m := range listed {
				got[m[1]] = true
				if !own[m[1]] {
					t.Errorf("%s %s --help lists -%s, another command's", p.Name, c.Name, m[1])
				}
			}
			for f := range own {
				if !got[f] {
					t.Errorf("%s %s --help does not list its -%s", p.Name, c.Name, f)
				}
			}
		}
		// --version says the same on all four: the name, the version and
		// the build.
		var out, errw bytes.Buffer
		if code := run([]string{"--version"}, &out, &errw); code != 0 || !regexp.MustCompile(`^`+p.Name+` \S+ build \S+\n$`).MatchString(out.String()) {
			t.Errorf("%s --version: exit %d %q %q", p.Name, code, out.String(), errw.String())
		}
		out.Reset()
		if code := run([]string{"version"}, &out, &errw); code != 0 || out.Len() == 0 {
			t.Errorf("%s version: exit %d %q %q", p.Name, code, out.String(), errw.String())
		}
		// version --json, and --version --json: one form for the four,
		// naming the program.
		for _, args := range [][]string{{"version", "--json"}, {"--version", "--json"}} {
			out.Reset()
			var v struct{ Program, Version, Build string }
			if code := run(args, &out, &errw); code != 0 || json.Unmarshal(out.Bytes(), &v) != nil || v.Program != p.Name || v.Version == "" || v.Build == "" {
				t.Errorf("%s %v: exit %d %q %q", p.Name, args, code, out.String(), errw.String())
			}
		}
	}
}

// A flag that stands alone like a boolean but takes a value (--wait, or
// --wait=5m) says its own reason for a bad value, not the flag package's
// "invalid boolean value"; a true boolean keeps the flag package's words.
func TestAFlagSaysItsOwnReason(t *testing.T) {
	for _, c := range []struct {
		args      []string
		want, not string
	}{
		{[]string{"declare", "--wait=abc", "n1", "f.json"}, `-wait: "abc" is not a time to wait`, "invalid boolean value"},
		{[]string{"declare", "--json=maybe", "n1", "f.json"}, `invalid boolean value "maybe" for -json`, ""},
		// A value given apart from a flag that takes one only after '='.
		{[]string{"declare", "n1", "f.json", "--wait", "5s"}, `"5s" after --wait is read as an argument; write --wait=5s`, ""},
		{[]string{"declare", "n1", "f.json", "--json", "1"}, "got 3 argument(s) (", "write --json"},
	} {
		var out, errw bytes.Buffer
		code := control.Main(context.Background(), c.args, &out, &errw)
		if code != 2 || !strings.Contains(errw.String(), c.want) || (c.not != "" && strings.Contains(errw.String(), c.not)) {
			t.Errorf("mesh-control %s: exit %d, said %q; want exit 2 and %q", strings.Join(c.args, " "), code, errw.String(), c.want)
		}
	}
}

// A group of commands ("node", "token") answers --help with its
// subcommands, a line each, exit 0; with no subcommand or an unknown one
// it exits 2 naming those there are. No listing cuts a description short
// ("…"): the top-level one wraps it under itself, within 80 columns.
func TestGroupsListTheirSubcommands(t *testing.T) {
	main := func(args ...string) (string, string, int) {
		var out, errw bytes.Buffer
		code := control.Main(context.Background(), args, &out, &errw)
		return out.String(), errw.String(), code
	}
	groups := map[string][]string{}
	for _, c := range control.Program().Commands {
		if first, second, ok := strings.Cut(c.Name, " "); ok {
			groups[first] = append(groups[first], second)
		}
	}
	for _, g := range []string{"node", "token", "overlay", "archive"} {
		subs := groups[g]
		if len(subs) == 0 {
			t.Fatalf("mesh-control has no group %s", g)
		}
		for _, args := range [][]string{{g, "--help"}, {g, "-h"}, {"help", g}} {
			out, errs, code := main(args...)
			if code != 0 || errs != "" {
				t.Errorf("mesh-control %s: exit %d\n%s", strings.Join(args, " "), code, errs)
			}
			for _, s := range subs {
				if !regexp.MustCompile(`(?m)^  ` + s + `  +\S`).MatchString(out) {
					t.Errorf("mesh-control %s does not list %s with what it does:\n%s", strings.Join(args, " "), s, out)
				}
			}
			if n := strings.Count(strings.TrimSpace(out), "\n"); n != len(subs)+3 {
				t.Errorf("mesh-control %s: %d lines for %d subcommands (one each):\n%s", strings.Join(args, " "), n+1, len(subs), out)
			}
		}
		for _, args := range [][]string{{g}, {g, "frob"}, {g, "--json"}} {
			out, errs, code := main(args...)
			if code != 2 || out != "" || !strings.Contains(errs, strings.Join(subs, ", ")) {
				t.Errorf("mesh-control %s: exit %d, want 2 naming %v\n%s%s", strings.Join(args, " "), code, subs, out, errs)
			}
		}
	}
	if _, errs, _ := main("node", "frob"); !strings.Contains(errs, `no subcommand "frob"`) {
		t.Errorf("mesh-control node frob does not name what it did not find: %s", errs)
	}
	out, _, code := main("help")
	if code != 0 || strings.Contains(out, "…") {
		t.Fatalf("mesh-control help: exit %d\n%s", code, out)
	}
	for i, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if i > 0 && len([]rune(l)) > 80 {
			t.Errorf("mesh-control help: a line over 80 columns: %q", l)
		}
	}
	// Every word of every description is there, wrapped or not.
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"assign the module FILE (resources of one module) to NODE and publish the node's composition: the overlay, then its modules in the order assigned",
		"each node: its state (revoked, never heard from, or what its agent says), when it was last heard from, executor version, declared vs applied, last outcome",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("mesh-control help cuts %q:\n%s", want, out)
		}
	}
}

// zsh and fish offer files where a file is taken — a FILE argument, a
// flag's value — and not where none is: the commands, and a command's
// flags, there. fish completes for real (complete -C); zsh runs its
// completion file as its autoload does, with compadd and _files said as
// what they are given, since only a zsh reading a terminal completes.
func TestZshAndFishOfferFilesWhereAFileIsTaken(t *testing.T) {
	dir := t.TempDir()
	cwd := t.TempDir()
	os.WriteFile(filepath.Join(cwd, "site.json"), nil, 0o644)
	scripts := map[string]string{}
	for _, p := range []cmdline.Program{cli.Program(), agent.Program()} {
		for shell, script := range map[string]string{"zsh": p.Zsh(), "fish": p.Fish()} {
			f := filepath.Join(dir, p.Name+"."+shell)
			os.WriteFile(f, []byte(script), 0o644)
			scripts[p.Name+"."+shell] = f
		}
	}
	complete := map[string][]string{
		"zsh": {"zsh", "-fc", `compadd() { [[ $1 == -- ]] && shift; local w; for w; do [[ $w == ${PREFIX}* ]] && print -r -- $w; done; }
_files() { print -r -- '<files>'; }
words=(${(z)2})
[[ $2 == *' ' ]] && words+=('')
CURRENT=${#words}
PREFIX=${words[CURRENT]}
source "$1" | xargs`, "zsh"},
		"fish": {"fish", "--no-config", "-c", `source $argv[1]
complete -C $argv[2] | string replace -r '\t.*' '' | string join ' '; true`},
	}
	for _, c := range []struct {
		line string
		// files: the shell offers files (site.json, the one here; zsh's
		// <files>), and nothing else.
		files bool
		want  string
	}{
		{"mesh-executor apply s", true, ""},
		{"mesh-executor plan ", true, ""},
		{"mesh-executor reconcile s", true, ""},
		{"mesh-executor doctor --state s", true, ""},
		{"mesh-executor apply --st", false, "--state"},
		{"mesh-executor do", false, "doctor"},
		{"mesh-executor status s", false, ""},
		{"mesh-agent --config s", true, ""},
		{"mesh-agent --conf", false, "--config"},
	} {
		for _, shell := range []string{"zsh", "fish"} {
			t.Run(shell+" "+c.line, func(t *testing.T) {
				want := c.want
				if c.files {
					want = map[string]string{"zsh": "<files>", "fish": "site.json"}[shell]
				}
				args := append(slices.Clone(complete[shell]), scripts[strings.Fields(c.line)[0]+"."+shell], c.line)
				run := exec.Command(args[0], args[1:]...)
				run.Dir = cwd
				out, err := run.CombinedOutput()
				if got := strings.TrimSpace(string(out)); err != nil || got != want {
					t.Errorf("%q<TAB>: %q, want %q (%v)", c.line, got, want, err)
				}
			})
		}
	}
}

// A flag before the command is said so, with the line as it goes.
func TestAFlagBeforeTheCommandIsSaidSo(t *testing.T) {
	var out, errw bytes.Buffer
	code := control.Main(context.Background(), []string{"--dir", "/tmp/k", "node", "show", "n1"}, &out, &errw)
	if code != 2 || !strings.Contains(errw.String(), "flags go after it (mesh-control node show n1 --dir /tmp/k)") {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
}

// A daemon's flag of a value that does not read (a time, a number) says
// so in the programs' words, the flag named as it is written (--), not
// the flag package's "invalid value … for flag -x: parse error".
func TestADaemonsBadValueIsSaidInItsWords(t *testing.T) {
	fs := flag.NewFlagSet("mesh-launch", flag.ContinueOnError)
	fs.Duration("stop-timeout", time.Second, "")
	fs.Int("max-starts", 3, "")
	for args, want := range map[string]string{
		"--stop-timeout=abc": `mesh-launch: --stop-timeout "abc": not a time (such as 30s, 5m or 1h)`,
		"--max-starts=x":     `mesh-launch: --max-starts "x": not a whole number`,
	} {
		var errw bytes.Buffer
		if err := cmdline.ParseAlone(fs, []string{args}, &errw); err == nil || !strings.Contains(errw.String(), want) || strings.Contains(errw.String(), "parse error") {
			t.Errorf("%s: %v, said %q; want %q", args, err, errw.String(), want)
		}
	}
}
