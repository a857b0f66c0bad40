// Command mesh-agent is the unprivileged link agent of nox-mesh-host. See
// package agent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// version and build are set at build time:
//
//	-ldflags "-X main.version=… -X main.build=…"
//
// build is compared with the executor's on every hello; the executor must
// be stamped with the same build id.
var (
	version = "dev"
	build   = "dev"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := agent.Main(ctx, version, build, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
