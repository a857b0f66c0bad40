// Package ports hands out loopback ports for the servers tests start.
//
// A port found free by binding port 0 and closing is free only until a
// server binds it, and the kernel may give a port just closed to the next
// bind to port 0: two servers started one after the other could be told the
// same port, and the first to bind it wins (a cluster whose first server
// found its monitoring port taken by the second's). Free never gives a port
// twice in one process.
package ports

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

var (
	mu        sync.Mutex
	handedOut = map[int]bool{}
)

// Free is a loopback TCP port no socket holds now and no earlier call of
// this process gave.
func Free() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut[port] {
			handedOut[port] = true
			return port, nil
		}
	}
	return 0, errors.New("a free port: every port the kernel offered was handed out already")
}
