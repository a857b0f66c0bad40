package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
)

// ErrUpgraded: the executor runs another build than this agent. The host
// was upgraded; the agent exits 0 and its init restarts it onto its own new
// binary.
var ErrUpgraded = errors.New("the executor runs another build; exiting to be restarted onto the new binary")

// execClient is one connection to the executor, one request at a time:
// mu is held from a request's first byte written to its last reply read,
// so the worker, a plan and whatever else shares the client take turns,
// and the replies read after a request are that request's. A request
// given up (an error, a deadline, its context) closes the connection, so
// a reply it left unread can never be read as the answer to the next; and
// every reply is checked against the request's row of the protocol's table
// (wire.Answers). It dials lazily and says hello first; the next request
// after a close dials again.
type execClient struct {
	mu   sync.Mutex
	path string
	uid  uint32
	// vsock, when set, is where the executor is instead of path: no peer
	// credentials there, so the hello presents the connection secret.
	vsock *Vsock
	// dial, when set, is where the executor is instead of path and vsock
	// (Options.DialExecutor).
	dial           func() (net.Conn, error)
	version, build string
	conn           *wire.Conn
	hello          *wire.HelloReply
}

const execTimeout = 10 * time.Second

// close closes the connection once the request on it, if any, has ended.
func (e *execClient) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drop()
}

// drop closes the connection; mu is held.
func (e *execClient) drop() {
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
}

func (e *execClient) connect() error {
	if e.conn != nil {
		return nil
	}
	var c *wire.Conn
	var err error
	hello := &wire.Hello{Protocol: wire.ProtocolVersion, Version: e.version, Build: e.build}
	switch {
	case e.dial != nil:
		var nc net.Conn
		if nc, err = e.dial(); err == nil {
			c = wire.NewConn(nc, wire.ExecutorToAgent)
		}
	case e.vsock != nil:
		c, err = wire.DialVsock(e.vsock.CID, e.vsock.Port)
		hello.Secret = e.vsock.Secret
	default:
		c, err = wire.DialUnix(e.path, e.uid)
		if fi, serr := os.Stat(e.path); err != nil && serr == nil && fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("executor unreachable: %w", notASocket(e.path, fi))
		}
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("executor unreachable: %w", socketDenied(e.path, err))
		}
	}
	if err != nil {
		return fmt.Errorf("executor unreachable: %w", err)
	}
	c.NetConn().SetDeadline(clock.Deadline(execTimeout))
	if err := c.Write(wire.KindHello, hello); err != nil {
		c.Close()
		return fmt.Errorf("executor: hello: %w", err)
	}
	k, body, err := c.Read()
	if err != nil {
		c.Close()
		return fmt.Errorf("executor: hello: %w", err)
	}
	switch b := body.(type) {
	case *wire.HelloReply:
		if b.Build != e.build {
			c.Close()
			return fmt.Errorf("%w (executor build %q version %s; agent build %q version %s)", ErrUpgraded, b.Build, b.Version, e.build, e.version)
		}
		if b.Protocol != wire.ProtocolVersion {
			c.Close()
			return fmt.Errorf("executor speaks protocol %d, the agent %d", b.Protocol, wire.ProtocolVersion)
		}
		e.hello = b
	case *wire.Error:
		c.Close()
		return fmt.Errorf("executor refused the connection: %w", b)
	default:
		c.Close()
		return fmt.Errorf("executor answered hello with %s", k)
	}
	c.NetConn().SetDeadline(time.Time{})
	e.conn = c
	return nil
}

// request sends one request and reads report lines until its Verdict. A
// request has no deadline of its own (an apply may take long); ctx ends it
// by closing the connection.
func (e *execClient) request(ctx context.Context, kind wire.Kind, body any) (*wire.Verdict, []shapes.Line, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	reused := e.conn != nil
	if err := e.connect(); err != nil {
		return nil, nil, err
	}
	c := e.conn
	first := c
	stop := context.AfterFunc(ctx, func() { first.Close() })
	err := c.Write(kind, body)
	if err != nil && reused && goneAway(err) && ctx.Err() == nil {
		// The executor the connection was made to is gone (restarted
		// since, as an upgrade does), and nothing of the request reached
		// one: sent once more, to the executor there is now (as askIf).
		stop()
		e.drop()
		if err := e.connect(); err != nil {
			return nil, nil, err
		}
		again := e.conn
		c = again
		stop = context.AfterFunc(ctx, func() { again.Close() })
		err = c.Write(kind, body)
	}
	defer stop()
	if err != nil {
		e.drop()
		return nil, nil, fmt.Errorf("executor: %s: %w", kind, err)
	}
	var lines []shapes.Line
	for {
		k, b, err := c.Read()
		if err != nil {
			e.drop()
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			return nil, nil, fmt.Errorf("executor: reading the answer to %s: %w", kind, err)
		}
		if belongs, _ := wire.Answers(kind, k); !belongs {
			e.drop()
			return nil, nil, fmt.Errorf("executor answered %s with %s, which belongs to no such request; the connection is closed", kind, k)
		}
		switch b := b.(type) {
		case *shapes.Line:
			lines = append(lines, *b)
		case *wire.Verdict:
			return b, lines, nil
		case *wire.Error:
			e.drop()
			return nil, nil, fmt.Errorf("executor closed the connection: %w", b)
		default:
			e.drop()
			return nil, nil, fmt.Errorf("executor answered %s with %s", kind, k)
		}
	}
}

// status asks the executor's state, saying the link's (nil: nothing).
func (e *execClient) status(l *wire.AgentLink) (*wire.StatusReply, error) {
	b, err := e.ask(wire.KindStatus, &wire.Status{Link: l}, "status")
	if err != nil {
		return nil, err
	}
	return b.(*wire.StatusReply), nil
}

// Vsock is the executor's vsock address, and the connection secret its
// hello presents.
type Vsock struct {
	CID, Port uint32
	Secret    []byte
}

// ask sends one request whose answer is one message (status, enrol,
// grant, profile, plan) and returns that answer, of the kind the
// protocol's table pairs with it.
func (e *execClient) ask(kind wire.Kind, body any, what string) (any, error) {
	return e.askIf(nil, kind, body, what)
}

// askIf is ask with still, when not nil, called once the connection is
// this request's — after the requests before it have ended, which may be
// long (an apply) — and the request not sent if still says it is not
// wanted any more: its error is returned. A plan request past its time
// is thus never handed over however long it waited for its turn.
func (e *execClient) askIf(still func() error, kind wire.Kind, body any, what string) (any, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if still != nil {
		if err := still(); err != nil {
			return nil, err
		}
	}
	reused := e.conn != nil
	if err := e.connect(); err != nil {
		return nil, err
	}
	c := e.conn
	c.NetConn().SetDeadline(clock.Deadline(execTimeout))
	defer func() {
		if e.conn != nil {
			e.conn.NetConn().SetDeadline(time.Time{})
		}
	}()
	if err := c.Write(kind, body); err != nil {
		e.drop()
		if !reused || !goneAway(err) {
			return nil, fmt.Errorf("executor: %s: %w", what, err)
		}
		// The executor this connection was made to is gone (restarted
		// since: its end closed), and nothing of the request reached
		// one: asked once more, of the executor there is now.
		if err := e.connect(); err != nil {
			return nil, err
		}
		c = e.conn
		c.NetConn().SetDeadline(clock.Deadline(execTimeout))
		if err := c.Write(kind, body); err != nil {
			e.drop()
			return nil, fmt.Errorf("executor: %s: %w", what, err)
		}
	}
	k, b, err := c.Read()
	if err != nil {
		e.drop()
		return nil, fmt.Errorf("executor: %s: %w", what, err)
	}
	if eb, ok := b.(*wire.Error); ok {
		e.drop()
		return nil, fmt.Errorf("executor closed the connection: %w", eb)
	}
	if belongs, ends := wire.Answers(kind, k); !belongs || !ends {
		e.drop()
		return nil, fmt.Errorf("executor answered %s with %s, which is not its answer; the connection is closed", what, k)
	}
	return b, nil
}

// goneAway says whether a write failed because the connection's other end
// is closed: the executor it was made to exited.
func goneAway(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// archiveWriteTimeout bounds one chunk's write to the executor, and the
// wait for its answer to the last.
const archiveWriteTimeout = 2 * time.Minute

// archive streams one archive into the executor's cache: fill calls send
// for each chunk of bytes (at most wire.MaxArchiveChunk) in order; then the
// last chunk is sent and the executor's answer read. If fill fails, the
// connection is closed before the last chunk, and the executor keeps
// nothing of the stream.
func (e *execClient) archive(ctx context.Context, sum string, fill func(send func([]byte) error) error) (*wire.ArchiveAck, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.connect(); err != nil {
		return nil, err
	}
	c := e.conn
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var off uint64
	write := func(b []byte, last bool) error {
		c.NetConn().SetWriteDeadline(clock.Deadline(archiveWriteTimeout))
		err := c.Write(wire.KindArchive, &wire.Archive{SHA256: sum, Offset: off, Chunk: b, Last: last})
		off += uint64(len(b))
		return err
	}
	// A write the executor cut off: its reason, if it said one.
	said := func(err error) error {
		c.NetConn().SetReadDeadline(clock.Deadline(time.Second))
		if _, b, rerr := c.Read(); rerr == nil {
			if we, ok := b.(*wire.Error); ok {
				err = fmt.Errorf("executor closed the connection: %w", we)
			}
		}
		e.drop()
		return err
	}
	if err := fill(func(b []byte) error {
		if err := write(b, false); err != nil {
			return said(fmt.Errorf("executor: archive %s: %w", sum, err))
		}
		return nil
	}); err != nil {
		e.drop()
		return nil, err
	}
	if err := write(nil, true); err != nil {
		return nil, said(fmt.Errorf("executor: archive %s: %w", sum, err))
	}
	c.NetConn().SetWriteDeadline(time.Time{})
	c.NetConn().SetReadDeadline(clock.Deadline(archiveWriteTimeout))
	defer func() {
		if e.conn != nil {
			e.conn.NetConn().SetReadDeadline(time.Time{})
		}
	}()
	k, b, err := c.Read()
	if err != nil {
		e.drop()
		return nil, fmt.Errorf("executor: archive %s: %w", sum, err)
	}
	switch b := b.(type) {
	case *wire.ArchiveAck:
		return b, nil
	case *wire.Error:
		e.drop()
		return nil, fmt.Errorf("executor closed the connection: %w", b)
	default:
		e.drop()
		return nil, fmt.Errorf("executor answered an archive with %s", k)
	}
}

// socketDenied says why the executor's socket refused this process, and
// what to do: the executor makes its socket and the directory above it
// its agent user's (root:agent 0660 in root:agent 0750), so an agent
// started as anyone else is shut out by the kernel before the executor
// hears of it.
func socketDenied(path string, err error) error {
	return statedir.ExplainAccess("connect to", path, err, fmt.Sprintf(
		"this agent runs as uid %d gid %d; the executor lets in only its agent's user (mesh-executor serve --agent-user, mesh-agent by default): start the agent as that user (--user), or the executor with --agent-user naming this one",
		os.Geteuid(), os.Getegid()))
}

// watchSocket says, as an error, when the executor's socket is there and
// this process may not connect to it, and says again when it may. Every
// other failure to reach the executor (not started yet, restarting) is
// ordinary and is left to the requests that need it; this one lasts until
// a person acts, and a hosted agent would otherwise mention it only at
// debug level while it waits for an enrolment that can never come. It
// asks the kernel with access(2) (the agent's real and effective ids are
// one after the drop) rather than connecting, so the executor sees no
// connection that says nothing. It ends once the socket is reachable, or
// with ctx.
func watchSocket(ctx context.Context, path string, every time.Duration, log *slog.Logger) {
	denied := false
	for {
		err := unix.Access(path, unix.W_OK)
		fi, serr := os.Stat(path)
		switch {
		case serr == nil && fi.Mode().Type() != fs.ModeSocket:
			// Not a socket at all (--socket naming its directory, say):
			// no user could connect, and "permission denied" would send
			// the person after the wrong fix.
			if !denied {
				denied = true
				log.Error(notASocket(path, fi).Error(), "socket", path)
			}
		case err == nil:
			if denied {
				log.Info("the executor's socket is reachable now", "socket", path, "uid", os.Geteuid())
			}
			return
		case errors.Is(err, fs.ErrPermission):
			if !denied {
				denied = true
				log.Error(socketDenied(path, &fs.PathError{Op: "connect", Path: path, Err: err}).Error(),
					"socket", path, "uid", os.Geteuid(), "gid", os.Getegid())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// notASocket says that path, which --socket names, is no socket.
func notASocket(path string, fi fs.FileInfo) error {
	what := "not a socket but a file of mode " + fi.Mode().String()
	switch {
	case fi.IsDir():
		what = "a directory"
	case fi.Mode().IsRegular():
		what = "a regular file"
	}
	return fmt.Errorf("%s is %s, not the executor's socket: --socket names the socket itself (mesh-executor serve --socket; /run/mesh-host/executor.sock by default)", path, what)
}
