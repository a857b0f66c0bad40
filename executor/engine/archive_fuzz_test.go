package engine

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// tarBytes is a tar of entries, gzipped or not, as the tests build them.
func tarBytes(gzipped bool, entries ...tarEntry) []byte {
	var buf bytes.Buffer
	var tw *tar.Writer
	var gz *gzip.Writer
	if gzipped {
		gz = gzip.NewWriter(&buf)
		tw = tar.NewWriter(gz)
	} else {
		tw = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if e.typ == tar.TypeSymlink || e.typ == tar.TypeLink {
			hdr.Linkname, hdr.Size = e.body, 0
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		tw.WriteHeader(hdr)
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	if gz != nil {
		gz.Close()
	}
	return buf.Bytes()
}

// FuzzReadArchive feeds hostile bytes to the extractor's reader: it never
// panics, and every entry it accepts lies inside the destination, named
// cleanly, a directory or a regular file, its directory held by the
// archive, once.
func FuzzReadArchive(f *testing.F) {
	f.Add(tarBytes(true, theme...))
	f.Add(tarBytes(false, theme...))
	f.Add(tarBytes(true, tarEntry{name: "./", typ: tar.TypeDir}, tarEntry{name: "./a", typ: tar.TypeReg, body: "x"}))
	f.Add(tarBytes(false, tarEntry{name: "a/", typ: tar.TypeDir}, tarEntry{name: "a/../../b", typ: tar.TypeReg, body: "x"}))
	f.Add(tarBytes(false, tarEntry{name: "../escape", typ: tar.TypeReg, body: "x"}))
	f.Add(tarBytes(false, tarEntry{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}))
	f.Add(tarBytes(false, tarEntry{name: "l", typ: tar.TypeSymlink, body: "/etc/shadow"}))
	f.Add(tarBytes(false, tarEntry{name: "h", typ: tar.TypeLink, body: "/etc/shadow"}))
	f.Add(tarBytes(false, tarEntry{name: "d", typ: tar.TypeChar}))
	f.Add(tarBytes(false, tarEntry{name: "a", typ: tar.TypeReg, body: "1"}, tarEntry{name: "a/", typ: tar.TypeDir}))
	f.Add([]byte{0x1f, 0x8b, 0x08, 0x00})
	f.Add([]byte{})
	dir := f.TempDir()
	const dest = "/srv/fuzz/dest"
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "a.tar")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		entries, err := readArchive(p, dest)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, e := range entries {
			full := path.Join(dest, e.rel)
			if e.rel == "" || e.rel == "." || path.Clean(e.rel) != e.rel || path.IsAbs(e.rel) ||
				e.rel == ".." || strings.HasPrefix(e.rel, "../") || !strings.HasPrefix(full, dest+"/") {
				t.Fatalf("accepted %q, which is not inside %s", e.rel, dest)
			}
			if seen[e.rel] {
				t.Fatalf("accepted %q twice", e.rel)
			}
			seen[e.rel] = true
			if e.dir && e.data != nil {
				t.Fatalf("directory %q with content", e.rel)
			}
			if e.mode&^0o777 != 0 {
				t.Fatalf("%q keeps bits beyond the permissions: %o", e.rel, e.mode)
			}
		}
		for _, e := range entries {
			if d := path.Dir(e.rel); d != "." {
				if !seen[d] {
					t.Fatalf("%q accepted in %q, which the archive does not hold", e.rel, d)
				}
			}
		}
	})
}
