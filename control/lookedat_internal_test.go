package control

import (
	"fmt"
	"testing"
	"time"
)

// A look is due once an interval a key, and what is older than the
// interval is forgotten as looks go on: the set does not grow with every
// key there ever was.
func TestLookedAtOnceAnIntervalAndForgets(t *testing.T) {
	var l lookedAt
	if !l.due("n1/a", time.Hour) || l.due("n1/a", time.Hour) || !l.due("n1/b", time.Hour) {
		t.Fatal("a key is due once an interval, each key on its own")
	}
	for i := range 2048 {
		l.due(fmt.Sprintf("old%d", i), time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	for i := range 1024 {
		l.due(fmt.Sprintf("new%d", i), time.Millisecond)
	}
	n := 0
	l.m.Range(func(k, _ any) bool { n++; return true })
	if n > 1024+2 {
		t.Fatalf("%d keys kept after those older than the interval were due to be forgotten", n)
	}
}
