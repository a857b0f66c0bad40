//go:build chaosclock

package clock

import (
	"fmt"
	"os"
	"time"
)

// skew is read once, at the start: a machine whose clock is off stays off
// for the life of the process, and every time Now gave keeps its place
// against the others.
var skew = readSkew()

func readSkew() time.Duration {
	v := os.Getenv(SkewEnv)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		// A chaosclock build runs only under the chaos run, which wrote
		// the value: a bad one is its mistake, said at once.
		panic(fmt.Sprintf("clock: %s=%q: %v", SkewEnv, v, err))
	}
	return d
}

// skewBuild says whether this build reads SkewEnv.
const skewBuild = true
