package control

import (
	"testing"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A plan refused for its time is told apart from other refusals, in both
// ways the executor refuses one (executor/serve/plan.go's words): past its
// time (the node's clock ahead) and good for too long (behind). The CLI
// then says the two clocks differ, when the node's heartbeat showed it.
func TestAPlanRefusedForItsTime(t *testing.T) {
	for _, c := range []struct {
		refused string
		want    bool
	}{
		{"executor: the plan request was good until 2026-12-02T10:00:00Z; it is past", true},
		{"executor: the plan request is good until 2027-12-02T10:00:00Z, further off than 5m0s", true},
		{"executor: the plan request is addressed to node \"n2\" enrolment \"e\"; this is node \"n1\" enrolment \"e\"", false},
		{"executor: resource base.motd: path: \"x\" is not absolute", false},
	} {
		r := &SignedReport{Report: link.Report{Outcome: shapes.Refused, Refused: c.refused}}
		if got := refusedForTime(r); got != c.want {
			t.Errorf("%q: %v, want %v", c.refused, got, c.want)
		}
	}
	if got := SkewText(-90_000); got != "its clock is 1m30s behind the control side's" {
		t.Errorf("SkewText: %q", got)
	}
}
