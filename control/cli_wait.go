package control

import (
	"fmt"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// DefaultWait is how long --wait waits when it names no time.
const DefaultWait = 2 * time.Minute

// The exit statuses of declare, assign and publish with --wait: by the
// outcome the node reported.
const (
	ExitApplied  = 0 // applied, repaired, unchanged
	ExitFailed   = 1 // a line failed
	ExitRefused  = 2 // the node refused it (the agent or the executor)
	ExitTimedOut = 3 // no report within the time
)

// waitFlag is --wait: alone, wait DefaultWait for the node's report;
// --wait=5m, that long.
type waitFlag struct{ d time.Duration }

func (w *waitFlag) IsBoolFlag() bool { return true }
func (w *waitFlag) String() string {
	if w == nil || w.d == 0 {
		return ""
	}
	return w.d.String()
}
func (w *waitFlag) Set(s string) error {
	switch s {
	case "true":
		w.d = DefaultWait
	case "false":
		w.d = 0
	default:
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a time to wait (--wait, or --wait=5m)", s)
		}
		w.d = d
	}
	return nil
}

// exitError ends a command with a status of its own (--wait's).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// nodeSeq is a sequence declared to a node, to wait for.
type nodeSeq struct {
	node string
	seq  uint64
}

// answers reports whether r settles seq: its own report, or a superseded
// one covering it.
func answers(r *SignedReport, seq uint64) bool {
	if r.Trigger != link.TriggerDeclaration {
		return false
	}
	if r.Outcome == shapes.Superseded {
		from := r.SupersededFrom
		if from == 0 {
			from = r.Seq
		}
		return from <= seq && seq <= r.Seq
	}
	return r.Seq == seq
}

// outcomeExit is the exit status a report's outcome means.
func outcomeExit(r *SignedReport) int {
	o := r.Outcome
	if o == shapes.Superseded {
		o = r.SupersededOutcome
	}
	switch o {
	case shapes.Refused:
		return ExitRefused
	case shapes.Failed:
		return ExitFailed
	case shapes.Superseded, "":
		return ExitApplied // a newer one was forwarded; its own wait says how it went
	}
	return ExitApplied
}

// await waits up to c.wait for each node's report on its sequence, prints
// each (the report's lines, as reports does), and ends with the worst
// status: timed out, refused, failed, else 0.
func (c *cli) await(cl *Client, want []nodeSeq) error {
	if c.wait <= 0 || len(want) == 0 {
		return nil
	}
	deadline := time.Now().Add(c.wait)
	got := map[int]*SignedReport{}
	for len(got) < len(want) && time.Now().Before(deadline) {
		for i, w := range want {
			if got[i] != nil || w.seq == 0 {
				continue
			}
			rs, _, err := cl.Reports(c.ctx, w.node, 50)
			if err != nil {
				continue
			}
			for _, r := range rs {
				if answers(r, w.seq) {
					got[i] = r
				}
			}
		}
		if len(got) == len(want) {
			break
		}
		select {
		case <-c.ctx.Done():
			return c.ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	worst, why := ExitApplied, ""
	var missing []string
	for i, w := range want {
		r := got[i]
		if r == nil {
			missing = append(missing, fmt.Sprintf("%s (seq %d)", w.node, w.seq))
			continue
		}
		if c.json {
			c.printJSON(map[string]any{"node": w.node, "seq": w.seq, "report": r})
		} else {
			fmt.Fprintf(c.stdout, "%s: ", w.node)
			c.printReport(r)
		}
		if code := outcomeExit(r); code > worst {
			worst, why = code, fmt.Sprintf("%s: seq %d %s", w.node, w.seq, r.Outcome)
		}
	}
	if len(missing) > 0 {
		return &exitError{ExitTimedOut, fmt.Sprintf("no report within %v from %s", c.wait, strings.Join(missing, ", "))}
	}
	if worst != ExitApplied {
		return &exitError{worst, why}
	}
	return nil
}
