package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// protectedOnce remembers which paths ProtectRunning has added, so an
// apply (many a second, in a burst) pays for the resolution once.
var (
	protectedOnce   = map[string]bool{}
	protectedOnceMu sync.Mutex
)

// ProtectRunning adds where this host actually runs from to the protected
// set (shapes.ProtectRunning): each path made absolute, as given and as
// the machine resolves it through its symlinks now. The protected set is
// a list of canonical paths; a host started with --state /srv/x, or from a
// binary in /opt, is protected where it really is, not where the list
// says. Apply adds the store's directory and this process's binary itself;
// the daemon adds its socket's directory, the agent's state and the
// launcher's.
func ProtectRunning(what string, paths ...string) {
	for _, p := range paths {
		if p == "" {
			continue
		}
		key := what + "\x00" + p
		protectedOnceMu.Lock()
		done := protectedOnce[key]
		protectedOnce[key] = true
		protectedOnceMu.Unlock()
		if done {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			continue
		}
		forms := []string{abs}
		if rp, err := fsx.Resolver()(abs); err == nil {
			forms = append(forms, rp)
		}
		shapes.ProtectRunning(what, forms...)
	}
}

// protectSelf adds the store's directory and the running binary, and what
// the daemon of this state said it runs from (RunningFile): a rescue
// apply, a process of its own, refuses the daemon's socket directory and
// the agent's state wherever that daemon was told they are, as the daemon
// does.
func protectSelf(stateDir string) {
	ProtectRunning("state directory", stateDir)
	if exe, err := os.Executable(); err == nil {
		ProtectRunning("binary", exe)
	}
	// Read once a state in a process, not at every apply: the daemon
	// protects what it writes there itself (RecordRunning), and a rescue
	// command applies once.
	if _, read := runningRead.LoadOrStore(stateDir, true); !read {
		for _, p := range readRunning(stateDir) {
			ProtectRunning(p.What, p.Path)
		}
	}
}

// runningRead is the state directories whose RunningFile this process
// has read (protectSelf).
var runningRead sync.Map

// RunningFile, in the executor's state directory, names where the daemon
// of that state runs from beyond the state and its binary: its socket's
// directory, the agent's state, the launcher's binary and known-good
// copies. The daemon writes it when it starts (RecordRunning); every apply
// of the same state reads it (protectSelf). It protects; it drives nothing
// else.
const RunningFile = "running.json"

// runningFormat is RunningFile's format; the file is read as far as a
// release knows it (a field it does not know is passed over).
const runningFormat = 1

// RunningPath is one path the daemon runs from, and what it is to it.
type RunningPath struct {
	What string `json:"what"`
	Path string `json:"path"`
}

type runningRecord struct {
	Format int           `json:"format"`
	Paths  []RunningPath `json:"paths"`
	// Socket is the socket the daemon serves (doctor looks there).
	Socket string `json:"socket,omitempty"`
}

// RecordRunning adds paths to this process's protected set (ProtectRunning)
// and keeps them in stateDir's RunningFile, with the socket the daemon
// serves, for the applies and the doctor of other processes on the same
// state. Empty paths are left out.
func RecordRunning(stateDir, socket string, paths []RunningPath) error {
	var kept []RunningPath
	for _, p := range paths {
		if p.Path == "" {
			continue
		}
		if abs, err := filepath.Abs(p.Path); err == nil {
			p.Path = abs // read by a process of another working directory
		}
		ProtectRunning(p.What, p.Path)
		kept = append(kept, p)
	}
	if socket != "" {
		if abs, err := filepath.Abs(socket); err == nil {
			socket = abs
		}
	}
	b, err := json.Marshal(runningRecord{Format: runningFormat, Paths: kept, Socket: socket})
	if err != nil {
		return err
	}
	return store.WriteFileAtomic(filepath.Join(stateDir, RunningFile), b)
}

// readRunning is what RunningFile says; nothing when it is absent or does
// not read (the state's own directory and binary are protected still).
func readRunning(stateDir string) []RunningPath { return readRunningRecord(stateDir).Paths }

// RunningSocket is the socket the daemon of stateDir last said it serves
// ("": never said, or the file does not read).
func RunningSocket(stateDir string) string { return readRunningRecord(stateDir).Socket }

func readRunningRecord(stateDir string) runningRecord {
	var r runningRecord
	if b, err := os.ReadFile(filepath.Join(stateDir, RunningFile)); err == nil {
		json.Unmarshal(b, &r)
	}
	return r
}
