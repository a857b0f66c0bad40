package tests

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every package has exactly one package doc comment, so the doc that says
// what a package is for, and what it refuses to do, is never missing or
// split.
func TestOnePackageDoc(t *testing.T) {
	docs := map[string][]string{}
	err := filepath.Walk("..", func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() && (strings.HasPrefix(fi.Name(), ".") && p != ".." || fi.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(p)
		if _, ok := docs[dir]; !ok {
			docs[dir] = nil
		}
		if f.Doc != nil {
			docs[dir] = append(docs[dir], filepath.Base(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range docs {
		if len(files) != 1 {
			t.Errorf("%s: %d files carry a package doc (%v); want exactly one", dir, len(files), files)
		}
	}
}

func TestGofmt(t *testing.T) {
	out, err := exec.Command("gofmt", "-l", "..").CombinedOutput()
	if err != nil {
		t.Fatalf("gofmt: %v\n%s", err, out)
	}
	if len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("not gofmt'd:\n%s", out)
	}
}

// Every fuzz target runs longer in `make fuzz`: a target added without a
// line there, or a line naming a target that is gone, fails here.
func TestEveryFuzzTargetInMakeFuzz(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	fuzz := string(mk)[strings.Index(string(mk), "\nfuzz:"):]
	if i := strings.Index(fuzz[1:], "\n\n"); i > 0 {
		fuzz = fuzz[:i+1]
	}
	found := map[string]bool{}
	re := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			found[m[1]] = true
			if !strings.Contains(fuzz, m[1]) {
				t.Errorf("%s (%s) is not in make fuzz", m[1], p)
			}
		}
		return nil
	})
	for _, m := range regexp.MustCompile(`Fuzz\w+`).FindAllString(fuzz, -1) {
		if !found[m] {
			t.Errorf("make fuzz names %s, which no test defines", m)
		}
	}
}
