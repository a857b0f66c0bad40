package serve

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// LinesFile, in the executor's state directory, keeps the lines of the
// last declaration applied from the link, with its sequence and digest:
// the one the agent may hand over again (a connection broken before the
// verdict, the agent restarted), whose answer is then "applied already"
// with these lines instead of none. Only the last is kept: an older one is
// refused as a replay, never answered as a duplicate.
const LinesFile = "lines-link.json"

// maxKeptLines bounds what is kept: beyond it a report sent again says the
// first ones.
const maxKeptLines = 20000

type keptLines struct {
	Seq    uint64        `json:"seq"`
	Digest string        `json:"digest"`
	Lines  []shapes.Line `json:"lines"`
}

func keepLines(dir string, seq uint64, digest string, lines []shapes.Line) error {
	if len(lines) > maxKeptLines {
		lines = lines[:maxKeptLines]
	}
	b, err := json.Marshal(keptLines{Seq: seq, Digest: digest, Lines: lines})
	if err != nil {
		return err
	}
	return store.WriteFileAtomic(filepath.Join(dir, LinesFile), b)
}

// readKeptLines returns the kept lines of the declaration seq with digest,
// or nil when they are another's or none are kept.
func readKeptLines(dir string, seq uint64, digest string) []shapes.Line {
	b, err := os.ReadFile(filepath.Join(dir, LinesFile))
	if err != nil {
		return nil
	}
	var k keptLines
	if json.Unmarshal(b, &k) != nil || k.Seq != seq || k.Digest != digest {
		return nil
	}
	return k.Lines
}
