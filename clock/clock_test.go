package clock

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// What Now says and the runtime's deadlines agree in the programs as
// built (no skew), and Since and Until measure against Now.
func TestTheTwoKindsAgreeWithoutSkew(t *testing.T) {
	if skewed() {
		t.Skip("a chaosclock build run with " + SkewEnv + " set: TestASkewMovesNowOnly covers it")
	}
	before := time.Now()
	now := Now()
	if now.Before(before) || now.Sub(before) > 10*time.Second {
		t.Fatalf("Now %v, time.Now %v", now, before)
	}
	if d := Deadline(time.Minute).Sub(now); d < time.Minute || d > time.Minute+10*time.Second {
		t.Fatalf("Deadline(1m) is %v after Now", d)
	}
	if Past(Deadline(time.Minute)) || !Past(Deadline(-time.Second)) {
		t.Fatal("Past is wrong about a deadline a minute on, or one a second gone")
	}
	if s := Since(now.Add(-time.Hour)); s < time.Hour || s > time.Hour+10*time.Second {
		t.Fatalf("Since an hour ago: %v", s)
	}
	if u := Until(now.Add(time.Hour)); u > time.Hour || u < time.Hour-10*time.Second {
		t.Fatalf("Until an hour on: %v", u)
	}
}

// A chaosclock build moves what Now says by NOX_CLOCK_SKEW and leaves the
// runtime's deadlines where they are; it is read in a child, since the
// skew is read once at the start. Run by `go test -tags chaosclock`
// (make test does).
func TestASkewMovesNowOnly(t *testing.T) {
	if os.Getenv("CLOCK_TEST_CHILD") != "" {
		real := time.Now()
		if d := Now().Sub(real); d > -3*time.Hour+10*time.Second || d < -3*time.Hour {
			t.Fatalf("with %s=-3h Now is %v from the machine's clock", SkewEnv, d)
		}
		if d := Deadline(time.Minute).Sub(real); d < time.Minute || d > time.Minute+10*time.Second {
			t.Fatalf("with a skew, Deadline(1m) is %v from the machine's clock", d)
		}
		if Past(Deadline(time.Minute)) || Left(Deadline(time.Minute)) < 50*time.Second {
			t.Fatal("with a skew, a deadline a minute on is past, or less than a minute off")
		}
		if s := Since(Now().Add(-time.Minute)); s < time.Minute || s > time.Minute+10*time.Second {
			t.Fatalf("with a skew, Since a minute ago by Now is %v", s)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestASkewMovesNowOnly$", "-test.v")
	cmd.Env = append(os.Environ(), "CLOCK_TEST_CHILD=1", SkewEnv+"=-3h")
	out, err := cmd.CombinedOutput()
	if !skewBuild {
		// The programs as built for a machine read no variable: the
		// child's Now is the machine's clock, so its check of -3h fails.
		if err == nil || !strings.Contains(string(out), "from the machine's clock") {
			t.Fatalf("a build without chaosclock took %s=-3h: %v\n%s", SkewEnv, err, out)
		}
		return
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func skewed() bool { return skew != 0 }
