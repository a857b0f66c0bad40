// Command mesh-executor is the root executor of nox-mesh-host: it applies,
// reads back and records. Today it is the rescue command; see
// executor/cli.
package main

import (
	"os"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
)

// version, build and bundle are set at build time:
//
//	-ldflags "-X main.version=… -X main.build=… -X main.bundle=<sha256>"
//
// The agent compares build with its own at every hello; bundle is the
// digest of the carried bundle the package ships, the only one
// `mesh-executor reconcile` applies.
var (
	version = "dev"
	build   = "dev"
	bundle  = ""
)

func main() {
	cli.Build = build
	cli.BundleDigest = bundle
	os.Exit(cli.Main(version, os.Args[1:], os.Stdout, os.Stderr))
}
