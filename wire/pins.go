package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// PurposeBrokerPins: the certificates of the broker a node may accept,
// as the control plane says them — how a broker's certificate is
// rotated: the new one announced beside the old, then the old dropped.
const PurposeBrokerPins Purpose = "application/nox-mesh.broker-pins+cose"

// MaxBrokerPins bounds the certificates one statement names.
const MaxBrokerPins = 4

// BrokerPins is the statement: the fingerprints (SHA-256 of each
// certificate's DER, hex) a node accepts from now on, in place of those it
// pinned at enrolment or took from an earlier statement (Seq orders them).
type BrokerPins struct {
	Seq    uint64    `json:"seq"`
	Pins   []string  `json:"pins"`
	Issued time.Time `json:"issued"`
}

// ParseBrokerPins decodes a statement strictly.
func ParseBrokerPins(payload []byte) (*BrokerPins, error) {
	var p BrokerPins
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("broker pins: %w", err)
	}
	if p.Seq == 0 || len(p.Pins) == 0 || len(p.Pins) > MaxBrokerPins {
		return nil, fmt.Errorf("broker pins: a sequence and 1 to %d fingerprints are required", MaxBrokerPins)
	}
	for _, f := range p.Pins {
		if b, err := hex.DecodeString(f); err != nil || len(b) != 32 || hex.EncodeToString(b) != f {
			return nil, errors.New("broker pins: a fingerprint is not a SHA-256 in lower-case hex")
		}
	}
	return &p, nil
}
