// Command mesh-control is the reference control side of nox-mesh-host:
// keys, the embedded broker, the node registry, signing and publishing
// declarations, and what nodes report. See package control.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/control"
)

// version and build are set at build time (-ldflags "-X main.version=…
// -X main.build=…").
var (
	version = "dev"
	build   = "dev"
)

func main() {
	control.Version, control.Build = version, build
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := control.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	atExit()
	os.Exit(code)
}

// atExit is what a build for the fleet bench does as the process ends
// (profile_bench.go: it writes a profile begun at the start); nothing in
// a release build.
var atExit = func() {}
