package tests

import (
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
	"github.com/nox-mesh/nox-mesh-host/launcher"
)

// The launcher looks for a serve holding the state by the executor's lock
// file without linking the executor (deps_test.go): one name in both.
func TestTheLauncherNamesTheExecutorsLock(t *testing.T) {
	if launcher.ExecutorServeLock != cli.ServeLockFile {
		t.Fatalf("the launcher probes %q; the executor's serve holds %q", launcher.ExecutorServeLock, cli.ServeLockFile)
	}
}
