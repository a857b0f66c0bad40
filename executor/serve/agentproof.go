package serve

import (
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/launcher"
)

// DefaultAgentProofAfter is how long an agent process must have been
// talking to this executor before its binary is proven: longer than any
// crash loop's life (the inits restart the agent within seconds), shorter
// than anyone waits for an upgrade to settle.
const DefaultAgentProofAfter = 30 * time.Second

// agentSeenMax bounds the agent processes remembered (a crash-looping
// agent is a new process every few seconds).
const agentSeenMax = 64

// proveAgent is the executor's half of the agent's supervision (the
// launcher's agent.go has the other): an agent that has stayed up is
// proven good, which lets a release become known-good only when both of
// its halves ran. It runs on the agent's status requests (every few
// seconds), and proves the installed agent binary when
//
//   - the peer is the agent's uid, and the process is the same one the
//     executor first heard from at least AgentProofAfter ago;
//   - its running binary is the installed one (same device and inode as
//     Config.AgentBinary): an agent still running the release before an
//     upgrade proves nothing of the new one;
//   - this executor has reconciled once to its end (so a release is
//     promoted only with both halves run).
//
// The agent is trusted for nothing here either: what it could gain by
// staying up is that its own binary, run as it is installed, counts as
// good — which staying up is. It cannot make another binary proven.
//
// It runs beside the request (spawned), one at a time: a proof
// reads and copies binaries, which no answer waits for.
func (s *Server) proveAgent(pid int32, uid uint32) {
	if s.cfg.AgentBinary == "" || pid <= 0 || uid == 0 || uid != uint32(s.cfg.AgentUID) {
		return
	}
	now := clock.Now()
	if !s.agentMu.TryLock() {
		return // a proof runs already; the next status comes in seconds
	}
	defer s.agentMu.Unlock()
	first, ok := s.agentSeen[pid]
	if !ok {
		if len(s.agentSeen) >= agentSeenMax {
			for pid := range s.agentSeen {
				delete(s.agentSeen, pid)
				break
			}
		}
		s.agentSeen[pid] = now
		return
	}
	if now.Sub(first) < s.cfg.AgentProofAfter || !s.reconciled.Load() {
		return
	}
	var inst, run unix.Stat_t
	if unix.Stat(s.cfg.AgentBinary, &inst) != nil || unix.Stat("/proc/"+strconv.Itoa(int(pid))+"/exe", &run) != nil {
		return
	}
	key := agentKey{inst.Dev, inst.Ino, inst.Size, inst.Mtim}
	if s.agentProven == key {
		return
	}
	if inst.Dev != run.Dev || inst.Ino != run.Ino {
		// Another file at the installed path: the same bytes installed
		// again (a rollback by copying writes the known-good release's
		// binaries anew) run as they are; another release's do not, until
		// the agent restarts onto it. Looked at once for each agent
		// process and installed file.
		if s.agentSameBytes[pid] == (sameBytes{key, false}) {
			return
		}
		if s.agentSameBytes[pid] != (sameBytes{key, true}) {
			a, aerr := launcher.FileDigest(s.cfg.AgentBinary)
			b, berr := launcher.FileDigest("/proc/" + strconv.Itoa(int(pid)) + "/exe")
			same := aerr == nil && berr == nil && a == b
			if len(s.agentSameBytes) >= agentSeenMax {
				clear(s.agentSameBytes)
			}
			s.agentSameBytes[pid] = sameBytes{key, same}
			if !same {
				return
			}
		}
	}
	sum, err := launcher.FileDigest(s.cfg.AgentBinary)
	if err == nil {
		err = launcher.AgentProven(s.cfg.StateDir, sum)
	}
	if err != nil {
		s.log.Warn("the agent stayed up, but that could not be recorded", "err", err)
		return
	}
	s.agentProven = key
	s.log.Info("the agent stayed up: its binary is proven", "pid", pid, "binary", s.cfg.AgentBinary, "sha256", sum)
	if s.cfg.Healthy != nil {
		if err := s.cfg.Healthy(); err != nil {
			s.log.Warn("could not record this build as known-good", "err", err)
		}
	}
}

// sameBytes is what an agent process's binary was found to be beside an
// installed file not its own: the same bytes or not.
type sameBytes struct {
	key  agentKey
	same bool
}

// agentKey names one installed agent binary without reading it.
type agentKey struct {
	dev, ino uint64
	size     int64
	mtime    unix.Timespec
}
