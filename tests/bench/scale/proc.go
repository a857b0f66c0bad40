package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux ABI (the kernel's own HZ is hidden from userspace).
const clockTicks = 100

// cpuTicks is a process's user + system time so far, in clock ticks,
// from /proc/PID/stat.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	t, err := parseStatCPU(string(b))
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	return t, nil
}

// parseStatCPU reads utime + stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may hold spaces
// and parentheses itself, so the fields are counted from its last ')'.
func parseStatCPU(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name", len(f))
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: utime: %w", err)
	}
	s, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: stime: %w", err)
	}
	return u + s, nil
}

// memory is a process's resident size, from /proc/PID/status (KiB).
type memory struct {
	RSS, HWM uint64
}

func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	m, err := parseStatus(string(b))
	if err != nil {
		return memory{}, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	return m, nil
}

// parseStatus reads VmRSS and VmHWM (kB) from /proc/PID/status.
func parseStatus(status string) (memory, error) {
	var m memory
	var rss bool
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("status: %s: %q", k, v)
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("status: %s: %w", k, err)
		}
		if k == "VmRSS" {
			m.RSS, rss = n, true
		} else {
			m.HWM = n
		}
	}
	if !rss {
		return m, fmt.Errorf("status: no VmRSS (a kernel thread, or the process is gone)")
	}
	return m, nil
}

// cpuSample is a process's CPU time at a moment.
type cpuSample struct {
	at    time.Time
	ticks uint64
}

func sampleCPU(pid int) (cpuSample, error) {
	t, err := cpuTicks(pid)
	return cpuSample{at: time.Now(), ticks: t}, err
}

// cpuPercent is the share of one core a process used between two samples.
func cpuPercent(a, b cpuSample) float64 {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 || b.ticks < a.ticks {
		return 0
	}
	return float64(b.ticks-a.ticks) / clockTicks / wall * 100
}

// openFiles is the process's limit on open files (soft, hard).
func openFiles() (soft, hard uint64, err error) {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return 0, 0, err
	}
	return parseNofile(string(b))
}

// parseNofile reads the "Max open files" line of /proc/PID/limits.
func parseNofile(limits string) (soft, hard uint64, err error) {
	for _, line := range strings.Split(limits, "\n") {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		num := func(s string) (uint64, error) {
			if s == "unlimited" {
				return 1 << 62, nil
			}
			return strconv.ParseUint(s, 10, 64)
		}
		if soft, err = num(f[0]); err != nil {
			return 0, 0, fmt.Errorf("limits: %w", err)
		}
		if hard, err = num(f[1]); err != nil {
			return 0, 0, fmt.Errorf("limits: %w", err)
		}
		return soft, hard, nil
	}
	return 0, 0, fmt.Errorf("limits: no 'Max open files' line")
}

// fdsInUse counts this process's open file descriptors.
func fdsInUse() int { return fdsOf("self") }

// fdsOf counts a process's open file descriptors ("self", or a pid).
func fdsOf(pid string) int {
	es, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		return 0
	}
	return len(es)
}

// profiled starts CPU profiles of this process (the agents, the bench's
// own declares) and of serve for one phase, when -profile names a
// directory, and returns what ends them. With no -profile it does nothing.
func (b *bench) profiled(phase string) func() {
	if b.cfg.profile == "" {
		return func() {}
	}
	pid := b.ctl.pid()
	end, ok := b.profileHere(phase, func() int { return pid })
	if ok && pid != 0 {
		syscall.Kill(pid, syscall.SIGUSR1)
	}
	if b.servers != nil && len(b.servers.prof) > 0 {
		servers := b.profileServers(phase)
		return func() { end(); servers() }
	}
	return end
}

// profiledRestart profiles the restart, from serve's stop until every
// node has linked again: this process's from now, serve's from its new
// start's first instant (a signal could not reach it before its handler).
// The function it returns ends both, once (it is called twice).
func (b *bench) profiledRestart() func() {
	if b.cfg.profile == "" {
		return func() {}
	}
	b.ctl.mu.Lock()
	b.ctl.profileFromStart = true
	b.ctl.mu.Unlock()
	var once sync.Once
	end, _ := b.profileHere("restart", b.ctl.pid)
	return func() { once.Do(end) }
}

// profileHere starts this process's CPU profile for phase and returns what
// ends it and serve's (SIGUSR2 to the pid servePID says then, if any),
// and whether it started.
func (b *bench) profileHere(phase string, servePID func() int) (func(), bool) {
	b.profiles++
	f, err := os.Create(filepath.Join(b.cfg.profile, fmt.Sprintf("agents-%s-%d.pprof", phase, b.profiles)))
	if err != nil {
		b.log.Warn("profile: " + err.Error())
		return func() {}, false
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.log.Warn("profile: " + err.Error())
		f.Close()
		return func() {}, false
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if pid := servePID(); pid != 0 {
			syscall.Kill(pid, syscall.SIGUSR2)
		}
	}, true
}
