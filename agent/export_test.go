package agent

// MeasureClock is measureClock, for the tests that hold it to a real
// broker.
var MeasureClock = measureClock
