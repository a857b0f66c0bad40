package shapes

import (
	"encoding/base64"
	"strconv"
)

// The shape names, as they appear in a resource's "type".
const (
	TypeFile      = "file"
	TypeDirectory = "directory"
	TypeAction    = "action"
	TypeService   = "service"
	TypePackage   = "package"
	TypeUser      = "user"
	TypeArchive   = "archive"
	TypeContainer = "container"
	TypeNetwork   = "network"
	TypeOverlay   = "overlay"
	TypeOpening   = "opening"
	TypeRegion    = "region"
	TypeKeys      = "keys"
	TypeProcess   = "process"
)

// shapeTable is the vocabulary. Every addition widens what a compromised
// control plane can express, so its size is asserted by a test.
var shapeTable = map[string]func() Resource{
	TypeFile:      func() Resource { return new(File) },
	TypeDirectory: func() Resource { return new(Directory) },
	TypeAction:    func() Resource { return new(Action) },
	TypeService:   func() Resource { return new(Service) },
	TypePackage:   func() Resource { return new(Package) },
	TypeUser:      func() Resource { return new(User) },
	TypeArchive:   func() Resource { return new(Archive) },
	TypeContainer: func() Resource { return new(Container) },
	TypeNetwork:   func() Resource { return new(Network) },
	TypeOverlay:   func() Resource { return new(Overlay) },
	TypeOpening:   func() Resource { return new(Opening) },
	TypeRegion:    func() Resource { return new(Region) },
	TypeKeys:      func() Resource { return new(Keys) },
	TypeProcess:   func() Resource { return new(Process) },
}

// TypeNames lists the known shapes in a fixed order, for error messages.
func TypeNames() []string {
	return []string{TypeFile, TypeDirectory, TypeAction, TypeService, TypePackage, TypeUser,
		TypeArchive, TypeContainer, TypeNetwork, TypeOverlay, TypeOpening, TypeRegion, TypeKeys, TypeProcess}
}

// File is a regular file with exactly one of Content (text), Bytes (base64)
// or Sealed (base64, opened only by the executor's sealing key). Mode and
// Owner, when unset, are 0644 and root:root for a file the host creates, and
// left as found for a file it replaces.
type File struct {
	Base
	Path    string  `json:"path"`
	Content *string `json:"content,omitempty"`
	Bytes   *string `json:"bytes,omitempty"`
	Sealed  *string `json:"sealed,omitempty" redact:"true"`
	Mode    string  `json:"mode,omitempty"`
	Owner   string  `json:"owner,omitempty"`
}

// Data returns the file's plain content. Sealed content cannot be opened here
// and is reported by ok=false; Validate has already checked the base64.
func (f *File) Data() (data []byte, ok bool) {
	switch {
	case f.Content != nil:
		return []byte(*f.Content), true
	case f.Bytes != nil:
		b, err := base64.StdEncoding.DecodeString(*f.Bytes)
		return b, err == nil
	}
	return nil, false
}

// Directory is a directory. Mode and Owner, when unset, are 0755 and
// root:root for one the host creates, and left as found otherwise.
type Directory struct {
	Base
	Path  string `json:"path"`
	Mode  string `json:"mode,omitempty"`
	Owner string `json:"owner,omitempty"`
}

// Action runs an argument vector (no shell implied) when its verify vector
// fails, and must leave verify succeeding. Verify is mandatory: it is the
// idempotency check and the read-back. Timeout is in seconds, for run and
// verify each; 0 means DefaultActionTimeout.
type Action struct {
	Base
	Run     []string `json:"run"`
	Verify  []string `json:"verify"`
	Timeout int      `json:"timeout,omitempty"`
}

// DefaultActionTimeout and MaxActionTimeout bound an action, in seconds.
const (
	DefaultActionTimeout = 60
	MaxActionTimeout     = 3600
)

// Service puts a unit the init already knows into a state. State is
// "running", "stopped", or "" (the mesh must not start it). Enabled, when
// set, is the enablement at boot. RestartOn names files (id, or module.id)
// whose change restarts the unit after the apply.
type Service struct {
	Base
	Unit      string   `json:"unit"`
	State     string   `json:"state,omitempty"`
	Enabled   *bool    `json:"enabled,omitempty"`
	RestartOn []string `json:"restart_on,omitempty"`
}

// Package is a package present; Version, when set, is an exact pin.
type Package struct {
	Base
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// User is a login: its shell and home, and groups it is added to (never
// removed from).
type User struct {
	Base
	Name   string   `json:"name"`
	Shell  string   `json:"shell,omitempty"`
	Home   string   `json:"home,omitempty"`
	Groups []string `json:"groups,omitempty"`
}

// Archive is a tar archive pinned by digest, unpacked into Destination.
type Archive struct {
	Base
	URL         string `json:"url"`
	SHA256      string `json:"sha256"`
	Destination string `json:"destination"`
}

// Container is a container pinned by image digest. Ports are
// "[ip:]host:container[/tcp|udp]"; Mounts are "source:target[:ro]" with an
// absolute source path or a volume name.
type Container struct {
	Base
	Name    string            `json:"name"`
	Image   string            `json:"image"`
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Ports   []string          `json:"ports,omitempty"`
	Mounts  []string          `json:"mounts,omitempty"`
	Network string            `json:"network,omitempty"`
}

// Network is a container network by name.
type Network struct {
	Base
	Name string `json:"name"`
}

// Overlay is a WireGuard interface. The private key is the executor's own and
// never appears in a declaration.
type Overlay struct {
	Base
	Interface  string `json:"interface"`
	Address    string `json:"address"`
	ListenPort int    `json:"listen_port,omitempty"`
	Peers      []Peer `json:"peers,omitempty"`
	// Roster: the peers are the mesh's roster (Roster), every node in it
	// but this one, as the executor holds it — signed by the control plane
	// once per change rather than copied into every node's declaration, so
	// a declaration's size does not grow with the mesh. Peers are then
	// declared none.
	Roster bool `json:"roster,omitempty"`
	// RosterMin is the oldest roster the peers may be taken from: the
	// newest the control side had published when it composed this
	// declaration. A host holding an older roster fails the step until a
	// newer one comes, so that the first roster a host takes is never one
	// from before the mesh was as it is now (a revoked node still in it):
	// a roster is taken if newer than the one held, and a host holding
	// none would take any signed one. Only with Roster. A host that does
	// not read it refuses the declaration (unknown field), so the control
	// side writes it only to a host that says it reads it (Accepts).
	RosterMin uint64 `json:"roster_min,omitempty"`
}

// Peer is one WireGuard peer of an Overlay. Keepalive is in seconds.
type Peer struct {
	PublicKey  string   `json:"public_key"`
	Endpoint   string   `json:"endpoint,omitempty"`
	AllowedIPs []string `json:"allowed_ips"`
	Keepalive  int      `json:"keepalive,omitempty"`
}

// Opening is a port made reachable through the firewall found on the
// machine: on the "incoming" or "forwarded" path, from an address or prefix
// ("" means from anywhere).
type Opening struct {
	Base
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
	From     string `json:"from,omitempty"`
	Path     string `json:"path"`
}

// Region is a block of lines the mesh owns inside a file it does not (ADR
// 0102: the mesh writes into a shared file, never over it), between two
// marker lines naming the resource: "<comment> BEGIN mesh <module.id>" and
// "<comment> END mesh <module.id>". The file must exist; everything
// outside the markers is never touched; undeclared, the block and its
// markers go, and the rest of the file is as it is. Comment is the marker
// lines' comment leader ("#" when unset).
type Region struct {
	Base
	Path    string  `json:"path"`
	Content *string `json:"content"`
	Comment string  `json:"comment,omitempty"`
}

// Text is the region's content ("" when unset, which validation refuses).
func (g *Region) Text() string {
	if g.Content == nil {
		return ""
	}
	return *g.Content
}

// CommentLeader is the region's comment leader, "#" when unset.
func (g *Region) CommentLeader() string {
	if g.Comment == "" {
		return "#"
	}
	return g.Comment
}

// Keys is the values of keys in a configuration file the mesh does not
// own: Format "equals" ("key = value": sysctl.conf, environment files) or
// "space" ("Key value": sshd_config). What each key held before the mesh
// first set it (or its absence) is recorded, and given back when it is
// undeclared.
type Keys struct {
	Base
	Path   string            `json:"path"`
	Format string            `json:"format"`
	Set    map[string]string `json:"set"`
}

// Process is the mesh's own long-running program, defined under
// whichever init the machine has (a systemd unit with hardening defaults,
// an OpenRC script, a runit or s6 service directory), run as User (never
// root), started and read back running as that user. Exec[0] may be a
// file an archive of the same declaration unpacked. Undeclared: stopped
// and its definition removed. Its name may not be a unit the mesh did not
// create.
type Process struct {
	Base
	Name  string            `json:"name"`
	Exec  []string          `json:"exec"`
	User  string            `json:"user"`
	Env   map[string]string `json:"env,omitempty"`
	State string            `json:"state,omitempty"`
}

// Running reports whether the process is declared running (the default).
func (p *Process) Running() bool { return p.State != "stopped" }

// ParseMode parses an octal mode string such as "0644". It accepts three or
// four octal digits and nothing above 07777.
func ParseMode(s string) (uint32, bool) {
	if len(s) < 3 || len(s) > 4 {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, false
	}
	return uint32(m), true
}
