package profile

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/dockerapi"
	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
)

// Each probe proves its capability by using it. The shape is the same
// throughout: try the candidates in order, return the first that answers
// with a detail, otherwise an absence naming every attempt and its answer.

// ---- container-runtime: a runtime answers _ping on its Docker-API socket.

// The sockets and the HTTP client are the container applier's too
// (package dockerapi): the profile says present only where the applier
// would find the same runtime.

func probeContainerRuntime(ctx context.Context, o Options) Capability {
	socks := o.sockets
	if socks == nil {
		for _, s := range dockerapi.Sockets {
			socks = append(socks, o.at(s))
		}
	}
	var tried []string
	seen := map[string]bool{}
	for _, s := range socks {
		// /var/run is usually /run: ask each socket once.
		if dir, err := filepath.EvalSymlinks(filepath.Dir(s)); err == nil {
			key := filepath.Join(dir, filepath.Base(s))
			if seen[key] {
				continue
			}
			seen[key] = true
		}
		server, err := ping(ctx, s)
		if err == nil {
			if server != "" {
				return present(s + " (" + server + ")")
			}
			return present(s)
		}
		tried = append(tried, s+": "+short(err))
	}
	return absent("no container runtime socket answered _ping (" + strings.Join(tried, "; ") + ")")
}

// ping asks the Docker-API socket at path for /_ping and returns what the
// engine calls itself.
func ping(ctx context.Context, path string) (string, error) {
	server, err := (&dockerapi.Client{Socket: path}).Ping(ctx)
	var e *dockerapi.Error
	if errors.As(err, &e) {
		return "", fmt.Errorf("answered %d %s", e.Status, e.Message)
	}
	return server, err
}

// parsePing reads a captured answer to /_ping with the applier's own
// parser.
func parsePing(raw []byte) (string, error) {
	r, err := dockerapi.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), "GET", 1<<10)
	if err != nil {
		return "", err
	}
	if r.Status != 200 {
		return "", fmt.Errorf("answered %d", r.Status)
	}
	return dockerapi.PingAnswer(r)
}

// ---- package-manager: the machine's own package manager queries its database.

var packageManagers = []struct {
	detail string
	cmd    []string
	ok     func(out string) bool
}{
	{"dpkg/apt", []string{"dpkg-query", "-W", "-f=${Status}", "dpkg"}, func(s string) bool { return s == "install ok installed" }},
	{"apk", []string{"apk", "info", "-e", "apk-tools"}, func(s string) bool { return s == "apk-tools" }},
	{"pacman", []string{"pacman", "-Q", "pacman"}, func(s string) bool { return strings.HasPrefix(s, "pacman ") }},
}

func probePackageManager(ctx context.Context, o Options) Capability {
	var tried []string
	for _, pm := range packageManagers {
		res, err := run(ctx, pm.cmd[0], pm.cmd[1:]...)
		switch {
		case err != nil:
			tried = append(tried, err.Error())
		case res.Code == 0 && pm.ok(res.Stdout):
			return present(pm.detail)
		default:
			tried = append(tried, strings.Join(pm.cmd, " ")+": "+describe(res))
		}
	}
	return absent("no package manager answered a query of its own database (" + strings.Join(tried, "; ") + ")")
}

// ---- service-manager: an init that can be asked for its state.

func probeServiceManager(ctx context.Context, o Options) Capability {
	var tried []string
	if comm, err := readTrim(o.at("/proc/1/comm")); err == nil {
		tried = append(tried, fmt.Sprintf("pid 1 is %q", comm))
	} else {
		tried = append(tried, "pid 1 unknown: "+short(err))
	}
	for _, ask := range []func(context.Context, Options) (string, string){askSystemd, askOpenRC, askRunit, askS6} {
		detail, why := ask(ctx, o)
		if detail != "" {
			return present(detail)
		}
		tried = append(tried, why)
	}
	return absent("no init answered for its state (" + strings.Join(tried, "; ") + ")")
}

// askSystemd returns a detail when systemd answers, otherwise why not.
func askSystemd(ctx context.Context, o Options) (string, string) {
	res, err := run(ctx, "systemctl", "is-system-running")
	if err != nil {
		return "", "systemd: " + err.Error()
	}
	// "degraded" exits non-zero and is still an answer: only the output counts.
	state, ok := parseSystemState(res.Stdout)
	if !ok {
		return "", "systemctl is-system-running: " + describe(res)
	}
	if v, err := run(ctx, "systemctl", "show", "--property=Version", "--value"); err == nil && v.Code == 0 {
		if n := leadingDigits(v.Stdout); n != "" {
			return "systemd " + n + ", " + state, ""
		}
	}
	return "systemd, " + state, ""
}

// parseSystemState reads `systemctl is-system-running`: every state but
// offline and unknown means a running systemd answered.
func parseSystemState(out string) (string, bool) {
	state, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	switch state = strings.TrimSpace(state); state {
	case "initializing", "starting", "running", "degraded", "maintenance", "stopping":
		return state, true
	}
	return state, false
}

func askOpenRC(ctx context.Context, o Options) (string, string) {
	if _, err := os.Stat(o.at("/run/openrc/softlevel")); err != nil {
		return "", "OpenRC: not booted (/run/openrc/softlevel " + short(err) + ")"
	}
	// The softlevel file alone is not evidence: installing the openrc
	// package leaves one on machines OpenRC never booted. PID 1 must be
	// OpenRC's (openrc-init, or an init that booted OpenRC).
	if comm, _ := os.ReadFile(o.at("/proc/1/comm")); !slices.Contains([]string{"openrc-init", "init"}, strings.TrimSpace(string(comm))) {
		return "", fmt.Sprintf("OpenRC: /run/openrc/softlevel is there, but pid 1 is %q, not OpenRC's", strings.TrimSpace(string(comm)))
	}
	res, err := run(ctx, "rc-status", "-r")
	if err != nil {
		return "", "OpenRC: " + err.Error()
	}
	if res.Code != 0 || res.Stdout == "" || strings.ContainsAny(res.Stdout, " \n") {
		return "", "rc-status -r: " + describe(res)
	}
	return "openrc, runlevel " + res.Stdout, ""
}

func askRunit(ctx context.Context, o Options) (string, string) {
	sup, ok := findSupervisor(o.at("/proc"), "runsvdir")
	if !ok {
		return "", "runit: no runsvdir as pid 1 or its child"
	}
	dir := scanDir(sup.args, "/etc/service")
	return askSupervised(ctx, o, "runit", "runsvdir", dir, []string{"sv", "status"}, []string{"run:", "down:", "finish:"})
}

func askS6(ctx context.Context, o Options) (string, string) {
	sup, ok := findSupervisor(o.at("/proc"), "s6-svscan")
	if !ok {
		return "", "s6: no s6-svscan as pid 1 or its child"
	}
	dir := sup.cwd // s6-svscan works from inside its scan directory
	if dir == "" {
		dir = "/run/service"
	}
	return askSupervised(ctx, o, "s6", "s6-svscan", dir, []string{"s6-svstat"}, []string{"up ", "down "})
}

// askSupervised asks the supervision suite's status tool about the services
// in dir; one answer proves the supervisor works. A scan directory with no
// services has nothing to ask, and the running scanner is the answer.
func askSupervised(ctx context.Context, o Options, suite, scanner, dir string, status, answers []string) (string, string) {
	detail := fmt.Sprintf("%s, %s on %s", suite, scanner, dir)
	entries, _ := os.ReadDir(o.at(dir))
	var services []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			services = append(services, filepath.Join(dir, e.Name()))
		}
	}
	if len(services) == 0 {
		return detail + ", no services", ""
	}
	var last string
	for _, svc := range services {
		res, err := run(ctx, status[0], append(status[1:], svc)...)
		if err != nil {
			return "", suite + ": " + err.Error()
		}
		for _, a := range answers {
			if strings.HasPrefix(res.Stdout, a) {
				return fmt.Sprintf("%s, %d services", detail, len(services)), ""
			}
		}
		last = strings.Join(append(status, svc), " ") + ": " + describe(res)
	}
	return "", last
}

type supervisor struct {
	pid  int
	args []string
	cwd  string // "" when unreadable
}

// findSupervisor finds a process called comm that is pid 1 or a child of it,
// under procDir.
func findSupervisor(procDir, comm string) (supervisor, bool) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return supervisor{}, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(procDir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		c, ppid, err := parseStat(string(stat))
		if err != nil || c != comm || (pid != 1 && ppid != 1) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(procDir, e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		cwd, _ := os.Readlink(filepath.Join(procDir, e.Name(), "cwd"))
		return supervisor{pid: pid, args: args, cwd: cwd}, true
	}
	return supervisor{}, false
}

// parseStat reads the command name and parent pid from /proc/PID/stat. The
// name is between the first "(" and the last ")" and may hold anything.
func parseStat(s string) (comm string, ppid int, err error) {
	lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if lp < 0 || rp < lp {
		return "", 0, fmt.Errorf("profile: malformed stat %q", s)
	}
	f := strings.Fields(s[rp+1:])
	if len(f) < 2 {
		return "", 0, fmt.Errorf("profile: malformed stat %q", s)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return "", 0, fmt.Errorf("profile: stat ppid: %w", err)
	}
	return s[lp+1 : rp], ppid, nil
}

// scanDir is the first argument after the program name that is not a
// flag: runsvdir's directory in "runsvdir [-P] dir [log]".
func scanDir(args []string, def string) string {
	for _, a := range args[min(1, len(args)):] {
		if a != "" && !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return def
}

// ---- firewall: nftables, listed over netlink as every opening is
// written (package firewall): no nft or iptables program is needed, and a
// host without nf_tables, or a caller without CAP_NET_ADMIN, has none.

func probeFirewall(ctx context.Context, o Options) Capability {
	if err := firewall.Listable(); err != nil {
		return absent("no firewall this host can write to: " + err.Error())
	}
	return present("nftables" + frontends(ctx))
}

// frontends names a running firewalld or an active ufw, since either owns
// the rules an opening would add to.
func frontends(ctx context.Context) string {
	var r *firewall.Refused
	if err := firewall.FrontEnd(ctx); errors.As(err, &r) {
		return ", " + r.Firewall + " owns the ruleset (an opening is refused with its name)"
	}
	return ""
}

// ---- overlay: WireGuard can be brought up, in the kernel or in userspace.

func probeOverlay(ctx context.Context, o Options) Capability {
	kernel, err := genlFamily(ctx, "wireguard")
	if err == nil && kernel {
		return present("kernel wireguard")
	}
	why := "no kernel wireguard (genetlink family \"wireguard\" not found)"
	if err != nil {
		why = "no kernel wireguard (genetlink: " + short(err) + ")"
	}
	var user string
	for _, name := range []string{"wireguard-go", "wireguard"} {
		if _, err := command.LookPath(name); err == nil {
			user = name
			break
		}
	}
	if user == "" {
		return absent(why + "; no userspace wireguard (neither wireguard-go nor wireguard on " + command.SearchPath + ")")
	}
	tun, err := os.OpenFile(o.at("/dev/net/tun"), os.O_RDWR, 0)
	if err != nil {
		return absent(why + "; userspace " + user + " found but /dev/net/tun does not open read-write: " + short(err))
	}
	tun.Close()
	return present("userspace " + user)
}

// genlFamily asks the kernel's generic netlink controller whether a family
// called name is registered. It changes nothing.
func genlFamily(ctx context.Context, name string) (bool, error) {
	const (
		genlIDCtrl         = 0x10
		ctrlCmdGetFamily   = 3
		ctrlAttrFamilyName = 2
	)
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_GENERIC)
	if err != nil {
		return false, fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(fd)
	wait := defaultTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = max(clock.Left(dl), time.Millisecond)
	}
	tv := syscall.NsecToTimeval(wait.Nanoseconds())
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return false, fmt.Errorf("setsockopt: %w", err)
	}

	attrLen := 4 + len(name) + 1
	msg := make([]byte, syscall.NLMSG_HDRLEN+4+(attrLen+3)&^3)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], genlIDCtrl)
	ne.PutUint16(msg[6:], syscall.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], 1) // sequence
	msg[16], msg[17] = ctrlCmdGetFamily, 1
	ne.PutUint16(msg[20:], uint16(attrLen))
	ne.PutUint16(msg[22:], ctrlAttrFamilyName)
	copy(msg[24:], name)
	if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("send: %w", err)
	}

	buf := make([]byte, 16<<10)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) {
			return false, context.DeadlineExceeded
		}
		return false, fmt.Errorf("receive: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return false, fmt.Errorf("parse: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case genlIDCtrl:
			return true, nil
		case syscall.NLMSG_ERROR:
			if len(m.Data) < 4 {
				return false, errors.New("short netlink error")
			}
			switch errno := syscall.Errno(-int32(ne.Uint32(m.Data))); errno {
			case 0:
			case syscall.ENOENT:
				return false, nil
			default:
				return false, errno
			}
		}
	}
	return false, errors.New("no answer from the netlink controller")
}

// ---- graphical-session: a display server accepts a connection.

func probeGraphicalSession(ctx context.Context, o Options) Capability {
	var found []string
	var refused []string
	xs, _ := filepath.Glob(o.at("/tmp/.X11-unix/X*"))
	ws, _ := filepath.Glob(o.at("/run/user/*/wayland-*"))
	for _, s := range append(xs, ws...) {
		if strings.HasSuffix(s, ".lock") {
			continue
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", s)
		if err != nil {
			refused = append(refused, s+": "+short(err))
			continue
		}
		c.Close()
		if base := filepath.Base(s); strings.HasPrefix(base, "X") {
			found = append(found, "X11 :"+strings.TrimPrefix(base, "X"))
		} else {
			found = append(found, "wayland "+s)
		}
	}
	if len(found) > 0 {
		return present(strings.Join(found, ", "))
	}
	why := "no display server socket in /tmp/.X11-unix/X* or /run/user/*/wayland-*"
	if len(refused) > 0 {
		why = "no display server socket accepted a connection (" + strings.Join(refused, "; ") + ")"
	}
	return absent(why)
}

// ---- seat: a display connector has something plugged in.

func probeSeat(ctx context.Context, o Options) Capability {
	connected, seen := drmConnectors(o.at("/sys/class/drm"))
	if len(connected) > 0 {
		return present(strings.Join(connected, ", "))
	}
	if seen == 0 {
		return absent("no connected display connector under /sys/class/drm (no connectors at all)")
	}
	return absent(fmt.Sprintf("no connected display connector under /sys/class/drm (%d connectors, none connected)", seen))
}

// drmConnectors returns the connectors under dir whose status is
// "connected", sorted, and how many connectors there were.
func drmConnectors(dir string) (connected []string, seen int) {
	paths, _ := filepath.Glob(filepath.Join(dir, "card*-*", "status"))
	for _, p := range paths {
		status, err := readTrim(p)
		if err != nil {
			continue
		}
		seen++
		if status == "connected" {
			connected = append(connected, filepath.Base(filepath.Dir(p)))
		}
	}
	slices.Sort(connected)
	return connected, seen
}

// ---- privileged: root with the capabilities changing the machine needs.

const (
	capDACOverride = 1
	capSysAdmin    = 21
)

func probePrivileged(ctx context.Context, o Options) Capability {
	status, err := os.ReadFile(o.at("/proc/self/status"))
	if err != nil {
		return absent("cannot read own capabilities: " + short(err))
	}
	eff, err := parseCapEff(string(status))
	if err != nil {
		return absent("cannot read own capabilities: " + strings.TrimPrefix(err.Error(), "profile: "))
	}
	last := -1
	if s, err := readTrim(o.at("/proc/sys/kernel/cap_last_cap")); err == nil {
		last, _ = strconv.Atoi(s)
	}
	return privilege(os.Geteuid(), eff, last)
}

// privilege decides from the effective uid and capability set; lastCap is
// the kernel's highest capability number, or -1 when unknown.
func privilege(euid int, eff uint64, lastCap int) Capability {
	var missing []string
	if euid != 0 {
		missing = append(missing, fmt.Sprintf("effective uid is %d, not 0", euid))
	}
	if eff&(1<<capSysAdmin) == 0 {
		missing = append(missing, "CapEff lacks CAP_SYS_ADMIN")
	}
	if eff&(1<<capDACOverride) == 0 {
		missing = append(missing, "CapEff lacks CAP_DAC_OVERRIDE")
	}
	if len(missing) > 0 {
		return absent(strings.Join(missing, "; "))
	}
	if lastCap < 0 || lastCap > 63 {
		return present(fmt.Sprintf("root, %d capabilities including CAP_SYS_ADMIN and CAP_DAC_OVERRIDE", bits.OnesCount64(eff)))
	}
	all := uint64(1)<<(lastCap+1) - 1
	if eff&all == all {
		return present("root, full capabilities")
	}
	return present(fmt.Sprintf("root, %d of %d capabilities including CAP_SYS_ADMIN and CAP_DAC_OVERRIDE", bits.OnesCount64(eff&all), lastCap+1))
}

// parseCapEff reads the CapEff mask from /proc/PID/status.
func parseCapEff(status string) (uint64, error) {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("profile: CapEff: %w", err)
			}
			return mask, nil
		}
	}
	return 0, errors.New("profile: no CapEff line in status")
}

// ---- helpers

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// short renders an error for a reason, in the words a person would use.
func short(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "absent"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "no answer in time"
	}
	return err.Error()
}
