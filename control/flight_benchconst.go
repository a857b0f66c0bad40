//go:build benchconstwindow

package control

// A comparison build for the fleet bench only (make bench-scale
// TAGS=benchconstwindow): every fan-out's window held at 256 requests in
// flight, the constant it was before it adapted to the broker's answers.
// Never built by the Makefile's other targets or the packages.
func init() { constWindow = 256 }
