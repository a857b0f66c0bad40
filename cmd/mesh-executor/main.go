// Command mesh-executor is the root executor of nox-mesh-host: it applies,
// reads back and records. Today it is the rescue command; see
// executor/cli.
package main

import (
	"os"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(cli.Main(version, os.Args[1:], os.Stdout, os.Stderr))
}
