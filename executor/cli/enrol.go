package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
)

// Exit statuses of enrol beyond 0 (enrolled) and 1 (refused).
const exitEnrolPending = 3 // begun; the agent has not finished it within --wait

// enrolFlags are enrol's own flags.
type enrolFlags struct {
	tokenFile string
	replace   bool // replace the identity the host holds
	cancel    bool // end the pending enrolment instead
}

// noTokenInArgs refuses a token given on the command line, saying why
// (the table's Vet for enrol).
func noTokenInArgs(pos []string) error {
	for _, a := range pos {
		if strings.HasPrefix(strings.TrimSpace(a), "nmt") {
			return errors.New("a token is never taken from the command line (any user can read it in the process list, and the shell keeps it); pipe it on standard input or name a root-only file with --token-file")
		}
	}
	return nil
}

// enrolCmd begins an enrolment with a token read from standard input or a
// root-only file — never the command line, where any user could read it
// in the process list — and waits for the agent to finish it.
func (c *command) enrolCmd(args []string, f enrolFlags, stdin io.Reader) int {
	if len(args) > 0 {
		fmt.Fprintf(c.errw, "executor: enrol: unexpected argument %q\n", args[0])
		return ExitRefused
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(c.errw, "mesh-executor: enrol: needs root: it makes the node's keys in the executor's state")
		return ExitRefused
	}
	if f.cancel {
		return c.enrolCancel(f)
	}
	tokenFile := f.tokenFile
	var raw string
	if tokenFile != "" {
		data, info, err := fsx.ReadRegular(tokenFile, 4096)
		switch {
		case err != nil:
			fmt.Fprintf(c.errw, "executor: enrol: %v\n", err)
			return ExitRefused
		case info.Kind == fsx.Absent:
			fmt.Fprintf(c.errw, "executor: enrol: %s does not exist\n", tokenFile)
			return ExitRefused
		case info.UID != 0 || info.Mode&0o077 != 0:
			fmt.Fprintf(c.errw, "executor: enrol: %s is uid %d mode %04o; a token file must be root's and readable by nobody else (it holds the enrolment secret)\n", tokenFile, info.UID, info.Mode)
			return ExitRefused
		}
		raw = string(data)
	} else {
		// A terminal only: /dev/null is a character device too, and a
		// pipe or a script is asked nothing.
		if f, ok := stdin.(*os.File); ok {
			if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
				fmt.Fprint(c.errw, "paste the enrolment token, then Enter: ")
			}
		}
		line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintf(c.errw, "executor: enrol: reading the token: %v\n", err)
			return ExitRefused
		}
		raw = line
	}
	tok, err := wire.ParseToken(raw)
	if err != nil {
		fmt.Fprintf(c.errw, "executor: enrol: %v\n", err)
		return ExitRefused
	}
	held, _ := enrol.Held(c.state)
	if err := enrol.BeginWith(c.state, tok, enrol.Options{Replace: f.replace}); err != nil {
		fmt.Fprintf(c.errw, "executor: enrol: %v\n", err)
		var refused enrol.Refusal
		if errors.As(err, &refused) {
			return ExitRefused
		}
		return ExitFailed
	}
	if !c.json {
		fmt.Fprintf(c.out, "token %s, expires %s\ncontrol key pinned: %s\nbroker: %s (certificate sha256 %s)\n",
			tok.IDString(), tok.Expires.Local().Format(time.RFC3339), wire.KeyID(tok.ControlKey), tok.BrokerURL, tok.FingerprintHex())
		switch {
		case held != nil && f.replace:
			fmt.Fprintf(c.out, "this host is enrolled as %s: the new identity replaces it, and the control side revokes it in the same step\n", held.Name())
		case held != nil:
			fmt.Fprintf(c.out, "this host is enrolled as %s: it keeps that identity until a grant comes. A token for node %s enrols it as %s again; the control side refuses one that would make it another node unless %s is revoked (enrol with --replace revokes %s in the same step)\n",
				held.Name(), held.Node, held.Node, held.Node, held.Node)
		}
		fmt.Fprintln(c.out, "keys made; the agent takes the enrolment from here")
	}
	if past := clock.Since(tok.Expires); past > 0 {
		// Not refused here: the control side judges the expiry by its own
		// clock, which wrote it, and this machine's may be wrong.
		unit := time.Second
		if past >= time.Minute {
			unit = time.Minute
		}
		fmt.Fprintf(c.errw, "executor: enrol: this token's expiry (%s) passed %s ago by this machine's clock: the control side refuses it if its own clock says so too (mesh-control token create makes another)\n",
			tok.Expires.Local().Format(time.RFC3339), past.Round(unit))
	}
	deadline := clock.Deadline(c.wait)
	// Nothing can finish it while no executor serves the socket: said once
	// a moment has passed (the init may be starting it), not at the end
	// of --wait.
	looked := clock.Deadline(min(c.wait, 3*time.Second))
	var last string
	for {
		r, err := enrol.ReadResult(c.state)
		if err != nil {
			fmt.Fprintf(c.errw, "executor: enrol: %v\n", err)
			return ExitFailed
		}
		if r != nil && r.Token == tok.IDString() {
			if s := r.String(); s != last && !r.Final && !r.Claimed && r.Reason != "" && !c.json {
				fmt.Fprintln(c.errw, s)
				last = s
			}
			if r.Claimed {
				// Only the agent's word: the enrolment stays begun (the
				// message says until when), but waiting on would only
				// hide what it says.
				if c.json {
					c.print(r, "")
				} else {
					fmt.Fprintln(c.errw, r.String())
				}
				return ExitFailed
			}
			if r.Final {
				text := r.String() + "\n"
				code := 0
				if !r.Enrolled {
					code = ExitFailed
				}
				if c.json {
					c.print(r, "")
				} else if code == 0 {
					fmt.Fprint(c.out, text)
				} else {
					fmt.Fprint(c.errw, text)
				}
				return code
			}
		}
		nobody := false
		if clock.Past(looked) {
			nobody, looked = nobodyToFinish(c.state, c.socket), clock.Deadline(5*time.Second)
		}
		if clock.Past(deadline) || nobody {
			msg := "the enrolment is pending: the agent has not finished it (" + agentDiagnosis(c.state, c.socket) + "); it completes when it does — `mesh-executor status` shows it, `mesh-executor enrol --cancel` ends it"
			if r != nil && r.Reason != "" {
				msg += "; last: " + r.String()
			}
			fmt.Fprintln(c.errw, msg)
			c.print(map[string]any{"pending": true, "why": msg}, "") // --json: one value, exit 3 or not
			return exitEnrolPending
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// enrolCancel ends the pending enrolment on root's word.
func (c *command) enrolCancel(f enrolFlags) int {
	if f.replace || f.tokenFile != "" {
		fmt.Fprintln(c.errw, "executor: enrol: --cancel ends the pending enrolment; it takes no token and no --replace")
		return ExitRefused
	}
	token, err := enrol.Cancel(c.state)
	if err != nil {
		fmt.Fprintf(c.errw, "executor: enrol: --cancel: %v\n", err)
		return ExitFailed
	}
	stays := "this host stays hosted"
	if held, _ := enrol.Held(c.state); held != nil {
		stays = "this host stays " + held.Name()
	}
	// --json as rekey --cancel says it: whether one was cancelled, and
	// the token of the one that was.
	if token == "" {
		return c.print(map[string]any{"cancelled": false}, "no enrolment is pending; nothing to cancel ("+stays+")\n")
	}
	return c.print(map[string]any{"cancelled": true, "token": token}, fmt.Sprintf("the enrolment of token %s is cancelled; %s\n", token, stays))
}
