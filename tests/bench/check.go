package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

// verifyTree checks that tree holds exactly the given directories and files:
// directories 0755, files regular, 0644, single-linked, with the exact bytes,
// all owned by root (the bench declares no owner and every tool runs as root),
// and nothing else — a tool that leaves backups or temporary files behind has
// not produced the declared tree.
func verifyTree(tree string, dirs []string, files []benchtree.File) error {
	var problems []string
	want := map[string]bool{}
	for _, d := range dirs {
		want[d] = true
		st, err := lstat(filepath.Join(tree, d))
		switch {
		case os.IsNotExist(err):
			problems = append(problems, d+": missing")
		case err != nil:
			problems = append(problems, err.Error())
		case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
			problems = append(problems, d+": not a directory")
		case st.Mode&0o7777 != benchtree.DirMode || st.Uid != 0 || st.Gid != 0:
			problems = append(problems, fmt.Sprintf("%s: mode %04o owner %d:%d, want 0755 0:0", d, st.Mode&0o7777, st.Uid, st.Gid))
		}
	}
	for _, f := range files {
		want[f.Rel] = true
		if p := checkFile(filepath.Join(tree, f.Rel), f); p != "" {
			problems = append(problems, f.Rel+": "+p)
		}
	}
	err := filepath.WalkDir(tree, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, path)
		if rel != "." && !want[rel] {
			problems = append(problems, rel+": not declared, but present")
		}
		return nil
	})
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) == 0 {
		return nil
	}
	const show = 8
	more := ""
	if len(problems) > show {
		more = fmt.Sprintf("\n  ... and %d more", len(problems)-show)
		problems = problems[:show]
	}
	return fmt.Errorf("the tree is not as declared (%s):\n  %s%s", tree, strings.Join(problems, "\n  "), more)
}

// checkFile returns what is wrong with the file at path, or "".
func checkFile(path string, f benchtree.File) string {
	st, err := lstat(path)
	if err != nil {
		return "missing"
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return "not a regular file"
	}
	if st.Mode&0o7777 != benchtree.FileMode || st.Uid != 0 || st.Gid != 0 || st.Nlink != 1 {
		return fmt.Sprintf("mode %04o owner %d:%d links %d, want 0644 0:0 1", st.Mode&0o7777, st.Uid, st.Gid, st.Nlink)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if !bytes.Equal(got, f.Content) {
		return fmt.Sprintf("content differs (%d bytes, want %d)", len(got), len(f.Content))
	}
	return ""
}

func lstat(path string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return &st, nil
}

// statKey is what changes when anything writes to an entry: its bytes
// (mtime, size, or a new inode after a rename over it) or its metadata (ctime,
// which even a chmod to the same mode moves).
type statKey struct {
	ino, size    int64
	mtime, ctime syscall.Timespec
}

// snapshotTree records every entry of tree, the root included (a temporary
// file created and renamed away still moves its directory's mtime).
func snapshotTree(tree string) (map[string]statKey, error) {
	snap := map[string]statKey{}
	err := filepath.WalkDir(tree, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := lstat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, path)
		snap[rel] = statKey{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
		return nil
	})
	return snap, err
}

// sameSnapshot names the entries a no-op touched.
func sameSnapshot(before, after map[string]statKey) error {
	var touched []string
	for rel, a := range after {
		if b, ok := before[rel]; !ok || a != b {
			touched = append(touched, rel)
		}
	}
	for rel := range before {
		if _, ok := after[rel]; !ok {
			touched = append(touched, rel+" (removed)")
		}
	}
	if len(touched) == 0 {
		return nil
	}
	sort.Strings(touched)
	if len(touched) > 8 {
		touched = append(touched[:8], fmt.Sprintf("... %d in all", len(touched)))
	}
	return fmt.Errorf("it wrote to %s", strings.Join(touched, ", "))
}
