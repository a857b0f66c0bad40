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
