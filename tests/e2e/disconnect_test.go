package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Disconnection is a state (the lifecycle seed), said by the node: while
// the control side is gone, `mesh-executor status` says enrolled and
// disconnected since when; root applies a rescue file meanwhile; when the
// link returns the node reports from when to when it was disconnected and
// what its executor did in that time — real processes all.
func TestDisconnectionIsAState(t *testing.T) {
	m := newMesh(t)
	seq := m.declare(`{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"{root}/motd","content":"linked\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	link := func() (up bool, since time.Time, ok bool) {
		var st struct {
			State string `json:"state"`
			Link  *struct {
				Up    bool      `json:"up"`
				Since time.Time `json:"since"`
			} `json:"link"`
		}
		out, _ := exec.Command(filepath.Join(bin, "mesh-executor"), "status", "--state", m.state, "--json").Output()
		if json.Unmarshal(out, &st) != nil || st.State != "enrolled" || st.Link == nil {
			return false, time.Time{}, false
		}
		return st.Link.Up, st.Link.Since, true
	}
	eventually(t, "the executor knows the link is up", func() bool { up, _, ok := link(); return ok && up })

	// The control side (and its broker) goes away.
	ctl := m.procs[0]
	stopping := time.Now()
	ctl.Process.Signal(syscall.SIGTERM)
	ctl.Wait()
	eventually(t, "mesh-executor status says enrolled and disconnected", func() bool {
		up, since, ok := link()
		return ok && !up && !since.Before(stopping.Add(-5*time.Second))
	})
	text := m.run("mesh-executor", "status", "--state", m.state)
	if !strings.HasPrefix(text, "state: enrolled, disconnected\ndaemon: running (pid ") || !strings.Contains(text, "\nlink: disconnected since ") {
		t.Fatalf("mesh-executor status while disconnected:\n%s", text)
	}

	// Root at the machine, meanwhile: a rescue file.
	rescue := filepath.Join(m.base, "rescue.json")
	os.WriteFile(rescue, []byte(`{"version":1,"node":"n1","resources":[{"module":"fix","id":"note","type":"file","path":"`+m.tree+`/rescued","content":"by hand\n"}]}`), 0o600)
	m.run("mesh-executor", "apply", "--state", m.state, rescue)
	starting := time.Now()
	m.startControl()

	var got struct {
		Trigger          string            `json:"trigger"`
		DisconnectedFrom time.Time         `json:"disconnected_from"`
		DisconnectedTo   time.Time         `json:"disconnected_to"`
		Meanwhile        []shapes.Activity `json:"meanwhile"`
	}
	eventually(t, "the reconnect report", func() bool {
		out, err := exec.Command(filepath.Join(bin, "mesh-control"), "reports", "n1", "--dir", m.ctl, "--json", "--last", "10").Output()
		if err != nil {
			return false
		}
		var rs struct {
			Reports []json.RawMessage `json:"reports"`
		}
		json.Unmarshal(out, &rs)
		for _, r := range rs.Reports {
			json.Unmarshal(r, &got)
			if got.Trigger == "reconnect" && !got.DisconnectedFrom.IsZero() {
				return true
			}
		}
		return false
	})
	// From the last moment the agent knew it linked (it noticed the drop
	// a moment after the stop) to when it linked again.
	if got.DisconnectedFrom.Before(stopping.Add(-2*time.Second)) || got.DisconnectedFrom.After(stopping.Add(5*time.Second)) || got.DisconnectedTo.Before(starting) {
		t.Errorf("disconnected from %v to %v; the control side stopped at %v and started at %v", got.DisconnectedFrom, got.DisconnectedTo, stopping, starting)
	}
	if len(got.Meanwhile) != 1 || got.Meanwhile[0].Trigger != "rescue" || got.Meanwhile[0].Source != "local" || got.Meanwhile[0].Changed != 1 ||
		len(got.Meanwhile[0].Lines) != 1 || got.Meanwhile[0].Lines[0].Module != "fix" || got.Meanwhile[0].Lines[0].ID != "note" {
		t.Errorf("meanwhile: %+v, want the rescue file applied, its line named", got.Meanwhile)
	}
	if out := m.run("mesh-control", "reports", "n1", "--dir", m.ctl, "--last", "10"); !strings.Contains(out, "disconnected from ") || !strings.Contains(out, "(rescue): 1 changed, 0 failed") ||
		!strings.Contains(out, "fix.note file applied") {
		t.Errorf("mesh-control reports does not say the disconnection and what was done:\n%s", out)
	}
	eventually(t, "the executor knows the link is up again", func() bool { up, _, ok := link(); return ok && up })
}

// Someone edits by hand a file the mesh holds while the node is linked;
// the executor's drift reconcile puts it back, and the control side is
// told by name within moments — not at the next disconnection, if one
// ever comes — real processes all.
func TestARepairWhileLinkedReachesTheControlSide(t *testing.T) {
	m := newBareMesh(t)
	agentConf := m.addNode()
	m.startExecutor("--drift", "1s")
	m.startAgent("--config", agentConf)
	eventually(t, "the node heard from", func() bool { return m.node()["executor_version"] == "e2e" })
	seq := m.declare(`{"version":1,"resources":[{"module":"ssh","id":"banner","type":"file","path":"{root}/banner","content":"authorised use only\n"}]}`)
	if r := m.reportFor(seq); r.Outcome != shapes.Applied {
		t.Fatalf("report %+v", r)
	}
	os.WriteFile(filepath.Join(m.tree, "banner"), []byte("edited by hand\n"), 0o644)

	type activityReport struct {
		Trigger   string            `json:"trigger"`
		Seq       uint64            `json:"seq"`
		Meanwhile []shapes.Activity `json:"meanwhile"`
	}
	var found []activityReport
	eventually(t, "a report of what the executor did on its own", func() bool {
		out, err := exec.Command(filepath.Join(bin, "mesh-control"), "reports", "n1", "--dir", m.ctl, "--json").Output()
		if err != nil {
			return false
		}
		var rs struct {
			Reports []activityReport `json:"reports"`
		}
		json.Unmarshal(out, &rs)
		found = found[:0]
		for _, r := range rs.Reports {
			if r.Trigger == "activity" {
				found = append(found, r)
			}
		}
		return len(found) > 0
	})
	if b, _ := os.ReadFile(filepath.Join(m.tree, "banner")); string(b) != "authorised use only\n" {
		t.Fatalf("the drift reconcile did not put the file back: %q", b)
	}
	a := found[0]
	if a.Seq != 0 || len(a.Meanwhile) != 1 || a.Meanwhile[0].Trigger != "drift" || a.Meanwhile[0].Outcome != shapes.Repaired ||
		len(a.Meanwhile[0].Lines) != 1 || a.Meanwhile[0].Lines[0].Module != "ssh" || a.Meanwhile[0].Lines[0].ID != "banner" {
		t.Errorf("the activity reported: %+v", found)
	}
	// Said once, however many looks and drift reconciles pass.
	time.Sleep(3 * time.Second)
	out := m.run("mesh-control", "reports", "n1", "--dir", m.ctl)
	if strings.Count(out, "(drift, seq 1): 1 changed, 0 failed") != 1 || !strings.Contains(out, "on its own  repaired   1 changed, 0 failed in 1 apply(s)") ||
		!strings.Contains(out, "ssh.banner file repaired") {
		t.Errorf("mesh-control reports does not say the repair once, by name:\n%s", out)
	}
}
