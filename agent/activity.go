package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// What the executor did on its own — a drift repaired (a hand edit of a
// file the mesh holds, put back), a start's reconcile after a boot, a
// rescue file root applied — is reported upward while linked, not only on
// the next reconnect: the control side learns within a status look that
// someone changed what it declared. The executor counts its activities
// (its status says the newest count); the agent keeps the count it last
// reported (State.ActivityReported), asks for those past it, and
// publishes them as a report of trigger activity. The work loop does it,
// as it does the reconnect's report, which carries the same count: the
// two never say one activity twice, nor pass one over.

// maxActivityRounds bounds the reports one pass publishes (MaxActivities
// each): the rest waits for the next look, behind any declaration.
const maxActivityRounds = 4

// heardActivity keeps the newest count a status said, and wakes the work
// loop when it is past the one reported.
func (a *Agent) heardActivity(s *wire.StatusReply) {
	a.activitySaid.Store(s.Activity + 1)
	if st := a.state.get(); !st.ActivityCounted || s.Activity != st.ActivityReported {
		select {
		case a.activityNow <- struct{}{}:
		default:
		}
	}
}

// reportActivity reports what the executor did on its own past the count
// last reported, up to the newest a status said. One that failed (the
// executor away, the broker not confirming: a control side's full disk)
// is tried again after a wait that doubles, up to a minute, not at each
// look.
func (a *Agent) reportActivity(ctx context.Context) error {
	said := a.activitySaid.Load()
	if said == 0 || clock.Now().Before(a.activityRetry) {
		return nil // no status heard yet, or waiting to try again
	}
	err := a.reportActivityNow(ctx, said-1)
	if err != nil {
		a.activityWait = min(max(2*a.activityWait, a.o.RetryWait), time.Minute)
		a.activityRetry = clock.Now().Add(a.activityWait)
		return fmt.Errorf("%w (tried again in %v)", err, a.activityWait.Round(time.Millisecond))
	}
	a.activityWait, a.activityRetry = 0, time.Time{}
	return nil
}

func (a *Agent) reportActivityNow(ctx context.Context, newest uint64) error {
	st := a.state.get()
	if !st.ActivityCounted {
		// A state from a release before the count, or a new one: what the
		// executor did before went upward as it could then (a reconnect's
		// report), or not at all; counting starts here.
		return a.state.update(func(s *State) { s.ActivityReported, s.ActivityCounted = newest, true })
	}
	after := st.ActivityReported
	for range maxActivityRounds {
		if after == newest {
			return nil
		}
		b, err := a.exec.ask(wire.KindActivity, &wire.Activity{After: after}, "activity")
		if err != nil {
			return err
		}
		r := b.(*wire.ActivityReply)
		if len(r.Acts) > 0 || r.Lost > 0 {
			rep := a.report(0)
			rep.Trigger, rep.Outcome = link.TriggerActivity, activityOutcome(r.Acts)
			rep.Meanwhile, rep.MeanwhileMore = r.Acts, int(min(r.Lost, 1<<20))
			if err := a.publishReports(ctx, []*link.Report{rep}); err != nil {
				return err
			}
			a.log.Info("reported what the executor did on its own", "activities", len(r.Acts), "lost", r.Lost, "outcome", rep.Outcome)
		}
		if err := a.state.update(func(s *State) { s.ActivityReported = r.Last }); err != nil {
			a.log.Warn("state: " + err.Error())
		}
		if r.Last == after || r.Last >= newest {
			return nil
		}
		after = r.Last
	}
	return nil
}

// activityOutcome is the worst outcome of acts, as a report's is.
func activityOutcome(acts []shapes.Activity) shapes.Outcome {
	out := shapes.Unchanged
	for _, act := range acts {
		if shapes.Severity(act.Outcome) < shapes.Severity(out) {
			out = act.Outcome
		}
	}
	return out
}

// reconnectedAfter is the count the reconnect names (nil: none kept).
func (a *Agent) reconnectedAfter() *uint64 {
	st := a.state.get()
	if !st.ActivityCounted {
		return nil
	}
	n := st.ActivityReported
	return &n
}

// reportedThrough keeps, once a reconnect's report is out, the count its
// verdict covered.
func (a *Agent) reportedThrough(v *wire.Verdict) {
	if err := a.state.update(func(s *State) { s.ActivityReported, s.ActivityCounted = v.Activity, true }); err != nil {
		a.log.Warn(fmt.Sprintf("state: %v", err))
	}
}
