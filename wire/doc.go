// Package wire is everything that crosses a boundary: the signed envelope
// (COSE_Sign1, Ed25519, purpose and key id in the protected header), the
// agent↔executor protocol (one enumerated table of messages with their
// direction, the states they are allowed in and their size limits; framed
// CBOR, deterministic to write and strict to read), the registry of refusal
// codes, and the unix transport with its peer credentials.
//
// It decides nothing. Which uid may connect, which key is pinned, whether a
// sequence is new: all of that is the executor's, from its own
// configuration. No message here can carry a "verified" flag, a parsed
// declaration, a key, a sequence floor, a protected set or a node id for the
// executor to adopt: a declaration crosses as the envelope bytes exactly as
// published, and the executor verifies them itself.
package wire
