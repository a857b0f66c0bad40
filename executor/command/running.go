package command

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A program the executor starts runs in a process group of its own, and
// nothing ties it to the executor: killed (kill -9, a stop that ran past
// the launcher's timeout), the executor leaves it running. The next
// executor must not start the same step beside it — an action run twice
// at once, a second package manager on the first one's lock — nor kill it
// midway (a package half-installed). So each program started under a
// tracked context is noted in a directory of the state, a file for its
// process group, removed as it ends; and the next apply waits for what a
// dead executor left there (LeftRunning), up to the deadline each had,
// then kills what is left of its group, as the executor would have.
//
// A kill between the program's start and its note leaves it unnoted: the
// note is written right after the start, a window of a system call or two.

type trackKey struct{}

// Tracked is ctx with every program Run or Action starts under it noted
// in dir while it runs.
func Tracked(ctx context.Context, dir string) context.Context {
	return context.WithValue(ctx, trackKey{}, dir)
}

// leftProgram is the note of one program's process group. A later
// format is read as far as this release knows it.
type leftProgram struct {
	Format int `json:"format"`
	PID    int `json:"pid"`
	// Start is /proc/PID/stat's starttime: a pid used again since is
	// another process, started later.
	Start    uint64    `json:"start"`
	Argv     []string  `json:"argv"`
	Deadline time.Time `json:"deadline"`
}

// note records pid's group in ctx's directory, if it is tracked; done
// removes the note once the group has ended.
func note(ctx context.Context, pid int, argv []string, deadline time.Time) (done func()) {
	dir, _ := ctx.Value(trackKey{}).(string)
	if dir == "" {
		return func() {}
	}
	start, err := procStart(pid)
	if err != nil {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return func() {}
	}
	if len(argv) > 8 {
		argv = argv[:8]
	}
	b, _ := json.Marshal(leftProgram{Format: 1, PID: pid, Start: start, Argv: argv, Deadline: deadline.UTC()})
	p := filepath.Join(dir, strconv.Itoa(pid))
	if os.WriteFile(p, b, 0o600) != nil {
		return func() {}
	}
	return func() { os.Remove(p) }
}

// ErrStopped is LeftRunning's answer when stop closed while it waited.
var ErrStopped = errors.New("asked to stop")

// LeftRunning waits for the programs an executor before this one started
// and left running, as noted in dir: each until its group has ended, or,
// past the deadline it had, its group killed. say is told of each it
// waits for and each it kills. A closed stop ends the wait (ErrStopped),
// the notes kept for the next. Nothing noted, it returns at once.
func LeftRunning(dir string, stop <-chan struct{}, say func(msg string, args ...any)) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("command: programs left running: %w", err)
	}
	for _, ent := range ents {
		p := filepath.Join(dir, ent.Name())
		l, ok := readNote(p)
		if !ok {
			os.Remove(p) // cut short as it was written: its program had only begun
			continue
		}
		// The deadline as the runtime keeps it (a context's), which a
		// node's clock set off by hours does not move.
		past, cancel := context.WithDeadline(context.Background(), l.Deadline)
		said, again := false, true
		for {
			members := groupOf(l)
			if len(members) == 0 && again {
				// Once more, a moment later: /proc is listed before it is
				// read, and a child forked between the two, its parent
				// gone by the read, is not seen.
				again = false
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if len(members) == 0 {
				break
			}
			if !said {
				said = true
				say("a program an executor before this one started is still running: waited for before this apply, up to its deadline", "pid", l.PID, "argv", l.Argv, "deadline", l.Deadline)
			}
			if past.Err() != nil {
				for _, m := range members {
					syscall.Kill(m, syscall.SIGKILL)
				}
				say("a program an executor before this one left running passed its deadline: its process group was killed", "pid", l.PID, "argv", l.Argv)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			select {
			case <-stop:
				cancel()
				return ErrStopped
			case <-past.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		cancel()
		os.Remove(p)
	}
	return nil
}

// readNote reads one note; false when it does not read (cut short as it
// was written) or names no program.
func readNote(p string) (leftProgram, bool) {
	var l leftProgram
	b, err := os.ReadFile(p)
	if err != nil || json.Unmarshal(b, &l) != nil || l.PID <= 1 {
		return leftProgram{}, false
	}
	return l, true
}

// groupOf lists the processes of l's process group that are l's: in the
// group its program led, started no earlier than it. A process now at
// the leader's pid that started later is another's, and so is its group.
func groupOf(l leftProgram) []int {
	if start, err := procStart(l.PID); err == nil && start != l.Start {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil || len(f) < 20 {
			continue
		}
		pgrp, _ := strconv.Atoi(f[2])
		start, _ := strconv.ParseUint(f[19], 10, 64)
		if pgrp == l.PID && start >= l.Start && f[0] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

// procStat is /proc/PID/stat's fields after the command's name: state
// first (field 3), starttime at index 19 (field 22).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// procStart is pid's starttime (clock ticks after boot).
func procStart(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}
