package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// HostPackage is the host's own package: a `package` resource naming it is
// an upgrade of the host.
const HostPackage = "nox-mesh-host"

// DefaultHostBinary is where the host's package installs the executor.
const DefaultHostBinary = "/usr/bin/mesh-executor"

// versionTimeout bounds the new binary's `version`.
const versionTimeout = 30 * time.Second

// checkHostUpgrade is the read-back of the one resource that is the host:
// a package manager can install a binary that does not run here (another
// architecture, a missing libc). The installed executor is run once as a
// subprocess, `mesh-executor version`, and must say the declared version;
// otherwise the step fails, saying why, and the running host carries on
// (it never restarts onto a binary it has not seen run). When the
// installed binary is not the running one, the apply finishes, the report
// says so (Report.Upgraded), and the daemon exits 0 after its verdict: the
// launcher starts the new binary, which reconciles. The host never asks
// the init to restart it.
func (r *run) checkHostUpgrade(p *shapes.Package, installed string) error {
	bin := r.opt.HostBinary
	if bin == "" {
		bin = DefaultHostBinary
	}
	res, err := command.Run(r.ctx, []string{bin, "version"}, command.Options{Timeout: versionTimeout})
	if err == nil && res.Code != 0 {
		err = fmt.Errorf("exit status %d", res.Code)
		if res.Stderr != "" {
			err = fmt.Errorf("%w: %s", err, res.Stderr)
		}
	}
	if err != nil {
		return fmt.Errorf("the installed host does not run here: %s version: %v; the running host (%s) carries on", bin, err, r.opt.HostVersion)
	}
	got := res.Stdout
	if !SameRelease(p.Version, installed, got) {
		return fmt.Errorf("the installed host says version %q, not the declared %s; the running host (%s) carries on", got, p.Version, r.opt.HostVersion)
	}
	if got == r.opt.HostVersion {
		return nil // the running host is the installed one: nothing to commit to
	}
	if err := r.checkHostAgent(filepath.Join(filepath.Dir(bin), "mesh-agent"), p, installed); err != nil {
		return err
	}
	r.upgradedTo = got
	return nil
}

// DefaultAgentUser is the agent's user the packages make.
const DefaultAgentUser = "mesh-agent"

// checkHostAgent runs the new release's agent before the host commits to
// it: `mesh-agent --self-check --user U`, as root, so the new binary's own
// privilege drop is what is tried (it must end confined: its uid and gid,
// no other group, no capability, no_new_privs, on every thread), and it
// must say the declared version. A release whose agent cannot start here
// would otherwise become a node that applies and never speaks. A host
// with no agent beside its executor (Android's root helper: the agent is
// the app) has none to try.
func (r *run) checkHostAgent(agent string, p *shapes.Package, installed string) error {
	if _, err := os.Lstat(agent); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	u := r.opt.AgentUser
	if u == "" {
		u = DefaultAgentUser
	}
	res, err := command.Run(r.ctx, []string{agent, "--self-check", "--user", u}, command.Options{Timeout: versionTimeout})
	var self struct {
		Confined bool   `json:"confined"`
		Version  string `json:"version"`
		Error    string `json:"error"`
	}
	if err == nil {
		if jerr := json.Unmarshal([]byte(res.Stdout), &self); jerr != nil {
			err = fmt.Errorf("exit status %d, and it printed no self-check (%v): %s", res.Code, jerr, res.ErrorLine())
		}
	}
	switch {
	case err != nil:
	case !self.Confined:
		err = fmt.Errorf("it does not drop to user %s: %s", u, self.Error)
	case res.Code != 0:
		err = fmt.Errorf("exit status %d: %s", res.Code, res.ErrorLine())
	case !SameRelease(p.Version, installed, self.Version):
		err = fmt.Errorf("it says version %q, not the declared %s", self.Version, p.Version)
	}
	if err != nil {
		return fmt.Errorf("the installed agent does not pass its self-check: %s --self-check --user %s: %v; the running host (%s) carries on", agent, u, err, r.opt.HostVersion)
	}
	return nil
}

// SameRelease reports whether a binary stamped version bin is the release
// a package manager calls declared (or, undeclared, installed): the same
// upstream version, with the package's epoch ("1:") and revision ("-1",
// "-r1") set aside.
func SameRelease(declared, installed, bin string) bool {
	want := declared
	if want == "" {
		want = installed
	}
	if want == "" || bin == "" {
		return false
	}
	if _, v, ok := strings.Cut(want, ":"); ok {
		want = v
	}
	if i := strings.LastIndexByte(want, '-'); i > 0 && isRevision(want[i+1:]) {
		want = want[:i]
	}
	return strings.TrimPrefix(bin, "v") == strings.TrimPrefix(want, "v")
}

func isRevision(s string) bool {
	s = strings.TrimPrefix(s, "r")
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
