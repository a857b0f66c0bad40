package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"
)

// The embedded broker's store on a full disk.
//
// nats-server (v2.15) keeps a stream's first write error for the stream's
// life: once a write fails for want of space, every later write to that
// stream fails with the same error and is never answered, so a command
// waits out its time ("context deadline exceeded") — long after the space
// is back, until the broker is restarted. Reads go on working. Serve
// watches for such errors (the broker's log names them as they happen; its
// health check, Healthz, lists each stream that holds one), says to a
// command that failed that the disk is full and where, and once the disk
// has room again has the broker open its store anew — JetStream shut down
// and enabled again, as nats-server's own configuration reload does: each
// stream is read back from its files, which hold exactly what was
// acknowledged (each write fsynced before it was, see serverConfig), and
// holds no error.

// StoreSubject is where serve answers, in the control side's account,
// what is wrong with the broker's store ("" when nothing is): a command
// asks it after it failed, to say why. Nodes have no way to it (their
// account imports none of the control side's subjects but the services
// link.ServiceImports names).
const StoreSubject = "mesh.control.store"

// storeRoomNeeded is how much room the store's disk must have before the
// broker opens the store again: below it, the first writes would fail as
// the last did.
const storeRoomNeeded = 1 << 20

// storeCheckEvery is how often serve looks at the store while it cannot
// write (for space coming back), and otherwise (for a write error its log
// did not name).
const (
	storeCheckEvery     = time.Second
	storeCheckEveryIdle = 30 * time.Second
)

// storeState is serve's answer on StoreSubject.
type storeState struct {
	// Problem says what keeps the store from writing, for a person; ""
	// when nothing does.
	Problem string `json:"problem,omitempty"`
}

// DiskFullError says that the disk holding Dir (the broker's store) has
// no room for a write.
type DiskFullError struct {
	Dir string
	Err error
}

func (e *DiskFullError) Error() string {
	return fmt.Sprintf("the disk holding %s is full (%v): free space there; serve takes writes again once there is, without a restart", e.Dir, e.Err)
}

func (e *DiskFullError) Unwrap() error { return e.Err }

// storeDir is the directory the embedded broker keeps its store in.
func (s *Server) storeDir() string { return s.opts.StoreDir }

// noteWriteError is called with each line of the broker's log at error
// level: a line naming a write that failed for want of space has serve
// look at the store now rather than at its next check.
func (s *Server) noteWriteError(line string) {
	if !strings.Contains(line, "no space left") && !strings.Contains(strings.ToLower(line), "write error") {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// writeError is the error that keeps the broker's store from taking
// writes now: JetStream shut down, or a stream holding a write error (as
// Healthz reports it); nil when there is none.
func (s *Server) writeError() error {
	if !s.ns.JetStreamEnabled() {
		return errors.New("JetStream is shut down")
	}
	h := s.ns.Healthz(&server.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		if strings.Contains(e.Error, "write error") {
			return errors.New(e.Error)
		}
	}
	return nil
}

// storeLimit is the most the broker's store may hold: the whole of the
// file system it is on. Left unset, nats-server caps its store at three
// quarters of what was free when JetStream started, plus what it held, and
// keeps that cap until it is started again: a serve started on a full
// disk (a machine rebooted after its disk filled) refused every write
// with "insufficient resources" long after the disk had room again, and
// one started on a nearly full disk was held to that little for good. A
// full disk is met instead as the disk's own error, which serve says and
// recovers from without a restart (keepStoreWriting).
// A store not made yet is on its parent's file system.
func storeLimit(dir string) (int64, error) {
	var st unix.Statfs_t
	err := unix.Statfs(dir, &st)
	for p := dir; errors.Is(err, unix.ENOENT) && filepath.Dir(p) != p; {
		p = filepath.Dir(p)
		err = unix.Statfs(p, &st)
	}
	if err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Blocks) * st.Bsize, nil
}

// room is the space free on the store's disk for an unprivileged writer.
func (s *Server) room() (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.storeDir(), &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", s.storeDir(), err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// Problem says what keeps the broker's store from taking writes now, nil
// when nothing does: a *DiskFullError when its disk has no room (whether a
// stream has failed yet or not), the write error a stream holds, or, in
// the seconds after the store was opened anew, a *ReopenedError — what a
// command that timed out then is told, where it was told nothing.
func (s *Server) Problem() error {
	werr := s.writeError()
	room, err := s.room()
	if err == nil && room < storeRoomNeeded {
		if werr == nil {
			werr = unix.ENOSPC
		}
		return &DiskFullError{Dir: s.storeDir(), Err: werr}
	}
	if werr != nil && strings.Contains(werr.Error(), "no space left") {
		return &DiskFullError{Dir: s.storeDir(), Err: werr}
	}
	if werr != nil {
		return werr
	}
	s.mu.Lock()
	at := s.reopenedAt
	s.mu.Unlock()
	if !at.IsZero() && time.Since(at) < reopenSettle {
		return &ReopenedError{Dir: s.storeDir(), At: at}
	}
	return nil
}

// reopen has the broker read its store anew: JetStream shut down (its
// state on disk kept) and enabled again with the configuration it started
// with. Each stream comes back from its files without the write error it
// held.
func (s *Server) reopen() error {
	o := s.opts
	if err := s.ns.ShutdownJetStream(); err != nil {
		return fmt.Errorf("shutting JetStream down: %w", err)
	}
	limit, err := storeLimit(o.StoreDir)
	if err != nil {
		return err
	}
	cfg := &server.JetStreamConfig{
		StoreDir: o.StoreDir, SyncInterval: o.SyncInterval, SyncAlways: o.SyncAlways,
		Strict: !o.NoJetStreamStrict, MaxMemory: o.JetStreamMaxMemory, MaxStore: limit,
		Domain: o.JetStreamDomain, CompressOK: true, UniqueTag: o.JetStreamUniqueTag,
	}
	if err := s.ns.EnableJetStream(cfg); err != nil {
		return fmt.Errorf("enabling JetStream again: %w", err)
	}
	s.mu.Lock()
	close(s.reopened)
	s.reopened = make(chan struct{})
	s.reopenedAt = time.Now()
	s.mu.Unlock()
	return nil
}

// reopenSettle is how long after the store is opened anew a command that
// failed is told so: the streams, the registry's watch and the recorder
// come back within it, and a command in between may time out.
const reopenSettle = 15 * time.Second

// ReopenedError says a command failed in the moments after the broker's
// store was opened anew, where the broker's own answer is a timeout.
type ReopenedError struct {
	Dir string
	At  time.Time
}

func (e *ReopenedError) Error() string {
	return fmt.Sprintf("the broker's store in %s was opened anew at %s, once its disk had room again; a command in the seconds after may time out: run it again", e.Dir, e.At.Local().Format(time.RFC3339))
}

// Reopened is closed when the broker's store is next opened anew. What
// serve keeps reading from the store (the registry's watch, the
// recorder's consumers) starts again then: the consumers it read through
// are gone with the store that was shut down, and nats.go would find that
// out only when their heartbeats stop coming — seconds in which a node
// added, or revoked, would not be the broker's users yet.
func (s *Server) Reopened() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reopened
}

// untilReopened is part run until srv's store is opened anew, then ended
// with an error saying so, for keepRunning to start it again; with a nil
// srv (a broker of the operator's own), part as it is.
func untilReopened(srv *Server, part func(context.Context) error) func(context.Context) error {
	if srv == nil {
		return part
	}
	return func(ctx context.Context) error {
		reopened := srv.Reopened()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- part(ctx) }()
		select {
		case err := <-done:
			return err
		case <-reopened:
			cancel()
			<-done
			return errStoreReopened
		}
	}
}

// errStoreReopened ends a part of serve when the broker's store is opened
// anew: a planned stop, which keepRunning starts again at once and says
// as such, not as a failure.
var errStoreReopened = errors.New("the broker's store was opened anew")

// keepStoreWriting watches the broker's store until ctx ends: when a
// write has failed (the broker's log says so, or a check finds it), it
// waits for room on the disk and has the broker open its store anew.
func (s *Server) keepStoreWriting(ctx context.Context, log *slog.Logger) {
	broken := false
	for {
		wait := storeCheckEveryIdle
		if broken {
			wait = storeCheckEvery
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-time.After(wait):
		}
		werr := s.writeError()
		if werr == nil {
			if broken {
				log.Info("serve: the broker's store takes writes again", "dir", s.storeDir())
			}
			broken = false
			continue
		}
		if !broken {
			log.Error("serve: the broker's store does not take writes; it is opened again once its disk has room", "dir", s.storeDir(), "err", werr)
			broken = true
		}
		room, err := s.room()
		if err != nil {
			log.Error("serve: the broker's store", "err", err)
			continue
		}
		if room < storeRoomNeeded {
			continue
		}
		log.Info("serve: the broker's disk has room again; opening its store anew", "dir", s.storeDir(), "free", room)
		if err := s.reopen(); err != nil {
			log.Error("serve: the broker's store", "err", err)
		}
	}
}

// answerStore answers on StoreSubject with what srv.Problem says, over
// nc, until the subscription is drained with nc.
func answerStore(nc *nats.Conn, srv *Server) error {
	_, err := nc.Subscribe(StoreSubject, func(m *nats.Msg) {
		var st storeState
		if p := srv.Problem(); p != nil {
			st.Problem = p.Error()
		}
		b, _ := json.Marshal(st)
		m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("answering on %s: %w", StoreSubject, err)
	}
	return nil
}

// mayBeTheStore says whether err may come of a store that cannot write:
// the broker did not answer in time, or answered with a JetStream error,
// or a node's answer was waited for in vain (what it sends is recorded
// before it is seen).
func mayBeTheStore(err error) bool {
	var api *jetstream.APIError
	var ee *exitError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.As(err, &ee) && ee.code == ExitTimedOut ||
		errors.Is(err, nats.ErrNoResponders) || errors.As(err, &api) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoStreamResponse)
}

// askStore asks serve, over nc, what keeps the broker's store from
// writing (StoreSubject): answered is false when nobody answers (no
// serve, a broker of the operator's own); problem is "" when nothing does.
func askStore(ctx context.Context, nc *nats.Conn) (answered bool, problem string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, StoreSubject, nil)
	if err != nil {
		return false, ""
	}
	var st storeState
	if json.Unmarshal(m.Data, &st) != nil {
		return false, ""
	}
	return true, st.Problem
}

// storeProblem is askStore's problem over a new connection to the broker
// at url: what a command whose own connection failed is told.
func storeProblem(ctx context.Context, k *Keys, url string) string {
	nc, _, err := dialBroker(k, url)
	if err != nil {
		return ""
	}
	defer nc.Close()
	_, p := askStore(ctx, nc)
	return p
}

// explainStoreError puts what keeps the broker's store from writing, as
// serve says it, before err: a command that failed for a full disk says
// so, where the broker's own answer is a timeout. err is returned as it is
// when the store is well, when serve does not answer, and when the store
// cannot have caused it (mayBeTheStore): a refusal of the control side's
// own ("this mesh has an overlay…") is not put down to the disk.
func (c *cli) explainStoreError(err error) error {
	if err == nil || !mayBeTheStore(err) {
		return err
	}
	k, kerr := LoadKeys(c.dir)
	if kerr != nil {
		return err
	}
	url := c.nats
	if url == "" {
		url = k.BrokerURL
	}
	p := storeProblem(c.ctx, k, url)
	if p == "" {
		return err
	}
	return fmt.Errorf("%s: %w", p, err)
}
