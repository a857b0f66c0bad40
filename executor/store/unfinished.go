package store

import (
	"errors"
	"fmt"
	"os"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// What an apply changed reaches the control side in its report, sent once
// the apply ends. A power cut or a kill between a change made durable and
// the report sent loses the report, and the next apply finds the change
// done: "unchanged". Nothing would ever say the machine changed. So the
// journal also carries, beside the records, what the apply said of each
// change it made ("said", in the same write as its record, or right after):
// an apply begins with "begin" (its source, sequence and digest) and ends
// with "end". An apply that finds one begun and never ended notes what
// that one said in the history, as an activity of its own
// (TriggerInterrupted), which the agent reports upward as what the
// executor did on its own, and then records "noted". Never lost (a note
// that fails is tried again by the next apply, and the notes are durable
// before "noted" is written), never noted twice (each note names the
// begin's record and its part, and one the history holds is not made
// again, when "noted" was lost). An end is journaled once the report is
// kept (engine.Options.Keep) and is made durable with the next sync: a
// cut in the seconds after an apply ended may have the next one note what
// that one's report said already — said twice, never not at all.

// TriggerInterrupted is the trigger of the activity an interrupted apply's
// changes are noted under.
const TriggerInterrupted = "interrupted"

// Began names an apply in the journal: its source, its declaration's
// sequence and a digest of its bytes.
type Began struct {
	Source Source `json:"source"`
	Seq    uint64 `json:"seq,omitempty"`
	Digest string `json:"digest,omitempty"`
}

// unfinished is an apply begun in the journal and not ended, with what it
// said.
type unfinished struct {
	Began
	// N is the begin's record number, which names its notes in the
	// history (historyLine.Begun).
	N     uint64
	PID   int // the process that began it; 0 in a release's before it
	Lines []shapes.Line
}

// ErrNotNoted is Begin's error when the apply began but the cut applies
// before it were not marked noted: what they changed could not be kept
// for their restarts (CutChanged). The journal keeps them for the next.
var ErrNotNoted = errors.New("the applies cut short before this one stay in the journal")

// Begin records that the apply b begins, after
// noting in the history what an apply begun before and never ended said
// it changed; noted is what it noted, for the caller's log.
func (s *Store) Begin(b Began) (noted []shapes.Activity, err error) {
	var noteErr error // the begin written, the cut applies not marked noted
	var done map[[2]uint64]bool
	if len(s.unfinished) > 0 {
		done = notedParts(s.dir)
	}
	for _, u := range s.unfinished {
		rep := &shapes.Report{Source: string(u.Source), Seq: u.Seq, Lines: u.Lines, Outcome: shapes.Derive(u.Lines)}
		for _, a := range shapes.ActivitiesOf(rep, clock.Now().UTC(), string(u.Source), TriggerInterrupted) {
			if done[[2]uint64{u.N, uint64(a.Part)}] {
				continue // noted by an apply whose "noted" was lost
			}
			if err := s.noteLine(historyLine{Begun: u.N, Activity: a}); err != nil {
				return nil, err
			}
			noted = append(noted, a)
		}
	}
	if len(noted) > 0 {
		// Durable before the end below is: the end may reach the disk
		// with the next record's sync.
		if err := SyncHistory(s.dir); err != nil {
			return nil, err
		}
	}
	if len(s.unfinished) > 0 {
		// What they changed is kept for their sources' restarts first
		// (CutChanged): once noted, the journal forgets it. Not kept (a
		// restarts-owed.json that does not read), they are not marked
		// noted, and stay in the journal for the next apply; their notes
		// in the history are not made twice.
		if err := s.keepCutChanges(); err != nil {
			noteErr = fmt.Errorf("%w: %w", ErrNotNoted, err)
		} else if err := s.append(&record{Op: "noted"}); err != nil {
			return noted, err
		}
	}
	// The begin is the last write: an error is that it was not written,
	// and the apply then says nothing into the journal, nor ends.
	if err := s.append(&record{Op: "begin", Began: &b, PID: os.Getpid()}); err != nil {
		return noted, err
	}
	return noted, noteErr
}

// Interrupted is the begin records of the applies of exactly b (the same
// declaration of the same source) begun and never ended: a change one of
// them began and did not record (IntentBegun), found done now, it made.
func (s *Store) Interrupted(b Began) []uint64 {
	var ns []uint64
	for _, u := range s.unfinished {
		if u.Began == b {
			ns = append(ns, u.N)
		}
	}
	return ns
}

// Unended is the applies begun in the journal and not ended, oldest
// first: cut short (a kill, a power cut), or — the last, begun by the
// process holding the store's lock (LockHolder) — the one running now.
func (s *Store) Unended() []UnendedApply {
	out := make([]UnendedApply, 0, len(s.unfinished))
	for _, u := range s.unfinished {
		out = append(out, UnendedApply{Began: u.Began, PID: u.PID})
	}
	return out
}

// UnendedApply is an apply begun and not ended, and the process that
// began it (0: a release before that was kept).
type UnendedApply struct {
	Began
	PID int
}

// IntentBegun is the begin record of the apply that wrote the intent
// pending on target, 0 when none is known (one of an apply that began
// nothing, or read from the snapshot). An intent an earlier apply left
// pending (its change failed) is that apply's, not a later one's that a
// cut ended before it got there.
func (s *Store) IntentBegun(target string) uint64 { return s.intentBegun[target] }

// Said keeps what the apply said of a change, for the journal's next
// record (written in the same write: a line said before the record of its
// change goes with it) or FlushSaid. Lines that changed nothing are not
// kept.
func (s *Store) Said(l shapes.Line) {
	if !l.Outcome.Changes() && l.Outcome != shapes.Failed {
		return
	}
	if len(l.Detail) > shapes.MaxActivityDetail {
		l.Detail = l.Detail[:shapes.MaxActivityDetail]
	}
	s.said = append(s.said, l)
}

// FlushSaid writes the lines Said kept, if any, as a record of their own.
func (s *Store) FlushSaid() error {
	if len(s.said) == 0 || s.journal == nil {
		return nil
	}
	return s.write(nil)
}

// End records that the apply begun last ended: its report is made.
func (s *Store) End() error {
	return s.append(&record{Op: "end"})
}
