package launcher

import (
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// NoticeFile is where the launcher says, for the agent, that it starts
// nothing: beside the executor's socket (the socket directory is root's
// and the agent's group's), readable by that group only. The agent, which
// cannot read the executor's private state, reports it upward with its
// heartbeat: a node whose executor is halted says so and why, rather than
// looking like a machine somebody switched off.
const NoticeFile = "/run/mesh-host/launcher.json"

// Notice is NoticeFile's content.
type Notice struct {
	Halted bool      `json:"halted"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// ReadNotice reads the launcher's notice at path; nil when there is none
// (the launcher is starting the executor).
func ReadNotice(path string) (*Notice, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var n Notice
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// notice writes (reason != "") or removes (reason == "") the notice.
func (l *launcher) notice(reason string) {
	p := l.cfg.Notice
	if p == "" {
		return
	}
	if reason == "" {
		os.Remove(p)
		return
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		l.log.Warn("launcher: the notice for the agent could not be written", "err", err)
		return
	}
	gid := noticeGroup(dir, l.cfg.AgentUser)
	if gid != 0 {
		os.Chown(dir, 0, gid) // the agent's group may look in, as at its socket
	}
	b, _ := json.Marshal(&Notice{Halted: true, Reason: reason, At: clock.Now().UTC()})
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		l.log.Warn("launcher: the notice for the agent could not be written", "err", err)
		return
	}
	os.Chown(tmp, 0, gid)
	os.Chmod(tmp, 0o640)
	if err := os.Rename(tmp, p); err != nil {
		l.log.Warn("launcher: the notice for the agent could not be written", "err", err)
	}
}

// noticeGroup is the group the notice is readable by: the one the
// directory has already — the socket's directory, which the executor's
// daemon gave the agent's group (its own --agent-user), whatever the
// launcher was told — else the group of the agent's user as the launcher
// knows it (agentUser; "" when it makes none), else root's alone.
func noticeGroup(dir, agentUser string) int {
	if fi, err := os.Stat(dir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Gid != 0 {
			return int(st.Gid)
		}
	}
	if agentUser != "" {
		if u, err := user.Lookup(agentUser); err == nil {
			gid, _ := strconv.Atoi(u.Gid)
			return gid
		}
	}
	return 0
}
