package link

import (
	"errors"
	"strings"
	"testing"
)

// The policy, both ways: within Skew of each other, either side newer, the
// two run together; beyond it, the refusal names both numbers and the side
// to upgrade — the older one.
func TestTheSkewPolicy(t *testing.T) {
	for _, c := range []struct {
		peer, self int
		ok         bool
		upgrade    string
	}{
		{peer: 1, self: 1, ok: true},
		{peer: 0, self: 1, ok: true},
		{peer: 2, self: 1, ok: true},
		{peer: 0, self: 2, upgrade: "upgrade node n1"},
		{peer: 3, self: 1, upgrade: "upgrade this control side"},
		{peer: 7, self: 2, upgrade: "upgrade this control side"},
		{peer: 4, self: 7, upgrade: "upgrade node n1"},
	} {
		err := checkSkew("node n1", c.peer, "this control side", c.self)
		if (err == nil) != c.ok {
			t.Errorf("peer %d, self %d: %v; want ok=%v", c.peer, c.self, err, c.ok)
			continue
		}
		if err == nil {
			continue
		}
		var se *SkewError
		if !errors.As(err, &se) || se.PeerCapability != c.peer || se.SelfCapability != c.self {
			t.Errorf("peer %d, self %d: %#v", c.peer, c.self, err)
		}
		if msg := err.Error(); !strings.Contains(msg, c.upgrade) || !strings.Contains(msg, "Version skew") {
			t.Errorf("peer %d, self %d: %q says neither %q nor where the policy is", c.peer, c.self, msg, c.upgrade)
		}
	}
	// This build's own numbers: the release before the header (0) runs
	// with this one, both ways.
	if err := CheckNode("n1", Capability-Skew); err != nil {
		t.Error(err)
	}
	if err := CheckControl(Capability - Skew); err != nil {
		t.Error(err)
	}
	if err := CheckControl(Capability + Skew + 1); err == nil || !strings.Contains(err.Error(), "upgrade this agent") {
		t.Errorf("a control side %d ahead: %v", Skew+1, err)
	}
}

func TestHeaderCapability(t *testing.T) {
	for v, want := range map[string]int{"": 0, "0": 0, "1": 1, "12": 12} {
		if got, err := HeaderCapability(v); err != nil || got != want {
			t.Errorf("%q: %d, %v", v, got, err)
		}
	}
	for _, v := range []string{"-1", "x", "1.5", " 1"} {
		if _, err := HeaderCapability(v); err == nil {
			t.Errorf("%q: read", v)
		}
	}
}
