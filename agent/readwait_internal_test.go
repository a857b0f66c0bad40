package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// A read the broker answers late makes the next one wait longer, until
// one is answered in time: a slow broker is waited for, not asked again
// at every timeout (each ask more for it to do, its late answer to the
// one before thrown away).
func TestAReadTheBrokerWasLateWithWaitsLongerNext(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the broker did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var asked atomic.Int32
	var silent atomic.Bool // the broker answers nothing (a read that must end late, whatever the load)
	if _, err := nc.Subscribe("get", func(m *nats.Msg) {
		n := asked.Add(1)
		if silent.Load() || n == 1 {
			return // the first read: never answered, so late however loaded the machine
		}
		go func() {
			if n <= 2 {
				time.Sleep(readWithin + 2*time.Second) // late for readWithin, in time for twice it
			}
			r := nats.NewMsg(m.Reply)
			r.Header.Set(link.HeaderSequence, "7")
			r.Header.Set(link.HeaderSubject, "subj")
			m.RespondMsg(r)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	st, err := openState(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{nc: nc, state: st, log: slog.New(slog.DiscardHandler)}
	a.link.up = true
	ctx := context.Background()
	if _, err := a.getLast(ctx, "get", "subj", "declaration"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read the broker answers late: %v", err)
	}
	m, err := a.getLast(ctx, "get", "subj", "declaration")
	if err != nil || m == nil || m.sseq != 7 {
		t.Fatalf("the read after a late one does not wait for the broker's answer: %+v %v", m, err)
	}
	if w := a.readWait.Load(); w != 0 {
		t.Fatalf("answered in time, the next read waits %s, not readWithin", time.Duration(w))
	}
	if _, err := a.getLast(ctx, "get", "subj", "declaration"); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 3 {
		t.Fatalf("the broker was asked %d times for three reads", n)
	}
	// A read in flight when the link drops ends then, not at its wait's
	// end, and says no lateness of the broker's: the wait stays.
	// Unanswered now: a late answer by a margin would be a race on a
	// loaded machine (the deadline's timer against the answer).
	silent.Store(true)
	a.readWait.Store(int64(readWithinMost))
	go func() { time.Sleep(500 * time.Millisecond); a.linkDown(errors.New("cut"), false) }()
	began := time.Now()
	if _, err := a.getLast(ctx, "get", "subj", "declaration"); !errors.Is(err, errReadLinkLost) {
		t.Fatalf("a read in flight when the link dropped: %v", err)
	}
	if took := time.Since(began); took > readWithin {
		t.Fatalf("a read in flight when the link dropped ended %s later", took)
	}
	if w := time.Duration(a.readWait.Load()); w != readWithinMost {
		t.Fatalf("a read the link's loss ended changed the wait to %s", w)
	}
	// With the link down, a read waits readWithin, not the wait grown.
	a.readWait.Store(int64(readWithinMost))
	began = time.Now()
	if _, err := a.getLast(ctx, "get", "subj", "declaration"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read with the link down, answered late: %v", err)
	}
	if took := time.Since(began); took > readWithin+time.Second {
		t.Fatalf("a read with the link down waited %s", took)
	}
	if w := time.Duration(a.readWait.Load()); w != readWithinMost {
		t.Fatalf("a read with the link down changed the wait to %s", w)
	}
	a.link.up = true

	// A wait that grows stops at readWithinMost.
	a.readWait.Store(int64(readWithinMost))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	a.getLast(cctx, "get", "subj", "declaration") // ended by its caller: no lateness of the broker's
	if w := time.Duration(a.readWait.Load()); w != readWithinMost {
		t.Fatalf("a read its caller ended changed the wait to %s", w)
	}
}
