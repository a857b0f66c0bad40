package serve

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdlayher/vsock"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// vsockConn is one end of a pipe that says it came over vsock from cid:
// what the daemon sees of a guest's connection (this kernel has no vsock
// loopback to make a real one).
type vsockConn struct {
	net.Conn
	cid uint32
}

func (v vsockConn) RemoteAddr() net.Addr { return &vsock.Addr{ContextID: v.cid, Port: 1234} }

// Over vsock the daemon admits only a context id on its allow-list, and
// only with the connection secret in the hello; the rest of the protocol
// is the unix socket's.
func TestVsockPeerAndSecret(t *testing.T) {
	e := newEnv(t, nobody, true)
	secret := []byte("a-secret-of-32-bytes-for-vsock!!")
	e.srv.cfg.VsockCIDs, e.srv.cfg.VsockSecret = []uint32{7}, secret
	try := func(cid uint32, presented []byte) (wire.Kind, any) {
		t.Helper()
		a, x := net.Pipe()
		sc, refused := e.srv.admit(vsockConn{x, cid})
		if sc == nil {
			t.Fatal(refused)
		}
		go e.srv.handle(context.Background(), sc)
		c := wire.NewConn(a, wire.ExecutorToAgent)
		defer c.Close()
		go c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Build: "b", Secret: presented})
		k, body, err := c.Read()
		if err != nil {
			t.Fatalf("cid %d: %v", cid, err)
		}
		if k == wire.KindHelloReply {
			// Admitted: the protocol goes on as over the unix socket.
			if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
				t.Fatal(err)
			}
			if k2, _, err := c.Read(); err != nil || k2 != wire.KindStatusReply {
				t.Fatalf("status over vsock: %v %v", k2, err)
			}
		}
		return k, body
	}
	if k, _ := try(7, secret); k != wire.KindHelloReply {
		t.Fatalf("the allowed cid with the secret: %v", k)
	}
	for _, c := range []struct {
		cid    uint32
		secret []byte
		want   string
	}{
		{7, []byte("wrong-secret-of-32-bytes-vsock!!"), "does not present the connection secret"},
		{7, nil, "does not present the connection secret"},
		{8, secret, "context id 8 is not on the allow-list"},
	} {
		k, body := try(c.cid, c.secret)
		werr, ok := body.(*wire.Error)
		if k != wire.KindError || !ok || werr.Code != wire.CodeProtocol || !strings.Contains(werr.Message, c.want) {
			t.Errorf("cid %d secret %q: %v %+v, want a refusal saying %q", c.cid, c.secret, k, body, c.want)
		}
	}
}

// Every listener Run is given — the vsock one beside the unix socket — is
// served once the daemon is set up (the start reconcile holds the apply
// lock before a first request is answered on any of them), and closed
// when Run ends.
func TestRunServesEveryListenerItIsGiven(t *testing.T) {
	e := newEnv(t, nobody, true)
	e.stop()
	second := filepath.Join(e.base, "run", "second.sock")
	ln2, err := wire.ListenUnix(second, nobody)
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(e.base, "gate")
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o644) })
	e.saveLocal(`{"version":1,"resources":[{"module":"m","id":"a","type":"action","run":["/bin/sh","-c","while [ ! -e ` + gate + ` ]; do sleep 0.05; done"],"verify":["/bin/sh","-c","test -e ` + gate + `"]}]}`)
	ln, err := wire.ListenUnix(e.sock, nobody)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.srv, e.done = New(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody}), make(chan error, 1)
	go func() { e.done <- e.srv.Run(ctx, ln, ln2) }()
	c, err := wire.DialUnix(second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(wire.KindHello, &wire.Hello{Protocol: wire.ProtocolVersion, Version: "agent", Build: "b1"})
	if k, _, err := c.Read(); err != nil || k != wire.KindHelloReply {
		t.Fatalf("hello on the second listener: %v %v", k, err)
	}
	if e.srv.applyMu.TryLock() {
		e.srv.applyMu.Unlock()
		t.Fatal("a request answered on the second listener before the start reconcile held the apply lock")
	}
	os.WriteFile(gate, nil, 0o644)
	cancel()
	if err := <-e.done; err != nil {
		t.Fatal(err)
	}
	if _, err := wire.DialUnix(second, 0); err == nil {
		t.Fatal("the second listener still answers after Run ended")
	}
}
