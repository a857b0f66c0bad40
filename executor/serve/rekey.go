package serve

import (
	"context"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// rekey takes the control side's answer to the rekey root asked for
// (enrol.TakeRekey judges it: the agent only carried it) and begins the
// enrolment that renews the node's keys; from there the agent carries it
// out as any enrolment. Under the apply lock, as a grant is: the identity
// the enrolment replaces is read and signed in it.
func (s *Server) rekey(_ context.Context, _ *conn, body any) (wire.Kind, any, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	token, err := enrol.TakeRekey(s.cfg.StateDir, body.(*wire.Rekey).Envelope)
	if err != nil {
		s.log.Warn("a rekey answer refused", "reason", err.Error())
		return wire.KindRekeyReply, &wire.RekeyReply{Refused: "executor: " + err.Error()}, nil
	}
	s.log.Warn("rekey: the control side answered; an enrolment with new keys begins, replacing this one", "token", token)
	return wire.KindRekeyReply, &wire.RekeyReply{Begun: true, Token: token}, nil
}
