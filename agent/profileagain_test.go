package agent_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// A profile said stands for Options.ProfileAgain, then a heartbeat says
// it again though it has not changed — a heartbeat is published without
// an acknowledgement and the stream that keeps it is not synced on its
// own, so one said once may be gone — and the heartbeats between say
// nothing of it.
func TestAProfileIsSaidAgainInTime(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	ex.mu.Lock()
	ex.profileDigest = "d1"
	ex.mu.Unlock()
	sub, err := c.client.NC.SubscribeSync(link.SubjectsOf("n1").Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	runAgentWith(t, id, ex.path, t.TempDir(), func(o *agent.Options) { o.ProfileAgain = time.Second })
	with, between := 0, 0 // heartbeats that say the profile; those after the first that do not
	deadline := time.Now().Add(20 * time.Second)
	for with < 2 {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("the profile said %d time(s), %d heartbeat(s) after without it: %v", with, between, err)
		}
		switch {
		case bytes.Contains(m.Data, []byte(`"profile":`)):
			with++
		case with == 1:
			between++
		}
	}
	if between == 0 {
		t.Fatal("the profile said again at the next heartbeat: said at every one")
	}
	ex.mu.Lock()
	asked := ex.profiles
	ex.mu.Unlock()
	if asked < 2 {
		t.Fatalf("the executor was asked its profile %d time(s)", asked)
	}
}

// An agent stopped (SIGTERM: its context ends) closes its link and says
// so at info; "link lost", a warning an operator's alerts look for, is
// for a link that was lost.
func TestACleanStopIsNoLostLink(t *testing.T) {
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	id, _ := c.addNode("n1")
	ex := newFakeExecutor(t, c.keys.ControlPublic(), "b1")
	var mu sync.Mutex
	var logs bytes.Buffer
	sub, err := c.client.NC.SubscribeSync(link.SubjectsOf("n1").Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	stop := runAgentWith(t, id, ex.path, t.TempDir(), func(o *agent.Options) {
		o.Log = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if _, err := sub.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("never linked: %v", err)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if said := logs.String(); strings.Contains(said, "link lost") || strings.Contains(said, "level=WARN") || !strings.Contains(said, "link closed: the agent stops") {
		t.Fatalf("a clean stop said:\n%s", said)
	}
}
