package statedir

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WriteFile writes v as indented JSON to path, mode 0600, atomically (a
// temporary file in the same directory, synced, renamed).
func WriteFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteBytes(path, append(data, '\n'), 0o600)
}

// WriteBytes replaces path with data, mode mode: a temporary beside it,
// synced, then renamed, so a reader never sees half of it; and the
// directory synced, so that once it returns a power cut leaves the new
// file, not the old. A temporary its writer died before renaming is
// removed by the directory's next holder (DirLock.Record).
func WriteBytes(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir syncs directory dir, so that the renames and removals made in
// it outlast a power cut.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
