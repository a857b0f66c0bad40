package agent

import (
	"net"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// lastConnDialer dials the link's connections and closes the one it
// dialed before as it dials the next. The NATS client (nats.go v1.55.0,
// and v1.56.0 alike) leaves a connection open when its reconnection's
// handshake fails after the dial — a broker that refuses the credential,
// an answer later than the timeout — and dials the next without closing
// it: the socket stays open until the collector finalizes it. An agent
// trying again for hours, its heap too small to be collected often, held
// one socket more for each try; ten thousand agents of the fleet's bench
// in one heap ran out of files while they linked again. The client dials
// again only once the last connection is lost or failed, so the last one
// is never in use when the next is dialed.
type lastConnDialer struct {
	dial nats.CustomDialer
	mu   sync.Mutex
	last net.Conn
}

// newLastConnDialer dials with d, or a net.Dialer with the link's timeout
// when d is nil.
func newLastConnDialer(d nats.CustomDialer) *lastConnDialer {
	if d == nil {
		d = &net.Dialer{Timeout: link.ConnectTimeout}
	}
	return &lastConnDialer{dial: d}
}

func (d *lastConnDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	if d.last != nil {
		d.last.Close() // closed already, or left open by a failed handshake
		d.last = nil
	}
	d.mu.Unlock()
	c, err := d.dial.Dial(network, address)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.last = c
	d.mu.Unlock()
	return c, nil
}
