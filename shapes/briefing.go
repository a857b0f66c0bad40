package shapes

import (
	"fmt"
	"time"
)

// Mark is a briefing line's verdict: what adoption found, and whether the
// mesh can take it over as it is.
type Mark string

// The marks, worst first. A briefing's outcome is derived from its worst
// line, never stated apart, so it cannot read fine while carrying a failed
// line.
const (
	MarkFailed  Mark = "failed"  // something the mesh needed could not happen
	MarkUnknown Mark = "unknown" // something could not be read
	MarkKept    Mark = "kept"    // the machine differs from the declaration, and the machine's is kept
	MarkOK      Mark = "ok"      // found as declared, or converged
)

var markOrder = []Mark{MarkFailed, MarkUnknown, MarkKept, MarkOK}

// Finding is one line of a briefing.
type Finding struct {
	Mark   Mark   `json:"mark"`
	Module string `json:"module"`
	ID     string `json:"id"`
	Type   string `json:"type"`
	Detail string `json:"detail"`
}

// Briefing is what the first applies on an adopted node found: a line per
// finding, the outcome derived from the worst, and what to look at, in
// prose. It is the first thing a person reads on a newly adopted node.
type Briefing struct {
	Outcome  Mark      `json:"outcome"`
	Node     string    `json:"node,omitempty"`
	Seq      uint64    `json:"seq,omitempty"`
	At       time.Time `json:"at"`
	Findings []Finding `json:"findings"`
	LookAt   []string  `json:"look_at"`
}

// DeriveMark is the worst mark among findings; none is ok.
func DeriveMark(fs []Finding) Mark {
	worst := len(markOrder) - 1
	for _, f := range fs {
		for i, m := range markOrder {
			if m == f.Mark && i < worst {
				worst = i
			}
		}
	}
	return markOrder[worst]
}

// Summary is the briefing as it travels upward: its outcome, every line
// that is not ok and what to look at, each capped at max, with the count
// of ok lines left out said in LookAt. The whole briefing stays on the
// node (mesh-executor briefing).
func (b *Briefing) Summary(max int) *Briefing {
	if b == nil {
		return nil
	}
	s := &Briefing{Outcome: b.Outcome, Node: b.Node, Seq: b.Seq, At: b.At, Findings: []Finding{}, LookAt: []string{}}
	ok := 0
	for _, f := range b.Findings {
		switch {
		case f.Mark == MarkOK:
			ok++
		case len(s.Findings) < max:
			s.Findings = append(s.Findings, f)
		}
	}
	for _, l := range b.LookAt {
		if len(s.LookAt) < max {
			s.LookAt = append(s.LookAt, l)
		}
	}
	if ok > 0 {
		s.LookAt = append(s.LookAt, fmt.Sprintf("%d findings are ok (not listed here; mesh-executor briefing on the node has them all).", ok))
	}
	return s
}
