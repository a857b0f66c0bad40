package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// chaosArchives is how many archives the run puts in the control side's
// object store once serve is up, for the modules drawn with one.
const chaosArchives = 3

// An archiveRef is one of the run's archives: its obj:// URL (the link's),
// its digest, and the tar on the run's disk (a rescue file's file:// URL).
type archiveRef struct {
	url, sha256, file string
}

// archiveTar is archive k: arch-k/one and arch-k/sub/two, each naming the
// archive, so that archives unpacked into one module's directory never
// write the same path.
func archiveTar(k int) []byte {
	dir := fmt.Sprintf("arch-%d", k)
	files := map[string][]byte{}
	for _, f := range []string{dir + "/one", dir + "/sub/two"} {
		files[f] = []byte(fmt.Sprintf("chaos archive %d: %s\n", k, f))
	}
	return tarOf([]string{dir + "/", dir + "/sub/"}, files)
}

// tarOf is a tar of dirs, then files in the order of their names.
func tarOf(dirs []string, files map[string][]byte) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, d := range dirs {
		tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)})
	}
	for _, f := range slices.Sorted(maps.Keys(files)) {
		tw.WriteHeader(&tar.Header{Name: f, Mode: 0o644, Size: int64(len(files[f])), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)})
		tw.Write(files[f])
	}
	tw.Close()
	return b.Bytes()
}

// putArchives writes the run's archives and puts each in the control
// side's object store, as an operator does before declaring one.
func (w *world) putArchives() error {
	for k := range chaosArchives {
		f := filepath.Join(w.base, fmt.Sprintf("archive-%d.tar", k))
		if err := os.WriteFile(f, archiveTar(k), 0o600); err != nil {
			return err
		}
		a, err := w.putArchive(f)
		if err != nil {
			return err
		}
		w.archives = append(w.archives, a)
	}
	return nil
}

// putArchive puts the tar at f in the control side's object store
// (mesh-control archive put): its URL and digest.
func (w *world) putArchive(f string) (archiveRef, error) {
	out, code, err := w.control("archive", "put", f, "--json")
	if err != nil || code != 0 {
		return archiveRef{}, fmt.Errorf("archive put %s: exit %d %v: %s", f, code, err, firstLine(out))
	}
	var a struct {
		SHA256 string `json:"sha256"`
		URL    string `json:"url"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &a); err != nil {
		return archiveRef{}, fmt.Errorf("archive put --json: %v: %s", err, firstLine(out))
	}
	return archiveRef{url: a.URL, sha256: a.SHA256, file: f}, nil
}

// unpackedBy says whether p is one an archive of module mod (its "arch"
// resource) writes: under the module's directory, in an arch-K directory.
func unpackedBy(n *node, p, mod, id string) bool {
	if id != "arch" || idPath(n, mod, "dir") == "" {
		return false
	}
	rel, ok := strings.CutPrefix(p, modDir(n, mod)+"/")
	return ok && strings.HasPrefix(rel, "arch-")
}
