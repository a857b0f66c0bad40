package control

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The status page's and metrics' listeners hold nothing for a client that
// stops: an idle keep-alive connection is closed by the server, and no
// more than httpMaxConns are served at once — one more waits until one of
// them goes.
func TestHTTPListenersCloseIdleAndBoundConnections(t *testing.T) {
	idle, max := httpIdle, httpMaxConns
	t.Cleanup(func() { httpIdle, httpMaxConns = idle, max })
	start := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- serveHTTP(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), slog.New(slog.DiscardHandler))
		}()
		t.Cleanup(func() { cancel(); <-done })
		return ln.Addr().String()
	}
	// ask sends one keep-alive request on a new connection and reads the
	// answer's status line, within wait.
	ask := func(t *testing.T, addr string, wait time.Duration) (net.Conn, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		c.SetReadDeadline(time.Time{})
		return c, err
	}

	t.Run("idle closed", func(t *testing.T) {
		httpIdle, httpMaxConns = 300*time.Millisecond, 64
		addr := start(t)
		var held []net.Conn
		for range 20 {
			c, err := ask(t, addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		for i, c := range held {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("idle connection %d not closed by the server: %v", i, err)
			}
		}
	})
	t.Run("bounded", func(t *testing.T) {
		httpIdle, httpMaxConns = time.Minute, 3
		addr := start(t)
		var held []net.Conn
		for range 3 {
			c, err := ask(t, addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		extra, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		io.WriteString(extra, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		r := bufio.NewReader(extra)
		extra.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := r.ReadString('\n'); err == nil {
			t.Fatal("a fourth connection was served while three were held")
		}
		held[0].Close()
		extra.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("the waiting connection, once one went: %q %v", line, err)
		}
	})
}
