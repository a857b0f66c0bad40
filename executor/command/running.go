package command

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	Start uint64 `json:"start"`
	// Boot is the kernel's boot id the program ran under. The notes are
	// on the disk and outlive a reboot, which ends every program; their
	// pids and start times are another boot's, and a group of this boot
	// at the same pid would be taken for the program's and killed. A
	// note without one (the first release's) is judged by its time.
	Boot string `json:"boot,omitempty"`
	// Stop is how the executor stops the program at its deadline, and so
	// how the next one does: "" its whole group (Run); stopGentle the
	// program alone, SIGTERM then SIGKILL after gentleGrace, never its
	// group (a package manager: dpkg finishes its transaction);
	// stopAction its whole group, and what is left of the group as soon
	// as the program itself exits (Action).
	Stop     string    `json:"stop,omitempty"`
	Argv     []string  `json:"argv"`
	Deadline time.Time `json:"deadline"`
}

const (
	stopGentle = "gentle"
	stopAction = "action"
)

// note records pid's group in ctx's directory, if it is tracked; done
// removes the note once the group has ended. how is the note's Stop.
func note(ctx context.Context, pid int, argv []string, deadline time.Time, how string) (done func()) {
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
	b, _ := json.Marshal(leftProgram{Format: 1, PID: pid, Start: start, Boot: bootID(), Stop: how, Argv: argv, Deadline: deadline.UTC()})
	p := filepath.Join(dir, strconv.Itoa(pid))
	if os.WriteFile(p, b, 0o600) != nil {
		return func() {}
	}
	return func() { os.Remove(p) }
}

// ErrStopped is LeftRunning's answer when stop closed while it waited.
var ErrStopped = errors.New("asked to stop")

// outlivesKill is how long a group killed at its deadline may take to be
// gone before LeftRunning gives up on it: a process in the kernel's
// uninterruptible sleep (a hung NFS mount, a failing disk) outlives
// SIGKILL, and the apply would wait for it, holding the store, for good.
var outlivesKill = 30 * time.Second

// signal is syscall.Kill; a test makes a group no signal ends.
var signal = syscall.Kill

// LeftRunning waits for the programs an executor before this one started
// and left running, as noted in dir: each until its group has ended, or,
// past the deadline it had, stopped as the executor would have stopped
// it (leftProgram.Stop). say is told of each it waits for and each it
// stops, once. A closed stop ends the wait (ErrStopped), the notes kept
// for the next; a group that outlives its kill by outlivesKill ends it
// too, with an error naming it. A note of another boot names nothing
// running and is dropped. Nothing noted, it returns at once.
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
		if !ok || ofAnotherBoot(l, p) {
			// Cut short as it was written (its program had only begun),
			// or of a boot whose programs all ended with it.
			os.Remove(p)
			continue
		}
		if err := waitLeft(l, stop, say); err != nil {
			return err
		}
		os.Remove(p)
	}
	return nil
}

// waitLeft is LeftRunning for one note.
func waitLeft(l leftProgram, stop <-chan struct{}, say func(msg string, args ...any)) error {
	// The deadline as the runtime keeps it (a context's), which a node's
	// clock set off by hours does not move.
	past, cancel := context.WithDeadline(context.Background(), l.Deadline)
	defer cancel()
	said, again := false, true
	// giveUp is set once the stop at the deadline has begun, killAt
	// (a package manager's SIGKILL) with it: contexts, for the runtime's
	// clock (this package reads no other).
	var giveUp, killAt context.Context
	killed := false
	for {
		members := groupOf(l)
		if len(members) == 0 && again {
			// Once more, a moment later: /proc is listed before it is
			// read, and a child forked between the two, its parent gone
			// by the read, is not seen.
			again = false
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if len(members) == 0 {
			return nil
		}
		if !said {
			said = true
			say("a program an executor before this one started is still running: waited for before this apply, up to its deadline", "pid", l.PID, "argv", l.Argv, "deadline", l.Deadline)
		}
		leader := slices.Contains(members, l.PID)
		switch {
		case l.Stop == stopAction && !leader:
			// The action has exited: what it left in its group goes,
			// as the executor takes it away when an action ends.
			if giveUp == nil {
				giveUp = within(outlivesKill)
			}
			killAll(members)
		case past.Err() == nil:
		case l.Stop == stopGentle && !leader:
			// The package manager itself is gone: what it runs (dpkg)
			// finishes on its own, as under the executor.
			return nil
		case l.Stop == stopGentle:
			if giveUp == nil {
				killAt, giveUp = within(gentleGrace), within(gentleGrace+outlivesKill)
				signal(l.PID, syscall.SIGTERM)
				say("a program an executor before this one left running passed its deadline: asked to stop (SIGTERM to it alone, as the executor does to a package manager)", "pid", l.PID, "argv", l.Argv)
			} else if !killed && killAt.Err() != nil {
				killed = true
				signal(l.PID, syscall.SIGKILL)
			}
		default:
			if giveUp == nil {
				giveUp = within(outlivesKill)
				say("a program an executor before this one left running passed its deadline: its process group was killed", "pid", l.PID, "argv", l.Argv)
			}
			killAll(members)
		}
		if giveUp != nil && giveUp.Err() != nil {
			return fmt.Errorf("pid %d (%s) did not end when stopped at its deadline: %s", l.PID, strings.Join(l.Argv, " "), states(members))
		}
		var deadline <-chan struct{}
		if past.Err() == nil {
			deadline = past.Done()
		}
		select {
		case <-stop:
			return ErrStopped
		case <-deadline:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// within is a context that ends after d, its timer let go when it does.
func within(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	time.AfterFunc(d, cancel)
	return ctx
}

// killAll SIGKILLs each of pids.
func killAll(pids []int) {
	for _, m := range pids {
		signal(m, syscall.SIGKILL)
	}
}

// states says each of pids with its state in /proc (D: in the kernel,
// where no signal reaches it).
func states(pids []int) string {
	var out []string
	for _, pid := range pids {
		st := "?"
		if f, err := procStat(pid); err == nil {
			st = f[0]
		}
		out = append(out, fmt.Sprintf("pid %d in state %s", pid, st))
	}
	return strings.Join(out, ", ")
}

// bootID is the kernel's id of this boot; "" when it cannot be read.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// ofAnotherBoot says whether the note at p, l, was written in another
// boot than this one: by its boot id, or, a note without one, by its
// file's time against the boot's (/proc/stat's btime). Either unknown,
// it is taken for this boot's (and its pid and start time are checked).
func ofAnotherBoot(l leftProgram, p string) bool {
	if l.Boot != "" {
		now := bootID()
		return now != "" && l.Boot != now
	}
	fi, err := os.Stat(p)
	if err != nil {
		return false
	}
	booted, ok := bootTime()
	return ok && fi.ModTime().Before(booted)
}

// bootTime is when this boot began, as /proc/stat says it.
func bootTime() (time.Time, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(n, 0), true
			}
		}
	}
	return time.Time{}, false
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
