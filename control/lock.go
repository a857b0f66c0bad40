package control

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// FileLock, in the key directory, names the mesh-control process holding
// the directory ("PID WHAT"); the lock itself is flock(2) on the
// directory (statedir.LockDir).
//
// The embedded broker keeps its JetStream store in the key directory, and
// nats-server does not lock its store: a second serve on one directory
// opened the store under the running one and rewrote it (the running
// broker then logged "could not locate msg block 1", and reports,
// declarations and the registry were lost). So whatever opens the store,
// or writes the keys, takes the directory first, and a second one is
// refused by name, before it has read a byte there. Client commands talk
// to the broker and open nothing of the store; they take no lock, and any
// number of them run beside a serve.
const FileLock = "control.lock"

// lockDir takes the key directory for what ("serve", "init") and records
// this process as its holder.
// A key directory reached through a symlink is locked where it is, so
// two serves naming it by two paths still exclude each other: the
// control side crosses no privilege boundary in following it.
func lockDir(dir, what string) (*statedir.DirLock, error) {
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s does not exist (run mesh-control init --dir %s)", dir, dir)
	}
	if err != nil {
		return nil, statedir.ExplainAccess("open", dir, err, "")
	}
	l, err := statedir.LockDir(real, FileLock)
	if err != nil {
		return nil, err
	}
	if err := l.Record("mesh-control " + what); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
