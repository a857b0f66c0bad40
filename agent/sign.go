package agent

// Sign signs data with the node's NKey, for link.SignatureHeader.
func (id *Identity) Sign(data []byte) (string, error) { return id.signer.Sign(data), nil }
