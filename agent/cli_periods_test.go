package agent_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// A period of zero or less is refused as a usage error naming its flag,
// not taken for the default in silence.
func TestANonPositivePeriodIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--heartbeat", "0"}, {"--heartbeat", "-5s"}, {"--enrol-poll", "0"},
	} {
		var out, errb bytes.Buffer
		code := agent.Main(context.Background(), "1.2.3", "b", append(args, "--state", t.TempDir()), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), args[0]) {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
	}
}
