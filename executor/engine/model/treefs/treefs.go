// Package treefs lays the reference model's tree (executor/engine/model)
// out on a machine and reads it back, for the tests that hold an executor
// to the model: the world's tree written as a person would before the
// mesh, the archive's tars, the operator's changes, and the tree as it is.
// The model itself touches nothing; this does, and only under the root it
// is given.
package treefs

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/executor/engine/model"
)

// Path is a model path (under model.TreeRoot) as it is under root.
func Path(root, p string) string {
	return filepath.Join(root, strings.TrimPrefix(p, model.TreeRoot))
}

// Write makes root and the world's tree under it: directories 0755, files
// 0644, as a person makes them.
func Write(root string, tree map[string]model.Node) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, p := range sortedPaths(tree) {
		n, full := tree[p], Path(root, p)
		var err error
		if n.Dir {
			err = os.Mkdir(full, 0o755)
		} else {
			err = os.WriteFile(full, []byte(n.Text), 0o644)
		}
		if err != nil {
			return fmt.Errorf("the world's tree: %w", err)
		}
	}
	return nil
}

// sortedPaths puts a directory before what it holds.
func sortedPaths(tree map[string]model.Node) []string { return slices.Sorted(maps.Keys(tree)) }

// WriteArchives writes each version's tar into dir, under its ArchiveURL.
func WriteArchives(dir string) error {
	for _, v := range []string{"v1", "v2"} {
		if err := os.WriteFile(filepath.Join(dir, model.ArchiveURL(v)), model.ArchiveTar(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Do is the operator's change to the tree, as the model makes it: a file
// written where its parent is a directory and it is none, or a file or an
// empty directory taken out.
func Do(root string, e model.Event) error {
	if e.TreePath == "" {
		return nil
	}
	full := Path(root, e.TreePath)
	info, err := os.Lstat(full)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return err
	}
	if e.TreeOut {
		switch {
		case exists && info.Mode().IsRegular():
			return os.Remove(full)
		case exists && info.IsDir():
			if err := syscall.Rmdir(full); err != nil && !errors.Is(err, syscall.ENOTEMPTY) {
				return err
			}
		}
		return nil
	}
	parent, err := os.Lstat(filepath.Dir(full))
	if err != nil || !parent.IsDir() || exists && info.IsDir() {
		return nil
	}
	return os.WriteFile(full, []byte(e.TreeText), 0o644)
}

// Read is the tree under root as the model names it; anything but a
// directory or a regular file is an error.
func Read(root string) (map[string]model.Node, error) {
	tree := map[string]model.Node{}
	err := filepath.WalkDir(root, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if full == root {
			return nil
		}
		rel, _ := filepath.Rel(root, full)
		p := model.TreeRoot + "/" + filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			tree[p] = model.Node{Dir: true}
		case d.Type().IsRegular():
			b, err := os.ReadFile(full)
			if err != nil {
				return err
			}
			tree[p] = model.Node{Text: string(b)}
		default:
			return fmt.Errorf("%s is a %v", full, d.Type())
		}
		return nil
	})
	return tree, err
}

// Diff says how got differs from want ("" for not at all).
func Diff(got, want map[string]model.Node) string {
	var out []string
	for _, p := range sortedPaths(want) {
		g, ok := got[p]
		switch w := want[p]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s missing (the model has %s)", p, say(w)))
		case g != w:
			out = append(out, fmt.Sprintf("%s is %s (the model has %s)", p, say(g), say(w)))
		}
	}
	for _, p := range sortedPaths(got) {
		if _, ok := want[p]; !ok {
			out = append(out, fmt.Sprintf("%s is %s (the model has nothing there)", p, say(got[p])))
		}
	}
	return strings.Join(out, "; ")
}

func say(n model.Node) string {
	if n.Dir {
		return "a directory"
	}
	return fmt.Sprintf("a file holding %q", n.Text)
}
