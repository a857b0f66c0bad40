package engine

import (
	"os"
	"path/filepath"
	"sync"

	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
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

// protectSelf adds the store's directory and the running binary.
func protectSelf(stateDir string) {
	ProtectRunning("state directory", stateDir)
	if exe, err := os.Executable(); err == nil {
		ProtectRunning("binary", exe)
	}
}
