package control_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const maxConnChild = "NOX_TEST_MAXCONN_CHILD"

// A fleet linking again at once can hold more connections than the
// broker has files: the broker refuses the connections past its
// open-file limit less a reserve, at once, and its store keeps taking
// writes. Serve runs in a child process whose limit is 300 (the test
// process holds the connections, so its own files are not the broker's).
func TestTheBrokerKeepsFilesForItsStore(t *testing.T) {
	if os.Getenv(maxConnChild) != "" {
		brokerWithFewFiles(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTheBrokerKeepsFilesForItsStore$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), maxConnChild+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	var addr string
	var said []string
	for addr == "" && lines.Scan() {
		said = append(said, lines.Text())
		if a, ok := strings.CutPrefix(lines.Text(), "BROKER "); ok {
			addr = a
		}
	}
	if addr == "" {
		t.Fatalf("the child never said its broker:\n%s", strings.Join(said, "\n"))
	}
	const flood = 400
	var mu sync.Mutex
	var refused, answered, silent int
	var wg sync.WaitGroup
	var conns []net.Conn
	for range flood {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dialing the broker: %v", err)
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The broker sends its INFO to every connection it accepts,
			// then refuses one over its limit and closes it; one it
			// holds waits for the TLS handshake.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, _ := io.ReadAll(c)
			mu.Lock()
			defer mu.Unlock()
			switch s := string(b); {
			case strings.Contains(s, "maximum connections exceeded"):
				refused++
			case strings.HasPrefix(s, "INFO"):
				answered++
			default:
				silent++
			}
		}()
	}
	wg.Wait()
	// The limit of 300 less the reserve of 256 is 44 connections, serve's
	// own among them.
	if answered > 44 || refused < flood-44 || silent > 0 {
		t.Errorf("of %d connections: %d answered, %d refused, %d neither; want at most 44 answered and the rest refused", flood, answered, refused, silent)
	}
	fmt.Fprintln(stdin, "write")
	for lines.Scan() {
		said = append(said, lines.Text())
		if strings.HasPrefix(lines.Text(), "STORE ") {
			break
		}
	}
	for _, c := range conns {
		c.Close()
	}
	if last := said[len(said)-1]; last != "STORE took the write" {
		t.Fatalf("with the broker's connections full, the store: %q\n%s", last, strings.Join(said, "\n"))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the child: %v\n%s", err, strings.Join(said, "\n"))
	}
}

// brokerWithFewFiles is the child: serve with an open-file limit of 300,
// its broker's address said on standard output; at a line on standard
// input, a node added (a registry write), and what came of it said.
func brokerWithFewFiles(t *testing.T) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	r.Cur = 300
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	defer s.stop()
	fmt.Println("BROKER " + strings.TrimPrefix(s.url, "tls://"))
	bufio.NewReader(os.Stdin).ReadString('\n')
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := s.client.AddNode(ctx, "after-the-flood", s.url); err != nil {
		fmt.Println("STORE refused the write: " + err.Error())
		return
	}
	fmt.Println("STORE took the write")
}
