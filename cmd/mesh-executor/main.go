// Command mesh-executor is the root executor of nox-mesh-host: it applies,
// reads back and records. Today it is the rescue command; see
// executor/cli.
package main

import (
	"os"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
)

// version and build are set at build time:
//
//	-ldflags "-X main.version=… -X main.build=…"
//
// The agent compares build with its own at every hello.
var (
	version = "dev"
	build   = "dev"
)

func main() {
	cli.Build = build
	os.Exit(cli.Main(version, os.Args[1:], os.Stdout, os.Stderr))
}
