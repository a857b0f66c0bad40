package engine

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// Every RunningFile a release wrote is read: the paths a rescue apply of
// the state refuses as its daemon does.
func TestEveryRunningFormatThatShippedIsRead(t *testing.T) {
	paths := []RunningPath{{What: "agent's state directory", Path: "/srv/mesh/agent"}, {What: "socket directory", Path: "/run/mesh-x"}}
	goldens := map[string]runningRecord{
		"3b99c67": {Format: 1, Paths: paths},
		"fd8214b": {Format: 1, Paths: paths, Socket: "/run/mesh-x/executor.sock"}, // the socket served
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want runningRecord) {
		if got := readRunningRecord(filepath.Join(golden.Dir, release)); !reflect.DeepEqual(got, want) {
			t.Errorf("read %+v; want %+v", got, want)
		}
	})
}

// RecordRunning writes what readRunning reads, absolute, leaving out what
// was not given.
func TestRecordRunningIsReadBack(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(t.TempDir(), "agent")
	if err := RecordRunning(dir, "/run/x/executor.sock", []RunningPath{{What: "agent's state directory", Path: agent}, {What: "launcher", Path: ""}}); err != nil {
		t.Fatal(err)
	}
	if got, want := readRunning(dir), []RunningPath{{What: "agent's state directory", Path: agent}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v; want %+v", got, want)
	}
	if got := RunningSocket(dir); got != "/run/x/executor.sock" {
		t.Fatalf("the socket read back: %q", got)
	}
}
