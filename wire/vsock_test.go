package wire

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/mdlayher/vsock"
)

// connPair makes an agent/executor pair of Conns from a listener and a
// dialler of one transport.
func connPair(t *testing.T, ln net.Listener, dial func() (net.Conn, error)) func() (*Conn, *Conn) {
	return func() (*Conn, *Conn) {
		t.Helper()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				accepted <- nil
				return
			}
			accepted <- c
		}()
		a, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		e := <-accepted
		if e == nil {
			t.Fatal("accept failed")
		}
		return NewConn(a, ExecutorToAgent), NewConn(e, AgentToExecutor)
	}
}

// The protocol's conformance over each stream transport this machine has:
// every message of the table, each way, its largest frames included, over
// a unix socket, TCP on loopback (a stream socket as vsock is), and vsock
// where the kernel offers a loopback (this machine's does not: that is
// checked to be the kernel's answer, not a failure of ours, and said).
func TestTransportConformance(t *testing.T) {
	t.Run("unix", func(t *testing.T) {
		p := t.TempDir() + "/s"
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		everyKindRoundTrips(t, connPair(t, ln, func() (net.Conn, error) { return net.Dial("unix", p) }))
	})
	t.Run("tcp", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		everyKindRoundTrips(t, connPair(t, ln, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }))
	})
	t.Run("vsock", func(t *testing.T) {
		ln, err := vsock.ListenContextID(vsock.Local, 0, nil)
		if err != nil {
			// No vsock here: the kernel's own refusal, and nothing else.
			if !errors.Is(err, syscall.EAFNOSUPPORT) && !errors.Is(err, syscall.ENODEV) && !errors.Is(err, os.ErrNotExist) &&
				!errors.Is(err, syscall.EADDRNOTAVAIL) && !strings.Contains(err.Error(), "not supported") {
				t.Fatalf("vsock listen failed for another reason than a kernel without vsock: %v", err)
			}
			t.Logf("this kernel offers no vsock loopback (%v): the transport is exercised over unix and TCP only", err)
			return
		}
		defer ln.Close()
		port := ln.Addr().(*vsock.Addr).Port
		everyKindRoundTrips(t, connPair(t, ln, func() (net.Conn, error) { return vsock.Dial(vsock.Local, port, nil) }))
	})
}

func TestVsockChecks(t *testing.T) {
	if err := CheckVsockPeer(3, []uint32{3, 7}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cid   uint32
		allow []uint32
	}{{4, []uint32{3, 7}}, {3, nil}, {2, []uint32{}}} {
		if err := CheckVsockPeer(c.cid, c.allow); !errors.Is(err, ErrVsockPeer) {
			t.Errorf("cid %d allow %v: %v", c.cid, c.allow, err)
		}
	}
	secret := []byte("0123456789abcdef0123")
	if err := CheckSecret(secret, secret); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{nil, []byte("0123456789abcdef012"), []byte("0123456789abcdef0124"), append(secret, 'x')} {
		if err := CheckSecret(bad, secret); !errors.Is(err, ErrVsockPeer) {
			t.Errorf("secret %q admitted", bad)
		}
	}
	if err := CheckSecret(nil, nil); err == nil {
		t.Error("an empty connection secret admitted an empty hello")
	}
	// A vsock connection is known by its address.
	if cid, ok := VsockCID(fakeVsock{cid: 9}); !ok || cid != 9 {
		t.Errorf("VsockCID = %d %v", cid, ok)
	}
	a, _ := net.Pipe()
	if _, ok := VsockCID(a); ok {
		t.Error("a pipe taken for vsock")
	}
}

type fakeVsock struct {
	net.Conn
	cid uint32
}

func (f fakeVsock) RemoteAddr() net.Addr { return &vsock.Addr{ContextID: f.cid, Port: 1} }
