package launcher

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// The agent's starts are supervised like the executor's, from the other
// side of the privilege line. The agent runs as its own user and may not
// write the launch state, and a release whose agent exits at start writes
// nothing anyway; so root counts each start before the agent exists:
// `mesh-launch agent-start`, which the init runs before every start of the
// agent (systemd: ExecStartPre=+, run as root outside the agent's
// sandbox; OpenRC, runit, s6: the command that execs the agent). The
// executor proves an agent good once it has stayed up (AgentProven).
//
//	count this start of the agent (persisted under the state's lock)
//	   │
//	the installed agent proven (or the known-good one)? ──yes──► start it
//	   │no: an upgrade's agent not yet seen to stay up
//	MaxStarts within Window? ──no──► start it
//	   │yes
//	rolled back already, or halted? ──yes──► start it (no second rollback)
//	   │no
//	mark rolled_back ("the agent crash-loops"): the running launcher stops
//	the executor and reinstalls the known-good release, both halves
//
// The mark is the one rollback mark the executor's own crash loop sets, so
// the rollback is the launcher's single path (it alone reinstalls, and it
// records the release rolled back from, which the executor then refuses
// to install again). Healthy never makes an unproven agent known-good: a
// release is known-good only when its executor reconciled and its agent
// stayed up.

// AgentLaunch is the agent's part of the launch state.
type AgentLaunch struct {
	// Starts are the agent's starts since its binary was last proven.
	Starts []time.Time `json:"starts,omitempty"`
	// Proven is the SHA-256 of the agent binary last seen to stay up, and
	// ProvenAt when.
	Proven   string    `json:"proven,omitempty"`
	ProvenAt time.Time `json:"proven_at,omitzero"`
}

// AgentAction is what DecideAgent says to do at an agent's start.
type AgentAction int

// The agent's actions. Every one starts the agent: a launcher that kept
// the agent from running would silence the node for good.
const (
	// AgentStart: start it.
	AgentStart AgentAction = iota
	// AgentRollback: the rollback mark is set; the launcher reinstalls the
	// known-good release.
	AgentRollback
	// AgentLoops: the agent crash-loops and nothing can be rolled back to
	// (the binary is proven, or known-good, or there is no known-good, or
	// it was rolled back already): start it and say so.
	AgentLoops
)

// DecideAgent is the agent's policy, a pure function like Decide: given
// the launch state, the time, the policy and the installed agent's digest,
// what to do, and the state to persist (which counts this start).
func DecideAgent(s State, now time.Time, p Policy, installed string) (AgentAction, State, string) {
	now = now.UTC()
	next := s.clone()
	if next.Agent == nil {
		next.Agent = &AgentLaunch{}
	}
	next.Agent.Starts = append(recent(next.Agent.Starts, now, p.Window), now)
	n := len(next.Agent.Starts)
	if n <= p.MaxStarts {
		return AgentStart, next, ""
	}
	loops := fmt.Sprintf("the agent started %d times within %v without staying up", n, p.Window)
	switch {
	case installed != "" && installed == next.Agent.Proven:
		return AgentLoops, next, loops + ", on a binary that ran before: the machine is the problem, not the release"
	case next.KnownGood == nil:
		return AgentLoops, next, loops + "; no release was known good on this node, so there is nothing to roll back to"
	case installed != "" && installed == next.KnownGood.Binaries["mesh-agent"]:
		return AgentLoops, next, loops + ", on the known-good release: the machine is the problem, not the release"
	case next.Halted != nil:
		return AgentLoops, next, loops + "; the launcher is halted: a person has to look"
	case next.RolledBack != nil:
		return AgentLoops, next, loops + ", after the rollback to the known-good release: the machine is the problem; no second rollback"
	}
	next.RolledBack = &RollbackMark{At: now, Reason: loops + " after an upgrade: reinstalling the known-good release (the agent crash-loops)"}
	next.Agent.Starts = nil
	return AgentRollback, next, next.RolledBack.Reason
}

// AgentStarting counts one start of the agent whose binary is at agentPath
// and decides, under the launch state's lock (DecideAgent). It returns
// what was decided and why; an error means nothing was recorded, and the
// agent is to be started all the same.
func AgentStarting(stateDir, agentPath string, p Policy) (AgentAction, string, error) {
	if err := checkDir(stateDir, true); err != nil {
		return AgentStart, "", err
	}
	sum := ""
	f, openErr := openRegular(agentPath, true)
	if openErr == nil {
		sum, _ = digest(f)
		f.Close()
	}
	var act AgentAction
	var why string
	_, err := update(stateDir, func(s *State) (bool, error) {
		var next State
		act, next, why = DecideAgent(*s, clock.Now(), p, sum)
		*s = next
		return true, nil
	})
	if err != nil {
		return AgentStart, "", err
	}
	if openErr != nil && act != AgentStart {
		// Said: a release whose agent cannot be read is taken for
		// broken — and so is a --agent a person mistyped.
		why += fmt.Sprintf(" (the agent's binary %s could not be read: %v)", agentPath, openErr)
	}
	return act, why, nil
}

// AgentProven records that an agent whose binary has SHA-256 sum stayed
// up: its starts are cleared, and a release whose executor reconciled
// may now become known-good (the executor calls Healthy next).
func AgentProven(stateDir, sum string) error {
	if sum == "" {
		return errors.New("launcher: AgentProven: no digest")
	}
	if err := checkDir(stateDir, true); err != nil {
		return err
	}
	_, err := update(stateDir, func(s *State) (bool, error) {
		if s.Agent != nil && s.Agent.Proven == sum && len(s.Agent.Starts) == 0 {
			return false, nil
		}
		if s.Agent == nil {
			s.Agent = &AgentLaunch{}
		}
		s.Agent.Proven, s.Agent.ProvenAt, s.Agent.Starts = sum, clock.Now().UTC(), nil
		return true, nil
	})
	return err
}

// FileDigest is the SHA-256 (hex) of the regular file at p, links
// followed: how the launch state names a binary.
func FileDigest(p string) (string, error) {
	f, err := openRegular(p, true)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return digest(f)
}

// agentUnproven reports whether the agent at path is a binary not yet seen
// to stay up while another release is known good: Healthy then leaves the
// known-good copy as it is, whatever the executor did.
func agentUnproven(s State, path string) bool {
	if s.KnownGood == nil {
		return false // the first release: nothing to keep
	}
	sum, err := FileDigest(path)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	if sum == s.KnownGood.Binaries["mesh-agent"] {
		return false
	}
	return s.Agent == nil || s.Agent.Proven != sum
}
