package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// The declaration and the cf-agent policy must describe the same tree, or the
// comparison is between different jobs.
func TestDeclarationAndPolicyAgree(t *testing.T) {
	tree := "/var/tmp/mesh-bench/run/x/tree"
	files := benchtree.Files(benchtree.MinFiles)
	data, err := json.Marshal(fullDeclaration(tree, files))
	if err != nil {
		t.Fatal(err)
	}
	var d declaration
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Resources) != benchtree.Dirs+len(files) {
		t.Fatalf("%d resources, want %d", len(d.Resources), benchtree.Dirs+len(files))
	}
	for i, r := range d.Resources[:benchtree.Dirs] {
		if r.Type != "directory" || r.Mode != "0755" || r.Path != filepath.Join(tree, benchtree.DirName(i)) {
			t.Fatalf("resource %d: %+v, want directory %s 0755", i, r, benchtree.DirName(i))
		}
	}
	policy := string(fullPolicy(tree, files))
	for i, r := range d.Resources[benchtree.Dirs:] {
		f := files[i]
		if r.Type != "file" || r.Mode != "0644" || r.Content != string(f.Content) || r.Path != filepath.Join(tree, f.Rel) {
			t.Fatalf("resource %s: %+v", f.Rel, r)
		}
		promise := "    \"" + r.Path + "\"\n      create => \"true\",\n      perms => mesh_bench_file,\n      content => \"" + r.Content + "\";\n"
		if !strings.Contains(policy, promise) {
			t.Fatalf("the policy has no promise for %s like\n%s", f.Rel, promise)
		}
	}
}
