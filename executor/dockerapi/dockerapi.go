// Package dockerapi is a small, strict HTTP/1.1 client for the
// Docker-compatible Engine API on a container runtime's unix socket
// (Docker's /run/docker.sock, or podman's from `podman system service`).
//
// It is hand-written rather than net/http on purpose. The executor's import
// rules (tests/deps_test.go) keep net/http and crypto/tls out of the root
// process, so that no code able to open a connection off the machine is
// linked into it: an HTTP client whose transport could be pointed at a TCP
// address is exactly that code. This client can only dial a unix socket
// path (Dial refuses anything else), speaks one request per connection
// ("Connection: close"), and parses the answer strictly and within bounds:
// a status line and headers of at most MaxHeader bytes, a body framed by
// Content-Length, chunked transfer coding or the connection's end, and
// never more than the caller's limit. What it does not do, deliberately:
// redirects, proxies, keep-alive, compression, 1xx answers, trailers that
// mean anything, or any header folding. The response parser is fuzzed
// (FuzzReadResponse), whole and split at arbitrary points.
package dockerapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// Sockets are where a runtime's Engine API is looked for, in order.
var Sockets = []string{"/run/docker.sock", "/var/run/docker.sock", "/run/podman/podman.sock"}

// APIVersion prefixes every path but /_ping: 1.41 is served by Docker
// 20.10 and later and by podman 4's compatibility API.
const APIVersion = "v1.41"

const (
	// MaxHeader bounds the status line and headers of one answer.
	MaxHeader = 64 << 10
	// MaxBody bounds an answer's body unless the caller says otherwise.
	MaxBody = 16 << 20
	// maxLine bounds one header line or chunk-size line.
	maxLine = 8 << 10
	// maxChunk bounds one chunk's declared size.
	maxChunk = 1 << 30
)

// Errors of the response parser, so a caller (and the fuzz target) can
// tell a hostile or broken answer from an I/O failure.
var (
	// ErrMalformed is returned for an answer that is not strict HTTP/1.1.
	ErrMalformed = errors.New("dockerapi: malformed HTTP answer")
	// ErrTooLarge is returned when headers or a body exceed their bound.
	ErrTooLarge = errors.New("dockerapi: answer too large")
)

// Client talks to one socket. The zero Timeout means no deadline but the
// context's.
type Client struct {
	Socket  string
	Timeout time.Duration
}

// Error is an answer of the runtime with a status of 300 or more, with the
// message it gave.
type Error struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = statusText(e.Status)
	}
	return fmt.Sprintf("container runtime: %s %s: %d %s", e.Method, e.Path, e.Status, msg)
}

func statusText(status int) string {
	switch status {
	case 304:
		return "not modified"
	case 404:
		return "not found"
	case 409:
		return "conflict"
	case 500:
		return "server error"
	}
	return "error"
}

// IsNotFound reports whether err is the runtime answering 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == 404
}

// Response is one parsed answer. Body is framed and bounded; reading past
// its limit fails with ErrTooLarge rather than truncating.
type Response struct {
	Status int
	Header map[string]string // lower-case names
	Body   io.Reader
}

// Dial connects to the socket; it dials nothing but a unix socket path.
func Dial(ctx context.Context, socket string) (net.Conn, error) {
	if !filepath.IsAbs(socket) {
		return nil, fmt.Errorf("dockerapi: %q is not an absolute unix socket path", socket)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", socket)
}

// Do sends a request with in (when not nil) as its JSON body and decodes a
// 2xx answer's JSON body into out (when not nil). A 304 is success with no
// body. Any other status is an *Error carrying the runtime's message.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	return c.do(ctx, method, path, in, func(r *Response) error {
		if out == nil || r.Status == 204 || r.Status == 304 {
			_, err := io.Copy(io.Discard, r.Body)
			return err
		}
		if err := json.NewDecoder(r.Body).Decode(out); err != nil {
			return fmt.Errorf("decode the answer: %w", err)
		}
		return nil
	})
}

// Stream sends a request and hands each JSON value of a 2xx answer's body
// to each, in order: what the runtime streams while it pulls an image.
// limit bounds the whole body.
func (c *Client) Stream(ctx context.Context, method, path string, in any, limit int64, each func(json.RawMessage) error) error {
	return c.doLimit(ctx, method, path, in, limit, func(r *Response) error {
		dec := json.NewDecoder(r.Body)
		for {
			var m json.RawMessage
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("decode the stream: %w", err)
			}
			if err := each(m); err != nil {
				return err
			}
		}
	})
}

// Ping asks /_ping and returns what the engine calls itself (its Server
// header, or its API version).
func (c *Client) Ping(ctx context.Context) (string, error) {
	var server string
	err := c.doLimit(ctx, "GET", "/_ping", nil, 1<<10, func(r *Response) error {
		var err error
		server, err = PingAnswer(r)
		return err
	})
	return server, err
}

// PingAnswer reads a 200 answer to /_ping: its body must be "OK". It
// returns what the engine calls itself (its Server header, or its API
// version).
func PingAnswer(r *Response) (string, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return "", err
	}
	if s := strings.TrimSpace(string(b)); s != "OK" {
		return "", fmt.Errorf("answered 200 with body %q, not OK", s)
	}
	switch h := r.Header; {
	case h["server"] != "":
		return h["server"], nil
	case h["libpod-api-version"] != "":
		return "libpod API " + h["libpod-api-version"], nil
	case h["api-version"] != "":
		return "API " + h["api-version"], nil
	}
	return "", nil
}

// Path builds a versioned API path with escaped segments and a query:
// Path("containers", name, "json") is /v1.41/containers/<name>/json.
func Path(q url.Values, segments ...string) string {
	var b strings.Builder
	b.WriteString("/" + APIVersion)
	for _, s := range segments {
		b.WriteString("/" + url.PathEscape(s))
	}
	if len(q) > 0 {
		b.WriteString("?" + q.Encode())
	}
	return b.String()
}

func (c *Client) do(ctx context.Context, method, path string, in any, handle func(*Response) error) error {
	return c.doLimit(ctx, method, path, in, MaxBody, handle)
}

func (c *Client) doLimit(ctx context.Context, method, path string, in any, limit int64, handle func(*Response) error) error {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	req, err := buildRequest(method, path, in)
	if err != nil {
		return err
	}
	conn, err := Dial(ctx, c.Socket)
	if err != nil {
		return fmt.Errorf("container runtime at %s: %w", c.Socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(clock.Deadline(0)) })
	defer stop()
	wrap := func(err error) error {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return fmt.Errorf("container runtime at %s: %s %s: %w", c.Socket, method, path, err)
	}
	if _, err := conn.Write(req); err != nil {
		return wrap(err)
	}
	resp, err := ReadResponse(bufio.NewReaderSize(conn, 4096), method, limit)
	if err != nil {
		return wrap(err)
	}
	if resp.Status >= 300 && resp.Status != 304 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return wrap(err)
		}
		var m struct {
			Message string `json:"message"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &m) == nil && m.Message != "" {
			msg = m.Message
		}
		return &Error{Method: method, Path: path, Status: resp.Status, Message: msg}
	}
	if err := handle(resp); err != nil {
		return wrap(err)
	}
	return nil
}

// buildRequest writes one request; method and path are checked so no
// caller can smuggle a header or a second request into the line.
func buildRequest(method, path string, in any) ([]byte, error) {
	if method == "" || strings.Trim(method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		return nil, fmt.Errorf("dockerapi: %q is not a method", method)
	}
	if !strings.HasPrefix(path, "/") || strings.ContainsFunc(path, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return nil, fmt.Errorf("dockerapi: %q is not a request path", path)
	}
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, fmt.Errorf("dockerapi: encode the request: %w", err)
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: docker\r\nUser-Agent: mesh-executor\r\nConnection: close\r\n", method, path)
	if in != nil || method == "POST" || method == "PUT" {
		if in != nil {
			b.WriteString("Content-Type: application/json\r\n")
		}
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes(), nil
}

// ReadResponse parses one answer to a request of method from r. The body
// it returns is framed (Content-Length, chunked, or to the end of the
// connection) and fails with ErrTooLarge past limit bytes.
func ReadResponse(r *bufio.Reader, method string, limit int64) (*Response, error) {
	budget := MaxHeader
	line, err := readLine(r, &budget)
	if err != nil {
		return nil, fmt.Errorf("status line: %w", err)
	}
	proto, rest, ok := strings.Cut(line, " ")
	if !ok || (proto != "HTTP/1.1" && proto != "HTTP/1.0") {
		return nil, fmt.Errorf("%w: status line %q", ErrMalformed, trim(line))
	}
	code, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if err != nil || len(code) != 3 || status < 200 || status > 599 {
		// 1xx is refused too: this client never asks for one.
		return nil, fmt.Errorf("%w: status line %q", ErrMalformed, trim(line))
	}
	h := map[string]string{}
	for {
		line, err := readLine(r, &budget)
		if err != nil {
			return nil, fmt.Errorf("headers: %w", err)
		}
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || !isToken(name) {
			return nil, fmt.Errorf("%w: header line %q", ErrMalformed, trim(line))
		}
		name = strings.ToLower(name)
		value = strings.Trim(value, " \t")
		if old, dup := h[name]; dup {
			if name == "content-length" || name == "transfer-encoding" {
				if old != value {
					return nil, fmt.Errorf("%w: %s given twice, differently", ErrMalformed, name)
				}
				continue
			}
			value = old + ", " + value
		}
		h[name] = value
	}
	resp := &Response{Status: status, Header: h}
	te, hasTE := h["transfer-encoding"]
	cl, hasCL := h["content-length"]
	switch {
	case method == "HEAD" || status == 204 || status == 304:
		resp.Body = bytes.NewReader(nil)
	case hasTE && hasCL:
		return nil, fmt.Errorf("%w: both Transfer-Encoding and Content-Length", ErrMalformed)
	case hasTE:
		if !strings.EqualFold(te, "chunked") {
			return nil, fmt.Errorf("%w: transfer coding %q", ErrMalformed, trim(te))
		}
		resp.Body = &limited{r: &chunked{r: r}, left: limit}
	case hasCL:
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 || strings.TrimLeft(cl, "0123456789") != "" {
			return nil, fmt.Errorf("%w: Content-Length %q", ErrMalformed, trim(cl))
		}
		if n > limit {
			return nil, fmt.Errorf("%w: a body of %d bytes, more than %d", ErrTooLarge, n, limit)
		}
		resp.Body = &exact{r: r, left: n}
	default:
		resp.Body = &limited{r: r, left: limit}
	}
	return resp, nil
}

// readLine reads one CRLF-terminated line, charging it to budget.
func readLine(r *bufio.Reader, budget *int) (string, error) {
	var b []byte
	for {
		frag, err := r.ReadSlice('\n')
		b = append(b, frag...)
		*budget -= len(frag)
		if *budget < 0 || len(b) > maxLine {
			return "", ErrTooLarge
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", err
		}
		break
	}
	if len(b) < 2 || b[len(b)-2] != '\r' {
		return "", fmt.Errorf("%w: a line not ended by CRLF", ErrMalformed)
	}
	line := b[:len(b)-2]
	if bytes.ContainsAny(line, "\r\n\x00") {
		return "", fmt.Errorf("%w: a control character in a line", ErrMalformed)
	}
	return string(line), nil
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// exact reads a Content-Length body: exactly left bytes, or an error.
type exact struct {
	r    io.Reader
	left int64
}

func (e *exact) Read(p []byte) (int, error) {
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if e.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// limited fails with ErrTooLarge, rather than truncating, past left bytes.
type limited struct {
	r    io.Reader
	left int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more is an answer too large; none is the end.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, ErrTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// chunked undoes the chunked transfer coding strictly: hex sizes, CRLF
// after every chunk, trailers read and ignored within a bound.
type chunked struct {
	r    *bufio.Reader
	left int64 // bytes left in the current chunk
	done bool
	err  error
}

// NewChunked returns a reader that undoes chunked coding read from r.
func NewChunked(r io.Reader) io.Reader { return &chunked{r: bufio.NewReader(r)} }

func (c *chunked) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		budget := MaxHeader
		line, err := readLine(c.r, &budget)
		if err != nil {
			c.err = fmt.Errorf("chunk size: %w", err)
			return 0, c.err
		}
		size, _, _ := strings.Cut(line, ";")
		size = strings.TrimRight(size, " \t")
		n, err := strconv.ParseInt(size, 16, 64)
		if err != nil || n < 0 || n > maxChunk || size == "" || strings.ContainsAny(size, "+-xX") {
			c.err = fmt.Errorf("%w: chunk size %q", ErrMalformed, trim(line))
			return 0, c.err
		}
		if n == 0 {
			for { // trailers, read and ignored
				l, err := readLine(c.r, &budget)
				if err != nil {
					c.err = fmt.Errorf("trailer: %w", err)
					return 0, c.err
				}
				if l == "" {
					break
				}
			}
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err == nil && c.left == 0 {
		var crlf [2]byte
		if _, err = io.ReadFull(c.r, crlf[:]); err != nil || crlf != [2]byte{'\r', '\n'} {
			err = fmt.Errorf("%w: a chunk not followed by CRLF", ErrMalformed)
		}
	}
	if err != nil {
		c.err = err
		if n > 0 {
			return n, nil
		}
	}
	return n, err
}
