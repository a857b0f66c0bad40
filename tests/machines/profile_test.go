package machines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The profile, proved: each of the eight capabilities is produced for real
// in a lab machine, in both states wherever this machine can, and read with
// the real `mesh-executor profile --json` run inside the lab. A present
// capability must carry a detail, an absent one a reason; each is checked
// for the words that make it true, and where the profile claims a thing
// works the test uses the thing (nft lists tables, wireguard-go brings up an
// interface, dpkg refuses to run under the lock).
//
// What this machine cannot produce is asserted absent with its reason and
// never faked: a seat (no display connector exists here) and kernel
// WireGuard (CONFIG_WIREGUARD is not set and the kernel loads no modules).

// profCapabilities are the eight, in the order the profile lists them.
var profCapabilities = []string{"container-runtime", "package-manager", "service-manager", "firewall", "overlay", "graphical-session", "seat", "privileged"}

type profCapability struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	Detail  string `json:"detail"`
	Reason  string `json:"reason"`
}

// profiled is one `mesh-executor profile --json`, decoded strictly.
type profiled struct {
	DetectedAt   time.Time        `json:"detected_at"`
	Capabilities []profCapability `json:"capabilities"`
	// Accepts: the declaration fields the executor reads beyond every
	// release's (shapes.Accepts), which the control side reads.
	Accepts []string `json:"accepts"`
}

// profile runs `mesh-executor profile --json` in the lab, behind prefix (a
// shell word list such as "setpriv --reuid=65534 --", or ""), checks the
// document's shape and returns it.
func (m *machine) profile(prefix string) profiled {
	m.t.Helper()
	start := time.Now()
	out := m.sh(prefix + " /usr/local/bin/mesh-executor profile --json")
	took := time.Since(start)
	var p profiled
	dec := json.NewDecoder(bytes.NewReader([]byte(out)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		m.t.Fatalf("profile --json %q: %v", out, err)
	}
	var names []string
	for _, c := range p.Capabilities {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, profCapabilities) {
		m.t.Fatalf("profile lists %q, want the eight in order %q", names, profCapabilities)
	}
	if !slices.Equal(p.Accepts, shapes.Accepts) {
		m.t.Fatalf("profile says it accepts %q, this build reads %q", p.Accepts, shapes.Accepts)
	}
	if p.DetectedAt.IsZero() || p.DetectedAt.Before(start.Add(-time.Minute)) || p.DetectedAt.After(time.Now().Add(time.Minute)) {
		m.t.Fatalf("detected_at %v, not the time of this run (%v)", p.DetectedAt, start)
	}
	// Every line carries one half of the fact, never both, never neither.
	for _, c := range p.Capabilities {
		if c.Present && (c.Detail == "" || c.Reason != "") || !c.Present && (c.Reason == "" || c.Detail != "") {
			m.t.Fatalf("%s: present %v with detail %q and reason %q", c.Name, c.Present, c.Detail, c.Reason)
		}
	}
	m.t.Logf("profile (%v)%s", took.Round(time.Millisecond), p)
	return p
}

func (p profiled) String() string {
	var b strings.Builder
	for _, c := range p.Capabilities {
		if c.Present {
			fmt.Fprintf(&b, "\n  %-18s present  %s", c.Name, c.Detail)
		} else {
			fmt.Fprintf(&b, "\n  %-18s absent   %s", c.Name, c.Reason)
		}
	}
	return b.String()
}

func (p profiled) get(t *testing.T, name string) profCapability {
	t.Helper()
	for _, c := range p.Capabilities {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %s in the profile", name)
	return profCapability{}
}

// present asserts name is present with a detail holding each of words.
func (p profiled) present(t *testing.T, name string, words ...string) string {
	t.Helper()
	c := p.get(t, name)
	if !c.Present {
		t.Fatalf("%s: absent (%s), want present with %q", name, c.Reason, words)
	}
	for _, w := range words {
		if !strings.Contains(c.Detail, w) {
			t.Fatalf("%s: present with detail %q, want it to say %q", name, c.Detail, w)
		}
	}
	return c.Detail
}

// absent asserts name is absent with a reason holding each of words.
func (p profiled) absent(t *testing.T, name string, words ...string) string {
	t.Helper()
	c := p.get(t, name)
	if c.Present {
		t.Fatalf("%s: present (%s), want absent saying %q", name, c.Detail, words)
	}
	for _, w := range words {
		if !strings.Contains(c.Reason, w) {
			t.Fatalf("%s: absent with reason %q, want it to say %q", name, c.Reason, w)
		}
	}
	return c.Reason
}

// dpkgLocker holds dpkg's frontend lock the way dpkg and apt take it: an
// fcntl write lock (F_SETLK = 6, F_WRLCK = 1; struct flock as on 64-bit
// Linux). util-linux `flock` takes a flock(2) lock, which dpkg never sees,
// so it cannot lock the database. It prints "locked" once it holds it.
const dpkgLocker = `perl -e 'open(my $f, "+<", "/var/lib/dpkg/lock-frontend") or die "open: $!\n"; ` +
	`my $l = pack("s s x4 q q l x4", 1, 0, 0, 0, 0); fcntl($f, 6, $l) or die "lock: $!\n"; ` +
	`$| = 1; print "locked\n"; sleep 120'`

// On systemd: the service manager running and degraded, dpkg free and
// locked, the container runtime off and on, a firewall and none, userspace
// WireGuard and none (two ways), an X server and none (two ways), root and
// not root, and no seat.
func TestProfileOnSystemd(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{Seed: map[string]string{
		// The only podman configuration that runs in a lab: runc (crun's
		// setrlimit of RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE), no pids
		// limit (the lab's cgroup has no pids controller).
		"/etc/containers/containers.conf": "[containers]\npids_limit = 0\n[engine]\nruntime = \"runc\"\n",
		// Storage: vfs, as the kernel's overlay does not stack on the lab's
		// overlayfs root without fuse-overlayfs.
		"/etc/containers/storage.conf": "[storage]\ndriver = \"vfs\"\n" +
			"runroot = \"/run/containers/storage\"\ngraphroot = \"/var/lib/containers/storage\"\n",
		"/etc/systemd/system/lp-broken.service": "[Unit]\nDescription=fails on purpose\n" +
			"[Service]\nType=oneshot\nExecStart=/bin/false\n",
	}})

	p := m.profile("")
	// service-manager: the init answers for its state.
	p.present(t, "service-manager", "systemd ", ", running")
	// package-manager: dpkg answers a query of its own database.
	p.present(t, "package-manager", "dpkg/apt")
	// container-runtime: nothing listens yet; every socket tried is named.
	p.absent(t, "container-runtime", "_ping", "/run/docker.sock: absent", "/run/podman/podman.sock: absent")
	// firewall: nftables lists the lab's own netns over netlink.
	p.present(t, "firewall", "nftables")
	m.sh("nft list tables")
	// graphical-session: no X server, no Wayland compositor.
	p.absent(t, "graphical-session", "no display server socket in /tmp/.X11-unix/X*")
	// privileged: root, with the lab's bounding set (no CAP_SYS_RESOURCE).
	if d := p.present(t, "privileged", "root, "); !strings.Contains(d, "CAP_SYS_ADMIN") && d != "root, full capabilities" {
		t.Fatalf("privileged: %q", d)
	}
	// seat and kernel WireGuard: not producible on this machine (unverified here).
	p.absent(t, "seat", "no connected display connector under /sys/class/drm")
	kernelWG := p.get(t, "overlay").Detail == "kernel wireguard"
	if kernelWG {
		t.Log("overlay: this kernel has WireGuard; the userspace cases below are not reached")
	} else {
		// overlay: userspace wireguard-go and a tun device that opens.
		p.present(t, "overlay", "userspace wireguard-go")
		// ...and the claim holds: wireguard-go brings an interface up here.
		m.sh("wireguard-go lpwg0 >/dev/null 2>&1 && ip link show lpwg0 >/dev/null && ip link del lpwg0")
	}

	// graphical-session: an X server on :7 accepts a connection.
	m.sh("setsid Xvfb :7 -nolisten tcp >/run/xvfb.log 2>&1 </dev/null &")
	untilTrue(t, 10*time.Second, "Xvfb listening on /tmp/.X11-unix/X7", func() bool {
		return m.sh("test -S /tmp/.X11-unix/X7 && echo yes || true") == "yes"
	})
	p = m.profile("")
	p.present(t, "graphical-session", "X11 :7")
	// Killed without cleaning up, it leaves its socket: found, refused, absent.
	m.sh("pkill -KILL -x Xvfb; while pgrep -x Xvfb >/dev/null; do sleep 0.05; done")
	// The kernel closes the dead server's listening socket a moment after
	// the process is gone; wait for that, not for a fixed time.
	untilTrue(t, 10*time.Second, "the dead X server's socket refusing", func() bool {
		return !m.profile("").get(t, "graphical-session").Present
	})
	p = m.profile("")
	p.absent(t, "graphical-session", "/tmp/.X11-unix/X7: connection refused")

	// container-runtime: podman's API, socket-activated by systemd.
	m.sh("systemctl start podman.socket")
	p = m.profile("")
	p.present(t, "container-runtime", "/run/podman/podman.sock", "Libpod")
	// ...and the claim holds: a container runs through it. Its image is
	// the static mesh-executor alone (no registry is reachable).
	m.sh("mkdir -p /root/img && cp /usr/local/bin/mesh-executor /root/img/ && tar -C /root/img -cf /root/img.tar . && " +
		"podman import -q /root/img.tar localhost/lp-min:1 >/dev/null")
	if out := m.sh("podman --url unix:///run/podman/podman.sock run --rm --network none localhost/lp-min:1 /mesh-executor version"); out == "" {
		t.Fatal("no container ran through the runtime the profile found")
	}
	m.sh("systemctl stop podman.socket podman.service")
	p = m.profile("")
	p.absent(t, "container-runtime", "/run/podman/podman.sock")

	// service-manager: a failed unit makes systemd degraded; still present,
	// and saying so.
	m.sh("systemctl start lp-broken.service || true")
	if st := m.sh("systemctl is-system-running || true"); st != "degraded" {
		t.Fatalf("systemd is %q after a unit failed, want degraded", st)
	}
	p = m.profile("")
	p.present(t, "service-manager", "systemd ", ", degraded")

	// package-manager with dpkg's database locked, as a running apt or dpkg
	// holds it. dpkg itself refuses to run: the lock is real.
	m.sh("setsid " + dpkgLocker + " >/run/locker.out 2>&1 </dev/null &")
	untilTrue(t, 10*time.Second, "the dpkg frontend lock held", func() bool {
		return m.sh("cat /run/locker.out") == "locked"
	})
	if out := m.sh("dpkg --configure -a 2>&1; echo rc=$?"); !strings.Contains(out, "lock") || strings.HasSuffix(out, "rc=0") {
		t.Fatalf("dpkg ran under the lock: %s", out)
	}
	p = m.profile("")
	// The probe reads dpkg's database, which a lock does not stop: the
	// package manager is there, and busy. It says present, and nothing of
	// the lock (a module configuring itself from the detail cannot tell).
	d := p.present(t, "package-manager", "dpkg/apt")
	t.Logf("package-manager with dpkg's frontend lock held by another process: present, %q", d)

	// privileged, and what root alone may ask: not root.
	p = m.profile("setpriv --reuid=65534 --regid=65534 --clear-groups --")
	p.absent(t, "privileged", "effective uid is 65534, not 0", "CapEff lacks CAP_SYS_ADMIN")
	p.absent(t, "firewall", "nftables cannot be listed over netlink (it takes CAP_NET_ADMIN)", "operation not permitted")

	// overlay: a userspace daemon but no tun device, then no daemon at all.
	if !kernelWG {
		m.sh("rm /dev/net/tun")
		p = m.profile("")
		p.absent(t, "overlay", `no kernel wireguard (genetlink family "wireguard" not found)`,
			"userspace wireguard-go found but /dev/net/tun does not open read-write: absent")
		m.sh("rm -f $(command -v wireguard-go) $(command -v wireguard)")
		p = m.profile("")
		p.absent(t, "overlay", "no kernel wireguard", "no userspace wireguard (neither wireguard-go nor wireguard on ")
	}

	// firewall: no nft and no iptables program on this machine. Openings
	// are written over netlink, so the firewall is there all the same, and
	// an opening is written into the chain found and read back.
	m.sh("nft add table inet filter && nft add chain inet filter input '{ type filter hook input priority 0; policy drop; }'")
	m.sh("rm -f $(command -v nft) $(command -v iptables)")
	p = m.profile("")
	p.present(t, "firewall", "nftables")
	opening := decl(`{"module":"web","id":"alt","type":"opening","port":2222,"protocol":"tcp","path":"incoming"}`)
	rep, code := m.apply(opening)
	expect(t, rep, shapes.Applied, "web.alt=applied")
	if code != 0 || !strings.Contains(rep.Lines[0].Detail, "inet filter input") {
		t.Fatalf("an opening with no firewall program: exit %d %+v", code, rep.Lines)
	}
	rep, _ = m.apply(opening)
	expect(t, rep, shapes.Unchanged, "web.alt=unchanged")
}

// On OpenRC, runit and s6 as PID 1: the service manager present, named for
// the init, answering for a service it supervises.
func TestProfileOnOtherInits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		init  lab.Init
		ready string // a shell test: the init answers for lp-idle
		words []string
	}{
		{lab.OpenRC, "rc-service lp-idle status", []string{"openrc, runlevel default"}},
		{lab.Runit, "sv status /etc/service/lp-idle | grep -q '^run: '", []string{"runit, runsvdir on /etc/service", ", 1 services"}},
		{lab.S6, "s6-svstat /etc/s6/scan/lp-idle | grep -q '^up '", []string{"s6, s6-svscan on /etc/s6/scan", ", 1 services"}},
	} {
		t.Run(string(c.init), func(t *testing.T) {
			m := boot(t, lab.Options{Init: c.init, Seed: c.init.Service("lp-idle", "sleep 100003")})
			untilTrue(t, 10*time.Second, "lp-idle up", func() bool {
				return m.sh(c.ready+" >/dev/null 2>&1 && echo yes || true") == "yes"
			})
			p := m.profile("")
			p.present(t, "service-manager", c.words...)
			p.present(t, "package-manager", "dpkg/apt")
			p.present(t, "privileged", "root, ")
			if c.init != lab.S6 {
				return
			}
			// service-manager absent: a process whose pid namespace has no
			// init at all, as in a container started with the executor as
			// its PID 1. Every init asked is named with what it answered.
			p = m.profile("unshare --pid --fork --mount-proc --")
			p.absent(t, "service-manager", "no init answered for its state", `pid 1 is "mesh-executor"`,
				`systemctl is-system-running: "offline"`, "OpenRC: not booted", "runit: no runsvdir", "s6: no s6-svscan")
		})
	}
}

// The service manager is the one PID 1 is. Installing Debian's openrc
// package leaves /run/openrc/softlevel on any host (tests/install-deps.sh
// says so, and the executor's own initsys.Detect goes by PID 1 for this
// reason); on an s6 machine with that leftover, the profile must still say
// s6, as the executor's service applier will drive s6.
func TestProfileServiceManagerIsPID1(t *testing.T) {
	t.Parallel()
	m := boot(t, lab.Options{Init: lab.S6, Seed: lab.S6.Service("lp-idle", "sleep 100004")})
	untilTrue(t, 10*time.Second, "lp-idle up", func() bool {
		return m.sh("s6-svstat /etc/s6/scan/lp-idle | grep -q '^up ' && echo yes || true") == "yes"
	})
	m.profile("").present(t, "service-manager", "s6, s6-svscan on /etc/s6/scan")
	m.sh("mkdir -p /run/openrc && echo default >/run/openrc/softlevel")
	// The executor's service applier picks s6 here (it knows no such unit,
	// in s6's words).
	rep, code := m.apply(decl(`{"module":"x","id":"s","type":"service","unit":"lp-nowhere","state":"running"}`))
	if code != 2 || !strings.Contains(rep.Refused, `s6 knows no unit "lp-nowhere"`) {
		t.Fatalf("the service applier did not pick s6: exit %d %+v", code, rep)
	}
	m.profile("").present(t, "service-manager", "s6, s6-svscan on /etc/s6/scan")
}
