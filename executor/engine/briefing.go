package engine

import (
	"fmt"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// briefing turns an apply on an adopted node into what a person reads
// first: a line per finding, marked ok (found as declared, or converged),
// kept (the machine differs and the machine's is kept until its module is
// taken), unknown or failed, and what to look at in prose. Its outcome is
// derived from the worst line.
//
// rest are the lines of the resources after a failed step, observed
// without a change (observeRest): an adoption's briefing covers every
// declared resource, not only those before the failure.
func (r *run) briefing(rep *shapes.Report, rest []shapes.Line) *shapes.Briefing {
	b := &shapes.Briefing{Node: r.d.Node, Seq: r.d.Seq, At: clock.Now().UTC(), Findings: []shapes.Finding{}, LookAt: []string{}}
	for _, l := range append(append([]shapes.Line(nil), rep.Lines...), rest...) {
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
		case "":
			// Observed after a failure, and the host could not tell.
			f.Mark = shapes.MarkUnknown
			b.LookAt = append(b.LookAt, fmt.Sprintf("%s (%s) could not be looked at: %s.", key, l.Type, l.Detail))
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

// observeRest, on an adopted node whose apply stopped at a failed step,
// observes every resource after it without changing anything (the plan's
// path, so it decides as an apply would) and returns their lines for the
// briefing, each saying it was only observed. One the host could not
// observe gets an empty outcome: the briefing marks it unknown.
func (r *run) observeRest() []shapes.Line {
	if !r.stopped {
		return nil
	}
	failed := -1
	for _, l := range r.lines {
		if l.Outcome == shapes.Failed {
			for i, res := range r.d.Resources {
				if h := res.Head(); h.Module == l.Module && h.ID == l.ID {
					failed = i
				}
			}
			break
		}
	}
	if failed < 0 || failed == len(r.d.Resources)-1 {
		return nil
	}
	at := r.d.Resources[failed].Head().Key()
	var lines []shapes.Line
	for rest := r.d.Resources[failed+1:]; len(rest) > 0; {
		d := *r.d
		d.Resources = rest
		o := *r
		o.d, o.opt.Plan, o.opt.OnLine = &d, true, nil
		o.lines, o.stopped, o.restarts, o.changed = nil, false, nil, map[string]bool{}
		o.applyAll()
		o.restartOn()
		rest = nil
		for _, l := range o.lines {
			if l.Outcome != shapes.Failed {
				l.Detail = "observed only (the apply stopped at " + at + "; nothing here was changed): " + l.Detail
				lines = append(lines, l)
				continue
			}
			// The host cannot tell this one: marked unknown, and the
			// observing goes on after it.
			l.Outcome = ""
			l.Detail = "observed only, after " + at + " failed: " + strings.TrimSuffix(l.Detail, stoppedSuffix(l.Detail))
			lines = append(lines, l)
			for j, res := range d.Resources {
				if h := res.Head(); h.Module == l.Module && h.ID == l.ID && j+1 < len(d.Resources) {
					rest = d.Resources[j+1:]
				}
			}
			break
		}
	}
	return lines
}

// stoppedSuffix is the part of a failed line's detail that says the apply
// stopped there, which an observation does not.
func stoppedSuffix(detail string) string {
	if i := strings.Index(detail, "; the apply stopped here"); i >= 0 {
		return detail[i:]
	}
	return ""
}
