// Command floor is the bench's physical floor: the least work any tool must do
// to reach, or confirm, the benchmark tree's state, done in its own process so
// that process start is counted exactly as it is for mesh-executor and
// cf-agent.
//
// Usage:
//
//	floor converge DIR N          mkdir the directories; per file: temp, write, fsync, rename
//	floor converge-batched DIR N  the same without per-file fsync; one syncfs at the end
//	floor check DIR N             per file: stat, read, sha256, compare (exit 1 on a difference)
//	floor repair DIR N            check, then rewrite what differs as converge does
//	floor repair-batched DIR N    check, then rewrite what differs as converge-batched does
//	floor one DIR                 write DIR/one: temp, write, fsync, rename
//
// "Durable" means what it means for the executor: a file's bytes are on disk
// before its name points at them (fsync, then rename), and the directories
// whose entries changed are fsync'd afterwards so the names are on disk too.
// The batched variants show what durability costs: they only promise the whole
// tree is on disk when they exit.
//
// The floor deliberately does not parse a declaration, keep a journal, guard
// against symlinks or report anything: it is the filesystem work alone, taken
// from the same benchtree description the driver declares.
package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/tests/bench/internal/benchtree"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: floor converge|converge-batched|check|repair|repair-batched DIR N | floor one DIR")
	}
	// Modes are created explicitly; the caller's umask must not change them.
	syscall.Umask(0)
	mode, root := args[0], args[1]
	if mode == "one" {
		return one(root)
	}
	if len(args) != 3 {
		return fmt.Errorf("%s: want DIR N", mode)
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 1 {
		return fmt.Errorf("%s: bad file count %q", mode, args[2])
	}
	files := benchtree.Files(n)
	switch mode {
	case "converge":
		return converge(root, files, true)
	case "converge-batched":
		return converge(root, files, false)
	case "check":
		bad, err := check(root, files)
		if err != nil {
			return err
		}
		if len(bad) > 0 {
			return fmt.Errorf("check: %d of %d files differ (first: %s)", len(bad), n, bad[0].Rel)
		}
		return nil
	case "repair":
		return repair(root, files, true)
	case "repair-batched":
		return repair(root, files, false)
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// converge builds the tree from nothing. With durable set, every file is
// fsync'd before its rename and every directory after its entries changed;
// otherwise one syncfs at the end stands for all of it.
func converge(root string, files []benchtree.File, durable bool) error {
	for d := 0; d < benchtree.Dirs; d++ {
		err := syscall.Mkdir(filepath.Join(root, benchtree.DirName(d)), benchtree.DirMode)
		if err != nil && err != syscall.EEXIST {
			return fmt.Errorf("mkdir %s: %w", benchtree.DirName(d), err)
		}
	}
	for _, f := range files {
		if err := writeFile(root, f, durable); err != nil {
			return err
		}
	}
	return finish(root, benchtree.DirNames(), durable)
}

// repair checks the whole tree and rewrites only the files that differ.
func repair(root string, files []benchtree.File, durable bool) error {
	bad, err := check(root, files)
	if err != nil {
		return err
	}
	touched := map[string]bool{}
	for _, f := range bad {
		if err := writeFile(root, f, durable); err != nil {
			return err
		}
		touched[filepath.Dir(f.Rel)] = true
	}
	if len(bad) == 0 {
		return nil
	}
	dirs := make([]string, 0, len(touched))
	for d := range touched {
		dirs = append(dirs, d)
	}
	return finish(root, dirs, durable)
}

// one writes the one-file scenario's single file, durably.
func one(root string) error {
	if err := writeFile(root, benchtree.One(), true); err != nil {
		return err
	}
	return fsyncPath(root)
}

// check stats, reads and hashes every file and returns those that are missing
// or differ in type, mode, size or content. A directory that is missing or
// wrong is an error: repair does not cover it, and no scenario causes it.
func check(root string, files []benchtree.File) ([]benchtree.File, error) {
	var st syscall.Stat_t
	for d := 0; d < benchtree.Dirs; d++ {
		name := filepath.Join(root, benchtree.DirName(d))
		if err := syscall.Lstat(name, &st); err != nil {
			return nil, fmt.Errorf("stat %s: %w", name, err)
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || st.Mode&0o7777 != benchtree.DirMode {
			return nil, fmt.Errorf("%s: not a 0755 directory", name)
		}
	}
	var bad []benchtree.File
	buf := make([]byte, benchtree.FileSize+1) // one spare byte reveals a longer file
	for _, f := range files {
		ok, err := matches(filepath.Join(root, f.Rel), f.Content, buf, &st)
		if err != nil {
			return nil, err
		}
		if !ok {
			bad = append(bad, f)
		}
	}
	return bad, nil
}

// matches reports whether path is a regular 0644 file holding want, by
// stat, read and sha256: the same evidence a tool keeping hashes would use.
func matches(path string, want, buf []byte, st *syscall.Stat_t) (bool, error) {
	if err := syscall.Lstat(path, st); err != nil {
		if err == syscall.ENOENT {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Mode&0o7777 != benchtree.FileMode || st.Size != int64(len(want)) {
		return false, nil
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	n, err := readFull(fd, buf)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	got := sha256.Sum256(buf[:n])
	wantSum := sha256.Sum256(want)
	return bytes.Equal(got[:], wantSum[:]), nil
}

// writeFile replaces root/f.Rel the atomic way: a temporary name beside it,
// written (and fsync'd when durable), then renamed over the real name.
func writeFile(root string, f benchtree.File, durable bool) error {
	path := filepath.Join(root, f.Rel)
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	fd, err := syscall.Open(tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, benchtree.FileMode)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := syscall.Write(fd, f.Content); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if durable {
		if err := syscall.Fsync(fd); err != nil {
			syscall.Close(fd)
			return fmt.Errorf("fsync %s: %w", tmp, err)
		}
	}
	if err := syscall.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := syscall.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}
	return nil
}

// finish makes the renames durable: an fsync of each directory whose entries
// changed (and of the root, whose entries change when directories are made),
// or a single syncfs when batched.
func finish(root string, dirs []string, durable bool) error {
	if !durable {
		return syncfs(root)
	}
	for _, d := range dirs {
		if err := fsyncPath(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	return fsyncPath(root)
}

func fsyncPath(path string) error {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	if err := syscall.Fsync(fd); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// syncfs flushes the whole filesystem holding path, and only that one (sync(2)
// would also flush whatever else this shared machine is writing). The standard
// library has no wrapper for it; x/sys, already in go.mod, has.
func syncfs(path string) error {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

func readFull(fd int, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}
