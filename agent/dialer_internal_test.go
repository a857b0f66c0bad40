package agent

import (
	"io"
	"net"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A handshake that fails after the dial (here a broker that says its INFO
// and never answers CONNECT: the client's timeout) leaves the client
// library's connection open; the link's dialer closes it at the next
// dial. The broker counts the connections still open from the client's
// side, with the collector off (it would close them at its own pace).
func TestAFailedHandshakeLeavesNoConnectionOpen(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, c := range []struct {
		name   string
		dialer nats.CustomDialer
		most   int
	}{
		{"the client library's dialer (leaves them open)", &net.Dialer{}, 1 << 30},
		{"the link's", newLastConnDialer(nil), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var mu sync.Mutex
			open, accepted := 0, 0
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					open++
					accepted++
					mu.Unlock()
					go func() {
						defer conn.Close()
						io.WriteString(conn, `INFO {"server_id":"silent","version":"2.15.2","max_payload":1048576}`+"\r\n")
						io.Copy(io.Discard, conn) // until the client closes it
						mu.Lock()
						open--
						mu.Unlock()
					}()
				}
			}()
			nc, err := nats.Connect("nats://"+ln.Addr().String(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
				nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0), nats.Timeout(100*time.Millisecond), nats.SetCustomDialer(c.dialer))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			time.Sleep(1500 * time.Millisecond)
			mu.Lock()
			o, a := open, accepted
			mu.Unlock()
			if a < 4 {
				t.Fatalf("the client tried %d times in 1.5 s", a)
			}
			if c.most == 1 && o > 1 {
				t.Fatalf("%d of %d connections still open from the client's side", o, a)
			}
			if c.most > 1 && o < a/2 {
				// The library's own: the leak this dialer exists for.
				// If it closes them now, the dialer is no longer needed.
				t.Logf("the client library closed its failed connections itself (%d of %d open): lastConnDialer may go", o, a)
			}
			t.Logf("%d of %d connections open", o, a)
		})
	}
}
