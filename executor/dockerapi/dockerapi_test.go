package dockerapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// parse reads a whole answer from raw through r and returns its status and
// body, or the first error.
func parse(r io.Reader, limit int64) (int, []byte, error) {
	resp, err := ReadResponse(bufio.NewReaderSize(r, 16), "GET", limit)
	if err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	return resp.Status, b, err
}

var answers = []struct {
	name, raw string
	status    int
	body      string
	err       error // nil: must parse; otherwise errors.Is target (or any error when io.EOF)
}{
	{"length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", 200, "OK", nil},
	{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n3;x=y\r\n!!!\r\n0\r\nT: v\r\n\r\n", 200, "OK!!!", nil},
	{"to close", "HTTP/1.0 200 OK\r\n\r\nbody", 200, "body", nil},
	{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 204, "", nil},
	{"error status", "HTTP/1.1 404 Not Found\r\nContent-Length: 20\r\n\r\n{\"message\":\"nope\"}\r\n", 404, "{\"message\":\"nope\"}\r\n", nil},
	{"short length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nOK", 0, "", io.ErrUnexpectedEOF},
	{"both framings", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nOK", 0, "", ErrMalformed},
	{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nOK", 0, "", ErrMalformed},
	{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nOK", 0, "", ErrMalformed},
	{"gzip coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nOK", 0, "", ErrMalformed},
	{"bare LF", "HTTP/1.1 200 OK\nContent-Length: 2\n\nOK", 0, "", ErrMalformed},
	{"folded header", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", 0, "", ErrMalformed},
	{"1xx", "HTTP/1.1 100 Continue\r\n\r\n", 0, "", ErrMalformed},
	{"not http", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", ErrMalformed},
	{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "", ErrMalformed},
	{"chunk without CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOKxx0\r\n\r\n", 0, "", ErrMalformed},
	{"chunked cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nOK", 0, "", io.ErrUnexpectedEOF},
	{"too long declared", "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", 0, "", ErrTooLarge},
	{"too long streamed", "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", 65), 0, "", ErrTooLarge},
	{"too long chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n" + strings.Repeat("x", 65) + "\r\n0\r\n\r\n", 0, "", ErrTooLarge},
	{"huge header", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: "+strings.Repeat("a", 4000)+"\r\n", 20) + "\r\n", 0, "", ErrTooLarge},
}

// The parser takes exactly what strict HTTP/1.1 framing allows, and says
// why it refuses the rest; delivered a byte at a time it answers the same.
func TestReadResponse(t *testing.T) {
	for _, a := range answers {
		for _, split := range []bool{false, true} {
			var r io.Reader = strings.NewReader(a.raw)
			if split {
				r = iotest.OneByteReader(r)
			}
			status, body, err := parse(r, 64)
			if a.err == nil {
				if err != nil || status != a.status || string(body) != a.body {
					t.Errorf("%s (split %v): %d %q %v, want %d %q", a.name, split, status, body, err, a.status, a.body)
				}
				continue
			}
			if !errors.Is(err, a.err) {
				t.Errorf("%s (split %v): %d %q %v, want %v", a.name, split, status, body, err, a.err)
			}
		}
	}
}

func TestBuildRequestRefusesSmuggling(t *testing.T) {
	for _, p := range []string{"/x HTTP/1.1\r\nHost: y", "/a\nb", "x", "/a b"} {
		if _, err := buildRequest("GET", p, nil); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
	if _, err := buildRequest("G T", "/x", nil); err == nil {
		t.Error("method with a space accepted")
	}
	req, err := buildRequest("POST", "/v1.41/networks/create", map[string]string{"Name": "n"})
	if err != nil || !bytes.HasSuffix(req, []byte("Content-Length: 12\r\n\r\n{\"Name\":\"n\"}")) {
		t.Fatalf("%q %v", req, err)
	}
}

func TestDialOnlyUnixPaths(t *testing.T) {
	for _, s := range []string{"127.0.0.1:2375", "tcp://127.0.0.1:2375", "relative.sock"} {
		if _, err := Dial(context.Background(), s); err == nil || !strings.Contains(err.Error(), "not an absolute unix socket path") {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// serve answers each connection on a unix socket with answer once it has
// read a request's headers.
func serve(t *testing.T, answer func(req string) string) string {
	path := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var req strings.Builder
				for {
					line, err := br.ReadString('\n')
					req.WriteString(line)
					if err != nil || line == "\r\n" {
						break
					}
				}
				if a := answer(req.String()); a != "" {
					io.WriteString(c, a)
				} else {
					time.Sleep(time.Hour)
				}
			}()
		}
	}()
	return path
}

func TestClientOverASocket(t *testing.T) {
	sock := serve(t, func(req string) string {
		switch {
		case strings.HasPrefix(req, "GET /_ping HTTP/1.1\r\n"):
			return "HTTP/1.1 200 OK\r\nServer: Libpod/4.3.1\r\nContent-Length: 2\r\n\r\nOK"
		case strings.HasPrefix(req, "GET /v1.41/containers/a%2Fb/json "):
			return "HTTP/1.1 404 Not Found\r\nContent-Length: 26\r\n\r\n{\"message\":\"no such one\"}\n"
		case strings.HasPrefix(req, "POST /v1.41/images/create?fromImage=x "):
			return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n{\"status\":\"a\"}\n\r\n" +
				"d\r\n{\"error\":\"b\"}\r\n0\r\n\r\n"
		}
		return ""
	})
	c := &Client{Socket: sock, Timeout: 2 * time.Second}
	if s, err := c.Ping(t.Context()); err != nil || s != "Libpod/4.3.1" {
		t.Fatalf("ping: %q %v", s, err)
	}
	err := c.Do(t.Context(), "GET", Path(nil, "containers", "a/b", "json"), nil, &struct{}{})
	if !IsNotFound(err) || !strings.Contains(err.Error(), "no such one") {
		t.Fatalf("inspect: %v", err)
	}
	var got []string
	err = c.Stream(t.Context(), "POST", Path(map[string][]string{"fromImage": {"x"}}, "images", "create"), nil, 1<<10, func(m json.RawMessage) error {
		got = append(got, string(m))
		return nil
	})
	if err != nil || strings.Join(got, " ") != `{"status":"a"} {"error":"b"}` {
		t.Fatalf("stream: %q %v", got, err)
	}
	// A runtime that never answers is bounded by the timeout.
	start := time.Now()
	c.Timeout = 200 * time.Millisecond
	if err := c.Do(t.Context(), "GET", "/v1.41/silent", nil, nil); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("silent: %v after %v", err, time.Since(start))
	}
}
