package fsx

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The caching resolver agrees with Resolve through links in the middle, at
// the end, relative, absolute, and into paths that do not exist yet.
func TestResolverAgreesWithResolve(t *testing.T) {
	d := t.TempDir()
	os.MkdirAll(filepath.Join(d, "real/sub"), 0o755)
	os.Symlink("real", filepath.Join(d, "rel"))
	os.Symlink(filepath.Join(d, "real/sub"), filepath.Join(d, "abs"))
	os.Symlink("../real/sub/file", filepath.Join(d, "real/sub/../link-to-file"))
	os.WriteFile(filepath.Join(d, "real/sub/file"), nil, 0o644)
	os.Symlink("/etc", filepath.Join(d, "real/sub/ln"))
	r := Resolver()
	for _, p := range []string{
		d, d + "/real/sub/file", d + "/rel/sub/file", d + "/abs/file", d + "/abs/missing/deeper",
		d + "/real/link-to-file", d + "/rel", d + "/nothing/here",
		// Several names in one directory reached through a link: the
		// directory is resolved once and remembered, the names each time.
		d + "/rel/sub/other", d + "/rel/sub/third", d + "/abs/file2", d + "/abs/link-to-file",
		// Not clean: the directory part is cleaned before it is looked up.
		d + "/real//sub/file", d + "/real/./sub/file", d + "/rel/sub/../sub/file", d + "/abs/../x",
		// A link asked after other names in its directory (its entries
		// read by then), and through a linked directory.
		d + "/real/sub/ln", d + "/real/sub/ln/passwd", d + "/abs/ln/passwd",
	} {
		want, err1 := Resolve(p)
		got, err2 := r(p)
		if err1 != nil || err2 != nil || got != want {
			t.Errorf("%s: Resolver %q %v, Resolve %q %v", p, got, err2, want, err1)
		}
		// Asked twice: the same answer from the cache.
		if again, _ := r(p); again != got {
			t.Errorf("%s: second answer %q, first %q", p, again, got)
		}
	}
	if got, _ := Resolve(d + "/rel/sub/file"); got != d+"/real/sub/file" {
		t.Errorf("Resolve through a relative link = %q", got)
	}
}

// What a crash leaves beside a file under the host's temporary name is
// removed when it is the host's (root's, regular, one name), and refused
// when it is anyone else's.
func TestWriteFileLeftover(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "f")
	tmp := filepath.Join(d, TempName("f"))
	os.WriteFile(tmp, []byte("half"), 0o600)
	if err := WriteFile(p, []byte("whole"), WriteOptions{Mode: 0o644}); err != nil {
		t.Fatalf("a leftover of the host's blocked the write: %v", err)
	}
	if _, err := os.Lstat(tmp); !os.IsNotExist(err) {
		t.Fatal("leftover not removed")
	}
	os.WriteFile(tmp, []byte("theirs"), 0o600)
	os.Chown(tmp, 65534, 65534)
	if err := WriteFile(p, []byte("again"), WriteOptions{Mode: 0o644}); err == nil {
		t.Fatal("wrote over another user's file under the host's temporary name")
	}
	if b, _ := os.ReadFile(tmp); string(b) != "theirs" {
		t.Fatal("another user's file was touched")
	}
	if RemoveLeftover(p) {
		t.Fatal("RemoveLeftover removed another user's file")
	}
	os.Remove(tmp)
	os.Symlink("/etc/passwd", tmp)
	if RemoveLeftover(p) {
		t.Fatal("RemoveLeftover removed a symlink")
	}
}

// symlinksIn names exactly the links among a directory's entries.
func TestSymlinksIn(t *testing.T) {
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(d, "dir"), 0o755)
	os.Symlink("/etc", filepath.Join(d, "link"))
	os.Symlink("missing", filepath.Join(d, "dangling"))
	for i := 0; i < 300; i++ { // more than one getdents buffer's worth of names
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d-%s", i, strings.Repeat("n", 100))), nil, 0o644)
	}
	got, err := symlinksIn(d)
	if err != nil || len(got) != 2 || !got["link"] || !got["dangling"] {
		t.Fatalf("symlinksIn = %v, %v", got, err)
	}
}

// Equal compares files of every size against the bytes they should hold:
// small ones in one read, large ones a piece at a time; one byte more,
// less or different anywhere (first, last, at a piece's edge) is not equal.
func TestEqualAtEverySize(t *testing.T) {
	d := t.TempDir()
	for _, size := range []int{0, 1, 511, 512, 513, equalChunk - 1, equalChunk, equalChunk + 1, 3*equalChunk + 17} {
		want := make([]byte, size)
		for i := range want {
			want[i] = byte('a' + i%26)
		}
		p := filepath.Join(d, fmt.Sprint(size))
		os.WriteFile(p, want, 0o644)
		if eq, info, err := Equal(p, want); err != nil || !eq || info.Kind != Regular {
			t.Fatalf("%d bytes, the same: %v %+v %v", size, eq, info, err)
		}
		var variants [][]byte
		variants = append(variants, append(bytes.Clone(want), 'x'))
		if size > 0 {
			variants = append(variants, want[:size-1])
			for _, at := range []int{0, size - 1, min(size-1, equalChunk-1), min(size-1, equalChunk)} {
				v := bytes.Clone(want)
				v[at] ^= 0x20
				variants = append(variants, v)
			}
		}
		for _, v := range variants {
			if eq, _, err := Equal(p, v); err != nil || eq {
				t.Fatalf("%d bytes on disk against %d other bytes: equal=%v err=%v", size, len(v), eq, err)
			}
		}
	}
	if eq, info, err := Equal(filepath.Join(d, "missing"), nil); eq || err != nil || info.Kind != Absent {
		t.Fatalf("missing file: %v %+v %v", eq, info, err)
	}
}

// aclReadBy is a POSIX access ACL (its xattr's bytes): the owner rw, the
// user uid r, the group r, others nothing.
func aclReadBy(uid uint32) []byte {
	var b bytes.Buffer
	le := func(v ...any) {
		for _, x := range v {
			binary.Write(&b, binary.LittleEndian, x)
		}
	}
	const all = ^uint32(0)
	le(uint32(2), uint16(0x01), uint16(6), all, uint16(0x02), uint16(4), uid, uint16(0x04), uint16(4), all, uint16(0x10), uint16(4), all, uint16(0x20), uint16(0), all)
	return b.Bytes()
}

// A rewrite keeps what the file's extended attributes said — its ACL (a
// service user's read access), its user.* notes — and never its file
// capabilities, which new content was never given; the mode is the one
// asked, whatever the ACL's mask.
func TestWriteFileKeepsTheFilesACLs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kv.conf")
	os.WriteFile(p, []byte("a = 1\n"), 0o640)
	acl := aclReadBy(65534)
	for name, val := range map[string][]byte{"system.posix_acl_access": acl, "user.note": []byte("kept"), "security.capability": {1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if err := unix.Setxattr(p, name, val, 0); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if err := WriteFile(p, []byte("a = 9\n"), WriteOptions{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"system.posix_acl_access": nil, "user.note": []byte("kept")} {
		buf := make([]byte, 256)
		n, err := unix.Getxattr(p, name, buf)
		if err != nil || want != nil && !bytes.Equal(buf[:n], want) {
			t.Fatalf("%s after the rewrite: %q %v", name, buf[:max(n, 0)], err)
		}
	}
	if _, err := unix.Getxattr(p, "security.capability", make([]byte, 64)); err != unix.ENODATA {
		t.Fatalf("file capabilities carried onto new content: %v", err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600 as asked", fi.Mode().Perm())
	}

	// Another user's file, its ACL theirs to set, rewritten for a new
	// owner (root here): nothing of it is carried onto the new content.
	q := filepath.Join(t.TempDir(), "site.key")
	os.WriteFile(q, []byte("old key\n"), 0o640)
	os.Chown(q, 1000, 1000)
	if err := unix.Setxattr(q, "system.posix_acl_access", aclReadBy(1000), 0); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(q, []byte("new key\n"), WriteOptions{Mode: 0o640}); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(q, "system.posix_acl_access", make([]byte, 128)); err != unix.ENODATA {
		t.Fatalf("a former owner's ACL carried onto content written for another: %v", err)
	}
}
