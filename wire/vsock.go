package wire

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/mdlayher/vsock"
)

// The agent↔executor protocol over vsock: the agent in a guest and the
// executor in the host, or the reverse. vsock carries no peer credentials,
// so the executor admits a connection only from a context id on its
// allow-list and only if its hello presents the connection secret (a
// random value root provisions on both sides). Everything after the hello
// is the same protocol as over the unix socket.

// DefaultVsockPort is the executor's vsock port unless told.
const DefaultVsockPort = 5732

// ListenVsock listens for the agent on vsock port.
func ListenVsock(port uint32) (net.Listener, error) {
	ln, err := vsock.Listen(port, nil)
	if err != nil {
		return nil, fmt.Errorf("wire: vsock port %d: %w", port, err)
	}
	return ln, nil
}

// DialVsock connects to the executor at context id cid, port.
func DialVsock(cid, port uint32) (*Conn, error) {
	c, err := vsock.Dial(cid, port, nil)
	if err != nil {
		return nil, fmt.Errorf("wire: executor at vsock %d:%d: %w", cid, port, err)
	}
	return NewConn(c, ExecutorToAgent), nil
}

// VsockCID returns the peer's context id when c is a vsock connection.
func VsockCID(c net.Conn) (uint32, bool) {
	a, ok := c.RemoteAddr().(*vsock.Addr)
	if !ok {
		return 0, false
	}
	return a.ContextID, true
}

// ErrVsockPeer is a vsock peer the executor does not admit.
var ErrVsockPeer = errors.New("wire: vsock peer refused")

// CheckVsockPeer admits context id cid only if it is on the allow-list.
// An empty allow-list admits nobody: vsock is opened to named peers only.
func CheckVsockPeer(cid uint32, allow []uint32) error {
	if !slices.Contains(allow, cid) {
		return fmt.Errorf("%w: context id %d is not on the allow-list %v", ErrVsockPeer, cid, allow)
	}
	return nil
}

// CheckSecret compares the secret a hello presents with the connection
// secret, in constant time. An empty connection secret admits nothing.
func CheckSecret(presented, want []byte) error {
	if len(want) == 0 || subtle.ConstantTimeCompare(presented, want) != 1 {
		return fmt.Errorf("%w: the hello does not present the connection secret", ErrVsockPeer)
	}
	return nil
}
