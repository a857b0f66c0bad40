package store

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// historyFile keeps, one JSON object a line, the applies that did
// something (shapes.Activity): what the node reports it did while its
// link was down. Applies that changed nothing are not kept (a drift
// reconcile every ten minutes would fill it with nothing).
const historyFile = "history.jsonl"

// History bounds: past historyMaxBytes the file is cut to its newest
// historyKeep lines (an activity is 150–250 bytes), so it stays a few tens
// of kilobytes whatever the node does.
const (
	historyMaxBytes = 64 << 10
	historyKeep     = 200
)

// historyFormat is the history's format, carried by each line (a line of
// the releases before the field, without it, is format 1): the lines are
// appended one by one, by whichever release runs, so each says its own.
const historyFormat = 1

// historyLine is a line of the history: an activity and its format. The
// releases before the field read a line as the activity alone, passing
// the format over.
type historyLine struct {
	Format int `json:"format,omitempty"`
	shapes.Activity
}

// note appends an activity to the history. Like SaveReport it is a
// convenience, not a record: not synced, written after the apply; a line
// cut short by a crash is skipped when read, so it never says more than
// happened.
func (s *Store) note(a shapes.Activity) error {
	line, err := json.Marshal(historyLine{Format: historyFormat, Activity: a})
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, historyFile)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("store: history: %w", err)
	}
	_, err = f.Write(append(line, '\n'))
	fi, serr := f.Stat()
	f.Close()
	if err != nil {
		return fmt.Errorf("store: history: %w", err)
	}
	if serr == nil && fi.Size() > historyMaxBytes {
		return s.trimHistory(p)
	}
	return nil
}

// trimHistory keeps the newest historyKeep lines.
func (s *Store) trimHistory(p string) error {
	lines := readLines(p)
	if len(lines) > historyKeep {
		lines = lines[len(lines)-historyKeep:]
	}
	return WriteFileAtomic(p, append(bytes.Join(lines, []byte("\n")), '\n'))
}

func readLines(p string) [][]byte {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	return out
}

// History returns the activities kept in dir from `from` to `to` (inclusive),
// oldest first, at most max of the newest, and how many more there were.
// It reads the file alone, without the store's lock: a line is whole or
// skipped. Lines of a later format are left out, and the error says how
// many, with both formats: the rest is still returned.
func History(dir string, from, to time.Time, max int) (acts []shapes.Activity, more int, err error) {
	p := filepath.Join(dir, historyFile)
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	later, newest := 0, 0
	for _, line := range readLines(p) {
		var a historyLine
		if json.Unmarshal(line, &a) != nil {
			continue // cut short by a crash: says nothing
		}
		if a.Format > historyFormat {
			later++
			if a.Format > newest {
				newest = a.Format
			}
			continue
		}
		if a.At.Before(from) || a.At.After(to) {
			continue
		}
		acts = append(acts, a.Activity)
	}
	if later > 0 {
		err = fmt.Errorf("store: %s holds lines in format v%d, written by a later release (%d), left out; this executor reads formats up to v%d", historyFile, newest, later, historyFormat)
	}
	if len(acts) > max {
		more = len(acts) - max
		acts = acts[more:]
	}
	return acts, more, err
}
