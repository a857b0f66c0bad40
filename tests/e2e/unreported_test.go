package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
	release := filepath.Join(m.base, "release")
	rescue := filepath.Join(m.base, "rescue.json")
	os.WriteFile(rescue, []byte(fmt.Sprintf(`{"version":1,"node":"n1","resources":[{"module":"hold","id":"lock","type":"action","run":["/bin/sh","-c","touch %s.held; while [ ! -e %s ]; do sleep 0.05; done; touch %s.done"],"verify":["/usr/bin/test","-e","%s.done"],"timeout":120}]}`, release, release, release, release)), 0o600)
	holder := exec.Command(filepath.Join(bin, "mesh-executor"), "apply", "--state", m.state, rescue)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rescue apply holds the lock (its action runs)", func() bool {
		_, err := os.Stat(release + ".held")
		return err == nil
	})
	motd := `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"%s\n"}]}`
	s1 := m.declare(fmt.Sprintf(motd, "one"))
	eventually(t, "the agent handed seq 1 over", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.base, "mesh-agent.log"))
		return strings.Contains(string(b), fmt.Sprintf(`"forwarding the newest declaration" node=n1 seq=%d`, s1))
	})
	agent.Process.Kill()
	agent.Wait()
	os.WriteFile(release, nil, 0o644)
	if err := holder.Wait(); err != nil {
		t.Fatalf("the rescue apply: %v", err)
	}
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
