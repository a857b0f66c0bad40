package profile

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// run runs name with args through executor/command and waits for it,
// bounded by ctx: from the fixed search path, with an environment of only
// PATH and LC_ALL=C, stdin from /dev/null, in its own process group, which
// is killed whole when ctx ends. A non-zero exit is not an error (Code says
// it; "degraded" is such an answer); an error means the command is not
// installed, could not be started or did not finish.
func run(ctx context.Context, name string, args ...string) (command.Result, error) {
	res, err := command.Run(ctx, append([]string{name}, args...), command.Options{})
	if errors.Is(err, command.ErrNotFound) {
		// A reason in the profile: short, the name alone.
		return res, fmt.Errorf("%s: not found", name)
	}
	return res, err
}

// describe renders what a command answered, for a reason: its output (or
// its stderr) and its exit status when that is not zero.
func describe(res command.Result) string {
	out := res.Stdout
	if out == "" {
		out = res.Stderr
	}
	if i := strings.IndexByte(out, '\n'); i >= 0 {
		out = out[:i]
	}
	switch {
	case out == "":
		return fmt.Sprintf("exit %d", res.Code)
	case res.Code != 0:
		return fmt.Sprintf("%q, exit %d", out, res.Code)
	default:
		return fmt.Sprintf("%q", out)
	}
}
