package control_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// Every key directory a release made is read. Its keys and certificates
// are in their own standard formats; what is the control side's own is
// control.json, a golden a release (golden.Releases), and the set of
// files that init made
// (before c4a83c5 no nodes' account: it is made at the first load).
func TestEveryKeyDirectoryFormatThatShippedIsRead(t *testing.T) {
	goldens := map[string][]string{
		"91009a6": {control.FileNodesAccount},
		"9d97354": nil,
		"5d5c15c": nil, // the first with the format field
	}
	golden.Each(t, goldens, func(t *testing.T, release string, missing []string) {
		k, err := control.LoadKeys(keyDirWith(t, golden.Path(release, control.FileSettings), missing))
		if err != nil {
			t.Fatal(err)
		}
		if k.BrokerURL != "tls://control.example:4222" {
			t.Errorf("broker URL %q", k.BrokerURL)
		}
	})
}

// A key directory of a later format is refused, naming both formats.
func TestALaterKeyDirectoryFormatIsRefused(t *testing.T) {
	later := filepath.Join(t.TempDir(), control.FileSettings)
	os.WriteFile(later, []byte(`{"broker_url":"tls://control.example:4222","format":2}`), 0o600)
	_, err := control.LoadKeys(keyDirWith(t, later, nil))
	if err == nil || !strings.Contains(err.Error(), "is in format v2, written by a later mesh-control; this one reads formats up to v1") {
		t.Fatalf("load: %v", err)
	}
}

// keyDirWith makes a key directory with init, puts settings in as its
// control.json and takes out the files missing.
func keyDirWith(t *testing.T, settings string, missing []string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "control")
	if _, err := control.Init(dir, nil, ""); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, control.FileSettings), b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, m := range missing {
		if err := os.Remove(filepath.Join(dir, m)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
