package engine

import (
	"fmt"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// briefing turns an apply on an adopted node into what a person reads
// first: a line per finding, marked ok (found as declared, or converged),
// kept (the machine differs and the machine's is kept until its module is
// taken), unknown or failed, and what to look at in prose. Its outcome is
// derived from the worst line.
func (r *run) briefing(rep *shapes.Report) *shapes.Briefing {
	b := &shapes.Briefing{Node: r.d.Node, Seq: r.d.Seq, At: time.Now().UTC(), Findings: []shapes.Finding{}, LookAt: []string{}}
	for _, l := range rep.Lines {
		key := l.Module + "." + l.ID
		f := shapes.Finding{Module: l.Module, ID: l.ID, Type: l.Type, Detail: l.Detail}
		switch l.Outcome {
		case shapes.Held:
			f.Mark = shapes.MarkKept
			if r.heldOK[key] {
				f.Mark = shapes.MarkOK
			} else {
				b.LookAt = append(b.LookAt, fmt.Sprintf("%s (%s): what the machine has differs from the declaration; the machine's is kept until module %s is taken, and nothing of it was changed.", key, l.Type, l.Module))
			}
		case shapes.HeldChanged:
			f.Mark = shapes.MarkKept
			b.LookAt = append(b.LookAt, fmt.Sprintf("%s (%s) changed since it was found, by something other than the mesh; it is left as it is.", key, l.Type))
		case shapes.Failed:
			f.Mark = shapes.MarkFailed
			b.LookAt = append(b.LookAt, fmt.Sprintf("%s (%s) failed: %s. The apply stopped there; apply again once it is resolved. Until then the control side assigns this node nothing new.", key, l.Type, l.Detail))
		default:
			f.Mark = shapes.MarkOK
		}
		b.Findings = append(b.Findings, f)
	}
	b.Outcome = shapes.DeriveMark(b.Findings)
	if len(b.LookAt) == 0 {
		b.LookAt = append(b.LookAt, "Nothing to look at: everything found is as declared, or converged.")
	}
	return b
}
