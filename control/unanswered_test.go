package control_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// gate is a TCP relay between a client and the broker whose answers can
// be held: while shut, what the broker sends is not passed on, as a
// broker that stalls or a server that died mid-request answers nothing.
type gate struct {
	addr string
	mu   sync.Mutex
	cond *sync.Cond
	shut bool
}

func newGate(t *testing.T, to string) *gate {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := &gate{addr: l.Addr().String()}
	g.cond = sync.NewCond(&g.mu)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); b.Close() })
			go io.Copy(b, c)
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := b.Read(buf)
					g.mu.Lock()
					for g.shut {
						g.cond.Wait()
					}
					g.mu.Unlock()
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return g
}

func (g *gate) set(shut bool) {
	g.mu.Lock()
	g.shut = shut
	g.cond.Broadcast()
	g.mu.Unlock()
}

// A declare outlasts a broker that answers nothing for longer than one
// request waits (a stall, a cluster's stream electing a leader after its
// server died): its requests are made again, and the node's declaration
// is published once.
func TestADeclareOutlastsAnUnansweredBroker(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, _, err := s.client.AddNode(ctx, "n1", s.url); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(s.url, "tls://")
	g := newGate(t, host)
	cl, err := control.Connect(ctx, s.keys, "tls://"+g.addr, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	decl := []byte(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"/etc/motd","content":"after a silence\n"}]}`)

	g.set(true)
	type result struct {
		seq uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		seq, err := cl.Declare(ctx, "n1", decl)
		done <- result{seq, err}
	}()
	// Longer than one request waits (10 s), and than nats.go's 5 s.
	time.Sleep(13 * time.Second)
	g.set(false)
	r := <-done
	if r.err != nil {
		t.Fatalf("declare across 13 s without an answer: %v", r.err)
	}
	m, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := m.GetLastMsgForSubject(ctx, link.SubjectsOf("n1").Decl)
	if err != nil {
		t.Fatal(err)
	}
	if got := last.Header.Get(link.SeqHeader); got != strconv.FormatUint(r.seq, 10) {
		t.Fatalf("the node's subject holds sequence %s, the declare said %d", got, r.seq)
	}
}

// A publish made again after its answer was lost finds its own
// declaration on the node's subject (the broker refuses it as not on top
// of the last): the declaration is published, the node told, nothing
// stored twice — not taken for a newer declare's.
func TestAPublishWhoseAnswerWasLostIsTheDeclaration(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := s.client.AddNode(ctx, "n1", s.url); err != nil {
		t.Fatal(err)
	}
	subj := link.SubjectsOf("n1")
	notices := make(chan *nats.Msg, 4)
	sub, err := s.client.NC.ChanSubscribe(subj.Notice, notices)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	s.client.NC.Flush()
	seq, err := s.client.Declare(ctx, "n1", []byte(`{"version":1,"resources":[{"module":"m","id":"motd","type":"file","path":"/etc/motd","content":"once\n"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	<-notices // the first attempt's
	st, err := s.client.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.GetLastMsgForSubject(ctx, subj.Decl)
	if err != nil {
		t.Fatal(err)
	}
	// Made again as the first attempt was: on top of an empty subject.
	if err := s.client.PublishDeclAgain(ctx, "n1", seq, first.Data, 0); err != nil {
		t.Fatalf("the publish made again: %v", err)
	}
	select {
	case n := <-notices:
		if got := n.Header.Get(link.HeaderSequence); got != strconv.FormatUint(first.Sequence, 10) {
			t.Errorf("the notice names stream sequence %s, the declaration is at %d", got, first.Sequence)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the node was not told of its declaration: the publish made again took it for a newer declare's")
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj.Decl))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subj.Decl]; n != 1 {
		t.Fatalf("%d messages on the node's subject, want 1", n)
	}
}
