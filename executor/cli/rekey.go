package cli

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
)

// rekeyCmd asks for the node's keys to be renewed over the link (the
// steps: wire.RekeyRequest) and waits for the enrolment that renews them
// to end, as enrol does: exit 0 renewed, 1 refused, 2 refused before
// anything changed, 3 still pending.
func (c *command) rekeyCmd(cancel bool) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(c.errw, "mesh-executor: rekey: needs root: it renews the node's keys in the executor's state")
		return ExitRefused
	}
	if cancel {
		ended, err := enrol.CancelRekey(c.state)
		switch {
		case err != nil:
			fmt.Fprintf(c.errw, "executor: rekey --cancel: %v\n", err)
			return ExitFailed
		case !ended:
			return c.print(map[string]any{"cancelled": false}, "no rekey is pending; nothing to cancel\n")
		}
		return c.print(map[string]any{"cancelled": true}, "the rekey is cancelled; the node keeps its keys (an answer that comes now is refused)\n")
	}
	v, err := enrol.BeginRekey(c.state)
	if err != nil {
		fmt.Fprintf(c.errw, "executor: rekey: %v\n", err)
		var refused enrol.Refusal
		if errors.As(err, &refused) {
			return ExitRefused
		}
		return ExitFailed
	}
	if !c.json {
		fmt.Fprintf(c.out, "rekey asked for by node %s (enrolment %s), since %s: the agent carries the request, signed by this identity's key, to the control side with its heartbeats; the control side's answer begins an enrolment with new keys (identity, sealing, WireGuard and the agent's NKey) that replaces this one\n",
			v.Node, v.Enrolment, v.Begun.Local().Format(time.RFC3339))
	}
	deadline := clock.Deadline(c.wait)
	var last string
	for {
		pending, r, err := enrol.RekeyState(c.state)
		if err != nil {
			fmt.Fprintf(c.errw, "executor: rekey: %v\n", err)
			return ExitFailed
		}
		// The answer began an enrolment: its result is the rekey's.
		if pending == nil && r != nil && !r.At.Before(v.Begun) {
			if s := r.String(); s != last && !r.Final && r.Reason != "" && !c.json {
				fmt.Fprintln(c.errw, s)
				last = s
			}
			if r.Final {
				if c.json {
					c.print(r, "")
				}
				if !r.Enrolled {
					if !c.json {
						fmt.Fprintf(c.errw, "rekey: %s\n", r.String())
					}
					return ExitFailed
				}
				if !c.json {
					fmt.Fprintf(c.out, "rekeyed: %s\n", r.String())
				}
				return 0
			}
		}
		if pending == nil && (r == nil || r.At.Before(v.Begun)) {
			fmt.Fprintln(c.errw, "executor: rekey: the rekey ended without an enrolment (cancelled by root, or an enrolment root began took its place)")
			return ExitFailed
		}
		if clock.Past(deadline) {
			msg := "the rekey is pending: "
			if pending != nil {
				msg += "the control side has not answered yet (" + agentDiagnosis(c.state, c.socket) + "; a control side of a release before rekeys does not answer)"
			} else {
				msg += "the enrolment with the new keys has not finished (" + agentDiagnosis(c.state, c.socket) + ")"
			}
			msg += "; it completes when it does: `mesh-executor status` shows it, `mesh-executor rekey --cancel` ends it"
			fmt.Fprintln(c.errw, msg)
			c.print(map[string]any{"pending": true, "why": msg}, "") // --json: one value, exit 3 or not
			return exitEnrolPending
		}
		time.Sleep(200 * time.Millisecond)
	}
}
