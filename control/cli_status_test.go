package control_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
)

// status says the fleet at a glance from the view nodes prints: one node
// linked (its heartbeat recorded, its last report with the overlay applied
// and a failed line, its briefing a kept one), one revoked, one never
// heard from; the versions the linked one runs; the broker, its store and
// the registry answering; the overlay and who applied it. The same in
// --json, in the one form every command keeps. Without a control side, or
// with a flag it does not take, it says so and prints nothing.
func TestStatusCommand(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	statusFleet(t, ctx, s, dir)
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return run(t, ctx, append(args, "--dir", dir, "--nats", s.url)...)
	}

	out, errs, code := cli("status")
	if code != 0 || errs != "" {
		t.Fatalf("status: exit %d, stderr %q\n%s", code, errs, out)
	}
	// Read with its columns' spaces as one.
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"broker: " + s.url + ", reachable",
		"store: takes writes",
		"registry: read, 4 node(s)",
		"enrolled (linked at its last word) 2 down1, web1",
		"last heard longest ago: ", // down1 or web1: heard within the same moment
		"disconnected 0",
		"revoked 1 gone1",
		"never heard from 1 quiet1",
		"a failed line (last report or briefing): 1 web1",
		"a held line (last report or briefing): 1 web1",
		"its executor unreachable by its agent: 1 down1",
		"nothing declared to its enrolment (declare to it again): 0",
		"executor versions (nodes not revoked): 0.9.2 (b2): 1",
		"agent versions (nodes not revoked): 0.9.2 (a7): 1",
		"overlay: 10.77.0.0/24 on mesh0; 3 node(s) addressed, 1 last reported it applied", // not the revoked one
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	js, errs, code := cli("status", "--json")
	if code != 0 || errs != "" {
		t.Fatalf("status --json: exit %d, stderr %q", code, errs)
	}
	if err := jsonform.Check([]byte(js)); err != nil {
		t.Fatalf("status --json: %v\n%s", err, js)
	}
	var got struct {
		Broker struct {
			Reachable bool `json:"reachable"`
		} `json:"broker"`
		Store struct {
			Answered bool `json:"answered"`
			DiskFull bool `json:"disk_full"`
		} `json:"store"`
		Registry struct {
			Answered bool `json:"answered"`
		} `json:"registry"`
		Total  int `json:"total"`
		States []struct {
			State      string   `json:"state"`
			Count      int      `json:"count"`
			Names      []string `json:"names"`
			OldestNode string   `json:"oldest_node"`
		} `json:"states"`
		Failed struct {
			Count int      `json:"count"`
			Names []string `json:"names"`
		} `json:"failed"`
		ExecutorUnreachable struct {
			Names []string `json:"names"`
		} `json:"executor_unreachable"`
		ExecutorVersions []struct {
			Version string `json:"version"`
			Build   string `json:"build"`
			Count   int    `json:"count"`
		} `json:"executor_versions"`
		Overlay struct {
			Set       bool `json:"set"`
			Addressed int  `json:"addressed"`
			Applied   int  `json:"applied"`
		} `json:"overlay"`
	}
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatal(err)
	}
	states := map[string][]string{}
	for _, g := range got.States {
		if g.Count != len(g.Names) {
			t.Errorf("state %s: count %d, names %v", g.State, g.Count, g.Names)
		}
		states[g.State] = g.Names
	}
	if !got.Broker.Reachable || !got.Store.Answered || got.Store.DiskFull || !got.Registry.Answered || got.Total != 4 || !got.Overlay.Set || got.Overlay.Addressed != 3 || got.Overlay.Applied != 1 ||
		strings.Join(states[link.StateEnrolled], ",") != "down1,web1" || strings.Join(got.ExecutorUnreachable.Names, ",") != "down1" || strings.Join(states[control.StateRevoked], ",") != "gone1" ||
		strings.Join(states[control.StateNeverHeard], ",") != "quiet1" || len(states[link.StateDisconnected]) != 0 ||
		got.Failed.Count != 1 || got.Failed.Names[0] != "web1" ||
		len(got.ExecutorVersions) != 1 || got.ExecutorVersions[0] != (struct {
		Version string `json:"version"`
		Build   string `json:"build"`
		Count   int    `json:"count"`
	}{"0.9.2", "b2", 1}) {
		t.Fatalf("status --json:\n%s", js)
	}
	// The same states as nodes --json: one rule, read from one view.
	nj, _, _ := cli("nodes", "--json")
	var ns []*control.NodeStatus
	if err := json.Unmarshal([]byte(nj), &ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		found := false
		for _, name := range states[n.State] {
			found = found || name == n.Name
		}
		if !found {
			t.Errorf("nodes says %s is %q; status does not: %v", n.Name, n.State, states)
		}
	}

	// A stranger: no control side, a flag status does not take.
	out, errs, code = run(t, ctx, "status", "--dir", filepath.Join(t.TempDir(), "none"))
	if code != 1 || out != "" || !strings.HasPrefix(errs, "mesh-control status: ") {
		t.Fatalf("status without a control side: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// node show says a node's executor as nodes does, and why when it is
	// not reached; its agent, its last outcome, its overlay address.
	for node, wants := range map[string][]string{
		"web1":  {"executor 0.9.2 (b2)", "agent 0.9.2 (a7)", "last outcome failed (seq 1)", "overlay address 10.77.0."},
		"down1": {"executor unreachable by its agent, at its last heartbeat: dial unix /run/mesh-host/executor.sock: connect: connection refused (mesh-executor doctor there says why)"},
	} {
		out, _, _ := cli("node", "show", node)
		flat := strings.Join(strings.Fields(out), " ")
		for _, want := range wants {
			if !strings.Contains(flat, want) {
				t.Errorf("node show %s lacks %q:\n%s", node, want, out)
			}
		}
	}
	// A control side whose broker is not reached: --json says so in one
	// value, reachable false, and the command fails.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "tls://" + dead.Addr().String()
	dead.Close()
	out, errs, code = run(t, ctx, "status", "--json", "--dir", dir, "--nats", deadURL)
	var down struct {
		Broker struct {
			URL       string `json:"url"`
			Reachable bool   `json:"reachable"`
			Error     string `json:"error"`
		} `json:"broker"`
	}
	if err := json.Unmarshal([]byte(out), &down); err != nil || code != 1 || down.Broker.Reachable || down.Broker.URL != deadURL || down.Broker.Error == "" || jsonform.Check([]byte(out)) != nil {
		t.Fatalf("status --json, the broker not reached: exit %d %v %v\n%s%s", code, err, jsonform.Check([]byte(out)), out, errs)
	}
	out, errs, code = cli("status", "--frob")
	if code != 2 || out != "" || !strings.Contains(errs, "frob") {
		t.Fatalf("status --frob: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// statusFleet makes the fleet the status tests read: web1 linked (its
// heartbeat with versions, its last report with the overlay applied and a
// failed line, its briefing a kept one), down1 linked with its executor
// unreachable, gone1 revoked, quiet1 never heard from, and the overlay
// set; it returns once the registry shows web1's and down1's.
func statusFleet(t *testing.T, ctx context.Context, s *served, dir string) {
	t.Helper()
	_, web := enrolNode(t, s, "web1")
	_, gone := enrolNode(t, s, "gone1")
	_, down := enrolNode(t, s, "down1")
	enrolNode(t, s, "quiet1")
	if _, errs, code := run(t, ctx, "overlay", "set", "--network", "10.77.0.0/24", "--dir", dir, "--nats", s.url); code != 0 {
		t.Fatalf("overlay set: %s", errs)
	}
	// web1: the overlay applied, a line failed, its briefing kept one.
	reportAs(t, web, 1, shapes.Failed, []shapes.Line{overlayLine(shapes.Unchanged), {Module: "site", ID: "svc", Type: "service", Outcome: shapes.Failed, Detail: "exit status 3"}},
		&shapes.Briefing{Outcome: shapes.MarkKept, Findings: []shapes.Finding{{Mark: shapes.MarkKept, Module: "site", ID: "conf", Type: "file"}}})
	nc, err := agent.Dial(web, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(link.Heartbeat{Node: "web1", Enrolment: web.Enrolment, At: time.Now().UTC(), Interval: 30, State: link.StateEnrolled,
		Presence: link.PresenceResident, AgentVersion: "0.9.2", AgentBuild: "a7", Executor: &link.ExecutorStatus{Version: "0.9.2", Build: "b2", Seq: 1}, LastApplied: 1})
	sig, _ := web.Sign(hb)
	if err := nc.PublishMsg(&nats.Msg{Subject: web.Subjects.Heartbeat, Data: hb, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil || nc.Flush() != nil {
		t.Fatal(err)
	}
	nc.Close()
	// down1: linked, its agent unable to reach its executor.
	heartbeatAs(t, down, func(hb *link.Heartbeat) {
		hb.ExecutorError = "dial unix /run/mesh-host/executor.sock: connect: connection refused"
	})
	heartbeatAs(t, gone)
	if _, _, err := s.client.Revoke(ctx, "gone1", "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web1 heard from with its report and executor", func() bool {
		n := status(t, s, "web1")
		return n.State == link.StateEnrolled && n.ExecutorVersion == "0.9.2" && n.LastReport != nil && n.Briefing != nil && status(t, s, "down1").ExecutorError != ""
	})

}

// On a full control disk status says so on its store line, and in --json,
// and exits 0 (the control side was read); with room again, the store
// takes writes. The key directory is on a small tmpfs (root: mount).
func TestStatusOnAFullDisk(t *testing.T) {
	dir := smallDisk(t)
	s := serve(t, dir, "127.0.0.1:0")
	cmd := func(args ...string) (string, string, int) {
		t.Helper()
		return run(t, context.Background(), append(args, "--dir", dir, "--nats", s.url)...)
	}
	filler := filepath.Join(dir, "filler")
	fillDisk(t, filler)
	full := "store:     cannot write: the disk holding " + filepath.Join(dir, "jetstream") + " is full"
	out, errs, code := cmd("status")
	if code != 0 || !strings.Contains(out, full) || !strings.Contains(out, "registry:  read") {
		t.Fatalf("status on a full disk: exit %d, want %q\n%s%s", code, full, out, errs)
	}
	js, _, code := cmd("status", "--json")
	if code != 0 || !strings.Contains(js, `"disk_full": true`) {
		t.Fatalf("status --json on a full disk: exit %d\n%s", code, js)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status says the store takes writes once there is room", func() bool {
		out, _, code := cmd("status")
		return code == 0 && strings.Contains(out, "store:     takes writes")
	})
}
