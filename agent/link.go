package agent

import (
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// LinkError is a failure to link, saying which side refused and why:
//
//	broker unreachable at <url>: …
//	the broker at <url> did not answer the connect in time: …
//	broker certificate fingerprint mismatch: got X, pinned Y
//	authorization refused by the broker at <url>: …
type LinkError struct {
	Reason string // "unreachable", "fingerprint", "authorization"
	Msg    string
	Err    error
}

func (e *LinkError) Error() string { return e.Msg }
func (e *LinkError) Unwrap() error { return e.Err }

// The reasons of a LinkError.
const (
	LinkUnreachable   = "unreachable"
	LinkFingerprint   = "fingerprint"
	LinkAuthorization = "authorization"
)

// pinWatch keeps the last fingerprint mismatch seen by the handshake, so
// the cause stays legible whatever the NATS client does with the TLS error.
type pinWatch struct {
	mu   sync.Mutex
	last *link.PinError
	at   time.Time
}

func (p *pinWatch) note(e *link.PinError) {
	p.mu.Lock()
	p.last, p.at = e, clock.Now()
	p.mu.Unlock()
}

func (p *pinWatch) since(t time.Time) *link.PinError {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last != nil && !p.at.Before(t) {
		return p.last
	}
	return nil
}

// explain turns what the NATS client returned into a LinkError.
func explain(url string, err error, pin *link.PinError) *LinkError {
	var pe *link.PinError
	if errors.As(err, &pe) {
		pin = pe
	}
	if pin != nil {
		return &LinkError{Reason: LinkFingerprint, Msg: pin.Error() + " (at " + url + "; the broker was sent nothing)", Err: pin}
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		return &LinkError{Reason: LinkAuthorization, Msg: fmt.Sprintf("authorization refused by the broker at %s: %v (it does not know this node's NKey, or revoked it)", url, err), Err: err}
	}
	var op *net.OpError
	if errors.Is(err, nats.ErrTimeout) || strings.Contains(err.Error(), "expected 'PONG'") || errors.As(err, &op) && op.Op == "read" && op.Timeout() {
		// The connect went out (the connection was made: a read timed
		// out) and no answer came in time: nothing came,
		// or a broker sent its own first ping before answering (an
		// external nats-server does 2 s after the connect; the control
		// side's embedded broker only at its ping interval). A control
		// side holds a node's connect while it has not read its registry
		// (starting), rather than refuse it.
		return &LinkError{Reason: LinkUnreachable, Msg: fmt.Sprintf("the broker at %s did not answer the connect in time: %v (a control side starting holds a node's connect until it has read its registry; or the broker is busy)", url, err), Err: err}
	}
	if errors.Is(err, nats.ErrNoServers) {
		// The NATS client keeps the cause to itself; ask the network.
		if u, perr := neturl.Parse(url); perr == nil {
			c, derr := net.DialTimeout("tcp", u.Host, 2*time.Second)
			if derr != nil {
				err = derr
			} else {
				c.Close()
			}
		}
	}
	return &LinkError{Reason: LinkUnreachable, Msg: fmt.Sprintf("broker unreachable at %s: %v", url, err), Err: err}
}

// linkOptions are the options every connection of this node's identity
// uses: its name (which asks for its layout of subjects), TLS pinned
// inside the handshake, its NKey, its own inbox prefix (the only subjects
// it may subscribe to).
func linkOptions(id *Identity, pins *pinWatch) []nats.Option {
	name := "mesh-agent/" + id.Node
	if id.Layout == link.LayoutByNode {
		name += " " + link.LayoutTag
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.Secure(link.PinnedTLSSet(id.Pins, pins.note)),
		nats.CustomInboxPrefix(id.Subjects.Inbox),
		nats.Timeout(link.ConnectTimeout),
	}
	switch {
	case signsInByJWT(id.userJWT):
		// A broker in operator mode: the JWT is the credential, the
		// NKey's signature over the nonce proves it is this node's. Read
		// at each connection: the control side may have renewed it.
		opts = append(opts, nats.UserJWT(func() (string, error) { return id.credential(), nil }, id.nkey.Sign))
	case id.userJWT != "":
		// The grant's user JWT rides as the connect token beside the NKey
		// and its signature over the nonce (see control's registryAuth).
		opts = append(opts, nats.Nkey(id.nkeyPublic, id.nkey.Sign), nats.Token(id.userJWT))
	default:
		opts = append(opts, nats.Nkey(id.nkeyPublic, id.nkey.Sign))
	}
	return opts
}

// signsInByJWT says whether a grant's user JWT is for a broker in NATS
// operator mode: issued on behalf of the node's own account (its issuer
// account), which only such a broker resolves. The control side issues
// that form only when its broker is one (control.UserJWT); any other
// broker takes the NKey, and the JWT beside it as the connect token.
func signsInByJWT(token string) bool {
	if token == "" {
		return false
	}
	uc, err := jwt.DecodeUserClaims(token)
	return err == nil && uc.IssuerAccount != ""
}

// Dial connects once with id's identity: the broker certificate pinned,
// the node's NKey, its inbox prefix; extra options after those. A failure
// is a *LinkError. Tests and tools use it; the agent's own link adds
// reconnection and its handlers (see Run).
func Dial(id *Identity, extra ...nats.Option) (*nats.Conn, error) {
	pins := &pinWatch{}
	start := clock.Now()
	nc, err := nats.Connect(id.BrokerURL, append(linkOptions(id, pins), extra...)...)
	if err != nil {
		return nil, explain(id.BrokerURL, err, pins.since(start))
	}
	return nc, nil
}
