package serve

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// LinkFile, in the executor's state directory, is the agent's link as the
// agent last told the daemon (with every status request, every few
// seconds): what `mesh-executor status`, a process of its own, shows.
// It is the agent's word, kept for a person to read, and drives nothing.
const LinkFile = "link.json"

// linkRefresh is how often the file is written again while nothing
// changes, so its SaidAt tells a silent agent from a steady link.
const linkRefresh = time.Minute

// LinkState is LinkFile's content.
type LinkState struct {
	// Up: linked since Since; otherwise without the link since Since (the
	// last moment the agent knew it linked; zero: never).
	Up    bool      `json:"up"`
	Since time.Time `json:"since,omitzero"`
	// Revoked, while down: the broker has refused the node's credential
	// since then, as the agent first saw it (the control side revoked the
	// node, or enrolled another machine as it). Status says so rather than
	// "disconnected": the link comes back with a new enrolment, not by
	// waiting.
	Revoked time.Time `json:"revoked,omitzero"`
	// SaidAt is when the agent last said so.
	SaidAt time.Time `json:"said_at"`
	// LastError, while down: why the agent last failed to reach the
	// broker, in its words (wire.AgentLink.Error), kept printable and
	// short.
	LastError string `json:"last_error,omitempty"`
	// ClockSkewMS is how far this machine's clock was ahead of the
	// broker's (negative: behind), in milliseconds, as the agent last
	// measured it, at ClockAt by this machine's clock (zero: never).
	ClockSkewMS int64     `json:"clock_skew_ms,omitempty"`
	ClockAt     time.Time `json:"clock_at,omitzero"`
	// Format is the file's format, linkFormat when written (absent, in
	// what releases before the field wrote: 1).
	Format int `json:"format,omitempty"`
}

// linkFormat is LinkFile's format. The file is read in every format, a
// later one too, as far as this release knows it (ReadLinkState): it is
// for a person to read and drives nothing. A later format that changes
// what a field means renames it.
const linkFormat = 1

// ReadLinkState reads LinkFile in dir; nil when the agent never said.
// The file is read by the release that wrote it and by the one before or
// after it (a rollback, an upgrade): a field one does not know is passed
// over, one it misses is its zero — as encoding/json reads, and as this
// must go on reading (no DisallowUnknownFields).
func ReadLinkState(dir string) (*LinkState, error) {
	b, err := os.ReadFile(filepath.Join(dir, LinkFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l LinkState
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// noteLink keeps what the agent said of its link: written when it
// changes, and at most once a linkRefresh otherwise.
func (s *Server) noteLink(l *wire.AgentLink) {
	if l == nil {
		return
	}
	now := clock.Now().UTC()
	s.lastMu.Lock()
	prev := s.link
	next := LinkState{Up: l.Up, Since: l.Since.UTC(), Revoked: l.Revoked.UTC(), SaidAt: now,
		LastError: wire.LinkErrorText(l.Error), ClockSkewMS: l.ClockSkew.Milliseconds(), ClockAt: l.ClockAt.UTC(), Format: linkFormat}
	// moved: the link's state changed, which the log says; same: nothing
	// the file holds did, which is written again once a linkRefresh.
	moved := prev.Up != next.Up || !prev.Since.Equal(next.Since) || !prev.Revoked.Equal(next.Revoked)
	same := !moved && prev.LastError == next.LastError && prev.ClockSkewMS == next.ClockSkewMS && prev.ClockAt.Equal(next.ClockAt)
	if same && now.Sub(prev.SaidAt) < linkRefresh {
		s.lastMu.Unlock()
		return
	}
	s.link = next
	s.lastMu.Unlock()
	s.keepLink()
	if moved {
		switch {
		case next.Up:
			s.log.Info("the agent says it is linked", "since", next.Since)
		case !next.Revoked.IsZero():
			s.log.Warn("the agent says the broker refuses the node's credential: revoked by the control side", "revoked", next.Revoked, "since", next.Since)
		default:
			s.log.Info("the agent says it is disconnected", "since", next.Since)
		}
	}
}

// keepLink writes the newest link state to LinkFile. Connections say their
// link state concurrently: the file is written by one at a time (its
// temporary file has one name), and each writes the state newest when it
// writes, so an older one never lands last. A state the agent's times make
// unwritable (a year past 9999) is not written over the last.
func (s *Server) keepLink() {
	s.linkFileMu.Lock()
	defer s.linkFileMu.Unlock()
	s.lastMu.Lock()
	cur := s.link
	s.lastMu.Unlock()
	b, err := json.Marshal(cur)
	if err == nil {
		err = store.WriteFileAtomic(filepath.Join(s.cfg.StateDir, LinkFile), b)
	}
	if err != nil {
		s.log.Warn("the agent's link state could not be kept", "err", err)
	}
}
