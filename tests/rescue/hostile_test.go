package rescue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A hostile local user cannot steer the engine with links.
//
// The attacker is uid 65534, acting in its own process. It owns a
// directory the declarations write into (home/attacker, like a home
// directory). Elsewhere root has a secret (0600) it wants to read or
// destroy, and a victim directory (think /etc/cron.d) it wants root to write
// a file into or remove one from. Each case plants a symlink, a hardlink or a
// FIFO — before an apply, between two applies, or while an apply runs — and
// checks that the apply failed or was refused naming what it found, that the
// secret and the victim directory are byte for byte as they were (nothing
// written, nothing new, nothing removed, not even for an instant: the
// victim directory's mtime would say), that no kept original in the state
// holds the secret's or the victim's bytes, and that no report carries them.

type hostileEnv struct {
	base     string
	decls    string // root 0755: declaration files
	attacker string // home/attacker: the attacker's own directory
	victim   string // root 0755, holds victim.conf
	secret   string // root 0600
	secretB  []byte
	victimB  []byte
	snaps    map[string]snap // the secret, the victim directory and its file
	states   []string        // every state directory used
	outputs  [][]byte        // every report printed
}

const (
	secretContent = "-----BEGIN SECRET KEY-----\nroot's secret, 0600\n-----END SECRET KEY-----\n"
	victimContent = "# /etc/cron.d/victim: only root may write here\n"
	victimName    = "victim.conf"
)

func newHostileEnv(t *testing.T) *hostileEnv {
	t.Helper()
	needRoot(t)
	base := rootDir(t)
	e := &hostileEnv{
		base:     base,
		decls:    filepath.Join(base, "decls"),
		attacker: filepath.Join(base, "home", "attacker"),
		victim:   filepath.Join(base, "victim"),
		secret:   filepath.Join(base, "private", "secret.key"),
		secretB:  []byte(secretContent),
		victimB:  []byte(victimContent),
		snaps:    map[string]snap{},
	}
	for _, d := range []string{e.decls, filepath.Dir(e.attacker), e.victim, filepath.Dir(e.secret)} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(e.attacker, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(e.attacker, attackerUID, attackerGID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.secret, e.secretB, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.victim, victimName), e.victimB, 0o644); err != nil {
		t.Fatal(err)
	}
	// Let a second pass by; a write that changed the directory in the
	// same tick would otherwise keep its mtime.
	time.Sleep(20 * time.Millisecond)
	for _, p := range []string{e.secret, e.victim, filepath.Join(e.victim, victimName), filepath.Dir(e.secret)} {
		e.snaps[p] = snapshotPath(t, p)
	}
	// The attacker really is unprivileged: it cannot touch the victim
	// directory or the secret's directory itself.
	attack(t, deniedOp(filepath.Join(e.victim, "x")), deniedOp(filepath.Join(filepath.Dir(e.secret), "x")))
	return e
}

// state is a fresh state directory.
func (e *hostileEnv) state(name string) string {
	s := filepath.Join(e.base, "state-"+name)
	e.states = append(e.states, s)
	return s
}

// applyDecl writes d and applies (or plans) it with a deadline: a planted
// FIFO must not make the executor hang.
func (e *hostileEnv) applyDecl(t *testing.T, verb, state, name string, d declaration) *report {
	t.Helper()
	file := writeDecl(t, e.decls, name+".json", d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := runExecutor(ctx, verb, "--state", state, "--json", file)
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not finish within 10s: the executor hangs on what the attacker planted", verb, name)
	}
	if err != nil {
		t.Fatal(err)
	}
	e.outputs = append(e.outputs, res.stdout, res.stderr)
	return decodeReport(t, res)
}

func decodeReport(t *testing.T, res result) *report {
	t.Helper()
	var rep report
	if err := json.Unmarshal(res.stdout, &rep); err != nil {
		t.Fatalf("exit %d, cannot decode the report: %v\n%s%s", res.exit, err, res.stdout, res.stderr)
	}
	if want := map[string]int{"refused": 2, "failed": 1}[rep.Outcome]; res.exit != want {
		t.Fatalf("outcome %q with exit %d, want exit %d\n%s", rep.Outcome, res.exit, want, res.stdout)
	}
	return &rep
}

// blocked asserts that rep failed or was refused, and that what it says
// names one of words (the link, the non-regular file, the hardlink).
func blocked(t *testing.T, rep *report, words ...string) {
	t.Helper()
	var said []string
	if rep.Refused != "" {
		said = append(said, rep.Refused)
	}
	for _, l := range rep.Lines {
		if l.Outcome == "failed" {
			said = append(said, l.Detail)
		}
	}
	if rep.Outcome != "failed" && rep.Outcome != "refused" {
		t.Fatalf("the apply's outcome is %q; it must fail or be refused (lines: %+v)", rep.Outcome, rep.Lines)
	}
	text := strings.Join(said, "\n")
	for _, w := range words {
		if strings.Contains(text, w) {
			t.Logf("%s: %s", rep.Outcome, text)
			return
		}
	}
	t.Errorf("the apply %s, but does not say why in terms of %q: %s", rep.Outcome, words, text)
}

// unharmed asserts the secret and the victim directory are exactly as
// they were, and that no kept original or report holds their bytes.
func (e *hostileEnv) unharmed(t *testing.T) {
	t.Helper()
	for p, s := range e.snaps {
		if d := sameAs(p, s); d != "" {
			t.Errorf("%s was changed: %s", p, d)
		}
	}
	if got := names(t, e.victim); !slices.Equal(got, []string{victimName}) {
		t.Errorf("the victim directory now holds %v; it held only %s", got, victimName)
	}
	if got := names(t, filepath.Dir(e.secret)); !slices.Equal(got, []string{filepath.Base(e.secret)}) {
		t.Errorf("the secret's directory now holds %v", got)
	}
	for _, st := range e.states {
		dir := filepath.Join(st, "originals")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // no apply got that far
		}
		for _, ent := range ents {
			b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
			if err != nil {
				t.Errorf("read kept original %s: %v", ent.Name(), err)
				continue
			}
			if bytes.Contains(b, e.secretB) || bytes.Contains(b, e.victimB) {
				t.Errorf("the state keeps a copy of root's file as an \"original\": %s holds %q", filepath.Join(dir, ent.Name()), clip(b))
			}
		}
	}
	for _, out := range e.outputs {
		if bytes.Contains(out, e.secretB) || bytes.Contains(out, []byte("root's secret")) {
			t.Errorf("a report carries the secret: %s", out)
		}
	}
}

func hostFile(path string) resource {
	return fileRes("app", "conf", path, "written by the host\n", "0644")
}

func decl(rs ...resource) declaration { return declaration{Version: 1, Resources: rs} }

// a. Before an apply, the directory the declared file is in is a symlink to
// a root directory: the write must not land there.
func TestHostileSymlinkedParentDirectoryDoesNotRedirectAWrite(t *testing.T) {
	e := newHostileEnv(t)
	sub := filepath.Join(e.attacker, "conf.d")
	attack(t, symlinkOp(e.victim, sub))
	// The declared file has the victim's name: writing through the link
	// would replace it, keeping an original would copy it.
	target := filepath.Join(sub, victimName)

	t.Run("plan", func(t *testing.T) {
		blocked(t, e.applyDecl(t, "plan", e.state("a-plan"), "a", decl(hostFile(target))), "symbolic link")
		e.unharmed(t)
	})
	t.Run("apply_a_file_below_it", func(t *testing.T) {
		blocked(t, e.applyDecl(t, "apply", e.state("a-file"), "a", decl(hostFile(target))), "symbolic link")
		e.unharmed(t)
	})
	t.Run("apply_the_directory_and_a_file_below_it", func(t *testing.T) {
		d := decl(dirRes("app", "dir", sub, "0755"), hostFile(target))
		blocked(t, e.applyDecl(t, "apply", e.state("a-dir"), "a-dir", d), "symbolic link")
		e.unharmed(t)
	})
}

// b. The declared file itself is a symlink to the secret: neither written
// through nor read as the "original" the host would keep.
func TestHostileSymlinkAtTheDeclaredFileIsNeitherWrittenNorReadAsAnOriginal(t *testing.T) {
	e := newHostileEnv(t)
	target := filepath.Join(e.attacker, "app.conf")
	attack(t, symlinkOp(e.secret, target))
	t.Run("plan", func(t *testing.T) {
		blocked(t, e.applyDecl(t, "plan", e.state("b-plan"), "b", decl(hostFile(target))), "symbolic link")
		e.unharmed(t)
	})
	t.Run("apply", func(t *testing.T) {
		st := e.state("b")
		blocked(t, e.applyDecl(t, "apply", st, "b", decl(hostFile(target))), "symbolic link")
		e.unharmed(t)
		if s, err := os.Readlink(target); err != nil || s != e.secret {
			t.Errorf("the attacker's link was replaced or removed: %q %v", s, err)
		}
		if list := owned(t, st); len(list) > 0 && !list[0].Pending {
			t.Errorf("the store claims %s after the write was refused: %+v", target, list)
		}
	})
}

// c. The declared file is a hardlink: rewriting it in place would change
// its other name too, and keeping its "original" would copy that file.
func TestHostileHardlinkAtTheDeclaredFileIsRefused(t *testing.T) {
	t.Run("to_a_file_the_attacker_owns", func(t *testing.T) {
		e := newHostileEnv(t)
		mine := filepath.Join(e.attacker, "mine")
		target := filepath.Join(e.attacker, "app.conf")
		attack(t, writeOp(mine, "the attacker's own file\n"), hardlinkOp(mine, target))
		before := snapshotPath(t, mine)
		blocked(t, e.applyDecl(t, "apply", e.state("c-own"), "c", decl(hostFile(target))), "hardlink")
		if d := sameAs(mine, before); d != "" {
			t.Errorf("the attacker's file behind the hardlink was changed: %s", d)
		}
		e.unharmed(t)
	})
	t.Run("to_the_root_secret_planted_by_root", func(t *testing.T) {
		// protected_hardlinks keeps the attacker from linking root's file
		// itself; the host must refuse such a link wherever it comes from.
		e := newHostileEnv(t)
		target := filepath.Join(e.attacker, "app.conf")
		if err := os.Link(e.secret, target); err != nil {
			t.Fatal(err)
		}
		blocked(t, e.applyDecl(t, "plan", e.state("c-secret-plan"), "c", decl(hostFile(target))), "hardlink")
		blocked(t, e.applyDecl(t, "apply", e.state("c-secret"), "c", decl(hostFile(target))), "hardlink")
		e.unharmed(t)
	})
}

// d. The declared file is a FIFO: an open for reading the "original" or
// comparing content would block forever if the host did not refuse it.
func TestHostileFIFOAtTheDeclaredFileIsRefusedWithoutHanging(t *testing.T) {
	e := newHostileEnv(t)
	target := filepath.Join(e.attacker, "app.conf")
	attack(t, mkfifoOp(target))
	for _, verb := range []string{"plan", "apply"} {
		t.Run(verb, func(t *testing.T) {
			start := time.Now()
			blocked(t, e.applyDecl(t, verb, e.state("d-"+verb), "d", decl(hostFile(target))), "the host writes only regular files")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("%s took %v with a FIFO in place", verb, took)
			}
			e.unharmed(t)
		})
	}
}

// e. Removal: the host created a file in the attacker's directory; the
// attacker replaces it (or its directory) with a symlink to root's file,
// and owns_nothing runs. Nothing is followed: a link in the file's place
// is the attacker's, left as it is, and the host forgets its file, gone;
// a link in its directory's place leaves the entry kept, its file perhaps
// where the directory went, removed once the link is gone.
func TestHostileSymlinkSwappedInAfterCreationDoesNotSteerTheRemoval(t *testing.T) {
	t.Run("the_file_replaced_by_a_symlink_to_the_secret", func(t *testing.T) {
		e := newHostileEnv(t)
		st := e.state("e-file")
		target := filepath.Join(e.attacker, "app.conf")
		if rep := e.applyDecl(t, "apply", st, "e", decl(hostFile(target))); rep.Outcome != "applied" {
			t.Fatalf("the first apply is %s: %+v", rep.Outcome, rep.Lines)
		}
		attack(t, removeOp(target), symlinkOp(e.secret, target))
		rep := e.applyDecl(t, "apply", st, "e-none", ownsNothing())
		if len(rep.Lines) != 1 || rep.Lines[0] != (line{Module: "app", ID: "conf", Type: "file", Outcome: "forgotten", Detail: "the host created it; a symbolic link is there now, which the host did not make: left as it is"}) {
			t.Errorf("the removal of app.conf is not the one forgotten line: %+v", rep.Lines)
		}
		if list := owned(t, st); len(list) != 0 {
			t.Errorf("still held: %+v", list)
		}
		e.unharmed(t)
		if s, err := os.Readlink(target); err != nil || s != e.secret {
			t.Errorf("the link is no longer there as planted: %q %v", s, err)
		}
	})
	t.Run("the_directory_replaced_by_a_symlink_to_the_victim_directory", func(t *testing.T) {
		e := newHostileEnv(t)
		st := e.state("e-dir")
		sub := filepath.Join(e.attacker, "conf.d")
		attack(t, mkdirOp(sub))
		// Named like the victim's file: removing through the link would
		// remove it.
		target := filepath.Join(sub, victimName)
		if rep := e.applyDecl(t, "apply", st, "e", decl(hostFile(target))); rep.Outcome != "applied" {
			t.Fatalf("the first apply is %s: %+v", rep.Outcome, rep.Lines)
		}
		attack(t, renameOp(sub, sub+".old"), symlinkOp(e.victim, sub))
		rep := e.applyDecl(t, "apply", st, "e-none", ownsNothing())
		if rep.Outcome != "kept" || len(rep.Lines) != 1 || !strings.Contains(rep.Lines[0].Detail, "a link is on its way now, which the host never follows: kept") {
			t.Errorf("the removal through the linked directory: %s %+v", rep.Outcome, rep.Lines)
		}
		e.unharmed(t)
	})
}

// f. Restoring an original: the host replaced a file the attacker owned in
// the attacker's directory; the attacker then swaps that directory for a
// symlink to a root directory. Giving the original back must not write an
// attacker-owned file there.
func TestHostileSymlinkedParentDoesNotSteerRestoringAnOriginal(t *testing.T) {
	e := newHostileEnv(t)
	st := e.state("f")
	sub := filepath.Join(e.attacker, "conf.d")
	target := filepath.Join(sub, victimName)
	const orig = "* * * * * root /home/attacker/payload\n"
	attack(t, mkdirOp(sub), writeOp(target, orig))
	rep := e.applyDecl(t, "apply", st, "f", decl(hostFile(target)))
	if rep.Outcome != "applied" {
		t.Fatalf("the first apply is %s: %+v", rep.Outcome, rep.Lines)
	}
	if list := owned(t, st); len(list) != 1 || list[0].Original == nil || list[0].Original.UID != attackerUID {
		t.Fatalf("the host did not keep the attacker's file as the original: %+v", list)
	}
	attack(t, renameOp(sub, sub+".old"), symlinkOp(e.victim, sub))
	if rep := e.applyDecl(t, "apply", st, "f-none", ownsNothing()); rep.Outcome != "kept" || len(rep.Lines) != 1 || !strings.Contains(rep.Lines[0].Detail, "a link is on its way now, which the host never follows: kept") {
		t.Errorf("the restore through the linked directory: %s %+v", rep.Outcome, rep.Lines)
	}
	e.unharmed(t)

	// Waiting lost nothing: with the directory back, the original is
	// given back where it was found.
	attack(t, removeOp(sub), renameOp(sub+".old", sub))
	if rep := e.applyDecl(t, "apply", st, "f-none", ownsNothing()); rep.Outcome != "restored" {
		t.Fatalf("with the directory back, owns_nothing is %s: %+v", rep.Outcome, rep.Lines)
	}
	got := snapshotPath(t, target)
	if string(got.content) != orig || got.uid != attackerUID {
		t.Errorf("the original is not back: %q owned by %d", got.content, got.uid)
	}
	e.unharmed(t)
}

// g. During an apply: while the host writes 300 files into the attacker's
// directory, the attacker swaps that directory for a symlink to the victim
// directory and back, as fast as it can. The apply may fail; it must never
// write, read or remove through the link.
func TestHostileDirectorySwappedForASymlinkDuringAnApplyNeverRedirectsAWrite(t *testing.T) {
	const files, rounds = 300, 3
	const swapFor = 3 * time.Second
	e := newHostileEnv(t)
	work := filepath.Join(e.attacker, "work")
	attack(t, mkdirOp(work))
	applies, interfered, midWrite, refusedBefore := 0, 0, 0, 0
	for r := 1; r <= rounds; r++ {
		t.Run(fmt.Sprintf("round_%d", r), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), swapFor+30*time.Second)
			defer cancel()
			cmd, out := attackerCmd(ctx, t, swapOp(work, e.victim, swapFor))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			reasons := map[string]int{}
			for k := 0; ; k++ {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("the attacker failed: %v: %s", err, out.String())
					}
					t.Logf("round %d: %d applies against the attacker's %s; failures: %v", r, k, strings.TrimSpace(out.String()), reasons)
					if fi, err := os.Lstat(work); err != nil || !fi.IsDir() {
						t.Fatalf("the attacker left no real directory behind: %v", err)
					}
					e.unharmed(t)
					return
				default:
				}
				// Every apply writes: fresh state, new content. One of the
				// files has the victim's name.
				var d declaration
				d.Version = 1
				for i := 0; i <= files; i++ {
					id, name := fmt.Sprintf("f%03d", i), fmt.Sprintf("f%03d", i)
					if i == files {
						id, name = "victim", victimName
					}
					d.Resources = append(d.Resources, fileRes("work", id, filepath.Join(work, name),
						fmt.Sprintf("round %d apply %d file %s\n", r, k, name), "0644"))
				}
				rep := e.applyDecl(t, "apply", e.state(fmt.Sprintf("g-%d-%d", r, k)), fmt.Sprintf("g-%d-%d", r, k), d)
				applies++
				if rep.Outcome == "refused" {
					// The attacker had taken the directory away when the
					// apply looked, before anything changed: refused whole,
					// which is safe too, but not the race this test runs.
					if !strings.Contains(rep.Refused, "is not there, and no directory resource before it declares it") {
						t.Fatalf("the apply was refused: %s", rep.Refused)
					}
					refusedBefore++
					e.unharmed(t)
					continue
				}
				written := 0
				for _, l := range rep.Lines {
					switch l.Outcome {
					case "failed":
						reasons[reason(l.Detail)]++
					case "applied":
						written++
					}
				}
				if rep.Outcome == "failed" {
					interfered++
					if written > 0 {
						midWrite++
					}
				}
				e.unharmed(t)
				if t.Failed() {
					cancel()
					<-done
					return
				}
			}
		})
	}
	t.Logf("%d applies raced the attacker; %d refused before anything changed (the directory gone when looked at), %d failed, %d of them after writing some files", applies, refusedBefore, interfered, midWrite)
	if applies > 0 && interfered == 0 {
		t.Errorf("no apply ever met the attacker's link: the race was not exercised")
	}
}

// reason shortens a failure's detail to its kind, for the log.
func reason(detail string) string {
	if strings.HasPrefix(detail, "read back: ") {
		return "read back: " + reason(strings.TrimPrefix(detail, "read back: "))
	}
	for _, r := range []string{"symbolic link", "does not exist", "not a regular file", "hardlink", "does not hold what was written"} {
		if strings.Contains(detail, r) {
			return r
		}
	}
	if len(detail) > 80 {
		return detail[:80]
	}
	return detail
}

// Writing into a shared file the attacker controls the path of (a region
// or keys in a file of its home): a link to root's file, a link on the
// way, a FIFO, or a link swapped in before the mesh's lines are taken out
// again — each refused, naming what it found, root's files untouched.
func TestHostileLinksAndFIFOsAtAnEditedFile(t *testing.T) {
	edits := map[string]func(path string) resource{
		"region": func(p string) resource { return regionRes("app", "hosts", p, "10.0.0.5 db\n") },
		"keys":   func(p string) resource { return keysRes("app", "conf", p, map[string]string{"listen": "0.0.0.0"}) },
	}
	for kind, mk := range edits {
		t.Run(kind, func(t *testing.T) {
			e := newHostileEnv(t)
			t.Run("a_link_to_roots_file", func(t *testing.T) {
				target := filepath.Join(e.attacker, "hosts")
				attack(t, symlinkOp(filepath.Join(e.victim, victimName), target))
				for _, verb := range []string{"plan", "apply"} {
					blocked(t, e.applyDecl(t, verb, e.state(kind+"-link-"+verb), "link", decl(mk(target))), "symbolic link")
				}
				e.unharmed(t)
			})
			t.Run("a_link_on_the_way", func(t *testing.T) {
				sub := filepath.Join(e.attacker, "etc")
				attack(t, symlinkOp(e.victim, sub))
				blocked(t, e.applyDecl(t, "apply", e.state(kind+"-parent"), "parent", decl(mk(filepath.Join(sub, victimName)))), "symbolic link")
				e.unharmed(t)
			})
			t.Run("a_fifo", func(t *testing.T) {
				target := filepath.Join(e.attacker, "fifo")
				attack(t, mkfifoOp(target))
				start := time.Now()
				blocked(t, e.applyDecl(t, "apply", e.state(kind+"-fifo"), "fifo", decl(mk(target))), "not a regular file")
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("the apply took %v with a FIFO in place", took)
				}
				e.unharmed(t)
			})
			t.Run("a_link_swapped_in_before_the_give_back", func(t *testing.T) {
				target := filepath.Join(e.attacker, "app.conf")
				attack(t, writeOp(target, "# the attacker's own file\nlisten = 127.0.0.1\n"))
				st := e.state(kind + "-swap")
				if rep := e.applyDecl(t, "apply", st, "swap", decl(mk(target))); rep.Outcome != "applied" {
					t.Fatalf("the first apply: %+v", rep)
				}
				attack(t, removeOp(target), symlinkOp(filepath.Join(e.victim, victimName), target))
				blocked(t, e.applyDecl(t, "apply", st, "swap-none", ownsNothing()), "symbolic link")
				e.unharmed(t)
			})
		})
	}
}
