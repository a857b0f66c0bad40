package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/fxamacker/cbor/v2"
	"golang.org/x/sync/semaphore"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// A frame is a 6-byte header — kind (2 bytes) and body length (4 bytes),
// big-endian — and a CBOR body. The length is checked against the kind's
// limit before a byte of the body is read or allocated.
const headerSize = 6

var (
	encMode cbor.EncMode
	// decModes are the decoders by the direction of what they read:
	// decoded, a collection takes more memory than its bytes on the wire,
	// so how many elements one may hold is bounded, tightly where the
	// executor reads the agent (trusted for nothing), loosely where the
	// agent reads the executor, whose answers grow with what the node
	// holds (a verdict names everything the store owns, a plan every line
	// and diff) and are bounded by their kind's byte limit.
	decModes = map[Direction]cbor.DecMode{}
)

func init() {
	var err error
	// Deterministic: the same message is always the same bytes. Times go
	// as Unix seconds, with their fraction when they have one (a float64:
	// to the microsecond today): an interval said to the second would
	// take in what happened in the second before it.
	enc := cbor.CoreDetEncOptions()
	enc.Time = cbor.TimeUnixDynamic
	if encMode, err = enc.EncMode(); err != nil {
		panic(err)
	}
	// Strict: no duplicate keys, no unknown fields, no indefinite lengths,
	// no tags, shallow nesting, bounded collections.
	for dir, bound := range map[Direction]struct{ elements, pairs int }{
		AgentToExecutor: {4096, 256},
		ExecutorToAgent: {1 << 20, 1 << 16},
	} {
		if decModes[dir], err = (cbor.DecOptions{
			DupMapKey:         cbor.DupMapKeyEnforcedAPF,
			IndefLength:       cbor.IndefLengthForbidden,
			TagsMd:            cbor.TagsForbidden,
			MaxNestedLevels:   8,
			MaxArrayElements:  bound.elements,
			MaxMapPairs:       bound.pairs,
			ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
			UTF8:              cbor.UTF8RejectInvalid,
		}).DecMode(); err != nil {
			panic(err)
		}
	}
}

// Encode is the body encoding of the protocol, exported for tests that
// speak it by hand.
func Encode(v any) ([]byte, error) { return encMode.Marshal(v) }

// Conn is one end of the protocol over a stream (a unix socket, vsock, or
// a pipe in tests). Reading is for one goroutine; writing is safe from
// several.
type Conn struct {
	c       net.Conn
	r       *bufio.Reader
	wmu     sync.Mutex
	receive Direction // the direction of the messages this end reads
	// closed ends a wait for the frame budget when the connection closes.
	closed context.Context
	close  context.CancelFunc
	// held is what the last frame read took from budget (ReadRequest):
	// given back when the next is read, or by Release.
	held   int64
	budget *Budget
}

// NewConn wraps c for the side that receives messages going in direction
// receive: the executor receives AgentToExecutor.
func NewConn(c net.Conn, receive Direction) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &Conn{c: c, r: bufio.NewReaderSize(c, 64<<10), receive: receive, closed: ctx, close: cancel}
}

// Close closes the stream. It may be called from any goroutine.
func (c *Conn) Close() error {
	c.close()
	return c.c.Close()
}

// NetConn is the underlying stream.
func (c *Conn) NetConn() net.Conn { return c.c }

// Write sends one message.
func (c *Conn) Write(k Kind, body any) error {
	s, ok := byKind[k]
	if !ok {
		return fmt.Errorf("wire: write: %w: unknown kind %d", ErrProtocol, k)
	}
	b, err := encMode.Marshal(body)
	if err != nil {
		return fmt.Errorf("wire: write %s: %w", s.Name, err)
	}
	if uint64(len(b)) > uint64(s.Max) {
		return fmt.Errorf("wire: write %s: %w: %d bytes, limit %d", s.Name, ErrTooLarge, len(b), s.Max)
	}
	frame := make([]byte, headerSize, headerSize+len(b))
	binary.BigEndian.PutUint16(frame[0:2], uint16(k))
	binary.BigEndian.PutUint32(frame[2:6], uint32(len(b)))
	frame = append(frame, b...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err = c.c.Write(frame)
	return err
}

// Read receives one message: its kind and its decoded body. A kind not in
// the table, going the wrong way, over its limit, or with a body that does
// not decode strictly is an error carrying its Code; the connection is
// then unusable.
func (c *Conn) Read() (Kind, any, error) {
	return c.read(nil)
}

// Budget bounds the bytes of large frames being read at once, across every
// connection that shares it (FrameBudget, in the connection rules).
type Budget struct {
	sem  *semaphore.Weighted
	size int64
}

// NewBudget returns a budget of n bytes; n must be at least the largest
// frame's limit.
func NewBudget(n int64) *Budget { return &Budget{sem: semaphore.NewWeighted(n), size: n} }

// ErrStalled is a frame that was begun and not finished within
// FrameWithin, or one that did not begin within the state's wait.
var ErrStalled = errors.New("wire: stalled")

// ReadRequest is Read as the executor reads, by the connection rules: it
// waits up to wait for a frame to begin (0: as long as it takes), then
// gives the frame FrameWithin to be whole, and reads a body larger than
// SmallFrame only once budget has room for it. What the frame took from
// budget is given back when the next frame is read, or by Release. A frame
// that does not come, or stalls, is ErrStalled.
func (c *Conn) ReadRequest(wait time.Duration, budget *Budget) (Kind, any, error) {
	c.Release()
	var until time.Time
	if wait > 0 {
		until = clock.Deadline(wait)
	}
	c.c.SetReadDeadline(until)
	if _, err := c.r.Peek(1); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, nil, fmt.Errorf("%w: no message came within %s", ErrStalled, wait)
		}
		return 0, nil, err
	}
	deadline := clock.Deadline(FrameWithin)
	c.c.SetReadDeadline(deadline)
	k, body, err := c.read(func(s *Spec, n uint32) error {
		if budget == nil || n <= SmallFrame {
			return nil
		}
		ctx, cancel := context.WithDeadline(c.closed, deadline)
		defer cancel()
		if err := budget.sem.Acquire(ctx, int64(n)); err != nil {
			return fmt.Errorf("%w: a %s of %d bytes waited %s for the executor's budget of frames in flight (%d bytes)", ErrStalled, s.Name, n, FrameWithin, budget.size)
		}
		c.held, c.budget = int64(n), budget
		return nil
	})
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.ErrUnexpectedEOF) && clock.Past(deadline) {
		err = fmt.Errorf("%w: a message begun was not whole within %s", ErrStalled, FrameWithin)
	}
	return k, body, err
}

// Release gives back what the last frame read took from its budget. It is
// for the goroutine that reads.
func (c *Conn) Release() {
	if c.held > 0 {
		c.budget.sem.Release(c.held)
		c.held, c.budget = 0, nil
	}
}

// read reads one frame; admit, when set, is asked once the header is
// checked, before a byte of the body is read.
func (c *Conn) read(admit func(s *Spec, n uint32) error) (Kind, any, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return 0, nil, err
	}
	k := Kind(binary.BigEndian.Uint16(h[0:2]))
	n := binary.BigEndian.Uint32(h[2:6])
	s, ok := byKind[k]
	if !ok {
		return k, nil, &Refusal{CodeProtocol, fmt.Sprintf("unknown message kind %d", k)}
	}
	if s.Dir != c.receive {
		return k, nil, &Refusal{CodeProtocol, fmt.Sprintf("%s may not be sent in this direction", s.Name)}
	}
	if n > s.Max {
		return k, nil, &Refusal{CodeTooLarge, fmt.Sprintf("%s of %d bytes, over its limit of %d", s.Name, n, s.Max)}
	}
	var b []byte
	if admit != nil {
		// Admitted (small, or within the budget, which has counted it):
		// the body is read into exactly its size.
		if err := admit(s, n); err != nil {
			return k, nil, err
		}
		b = make([]byte, n)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return k, nil, err
		}
	} else {
		// Read as the bytes arrive, not allocated from the header's
		// word: a peer that announces 64 MiB and trickles must not pin
		// 64 MiB.
		var err error
		if b, err = readGrowing(c.r, int(n)); err != nil {
			return k, nil, err
		}
	}
	body := s.Body()
	if err := decModes[s.Dir].Unmarshal(b, body); err != nil {
		return k, nil, &Refusal{CodeMalformed, fmt.Sprintf("%s body: %v", s.Name, err)}
	}
	return k, body, nil
}

// bodyType is the Go type of a kind's body, for the table tests.
func bodyType(k Kind) reflect.Type {
	return reflect.TypeOf(byKind[k].Body()).Elem()
}

// readGrowing reads exactly n bytes from r into a slice that starts at
// 64 KiB at most and doubles as the bytes arrive, never past n. (A
// bytes.Buffer filled by io.CopyN grew once more after the last byte, to
// make room for a read that only says EOF: every frame was allocated
// twice and copied once; the fleet bench's stand-ins spent a tenth of a
// fan-out's CPU there.)
func readGrowing(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, 0, min(n, 64<<10))
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), cap(b)))
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}
