package overlay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// The interface lives in the kernel where the kernel has WireGuard (made
// with `ip link add … type wireguard`); otherwise a userspace wireguard-go
// found on the machine holds it. That process is never the executor's
// child: under systemd it is a transient unit (mesh-wg-<if>.service, made
// with systemd-run), so it is the init's, outside the executor's cgroup;
// under any other init, or none, it is started in its own session and
// left to daemonise, so the init adopts it. Either way the overlay — the
// way back in — survives the executor's restart or upgrade. The transient
// unit lives under /run: after a reboot the executor's next apply brings
// the interface up again, as it must anyway (WireGuard's configuration is
// not persistent).

// socketDir is where a userspace WireGuard listens for its configuration.
const socketDir = "/var/run/wireguard"

// Supervisor is the machine's init, when it is systemd: the executor's
// initsys Manager is one.
type Supervisor interface {
	Name() string
	Stop(ctx context.Context, unit string) error
}

// Unit is the systemd unit that runs wireguard-go for iface.
func Unit(iface string) string { return "mesh-wg-" + iface + ".service" }

// Backend brings WireGuard interfaces up, configures them and reads them
// back.
type Backend struct {
	// Init is systemd when it runs (nil otherwise): wireguard-go then runs
	// as its transient unit.
	Init Supervisor
}

// run runs a tool through executor/command (from the fixed search path,
// with only PATH and LC_ALL=C in its environment, standard input from
// /dev/null, killed with its process group after a minute) and returns its
// standard output; a non-zero exit is an error naming argv and its
// standard error.
func run(ctx context.Context, argv ...string) (string, error) {
	res, err := command.Run(ctx, argv, command.Options{})
	if err != nil {
		return "", err
	}
	if res.Code != 0 {
		return res.Stdout, fmt.Errorf("%s: exit status %d: %s", strings.Join(argv, " "), res.Code, res.Stderr)
	}
	return res.Stdout, nil
}

// ipLink is what `ip -j -d addr show` says of one link.
type ipLink struct {
	Flags    []string `json:"flags"`
	LinkInfo struct {
		Kind string `json:"info_kind"`
	} `json:"linkinfo"`
	AddrInfo []struct {
		Local     string `json:"local"`
		PrefixLen int    `json:"prefixlen"`
		Scope     string `json:"scope"`
	} `json:"addr_info"`
}

// parseLink reads `ip -j -d addr show dev X`'s output.
func parseLink(out []byte) (Observed, error) {
	var links []ipLink
	if err := json.Unmarshal(out, &links); err != nil {
		return Observed{}, fmt.Errorf("ip addr show: %w", err)
	}
	if len(links) == 0 {
		return Observed{}, nil
	}
	l := links[0]
	o := Observed{Exists: true, Kind: l.LinkInfo.Kind}
	for _, f := range l.Flags {
		if f == "UP" {
			o.Up = true
		}
	}
	for _, a := range l.AddrInfo {
		if a.Scope != "global" {
			continue
		}
		ad, err := netip.ParseAddr(a.Local)
		if err != nil {
			continue
		}
		o.Addrs = append(o.Addrs, netip.PrefixFrom(ad, a.PrefixLen))
	}
	SortPrefixes(o.Addrs)
	return o, nil
}

// Observe reads what the machine has under iface: the link and its
// addresses (iproute2), and WireGuard's own view (wgctrl).
func (b *Backend) Observe(ctx context.Context, iface string) (Observed, error) {
	if _, err := net.InterfaceByName(iface); err != nil {
		return Observed{}, nil // no such link
	}
	out, err := run(ctx, "ip", "-j", "-d", "addr", "show", "dev", iface)
	if err != nil {
		if _, e := net.InterfaceByName(iface); e != nil {
			return Observed{}, nil // gone meanwhile
		}
		return Observed{}, err
	}
	o, err := parseLink([]byte(out))
	if err != nil || !o.Exists {
		return o, err
	}
	c, err := wgctrl.New()
	if err != nil {
		return o, fmt.Errorf("wgctrl: %w", err)
	}
	defer c.Close()
	d, err := c.Device(iface)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A link of that name that no WireGuard answers for.
	case err != nil:
		return o, fmt.Errorf("wgctrl: read %s: %w", iface, err)
	default:
		o.Device = d
	}
	return o, nil
}

// Describe says what holds an observed interface, for the report.
func (b *Backend) Describe(iface string, o Observed) string {
	switch {
	case o.Device == nil:
		return "absent"
	case o.Device.Type == wgtypes.LinuxKernel:
		return "kernel WireGuard"
	case b.Init != nil:
		return "userspace wireguard-go, run by systemd as " + Unit(iface)
	default:
		return "userspace wireguard-go in its own session"
	}
}

// Create brings a WireGuard interface named iface up: in the kernel when it
// has WireGuard, otherwise under wireguard-go. It returns what holds it.
func (b *Backend) Create(ctx context.Context, iface string) (string, error) {
	_, kerr := run(ctx, "ip", "link", "add", "dev", iface, "type", "wireguard")
	if kerr == nil {
		return "kernel WireGuard", nil
	}
	wg, err := command.LookPath("wireguard-go")
	if err != nil {
		return "", fmt.Errorf("no kernel WireGuard (%v) and no userspace one (%v)", kerr, err)
	}
	var how string
	if b.Init != nil && b.Init.Name() == "systemd" {
		// A unit left from before (its process gone) is stopped first;
		// --collect lets systemd forget it once it ends, failed or not.
		b.Init.Stop(ctx, Unit(iface))
		_, err = run(ctx, "systemd-run", "--unit="+Unit(iface), "--collect",
			"--description=nox-mesh-host WireGuard overlay "+iface, "--property=Restart=no", "--", wg, "-f", iface)
		how = "userspace wireguard-go, run by systemd as " + Unit(iface)
	} else {
		err = startDetached(ctx, wg, iface)
		how = "userspace wireguard-go in its own session (no systemd to run it)"
	}
	if err != nil {
		return "", fmt.Errorf("start %s: %w", wg, err)
	}
	if err := waitFor(ctx, 10*time.Second, func() bool {
		_, e1 := os.Stat(filepath.Join(socketDir, iface+".sock"))
		_, e2 := net.InterfaceByName(iface)
		return e1 == nil && e2 == nil
	}); err != nil {
		return "", fmt.Errorf("%s did not bring %s up within 10 s", wg, iface)
	}
	return how, nil
}

// startDetached runs wireguard-go without -f in a session of its own: it
// starts its daemon and exits, so the daemon is the init's, not ours. The
// daemon is not killed when wireguard-go exits; it is, with its group, if
// wireguard-go is not done within thirty seconds. A failure says the line
// of its output that names the error (command.Result.ErrorLine): its
// error goes to standard output and its banner to standard error, after.
func startDetached(ctx context.Context, wg, iface string) error {
	res, err := command.Run(ctx, []string{wg, iface}, command.Options{Timeout: 30 * time.Second, Session: true})
	if err == nil && res.Code != 0 {
		err = fmt.Errorf("exit status %d", res.Code)
	}
	if err != nil {
		return fmt.Errorf("%w: %s", err, res.ErrorLine())
	}
	return nil
}

func waitFor(ctx context.Context, d time.Duration, ok func() bool) error {
	deadline := clock.Deadline(d)
	for !ok() {
		if clock.Past(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Configure makes iface's WireGuard configuration, address and link state
// what c says differs from want.
func (b *Backend) Configure(ctx context.Context, want Spec, c Changes) error {
	cfg := wgtypes.Config{}
	if c.Key && want.PrivateKey != nil {
		k := *want.PrivateKey
		cfg.PrivateKey = &k
	}
	if c.ListenPort {
		p := want.ListenPort
		cfg.ListenPort = &p
	}
	for _, k := range c.RemovePeers {
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
	}
	for _, p := range c.SetPeers {
		ka := p.Keepalive
		pc := wgtypes.PeerConfig{PublicKey: p.PublicKey, ReplaceAllowedIPs: true, AllowedIPs: ipNets(p.AllowedIPs), PersistentKeepaliveInterval: &ka}
		if p.Endpoint.IsValid() {
			pc.Endpoint = net.UDPAddrFromAddrPort(p.Endpoint)
		}
		cfg.Peers = append(cfg.Peers, pc)
	}
	if cfg.PrivateKey != nil || cfg.ListenPort != nil || len(cfg.Peers) > 0 {
		wc, err := wgctrl.New()
		if err != nil {
			return fmt.Errorf("wgctrl: %w", err)
		}
		err = wc.ConfigureDevice(want.Interface, cfg)
		wc.Close()
		if err != nil {
			return fmt.Errorf("wgctrl: configure %s: %w", want.Interface, err)
		}
	}
	for _, a := range c.DelAddrs {
		if _, err := run(ctx, "ip", "addr", "del", a.String(), "dev", want.Interface); err != nil {
			return err
		}
	}
	if c.AddAddress {
		if _, err := run(ctx, "ip", "addr", "add", want.Address.String(), "dev", want.Interface); err != nil {
			return err
		}
	}
	if c.Up {
		if _, err := run(ctx, "ip", "link", "set", "dev", want.Interface, "up"); err != nil {
			return err
		}
	}
	return nil
}

// Remove takes iface away: a kernel interface is deleted; a userspace one's
// process is stopped (its unit under systemd, otherwise the process that
// holds its socket), which removes its link.
func (b *Backend) Remove(ctx context.Context, iface string) error {
	if b.Init != nil && b.Init.Name() == "systemd" {
		if err := b.Init.Stop(ctx, Unit(iface)); err != nil && !strings.Contains(err.Error(), "not loaded") {
			return fmt.Errorf("stop %s: %w", Unit(iface), err)
		}
	}
	// Whatever still holds the socket (started in its own session, or by
	// someone else) is made to end.
	sock := filepath.Join(socketDir, iface+".sock")
	pids, inodes, err := socketHolders(sock)
	if err != nil {
		return fmt.Errorf("the process serving %s: %w", iface, err)
	}
	for _, pid := range pids {
		if err := endProcess(ctx, pid, func() bool { return holding(pid, inodes) }); err != nil {
			return fmt.Errorf("the WireGuard process serving %s (pid %d): %w", iface, pid, err)
		}
	}
	if _, err := net.InterfaceByName(iface); err == nil {
		if _, err := run(ctx, "ip", "link", "del", "dev", iface); err != nil {
			if _, e := net.InterfaceByName(iface); e == nil {
				return err
			}
		}
	}
	return nil
}

// endProcess makes pid end: SIGTERM, and SIGKILL if it is still there after
// processGrace; an error says it is still there after the second grace, and
// the removal is not done, nor recorded as done (a wait that ended silently
// would record a removal that did not happen). The process is held by a pidfd, and signalled
// only if, once held, it still is the one (still): a pid the kernel gave to
// another process meanwhile is never signalled. On a kernel without pidfds
// (before 5.3: an older Android device's), or where a seccomp filter
// refuses them (EPERM), it is signalled by pid after the same check, as
// before pidfds — the pid given again between check and signal is the risk
// left there.
func endProcess(ctx context.Context, pid int, still func() bool) error {
	if pid <= 1 || pid == os.Getpid() {
		return fmt.Errorf("pid %d is not a process to end", pid)
	}
	signal := func(sig unix.Signal) error { return unix.Kill(pid, sig) }
	ended := func() bool { return unix.Kill(pid, 0) != nil }
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil // ended already
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
	case err != nil:
		return fmt.Errorf("pidfd_open: %w", err)
	default:
		defer unix.Close(fd)
		signal = func(sig unix.Signal) error { return unix.PidfdSendSignal(fd, sig, nil, 0) }
		ended = func() bool {
			// Readable once the process has ended (a zombie too: it holds
			// nothing any more, and its parent reaps it).
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err == nil && n == 1
		}
	}
	if !still() {
		return nil // it let go meanwhile, or the pid is another's now
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := signal(sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%s: %w", unix.SignalName(sig), err)
		}
		err := waitFor(ctx, processGrace, ended)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for it to end after %s: %w", unix.SignalName(sig), err)
		}
	}
	return fmt.Errorf("still running %s after SIGTERM and SIGKILL", 2*processGrace)
}

// processGrace is how long a WireGuard process is given to end after each
// signal.
var processGrace = 5 * time.Second // a test shortens it

// Gone reads back that iface is no more: no interface, and no process
// holding its socket.
func (b *Backend) Gone(iface string) error {
	if _, err := net.InterfaceByName(iface); err == nil {
		return fmt.Errorf("interface %s is still there", iface)
	}
	pids, _, err := socketHolders(filepath.Join(socketDir, iface+".sock"))
	if err != nil {
		return fmt.Errorf("reading who holds %s's socket: %w", iface, err)
	}
	if len(pids) > 0 {
		return fmt.Errorf("a WireGuard process (pid %d) still holds %s's socket", pids[0], iface)
	}
	return nil
}

// socketHolders returns the processes that hold the unix socket bound at
// path open, and the socket's inodes: the listening socket and the
// connections it accepted (which carry its path) are found in
// /proc/net/unix, their holders in /proc/PID/fd. Not SO_PEERCRED of a
// connection: that names the process that called listen(), and wireguard-go
// listens before it daemonises — the process it names has exited (its pid
// may be another's by now), and the daemon holding the socket was never
// signalled; the interface's deletion ended it a moment later, after the
// removal was read back (the s6 lab's failure under load).
func socketHolders(path string) ([]int, map[uint64]bool, error) {
	inodes, err := socketInodes(path)
	if err != nil || len(inodes) == 0 {
		return nil, inodes, err
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if holding(pid, inodes) {
			pids = append(pids, pid)
		}
	}
	return pids, inodes, nil
}

// socketInodes reads /proc/net/unix for the sockets bound at path.
func socketInodes(path string) (map[uint64]bool, error) {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	inodes := map[uint64]bool{}
	sc := bufio.NewScanner(f)
	sc.Scan() // the header: Num RefCount Protocol Flags Type St Inode Path
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[7] != path {
			continue
		}
		if ino, err := strconv.ParseUint(fields[6], 10, 64); err == nil {
			inodes[ino] = true
		}
	}
	return inodes, sc.Err()
}

// holding says whether pid holds one of inodes open.
func holding(pid int, inodes map[uint64]bool) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false // gone, or no longer readable
	}
	for _, fd := range fds {
		link, err := os.Readlink(dir + "/" + fd.Name())
		if !strings.HasPrefix(link, "socket:[") || err != nil {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(link[len("socket:["):], "]"), 10, 64); err == nil && inodes[ino] {
			return true
		}
	}
	return false
}
