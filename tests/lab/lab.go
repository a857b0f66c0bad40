package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options says what lab to boot.
type Options struct {
	// Init is the lab's PID 1; empty means Systemd.
	Init Init
	// Name is the lab's name and hostname: letters, digits and '-', at most
	// 40 characters, unique among this process's running labs. Empty means
	// one made from t.Name().
	Name string
	// Seed holds extra files to place in the upper layer before the init
	// starts: absolute lab path -> content. A file whose content starts
	// with "#!" gets mode 0755, any other 0644; a content of the form
	// "symlink:TARGET" makes a symbolic link to TARGET. Directories on the
	// way are created with the host's mode and owner for that path. A
	// seeded path must not pass through a symbolic link of the host's.
	// Init.Service gives the seeds of a service for each init.
	Seed map[string]string
}

// Machine is a running lab.
type Machine struct {
	t      testing.TB
	name   string
	init   Init
	pid    int
	base   string // scratch directory on the host
	cgroup string // the lab's cgroup2 directory on the host

	exited  chan struct{} // closed when PID 1 has been reaped
	waitErr error

	console     *os.File      // a writer kept open on the console FIFO
	consoleDone chan struct{} // closed when the console is copied out

	booted time.Duration
	down   sync.Once
}

// How long Boot waits for the init to come up, and for a slot.
const (
	bootTimeout = 30 * time.Second
	slotTimeout = 10 * time.Minute
)

// at most two labs at once in this process.
var slots = make(chan struct{}, 2)

var (
	namesMu sync.Mutex
	names   = map[string]bool{}
	sweep   sync.Once
)

var validName = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,38}[a-zA-Z0-9])?$`)

// Boot boots a lab machine and waits until its init is up (systemd:
// `systemctl is-system-running` says running or degraded; see Init for the
// others). It registers the teardown with t.Cleanup. It fails the test, with
// the lab's console log, when the lab does not come up within 30 s, and
// skips it when not run as root.
func Boot(t testing.TB, opt Options) *Machine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("lab: booting a lab machine needs root (make test runs as root)")
	}
	if opt.Init == "" {
		opt.Init = Systemd
	}
	bin, err := opt.Init.binary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("lab: %s is missing (Debian package %s; tests/install-deps.sh installs it): %v", bin, opt.Init.pkg(), err)
	}
	for _, tool := range []string{"nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("lab: %s is missing (tests/install-deps.sh installs it)", tool)
		}
	}
	name, err := claimName(t, opt.Name)
	if err != nil {
		t.Fatal(err)
	}
	sweep.Do(sweepStale)

	select {
	case slots <- struct{}{}:
	case <-time.After(slotTimeout):
		releaseName(name)
		t.Fatalf("lab %s: waited %v for one of the 2 lab slots; does a test hold one lab while it waits for a second?", name, slotTimeout)
	}
	m := &Machine{t: t, name: name, init: opt.Init, exited: make(chan struct{})}
	t.Cleanup(m.Teardown)

	start := time.Now()
	if err := m.start(opt); err != nil {
		t.Fatalf("lab %s: %v%s", name, err, m.consoleTail())
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if err := m.waitUp(ctx); err != nil {
		t.Fatalf("lab %s (%s): not up after %v: %v%s", name, opt.Init, time.Since(start).Round(time.Millisecond), err, m.consoleTail())
	}
	m.booted = time.Since(start)
	t.Logf("lab %s (%s): PID 1 is host pid %d, up in %v", name, opt.Init, m.pid, m.booted.Round(time.Millisecond))
	return m
}

// claimName validates or makes the lab's name and reserves it.
func claimName(t testing.TB, want string) (string, error) {
	namesMu.Lock()
	defer namesMu.Unlock()
	if want != "" {
		if !validName.MatchString(want) {
			return "", fmt.Errorf("lab: name %q: want letters, digits and '-', at most 40", want)
		}
		if names[want] {
			return "", fmt.Errorf("lab: a lab named %q is already running", want)
		}
		names[want] = true
		return want, nil
	}
	base := strings.Trim(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-"), "-")
	if len(base) > 32 {
		base = strings.Trim(base[len(base)-32:], "-")
	}
	if base == "" {
		base = "lab"
	}
	for i := 1; ; i++ {
		n := base
		if i > 1 {
			n = base + "-" + strconv.Itoa(i)
		}
		if !names[n] {
			names[n] = true
			return n, nil
		}
	}
}

func releaseName(n string) {
	namesMu.Lock()
	delete(names, n)
	namesMu.Unlock()
}

// start creates the lab's scratch and cgroup directories and starts its
// PID 1, returning once the init has been exec'd.
func (m *Machine) start(opt Options) error {
	var err error
	m.base, err = os.MkdirTemp("", fmt.Sprintf("nox-lab-%d-%s-", os.Getpid(), m.name))
	if err != nil {
		return err
	}
	for _, d := range []string{"rw", "root"} {
		if err := os.Mkdir(filepath.Join(m.base, d), 0o755); err != nil {
			return err
		}
	}
	console, err := m.startConsole()
	if err != nil {
		return err
	}

	seeds, err := seedsFor(m.name, opt)
	if err != nil {
		return err
	}
	cfg, err := json.Marshal(innerConfig{Name: m.name, Base: m.base, Init: opt.Init, Seeds: seeds})
	if err != nil {
		return err
	}

	root, err := cgroup2Root()
	if err != nil {
		return err
	}
	m.cgroup = filepath.Join(root, cgroupParent, fmt.Sprintf("%d.%s", os.Getpid(), m.name))
	if err := mkdirCgroup(m.cgroup); err != nil {
		return err
	}
	cgfd, err := syscall.Open(m.cgroup, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", m.cgroup, err)
	}
	defer syscall.Close(cgfd)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	cmd := exec.Command(self)
	cmd.Args = []string{"nox-lab-inner"}
	cmd.Env = []string{innerEnv + "=" + string(cfg)}
	cmd.Stdout, cmd.Stderr = console, console
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET | syscall.CLONE_NEWCGROUP,
		Pdeathsig:   syscall.SIGKILL,
		UseCgroupFD: true,
		CgroupFD:    cgfd,
	}

	// Pdeathsig fires when the thread that forked the child ends, so the
	// fork happens on a locked thread that lives as long as the lab: it
	// waits for PID 1 and ends (still locked, so the runtime retires it)
	// only after PID 1 is gone.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			pw.Close()
			started <- err
			close(m.exited)
			return
		}
		pw.Close()
		started <- nil
		m.waitErr = cmd.Wait()
		close(m.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start PID 1: %w", err)
	}
	m.pid = cmd.Process.Pid
	// EOF once the inner stage has exec'd the init, or died.
	execd := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, pr)
		execd <- err
	}()
	select {
	case err := <-execd:
		if err != nil {
			return err
		}
	case <-time.After(bootTimeout):
		return fmt.Errorf("the inner stage did not exec the init within %v", bootTimeout)
	}
	select {
	case <-m.exited:
		return fmt.Errorf("PID 1 exited during setup: %v", m.waitErr)
	default:
	}
	return nil
}

// startConsole makes the lab's console: a FIFO in the scratch directory,
// bound on the lab's /dev/console and given to PID 1 as its output, copied
// in order into console.log (and to the test's stderr when NOX_LAB_CONSOLE
// is set). A FIFO rather than the log file itself, because writers that
// open /dev/console without O_APPEND would overwrite each other.
func (m *Machine) startConsole() (*os.File, error) {
	fifo := filepath.Join(m.base, "console")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		return nil, fmt.Errorf("mkfifo %s: %w", fifo, err)
	}
	rfd, err := syscall.Open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	r := os.NewFile(uintptr(rfd), fifo)
	// Opening for writing does not block: the reader is there. Keeping a
	// writer open means the reader sees EOF only at teardown.
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		r.Close()
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(m.base, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	var out io.Writer = log
	if os.Getenv("NOX_LAB_CONSOLE") != "" {
		out = io.MultiWriter(log, &prefixWriter{prefix: "[" + m.name + "] ", w: os.Stderr})
	}
	m.console, m.consoleDone = w, make(chan struct{})
	go func() {
		_, _ = io.Copy(out, r)
		r.Close()
		log.Close()
		close(m.consoleDone)
	}()
	return w, nil
}

// prefixWriter writes each line with a prefix.
type prefixWriter struct {
	prefix string
	w      io.Writer
	mid    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	var buf bytes.Buffer
	for _, c := range b {
		if !p.mid {
			buf.WriteString(p.prefix)
			p.mid = true
		}
		buf.WriteByte(c)
		if c == '\n' {
			p.mid = false
		}
	}
	_, err := p.w.Write(buf.Bytes())
	return len(b), err
}

// seedsFor gives the inner stage the upper layer's contents: the init's
// own seeds, then the test's.
func seedsFor(name string, opt Options) ([]entry, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	es := []entry{
		{Path: "/etc/hostname", Data: name + "\n", Mode: 0o644},
		{Path: "/etc/machine-id", Data: hex.EncodeToString(id) + "\n", Mode: 0o444},
	}
	file := func(p, data string) { es = append(es, entry{Path: p, Data: data, Mode: modeFor(data)}) }
	opaque := func(p string) { es = append(es, entry{Path: p, Opaque: true}) }
	switch opt.Init {
	case Systemd:
		opaque("/etc/systemd/system")
		for _, u := range []string{"console-getty.service", "sys-kernel-debug.mount", "sys-kernel-tracing.mount"} {
			es = append(es, entry{Path: "/etc/systemd/system/" + u, Link: "/dev/null"})
		}
	case OpenRC:
		file("/etc/rc.conf", "rc_sys=\"lxc\"\nrc_cgroup_mode=\"none\"\nrc_logger=\"NO\"\n")
		opaque("/etc/runlevels")
		for _, l := range []string{"sysinit", "boot", "default", "nonetwork", "shutdown"} {
			opaque("/etc/runlevels/" + l)
		}
	case Runit:
		file("/etc/runit/1", "#!/bin/sh\n# lab: mark runit as the running init, nothing else\n"+
			"install -m000 /dev/null /run/runit.stopit\ninstall -m000 /dev/null /run/runit.reboot\n")
		file("/etc/runit/no.emulate.sysv", "")
		opaque("/etc/runit/runsvdir/default")
	case S6:
		opaque(s6ScanDir)
	}
	for p, data := range opt.Seed {
		if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
			return nil, fmt.Errorf("seed path %q: want a clean absolute path", p)
		}
		// A directory made in the upper layer where the host has a
		// symbolic link would hide the link's target (seeding
		// /lib/x on merged /usr would hide all of /usr/lib).
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if fi, err := os.Lstat(d); err == nil && fi.Mode()&os.ModeSymlink != 0 {
				target, _ := os.Readlink(d)
				return nil, fmt.Errorf("seed path %q passes through the host's symbolic link %s -> %s; seed the path it leads to", p, d, target)
			}
		}
		if target, ok := strings.CutPrefix(data, symlinkPrefix); ok {
			es = append(es, entry{Path: p, Link: target})
			continue
		}
		file(p, data)
	}
	return es, nil
}

func modeFor(data string) uint32 {
	if strings.HasPrefix(data, "#!") {
		return 0o755
	}
	return 0o644
}

// waitUp polls until the init is up.
func (m *Machine) waitUp(ctx context.Context) error {
	last := "no answer yet"
	for {
		select {
		case <-m.exited:
			return fmt.Errorf("PID 1 exited: %v", m.waitErr)
		default:
		}
		up, state := m.isUp(ctx)
		if up {
			return nil
		}
		if state != "" {
			last = state
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("last seen: %s", last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// isUp tells whether the init is up, and what it saw.
func (m *Machine) isUp(ctx context.Context) (bool, string) {
	switch m.init {
	case Systemd:
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out, errOut, err := m.Run(c, "systemctl", "is-system-running", "--wait")
		state := strings.TrimSpace(out)
		if state == "running" || state == "degraded" {
			return true, state
		}
		if state == "" && err != nil {
			state = strings.TrimSpace(errOut)
		}
		return false, "is-system-running: " + state
	case OpenRC:
		level, _ := os.ReadFile(m.Path("/run/openrc/softlevel"))
		busy := m.procsNamed("openrc")
		return strings.TrimSpace(string(level)) == "default" && busy == 0,
			fmt.Sprintf("runlevel %q, %d openrc processes", strings.TrimSpace(string(level)), busy)
	case Runit:
		n := m.procsNamed("runsvdir")
		return n > 0, fmt.Sprintf("%d runsvdir processes", n)
	case S6:
		_, err := os.Stat(m.Path(s6ScanDir + "/.s6-svscan/control"))
		return err == nil, fmt.Sprintf("s6-svscan control: %v", err)
	}
	return false, "unknown init"
}

// procsNamed counts the lab's processes whose comm is name.
func (m *Machine) procsNamed(name string) int {
	ents, err := os.ReadDir(m.Path("/proc"))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile(m.Path("/proc/" + e.Name() + "/comm")); err == nil && strings.TrimSpace(string(b)) == name {
			n++
		}
	}
	return n
}

// consoleTail is the lab's console log, for a failure message.
func (m *Machine) consoleTail() string {
	if m.base == "" {
		return ""
	}
	// Let the console copier catch up: all of it when PID 1 is gone.
	select {
	case <-m.exited:
		if m.console != nil {
			m.console.Close()
			select {
			case <-m.consoleDone:
			case <-time.After(time.Second):
			}
		}
	default:
		time.Sleep(100 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(m.base, "console.log"))
	if err != nil {
		return "\n(no console log: " + err.Error() + ")"
	}
	const max = 16 << 10
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	return "\n--- console of lab " + m.name + " ---\n" + string(b) + "--- end of console ---"
}

// Name is the lab's name, also its hostname.
func (m *Machine) Name() string { return m.name }

// Init is the lab's init.
func (m *Machine) Init() Init { return m.init }

// PID is the host pid of the lab's PID 1.
func (m *Machine) PID() int { return m.pid }

// BootTime is how long Boot took, from creating the scratch directory to
// the init being up.
func (m *Machine) BootTime() time.Duration { return m.booted }

// Console is the lab's console log so far (PID 1's output and what the
// lab writes to /dev/console).
func (m *Machine) Console() string {
	b, _ := os.ReadFile(filepath.Join(m.base, "console.log"))
	return string(b)
}

// labEnv is the environment of commands run in a lab: nothing of the
// test's.
var labEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "TERM=dumb", "LANG=C.UTF-8",
}

// Run runs argv inside the lab, in all its namespaces (nsenter -t PID -a),
// with a minimal environment and standard input from /dev/null, and returns
// its output. The command is in the lab's pid namespace but not in its
// cgroup (use systemd-run for that). On ctx's end its whole process group
// is killed. A command that leaves a daemon holding its output is waited
// for at most 2 s after it exits. err names argv, the exit status and the
// output.
func (m *Machine) Run(ctx context.Context, argv ...string) (stdout, stderr string, err error) {
	if len(argv) == 0 {
		return "", "", errors.New("lab: Run with no command")
	}
	select {
	case <-m.exited:
		return "", "", fmt.Errorf("lab %s: %q: the lab is down", m.name, argv)
	default:
	}
	args := append([]string{"-t", strconv.Itoa(m.pid), "-a", "--"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = labEnv
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("lab %s: %q: %w\nstdout: %s\nstderr: %s", m.name, argv, err, so.String(), se.String())
	}
	return so.String(), se.String(), err
}

// Path is the host path of p inside the lab: /proc/PID/root/p. Beware that
// the host resolves an absolute symbolic link met on the way against the
// host's root; WriteFile and CopyIn do not.
func (m *Machine) Path(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", m.pid, path.Clean("/"+p))
}

// DBusSocket is the host path of the lab's system bus socket (systemd labs):
// /proc/PID/root/run/dbus/system_bus_socket. Dial it as
// "unix:path="+DBusSocket() and authenticate as uid 0.
func (m *Machine) DBusSocket() string { return m.Path("/run/dbus/system_bus_socket") }

// Teardown kills the lab, waits until its cgroup is empty, removes its
// cgroup subtree and its scratch directory. It is idempotent; Boot
// registers it with t.Cleanup. Problems are reported with t.Errorf.
func (m *Machine) Teardown() {
	m.down.Do(func() {
		start := time.Now()
		if err := m.teardown(); err != nil {
			m.t.Errorf("lab %s: teardown: %v", m.name, err)
		}
		if m.pid != 0 {
			m.t.Logf("lab %s: torn down in %v", m.name, time.Since(start).Round(time.Millisecond))
		}
	})
}

func (m *Machine) teardown() error {
	defer func() {
		releaseName(m.name)
		<-slots
	}()
	var errs []error
	if m.cgroup != "" {
		// Everything in the cgroup at once, PID 1 included.
		_ = os.WriteFile(filepath.Join(m.cgroup, "cgroup.kill"), []byte("1"), 0)
	}
	if m.pid != 0 {
		_ = syscall.Kill(m.pid, syscall.SIGKILL)
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			errs = append(errs, fmt.Errorf("PID 1 (host pid %d) still there 10 s after SIGKILL", m.pid))
		}
	}
	if m.cgroup != "" {
		if err := removeCgroup(m.cgroup, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if m.console != nil {
		m.console.Close()
		select {
		case <-m.consoleDone:
		case <-time.After(2 * time.Second):
			errs = append(errs, errors.New("the console FIFO still has a writer"))
		}
	}
	if m.base != "" {
		if err := os.RemoveAll(m.base); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Link joins a and b with a veth pair created straight into their network
// namespaces (the host's is never touched), gives the ends the addresses
// aAddr and bAddr (CIDR, e.g. 10.231.0.1/24), and brings both ends and each
// lab's lo up. It returns the interface names in a and in b. The pair goes
// away with the labs.
func Link(t testing.TB, a, b *Machine, aAddr, bAddr string) (aIf, bIf string) {
	t.Helper()
	if a == b {
		t.Fatal("lab: Link of a lab to itself")
	}
	n := linkSeq.Add(1)
	aIf, bIf = fmt.Sprintf("nxl%da", n), fmt.Sprintf("nxl%db", n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "link", "add", aIf, "netns", strconv.Itoa(a.pid),
		"type", "veth", "peer", "name", bIf, "netns", strconv.Itoa(b.pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("lab: veth %s/%s between %s and %s: %v: %s", aIf, bIf, a.name, b.name, err, out)
	}
	for _, side := range []struct {
		m         *Machine
		ifc, addr string
	}{{a, aIf, aAddr}, {b, bIf, bAddr}} {
		cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(side.m.pid), "-n", "ip", "-batch", "-")
		cmd.Stdin = strings.NewReader(fmt.Sprintf("link set lo up\naddr add %s dev %s\nlink set %s up\n", side.addr, side.ifc, side.ifc))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("lab %s: set up %s with %s: %v: %s", side.m.name, side.ifc, side.addr, err, out)
		}
	}
	return aIf, bIf
}
