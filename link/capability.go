package link

import (
	"fmt"
	"strconv"
)

// Capability is the version of the link's contract this build speaks:
// its subjects and streams, its messages and their headers, and what a
// declaration may hold that a node must read. It is raised by one when a
// release changes what the other side has to understand, and only then:
// releases that change nothing of the link keep it. The releases before
// it was carried are capability 0 (a message without CapabilityHeader, a
// heartbeat without "capability").
//
// The version skew policy (docs/operations.md) is in its terms: a control
// side and a node run together when their capabilities differ by one at
// most (Skew), whichever was upgraded first. Each side refuses the other
// outside it, saying both numbers and which to upgrade (CheckNode,
// CheckControl): the control side a declaration or an enrolment for such a
// node, the agent a declaration from such a control side.
const Capability = 1

// Skew is how far apart a control side's and a node's capabilities may be.
const Skew = 1

// CapabilityHeader carries the sender's Capability on what has a body
// that an earlier release reads strictly, or that is signed as it was
// before the number existed: the declarations and notices the control
// side publishes, and the agent's enrolment request. It is a header, not
// in the signed body, because a release before it refuses a field it
// does not know (the executor's declaration, the control side's
// enrolment request). Unsigned, it can only make a side refuse — as a
// broker can by dropping the message — never make one accept.
const CapabilityHeader = "Mesh-Capability"

// HeaderCapability reads a CapabilityHeader value: absent is 0 (a release
// before the header); anything but a decimal number is an error.
func HeaderCapability(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("the %s header %q is not a capability version", CapabilityHeader, v)
	}
	return n, nil
}

// CapabilityValue is Capability as CapabilityHeader carries it.
var CapabilityValue = strconv.Itoa(Capability)

// SkewError is a peer outside the version skew policy: what the side that
// refuses says, with both numbers and what to upgrade.
type SkewError struct {
	// Peer is "node NAME" or "the control side"; Self names the side that
	// refuses ("this control side", "this agent").
	Peer, Self string
	// PeerCapability and SelfCapability are the two capabilities.
	PeerCapability, SelfCapability int
}

func (e *SkewError) Error() string {
	upgrade := "upgrade " + e.Peer
	if e.PeerCapability > e.SelfCapability {
		upgrade = "upgrade " + e.Self
	}
	if e.PeerCapability == 0 {
		return fmt.Sprintf("%s speaks link capability 0 (a release before the capability was carried); %s speaks %d, and the two run together within %d of each other: %s (docs/operations.md, Version skew)",
			e.Peer, e.Self, e.SelfCapability, Skew, upgrade)
	}
	return fmt.Sprintf("%s speaks link capability %d; %s speaks %d, and the two run together within %d of each other: %s (docs/operations.md, Version skew)",
		e.Peer, e.PeerCapability, e.Self, e.SelfCapability, Skew, upgrade)
}

// checkSkew is the policy itself: peer against self, one place for both
// sides.
func checkSkew(peer string, peerCap int, self string, selfCap int) error {
	if d := peerCap - selfCap; d > Skew || -d > Skew {
		return &SkewError{Peer: peer, Self: self, PeerCapability: peerCap, SelfCapability: selfCap}
	}
	return nil
}

// CheckNode is the control side's rule for a node whose agent last said
// capability c (0: never said it).
func CheckNode(node string, c int) error {
	return checkSkew("node "+node, c, "this control side", Capability)
}

// CheckControl is the agent's rule for a control side that said
// capability c on what it published (HeaderCapability).
func CheckControl(c int) error {
	return checkSkew("the control side", c, "this agent", Capability)
}

// RotationHeader carries, beside each declaration and plan request the
// control side publishes (and in statements alone, StatementsHeader), the
// statements of the control key's rotations addressed to that node and
// still kept (wire.EncodeRotationChain), oldest first: a node that was
// away through a rotation takes it with the first message signed by the
// new key. Each statement is signed, twice; the header only carries them.
const RotationHeader = "Mesh-Key-Rotation"

// StatementsHeader marks a message on a node's notice subject that is not
// a notice but the control side's statements alone, no body: the control
// key's rotations (RotationHeader) and the broker certificates' statement
// (PinsHeader), either or both. Sent to a node whose heartbeat says it has
// not taken them while nothing else carries them to it — no declaration on
// its subject to sign again (never declared to, or emptied by its
// re-enrolment), or one held on sealed content — so that it stops trusting
// a retired control key, or accepts the broker's next certificate, within
// a heartbeat rather than at its next declaration. The agent only carries
// them to be judged (the executor the rotations, its own check under the
// control key the statement). An agent of a release before it drops the
// message (it names no sequence).
const StatementsHeader = "Mesh-Statements"

// PinsHeader carries, beside each declaration and plan request (and in
// statements alone, StatementsHeader), the control side's newest statement
// of the broker certificates a node accepts (a wire.BrokerPins envelope,
// base64), once the broker's certificate has been rotated: signed by the
// control key, the header only carries it.
const PinsHeader = "Mesh-Broker-Pins"

// RekeyHeader marks a message on a node's notice subject that is not a
// notice but the control side's answer to the node's rekey request (a
// wire.RekeyAnswer envelope as the body; the header's value is the
// request's nonce). Signed by the control key, the agent only carries it
// to the executor, which alone judges it.
const RekeyHeader = "Mesh-Rekey"

// UserJWTHeader marks a message on a node's notice subject that is not a
// notice either: the node's broker credential renewed (its body a
// wire.UserJWT envelope), sent when its heartbeat says it signs in with a
// JWT the nodes' account key in force did not issue.
const UserJWTHeader = "Mesh-User-JWT"
