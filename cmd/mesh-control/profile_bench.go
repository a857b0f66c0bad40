//go:build benchprofile

package main

// A CPU profile on demand, for the fleet-scale bench only (it builds
// mesh-control with -tags benchprofile when asked for -profile): with
// MESH_BENCH_PROFILE set to a directory, SIGUSR1 starts a CPU profile into
// it (serve-PID-N.pprof; a command's name for another's) and SIGUSR2 ends it and writes the heap's
// profile and the runtime's memory statistics beside it (.heap, .mem);
// MESH_BENCH_PROFILE_FROM_START starts the first profile at once (a command
// other than serve ends it as it exits). A release build has none of
// this: the tag is never set by the Makefile or the packages.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"
)

func init() {
	dir := os.Getenv("MESH_BENCH_PROFILE")
	if dir == "" {
		return
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	// serve-PID-N, or the command's name for another (overlay-PID-N).
	name := "serve"
	if len(os.Args) > 1 && os.Args[1] != "serve" {
		name = os.Args[1]
	}
	ended := make(chan struct{}, 1)
	atExit = func() {
		// A command's profile begun at its start ends with it.
		select {
		case <-ended:
		default:
		}
		sig <- syscall.SIGUSR2
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
		}
	}
	if os.Getenv("MESH_BENCH_PROFILE_FROM_START") != "" {
		// From the first instant (a restart's storm of reconnections): a
		// signal sent at the start could come before Notify and end the
		// process.
		sig <- syscall.SIGUSR1
	}
	go func() {
		var f *os.File
		n := 0
		for s := range sig {
			switch {
			case s == syscall.SIGUSR1 && f == nil:
				n++
				var err error
				if f, err = os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d-%d.pprof", name, os.Getpid(), n))); err != nil {
					fmt.Fprintln(os.Stderr, "profile:", err)
					continue
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					fmt.Fprintln(os.Stderr, "profile:", err)
					f.Close()
					f = nil
				}
			case s == syscall.SIGUSR2 && f != nil:
				pprof.StopCPUProfile()
				f.Close()
				f = nil
				base := filepath.Join(dir, fmt.Sprintf("%s-%d-%d", name, os.Getpid(), n))
				if h, err := os.Create(base + ".heap"); err == nil {
					pprof.Lookup("heap").WriteTo(h, 0)
					h.Close()
				}
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				b, _ := json.MarshalIndent(map[string]any{
					"heap_inuse": m.HeapInuse, "heap_alloc": m.HeapAlloc, "heap_idle": m.HeapIdle, "heap_released": m.HeapReleased,
					"stack_inuse": m.StackInuse, "sys": m.Sys, "num_gc": m.NumGC, "goroutines": runtime.NumGoroutine(),
					"mspan_inuse": m.MSpanInuse, "other_sys": m.OtherSys, "gc_sys": m.GCSys,
				}, "", "  ")
				os.WriteFile(base+".mem", b, 0o644)
			}
			if s == syscall.SIGUSR2 {
				select {
				case ended <- struct{}{}:
				default:
				}
			}
		}
	}()
}

// An experiment for the bench: with MESH_BENCH_FREE_EVERY set to a
// duration, serve gives its free memory back (debug.FreeOSMemory, a full
// collection) that often.
func init() {
	d, err := time.ParseDuration(os.Getenv("MESH_BENCH_FREE_EVERY"))
	if err != nil || d <= 0 {
		return
	}
	go func() {
		for range time.Tick(d) {
			debug.FreeOSMemory()
		}
	}()
}

// An experiment for the bench: MESH_BENCH_MEMLIMIT (bytes) sets serve's
// soft memory limit.
func init() {
	if n, err := strconv.ParseInt(os.Getenv("MESH_BENCH_MEMLIMIT"), 10, 64); err == nil && n > 0 {
		debug.SetMemoryLimit(n)
	}
}

// An experiment for the bench: MESH_BENCH_GOGC sets serve's GOGC (the
// bench's own process keeps its own).
func init() {
	if n, err := strconv.Atoi(os.Getenv("MESH_BENCH_GOGC")); err == nil && n > 0 {
		debug.SetGCPercent(n)
	}
}
