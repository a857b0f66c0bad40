package agent

import (
	"testing"
	"time"
)

// The waits between attempts to link spread a fleet that lost its link at
// one instant: each is drawn from a window that doubles with the failed
// attempts, up to a ceiling, and never shorter than RetryWait.
func TestLinkWaitsGrowWithFullJitter(t *testing.T) {
	a := &Agent{o: Options{RetryWait: time.Second}}
	for _, tc := range []struct {
		attempt int
		window  time.Duration // the waits are RetryWait + [0, window]
	}{
		{1, 4 * time.Second},
		{2, 8 * time.Second},
		{3, 16 * time.Second},
		{4, 32 * time.Second},
		{5, 60 * time.Second},
		{50, 60 * time.Second},
	} {
		lo, hi := time.Hour, time.Duration(0)
		for range 2000 {
			d := a.linkWait(tc.attempt)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < time.Second || hi > time.Second+tc.window {
			t.Errorf("attempt %d: waits in [%v, %v], want within [1s, %v]", tc.attempt, lo, hi, time.Second+tc.window)
		}
		// Full jitter: the draws cover the window, not a second of it.
		if hi-lo < tc.window*9/10 {
			t.Errorf("attempt %d: waits in [%v, %v] cover less than the window %v", tc.attempt, lo, hi, tc.window)
		}
	}
}
