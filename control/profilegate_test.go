package control_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// The node's profile gates assign: a module that needs what the node said
// it lacks (a container runtime, a service manager) is refused at the
// control side, naming the capability, the resource and the node's own
// reason, and nothing is kept; a module it can run is assigned; a node
// that reported no profile is not refused.
func TestTheProfileGatesAssign(t *testing.T) {
	s, ctx := serveOverlay(t, 90*time.Second)
	_, id := enrolNode(t, s, "n1")
	enrolNode(t, s, "n2") // reports no profile
	const app = `{"version":1,"resources":[{"module":"app","id":"c","type":"container","name":"app","image":"registry.local/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"},
		{"module":"app","id":"svc","type":"service","unit":"app-helper","state":"running"}]}`
	profile := json.RawMessage(`{"detected_at":"2026-12-01T00:00:00Z","capabilities":[
		{"name":"container-runtime","present":false,"reason":"no container runtime answered _ping (/run/podman/podman.sock: absent)"},
		{"name":"package-manager","present":true,"detail":"dpkg/apt"},
		{"name":"service-manager","present":true,"detail":"systemd 252"}]}`)
	nc, err := agent.Dial(id)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	data, _ := json.Marshal(link.Heartbeat{Node: "n1", Enrolment: id.Enrolment, At: time.Now().UTC(), Interval: 30, State: link.StateEnrolled, Profile: profile})
	sig, _ := id.Sign(data)
	if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	eventually(t, "n1's profile kept", func() bool {
		v, err := s.client.ShowNode(ctx, "n1")
		return err == nil && !v.ProfileAt.IsZero()
	})

	before, _ := s.client.Assignments(ctx, "n1")
	_, err = s.client.Assign(ctx, "n1", []byte(app), "app.json")
	var lacking *control.LackingError
	if !errors.As(err, &lacking) || !strings.Contains(err.Error(), "container-runtime (container app.c needs it; the node says: no container runtime answered _ping") ||
		strings.Contains(err.Error(), "service-manager") {
		t.Fatalf("assign of a module the node cannot run: %v", err)
	}
	if after, _ := s.client.Assignments(ctx, "n1"); len(after) != len(before) {
		t.Fatalf("a refused module was kept: %v", after)
	}
	if _, err := s.client.ComposeWith(ctx, "n1", []byte(app)); !errors.As(err, &lacking) {
		t.Fatalf("assign --plan of a module the node cannot run: %v", err)
	}
	if _, err := s.client.Assign(ctx, "n1", []byte(webModule), "web.json"); err != nil {
		t.Fatalf("a module the node can run: %v", err)
	}
	if _, err := s.client.Assign(ctx, "n2", []byte(app), "app.json"); err != nil {
		t.Fatalf("a node with no profile reported: %v", err)
	}
}
