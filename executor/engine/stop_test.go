package engine

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A stop asked in the middle of an apply (Options.Stop) lets the step in
// progress end — an action is neither killed nor cut short — attempts no
// later resource, says how many it left and removes nothing undeclared:
// the apply did not see the declaration through. The next apply, not
// stopped, does the rest and only then removes what is undeclared. A
// stop asked before the apply began refuses it for the moment (passing):
// nothing changes, the target is not saved.
func TestAStopEndsTheApplyBetweenTwoResources(t *testing.T) {
	old := `{"module":"m","id":"old","type":"file","path":"{root}/old","content":"old\n"}`
	action := `{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo > {root}/started; sleep 0.5; echo done > {root}/marker"],"verify":["/bin/sh","-c","test -f {root}/marker"]}`
	resources := []string{
		`{"module":"m","id":"first","type":"file","path":"{root}/first","content":"1\n"}`,
		action,
		`{"module":"m","id":"second","type":"file","path":"{root}/second","content":"2\n"}`,
		`{"module":"m","id":"dir","type":"directory","path":"{root}/dir"}`,
	}
	cases := []struct {
		name string
		// at is the line whose emission asks the stop ("" before the apply).
		at      string
		applied string
		rest    string
	}{
		{"before the apply began", "", "", ""},
		{"after a batch of files", "first", "m.first=applied ", "3 later resources"},
		{"during an action, which ends", "first-then-action", "m.first=applied m.a=applied ", "2 later resources"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.expect(h.apply(h.doc(old)), shapes.Applied, "m.old=applied")
			doc := h.doc(resources...)
			stop := make(chan struct{})
			switch tc.at {
			case "":
				close(stop)
			case "first-then-action":
				// Asked once the action has begun.
				go func() {
					for {
						if _, err := os.Stat(h.p("started")); err == nil {
							close(stop)
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
			}
			d, st := h.open(doc, false)
			defer st.Unlock()
			rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Stop: stop, OnLine: func(l shapes.Line) {
				if tc.at == "first" && l.ID == "first" {
					close(stop)
				}
			}})
			if tc.at == "" {
				// Before the apply began: refused for the moment, and
				// nothing changed, the target not saved.
				if rep.Outcome != shapes.Refused || !rep.Passing || !strings.Contains(rep.Refused, "asked to stop before the apply began; nothing was changed") || len(rep.Lines) != 0 {
					t.Fatalf("%+v", rep)
				}
				if raw, _ := st.Target(store.Local); string(raw) == doc {
					t.Fatal("a declaration refused for a stop was saved as the target")
				}
				h.absent("first")
				st.Unlock()
				h.expect(h.apply(doc), shapes.Applied, "m.first=applied m.a=applied m.second=applied m.dir=applied m.old=removed")
				return
			}
			want := tc.applied + ".=failed"
			if outcomes(rep) != want || rep.Outcome != shapes.Failed {
				t.Fatalf("report %s [%s], want failed [%s]\n%+v", rep.Outcome, outcomes(rep), want, rep)
			}
			last := rep.Lines[len(rep.Lines)-1]
			if last.Type != "executor" || !strings.Contains(last.Detail, "asked to stop: the apply stopped here") || !strings.Contains(last.Detail, tc.rest+" not attempted") {
				t.Fatalf("the last line does not say the stop and what it left: %+v", last)
			}
			h.absent("second")
			h.absent("dir")
			if got := h.read("old"); got != "old\n" {
				t.Fatalf("an apply that stopped removed what is undeclared: old = %q", got)
			}
			if e := st.Get("path:" + h.p("old")); e == nil {
				t.Fatal("an apply that stopped let go of what is undeclared")
			}
			if tc.at == "first-then-action" {
				if got := h.read("marker"); got != "done\n" {
					t.Fatalf("the action in progress was cut short: marker %q", got)
				}
			}
			st.Unlock()

			h.expect(h.apply(doc), shapes.Applied, map[string]string{
				"first":             "m.first=unchanged m.a=applied m.second=applied m.dir=applied",
				"first-then-action": "m.first=unchanged m.a=unchanged m.second=applied m.dir=applied",
			}[tc.at]+" m.old=removed")
			h.absent("old")
		})
	}
}

// A stop asked during the last resource reaches the removals after it:
// what is no longer declared is not removed by that apply (its removals
// are steps like the others: a package's, a unit's), the next does it.
func TestAStopReachesTheRemovals(t *testing.T) {
	h := newHarness(t)
	var olds []string
	for _, n := range []string{"o1", "o2", "o3"} {
		olds = append(olds, `{"module":"m","id":"`+n+`","type":"file","path":"{root}/`+n+`","content":"x\n"}`)
	}
	h.expect(h.apply(h.doc(olds...)), shapes.Applied, "m.o1=applied m.o2=applied m.o3=applied")
	doc := h.doc(`{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo > {root}/started; sleep 0.3; echo done > {root}/marker"],"verify":["/bin/sh","-c","test -f {root}/marker"]}`)
	stop := make(chan struct{})
	go func() {
		for {
			if _, err := os.Stat(h.p("started")); err == nil {
				close(stop)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	d, st := h.open(doc, false)
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Stop: stop})
	st.Unlock()
	if outcomes(rep) != "m.a=applied .=failed" || !strings.Contains(rep.Lines[1].Detail, "asked to stop: the apply stopped here (3 later steps not attempted") {
		t.Fatalf("%s\n%+v", outcomes(rep), rep)
	}
	for _, n := range []string{"o1", "o2", "o3"} {
		if h.read(n) != "x\n" {
			t.Fatalf("%s was removed by the apply that stopped", n)
		}
	}
	h.expect(h.apply(doc), shapes.Removed, "m.a=unchanged m.o3=removed m.o2=removed m.o1=removed")
}
