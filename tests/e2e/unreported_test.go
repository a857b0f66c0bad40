package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// An agent killed (SIGKILL) while the executor applies — the verdict never
// heard, a newer declaration published before an agent is back — has that
// apply reported applied, with its line, by the agent started again: not
// superseded by the newer, as if it never ran. The real agent, executor and
// control side; the executor held at the store's lock by a rescue apply
// until the agent is gone.
func TestAnApplyWhoseAgentWasKilledIsReportedApplied(t *testing.T) {
	m := newMesh(t)
	agent := m.procs[len(m.procs)-1]
	release := m.holdStoreLock()
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	s1 := m.declare(fmt.Sprintf(motd, "one"))
	eventually(t, "the agent handed seq 1 over", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return strings.Contains(string(b), fmt.Sprintf(`"forwarding the newest declaration" node=n1 seq=%d`, s1))
	})
	// The agent says so just before it writes the request: a moment for
	// the write, so that the kill meets it waiting for the verdict (a
	// kill before the write would leave seq 1 never handed over).
	time.Sleep(time.Second)
	agent.Process.Kill()
	agent.Wait()
	release()
	eventually(t, "the executor applied seq 1 with no agent to hear it", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.tree, "motd"))
		return string(b) == "one\n"
	})
	s2 := m.declare(fmt.Sprintf(motd, "two"))
	m.startAgent("--config", filepath.Join(m.base, "agent.json"))
	if r := m.reportFor(s2); r.Outcome != shapes.Applied {
		t.Fatalf("seq %d: %+v", s2, r)
	}
	var first *report
	eventually(t, fmt.Sprintf("seq %d reported", s1), func() bool {
		for _, r := range m.reports(20) {
			if r.Trigger != "declaration" {
				continue
			}
			from := r.SupersededFrom
			if from == 0 {
				from = r.Seq
			}
			if r.SupersededBy != 0 && from <= s1 && s1 <= r.Seq {
				t.Fatalf("seq %d, applied, reported superseded: %+v", s1, r)
			}
			if r.Seq == s1 {
				first = &r
				return true
			}
		}
		return false
	})
	if first.Outcome != shapes.Applied || len(first.Lines) != 1 || first.Lines[0].Outcome != shapes.Applied {
		t.Fatalf("seq %d's report: %+v; want applied, with the line of its apply", s1, first)
	}
}
