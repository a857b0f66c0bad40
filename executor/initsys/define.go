package initsys

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Program is a long-running program the host defines under the init (the
// process shape): its unit's name, its command line, the user it runs as
// and its environment (in a fixed order). Validation (shapes) has kept
// every word to a character set no definition format quotes or expands.
type Program struct {
	Name        string
	Exec        []string
	User        string
	Env         [][2]string
	Description string
}

// DefFile is one file of a definition.
type DefFile struct {
	Path    string
	Content string
	Mode    uint32
}

// Definition is how an init defines a program: the directories to make
// (in order), the files to write, and the unit's name as the Manager
// takes it.
type Definition struct {
	Dirs  []string
	Files []DefFile
	Unit  string
}

// Paths is every path of the definition, files then directories deepest
// first: what removing it takes away, in order.
func (d Definition) Paths() []string {
	var out []string
	for _, f := range d.Files {
		out = append(out, f.Path)
	}
	for i := len(d.Dirs) - 1; i >= 0; i-- {
		out = append(out, d.Dirs[i])
	}
	return out
}

// systemdHardening is what a process unit gets on systemd: what a program
// of the mesh's never needs (the machine's kernel, its devices' raw
// access, new privileges, other users' homes), and nothing that would
// break a common daemon (it may write /var, /srv and /tmp of its own).
const systemdHardening = `NoNewPrivileges=yes
ProtectSystem=full
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native
`

// Define is the definition of p under the init named init ("systemd",
// "openrc", "runit", "s6"); scanDir is the directory s6-svscan scans (s6
// keeps its service directories there). The host's own marker line names
// it as the mesh's in every format.
func Define(init, scanDir string, p Program) (Definition, error) {
	mark := "nox-mesh-host process " + p.Description + ": written by the host; changed by hand, it is put back"
	switch init {
	case "systemd":
		var b strings.Builder
		fmt.Fprintf(&b, "# %s\n[Unit]\nDescription=%s (nox-mesh process)\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n", mark, p.Description)
		fmt.Fprintf(&b, "ExecStart=%s\nUser=%s\n", strings.Join(p.Exec, " "), p.User)
		for _, e := range p.Env {
			fmt.Fprintf(&b, "Environment=%s=%s\n", e[0], e[1])
		}
		b.WriteString("Restart=always\nRestartSec=2s\n")
		b.WriteString(systemdHardening)
		b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
		return Definition{Files: []DefFile{{"/etc/systemd/system/" + p.Name + ".service", b.String(), 0o644}}, Unit: p.Name + ".service"}, nil
	case "openrc":
		var b strings.Builder
		fmt.Fprintf(&b, "#!/sbin/openrc-run\n# %s\n\ndescription=\"%s (nox-mesh process)\"\nsupervisor=supervise-daemon\n", mark, p.Description)
		fmt.Fprintf(&b, "command=%s\ncommand_args=\"%s\"\ncommand_user=\"%s\"\n", p.Exec[0], strings.Join(p.Exec[1:], " "), p.User)
		if len(p.Env) > 0 {
			var env []string
			for _, e := range p.Env {
				env = append(env, "--env "+e[0]+"="+e[1])
			}
			fmt.Fprintf(&b, "supervise_daemon_args=\"%s\"\n", strings.Join(env, " "))
		}
		fmt.Fprintf(&b, "pidfile=\"/run/${RC_SVCNAME}.pid\"\nrespawn_delay=2\nrespawn_max=0\n\ndepend() {\n\tuse net\n\tafter net\n}\n")
		return Definition{Files: []DefFile{{"/etc/init.d/" + p.Name, b.String(), 0o755}}, Unit: p.Name}, nil
	case "runit", "s6":
		dir := "/etc/sv/" + p.Name
		drop := "chpst -u " + p.User
		if init == "s6" {
			if scanDir == "" {
				return Definition{}, fmt.Errorf("initsys: s6: no scan directory to define %s in", p.Name)
			}
			dir, drop = filepath.Join(scanDir, p.Name), "s6-setuidgid "+p.User
		}
		var b strings.Builder
		fmt.Fprintf(&b, "#!/bin/sh\n# %s\nexec 2>&1\nexec %s", mark, drop)
		if len(p.Env) > 0 {
			b.WriteString(" env")
			for _, e := range p.Env {
				b.WriteString(" " + e[0] + "=" + e[1])
			}
		}
		b.WriteString(" " + strings.Join(p.Exec, " ") + "\n")
		return Definition{Dirs: []string{dir}, Files: []DefFile{{dir + "/run", b.String(), 0o755}}, Unit: p.Name}, nil
	}
	return Definition{}, fmt.Errorf("initsys: %s: the host cannot define a process under it", init)
}

// ScanDir is the directory an s6 or runit manager's supervisor scans (""
// for the other inits): s6 keeps a process's service directory there, and
// runit links it in.
func ScanDir(m Manager) string {
	switch x := m.(type) {
	case *s6:
		return x.scanDir
	case *runit:
		return x.scanDir
	}
	return ""
}

// Undefine stops supervising a unit whose definition the host removes
// next: runit's link in its scanned directory comes out (runsvdir then
// ends the runsv); s6's supervisor is told its directory is gone once it
// is (Forget, after). Stop it first.
func Undefine(ctx context.Context, m Manager, name string) error {
	if r, ok := m.(*runit); ok {
		link := filepath.Join(r.scanDir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(r.svDir, name) {
			if err := removeFile(link); err != nil {
				return fmt.Errorf("initsys: runit: unlink %s: %w", link, err)
			}
		}
	}
	return nil
}

// Forget tells s6-svscan a service directory is gone (s6-svscanctl -an:
// rescan, and end the supervisors of what vanished); nothing elsewhere.
func Forget(ctx context.Context, m Manager) error {
	if s, ok := m.(*s6); ok {
		_, err := s.t.must(ctx, "s6-svscanctl", "-an", s.scanDir)
		return err
	}
	return nil
}
