package serve

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// LinesFile, in the executor's state directory, keeps the lines and the
// outcome of the last declaration applied from the link, with its
// sequence and digest:
// the one the agent may hand over again (a connection broken before the
// verdict, the agent restarted), whose answer is then "applied already"
// with these lines instead of none. Only the last is kept: an older one is
// refused as a replay, never answered as a duplicate.
const LinesFile = "lines-link.json"

// maxKeptLines bounds what is kept: beyond it a report sent again says the
// first ones.
const maxKeptLines = 20000

type keptLines struct {
	Seq    uint64 `json:"seq"`
	Digest string `json:"digest"`
	// Outcome is the apply's ("": kept by a release before the field).
	// Not the executor's last outcome: a reconcile since (a start's)
	// applied the same declaration again and found it unchanged.
	Outcome shapes.Outcome `json:"outcome,omitempty"`
	Lines   []shapes.Line  `json:"lines"`
}

func keepLines(dir string, seq uint64, digest string, rep *shapes.Report) error {
	lines := rep.Lines
	if len(lines) > maxKeptLines {
		lines = lines[:maxKeptLines]
	}
	b, err := json.Marshal(keptLines{Seq: seq, Digest: digest, Outcome: rep.Outcome, Lines: lines})
	if err != nil {
		return err
	}
	return store.WriteFileAtomic(filepath.Join(dir, LinesFile), b)
}

// readKeptLines returns what was kept of the apply of the declaration seq
// with digest, or nil when it is another's or none is kept.
func readKeptLines(dir string, seq uint64, digest string) *keptLines {
	b, err := os.ReadFile(filepath.Join(dir, LinesFile))
	if err != nil {
		return nil
	}
	var k keptLines
	if json.Unmarshal(b, &k) != nil || k.Seq != seq || k.Digest != digest {
		return nil
	}
	return &k
}
