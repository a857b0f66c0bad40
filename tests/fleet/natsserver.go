package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

// BuildNATSServer builds nats-server, at the version the module requires,
// into out: the real broker processes of a cluster (the cluster test and
// `make bench-scale CLUSTER=1`), or an operator's own broker: as
// published (GOWORK=off: never through a workspace a caller may have).
func BuildNATSServer(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building nats-server: %w\n%s", err, b)
	}
	return nil
}
