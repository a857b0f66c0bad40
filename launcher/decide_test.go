package launcher

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// Decide is the launcher's algorithm, whole: every branch, the window's edges,
// and that the state it returns already counts the start it asks for.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	p := Policy{MaxStarts: 3, Window: 10 * time.Minute}
	ago := func(d ...time.Duration) []time.Time {
		var ts []time.Time
		for _, x := range d {
			ts = append(ts, now.Add(-x))
		}
		return ts
	}
	back := &RollbackMark{At: now.Add(-time.Hour), Reason: "earlier", Reinstalled: true}
	halted := &Mark{At: now.Add(-time.Minute), Reason: "the machine is the problem"}
	for _, tc := range []struct {
		name       string
		in         State
		want       Action
		starts     int  // len(next.Starts)
		rolledBack bool // next.RolledBack != nil
		halted     bool
		reason     string // in the new mark's reason
	}{
		{name: "first start", in: State{}, want: Start, starts: 1},
		{name: "below the limit", in: State{Starts: ago(time.Minute, 2*time.Minute)}, want: Start, starts: 3},
		{name: "at the limit: roll back", in: State{Starts: ago(time.Minute, 2*time.Minute, 3*time.Minute)},
			want: Rollback, starts: 1, rolledBack: true, reason: "3 starts within 10m0s"},
		{name: "at the limit, rolled back: halt", in: State{Starts: ago(1, 2, 3), RolledBack: back},
			want: Halt, starts: 3, rolledBack: true, halted: true, reason: "the machine is the problem"},
		{name: "rolled back, below the limit: start", in: State{Starts: ago(1, 2), RolledBack: back},
			want: Start, starts: 3, rolledBack: true},
		{name: "old starts fall out of the window", in: State{Starts: ago(11*time.Minute, 20*time.Minute, time.Hour, time.Minute)},
			want: Start, starts: 2},
		{name: "exactly one window ago does not count", in: State{Starts: ago(10*time.Minute, 10*time.Minute, 10*time.Minute)},
			want: Start, starts: 1},
		{name: "a clock set back keeps one window of future starts", in: State{Starts: ago(-time.Minute, -time.Hour, 0)},
			want: Start, starts: 3},
		{name: "halted: idle, whatever the counter", in: State{Starts: ago(1, 2, 3, 4), Halted: halted},
			want: Idle, starts: 4, halted: true},
		{name: "halted and rolled back: idle", in: State{Halted: halted, RolledBack: back}, want: Idle, rolledBack: true, halted: true},
		{name: "an unfinished reinstall is finished first", in: State{Starts: ago(1), RolledBack: &RollbackMark{At: now, Reason: "r"}},
			want: Rollback, starts: 1, rolledBack: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.in.clone()
			act, next := Decide(tc.in, now, p)
			if act != tc.want {
				t.Fatalf("Decide = %v, want %v", act, tc.want)
			}
			if !reflect.DeepEqual(tc.in, before) {
				t.Errorf("Decide changed its argument: %+v, was %+v", tc.in, before)
			}
			if len(next.Starts) != tc.starts || (next.RolledBack != nil) != tc.rolledBack || (next.Halted != nil) != tc.halted {
				t.Errorf("next = %d starts, rolled back %v, halted %v; want %d, %v, %v",
					len(next.Starts), next.RolledBack != nil, next.Halted != nil, tc.starts, tc.rolledBack, tc.halted)
			}
			if act == Start || act == Rollback {
				if last := next.Starts[len(next.Starts)-1]; !last.Equal(now) {
					t.Errorf("the start asked for is not counted: last start %v", last)
				}
			}
			if act == Rollback && next.RolledBack.Reinstalled {
				t.Error("a rollback is marked done before the reinstall")
			}
			var reason string
			switch {
			case act == Halt:
				reason = next.Halted.Reason
			case act == Rollback && tc.in.RolledBack == nil:
				reason = next.RolledBack.Reason
			}
			if !strings.Contains(reason, tc.reason) {
				t.Errorf("reason %q does not say %q", reason, tc.reason)
			}
		})
	}
}

// The whole sequence from an empty state with a binary that never reports
// healthy: MaxStarts starts, a rollback, MaxStarts more, a halt, then idle.
func TestDecideSequence(t *testing.T) {
	p := Policy{MaxStarts: 5, Window: 10 * time.Minute}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var s State
	var got []string
	for i := 0; i < 13; i++ {
		var act Action
		act, s = Decide(s, now, p)
		if act == Rollback {
			s.RolledBack.Reinstalled = true // what Run records once the reinstall is done
		}
		got = append(got, act.String())
		now = now.Add(time.Second)
	}
	want := "start start start start start rollback start start start start halt idle idle"
	if strings.Join(got, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
}
