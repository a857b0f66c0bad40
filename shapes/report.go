package shapes

import (
	"slices"
	"strings"
	"time"
)

// Outcome is what happened to one resource, or to an apply as a whole.
type Outcome string

// The outcomes of a report line, worst first. An apply's outcome is derived
// from its worst line, never stated apart, so a report cannot read fine while
// carrying a failed line.
const (
	Failed      Outcome = "failed"
	HeldChanged Outcome = "held-changed" // held, and changed by something else
	Held        Outcome = "held"         // found on an adopted node, kept as found
	Kept        Outcome = "kept"         // undeclared, but kept (it holds what the host did not make)
	Repaired    Outcome = "repaired"     // drift from what the host applied, put right
	Applied     Outcome = "applied"
	Removed     Outcome = "removed"
	Restored    Outcome = "restored" // undeclared, and given back as the host found it
	Forgotten   Outcome = "forgotten"
	Unchanged   Outcome = "unchanged"
)

// Outcomes of a whole declaration that never reached the engine's lines.
const (
	Refused    Outcome = "refused"
	Superseded Outcome = "superseded"
)

// severity orders line outcomes, worst first.
var severity = []Outcome{Failed, HeldChanged, Held, Kept, Repaired, Applied, Removed, Restored, Forgotten, Unchanged}

// Severity is an outcome's rank: lower is worse. Unknown outcomes rank worst.
func Severity(o Outcome) int {
	for i, s := range severity {
		if s == o {
			return i
		}
	}
	return -1
}

// LineOutcomes is the outcomes a report's lines may have, worst first.
func LineOutcomes() []Outcome { return slices.Clone(severity) }

// Planned says what an outcome would be, for a plan's lines and its head
// wherever they are printed: a plan changes nothing, and a line that said
// "applied" would read as done. Refused and held-changed say what is so
// now, and are themselves.
func (o Outcome) Planned() string {
	switch o {
	case Applied:
		return "would apply"
	case Repaired:
		return "would repair"
	case Removed:
		return "would remove"
	case Restored:
		return "would restore"
	case Forgotten:
		return "would forget"
	case Kept:
		return "would keep"
	case Held:
		return "would hold"
	case Failed:
		return "would fail"
	case Unchanged:
		return "would change nothing"
	}
	return string(o)
}

// Line is one resource's line in a report. Detail never carries a kept
// original or a sealed plaintext.
type Line struct {
	Module  string  `json:"module"`
	ID      string  `json:"id"`
	Type    string  `json:"type"`
	Outcome Outcome `json:"outcome"`
	Detail  string  `json:"detail,omitempty"`
}

// Report is what an apply answers: its lines, and the outcome derived from
// them. A refused declaration has Refused set and no lines.
type Report struct {
	Outcome Outcome `json:"outcome"`
	Source  string  `json:"source,omitempty"`
	Seq     uint64  `json:"seq,omitempty"`
	Lines   []Line  `json:"lines"`
	Refused string  `json:"refused,omitempty"`
	// Briefing is set by an apply on an adopted node.
	Briefing *Briefing `json:"briefing,omitempty"`
	// Upgraded is the version of the host now installed, when it is not
	// the one that ran this apply: the daemon restarts onto it (exit 0,
	// the launcher starts the new binary) once the apply is reported.
	Upgraded string `json:"upgraded,omitempty"`
	// Passing marks a refusal of the executor's own side (its target or
	// floor not written: a full disk), not of the declaration: the same
	// declaration delivered again may be taken. Not carried anywhere.
	Passing bool `json:"-" cbor:"-"`
}

// Derive returns the worst outcome among lines; no lines is Unchanged.
func Derive(lines []Line) Outcome {
	worst := Unchanged
	for _, l := range lines {
		if Severity(l.Outcome) < Severity(worst) {
			worst = l.Outcome
		}
	}
	return worst
}

// Activity is one apply that did something — changed the machine, or
// failed — as the executor's history keeps it: what a node says it did
// while its link was down (drift repaired, a rescue file applied).
type Activity struct {
	At      time.Time `json:"at" cbor:"1,keyasint"`
	Source  string    `json:"source" cbor:"2,keyasint"`  // link, local (rescue), bundle
	Trigger string    `json:"trigger" cbor:"3,keyasint"` // declaration, start, drift, reconnect, rescue, reconcile
	Seq     uint64    `json:"seq,omitempty" cbor:"4,keyasint,omitempty"`
	Outcome Outcome   `json:"outcome" cbor:"5,keyasint"`
	// Changed counts the lines that changed the machine (applied,
	// repaired, removed, restored); Failed the failed ones.
	Changed int `json:"changed" cbor:"6,keyasint"`
	Failed  int `json:"failed" cbor:"7,keyasint"`
	// Lines are those changed and failed lines themselves, at most
	// MaxActivityLines of them, each detail cut to MaxActivityDetail
	// bytes; LinesMore counts those left out. What a node changed on its
	// own — a start after a reboot, a drift repaired — reaches the control
	// side by name, not as a count alone. Absent in what releases before
	// the field kept.
	Lines     []Line `json:"lines,omitempty" cbor:"8,keyasint,omitempty"`
	LinesMore int    `json:"lines_more,omitempty" cbor:"9,keyasint,omitempty"`
	// Part numbers the activities one apply is named in (ActivitiesOf):
	// 0 for its first (or only) one.
	Part int `json:"part,omitempty" cbor:"10,keyasint,omitempty"`
}

// The bounds of an Activity's lines: an activity is kept in the executor's
// bounded history and a hundred of them ride on one reconnect report.
const (
	MaxActivityLines  = 16
	MaxActivityDetail = 160
	// MaxActivityParts bounds the activities one apply is named in: 8
	// name 128 lines, what a declaration of a few modules changes whole.
	// A larger apply's lines past them are counted, not named, so that
	// the history (its newest 200 kept) keeps what came before.
	MaxActivityParts = 8
)

// Did reports whether rep is worth an Activity, and counts its lines.
func Did(rep *Report) (changed, failed int, ok bool) {
	for _, l := range rep.Lines {
		switch {
		case l.Outcome.Changes():
			changed++
		case l.Outcome == Failed:
			failed++
		}
	}
	return changed, failed, changed+failed > 0
}

// Changes says whether a line of this outcome changed the machine.
func (o Outcome) Changes() bool {
	return o == Applied || o == Repaired || o == Removed || o == Restored
}

// Applies counts the applies acts name: one named in several activities
// (ActivitiesOf) once — also one whose first parts were left off a list
// (a page of the executor's history, the newest kept): a part that does
// not follow its part before it starts an apply here.
func Applies(acts []Activity) int {
	n := 0
	for i, a := range acts {
		if a.Part == 0 || i == 0 || acts[i-1].Part != a.Part-1 {
			n++
		}
	}
	return n
}

// ActivitiesOf is rep as Activities (Did says whether it is worth any):
// its changed and failed lines, MaxActivityLines to an activity, in as
// many as name them all up to MaxActivityParts, the last counting the
// rest (LinesMore). A start that resumed a declaration a power cut
// stopped names every file it removed, not sixteen and a count. Each
// activity counts the lines it names or counts: their sums are the
// apply's.
func ActivitiesOf(rep *Report, at time.Time, source, trigger string) []Activity {
	var acts []Activity
	for _, l := range rep.Lines {
		if !l.Outcome.Changes() && l.Outcome != Failed {
			continue
		}
		n := len(acts)
		if n == 0 || (len(acts[n-1].Lines) == MaxActivityLines && n < MaxActivityParts) {
			acts = append(acts, Activity{At: at, Source: source, Trigger: trigger, Seq: rep.Seq, Outcome: rep.Outcome, Part: n})
			n++
		}
		a := &acts[n-1]
		if l.Outcome == Failed {
			a.Failed++
		} else {
			a.Changed++
		}
		if len(a.Lines) == MaxActivityLines {
			a.LinesMore++
			continue
		}
		if len(l.Detail) > MaxActivityDetail {
			l.Detail = strings.ToValidUTF8(l.Detail[:MaxActivityDetail], "") + "…"
		}
		a.Lines = append(a.Lines, l)
	}
	return acts
}
