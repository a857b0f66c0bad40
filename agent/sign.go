package agent

import "github.com/nox-mesh/nox-mesh-host/link"

// Sign signs data with the node's NKey, for link.SignatureHeader.
func (id *Identity) Sign(data []byte) (string, error) { return link.Sign(id.nkey, data) }
