package launcher

import (
	"fmt"
	"time"
)

// Policy is the rollback thresholds.
type Policy struct {
	// MaxStarts is how many starts within Window the launcher allows
	// without a healthy report; the next attempt rolls back (or halts).
	MaxStarts int
	// Window is how far back a start counts.
	Window time.Duration
}

// Action is what Decide tells the launcher to do.
type Action int

// The actions; String names them (what stringer would write, by hand).
const (
	// Idle: halted; start nothing, stay up.
	Idle Action = iota
	// Start: start the installed executor.
	Start
	// Rollback: reinstall the known-good copy, then start.
	Rollback
	// Halt: record the halt, then Idle.
	Halt
)

func (a Action) String() string {
	switch a {
	case Idle:
		return "idle"
	case Start:
		return "start"
	case Rollback:
		return "rollback"
	case Halt:
		return "halt"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decide is the launcher's algorithm, as a pure function: given the launch
// state and the time, what to do and the state to persist before doing it
// (which already counts the start it asks for). It never changes s.
//
//	halted                                   → Idle (s unchanged)
//	rolled_back marked, not reinstalled      → Rollback (finish it)
//	fewer than MaxStarts starts in Window    → Start
//	MaxStarts or more, not rolled back       → Rollback (mark set, counter restarted at this start)
//	MaxStarts or more, rolled back           → Halt ("the machine is the problem")
//
// A start counts while it is within Window of now on either side: a clock
// set back keeps the starts of one window, never more.
func Decide(s State, now time.Time, p Policy) (Action, State) {
	if s.Halted != nil {
		return Idle, s
	}
	now = now.UTC()
	next := s.clone()
	next.Starts = recent(s.Starts, now, p.Window)
	n := len(next.Starts)
	switch {
	case next.RolledBack != nil && !next.RolledBack.Reinstalled:
		next.Starts = []time.Time{now}
		return Rollback, next
	case n >= p.MaxStarts && next.RolledBack == nil:
		next.RolledBack = &RollbackMark{At: now, Reason: fmt.Sprintf(
			"%d starts within %v without a reconcile running to its end: reinstalling the known-good copy", n, p.Window)}
		next.Starts = []time.Time{now}
		return Rollback, next
	case n >= p.MaxStarts:
		next.Halted = &Mark{At: now, Reason: fmt.Sprintf(
			"%d starts within %v without a reconcile running to its end, after the rollback to the known-good copy at %s: "+
				"the machine is the problem, not the binary; a person has to look, then run mesh-launch clear",
			n, p.Window, next.RolledBack.At.Format(time.RFC3339))}
		return Halt, next
	}
	next.Starts = append(next.Starts, now)
	return Start, next
}

// recent keeps the starts within w of now, at most maxKept of the latest.
func recent(starts []time.Time, now time.Time, w time.Duration) []time.Time {
	var out []time.Time
	for _, t := range starts {
		if d := now.Sub(t); d < w && d > -w {
			out = append(out, t.UTC())
		}
	}
	if len(out) > maxKept {
		out = out[len(out)-maxKept:]
	}
	return out
}
