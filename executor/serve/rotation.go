package serve

import (
	"context"
	"errors"
	"fmt"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// keyRotation takes the control key's rotations the agent carried up
// (identity.TakeRotations: each signed by the key in force or the
// recovery key this host pinned, and by the key it brings in, addressed
// to this enrolment, newer than the last taken) and answers with the key
// in force after them — what the agent's own early checks use. None asks
// only that. Under the apply lock: an apply verifies its declaration
// under one key, the one in force when it began.
func (s *Server) keyRotation(_ context.Context, _ *conn, body any) (wire.Kind, any, error) {
	defer s.giveBack()
	chain := body.(*wire.KeyRotations).Envelopes
	if len(chain) > wire.MaxRotationChain {
		return wire.KindKeyRotationReply, &wire.KeyRotationReply{Refused: fmt.Sprintf("executor: a chain of %d rotations, over the limit of %d", len(chain), wire.MaxRotationChain)}, nil
	}
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	id, err := s.identity()
	if err != nil {
		return 0, nil, err
	}
	if id == nil {
		return wire.KindKeyRotationReply, &wire.KeyRotationReply{Refused: "executor: this host has no identity (hosted): it holds no control key"}, nil
	}
	taken, err := identity.TakeRotations(s.cfg.StateDir, id, chain, clock.Now())
	for _, r := range taken {
		k, _ := r.NewKey()
		s.log.Warn("the control key rotated", "seq", r.Seq, "by", r.By, "from", r.From, "to", wire.KeyID(k))
	}
	if errors.Is(err, identity.ErrNotKept) {
		// No answer rather than a refusal: the agent asks again, and
		// what it carried is judged once the rotation can be kept.
		s.log.Warn("a key rotation could not be kept; the agent will offer it again", "err", err.Error())
		return 0, nil, err
	}
	reply := &wire.KeyRotationReply{ControlKey: id.ControlKey, Taken: len(taken)}
	if err != nil {
		s.log.Warn("a key rotation refused", "reason", err.Error())
		reply.Refused = "executor: " + err.Error()
	}
	return wire.KindKeyRotationReply, reply, nil
}
