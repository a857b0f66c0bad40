package wire

import (
	"errors"
	"fmt"
)

// Code is why the executor refused, as it crosses the socket: stable
// numbers, one registry, each mapped back to a sentinel on the agent's side
// so callers use errors.Is.
type Code uint16

// The codes. Numbers are stable and never reused.
const (
	CodeNone        Code = 0
	CodeProtocol    Code = 1  // unknown kind, wrong direction, not allowed in this state
	CodeTooLarge    Code = 2  // frame over the kind's limit
	CodeMalformed   Code = 3  // the body does not decode strictly
	CodeBusy        Code = 4  // too many connections or requests
	CodeNotEnrolled Code = 5  // no pinned key: this host takes no declaration from the link
	CodeWrongKey    Code = 6  // signed by another key
	CodeSignature   Code = 7  // the signature does not verify
	CodePurpose     Code = 8  // signed for another purpose (a grant passed off as a declaration)
	CodeAddress     Code = 9  // addressed to another node or enrolment
	CodeReplay      Code = 10 // a sequence not newer than the last applied
	CodeConflict    Code = 11 // the same sequence with other bytes
	CodeAction      Code = 12 // an action over the link
	CodeInvalid     Code = 13 // the declaration itself is refused (shapes, engine)
	CodeInternal    Code = 14 // the executor failed on its own side
)

// Sentinels, one per code, returned wrapped by the agent's side.
var (
	ErrProtocol    = errors.New("wire: protocol violation")
	ErrTooLarge    = errors.New("wire: frame too large")
	ErrDecode      = errors.New("wire: malformed body")
	ErrBusy        = errors.New("wire: executor busy")
	ErrNotEnrolled = errors.New("wire: executor not enrolled")
	ErrAddress     = errors.New("wire: addressed elsewhere")
	ErrReplay      = errors.New("wire: replayed or old sequence")
	ErrConflict    = errors.New("wire: same sequence, other bytes")
	ErrAction      = errors.New("wire: action over the link")
	ErrInvalid     = errors.New("wire: declaration refused")
	ErrInternal    = errors.New("wire: executor internal error")
)

var registry = map[Code]struct {
	name     string
	sentinel error
}{
	CodeProtocol:    {"protocol", ErrProtocol},
	CodeTooLarge:    {"too-large", ErrTooLarge},
	CodeMalformed:   {"malformed", ErrDecode},
	CodeBusy:        {"busy", ErrBusy},
	CodeNotEnrolled: {"not-enrolled", ErrNotEnrolled},
	CodeWrongKey:    {"wrong-key", ErrWrongKey},
	CodeSignature:   {"bad-signature", ErrBadSignature},
	CodePurpose:     {"wrong-purpose", ErrWrongPurpose},
	CodeAddress:     {"address", ErrAddress},
	CodeReplay:      {"replay", ErrReplay},
	CodeConflict:    {"conflict", ErrConflict},
	CodeAction:      {"action", ErrAction},
	CodeInvalid:     {"invalid", ErrInvalid},
	CodeInternal:    {"internal", ErrInternal},
}

// Passing says whether a refusal with this code is of the executor's own
// side at that moment — its store locked by a rescue, its disk full, its
// state unreadable, too many requests — and not of the declaration: the
// executor moved no floor for it, and the agent hands it over again later
// rather than settling it as refused.
func (c Code) Passing() bool { return c == CodeInternal || c == CodeBusy }

func (c Code) String() string {
	if c == CodeNone {
		return "none"
	}
	if r, ok := registry[c]; ok {
		return r.name
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

func (c Code) sentinel() error {
	if r, ok := registry[c]; ok {
		return r.sentinel
	}
	return nil
}

// Refusal is a code with the reason, as a Go error that unwraps to the
// code's sentinel.
type Refusal struct {
	Code   Code
	Reason string
}

func (r *Refusal) Error() string { return r.Reason }

// Unwrap maps the code to its sentinel.
func (r *Refusal) Unwrap() error { return r.Code.sentinel() }

// CodeOf returns the code of a refusal, CodeInternal for any other error.
func CodeOf(err error) Code {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Code
	}
	for c, reg := range registry {
		if errors.Is(err, reg.sentinel) {
			return c
		}
	}
	return CodeInternal
}
