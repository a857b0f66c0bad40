package lab

import (
	"fmt"
	"strings"
)

// Init is the init system a lab runs as its PID 1.
//
// Each boots to an idle init: only what the lab seeds, plus what the init
// itself insists on, is started. Adding a service, for each:
//
//   - Systemd: write /etc/systemd/system/NAME.service (WriteFile, or Seed it
//     at boot), then `systemctl daemon-reload` and `systemctl start NAME`, or
//     the manager's D-Bus methods Reload and StartUnit through DBusSocket().
//     The lab's /etc/systemd/system is opaque: no host enablement, alias or
//     override is seen. console-getty, debugfs and tracefs are masked.
//     Boot counts the lab up when `systemctl is-system-running` says running
//     or degraded.
//   - OpenRC: write /etc/init.d/NAME (mode 0755, `#!/sbin/openrc-run`), then
//     `rc-service NAME start` (`rc-service NAME status`, `... stop`). To start
//     it at boot, also link it into /etc/runlevels/default (`rc-update add
//     NAME default` at run time). The lab's /etc/rc.conf sets rc_sys="lxc",
//     rc_cgroup_mode="none" and rc_logger="NO"; /etc/runlevels is opaque,
//     with empty sysinit, boot, default, nonetwork and shutdown runlevels.
//     Boot counts the lab up when the default runlevel is reached and no
//     `openrc` process is left.
//   - Runit: a service is a directory holding an executable `run`, in
//     /etc/runit/runsvdir/default (which /etc/service reaches through the
//     `current` link); runsvdir notices a new one within 5 s and starts it;
//     then `sv status|up|down /etc/service/NAME`. /etc/runit/1 is minimal
//     (it only marks runit as the running init), /etc/runit/no.emulate.sysv
//     keeps the host's /etc/rc2.d out, and runsvdir/default is opaque. Boot
//     counts the lab up when runsvdir runs.
//   - S6: a service is a directory holding an executable `run`, in the scan
//     directory /etc/s6/scan (opaque); `s6-svscanctl -a /etc/s6/scan` makes
//     s6-svscan (PID 1) pick a new one up at once, then `s6-svc -u|-d` and
//     `s6-svstat` on /etc/s6/scan/NAME. Boot counts the lab up when
//     s6-svscan's control FIFO exists.
//
// Init.Service gives the files that define a long-running service for each
// init, to Seed at boot or to write at run time.
type Init string

// The inits a lab can run.
const (
	Systemd Init = "systemd"
	OpenRC  Init = "openrc"
	Runit   Init = "runit"
	S6      Init = "s6"
)

// binary is the init's program on the host (and so in the lab's overlay).
func (i Init) binary() (string, error) {
	switch i {
	case Systemd:
		return "/lib/systemd/systemd", nil
	case OpenRC:
		return "/sbin/openrc-init", nil
	case Runit:
		return "/sbin/runit", nil
	case S6:
		return "/usr/bin/s6-svscan", nil
	}
	return "", fmt.Errorf("lab: unknown init %q (want systemd, openrc, runit or s6)", string(i))
}

func (i Init) argv() []string {
	switch i {
	case S6:
		return []string{"s6-svscan", s6ScanDir}
	case Runit:
		return []string{"runit"}
	case OpenRC:
		return []string{"openrc-init"}
	}
	return []string{"systemd"}
}

// The package that brings the init, for the error when it is missing.
func (i Init) pkg() string {
	switch i {
	case OpenRC:
		return "openrc"
	case Runit:
		return "runit"
	case S6:
		return "s6"
	}
	return "systemd"
}

const s6ScanDir = "/etc/s6/scan"

// Service gives the files that define a long-running service NAME running
// the shell command line command under this init, started at boot when
// passed as (part of) Options.Seed, or written into a running lab with
// WriteFile and then started with the init's own tool (see Init). Paths map
// to contents; WriteFile them with mode 0755 when they start with "#!".
//
//   - systemd: /etc/systemd/system/NAME.service, and a drop-in that makes
//     multi-user.target want it;
//   - openrc: /etc/init.d/NAME (under supervise-daemon, pidfile
//     /run/NAME.pid) and the runlevel entry /etc/runlevels/default/NAME;
//   - runit: /etc/runit/runsvdir/default/NAME/run;
//   - s6: /etc/s6/scan/NAME/run.
func (i Init) Service(name, command string) map[string]string {
	run := "#!/bin/sh\nexec 2>&1\nexec " + command + "\n"
	switch i {
	case OpenRC:
		return map[string]string{
			"/etc/init.d/" + name: "#!/sbin/openrc-run\n" +
				"description=\"lab service " + name + "\"\n" +
				// supervise-daemon tracks the child itself, so stop and
				// status do not depend on what the command execs.
				"supervisor=supervise-daemon\n" +
				"command=/bin/sh\n" +
				// openrc-run evals command_args: a quoted word survives.
				"command_args=\"" + dqEscape("-c "+shellQuote("exec "+command)) + "\"\n" +
				"pidfile=/run/" + name + ".pid\n",
			"/etc/runlevels/default/" + name: symlinkPrefix + "/etc/init.d/" + name,
		}
	case Runit:
		return map[string]string{"/etc/runit/runsvdir/default/" + name + "/run": run}
	case S6:
		return map[string]string{s6ScanDir + "/" + name + "/run": run}
	}
	exec := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "%", "%%", "$", "$$").Replace("exec " + command)
	return map[string]string{
		"/etc/systemd/system/" + name + ".service": "[Unit]\nDescription=lab service " + name + "\n\n" +
			"[Service]\nExecStart=/bin/sh -c \"" + exec + "\"\n\n" +
			"[Install]\nWantedBy=multi-user.target\n",
		"/etc/systemd/system/multi-user.target.d/lab-" + name + ".conf": "[Unit]\nWants=" + name + ".service\n",
	}
}

// shellQuote makes s one single-quoted shell word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// dqEscape escapes s for the inside of a double-quoted shell string.
func dqEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(s)
}

// symlinkPrefix marks a Seed value that is a symbolic link, not a file:
// "symlink:/etc/init.d/NAME" seeds a link to /etc/init.d/NAME.
const symlinkPrefix = "symlink:"
