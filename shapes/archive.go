package shapes

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"strings"
)

// What an archive resource may hold: the executor unpacks nothing else,
// and the control side's archive put stores nothing else, by this one
// walk (WalkArchive).
const (
	// MaxArchiveBytes bounds one archive, as a stream and as the files it
	// holds together.
	MaxArchiveBytes = 4 << 30
	// MaxArchiveEntries bounds the entries of one archive.
	MaxArchiveEntries = 100000
)

// ArchiveEntry is one entry an archive resource unpacks: a directory or a
// regular file, named by its clean path relative to the destination.
type ArchiveEntry struct {
	Name string // clean, relative: "site/index.html"
	Raw  string // as the archive names it, for what is said of it
	Dir  bool
	Mode uint32 // the entry's permission bits
	Size int64  // a file's
}

// WalkArchive reads a tar, gzipped or not, and calls fn for each entry an
// archive resource unpacks, in the archive's order, with a reader of its
// bytes (a file's: fn reads them or not). It refuses the archive whole,
// naming the entry, at the first that no executor unpacks — a path
// outside the destination, one given twice, a link, a device, a FIFO, a
// sparse file — past MaxArchiveEntries or MaxArchiveBytes, and, after the
// last, an entry whose directory the archive does not hold. A refusal of
// fn's ends the walk with it.
func WalkArchive(r io.Reader, fn func(ArchiveEntry, io.Reader) error) error {
	br := bufio.NewReader(r)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		rd = gz
	}
	tr := tar.NewReader(rd)
	var total int64
	seen := map[string]bool{}
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		if len(names) >= MaxArchiveEntries {
			return fmt.Errorf("archive: more than %d entries", MaxArchiveEntries)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		name = strings.TrimSuffix(name, "/")
		clean := path.Clean(name)
		if name == "" || name == "." {
			continue // the archive's own top directory
		}
		if strings.HasPrefix(name, "/") || clean != name || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("archive: entry %q names a path outside the destination; refused, not relocated", hdr.Name)
		}
		if seen[clean] {
			return fmt.Errorf("archive: entry %q appears twice", hdr.Name)
		}
		seen[clean] = true
		e := ArchiveEntry{Name: clean, Raw: hdr.Name, Mode: uint32(hdr.Mode) & 0o777}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.Dir = true
		case tar.TypeReg:
			for k := range hdr.PAXRecords {
				if strings.HasPrefix(k, "GNU.sparse.") {
					// Its holes would be made up by the reader: a few bytes
					// of archive could claim gigabytes.
					return fmt.Errorf("archive: entry %q is a sparse file; only regular files and directories are unpacked, and an archive needing one is refused rather than left incomplete", hdr.Name)
				}
			}
			if hdr.Size < 0 {
				return fmt.Errorf("archive: entry %q has a negative size", hdr.Name)
			}
			if total += hdr.Size; total > MaxArchiveBytes {
				return fmt.Errorf("archive: more than %d bytes", int64(MaxArchiveBytes))
			}
			e.Size = hdr.Size
		default:
			return fmt.Errorf("archive: entry %q is a %s; only regular files and directories are unpacked, and an archive needing one is refused rather than left incomplete", hdr.Name, tarType(hdr.Typeflag))
		}
		if err := fn(e, io.LimitReader(tr, e.Size)); err != nil {
			return err
		}
		names = append(names, clean)
	}
	// Every entry's directories must be in the archive or be the destination.
	for _, n := range names {
		if d := path.Dir(n); d != "." && !seen[d] {
			return fmt.Errorf("archive: entry %q is in %q, which the archive does not hold", n, d)
		}
	}
	return nil
}

func tarType(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device node"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}
