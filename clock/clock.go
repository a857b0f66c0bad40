// Package clock is the one place a node's programs (the agent, the
// executor and the launcher) read the time, in two kinds that must not mix:
//
//   - Now, Since and Until say what this machine's clock says: the stamps a
//     node records and sends (a report's time, a heartbeat, a disconnection's
//     interval), and the checks of a time that came from elsewhere (a
//     plan's NotAfter, a token's expiry). A node whose clock is wrong is
//     wrong here, and the control side, which reads its own clock, says so.
//   - Deadline, Past and Left are for the runtime's deadlines (a
//     connection's, a context's, a wait for a lock): the runtime measures
//     those on its own clock, so they are never made from Now.
//
// In the programs as built for a machine the two kinds read the same
// clock. A build with the tag chaosclock (the chaos run's, tests/chaos)
// shifts the first kind by the duration in NOX_CLOCK_SKEW, which is how a
// node whose clock is hours off is run on a machine whose clock is right:
// Go reads the wall clock through the vDSO, out of reach of an LD_PRELOAD
// faker, and Linux time namespaces offset only the monotonic clocks. The
// rule that every read goes through here is held by
// tests/clock_test.go.
package clock

import "time"

// SkewEnv names the variable whose duration (time.ParseDuration's form,
// "-3h") a chaosclock build adds to what Now says; other builds read no
// variable.
const SkewEnv = "NOX_CLOCK_SKEW"

// Now is the time this machine's clock says.
func Now() time.Time { return time.Now().Add(skew) }

// Since is the time elapsed since t, a time Now returned or one read from
// elsewhere, by this machine's clock.
func Since(t time.Time) time.Duration { return Now().Sub(t) }

// Until is the time left until t by this machine's clock.
func Until(t time.Time) time.Duration { return t.Sub(Now()) }

// Deadline is the moment d from now, for a deadline the runtime keeps (a
// connection's, a context's) or one Past and Left check.
func Deadline(d time.Duration) time.Time { return time.Now().Add(d) }

// Past reports whether a deadline made by Deadline, or a context's, has
// passed.
func Past(deadline time.Time) bool { return time.Now().After(deadline) }

// Left is the time left before a deadline made by Deadline, or a
// context's.
func Left(deadline time.Time) time.Duration { return time.Until(deadline) }
