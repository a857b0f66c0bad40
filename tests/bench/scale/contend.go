package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// burnEnv, set in this program's environment, makes it the contended
// run's burner (burn) instead of the bench.
const burnEnv = "MESH_BENCH_BURN"

// burn takes one core's worth of CPU until it is killed: the other job
// of a control machine that is not idle (a backup, a package upgrade, a
// second service), for -contended. One thread, spinning.
func burn() {
	runtime.GOMAXPROCS(1)
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			fmt.Println(x) // never: keeps the loop from being optimised away
		}
	}
}

// burner is the contended run's burner: this program again, spinning,
// started before the first measure and killed after the last; it dies
// with the bench (PR_SET_PDEATHSIG).
type burner struct {
	cmd   *exec.Cmd
	start time.Time
}

func startBurner() (*burner, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the burner: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), burnEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("the burner: %w", err)
	}
	return &burner{cmd: cmd, start: time.Now()}, nil
}

// stop ends the burner and says the share of a core it took, on average,
// from its start (0 when it cannot be read).
func (b *burner) stop() float64 {
	if b == nil {
		return 0
	}
	t, err := cpuTicks(b.cmd.Process.Pid)
	took := time.Since(b.start)
	b.cmd.Process.Kill()
	b.cmd.Wait()
	if err != nil || took <= 0 {
		return 0
	}
	return 100 * float64(t) / clockTicks / took.Seconds()
}
