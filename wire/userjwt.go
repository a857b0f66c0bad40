package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// PurposeUserJWT: a node's broker credential renewed by the control
// plane — the user JWT a broker in NATS operator mode signs the node in
// with, issued by the nodes' account key that is next (its rotation). The
// agent takes it only under the control key: a JWT the broker made up
// would lock the node out of its own link.
const PurposeUserJWT Purpose = "application/nox-mesh.user-jwt+cose"

// MaxUserJWT bounds a user JWT statement's envelope (a JWT with a node's
// permissions is about 1.5 KiB).
const MaxUserJWT = 16 << 10

// UserJWT is the statement: the JWT for one node's enrolment.
type UserJWT struct {
	Node      string    `json:"node"`
	Enrolment string    `json:"enrolment"`
	JWT       string    `json:"jwt"`
	Issued    time.Time `json:"issued"`
}

// ParseUserJWT decodes a statement strictly.
func ParseUserJWT(payload []byte) (*UserJWT, error) {
	var u UserJWT
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		return nil, fmt.Errorf("user jwt: %w", err)
	}
	if u.Node == "" || u.Enrolment == "" || u.JWT == "" {
		return nil, errors.New("user jwt: a node, an enrolment and a JWT are required")
	}
	return &u, nil
}
