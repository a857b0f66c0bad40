package identity

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// inDir copies the golden testdata/formats/release/name into a directory
// of the test's own, root's and private as the executor keeps it.
func inDir(t *testing.T, release, name string) string {
	t.Helper()
	b, err := os.ReadFile(golden.Path(release, name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Every identity and floor a release wrote is read, each golden named by
// the commit that first wrote its shape: the identity has one, the floor
// two (its format field came with 5d5c15c).
func TestEveryIdentityFormatThatShippedIsRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the identity is read only when it is root's: run as root (make test does)")
	}
	golden.Releases(t, "2d9627c", "c4a83c5", "5d5c15c", "1b40289")
	id, err := Load(inDir(t, "2d9627c", FileName))
	if err != nil {
		t.Fatal(err)
	}
	if id.Node != "workstation" || id.Enrolment != "e-7f3a" || len(id.ControlKey) != 32 || id.ControlKey[31] != 31 {
		t.Errorf("read %+v", id)
	}
	for _, release := range []string{"c4a83c5", "5d5c15c"} {
		f, err := ReadFloor(inDir(t, release, FloorFile))
		if err != nil {
			t.Fatal(err)
		}
		if f.Seq != 42 || f.Digest != "9f86d081884c7d65" {
			t.Errorf("%s: floor %+v", release, f)
		}
	}
}

// The control keys a release wrote (from 1b40289, the first to keep
// them) are read, and put the key in force in place of the one
// identity.json pinned at enrolment.
func TestEveryControlKeysFormatThatShippedIsRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the identity is read only when it is root's: run as root (make test does)")
	}
	dir := inDir(t, "1b40289", KeysFile)
	b, err := os.ReadFile(golden.Path("1b40289", FileName))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, FileName), b, 0o600)
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if id.Keys == nil || id.ControlKey[0] != 32 || id.ControlKey[31] != 63 || id.Keys.Recovery[0] != 64 || id.Keys.Seq != 2 ||
		len(id.Keys.Taken) != 2 || id.Keys.Taken[1].To != "cccccccccccccccc" {
		t.Errorf("read %+v", id.Keys)
	}
}

// A later format is refused, naming both: misreading what the executor
// pins or its floor would let in what it must refuse. The identity is
// written without the field, which the releases before decode strictly;
// the floor with it, which they pass over.
func TestALaterIdentityFormatIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the identity is read only when it is root's: run as root (make test does)")
	}
	const later = "is in format v2, written by a later release; this executor reads formats up to v1"
	dir := t.TempDir()
	key := bytes.Repeat([]byte{7}, 32)
	if err := Save(dir, &Identity{Node: "n", Enrolment: "e", ControlKey: key}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	if bytes.Contains(b, []byte("format")) {
		t.Fatalf("the identity was written with its format, which the release before refuses:\n%s", b)
	}
	for _, c := range []struct {
		format string
		err    string
	}{
		{`"format": 1,`, ""},
		{`"format": 2,`, later},
	} {
		os.WriteFile(filepath.Join(dir, FileName), bytes.Replace(b, []byte("{"), []byte("{"+c.format), 1), 0o600)
		_, err := Load(dir)
		if (c.err == "" && err != nil) || (c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err))) {
			t.Errorf("%s: %v", c.format, err)
		}
	}
	if err := WriteFloor(dir, Floor{Seq: 9, Digest: "d"}); err != nil {
		t.Fatal(err)
	}
	if f, err := ReadFloor(dir); err != nil || f.Seq != 9 || f.Format != fileFormat {
		t.Errorf("floor read back %+v, %v", f, err)
	}
	os.WriteFile(filepath.Join(dir, FloorFile), []byte(`{"seq":9,"digest":"d","format":2}`), 0o600)
	if f, err := ReadFloor(dir); err == nil || !strings.Contains(err.Error(), later) || f.Seq != 0 {
		t.Errorf("a later floor: %+v, %v", f, err)
	}
}
