package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// ExplainAccess turns a permission error into what an operator acts on
// (whose, which mode, what to do), and leaves any other error as it was.
func TestExplainAccess(t *testing.T) {
	dir := t.TempDir()
	priv := filepath.Join(dir, "key")
	os.WriteFile(priv, nil, 0o600)
	shared := filepath.Join(dir, "sock")
	os.WriteFile(shared, nil, 0o660)
	os.Chmod(shared, 0o660)
	os.Chown(shared, 0, 65534)
	group := "gid 65534"
	if g, err := user.LookupGroupId("65534"); err == nil {
		group = g.Name
	}
	denied := func(p string) error { return &fs.PathError{Op: "open", Path: p, Err: syscall.EACCES} }
	for _, c := range []struct {
		name   string
		path   string
		err    error
		advice string
		want   string
	}{
		{"the file in the way", priv, denied(priv), "", "cannot read " + priv + ": permission denied (it is root's, mode 0600; run as its owner)"},
		{"a group that may", shared, fmt.Errorf("wire: %w", denied(shared)), "ask", "cannot read " + shared + ": permission denied (it is root's (group " + group + "), mode 0660; ask)"},
		{"read-only file system", priv, &fs.PathError{Op: "open", Path: priv, Err: syscall.EROFS}, "", "cannot read " + priv + ": read-only file system (it is root's, on a read-only file system, mode 0600; run as its owner)"},
		{"another error", priv, &fs.PathError{Op: "open", Path: priv, Err: syscall.ENOENT}, "", "open " + priv + ": no such file or directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ExplainAccess("read", c.path, c.err, c.advice)
			if err.Error() != c.want {
				t.Fatalf("%v\nwant %s", err, c.want)
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("%v does not wrap %v", err, c.err)
			}
		})
	}
}

// A holder that starts removes the temporaries a writer killed mid-write
// left (a crash-looping agent left one a start), and nothing else: not a
// temporary young enough to be another writer's now, not a file of the
// same shape behind a symlink, not the directory's own files.
func TestTheHolderSweepsWhatADeadWriterLeft(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	mk := func(name string, age time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, age, age); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A temporary as WriteBytes makes one, aged.
	tmp, err := os.CreateTemp(dir, ".agent.json.*")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	os.Chtimes(tmp.Name(), old, old)
	dead := []string{tmp.Name(), mk(".nkey.seed.12345", old)}
	kept := []string{
		mk("agent.json", old),
		mk(".agent.json.999", time.Now()), // another writer's, now
		mk(".hidden", old),
		mk(".agent.json.tmp", old),
		mk(".agent.json.12x", old),
		mk("..5", old),
	}
	target := mk("target", old)
	link := filepath.Join(dir, ".link.77")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link, target)

	l, err := LockDir(dir, ".lock-record")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Record("test"); err != nil {
		t.Fatal(err)
	}
	for _, p := range dead {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: a dead writer's temporary is still there (%v)", filepath.Base(p), err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: removed, and it was no dead writer's temporary (%v)", filepath.Base(p), err)
		}
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".agent.json.4093": true, ".nkey.seed.1": true, ".a.0": true,
		"agent.json.4093": false, ".agent.json": false, ".agent.json.": false,
		"..12": false, ".agent.json.12a": false, ".agent.json.tmp-3": false,
	} {
		if got := isTemp(name); got != want {
			t.Errorf("isTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

// Still says whether the lock's path names the directory locked: not
// once it is moved away, nor once another directory is made at the path.
func TestTheLockSaysItsDirectoryMoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	os.Mkdir(dir, 0o700)
	l, err := LockDir(dir, "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Still() {
		t.Fatal("not still, as locked")
	}
	os.Rename(dir, dir+".moved")
	if l.Still() {
		t.Fatal("still, moved away")
	}
	os.Mkdir(dir, 0o700)
	if l.Still() {
		t.Fatal("still, another directory at its path")
	}
}
