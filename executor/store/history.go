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
const historyFile = HistoryFile

// HistoryFile is the history's name in the state directory.
const HistoryFile = "history.jsonl"

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
//
// N counts the activities, one more each line (0: a line of a release
// before it): what the agent has reported upward is a count, not a time,
// so a clock set back never hides an activity from it and one set
// forward never repeats one. A release that passes the field over reads
// the line as it did, so the format stays 1.
//
// Begun names, in a note of an apply cut short (TriggerInterrupted), the
// journal's record of its begin, and the activity's Part which of its
// notes this is: a note written whose "noted" record was not (a full
// disk, a cut between the two) is found by them and not made again.
type historyLine struct {
	Format int    `json:"format,omitempty"`
	N      uint64 `json:"n,omitempty"`
	Begun  uint64 `json:"begun,omitempty"`
	shapes.Activity
}

// note appends an activity to the history. Like SaveReport it is a
// convenience, not a record: not synced, written after the apply; a line
// cut short by a crash is skipped when read, so it never says more than
// happened.
func (s *Store) note(a shapes.Activity) error {
	return s.noteLine(historyLine{Activity: a})
}

// noteLine appends h, numbered next, to the history.
func (s *Store) noteLine(h historyLine) error {
	p := filepath.Join(s.dir, historyFile)
	n, _ := newestIn(readLines(p))
	h.Format, h.N = historyFormat, n+1
	line, err := json.Marshal(h)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("store: history: %w", err)
	}
	// A tail a crash or a power cut left unended (a line cut short, or the
	// zeros of blocks allocated and never written) is ended first: the
	// line appended to it would be read as part of it, and skipped.
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			line = append([]byte{'\n'}, line...)
		}
	}
	_, err = f.Write(append(line, '\n'))
	fi, serr := f.Stat()
	f.Close()
	if err != nil {
		return fmt.Errorf("store: history: %w", err)
	}
	if serr == nil && fi.Size() > historyMaxBytes {
		// The line is kept whether the history can be cut to its newest
		// or not (a full disk): the next note tries again, and a note
		// said failed when it was made would be made twice.
		_ = s.trimHistory(p)
	}
	return nil
}

// notedParts are the notes of applies cut short the history holds, by
// the journal's begin record and part.
func notedParts(dir string) map[[2]uint64]bool {
	out := map[[2]uint64]bool{}
	for _, line := range readLines(filepath.Join(dir, historyFile)) {
		var h struct {
			Begun uint64 `json:"begun"`
			Part  int    `json:"part"`
		}
		if json.Unmarshal(line, &h) == nil && h.Begun > 0 {
			out[[2]uint64{h.Begun, uint64(h.Part)}] = true
		}
	}
	return out
}

// SyncHistory makes the history in dir durable, its directory's entry
// with it. The history is written without a sync, after each apply; a
// count is synced before it is said to anyone who keeps it (the agent):
// a line a power cut took would otherwise give its count to the next
// activity, which the agent, holding the count, would take for reported.
func SyncHistory(dir string) error {
	for _, p := range []string{filepath.Join(dir, historyFile), dir} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("store: history: %w", err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("store: history: %w", err)
		}
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

// newestIn is the count of the newest activity among lines (0: none
// counted), and the count of the oldest counted one.
func newestIn(lines [][]byte) (newest, oldest uint64) {
	for _, line := range lines {
		var a struct {
			N uint64 `json:"n"`
		}
		if json.Unmarshal(line, &a) != nil || a.N == 0 {
			continue
		}
		newest = max(newest, a.N)
		if oldest == 0 || a.N < oldest {
			oldest = a.N
		}
	}
	return newest, oldest
}

// Newest is the count of the newest activity kept in dir (0: none), read
// without the store's lock, as History is.
func Newest(dir string) uint64 {
	n, _ := newestIn(readLines(filepath.Join(dir, historyFile)))
	return n
}

// Counted is a part of the history, by count: the activities after one
// count up to another, those a filter keeps.
type Counted struct {
	// Acts are the activities kept, oldest first: the oldest max of them
	// for Since, the newest for Newer (their Lost counts the older).
	Acts []shapes.Activity
	// Last is the count this part reaches: the next asks after it. Those
	// the filter passed over are reached all the same.
	Last uint64
	// Lost counts the activities after the count asked for that the
	// history no longer holds (cut to its bound meanwhile), or that a
	// bound on this part left out: each said as a number, never silently.
	Lost uint64
}

// Since returns, oldest first, at most max of the activities counted after
// `after` and up to `upto`, those keep keeps; Last is the count of the last
// one looked at, so that the next call goes on from there. A history
// started anew (its newest count below `after`: a store lost and made
// again) is read from its start.
func Since(dir string, after, upto uint64, max int, keep func(shapes.Activity) bool) (Counted, error) {
	return counted(dir, after, upto, max, keep, false)
}

// Newer is Since keeping the newest max instead, and counting the older
// ones left out in Lost: what a reconnect's report carries.
func Newer(dir string, after, upto uint64, max int, keep func(shapes.Activity) bool) (Counted, error) {
	return counted(dir, after, upto, max, keep, true)
}

func counted(dir string, after, upto uint64, max int, keep func(shapes.Activity) bool, newest bool) (Counted, error) {
	out := Counted{Last: after}
	lines := readLines(filepath.Join(dir, historyFile))
	top, oldest := newestIn(lines)
	if top < after {
		after, out.Last = 0, 0 // the history was started anew
	}
	if oldest > after+1 {
		out.Lost = oldest - after - 1 // cut from the history: how many of them were kept is not known
	}
	later := 0
	for _, raw := range lines {
		var a historyLine
		if json.Unmarshal(raw, &a) != nil {
			continue
		}
		if a.Format > historyFormat {
			later++
			continue
		}
		if a.N <= after || a.N > upto {
			continue
		}
		if !newest && len(out.Acts) == max {
			break
		}
		out.Last = a.N
		if keep == nil || keep(a.Activity) {
			out.Acts = append(out.Acts, a.Activity)
		}
	}
	if newest && len(out.Acts) > max {
		out.Lost += uint64(len(out.Acts) - max)
		out.Acts = out.Acts[len(out.Acts)-max:]
	}
	if later > 0 {
		return out, fmt.Errorf("store: %s holds %d lines written by a later release, left out; this executor reads formats up to v%d", historyFile, later, historyFormat)
	}
	return out, nil
}
