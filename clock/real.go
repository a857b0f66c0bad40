//go:build !chaosclock

package clock

// skew is nothing in the programs as built for a machine.
const skew = 0

// skewBuild says whether this build reads SkewEnv.
const skewBuild = false
