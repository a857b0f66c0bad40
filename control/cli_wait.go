package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

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

// exitUsage is Main's status for a command line it does not take, a
// command's own checks of its flags among them (which flags go together,
// a flag's form): 2, as the flag parser's.
const exitUsage = 2

// usageError is a command's refusal of its command line.
func usageError(format string, a ...any) error {
	return &exitError{exitUsage, fmt.Sprintf(format, a...)}
}

// nodeSeq is a sequence declared to a node, to wait for.
type nodeSeq struct {
	node string
	seq  uint64
}

// waited is the reports --wait saw, by node and sequence; nil when the
// command waited for none.
type waited map[nodeSeq]*SignedReport

func waitedOf(want []nodeSeq, got map[int]*SignedReport) waited {
	w := waited{}
	for i, r := range got {
		w[want[i]] = r
	}
	return w
}

// of is node's report on seq, nil when none came (or none was waited for).
func (w waited) of(node string, seq uint64) *SignedReport { return w[nodeSeq{node, seq}] }

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
// each (the report's lines, as reports does) and then a summary in
// Puppet's manner — a line a node and the total — and ends with the worst
// status: timed out, refused, failed, else 0. On a terminal it says, while
// it waits, how many have answered (progress); a pipe or a file gets the
// reports and the summary only. --json prints one value, the command's
// (value: what it did, with the reports that came), once the wait is
// over, so a script reads one value whether it waited or not.
func (c *cli) await(cl *Client, want []nodeSeq, value func(waited) any) error {
	if c.wait <= 0 || len(want) == 0 {
		if c.json {
			return c.printJSON(value(nil))
		}
		return nil
	}
	start := time.Now()
	deadline := start.Add(c.wait)
	got := map[int]*SignedReport{}
	// What each node's reports may answer, by node: one watch of all
	// their report subjects (Client.WatchReports).
	byNode := map[string][]int{}
	var nodes []string
	for i, w := range want {
		if w.seq == 0 {
			continue
		}
		if byNode[w.node] == nil {
			nodes = append(nodes, w.node)
		}
		byNode[w.node] = append(byNode[w.node], i)
	}
	missing := 0
	for i := range want {
		if want[i].seq != 0 {
			missing++
		}
	}
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	if missing > 0 {
		err := cl.WatchReports(ctx, nodes, 250*time.Millisecond, func() bool {
			c.waiting("the nodes' reports", len(got), len(want), start, c.wait)
			return true
		}, func(node string, r *SignedReport) bool {
			for _, i := range byNode[node] {
				if got[i] == nil && answers(r, want[i].seq) {
					got[i] = r
					missing--
				}
			}
			if missing > 0 {
				c.waiting("the nodes' reports", len(got), len(want), start, c.wait)
			}
			return missing > 0
		})
		if c.ctx.Err() != nil {
			c.progress("")
			if c.json {
				c.printJSON(value(waitedOf(want, got))) // what was done, whatever the wait
			}
			return c.ctx.Err()
		}
		// A watch the broker's going ended is said as the nodes not heard
		// from, with the broker lost (below), not as the watch's error.
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && cl.NC.IsConnected() {
			c.progress("")
			if c.json {
				c.printJSON(value(waitedOf(want, got))) // what was done, whatever the wait
			}
			return err
		}
	}
	c.progress("")
	worst, why := ExitApplied, ""
	var late []string
	var lateNodes []string
	for i, w := range want {
		r := got[i]
		if r == nil {
			late = append(late, fmt.Sprintf("%s (seq %d)", w.node, w.seq))
			lateNodes = append(lateNodes, w.node)
			continue
		}
		if !c.json {
			fmt.Fprintf(c.stdout, "%s: ", w.node)
			c.printReport(r)
		}
		if code := outcomeExit(r); code > worst {
			worst, why = code, fmt.Sprintf("%s: seq %d %s", w.node, w.seq, r.Outcome)
		}
	}
	if c.json {
		if err := c.printJSON(value(waitedOf(want, got))); err != nil {
			return err
		}
	} else {
		if len(got) > 0 {
			fmt.Fprintln(c.stdout) // the reports above, the summary apart
		}
		c.printSummary(want, got)
	}
	if len(late) > 0 {
		msg := fmt.Sprintf("no report within %v from %s", c.wait, strings.Join(late, ", "))
		if !cl.NC.IsConnected() {
			// Not the nodes' silence alone: the reports may have come to
			// a broker this command no longer reaches.
			msg += fmt.Sprintf("; this command lost the broker (%s) while it waited: their reports may be there (mesh-control reports NODE once it answers)", strings.ToLower(cl.NC.Status().String()))
		} else if why := cl.executorsAway(context.WithoutCancel(c.ctx), lateNodes); why != "" {
			msg += "; " + why
		}
		return &exitError{ExitTimedOut, msg}
	}
	if worst != ExitApplied {
		return &exitError{worst, why}
	}
	return nil
}

// tally is what a node's report did, counted by its lines as a person
// asks after an apply: how many changed the machine, were already as
// declared, failed, or were held (found on an adopted node and kept as
// found, changed by something else or not).
type tally struct{ changed, unchanged, failed, held, kept int }

func tallyOf(lines []shapes.Line) tally {
	var t tally
	t.changed, t.failed, _ = shapes.Did(&shapes.Report{Lines: lines})
	for _, l := range lines {
		switch l.Outcome {
		case shapes.Unchanged:
			t.unchanged++
		case shapes.Held, shapes.HeldChanged:
			t.held++
		case shapes.Kept:
			t.kept++ // undeclared and not undone: what it holds is not the host's
		}
	}
	return t
}

func (t *tally) add(o tally) {
	t.changed += o.changed
	t.unchanged += o.unchanged
	t.failed += o.failed
	t.held += o.held
	t.kept += o.kept
}

func (t tally) String() string {
	s := fmt.Sprintf("%d changed, %d unchanged, %d failed", t.changed, t.unchanged, t.failed)
	if t.held > 0 {
		s += fmt.Sprintf(", %d held", t.held)
	}
	if t.kept > 0 {
		s += fmt.Sprintf(", %d kept", t.kept)
	}
	return s
}

// summaryRow is one row of a summary of applies: the node it is about
// ("" in one node's own reports, where every row is that node's), the
// sequence, and the report (nil: none came within --wait).
type summaryRow struct {
	node string
	seq  uint64
	r    *SignedReport
}

// printSummary says, after the reports, a line for each node waited for
// — its sequence, its outcome and its lines counted, or that it did not
// answer — and the total: "2 nodes: 2 applied (5 changed, 1 unchanged, 0
// failed), 0 no answer". A fleet's worth of reports scrolls by; this is
// what is left on the screen.
func (c *cli) printSummary(want []nodeSeq, got map[int]*SignedReport) {
	rows := make([]summaryRow, len(want))
	for i, n := range want {
		rows[i] = summaryRow{node: n.node, seq: n.seq, r: got[i]}
	}
	c.summarize(rows, "node", true)
}

// summarize writes a summary of applies in Puppet's manner: a row each —
// who, the sequence, the outcome and the lines counted ("3 changed, 1
// unchanged, 0 failed"), who refused it, or that no report came — then
// the total ("2 nodes: 1 applied, 1 failed (3 changed, …)"). noun is what
// a row counts ("node", "report"); waited says the rows are what --wait
// asked for, so the total says how many did not answer. --wait and
// reports say it alike, from this one place. A plan changed nothing and
// a report of an apply done before (Duplicate) did nothing now: each is
// said on its row, and neither adds to the lines counted.
func (c *cli) summarize(rows []summaryRow, noun string, waited bool) {
	var total tally
	var applied, failed, refused, plans, own, none int
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	// A row's cells: the node (when the rows are of several), what was
	// asked ("seq 7", "plan ID"), then what became of it.
	row := func(n summaryRow, cells ...string) {
		if n.node != "" {
			cells = append([]string{n.node}, cells...)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	for _, n := range rows {
		r := n.r
		switch {
		case r == nil:
			none++
			row(n, fmt.Sprintf("seq %d", n.seq), "no answer", fmt.Sprintf("within %v", c.wait))
			continue
		case r.Trigger == link.TriggerPlan:
			plans++
			t := tallyOf(r.Lines)
			row(n, "plan "+r.PlanID, r.Outcome.Planned(), fmt.Sprintf("%d would change, %d would fail (a plan: nothing changed)", t.changed, t.failed))
			continue
		case r.Trigger == link.TriggerActivity:
			// No declaration's: what the executor did with none asking.
			own++
			changed, failedLines := 0, 0
			for _, a := range r.Meanwhile {
				changed, failedLines = changed+a.Changed, failedLines+a.Failed
			}
			row(n, "on its own", string(r.Outcome), fmt.Sprintf("%d changed, %d failed in %d apply(s) no declaration asked for", changed, failedLines, shapes.Applies(r.Meanwhile)))
			continue
		}
		seq := fmt.Sprintf("seq %d", n.seq)
		outcome := string(r.Outcome)
		if r.Outcome == shapes.Superseded {
			outcome = fmt.Sprintf("superseded by seq %d (%s)", r.SupersededBy, r.SupersededOutcome)
		}
		switch outcomeExit(r) {
		case ExitRefused:
			refused++
			row(n, seq, outcome, "by the "+r.RefusedBy)
			continue
		case ExitFailed:
			failed++
		default:
			applied++
		}
		if r.Duplicate {
			row(n, seq, outcome, "already applied: nothing done now")
			continue
		}
		t := tallyOf(r.Lines)
		total.add(t)
		row(n, seq, outcome, t.String())
	}
	w.Flush()
	nouns := noun + "s"
	if len(rows) == 1 {
		nouns = noun
	}
	line := fmt.Sprintf("%d %s: %d applied", len(rows), nouns, applied)
	if failed > 0 {
		line += fmt.Sprintf(", %d failed", failed)
	}
	if refused > 0 {
		line += fmt.Sprintf(", %d refused", refused)
	}
	line += fmt.Sprintf(" (%s)", total)
	if plans > 0 {
		line += fmt.Sprintf(", %d plan(s)", plans)
	}
	if own > 0 {
		line += fmt.Sprintf(", %d of what the executor did on its own", own)
	}
	if waited {
		line += fmt.Sprintf(", %d no answer", none)
	}
	fmt.Fprintln(c.stdout, line)
}

// progress says, on a terminal only, how the wait is going, on one line
// written over each time ("" clears it): a person sees it move; a pipe or
// a log file would keep every version of it.
func (c *cli) progress(format string, args ...any) {
	if c.tty == nil {
		return
	}
	// \r to the line's start, ESC [K erases what a longer line left.
	fmt.Fprintf(c.tty, "\r%s\x1b[K", fmt.Sprintf(format, args...))
}

// waiting says, on a terminal only (progress), what a command waits for
// and how far it is: "waiting for WHAT: N of M answered (5s of 2m0s)" —
// the same words for every wait on nodes' answers (declare --wait's
// reports, plan's), so a person reads them alike.
func (c *cli) waiting(what string, answered, of int, start time.Time, within time.Duration) {
	c.progress("waiting for %s: %d of %d answered (%v of %v)", what, answered, of, time.Since(start).Round(time.Second), within)
}

// isTerminal says whether w is a terminal: a file descriptor on which
// the terminal's attributes can be read (what isatty(3) asks).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
