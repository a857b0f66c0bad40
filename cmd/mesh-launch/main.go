// Command mesh-launch is what the init starts: it supervises mesh-executor,
// rolls back once to the known-good copy and halts. The logic is package
// launcher; this is its thin main.
package main

import (
	"os"

	"github.com/nox-mesh/nox-mesh-host/launcher"
)

// version and build are set at build time (-ldflags "-X main.version=…
// -X main.build=…").
var (
	version = "dev"
	build   = "dev"
)

func main() {
	launcher.Version, launcher.Build = version, build
	os.Exit(launcher.Main(os.Args[1:], os.Stdout, os.Stderr))
}
