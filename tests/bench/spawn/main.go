// Command spawn runs one command and reports its wall time and peak RSS. The
// bench driver starts every measured tool through it.
//
// Usage:
//
//	spawn PROG [ARG...]
//
// It writes one JSON object to file descriptor 3:
//
//	{"wall_ns": 1234567, "maxrss_kib": 5120, "exit": 0, "signal": 0}
//
// Why not measure from the driver with os/exec: Go starts children with
// clone(CLONE_VM|CLONE_VFORK), so at execve the kernel folds the *parent's*
// high-water RSS into the child's ru_maxrss. A child of the driver would be
// reported at least as large as the driver itself. This program is the parent
// instead: it resets its own high-water mark (clear_refs 5) and is nearly
// empty when it starts the child, so the reported figure is the child's own,
// with a floor of this program's size (about 2 MiB; the driver measures and
// prints that floor).
//
// The wall time runs from just before the fork to the child's reaping, so it
// counts the tool's whole process: exec, dynamic loading, runtime start, work
// and exit. ru_maxrss from wait4 covers the child and the descendants it
// waited for (cf-agent runs cf-promises), as the maximum of them, not a sum.
//
// The child gets this program's standard streams and environment, and dies
// with it (PR_SET_PDEATHSIG), so a driver that gives up on a hung tool by
// killing spawn leaves nothing behind.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

type report struct {
	WallNS    int64 `json:"wall_ns"`
	MaxRSSKiB int64 `json:"maxrss_kib"`
	Exit      int   `json:"exit"`
	Signal    int   `json:"signal"`
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "spawn:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) < 1 || args[0] == "" || args[0][0] != '/' {
		return fmt.Errorf("usage: spawn /ABSOLUTE/PROG [ARG...]")
	}
	out := os.NewFile(3, "report")
	if out == nil {
		return fmt.Errorf("file descriptor 3 (the report) is not open")
	}
	// Pdeathsig is tied to the thread that forks: keep the fork and the wait
	// on one thread.
	runtime.LockOSThread()
	// Lower this process's high-water RSS to what it is now, so the child
	// inherits as little of it as possible (see the package doc).
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)

	attr := &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	start := time.Now()
	pid, err := syscall.ForkExec(args[0], args, attr)
	if err != nil {
		return fmt.Errorf("starting %s: %w", args[0], err)
	}
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	for {
		_, err = syscall.Wait4(pid, &ws, 0, &ru)
		if err != syscall.EINTR {
			break
		}
	}
	wall := time.Since(start)
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", args[0], err)
	}
	r := report{WallNS: wall.Nanoseconds(), MaxRSSKiB: ru.Maxrss, Exit: ws.ExitStatus()}
	if ws.Signaled() {
		r.Signal = int(ws.Signal())
	}
	return json.NewEncoder(out).Encode(r)
}
