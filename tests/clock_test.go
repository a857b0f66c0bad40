package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// nodeDirs hold the code that runs on a node: its time is read through
// package clock, in the kind each read needs (see clock's doc).
var nodeDirs = []string{"agent", "executor", "launcher", "wire", "cmd/mesh-agent", "cmd/mesh-executor", "cmd/mesh-launch"}

// A node's code reads the time only through package clock, and never
// hands the runtime a deadline made from what the clock says (Now, Since,
// Until), which a chaosclock build shifts: a connection's or a context's
// deadline is measured on the runtime's own clock, so a skewed node would
// wait hours, or not at all. The chaos run's node with a clock hours off
// is only as faithful as this rule.
func TestTheNodeReadsTheTimeThroughClock(t *testing.T) {
	deadlineCalls := map[string]bool{"SetDeadline": true, "SetReadDeadline": true, "SetWriteDeadline": true, "WithDeadline": true}
	checked := 0
	for _, dir := range nodeDirs {
		err := filepath.WalkDir(filepath.Join("..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			checked++
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if pkgIs(n.X, "time") && (n.Sel.Name == "Now" || n.Sel.Name == "Since" || n.Sel.Name == "Until") {
						t.Errorf("%s: time.%s: a node reads the time through package clock (Now for what its clock says, Deadline for the runtime's deadlines)", fset.Position(n.Pos()), n.Sel.Name)
					}
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok || !deadlineCalls[sel.Sel.Name] {
						return true
					}
					for _, a := range n.Args {
						ast.Inspect(a, func(m ast.Node) bool {
							if s, ok := m.(*ast.SelectorExpr); ok && pkgIs(s.X, "clock") && (s.Sel.Name == "Now" || s.Sel.Name == "Since" || s.Sel.Name == "Until") {
								t.Errorf("%s: %s(… clock.%s …): the runtime's deadlines come from clock.Deadline", fset.Position(s.Pos()), sel.Sel.Name, s.Sel.Name)
							}
							return true
						})
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files of a node's code looked at", checked)
	}
}

func pkgIs(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == name
}
