// Package profile says what this machine can be asked to do, and what it is.
//
// A capability is detected, never assumed. Each of the eight is decided by
// running or touching something that only succeeds when the thing works: a
// container runtime answering _ping on its socket, an init answering for its
// state, a firewall listing its tables. Never `--version`, never "the binary
// exists": an installed package whose daemon is not running is not a
// capability.
//
// Every line carries both halves of the fact. A present capability has a
// Detail, the value a module configures itself from ("card1-DP-1",
// "systemd 252, degraded"); an absent one has a Reason naming what was tried
// and what it answered, because why a machine cannot do something is only
// the machine's to say.
//
// Never reported and reported nothing are different, and keeping them apart
// is the caller's: a nil *Profile means the machine never reported; a
// Profile whose capabilities are all absent means it reported and can do
// nothing. Both refuse everything that needs a capability; the remedies are
// not alike. A Profile always marshals its capabilities as a JSON array
// (never null) so the two survive a round trip.
//
// Probes run concurrently, each bounded by Options.Timeout; a stuck command
// is killed with its whole process group. The package opens no connection
// off the machine: its only sockets are local (unix sockets, netlink).
package profile

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Capability is one line of the profile: a yes/no and the detail or reason.
type Capability struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	Detail  string `json:"detail,omitempty"` // when present: e.g. "systemd 252, degraded", "card1-DP-1", "nftables"
	Reason  string `json:"reason,omitempty"` // when absent: what was tried and what it answered
}

// Profile is what the machine said about itself at DetectedAt.
type Profile struct {
	DetectedAt   time.Time    `json:"detected_at"`
	Capabilities []Capability `json:"capabilities"` // always the eight, in the fixed order of Names
	// Accepts names the declaration fields this executor reads beyond
	// those every release reads (shapes.Accepts). It travels with the
	// profile — at enrolment, and again whenever the profile changes, as
	// it does when the host is upgraded — so the control side writes a
	// newer field only to a node that reads it, before the node has sent
	// anything else.
	Accepts []string `json:"accepts,omitempty"`
}

// Names are the eight capabilities, in the order a Profile lists them.
var Names = []string{"container-runtime", "package-manager", "service-manager", "firewall", "overlay", "graphical-session", "seat", "privileged"}

// Options tune Detect.
type Options struct {
	// Root prefixes the files probes read (/proc, /sys, /run, /tmp, /dev,
	// /etc); "" means "/". Commands always run against the real machine, so
	// a Root other than "/" is only meaningful for the file-reading helpers.
	Root string
	// Timeout bounds each probe; 0 means 3s.
	Timeout time.Duration

	// sockets replaces the container runtime sockets tried (tests only).
	sockets []string
}

// defaultTimeout is the per-probe bound when Options.Timeout is zero.
const defaultTimeout = 3 * time.Second

// grace is how long Detect waits past the timeout for a probe to come back
// before it records it as not having finished.
const grace = time.Second

type probe func(ctx context.Context, o Options) Capability

// probes maps each name to its detector; see probes.go.
var probes = map[string]probe{
	"container-runtime": probeContainerRuntime,
	"package-manager":   probePackageManager,
	"service-manager":   probeServiceManager,
	"firewall":          probeFirewall,
	"overlay":           probeOverlay,
	"graphical-session": probeGraphicalSession,
	"seat":              probeSeat,
	"privileged":        probePrivileged,
}

// Detect runs the eight probes concurrently and returns their answers in
// the order of Names. It returns within about Timeout plus a second even if
// a probe is stuck, recording that probe as absent.
func Detect(ctx context.Context, opt Options) Profile {
	if opt.Root == "" {
		opt.Root = "/"
	}
	if opt.Timeout <= 0 {
		opt.Timeout = defaultTimeout
	}
	p := Profile{DetectedAt: clock.Now().UTC(), Capabilities: make([]Capability, len(Names)), Accepts: shapes.Accepts}

	type answer struct {
		i int
		c Capability
	}
	answers := make(chan answer, len(Names)) // buffered: a late probe never blocks
	for i, name := range Names {
		detect := probes[name]
		go func() {
			pctx, cancel := context.WithTimeout(ctx, opt.Timeout)
			defer cancel()
			c := detect(pctx, opt)
			c.Name = name
			answers <- answer{i, c}
		}()
	}

	done := make([]bool, len(Names))
	give := time.NewTimer(opt.Timeout + grace)
	defer give.Stop()
collect:
	for range Names {
		select {
		case a := <-answers:
			p.Capabilities[a.i], done[a.i] = a.c, true
		case <-give.C:
			break collect
		}
	}
	for i, name := range Names {
		if !done[i] {
			p.Capabilities[i] = Capability{Name: name, Reason: fmt.Sprintf("probe did not finish within %s", opt.Timeout)}
		}
	}
	return p
}

// Lookup returns the capability called name.
func (p Profile) Lookup(name string) (Capability, bool) {
	for _, c := range p.Capabilities {
		if c.Name == name {
			return c, true
		}
	}
	return Capability{}, false
}

// MarshalJSON writes capabilities as an array even when there are none, so
// a profile that reported nothing never reads back as one never reported.
func (p Profile) MarshalJSON() ([]byte, error) {
	type plain Profile
	if p.Capabilities == nil {
		p.Capabilities = []Capability{}
	}
	return json.Marshal(plain(p))
}

// at joins a machine path under the root.
func (o Options) at(path string) string {
	return filepath.Join(o.Root, path)
}

func present(detail string) Capability { return Capability{Present: true, Detail: detail} }

func absent(reason string) Capability { return Capability{Reason: reason} }
