// Package benchtree is the bench's single description of the managed tree:
// which directories and files exist, what each file holds, and which files the
// drift scenario damages.
//
// The driver (which writes the executor's declaration, the cf-agent policy and
// the correctness checks) and the floor program both take the tree from here,
// so all of them agree byte for byte on what "converged" means. It holds no
// I/O: it only names paths relative to a tree root and produces contents.
package benchtree

import (
	"fmt"
	"path/filepath"
)

// The shape of the tree the targets are stated for: files of about 200 bytes
// spread over ten directories, directories 0755 and files 0644.
const (
	Dirs     = 10
	FileSize = 200
	DirMode  = 0o755
	FileMode = 0o644
)

// MinFiles is the smallest file count the drift scenario can damage without
// picking the same file twice.
const MinFiles = 100

// Drifted is what the drift scenario writes over a file's content.
const Drifted = "drifted by mesh-bench\n"

// File is one managed file, named relative to the tree root.
type File struct {
	Index   int
	Rel     string // e.g. "d3/f13"
	Content []byte
}

// DirName is the relative name of directory d.
func DirName(d int) string { return fmt.Sprintf("d%d", d) }

// DirNames lists the relative names of all the directories, in order.
func DirNames() []string {
	ds := make([]string, Dirs)
	for d := range ds {
		ds[d] = DirName(d)
	}
	return ds
}

// Files returns the n managed files in declaration order. File i lives in
// directory i mod Dirs, so every directory gets the same share.
func Files(n int) []File {
	fs := make([]File, n)
	for i := range fs {
		fs[i] = File{
			Index:   i,
			Rel:     filepath.Join(DirName(i%Dirs), fmt.Sprintf("f%d", i)),
			Content: content(i),
		}
	}
	return fs
}

// One is the single file of the one-file scenario. It sits directly in the
// tree root, so its declaration needs no directory.
func One() File {
	return File{Index: -1, Rel: "one", Content: content(1 << 20)}
}

// Drift returns which files the drift scenario changes (10) and deletes (5),
// spread over the tree. n must be at least MinFiles.
func Drift(n int) (changed, deleted []int) {
	for k := 0; k < 10; k++ {
		changed = append(changed, k*n/10+3)
	}
	for k := 0; k < 5; k++ {
		deleted = append(deleted, k*n/5+7)
	}
	return changed, deleted
}

// alphabet is deliberately plain: no quote, backslash, dollar or at sign, so
// the same text is a valid literal in JSON and in a CFEngine string without
// any escaping that could make the two differ.
const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// content makes file i's FileSize bytes: a header naming the file, then
// pseudo-random text (so no two files hash alike), then a newline.
func content(i int) []byte {
	b := make([]byte, 0, FileSize)
	b = fmt.Appendf(b, "mesh-bench file %d ", i)
	x := uint32(2166136261) ^ uint32(i)*16777619 // xorshift seed
	if x == 0 {
		x = 1 // xorshift is stuck at zero
	}
	for len(b) < FileSize-1 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b = append(b, alphabet[x%uint32(len(alphabet))])
	}
	return append(b, '\n')
}
