package control_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// The control side holds every node to the version skew policy by the
// link capability its agent last said: an enrolment from an agent outside
// it is refused, signed, before the token is spent; a node whose agent
// says one outside it (an upgrade past the control side's reach) is
// declared and planned nothing, and `nodes` says why; one that says
// nothing (a release before the capability) is within it. What the
// control side publishes says its own capability.
func TestTheControlSideHoldsNodesToTheSkewPolicy(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	far := strconv.Itoa(link.Capability + link.Skew + 1)

	text, _, err := s.client.IssueToken(ctx, "n1", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	for _, c := range []struct{ header, says string }{
		{far, "speaks link capability " + far + "; this control side speaks " + strconv.Itoa(link.Capability)},
		{"x", "is not a capability version"},
	} {
		r := must(requestWith(t, s, text, m.keys, nil, nats.Header{link.CapabilityHeader: []string{c.header}}))
		if len(r.Grant) != 0 || !strings.Contains(r.Refused, c.says) || len(r.Refusal) == 0 {
			t.Fatalf("an agent saying capability %q: %+v; want a signed refusal saying %q", c.header, r, c.says)
		}
		if c.header == far && !strings.Contains(r.Refused, "upgrade this control side") {
			t.Fatalf("the refusal does not say what to upgrade: %s", r.Refused)
		}
	}
	// Neither spent the token: the agent of a release before the
	// capability (no header) enrols with it.
	_, id := identityOf(t, s, m, grantOf(t, s, must(request(t, s, text, m.keys, nil))))

	const decl = `{"version":1,"resources":[{"module":"base","id":"motd","type":"file","path":"/etc/motd","content":"hi\n"}]}`
	seq, err := s.client.Declare(ctx, "n1", []byte(decl))
	if err != nil {
		t.Fatalf("a node of capability 0: %v", err)
	}
	last, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := last.GetLastMsgForSubject(ctx, link.SubjectsOf("n1").Decl)
	if err != nil || msg.Header.Get(link.CapabilityHeader) != link.CapabilityValue {
		t.Fatalf("seq %d as stored: %v, capability header %q", seq, err, msg.Header.Get(link.CapabilityHeader))
	}

	var nc *nats.Conn
	eventually(t, "n1 let in", func() bool { nc, err = agent.Dial(id); return err == nil })
	defer nc.Close()
	say := func(capability int) {
		t.Helper()
		data, _ := json.Marshal(link.Heartbeat{Node: "n1", Enrolment: id.Enrolment, At: time.Now().UTC(), Interval: 30, State: link.StateEnrolled,
			Capability: capability, Profile: json.RawMessage(`{"capabilities":[]}`)})
		sig, _ := id.Sign(data)
		if err := nc.PublishMsg(&nats.Msg{Subject: id.Subjects.Heartbeat, Data: data, Header: nats.Header{link.SignatureHeader: []string{sig}}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "n1's capability kept", func() bool {
			rec, _, err := s.client.Node(ctx, "n1")
			return err == nil && rec.Capability == capability
		})
	}
	say(link.Capability + link.Skew + 1)
	_, err = s.client.Declare(ctx, "n1", []byte(decl))
	if err == nil || !strings.Contains(err.Error(), "refused by the control side: node n1 speaks link capability "+far) || !strings.Contains(err.Error(), "upgrade this control side") {
		t.Fatalf("a declaration to a node past the policy: %v", err)
	}
	if _, err := s.client.Plan(ctx, "n1", []byte(decl)); err == nil || !strings.Contains(err.Error(), "Version skew") {
		t.Fatalf("a plan for a node past the policy: %v", err)
	}
	ns, err := s.client.Nodes(ctx)
	if err != nil || len(ns) != 1 || ns[0].Capability != link.Capability+link.Skew+1 || !strings.Contains(ns[0].OutsideSkew, "upgrade this control side") {
		t.Fatalf("nodes: %v %+v", err, ns)
	}
	// Upgraded the other way: within the policy again.
	say(link.Capability)
	if _, err := s.client.Declare(ctx, "n1", []byte(decl)); err != nil {
		t.Fatalf("a node of this capability: %v", err)
	}
	if ns, _ := s.client.Nodes(ctx); len(ns) != 1 || ns[0].OutsideSkew != "" {
		t.Fatalf("nodes: %+v", ns)
	}
}
