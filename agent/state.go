package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// State is what the agent keeps across restarts, in agent.json in its state
// directory. None of it is trusted by the executor; it is the agent's
// memory for early refusal and for the heartbeat.
type State struct {
	// Enrolment is the enrolment the sequences and stream positions below
	// were learnt in ("": by a release before the field, taken for this
	// one's). A host enrolled anew — retired and enrolled as another node,
	// or into another mesh — starts them afresh: the new node's
	// declarations begin at sequence 1, and an agent that held the old
	// node's last applied (50, say) refused them as replays.
	Enrolment          string         `json:"enrolment,omitempty"`
	LastLinked         time.Time      `json:"last_linked,omitzero"`
	LastApplied        uint64         `json:"last_applied"`
	LastAppliedOutcome shapes.Outcome `json:"last_applied_outcome,omitempty"`
	LastSeq            uint64         `json:"last_seq,omitempty"`
	LastOutcome        shapes.Outcome `json:"last_outcome,omitempty"`
	// LastStreamSeq is the stream sequence of the last message on the
	// node's subject the agent settled (reported): the one it does not
	// read twice.
	LastStreamSeq uint64 `json:"last_stream_seq,omitempty"`
	// LastRosterStreamSeq is the stream sequence of the last roster the
	// agent settled (handed to the executor, or refused).
	LastRosterStreamSeq uint64 `json:"last_roster_stream_seq,omitempty"`
	// LastRosterSeq is that roster's own sequence: a declaration whose
	// overlay names a newer floor (roster_min) has the newest read first.
	LastRosterSeq uint64 `json:"last_roster_seq,omitempty"`
	// UsesRoster: the last declaration handed over takes its overlay's
	// peers from the roster, so the roster is read and handed over too.
	UsesRoster bool `json:"uses_roster,omitempty"`
	// ProfileDigest names the profile and inventory last reported upward.
	ProfileDigest string `json:"profile_digest,omitempty"`
	// ToldCapability is the link capability the agent said with that
	// profile: an agent of another capability (an upgrade) says the
	// profile again, so the control side keeps the capability beside it.
	ToldCapability int `json:"told_capability,omitempty"`
	// ProfileToldAt is when that profile was said (Options.ProfileAgain).
	ProfileToldAt time.Time `json:"profile_told_at,omitzero"`
	// BrokerPins are the broker certificates the control side last
	// announced (wire.BrokerPins, sequence PinsSeq), accepted in place of
	// the one the config pinned: a rotation of the broker's certificate.
	BrokerPins []string `json:"broker_pins,omitempty"`
	PinsSeq    uint64   `json:"pins_seq,omitempty"`
	// PinsEnrolment is the enrolment they were taken in ("": by a release
	// before the field, taken for this one's): a node enrolled again pins
	// what its token pinned, the certificate the broker presented when it
	// was issued, and takes the control side's newest statement anew —
	// its heartbeat says it holds none, and the control side sends it.
	PinsEnrolment string `json:"pins_enrolment,omitempty"`
	// UserJWT is the user JWT the control side renewed (wire.UserJWT),
	// signed in with in place of the grant's; JWTIssuer the key that
	// issued it.
	UserJWT   string `json:"user_jwt,omitempty"`
	JWTIssuer string `json:"jwt_issuer,omitempty"`
	// ActivityReported is the count of the executor's last activity
	// reported upward (activity.go); ActivityCounted, that it is kept (a
	// state from before the field counts from the executor's newest).
	ActivityReported uint64 `json:"activity_reported,omitempty"`
	ActivityCounted  bool   `json:"activity_counted,omitempty"`
	// FloorLearnt: the executor's floor was learnt in this enrolment (its
	// status heard at a reconnect, learnFromStatus), so the sequences
	// above are at least it. Until then the agent raises them to the
	// executor's — a new enrolment's grant floor, a lost state's last
	// applied; after, a floor past them is an apply the agent never
	// reported (reportUnreported), which a raise would hide.
	FloorLearnt bool `json:"floor_learnt,omitempty"`
	// Format is the file's format, stateFormat when written (absent, in
	// what releases before the field wrote: 1).
	Format int `json:"format,omitempty"`
}

// stateFormat is the state file's format. The file is read loosely, in
// every format: it is the agent's memory, never a promise (the executor
// keeps the floor that matters), and the release a rollback returns to
// must start on a later release's file rather than stop a node. A field
// unknown is passed over, one missing is its zero; a later format that
// changes what a field means renames it.
const stateFormat = 1

type stateStore struct {
	path  string // "" keeps it in memory only
	mu    sync.Mutex
	s     State
	ended bool // end: no more changes
	// dir is the state directory as the agent opened it (and locked it:
	// agent.lock is in it); onMoved is told at each change that it was
	// moved, removed or replaced since.
	dir     *syscall.Stat_t
	still   func() bool // Options.StateStill, which stands for dir when set
	onMoved func(error)
}

// errStateMoved: the agent's state directory is not the one it started on.
var errStateMoved = errors.New("the agent's state directory is not the one it started on")

func openState(dir string) (*stateStore, error) {
	st := &stateStore{}
	if dir == "" {
		return st, nil
	}
	if fi, err := os.Stat(dir); err == nil {
		st.dir = fi.Sys().(*syscall.Stat_t)
	}
	st.path = filepath.Join(dir, "agent.json")
	data, err := os.ReadFile(st.path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if err := json.Unmarshal(data, &st.s); err != nil {
		// Only memory is lost: the executor keeps the floor that matters.
		return st, fmt.Errorf("state %s unreadable, starting afresh: %w", st.path, err)
	}
	if st.s.Format > stateFormat {
		return st, fmt.Errorf("state %s is in format v%d, written by a later release; this agent reads formats up to v%d and keeps what it knows of it", st.path, st.s.Format, stateFormat)
	}
	return st, nil
}

// errStateEnded refuses a change to the state of a run that has ended.
var errStateEnded = errors.New("the agent's run that held this state has ended; not written")

// end makes the store take no more changes: its run has ended, and a
// change from what of it still runs would be written over what the next
// run holds.
func (st *stateStore) end() {
	st.mu.Lock()
	st.ended = true
	st.mu.Unlock()
}

func (st *stateStore) get() State {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.s
}

// update changes the agent's memory and writes it down. The memory holds
// the change even when the write fails (a full disk): it is what the
// agent goes on with, and the next write that succeeds keeps it.
func (st *stateStore) update(f func(*State)) error { return st.change(f, false) }

// keep is update for what the agent tells the control side it holds —
// the broker's certificates (the heartbeat's broker_pins_seq) and its
// credential (jwt_issuer): the control side acts on what it is told,
// switching the broker's certificate or retiring a signing key, so the
// change is made only once it is on disk. Taken in memory alone, a
// restart before the next write (the disk still full, a power cut) would
// bring back the old certificates after the broker had switched, and
// keep the node off it for good. A write that fails leaves memory as the
// disk has it, the change not taken; the control side sends it again
// while the heartbeats say it is not.
func (st *stateStore) keep(f func(*State)) error { return st.change(f, true) }

// change is update and keep: f applied, written down, and taken into
// memory before the write, or (onceKept) only once it succeeded.
func (st *stateStore) change(f func(*State), onceKept bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return errStateEnded
	}
	next := st.s
	f(&next)
	next.Format = stateFormat
	if !onceKept {
		st.s = next
	}
	if st.path != "" {
		if err := st.here(); err != nil {
			return err
		}
		if err := statedir.WriteFile(st.path, next); err != nil {
			return err
		}
	}
	st.s = next
	return nil
}

// here fails once the state directory is not the one the agent started
// on: written by its path, a directory moved away would be made anew
// under another agent's lock, or a second agent's (started on the path,
// finding it free) written over.
func (st *stateStore) here() error {
	dir := filepath.Dir(st.path)
	fi, err := os.Stat(dir)
	switch {
	case st.still != nil:
		if st.still() {
			return nil
		}
	case st.dir == nil:
		return nil
	case err == nil && fi.Sys().(*syscall.Stat_t).Dev == st.dir.Dev && fi.Sys().(*syscall.Stat_t).Ino == st.dir.Ino:
		return nil
	}
	what := "replaced by another directory"
	if err != nil {
		what = "gone (" + err.Error() + ")"
	}
	moved := fmt.Errorf("%w: %s, %s since; nothing is written there, and the agent stops (its next start takes the directory as it is then)", errStateMoved, dir, what)
	if st.onMoved != nil {
		st.onMoved(moved)
	}
	return moved
}
