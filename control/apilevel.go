package control

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API level 2 (nats-server 2.12) brings the two stream settings
// the control side asks for where the server knows them: the heartbeats'
// async persist mode (heartbeatsAsWanted) and atomic batches into the
// declarations and the registry (DeclareAll). A server before it takes a
// stream's configuration with them and leaves them out, so they are asked
// only of one that knows them — else every command would update the
// stream again, each update a write of its metadata.

// knowsLevel2 says whether the server holding the stream of info knows
// API level 2: every stream's information says its server's level (from
// nats-server 2.11; none before).
func knowsLevel2(info *jetstream.StreamInfo) bool {
	if info == nil {
		return false
	}
	level, _ := strconv.Atoi(info.Config.Metadata["_nats.level"])
	return level >= 2
}

// serverKnowsLevel2 is knowsLevel2 for a stream not made yet: the server
// this client is connected to, by its version.
func (c *Client) serverKnowsLevel2() bool {
	v := strings.TrimPrefix(c.NC.ConnectedServerVersion(), "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 2 || major == 2 && minor >= 12
}
