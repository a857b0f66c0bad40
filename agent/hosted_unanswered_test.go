package agent_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// A hosted agent whose executor does not answer (a wrong --socket, one
// not started) says so once, with the socket, at the default level: an
// operator waiting for an enrolment sees why nothing comes.
func TestAHostedAgentSaysItsExecutorDoesNotAnswer(t *testing.T) {
	var logs bytes.Buffer
	sock := filepath.Join(t.TempDir(), "nosock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := agent.Run(ctx, agent.Options{StateDir: t.TempDir(), Socket: sock, EnrolPoll: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "the executor did not answer"); n != 1 || !strings.Contains(logs.String(), sock) {
		t.Fatalf("said %d times:\n%s", n, logs.String())
	}
}
