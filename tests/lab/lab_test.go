package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gone is what a torn-down lab must leave: nothing.
type gone struct {
	name, base, cgroup string
	pid                int
	start              string   // PID 1's start time, so a reused pid is not taken for it
	ns                 []string // the lab's namespaces, as "net:[4026532...]"
	// when remembered, in clock ticks since boot: the kernel reuses a
	// freed namespace's inode number, so a holder that started later is
	// in another (a parallel test's) lab.
	ticks uint64
}

func remember(m *Machine) gone {
	g := gone{name: m.name, base: m.base, cgroup: m.cgroup, pid: m.pid, start: startTime(m.pid), ticks: uptimeTicks()}
	host := map[string]bool{}
	for _, n := range namespaceKinds {
		l, _ := os.Readlink("/proc/self/ns/" + n)
		host[l] = true
	}
	for _, n := range namespaceKinds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", m.pid, n)); err == nil && !host[l] {
			g.ns = append(g.ns, l)
		}
	}
	return g
}

var namespaceKinds = []string{"pid", "mnt", "uts", "ipc", "net", "cgroup"}

// uptimeTicks is the time since boot in the unit of /proc/PID/stat's start
// time (USER_HZ, 100 on Linux).
func uptimeTicks() uint64 {
	b, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	up, _ := strconv.ParseFloat(f[0], 64)
	return uint64(up * 100)
}

// namespaceHolders lists the host's processes, started before ticks, that
// are in, or hold a file descriptor of, one of the namespaces ns.
func namespaceHolders(ns []string, ticks uint64) []string {
	want := map[string]bool{}
	for _, n := range ns {
		want[n] = true
	}
	var found []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if st, err := strconv.ParseUint(startTime(pid), 10, 64); err != nil || st > ticks {
			continue
		}
		for _, n := range namespaceKinds {
			if l, _ := os.Readlink("/proc/" + p.Name() + "/ns/" + n); want[l] {
				found = append(found, "pid "+p.Name()+" is in "+l)
			}
		}
		fds, _ := os.ReadDir("/proc/" + p.Name() + "/fd")
		for _, fd := range fds {
			if l, _ := os.Readlink("/proc/" + p.Name() + "/fd/" + fd.Name()); want[l] {
				found = append(found, "pid "+p.Name()+" holds "+l)
			}
		}
	}
	return found
}

// startTime is field 22 of /proc/PID/stat, "" when there is no such process.
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// hostMountsOf lists the host's mounts that belong to a lab.
func hostMountsOf(t testing.TB, g gone) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "nox-lab") || (g.base != "" && strings.Contains(l, g.base)) || strings.Contains(l, " - overlay ") {
			bad = append(bad, l)
		}
	}
	return bad
}

// assertGone checks that nothing of the lab is left on the host.
func assertGone(t testing.TB, g gone) {
	t.Helper()
	if bad := hostMountsOf(t, g); len(bad) > 0 {
		t.Errorf("lab %s: the host's mountinfo shows lab mounts:\n%s", g.name, strings.Join(bad, "\n"))
	}
	if _, err := os.Stat(g.cgroup); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lab %s: cgroup %s is still there (%v)", g.name, g.cgroup, err)
	}
	if _, err := os.Stat(g.base); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lab %s: scratch dir %s is still there (%v)", g.name, g.base, err)
	}
	if alive(g) {
		t.Errorf("lab %s: PID 1 (host pid %d) is still there", g.name, g.pid)
	}
	if len(g.ns) > 0 {
		// The kernel kills what is left in the lab's pid namespace when its
		// PID 1 dies, but a process entered with nsenter (outside the lab's
		// cgroup) may take a moment to be gone on a loaded machine: looked
		// at until it is, for a few seconds, and an error if it is not.
		h := namespaceHolders(g.ns, g.ticks)
		for deadline := time.Now().Add(5 * time.Second); len(h) > 0 && time.Now().Before(deadline); h = namespaceHolders(g.ns, g.ticks) {
			time.Sleep(50 * time.Millisecond)
		}
		if len(h) > 0 {
			t.Errorf("lab %s: its namespaces live on: %s", g.name, strings.Join(h, "; "))
		}
	}
}

// alive tells whether the lab's PID 1 still runs. A zombie does not: it is
// dead, and only waits for its parent (the host's init, once the test
// binary that started it is gone) to reap it.
func alive(g gone) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(g.pid) + "/stat")
	if err != nil || startTime(g.pid) != g.start {
		return false
	}
	s := string(b)
	return !strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z ")
}

func run(t testing.TB, m *Machine, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _, err := m.Run(ctx, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// eventually polls check until it returns nil, for at most d.
func eventually(t testing.TB, d time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A systemd lab boots to running, is its own host by name, keeps every
// write to itself, cannot write the kernel's or sysfs's settings, starts
// what it was seeded with, and leaves nothing behind.
func TestSystemdLab(t *testing.T) {
	t.Parallel()
	seed := Systemd.Service("nox-seeded", "sleep infinity")
	seed["/etc/nox-lab-seed"] = "seeded\n"
	m := Boot(t, Options{Name: "nox-systemd-1", Seed: seed})
	g := remember(m)

	if s := run(t, m, "systemctl", "is-system-running"); s != "running" && s != "degraded" {
		t.Fatalf("is-system-running: %q", s)
	}
	if h := run(t, m, "hostname"); h != "nox-systemd-1" {
		t.Errorf("hostname in the lab: %q", h)
	}
	if h, _ := os.Hostname(); h == "nox-systemd-1" {
		t.Errorf("the host's hostname became the lab's")
	}
	hostID, _ := os.ReadFile("/etc/machine-id")
	if id := run(t, m, "cat", "/etc/machine-id"); len(id) != 32 || id == strings.TrimSpace(string(hostID)) {
		t.Errorf("lab machine-id %q (host's %q): want a fresh one", id, strings.TrimSpace(string(hostID)))
	}
	if s := run(t, m, "systemctl", "is-active", "nox-seeded"); s != "active" {
		t.Errorf("seeded unit: %q", s)
	}
	if s := run(t, m, "cat", "/etc/nox-lab-seed"); s != "seeded" {
		t.Errorf("seeded file: %q", s)
	}
	// Host units stay out: the opaque /etc/systemd/system hides their
	// enablement.
	if s := run(t, m, "sh", "-c", "systemctl list-units --type=service --state=running --no-legend --plain | awk '{print $1}' | sort | tr '\\n' ' '"); strings.Contains(s, "postgresql") || strings.Contains(s, "cron") {
		t.Errorf("host services run in the lab: %s", s)
	}

	// Writes stay in the lab.
	marker := fmt.Sprintf("/etc/nox-lab-write-%d", os.Getpid())
	run(t, m, "sh", "-c", "echo hello > "+marker+" && touch /usr/bin/nox-lab-x && rm -f /etc/debian_version")
	if err := m.WriteFile("/root/nox-lab-written", []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := run(t, m, "cat", marker, "/root/nox-lab-written"); s != "hello\nfrom the host" {
		t.Errorf("in the lab: %q", s)
	}
	for _, p := range []string{marker, "/usr/bin/nox-lab-x", "/root/nox-lab-written", "/etc/nox-lab-seed", "/etc/systemd/system/nox-seeded.service"} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s reached the host (%v)", p, err)
		}
	}
	if _, err := os.Stat("/etc/debian_version"); err != nil {
		t.Errorf("a removal in the lab reached the host: %v", err)
	}
	if _, _, err := m.Run(context.Background(), "test", "-e", "/etc/debian_version"); err == nil {
		t.Errorf("/etc/debian_version still there in the lab after rm")
	}

	// Kernel settings: read-only but the lab's own network namespace.
	hostFwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if _, _, err := m.Run(context.Background(), "sh", "-c", "echo x > /proc/sys/kernel/hostname"); err == nil || !strings.Contains(err.Error(), "Read-only") {
		t.Errorf("/proc/sys/kernel writable in the lab: %v", err)
	}
	if _, _, err := m.Run(context.Background(), "sh", "-c", "echo 1 > /sys/kernel/uevent_helper || mkdir /sys/nox-lab"); err == nil || !strings.Contains(err.Error(), "Read-only") {
		t.Errorf("sysfs writable in the lab: %v", err)
	}
	flip := "1"
	if strings.TrimSpace(string(hostFwd)) == "1" {
		flip = "0"
	}
	run(t, m, "sysctl", "-q", "-w", "net.ipv4.ip_forward="+flip)
	if s := run(t, m, "cat", "/proc/sys/net/ipv4/ip_forward"); s != flip {
		t.Errorf("lab ip_forward: %q, want %s", s, flip)
	}
	if now, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(now) != string(hostFwd) {
		t.Errorf("the lab's sysctl reached the host: %q -> %q", hostFwd, now)
	}
	// The lab's network is its own: lo only.
	if s := run(t, m, "ip", "-o", "link"); strings.Count(s, "\n") != 0 || !strings.Contains(s, "lo:") {
		t.Errorf("lab links: %s", s)
	}
	if bad := hostMountsOf(t, g); len(bad) > 0 {
		t.Errorf("while the lab runs, the host's mountinfo shows:\n%s", strings.Join(bad, "\n"))
	}
	if _, err := os.Stat(g.cgroup); err != nil {
		t.Errorf("the lab's cgroup: %v", err)
	}

	m.Teardown()
	assertGone(t, g)
	m.Teardown() // idempotent
	if _, _, err := m.Run(context.Background(), "true"); err == nil {
		t.Errorf("Run after Teardown succeeded")
	}
}

// A unit is started and stopped from the host through the lab's system bus
// socket; systemd inside agrees.
func TestSystemdDBusFromHost(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("busctl"); err != nil {
		t.Fatal("busctl is missing (package systemd)")
	}
	m := Boot(t, Options{})
	if err := m.WriteFiles(Systemd.Service("nox-hello", "sleep infinity")); err != nil {
		t.Fatal(err)
	}
	bus := func(args ...string) string {
		t.Helper()
		args = append([]string{"--address=unix:path=" + m.DBusSocket(), "--timeout=20"}, args...)
		out, err := exec.Command("busctl", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("busctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	const (
		dest = "org.freedesktop.systemd1"
		obj  = "/org/freedesktop/systemd1"
		mgr  = "org.freedesktop.systemd1.Manager"
		unit = "/org/freedesktop/systemd1/unit/nox_2dhello_2eservice"
	)
	state := func() string {
		return bus("get-property", dest, unit, "org.freedesktop.systemd1.Unit", "ActiveState")
	}
	bus("call", dest, obj, mgr, "Reload")
	if s := bus("get-property", dest, obj, mgr, "Virtualization"); s != `s "container-other"` {
		t.Errorf("the bus is not the lab's: Virtualization %s", s)
	}
	if s := state(); s != `s "inactive"` {
		t.Fatalf("before StartUnit: %s", s)
	}
	bus("call", dest, obj, mgr, "StartUnit", "ss", "nox-hello.service", "replace")
	eventually(t, 10*time.Second, "nox-hello active", func() error {
		if s := state(); s != `s "active"` {
			return errors.New(s)
		}
		return nil
	})
	if s := run(t, m, "systemctl", "is-active", "nox-hello"); s != "active" {
		t.Errorf("systemctl in the lab: %q", s)
	}
	pid := bus("get-property", dest, unit, "org.freedesktop.systemd1.Service", "MainPID")
	if pid == "u 0" {
		t.Errorf("active without a main pid")
	}
	bus("call", dest, obj, mgr, "StopUnit", "ss", "nox-hello.service", "replace")
	eventually(t, 10*time.Second, "nox-hello inactive", func() error {
		if s := state(); s != `s "inactive"` {
			return errors.New(s)
		}
		return nil
	})
	if _, _, err := m.Run(context.Background(), "systemctl", "is-active", "nox-hello"); err == nil {
		t.Errorf("systemctl in the lab says nox-hello is still active")
	}
}

// Two labs joined by a veth ping each other; the host's network namespace
// never holds either end, and both go with the labs.
func TestLink(t *testing.T) {
	a := Boot(t, Options{Name: "nox-link-a"})
	b := Boot(t, Options{Name: "nox-link-b"})
	aIf, bIf := Link(t, a, b, "10.231.7.1/24", "10.231.7.2/24")
	for _, ifc := range []string{aIf, bIf} {
		if _, err := net.InterfaceByName(ifc); err == nil {
			t.Errorf("%s is in the host's network namespace", ifc)
		}
	}
	if s := run(t, a, "ip", "-o", "-4", "addr", "show", "dev", aIf); !strings.Contains(s, "10.231.7.1/24") {
		t.Errorf("%s in a: %s", aIf, s)
	}
	run(t, a, "ping", "-c", "1", "-W", "2", "10.231.7.2")
	run(t, b, "ping", "-c", "1", "-W", "2", "10.231.7.1")
	ga, gb := remember(a), remember(b)
	a.Teardown()
	b.Teardown()
	assertGone(t, ga)
	assertGone(t, gb)
	for _, ifc := range []string{aIf, bIf} {
		if _, err := net.InterfaceByName(ifc); err == nil {
			t.Errorf("%s left on the host", ifc)
		}
	}
}

// OpenRC, runit and s6 each boot as PID 1 to an idle init within a few
// seconds, start the service they were seeded with, and start and stop a
// service added while they run, with their own tools.
func TestOtherInits(t *testing.T) {
	t.Parallel()
	type initTools struct {
		status   func(name string) []string
		isUp     func(out string) bool
		add      func(name string) [][]string // after the service's files are written
		up, down func(name string) []string
	}
	tools := map[Init]initTools{
		OpenRC: {
			status: func(n string) []string { return []string{"rc-service", n, "status"} },
			isUp:   func(out string) bool { return strings.Contains(out, "status: started") },
			add:    func(n string) [][]string { return [][]string{{"rc-service", n, "start"}} },
			up:     func(n string) []string { return []string{"rc-service", n, "start"} },
			down:   func(n string) []string { return []string{"rc-service", n, "stop"} },
		},
		Runit: {
			status: func(n string) []string { return []string{"sv", "status", "/etc/service/" + n} },
			isUp:   func(out string) bool { return strings.HasPrefix(out, "run: ") },
			// Nothing: runsvdir notices the new directory within 5 s.
			add:  func(n string) [][]string { return nil },
			up:   func(n string) []string { return []string{"sv", "-w", "10", "up", "/etc/service/" + n} },
			down: func(n string) []string { return []string{"sv", "-w", "10", "down", "/etc/service/" + n} },
		},
		S6: {
			status: func(n string) []string { return []string{"s6-svstat", s6ScanDir + "/" + n} },
			isUp:   func(out string) bool { return strings.HasPrefix(out, "up ") },
			add:    func(n string) [][]string { return [][]string{{"s6-svscanctl", "-a", s6ScanDir}} },
			up:     func(n string) []string { return []string{"s6-svc", "-wu", "-T", "5000", "-u", s6ScanDir + "/" + n} },
			down:   func(n string) []string { return []string{"s6-svc", "-wd", "-T", "5000", "-d", s6ScanDir + "/" + n} },
		},
	}
	for _, in := range []Init{OpenRC, Runit, S6} {
		tl := tools[in]
		t.Run(string(in), func(t *testing.T) {
			t.Parallel()
			m := Boot(t, Options{Init: in, Seed: in.Service("nox-boot", "sleep 1000")})
			if m.BootTime() > 5*time.Second {
				t.Errorf("%s took %v to come up", in, m.BootTime())
			}
			if comm := run(t, m, "cat", "/proc/1/comm"); !strings.HasPrefix(filepath.Base(mustBinary(t, in)), comm) {
				t.Errorf("PID 1 is %q", comm)
			}
			status := func(n string) (string, error) {
				out, _, err := m.Run(context.Background(), tl.status(n)...)
				return strings.TrimSpace(out), err
			}
			up := func(n string) func() error {
				return func() error {
					out, err := status(n)
					if !tl.isUp(out) {
						return fmt.Errorf("%q %v", out, err)
					}
					return nil
				}
			}
			down := func(n string) func() error {
				return func() error {
					if out, _ := status(n); tl.isUp(out) {
						return fmt.Errorf("still up: %q", out)
					}
					return nil
				}
			}
			eventually(t, 5*time.Second, "the seeded service up", up("nox-boot"))

			// A service added while the init runs.
			if err := m.WriteFiles(in.Service("nox-hello", "sleep 2000")); err != nil {
				t.Fatal(err)
			}
			for _, c := range tl.add("nox-hello") {
				run(t, m, c...)
			}
			eventually(t, 10*time.Second, "nox-hello up", up("nox-hello"))
			sleeps := func(want int) func() error {
				return func() error {
					if n := m.procsNamed("sleep"); n != want {
						return fmt.Errorf("%d sleep processes in the lab, want %d", n, want)
					}
					return nil
				}
			}
			eventually(t, 5*time.Second, "both services' processes", sleeps(2))
			run(t, m, tl.down("nox-hello")...)
			eventually(t, 10*time.Second, "nox-hello down", down("nox-hello"))
			eventually(t, 5*time.Second, "only nox-boot's process", sleeps(1))
			run(t, m, tl.up("nox-hello")...)
			eventually(t, 10*time.Second, "nox-hello up again", up("nox-hello"))
			eventually(t, 5*time.Second, "both services' processes again", sleeps(2))

			g := remember(m)
			m.Teardown()
			assertGone(t, g)
		})
	}
}

func mustBinary(t testing.TB, in Init) string {
	b, err := in.binary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WriteFile and CopyIn resolve paths inside the lab: an absolute symbolic
// link planted in the lab leads to the lab's file, never the host's.
func TestFilesStayInTheLab(t *testing.T) {
	t.Parallel()
	m := Boot(t, Options{Init: S6})
	hostTarget := filepath.Join(t.TempDir(), "target")
	run(t, m, "mkdir", "-p", filepath.Dir(hostTarget))
	run(t, m, "ln", "-s", hostTarget, "/etc/nox-escape")
	run(t, m, "ln", "-s", "/", "/etc/nox-escape-dir")
	if err := m.WriteFile("/etc/nox-escape", []byte("in the lab\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(hostTarget); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WriteFile followed the lab's link to the host: %v", err)
	}
	if s := run(t, m, "cat", hostTarget); s != "in the lab" {
		t.Errorf("the lab's target: %q", s)
	}
	script := filepath.Join(t.TempDir(), "nox-hello.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hello from $(hostname)\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := m.CopyIn(script, "/etc/nox-escape-dir/usr/local/bin/"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/usr/local/bin/nox-hello.sh"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CopyIn reached the host: %v", err)
	}
	if s := run(t, m, "nox-hello.sh"); s != "hello from "+m.Name() {
		t.Errorf("copied script: %q", s)
	}
	if s := run(t, m, "stat", "-c", "%a", "/usr/local/bin/nox-hello.sh"); s != "750" {
		t.Errorf("copied mode %s, want 750", s)
	}
}

// A third Boot waits until one of the two running labs is torn down.
func TestAtMostTwoLabs(t *testing.T) {
	a := Boot(t, Options{Init: S6, Name: "nox-two-a"})
	Boot(t, Options{Init: S6, Name: "nox-two-b"})
	third := make(chan *Machine, 1)
	go func() { third <- Boot(t, Options{Init: S6, Name: "nox-two-c"}) }()
	select {
	case <-third:
		t.Fatal("a third lab booted while two ran")
	case <-time.After(500 * time.Millisecond):
	}
	a.Teardown()
	select {
	case c := <-third:
		run(t, c, "true")
	case <-time.After(30 * time.Second):
		t.Fatal("the third lab did not boot after one of two was torn down")
	}
}

// The child side of TestFailingTestTearsDown: it boots a lab, says where
// it lives, and then fails, panics or waits to be killed.
func TestChildLab(t *testing.T) {
	mode := os.Getenv("NOX_LAB_CHILD")
	if mode == "" {
		t.Skip("run by TestFailingTestTearsDown")
	}
	opt := Options{Name: "nox-child-" + mode}
	if mode == "noboot" {
		// An init that dies at once: Boot must fail with its console.
		opt.Seed = map[string]string{"/usr/lib/systemd/systemd": "#!/bin/sh\necho lab-broken-on-purpose\nexit 3\n"}
	}
	m := Boot(t, opt)
	fmt.Printf("NOXLAB %d %s %s %s\n", m.pid, startTime(m.pid), m.cgroup, m.base)
	switch mode {
	case "fatal":
		t.Fatal("failing on purpose, with a lab running")
	case "panic":
		panic("panicking on purpose, with a lab running")
	case "kill":
		time.Sleep(time.Minute)
	}
}

// A lab is torn down when its test fails or panics; when the test binary
// is killed outright, the lab dies with it (Pdeathsig) and the next Boot's
// sweep removes what is left.
func TestFailingTestTearsDown(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"fatal", "panic", "kill", "noboot"} {
		t.Run(mode, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Fatal("needs root (make test runs as root)")
			}
			slots <- struct{}{} // the child's lab counts against this process's two
			defer func() { <-slots }()
			cmd := exec.Command(self, "-test.run=^TestChildLab$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "NOX_LAB_CHILD="+mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var g gone
			var log strings.Builder
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				if f := strings.Fields(sc.Text()); len(f) == 5 && f[0] == "NOXLAB" {
					g.pid, _ = strconv.Atoi(f[1])
					g.name, g.start, g.cgroup, g.base = "nox-child-"+mode, f[2], f[3], f[4]
					if mode == "kill" {
						if bad := hostMountsOf(t, g); len(bad) > 0 {
							t.Errorf("host mounts while the child's lab runs: %v", bad)
						}
						_ = cmd.Process.Kill()
					}
				}
			}
			err = cmd.Wait()
			if mode == "noboot" {
				if err == nil || !strings.Contains(log.String(), "PID 1 exited") || !strings.Contains(log.String(), "lab-broken-on-purpose") {
					t.Errorf("Boot of a broken init: %v, want a failure that shows its console:\n%s", err, log.String())
				}
				root, _ := cgroup2Root()
				left, _ := filepath.Glob(filepath.Join(root, cgroupParent, strconv.Itoa(cmd.Process.Pid)+".*"))
				tmp, _ := filepath.Glob(filepath.Join(os.TempDir(), "nox-lab-"+strconv.Itoa(cmd.Process.Pid)+"-*"))
				if len(left)+len(tmp) > 0 {
					t.Errorf("a failed Boot left %v %v", left, tmp)
				}
				return
			}
			if g.pid == 0 {
				t.Fatalf("the child booted no lab: %v\n%s%s", err, log.String(), stderr.String())
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("the child: %v, want it to fail\n%s", err, log.String())
			}
			switch mode {
			case "fatal":
				if !strings.Contains(log.String(), "--- FAIL: TestChildLab") {
					t.Errorf("the child did not fail its test:\n%s", log.String())
				}
			case "panic":
				if !strings.Contains(log.String()+stderr.String(), "panicking on purpose") {
					t.Errorf("the child did not panic:\n%s%s", log.String(), stderr.String())
				}
			case "kill":
				if ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Errorf("the child: %v, want killed", err)
				}
				// Pdeathsig: PID 1 dies with the test binary.
				killed := time.Now()
				eventually(t, 5*time.Second, "the lab's PID 1 dies with the test binary", func() error {
					if alive(g) {
						return fmt.Errorf("pid %d still runs", g.pid)
					}
					return nil
				})
				t.Logf("the lab's PID 1 died %v after the test binary was killed", time.Since(killed).Round(time.Millisecond))
				// Nobody ran the cleanups: the sweep of the next Boot does.
				sweepStale()
			}
			assertGone(t, g)
		})
	}
}

// A seed through a symbolic link of the host's is refused before anything
// boots: a directory made in its place would hide the link's target.
func TestSeedThroughHostLinkRefused(t *testing.T) {
	fi, err := os.Lstat("/lib")
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Skip("/lib is not a symbolic link on this host")
	}
	_, err = seedsFor("x", Options{Init: Systemd, Seed: map[string]string{"/lib/systemd/nox": "x"}})
	if err == nil || !strings.Contains(err.Error(), "symbolic link /lib") {
		t.Fatalf("seedsFor: %v", err)
	}
	if _, err := seedsFor("x", Options{Init: Systemd, Seed: map[string]string{"/usr/lib/systemd/nox": "x"}}); err != nil {
		t.Fatalf("seedsFor the real path: %v", err)
	}
}
