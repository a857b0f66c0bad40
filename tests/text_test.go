package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// How the repository was made is git's to say. Its text — code comments,
// documents, scripts, units — speaks of the software as it is: why it is
// this way, what would break otherwise, for its operators and reviewers.
// Each pattern here is a way the making leaks into that text, with what
// to write instead.
var madeOf = []struct {
	re   *regexp.Regexp
	fix  string
	name string
}{
	{regexp.MustCompile(`\b[Ss]essions? [0-9]+`), "say the reason and its figure, without when it was found", "a working session"},
	{regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+`), "say what the software does, not which request asked for it", "an issue number"},
	{regexp.MustCompile(`\b[Tt]he [r]eview\b|\([r]eview\)`), "say what is checked and by which test", "a mention of a reading of the code"},
	{regexp.MustCompile(`\b[Tt]he [i]ssue\b|\b[Tt]he [i]ssue's`), "say what the software does and why", "a mention of a request"},
	{regexp.MustCompile(`(?i)\ban earlier [d]evelopment build`), "say what the code accepts and why, or drop it", "a mention of an unreleased build"},
	{regexp.MustCompile(`(?i)\b[r]eviewed text\b`), "say what is not run or compiled here, and why", "text said to be read, not run"},
	{regexp.MustCompile(`\bthe [s]eeds'`), "say the rule itself, or cite the design document by its title", "the design seeds"},
	{regexp.MustCompile(`\b[0-9]{3}_[0-9a-f]{16}\.txt\b`), "cite the design document by its title", "a seed's file name"},
	{regexp.MustCompile(`(?i)\bADRs?[-_/][0-9]+|\badrs?/`), "cite an ADR by its number and title (ADR 0118, what undeclaring gives back), not as a file", "an ADR as a file"},
}

// A document cited by name must be one the repository holds.
var cited = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)

// textAllow: files this test does not scan. None: its own patterns are
// written so that they do not match themselves ([r]eview).
var textAllow = []string{}

// textKinds: the kinds of file a person reads as text.
func textKind(p string) bool {
	switch filepath.Ext(p) {
	case ".go", ".md", ".sh", ".yaml", ".yml", ".conf", ".service", ".rc", ".te", ".if", ".fc", ".html":
		return true
	}
	base := filepath.Base(p)
	return base == "Makefile" || strings.HasPrefix(p, "init/") || strings.HasPrefix(p, ".ci/") ||
		base == "run" || strings.HasPrefix(p, "selinux/")
}

func TestTextSpeaksOfTheSoftware(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files").Output()
	if err != nil {
		t.Fatalf("no git checkout to list (the test reads what git tracks): %v", err)
	}
	tracked := map[string]bool{}
	files := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, f := range files {
		tracked[f] = true
	}
	holds := func(from, doc string) bool {
		doc = strings.TrimPrefix(doc, "/usr/share/doc/nox-mesh-host/") // installed from docs/ or the root
		for _, p := range []string{doc, filepath.Join(filepath.Dir(from), doc), filepath.Join("docs", doc)} {
			if tracked[filepath.Clean(p)] {
				return true
			}
		}
		return false
	}
	allowed := func(p string) bool {
		for _, a := range textAllow {
			if strings.HasPrefix(p, a) {
				return true
			}
		}
		return false
	}
	scanned := 0
	for _, f := range files {
		if !textKind(f) || allowed(f) || strings.Contains(f, "/testdata/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			continue // deleted in the working tree, not yet in git
		}
		scanned++
		for i, line := range strings.Split(string(data), "\n") {
			for _, p := range madeOf {
				if m := p.re.FindString(line); m != "" {
					t.Errorf("%s:%d: %q speaks of how the repository was made (%s): %s", f, i+1, m, p.name, p.fix)
				}
			}
			// A Go string's \n before a path is not part of it.
			for _, doc := range cited.FindAllString(strings.NewReplacer(`\n`, " ", `\t`, " ").Replace(line), -1) {
				if !holds(f, doc) {
					t.Errorf("%s:%d: cites %s, which the repository does not hold", f, i+1, doc)
				}
			}
		}
	}
	if scanned < 100 {
		t.Fatalf("only %d files scanned: the listing is wrong", scanned)
	}
}
