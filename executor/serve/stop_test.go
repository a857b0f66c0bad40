package serve

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// waitFor polls until ok or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	until := time.Now().Add(d)
	for !ok() {
		if time.Now().After(until) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockedStore opens the state's store and takes its lock, as a rescue
// command holds it: let go when the test ends, if not before.
func (e *env) lockedStore() *store.Store {
	e.t.Helper()
	st, err := store.Open(e.state)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(st.Unlock)
	return st
}

// saveLocal keeps doc as the store's local target (a rescue file's), which
// the next start reconciles; the daemon is stopped.
func (e *env) saveLocal(doc string) *store.Store {
	e.t.Helper()
	st := e.lockedStore()
	defer st.Unlock()
	if err := st.SaveTarget(store.Local, []byte(strings.ReplaceAll(doc, "{root}", e.root))); err != nil {
		e.t.Fatal(err)
	}
	if err := st.Sync(); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// The daemon answers while its start reconcile runs, which may be long:
// an action in progress, or a program a killed executor left running,
// waited for up to its deadline (an action's may be an hour). An agent
// finding no socket meanwhile would say its executor gone. hello and
// status are answered at once; a request that reads an apply's end
// (lastApplied, as a declaration) is answered after the reconcile, which
// took the apply lock before the first connection was accepted.
func TestTheDaemonAnswersWhileItsStartReconcileRuns(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	gate := filepath.Join(e.base, "gate")
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o644) }) // before the daemon's stop, which waits for the action
	e.saveLocal(`{"version":1,"resources":[
		{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo > {root}/started; while [ ! -e ` + gate + ` ]; do sleep 0.05; done"],"verify":["/bin/sh","-c","test -e ` + gate + `"]}]}`)
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
	c := e.dial()
	if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
		t.Fatal(err)
	}
	if k, body, err := c.Read(); err != nil || k != wire.KindStatusReply || body.(*wire.StatusReply).State != "enrolled" {
		t.Fatalf("status while the start reconcile runs: %v %+v %v", k, body, err)
	}
	waitFor(t, 10*time.Second, "the start reconcile's action began", func() bool {
		_, err := os.Stat(filepath.Join(e.root, "started"))
		return err == nil
	})
	if err := c.Write(wire.KindLastApplied, &wire.LastApplied{}); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		_, _, err := c.Read()
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("lastApplied answered while the start reconcile ran (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	os.WriteFile(gate, nil, 0o644)
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("lastApplied not answered after the start reconcile")
	}
}

// A daemon asked to stop in the middle of an apply (SIGTERM: Run's
// context ends) does not return before the apply has ended, and the apply
// ends between two resources: the action in progress runs to its end,
// neither killed nor cut short (the daemon's context does not reach it),
// the later resources are left, the report says so, and the next start
// applies them. A connection open meanwhile is ended, and Run leaves no
// task of its own behind it. A reconcile the stop ended does not take the
// build for healthy (it would become the known-good copy without having
// applied anything to its end); the next start's, run to its end, does.
func TestAStopLetsTheStepInProgressEnd(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	e.stop()
	if _, _, err := c.Read(); err == nil {
		t.Fatal("a connection outlived the daemon's stop")
	}

	doc := strings.ReplaceAll(`{"version":1,"resources":[
		{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","echo > {root}/started; sleep 1; echo done > {root}/marker"],"verify":["/bin/sh","-c","test -f {root}/marker"]},
		{"module":"m","id":"after","type":"file","path":"{root}/after","content":"x\n"}]}`, "{root}", e.root)
	st := e.saveLocal(doc)

	var healthy atomic.Int32
	counted := func() error { healthy.Add(1); return nil }
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, Healthy: counted})
	waitFor(t, 10*time.Second, "the start reconcile's action began", func() bool {
		_, err := os.Stat(filepath.Join(e.root, "started"))
		return err == nil
	})
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not stop")
	}
	e.cancel = nil
	if b, err := os.ReadFile(filepath.Join(e.root, "marker")); err != nil || string(b) != "done\n" {
		t.Fatalf("Run returned before the action in progress ended, or it was cut short: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "after")); !os.IsNotExist(err) {
		t.Fatalf("a resource after the stop was applied: %v", err)
	}
	if n := healthy.Load(); n != 0 {
		t.Fatalf("a reconcile the stop ended took the build for healthy (%d)", n)
	}
	raw, err := st.Report(store.Local)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Outcome shapes.Outcome
		Lines   map[shapes.Outcome]int
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	// The action applied, and the line of the stop (its words: the
	// engine's TestAStopEndsTheApplyBetweenTwoResources).
	if rep.Outcome != shapes.Failed || rep.Lines[shapes.Applied] != 1 || rep.Lines[shapes.Failed] != 1 || len(rep.Lines) != 2 {
		t.Fatalf("the summary does not say the stop: %s", raw)
	}

	// Started again, it applies what the stop left.
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody, Healthy: counted})
	c = e.dial()
	waitFor(t, 10*time.Second, "the next start applied the rest", func() bool {
		_, err := os.Stat(filepath.Join(e.root, "after"))
		return err == nil
	})
	c.Close()
	e.afterStart()
	if n := healthy.Load(); n != 1 {
		t.Fatalf("the start reconcile run to its end was taken for healthy %d times, want once", n)
	}
	e.stop()
	if _, err := wire.DialUnix(e.sock, 0); err == nil {
		t.Fatal("the socket still answers after the stop")
	}
}

// A stop asked while the start's reconcile waits for the store's lock (a
// rescue apply holds it) ends the wait: the daemon does not sit out the
// lock's ten minutes, and no apply is recorded for what never began.
func TestAStopEndsAWaitForTheStoresLock(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	st := e.lockedStore()
	before, _ := st.Report(store.Link)
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
	time.Sleep(300 * time.Millisecond) // waiting for the lock by now
	e.cancel()
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stop waited for the store's lock")
	}
	e.cancel = nil
	if after, _ := st.Report(store.Link); string(after) != string(before) {
		t.Fatalf("a report was kept for an apply that never began: %s", after)
	}
}

// A state directory moved away under the running daemon is not made anew
// and applied to as an empty store (the machine's holdings taken for
// found, its lock gone with the old directory): the declaration is
// refused, saying why, nothing is made at the path, and the daemon stops.
func TestAStateMovedUnderTheDaemonStopsIt(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "x")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	if err := os.Rename(e.state, e.state+".moved"); err != nil {
		t.Fatal(err)
	}
	_, v := e.push(c, e.seal(e.decl("n1", "e-1", 2, file("motd", "y"))))
	if v.Outcome != shapes.Refused || !strings.Contains(v.Reason, "is not the one this daemon started on") {
		t.Fatalf("%+v", v)
	}
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon goes on")
	}
	e.cancel = nil
	if _, err := os.Lstat(e.state); !os.IsNotExist(err) {
		t.Fatalf("the state was made anew: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "motd")); string(b) != "x" {
		t.Fatalf("applied: %q", b)
	}
}

// A hello once the state has moved is not answered "hosted" — a host
// never enrolled, which the agent takes for its node retired — but
// refused, saying why; an identity that does not read, the same.
func TestAHelloIsNotHostedForAStateThatDoesNotRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(e *env)
		says  string
	}{
		{"the state moved", func(e *env) { os.Rename(e.state, e.state+".moved") }, "is not the one this daemon started on"},
		{"the identity damaged", func(e *env) { os.WriteFile(filepath.Join(e.state, "identity.json"), []byte("{"), 0o600) }, "identity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nobody, true)
			e.afterStart()
			tc.spoil(e)
			c, err := wire.DialUnix(e.sock, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"})
			if k, body, err := c.Read(); err != nil || k != wire.KindError || !strings.Contains(body.(*wire.Error).Message, tc.says) {
				t.Fatalf("hello: %v %+v %v", k, body, err)
			}
		})
	}
	// An identity that does not read, and root has begun an enrolment
	// (how such a host gets one again): hosted, the enrolment pending,
	// for the agent to carry out.
	e := newEnv(t, nobody, true)
	e.afterStart()
	os.WriteFile(filepath.Join(e.state, "identity.json"), []byte("{"), 0o600)
	e.beginEnrolment(e.pub)
	c := e.dial()
	if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
		t.Fatal(err)
	}
	if k, body, err := c.Read(); err != nil || k != wire.KindStatusReply || body.(*wire.StatusReply).State != "hosted" || !body.(*wire.StatusReply).Enrolling {
		t.Fatalf("status with an enrolment pending: %v %+v %v", k, body, err)
	}
}
