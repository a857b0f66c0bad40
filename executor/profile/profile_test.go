package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// detectWithin runs Detect and fails if it does not return before a
// deadline of the per-probe timeout plus slack.
func detectWithin(t *testing.T, opt Options) Profile {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opt.Timeout+grace+2*time.Second)
	defer cancel()
	done := make(chan Profile, 1)
	go func() { done <- Detect(ctx, opt) }()
	select {
	case p := <-done:
		return p
	case <-ctx.Done():
		t.Fatalf("Detect did not return within its timeout %s plus slack", opt.Timeout)
		return Profile{}
	}
}

func TestDetectThisMachine(t *testing.T) {
	p := detectWithin(t, Options{Timeout: 3 * time.Second})
	if p.DetectedAt.IsZero() {
		t.Error("DetectedAt is zero")
	}
	var names []string
	for _, c := range p.Capabilities {
		names = append(names, c.Name)
		switch {
		case c.Present && (c.Detail == "" || c.Reason != ""):
			t.Errorf("%s present needs a detail and no reason: %+v", c.Name, c)
		case !c.Present && (c.Reason == "" || c.Detail != ""):
			t.Errorf("%s absent needs a reason and no detail: %+v", c.Name, c)
		}
		t.Logf("%-17s present=%-5v %s%s", c.Name, c.Present, c.Detail, c.Reason)
	}
	if !slices.Equal(names, Names) {
		t.Fatalf("names = %v, want %v", names, Names)
	}
	for _, n := range Names {
		if c, ok := p.Lookup(n); !ok || c.Name != n {
			t.Errorf("Lookup(%q) = %+v, %v", n, c, ok)
		}
	}
	if _, ok := p.Lookup("teleporter"); ok {
		t.Error("Lookup found a capability that is not one of the eight")
	}
}

func TestDetectHonoursACancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	p := Detect(ctx, Options{Timeout: time.Second})
	if len(p.Capabilities) != len(Names) {
		t.Fatalf("got %d capabilities, want %d", len(p.Capabilities), len(Names))
	}
}

func TestPrivilegedAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("not running as root (make test runs as root)")
	}
	c := probePrivileged(t.Context(), Options{Root: "/"})
	if !c.Present || !strings.HasPrefix(c.Detail, "root, ") {
		t.Fatalf("privileged as root = %+v", c)
	}
}

// serveDockerAPI answers every connection on a unix socket with answer.
func serveDockerAPI(t *testing.T, answer string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "docker.sock")
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
				c.SetDeadline(time.Now().Add(2 * time.Second))
				req := make([]byte, 0, 256)
				buf := make([]byte, 256)
				for !bytes.Contains(req, []byte("\r\n\r\n")) {
					n, err := c.Read(buf)
					req = append(req, buf[:n]...)
					if err != nil {
						return
					}
				}
				if !bytes.HasPrefix(req, []byte("GET /_ping HTTP/1.1\r\n")) {
					io.WriteString(c, "HTTP/1.0 404 Not Found\r\n\r\n")
					return
				}
				io.WriteString(c, answer)
			}()
		}
	}()
	return path
}

func TestContainerRuntimeAnswersPing(t *testing.T) {
	ok := serveDockerAPI(t, "HTTP/1.0 200 OK\r\nServer: Docker/24.0.7 (linux)\r\nContent-Length: 2\r\n\r\nOK")
	broken := serveDockerAPI(t, "HTTP/1.0 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nerror")
	missing := filepath.Join(t.TempDir(), "nothing.sock")

	c := probeContainerRuntime(t.Context(), Options{sockets: []string{missing, broken, ok}})
	if !c.Present || c.Detail != ok+" (Docker/24.0.7 (linux))" {
		t.Fatalf("with a working socket: %+v", c)
	}

	c = probeContainerRuntime(t.Context(), Options{sockets: []string{missing, broken}})
	if c.Present || !strings.Contains(c.Reason, missing+": absent") || !strings.Contains(c.Reason, broken+": answered") {
		t.Fatalf("without one, the reason must name each socket and its answer: %+v", c)
	}

	// And through Detect, which the caller uses.
	p := detectWithin(t, Options{Timeout: 2 * time.Second, sockets: []string{ok}})
	if got, _ := p.Lookup("container-runtime"); !got.Present {
		t.Fatalf("Detect: %+v", got)
	}
}

func TestContainerRuntimeSilentSocketTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "silent.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // accept and never answer
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	c := probeContainerRuntime(ctx, Options{sockets: []string{path}})
	if c.Present || !strings.Contains(c.Reason, "no answer in time") {
		t.Fatalf("silent socket: %+v", c)
	}

	p := detectWithin(t, Options{Timeout: 300 * time.Millisecond, sockets: []string{path}})
	if c, _ := p.Lookup("container-runtime"); c.Present || !strings.Contains(c.Reason, "no answer in time") {
		t.Fatalf("Detect with a silent socket: %+v", c)
	}
}

// A probe that ignores its context entirely still cannot hold Detect past
// its timeout: it is recorded as not having finished.
func TestDetectDoesNotWaitForAStuckProbe(t *testing.T) {
	stuck := make(chan struct{})
	saved := probes["seat"]
	probes["seat"] = func(context.Context, Options) Capability { <-stuck; return present("never") }
	t.Cleanup(func() { close(stuck); probes["seat"] = saved })

	p := detectWithin(t, Options{Timeout: 200 * time.Millisecond})
	c, ok := p.Lookup("seat")
	if !ok || c.Present || !strings.Contains(c.Reason, "did not finish within 200ms") {
		t.Fatalf("stuck probe: %+v", c)
	}
	if len(p.Capabilities) != len(Names) {
		t.Fatalf("got %d capabilities", len(p.Capabilities))
	}
}

func TestJSONNeverReportedVersusReportedNothing(t *testing.T) {
	var never *Profile
	b, err := json.Marshal(never)
	if err != nil || string(b) != "null" {
		t.Fatalf("nil profile = %s, %v; want null", b, err)
	}
	nothing := &Profile{}
	b, err = json.Marshal(nothing)
	if err != nil || !strings.Contains(string(b), `"capabilities":[]`) {
		t.Fatalf("empty profile = %s, %v; want capabilities []", b, err)
	}

	var back *Profile
	if err := json.Unmarshal([]byte("null"), &back); err != nil || back != nil {
		t.Fatalf("null decoded to %+v, %v", back, err)
	}
	if err := json.Unmarshal(b, &back); err != nil || back == nil || back.Capabilities == nil || len(back.Capabilities) != 0 {
		t.Fatalf("empty decoded to %+v, %v", back, err)
	}

	// A present line with its value and an absent one with its reason both survive.
	p := Profile{DetectedAt: time.Date(2026, 8, 31, 12, 0, 0, 0, time.UTC), Capabilities: []Capability{
		{Name: "seat", Present: true, Detail: "card1-DP-1"},
		{Name: "container-runtime", Reason: "no container runtime socket answered _ping"},
	}}
	b, err = json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"detected_at"`, `"name"`, `"present"`, `"detail"`, `"reason"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("%s lacks %s", b, key)
		}
	}
	var q Profile
	if err := json.Unmarshal(b, &q); err != nil || !q.DetectedAt.Equal(p.DetectedAt) || !slices.Equal(q.Capabilities, p.Capabilities) {
		t.Fatalf("round trip: %+v, %v", q, err)
	}
}
